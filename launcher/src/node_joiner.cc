#include "node_joiner.h"

#include "absl/strings/str_replace.h"
#include "nodes/node_join.h"
#include "remote/agent.h"
#include "remote/agent_protocol.h"
#include "start_deadline.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"

namespace trainrun::launcher {

absl::StatusOr<int> RunJoinedNode(const LaunchSpec& spec) {
  const PerNodeSpec& node = *spec.per_node;
  // This node's ranks' lines also show here (node 0 shows every rank's), tagged the same way.
  OutputOptions output_options;
  output_options.tag = spec.tag_output;
  output_options.prefix_timestamp = spec.prefix_timestamp;
  output_options.world_size = spec.plan.size();
  absl::StatusOr<std::unique_ptr<OutputForwarder>> output = OutputForwarder::Create(output_options);
  if (!output.ok()) return output.status();

  // Node 0 may start the job again (--max-restarts, or a node joined a --nnodes MIN:MAX job): then
  // its JobEnd says `rejoin`, and this node joins again, with a start timeout of its own.
  for (bool rejoin = false;; rejoin = true) {
    const StartDeadline deadline = StartDeadline::From(spec.start_timeout);
    std::string seal_key;
    absl::StatusOr<posix::UniqueFd> connection =
        nodes::DialNodeZero(node, deadline.at, spec.start_timeout, &seal_key, rejoin);
    if (!connection.ok()) return connection.status();
    Logger().debug("joined node 0 at {} as node {}", nodes::EndpointText(node), node.node_rank);

    remote::AgentOptions options;
    options.on_output = [&output](int rank, OutputStream stream, std::string_view bytes) {
      (*output)->Write(rank, stream, bytes);
    };
    options.in_fd = connection->get();
    options.out_fd = connection->get();
    // Node 0 sealed the job's token with this join's key: it never crossed the network in clear.
    options.unseal_token = [seal_key](const std::string& sealed) {
      return nodes::Seal(seal_key, sealed);
    };
    // Node 0 sends the Job once every node has joined, within its own start timeout.
    options.first_silence = spec.start_timeout + remote::kSilenceLimit;
    options.await_job_end = true;
    options.watch_parent = false;
    const remote::AgentOutcome outcome = remote::RunAgentOn(remote::TrainrunRelease(), options);
    (*output)->EndLines();
    if (outcome.job_end && outcome.job_end->rejoin) {
      Logger().info("node 0 starts the job again: node {} joins it again", node.node_rank);
      continue;
    }
    if (outcome.job_end) {
      if (!outcome.job_end->summary.empty()) {
        Logger().error("{}", absl::StrReplaceAll(outcome.job_end->summary, {{"\n", "\n  "}}));
      }
      return outcome.job_end->exit_code;
    }
    if (outcome.launcher_gone) {
      Logger().error(
          "lost node 0's trainrun at {} before the job ended; this node's ranks (node {}) were "
          "ended",
          nodes::EndpointText(node), node.node_rank);
      return 1;
    }
    return outcome.exit_code;
  }
}

}  // namespace trainrun::launcher
