// Per-node mode on every node but node 0 (nodes/node_join.h): this node's trainrun joins node 0's
// and then serves as this node's agent over that connection until the job ends; it prints the
// job's summary as node 0 decided it and exits with the job's code.
#pragma once

#include "absl/status/statusor.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// RunJoinedNode joins node 0 at spec.per_node's endpoint and runs this node's ranks as node 0's
// trainrun says. Returns trainrun's exit code; an error when node 0 never answered or refused
// this node (one sentence naming the endpoint or the flag that differs).
absl::StatusOr<int> RunJoinedNode(const LaunchSpec& spec);

}  // namespace trainrun::launcher
