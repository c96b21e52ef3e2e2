// --sync-dst-dir in the job's pipeline (launcher.cc): the source directory copied to DIR on this
// machine (when ranks run here) before the plan checks DIR, and to the remote hosts once their
// agents are connected, before any Job (remote/file_sync.h). On a terminal, one progress line
// while a copy takes longer than a second (else a line every ten seconds); then one summary line.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "remote/agent_connector.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// RanksHere says whether any of the job's hosts is this machine (so DIR is needed here too).
bool RanksHere(const LaunchSpec& spec);

// SyncHere copies spec.sync's source to its directory on this machine.
absl::Status SyncHere(const LaunchSpec& spec);

// SyncRemote copies spec.sync's source to its directory on every agent's host, in parallel. The
// first failure is one line naming the host (InvalidArgument: trainrun exits 2, as for a bad host).
absl::Status SyncRemote(const LaunchSpec& spec, std::vector<remote::RemoteAgent>& agents);

}  // namespace trainrun::launcher
