// Hosts and the slot plan: who is rank what, on which host (DESIGN.md, "Rank layout").
//
//   auto hosts = trainrun::hostfile::ParseHostList("a:2,b:2");
//   auto plan = trainrun::hostfile::PlanSlots(*hosts, /*num_proc=*/std::nullopt);
//   // plan->ranks[2] is rank 2: host b, local_rank 0, cross_rank 1.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainrun::hostfile {

// HostSpec is one host as the user wrote it, with its slot count.
struct HostSpec {
  std::string user;              // "" when not given (user@host)
  std::string host;              // name or address; IPv6 without brackets
  int slots = 1;                 // ranks this host may run
  std::optional<int> max_slots;  // hostfile's max_slots=, when given
};

// RankAssignment is one rank's place in the job.
struct RankAssignment {
  int rank = 0;
  int local_rank = 0;
  int local_size = 0;
  int cross_rank = 0;
  int cross_size = 0;
  int host_index = 0;  // index into SlotPlan::hosts
};

// SlotPlan is the whole job's layout: the hosts that run at least one rank, in the order given,
// and one RankAssignment per rank, indexed by rank.
struct SlotPlan {
  std::vector<HostSpec> hosts;
  std::vector<RankAssignment> ranks;

  int size() const { return static_cast<int>(ranks.size()); }
  const HostSpec& HostOf(int rank) const { return hosts[ranks[rank].host_index]; }
};

// kMaxSlotsPerHost bounds a host's slot count, so a typo such as `a:40000` is rejected rather
// than starting forty thousand processes.
inline constexpr int kMaxSlotsPerHost = 4096;

// PlanSlots lays ranks out over `hosts` as DESIGN.md's contract says: host-major in the order
// given; local_rank is the index on the host; cross_rank is the host's index among the hosts that
// have that local_rank, cross_size their number. `num_proc` omitted uses every slot; below the slot
// total it uses the first slots in order (hosts left without a rank are dropped from the plan).
// Errors (InvalidArgument): no hosts, num_proc < 1, num_proc above the slot total (the message
// names both numbers).
absl::StatusOr<SlotPlan> PlanSlots(const std::vector<HostSpec>& hosts, std::optional<int> num_proc);

}  // namespace trainrun::hostfile
