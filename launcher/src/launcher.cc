#include "trainrun/launcher/launcher.h"

#include <signal.h>

#include "job_plan.h"
#include "job_run.h"
#include "node_joiner.h"
#include "nodes/node_join.h"
#include "reach_hosts.h"
#include "start_deadline.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"

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
  absl::StatusOr<JobPlan> plan = PlanJob(spec);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::unique_ptr<OutputForwarder>> output = OpenOutput(spec);
  if (!output.ok()) return output.status();
  IgnoreSigpipe ignore_sigpipe;

  // --start-timeout: one deadline, from the first connection to the last rank's start.
  const StartDeadline deadline = StartDeadline::From(spec.start_timeout);
  absl::StatusOr<std::vector<remote::RemoteAgent>> agents = ReachHosts(spec, *plan, deadline);
  if (!agents.ok()) return agents.status();

  JobRun run(spec, *plan, **output, *std::move(agents));
  if (absl::Status served = run.ServeRendezvous(); !served.ok()) return served;
  run.StartRanks(deadline);
  run.Supervise();
  return run.Summarize();
}

}  // namespace trainrun::launcher
