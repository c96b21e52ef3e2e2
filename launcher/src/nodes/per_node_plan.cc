#include "absl/strings/str_cat.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

absl::StatusOr<hostfile::SlotPlan> PerNodeSlotPlan(const PerNodeSpec& spec,
                                                   const std::vector<int>& counts) {
  std::vector<hostfile::HostSpec> hosts;
  int total = 0;
  for (int node = 0; node < spec.nnodes && node < static_cast<int>(counts.size()); ++node) {
    if (counts[node] == 0 && node > 0) continue;  // a node of a MIN:MAX range that did not join
    hostfile::HostSpec host;
    host.host = node == 0 ? spec.endpoint_host : absl::StrCat("node", node);
    host.slots = counts[node];
    total += counts[node];
    hosts.push_back(std::move(host));
  }
  return hostfile::PlanSlots(hosts, total);
}

}  // namespace trainrun::launcher
