// JobSupervisor: the job's policy (DESIGN.md, "Supervision"). The first rank that fails ends the
// job: every other rank gets SIGTERM, then SIGKILL after the grace period; trainrun exits with that
// rank's code (128+N for signal N) and prints one summary that blames the first failure.
//
// Elastic jobs (SupervisorOptions::elastic, --min-np) differ: a rank that fails while at least
// min_np others run is lost, not fatal. The survivors become the next generation (new ranks 0..k-1
// in slot order), announced through `on_membership_change`; the summary counts the changes. When
// fewer than min_np remain, the job waits up to the elastic timeout, then ends with one sentence.
//
// It only decides: events come in (from RankProcessSet locally, from agents for remote hosts),
// and it acts through RankControl. Call it on the io_context's thread; the rendezvous server,
// running on its own threads, posts ReportPeerFailure and OnRankJoined there with
// boost::asio::post.
//
//   JobSupervisor supervisor(io, plan, ranks, options, [&] { io.stop(); });
//   ... supervisor.OnRankStarted(r) / OnRankExit(r, exit) / OnSignal(SIGINT) ...
//   Logger().error(supervisor.Summary()); return supervisor.exit_code();
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/launcher/exit_info.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher {

struct SupervisorOptions {
  std::string command;  // argv[0] as typed, for "cannot execute 'foo'"
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;  // SIGTERM → SIGKILL
  // After SIGKILL, how long to wait for ranks to be reaped before giving up on them.
  std::chrono::milliseconds kill_timeout{5000};
  int stderr_tail_lines = 10;  // lines of the failed rank's stderr in the summary
  // Elastic mode (--min-np); unset: the first failure ends the job.
  std::optional<ElasticSpec> elastic;
};

// MembershipChange is one change of an elastic job's members: generation `generation` is made of
// `members` (slots, that is generation-0 ranks and then the ranks the job grew by, in the order
// they started, ascending; member i is rank i) after `lost_ranks` left or `joined_ranks` came,
// `why` saying how ("rank 2 on localhost was killed by SIGKILL", "host b joined (from the host
// discovery script): ranks 4-5 started").
struct MembershipChange {
  int generation = 0;
  std::vector<int> lost_ranks;    // every rank lost (a lost host's ranks), ascending
  std::string lost_host;          // the host lost with its agent; "" when ranks were lost
  std::vector<int> joined_ranks;  // the ranks the job grew by, ascending (lost or joined: not both)
  std::string joined_host;        // the host they run on
  std::string why;
  std::vector<int> members;
  std::chrono::steady_clock::time_point when;  // when the loss was seen
  // Seconds from the loss to every member's joining the generation; negative until then.
  double recovery_seconds = -1;
};

// IsStallDiagnosis: `message` is a waiting rank's timeout ("no progress from rank 0 ...", "rank 0
// moved no data ..."): its peer was alive but stalled, not failed.
bool IsStallDiagnosis(std::string_view message);

class JobSupervisor {
 public:
  // `on_done` runs once, when every started rank has exited (or the kill timeout passed).
  // `on_membership_change` (elastic jobs) runs for each new generation, on the io_context's thread.
  JobSupervisor(boost::asio::io_context& io, const hostfile::SlotPlan& plan, RankControl& ranks,
                SupervisorOptions options, std::function<void()> on_done,
                std::function<void(const MembershipChange&)> on_membership_change = {});

  // OnRankStarted counts a rank the job must wait for.
  void OnRankStarted(int rank);
  // OnStartFailure ends the job because rank `rank` could not be started at all.
  void OnStartFailure(int rank, std::string message);
  // OnStartsComplete says no more ranks will start; with none running the job is done.
  void OnStartsComplete();
  // OnOutput keeps the last lines of each rank's stderr for the summary.
  void OnOutput(int rank, OutputStream stream, std::string_view bytes);
  // OnRankExit records a rank's end; the first failure starts the teardown.
  void OnRankExit(int rank, const ExitInfo& exit);
  // OnHostLost (elastic jobs): the ranks `ranks` of one host are gone with its agent (`why`
  // names the host and how it was lost). They count as lost ranks, recorded as killed now: one
  // membership change while at least min_np ranks survive, else the wait for ranks. Pending
  // ranks among them (the job was growing onto the host) are given up without a change.
  void OnHostLost(const std::vector<int>& ranks, const std::string& why);
  // OnRanksRemoved (elastic jobs): the host discovery script no longer lists the host of `ranks`
  // (`why` says so): those still running are stopped (SIGTERM, SIGKILL after the grace period)
  // and are one membership change, as lost ranks are.
  void OnRanksRemoved(const std::vector<int>& ranks, const std::string& why);
  // Growing (elastic jobs): OnRanksAdded counts ranks started while the job runs (slots past the
  // start's, already in the plan); they are pending, not members, until OnRanksJoined makes them
  // one membership change (`why` names the host; `since`: when the host was found). A pending rank
  // that ends, or is removed, is lost without a change. OnRanksJoined drops the ranks that ended
  // and returns false when none is left or the job is ending.
  void OnRanksAdded(const std::vector<int>& ranks);
  bool OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                     std::chrono::steady_clock::time_point since, const std::string& host);
  // Live: `rank` was started and has neither ended nor been given up (a member or pending).
  bool Live(int rank) const;
  // StoppedOnPurpose: `rank` was stopped by trainrun (the teardown, or its host left the discovery
  // output), so its end is not its host's failure.
  bool StoppedOnPurpose(int rank) const;
  // OnSignal: trainrun got SIGINT/SIGTERM/SIGHUP. The first starts the teardown (exit 128+N);
  // a second one skips the grace period.
  void OnSignal(int signal);
  // ReportPeerFailure: rank `rank` says it failed because peer `peer` failed (through the
  // rendezvous). Such a rank is never blamed while another failure can be.
  // `message` is the rank's own diagnosis ("no progress from rank 0 for 3 s ..."): a stall
  // diagnosis (IsStallDiagnosis) makes the summary name the peer as stalled, quoting it.
  void ReportPeerFailure(int rank, int peer, std::string message = "");
  // OnRankJoined: rank `rank` joined the rendezvous (the server tells, ServerOptions::on_join).
  // A rank that exited 0 without joining while a rank that joined still runs will never join, and
  // the others would wait for it until their timeout: with OnRankExit, this sees that, once, and
  // calls OnExitBeforeJoin.
  void OnRankJoined(int rank);
  // OnExitBeforeJoin: rank `rank` exited 0 without joining the rendezvous while other ranks had
  // joined. The job ends now, naming it, and trainrun exits 1 unless a rank failed before.
  void OnExitBeforeJoin(int rank);
  // OnStall ends the job because a collective waited past the stall shutdown time: `stalled` are
  // the ranks that never joined it, `description` says who waited where (StallInspector).
  void OnStall(std::vector<int> stalled, std::string description);

  // OnGenerationFormed: every member of generation `generation` has joined it (elastic jobs);
  // records the recovery time and returns the change's one line for the log.
  std::string OnGenerationFormed(int generation);
  // MembershipChanges lists an elastic job's changes so far, oldest first.
  const std::vector<MembershipChange>& MembershipChanges() const { return changes_; }
  // ElasticSummary is one line counting the membership changes ("" when there were none).
  std::string ElasticSummary() const;

  bool done() const { return done_; }
  // finishing: a member exited 0 (the job is ending well): it grows no more.
  bool finishing() const { return finishing_; }
  // ending: the teardown has begun (every rank is being stopped).
  bool ending() const { return teardown_started_.has_value(); }
  // interrupted: trainrun was told to stop (SIGINT, SIGTERM, SIGHUP), whatever the ranks did.
  bool interrupted() const { return signal_.has_value(); }
  // exit_code is what trainrun exits with: the blamed rank's code, 128+N after signal N, 1 when a
  // rank could not be started or exited before joining, else 0.
  int exit_code() const;
  // Summary is the one message for the user after a failed or interrupted job; "" when all ranks
  // exited 0. Several lines, the first naming the rank, host, and code or signal.
  std::string Summary() const;

 private:
  void StartTeardown();
  void MaybeDone();
  // CheckExitBeforeJoin applies OnRankJoined's rule once a rank's join or exit may have made it
  // true.
  void CheckExitBeforeJoin();
  // OnElasticLoss handles rank `rank`'s failure in an elastic job: a new generation when enough
  // ranks remain, else the wait for ranks (WaitForRanks).
  void OnElasticLoss(int rank, const ExitInfo& exit);
  // Loss is OnElasticLoss's and OnHostLost's common part: `ranks` (already in exits_) are lost.
  void Loss(const std::vector<int>& ranks, const std::string& why,
            std::chrono::steady_clock::time_point when, const std::string& host = "");
  // PastResetLimit ends the job (saying `why` and the limit) when one more membership change would
  // pass --reset-limit, and then returns true.
  bool PastResetLimit(const std::string& why);
  // Record gives `change` the next generation, `why`, `members` and `when`, keeps it and reports
  // it.
  void Record(MembershipChange change, const std::string& why, const std::vector<int>& members,
              std::chrono::steady_clock::time_point when);
  void WaitForRanks();
  // Survivors lists the ranks started and not yet exited, ascending.
  std::vector<int> Survivors() const;
  // Blamed returns the first failure: the earliest one that happened before the teardown began,
  // preferring ranks that did not report a peer's failure; or, when that rank reported a peer,
  // the end of the chain of reports if that rank's own exit was its own failure (OwnFailure).
  std::optional<int> Blamed() const;
  // OwnFailure: `rank` ended in a failure the teardown cannot have caused (an exit code, or a
  // signal other than the teardown's SIGTERM and, before it was sent, SIGKILL), whenever it was
  // reaped.
  bool OwnFailure(int rank) const;
  // RootPeer follows the peer-failure reports from `rank` to the rank at the end of the chain
  // (one that reported nothing); nullopt when `rank` reported no peer.
  std::optional<int> RootPeer(int rank) const;
  // SilentRank is the one rank that made no peer-failure report and was still running when the
  // teardown began; none when no rank or several are so.
  std::optional<int> SilentRank() const;
  // AnyStallDiagnosis: some rank reported a peer that was alive but moved no data.
  bool AnyStallDiagnosis() const;
  // AppendStderrTail adds the last lines of `rank`'s stderr, if any, to `lines`.
  void AppendStderrTail(int rank, std::vector<std::string>& lines) const;

  const hostfile::SlotPlan& plan_;
  RankControl& ranks_;
  SupervisorOptions options_;
  std::function<void()> on_done_;
  boost::asio::steady_timer timer_;

  int started_ = 0;
  bool starts_complete_ = false;
  std::map<int, ExitInfo> exits_;
  std::map<int, std::string> stderr_tail_;
  std::map<int, int> peer_failures_;          // rank → the peer it blamed
  std::map<int, std::string> peer_messages_;  // rank → its diagnosis, when it gave one
  struct Stall {
    std::vector<int> ranks;
    std::string description;
  };
  std::optional<Stall> stall_;
  std::optional<std::string> start_failure_;
  std::optional<int> signal_;
  std::optional<int> exited_before_join_;
  std::set<int> joined_;                  // ranks that joined the rendezvous
  std::set<int> exited_without_joining_;  // ranks that exited 0 and never joined
  bool exit_before_join_seen_ = false;
  std::optional<std::chrono::steady_clock::time_point> teardown_started_;
  bool killed_ = false;
  std::optional<std::chrono::steady_clock::time_point> killed_at_;  // when SIGKILL was sent
  bool done_ = false;

  // Elastic mode.
  std::function<void(const MembershipChange&)> on_membership_change_;
  std::vector<MembershipChange> changes_;
  std::set<int> lost_;      // ranks whose failure the job survived (never blamed)
  std::set<int> pending_;   // ranks started while the job runs, not yet members
  bool finishing_ = false;  // a member exited 0
  // GiveUpPending stops the pending ranks (a member finished: the job ends without them).
  void GiveUpPending();
  std::set<int> stopped_;  // ranks stopped because their host left the discovery output
  int start_size_ = 0;     // the plan's size at the start (slots past it are the job's growth)
  struct BelowMinimum {
    int rank = 0;         // the failure that left too few ranks
    std::string why;      // how it was lost ("rank 2 on a was killed by SIGKILL")
    int remaining = 0;    // how many ranks were left
    bool waiting = true;  // the elastic timeout has not yet passed
  };
  std::optional<BelowMinimum> below_minimum_;
  // The change that went past --reset-limit, which ended the job.
  std::optional<std::string> reset_limit_hit_;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> removal_timers_;
  boost::asio::io_context& io_;
  boost::asio::steady_timer elastic_timer_;
};

}  // namespace trainrun::launcher
