// FailurePolicy: what a rank's failure does to the job (DESIGN.md, "Supervision"). JobSupervisor
// keeps the job's common facts (who started, who ended and how, the teardown, whom to blame) and
// asks its policy what an end means:
//
//   fail fast  the first failure ends the job: every other rank is stopped, trainrun exits with the
//              failed rank's code. A lost host is a failure.
//   restart    (--max-restarts) each run of the job fails fast; the launcher then starts all of it
//              again (launcher.cc), so within a run it is the fail-fast policy.
//   elastic    (--min-np) a failed or lost rank is a membership change while at least min_np others
//              run: the survivors become the next generation (new ranks 0..k-1 in slot order),
//              announced through `on_membership_change`. Below min_np the job waits up to the
//              elastic timeout for ranks (growth, JobRun's ElasticController), then ends saying
//              why.
//
// EndReason is why a job ended when it did not end well by itself: the one reason its summary
// renders first.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/launcher/exit_info.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher {

// FailureMode is the policy a LaunchSpec asks for.
enum class FailureMode { kFailFast, kRestart, kElastic };
FailureMode FailureModeOf(const LaunchSpec& spec);

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

// The reasons a job ends early. RankFailed is the blamed rank (JobSupervisor works it out from the
// exits and the ranks' peer reports); the others are recorded as they happen.
struct RankFailed {
  int rank = 0;
};
struct StartFailed {
  std::string message;  // why a rank could not be started (or its host was lost)
};
struct Interrupted {
  int signal = 0;  // trainrun got SIGINT, SIGTERM or SIGHUP
};
struct ExitedBeforeJoin {
  int rank = 0;  // exited 0 without joining while others waited for it
};
struct Stalled {
  std::vector<int> ranks;   // the ranks that never joined the collective
  std::string description;  // who waited where (StallInspector)
};
struct BelowMinimum {
  int rank = 0;       // the failure that left too few ranks (the last one when none is left)
  std::string why;    // how it was lost ("rank 2 on a was killed by SIGKILL")
  int remaining = 0;  // how many ranks were left; 0: every rank had failed, the job ended at once
  int min_np = 0;
  std::chrono::seconds timeout{0};  // the elastic timeout that passed
  // Per-node --nnodes MIN:MAX: MIN, and `remaining` counts nodes; the job ended at once. 0: ranks.
  int min_nodes = 0;
};
// EveryHostBlacklisted: a failure blacklisted the last host of the discovery script's output that
// was not (with no --blacklist-cooldown-range, so none comes back): Horovod fails the job there.
struct EveryHostBlacklisted {
  std::string message;  // the failure and the hosts blacklisted
  int code = 1;         // the failure's exit code
};
struct ResetLimitReached {
  std::string message;  // the change past --reset-limit, and the limit
};
// NodesChanged: a node joined a per-node --nnodes MIN:MAX job that re-forms by restarting
// (--max-restarts, torchrun's way): this start ends so that the next one has it. Not a failure.
struct NodesChanged {
  std::string message;  // which node joined
};
using EndReason = std::variant<RankFailed, StartFailed, Interrupted, ExitedBeforeJoin, Stalled,
                               BelowMinimum, ResetLimitReached, EveryHostBlacklisted, NodesChanged>;

class FailurePolicy {
 public:
  // Job is what a policy acts on: the supervisor's view of the job.
  class Job {
   public:
    virtual ~Job() = default;
    // Exited: `rank` has ended (an exit, or its host was lost).
    virtual bool Exited(int rank) const = 0;
    // Ending: the teardown has begun. Done: every rank has ended.
    virtual bool Ending() const = 0;
    virtual bool Done() const = 0;
    // End records `reason` (the first one recorded is kept) and starts the teardown.
    virtual void End(EndReason reason) = 0;
    // MaybeDone finishes the job when every started rank has ended and the policy holds nothing.
    virtual void MaybeDone() = 0;
  };

  virtual ~FailurePolicy() = default;

  // OnExit: rank `rank` ended (already recorded). Returns true when the job must be torn down.
  virtual bool OnExit(int rank, const ExitInfo& exit) = 0;
  // OnHostLost: the ranks `ranks` of one host are gone with its agent (recorded as killed now).
  virtual void OnHostLost(const std::vector<int>& ranks, const std::string& why) = 0;
  // Survived: the job went on after `rank`'s end (a lost or given-up rank): never blamed.
  virtual bool Survived(int rank) const { return false; }
  // StoppedOnPurpose: the policy stopped `rank` (its host left the discovery output).
  virtual bool StoppedOnPurpose(int rank) const { return false; }
  // Holding: the job is not done even when every rank has ended (it waits for ranks).
  virtual bool Holding() const { return false; }
  // OnDone: the job is done; cancel what waits.
  virtual void OnDone() {}

  // Membership, for a policy whose members change (JobSupervisor's methods of these names say
  // what each means); a policy with fixed members ignores them.
  virtual void OnRanksAdded(const std::vector<int>& ranks) {}
  virtual bool OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                             std::chrono::steady_clock::time_point since, const std::string& host) {
    return false;
  }
  virtual void OnRanksRemoved(const std::vector<int>& ranks, const std::string& why) {}
  virtual std::string OnGenerationFormed(int generation) { return ""; }
  virtual const std::vector<MembershipChange>& MembershipChanges() const;
  virtual bool finishing() const { return false; }
  // Summary is one line on what the policy did ("" when nothing).
  virtual std::string Summary() const { return ""; }
};

// PolicyContext is what a policy is made with.
struct PolicyContext {
  boost::asio::io_context& io;
  const hostfile::SlotPlan& plan;
  RankControl& ranks;
  FailurePolicy::Job& job;
  std::chrono::milliseconds grace_period;
  std::function<void(const MembershipChange&)> on_membership_change;
};

// MakeFailurePolicy: the elastic policy when `elastic` is set, else fail fast.
std::unique_ptr<FailurePolicy> MakeFailurePolicy(const PolicyContext& context,
                                                 const std::optional<ElasticSpec>& elastic);

}  // namespace trainrun::launcher
