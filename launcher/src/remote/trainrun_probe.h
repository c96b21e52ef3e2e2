// Asking each remote host, for --dry-run, whether the trainrun the agents would run is there and
// which release it is: `<remote trainrun> --version` through the job's HostChannel, on every host
// at once, all before one deadline (--start-timeout).
//
//   auto found = ProbeTrainrun(*channel, hosts, "/usr/bin/trainrun", absl::Now() +
//   absl::Seconds(30)); found[0].ok() ? *found[0] /* "0.1.0" */ : found[0].status().message() /*
//   "host h1: ..." */
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel/host_channel.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::launcher::remote {

// ProbeTrainrun runs `<trainrun> --version` on each of `hosts` through `channel` and returns, in
// the hosts' order, the release it printed (followed, after a newline, by what
// `<trainrun> --gpu-probe` says of the host's GPUs, when that trainrun has it), or why there is
// none, in one sentence naming the host: NotFound when nothing is at that path there,
// FailedPrecondition when what is there is not trainrun, DeadlineExceeded when the host did not
// answer before `deadline`, else the channel's own reason (name not resolved, refused,
// authentication, ...).
std::vector<absl::StatusOr<std::string>> ProbeTrainrun(channel::HostChannel& channel,
                                                       const std::vector<hostfile::HostSpec>& hosts,
                                                       const std::string& trainrun,
                                                       absl::Time deadline);

}  // namespace trainrun::launcher::remote
