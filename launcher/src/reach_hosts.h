// The second phase of a job (launcher.cc): the hosts that are not this machine, reached through the
// job's HostChannel (SSH today) and greeted by their agents, before anything starts anywhere.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "channel/host_channel.h"
#include "job_plan.h"
#include "remote/agent_connector.h"
#include "start_deadline.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// ReachHosts connects to the agents of plan.remote_hosts through `channel` (the job's,
// remote::MakeHostChannel; unused, and may be null, when there are none), all in parallel, before
// `deadline`, and
// returns them in that order (none when every host is this machine). On a terminal it shows one
// progress line while that takes longer than a second. The first failure is returned at once (one
// line naming the host and the reason; InvalidArgument, so trainrun exits 2 as for any bad host),
// and every connection already open is closed.
absl::StatusOr<std::vector<remote::RemoteAgent>> ReachHosts(const LaunchSpec& spec,
                                                            const JobPlan& plan,
                                                            const StartDeadline& deadline,
                                                            channel::HostChannel* channel);

}  // namespace trainrun::launcher
