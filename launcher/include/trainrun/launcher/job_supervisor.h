// JobSupervisor: the job's supervision (DESIGN.md, "Supervision"). It keeps what every job has —
// who started, who ended and how, the teardown (SIGTERM to every rank, then SIGKILL after the grace
// period), whom to blame — and asks its FailurePolicy (failure_policy.h) what an end means: with
// fail fast, the first failure ends the job and trainrun exits with that rank's code (128+N for
// signal N); with the elastic policy (SupervisorOptions::elastic, --min-np) a lost rank is a
// membership change. Why the job ended is one EndReason, which the summary renders first.
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
#include <variant>
#include <vector>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/launcher/exit_info.h"
#include "trainrun/launcher/failure_policy.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher {

struct SupervisorOptions {
  std::string command;  // argv[0] as typed, for "cannot execute 'foo'"
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;  // SIGTERM → SIGKILL
  // After SIGKILL, how long to wait for ranks to be reaped before giving up on them.
  std::chrono::milliseconds kill_timeout{5000};
  int stderr_tail_lines = 10;  // lines of the failed rank's stderr in the summary
  // For a rank whose stderr says it could not import trainrun, torch or numpy: one line naming the
  // interpreters (python_interpreter.h's PythonHint); unset: nothing more is said.
  std::function<std::string(const std::string& module)> python_hint;
  // Elastic mode (--min-np): the elastic FailurePolicy; unset: fail fast.
  std::optional<ElasticSpec> elastic;
};

// IsStallDiagnosis: `message` is a waiting rank's timeout ("no progress from rank 0 ...", "rank 0
// moved no data ..."): its peer was alive but stalled, not failed.
bool IsStallDiagnosis(std::string_view message);

class JobSupervisor final : private FailurePolicy::Job {
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
  const std::vector<MembershipChange>& MembershipChanges() const {
    return policy_->MembershipChanges();
  }
  // ElasticSummary is one line counting the membership changes ("" when there were none).
  std::string ElasticSummary() const;

  bool done() const { return done_; }
  // finishing: a member exited 0 (the job is ending well): it grows no more.
  bool finishing() const { return policy_->finishing(); }
  // ending: the teardown has begun (every rank is being stopped).
  bool ending() const { return teardown_started_.has_value(); }
  // EndFor ends the job for `reason` (the membership controller's: every host blacklisted).
  void EndFor(EndReason reason) { End(std::move(reason)); }
  // interrupted: trainrun was told to stop (SIGINT, SIGTERM, SIGHUP), whatever the ranks did.
  bool interrupted() const {
    return reason_.has_value() && std::holds_alternative<Interrupted>(*reason_);
  }
  // nodes_changed: the job ended because a node joined (NodesChanged), to start again with it.
  bool nodes_changed() const {
    return reason_.has_value() && std::holds_alternative<NodesChanged>(*reason_);
  }
  // exit_code is what trainrun exits with: the blamed rank's code, 128+N after signal N, 1 when a
  // rank could not be started or exited before joining, else 0.
  int exit_code() const;
  // Summary is the one message for the user after a failed or interrupted job; "" when all ranks
  // exited 0. Several lines, the first naming the rank, host, and code or signal.
  std::string Summary() const;

 private:
  // FailurePolicy::Job.
  bool Exited(int rank) const override { return exits_.count(rank) > 0; }
  bool Ending() const override { return teardown_started_.has_value(); }
  bool Done() const override { return done_; }
  void End(EndReason reason) override;
  void MaybeDone() override;

  void StartTeardown();
  // CheckExitBeforeJoin applies OnRankJoined's rule once a rank's join or exit may have made it
  // true.
  void CheckExitBeforeJoin();
  // Reason is why the job ended: the policy's reason (below --min-np, --reset-limit) first, then
  // the blamed rank, then the reason recorded; nullopt when nothing went wrong.
  std::optional<EndReason> Reason() const;
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
  // Render writes the summary's first lines for one reason, adding the ranks they account for to
  // `accounted`.
  void Render(const EndReason& reason, std::set<int>& accounted,
              std::vector<std::string>& lines) const;
  void RenderRankFailed(int rank, std::set<int>& accounted, std::vector<std::string>& lines) const;

  const hostfile::SlotPlan& plan_;
  RankControl& ranks_;
  SupervisorOptions options_;
  std::function<void()> on_done_;
  boost::asio::steady_timer timer_;
  std::unique_ptr<FailurePolicy> policy_;

  int started_ = 0;
  bool starts_complete_ = false;
  std::map<int, ExitInfo> exits_;
  std::map<int, std::string> stderr_tail_;
  std::map<int, int> peer_failures_;          // rank → the peer it blamed
  std::map<int, std::string> peer_messages_;  // rank → its diagnosis, when it gave one
  // Why the job ends, as recorded (the first reason kept); the blamed rank is worked out instead.
  std::optional<EndReason> reason_;
  std::set<int> joined_;                  // ranks that joined the rendezvous
  std::set<int> exited_without_joining_;  // ranks that exited 0 and never joined
  bool exit_before_join_seen_ = false;
  std::optional<std::chrono::steady_clock::time_point> teardown_started_;
  bool killed_ = false;
  std::optional<std::chrono::steady_clock::time_point> killed_at_;  // when SIGKILL was sent
  bool done_ = false;
};

}  // namespace trainrun::launcher
