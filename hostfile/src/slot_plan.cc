#include "trainrun/hostfile/slot_plan.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace trainrun::hostfile {

absl::StatusOr<SlotPlan> PlanSlots(const std::vector<HostSpec>& hosts,
                                   std::optional<int> num_proc) {
  if (hosts.empty()) return absl::InvalidArgumentError("no hosts to run on");
  int64_t total = 0;
  for (const HostSpec& host : hosts) total += host.slots;
  if (num_proc && *num_proc < 1) {
    return absl::InvalidArgumentError(absl::StrCat("-np must be at least 1, not ", *num_proc));
  }
  if (num_proc && *num_proc > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("-np ", *num_proc, " asks for more processes than the ", total,
                     total == 1 ? " slot on " : " slots on ", hosts.size(),
                     hosts.size() == 1 ? " host" : " hosts", "; lower -np or add slots (host:N)"));
  }
  const int size = num_proc.value_or(static_cast<int>(total));

  // Host-major fill: each host takes up to its slots, in the order given.
  SlotPlan plan;
  plan.ranks.reserve(size);
  for (const HostSpec& host : hosts) {
    int remaining = size - static_cast<int>(plan.ranks.size());
    if (remaining == 0) break;
    int count = std::min(host.slots, remaining);
    int host_index = static_cast<int>(plan.hosts.size());
    plan.hosts.push_back(host);
    for (int local = 0; local < count; ++local) {
      RankAssignment r;
      r.rank = static_cast<int>(plan.ranks.size());
      r.local_rank = local;
      r.local_size = count;
      r.host_index = host_index;
      plan.ranks.push_back(r);
    }
  }

  // cross_rank: the host's index among hosts that have this local_rank, i.e. among the hosts with
  // more than local_rank ranks; cross_size: how many such hosts there are. Ranks are in host
  // order, so one pass counting hosts per local_rank gives both (linear, not ranks x hosts).
  std::vector<int> hosts_with_local_rank;
  for (RankAssignment& r : plan.ranks) {
    if (static_cast<size_t>(r.local_rank) >= hosts_with_local_rank.size()) {
      hosts_with_local_rank.resize(r.local_rank + 1, 0);
    }
    r.cross_rank = hosts_with_local_rank[r.local_rank]++;
  }
  for (RankAssignment& r : plan.ranks) r.cross_size = hosts_with_local_rank[r.local_rank];
  return plan;
}

}  // namespace trainrun::hostfile
