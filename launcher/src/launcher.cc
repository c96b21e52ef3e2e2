#include "trainrun/launcher/launcher.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job_plan.h"
#include "job_run.h"
#include "node_joiner.h"
#include "nodes/node_join.h"
#include "reach_hosts.h"
#include "start_deadline.h"
#include "trainrun/launcher/failure_policy.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace {

// Ignores SIGPIPE while alive (a rank that closed its stdin, a console that went away) and
// restores the previous disposition.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

absl::StatusOr<std::unique_ptr<OutputForwarder>> OpenOutput(const LaunchSpec& spec) {
  OutputOptions options;
  options.tag = spec.tag_output;
  options.prefix_timestamp = spec.prefix_timestamp;
  options.output_dir = spec.output_dir;
  options.world_size = spec.plan.size();
  options.log_dir = spec.log_dir;
  options.log_streams = spec.tee | spec.redirects;
  options.console_off = spec.redirects & ~spec.tee;
  return OutputForwarder::Create(options);
}

// WithRestartCount is `spec` for start `restart` of the job (0 the first): its ranks are told which
// (TRAINRUN_RESTART_COUNT, and torchrun's TORCHELASTIC_RESTART_COUNT) and how many may follow.
LaunchSpec WithRestartCount(const LaunchSpec& spec, int restart) {
  LaunchSpec attempt = spec;
  for (const char* name : {env::kRestartCount, env::kTorchRestartCount}) {
    attempt.exported.push_back({name, std::to_string(restart)});
  }
  for (const char* name : {env::kMaxRestarts, env::kTorchMaxRestarts}) {
    attempt.exported.push_back({name, std::to_string(spec.max_restarts)});
  }
  return attempt;
}

struct Attempt {
  int exit_code = 0;
  bool interrupted = false;  // trainrun got SIGINT, SIGTERM or SIGHUP
  std::string cause;         // the summary's first line; "" when the job succeeded
};

// RunOnce runs the job once: plan, reach the hosts, serve the rendezvous, start the ranks,
// supervise them, summarize. A status is a failure before any rank started.
absl::StatusOr<Attempt> RunOnce(const LaunchSpec& spec, OutputForwarder& output) {
  absl::StatusOr<JobPlan> plan = PlanJob(spec);
  if (!plan.ok()) return plan.status();
  // --start-timeout: one deadline, from the first connection to the last rank's start.
  const StartDeadline deadline = StartDeadline::From(spec.start_timeout);
  absl::StatusOr<std::vector<remote::RemoteAgent>> agents = ReachHosts(spec, *plan, deadline);
  if (!agents.ok()) return agents.status();

  JobRun run(spec, *plan, output, *std::move(agents));
  if (absl::Status served = run.ServeRendezvous(); !served.ok()) return served;
  run.StartRanks(deadline);
  run.Supervise();
  Attempt attempt;
  attempt.exit_code = run.Summarize();
  attempt.interrupted = run.interrupted();
  attempt.cause = run.cause();
  return attempt;
}

}  // namespace

// A job is a pipeline: plan, reach the hosts, serve the rendezvous, start the ranks, supervise
// them, summarize. Each phase is named in job_plan.h, reach_hosts.h and job_run.h.
absl::StatusOr<int> Launch(const LaunchSpec& spec) {
  if (spec.per_node) {
    if (spec.per_node->token.empty()) {
      Logger().warn(
          "no --rdzv-token (nor TRAINRUN_RDZV_TOKEN): any host that reaches {} may join this job "
          "as a node, as with torchrun",
          nodes::EndpointText(*spec.per_node));
    }
    // Per-node mode: node 0 runs the pipeline below, with the other nodes as its agents.
    if (spec.per_node->node_rank != 0) return RunJoinedNode(spec);
  }
  absl::StatusOr<std::unique_ptr<OutputForwarder>> output = OpenOutput(spec);
  if (!output.ok()) return output.status();
  IgnoreSigpipe ignore_sigpipe;
  // Fail fast and elastic run the job once (the failure policy is the supervisor's); restart runs
  // it again after each failure.
  if (FailureModeOf(spec) != FailureMode::kRestart) {
    absl::StatusOr<Attempt> attempt = RunOnce(spec, **output);
    if (!attempt.ok()) return attempt.status();
    return attempt->exit_code;
  }

  // --max-restarts: the whole job again, on the same hosts with a new rendezvous, until it
  // succeeds, trainrun is told to stop, or the restarts are spent.
  std::vector<std::string> causes;
  for (int restart = 0;; ++restart) {
    absl::StatusOr<Attempt> attempt = RunOnce(WithRestartCount(spec, restart), **output);
    if (!attempt.ok()) return attempt.status();
    if (attempt->exit_code == 0) {
      if (restart > 0) {
        Logger().info("the job succeeded on its restart {} of {}", restart, spec.max_restarts);
      }
      return 0;
    }
    causes.push_back(absl::StrCat("start ", restart + 1, ": ", attempt->cause));
    if (attempt->interrupted || restart == spec.max_restarts) {
      if (causes.size() > 1) {
        Logger().error("the job failed {} times (--max-restarts {}):\n  {}", causes.size(),
                       spec.max_restarts, absl::StrJoin(causes, "\n  "));
      }
      return attempt->exit_code;
    }
    Logger().warn("the job failed ({}); restarting it (restart {} of {})", attempt->cause,
                  restart + 1, spec.max_restarts);
  }
}

}  // namespace trainrun::launcher
