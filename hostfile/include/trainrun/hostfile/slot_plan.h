// Hosts and the slot plan: who is rank what, on which host (DESIGN.md, "Rank layout").
//
//   auto hosts = trainrun::hostfile::ParseHostList("a:2,b:2");
//   auto plan = trainrun::hostfile::PlanSlots(*hosts, /*num_proc=*/std::nullopt);
//   // plan->ranks[2] is rank 2: host b, local_rank 0, cross_rank 1.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace trainrun::hostfile {

// HostSpec is one host as the user wrote it, with its slot count.
struct HostSpec {
  std::string user;             // "" when not given (user@host)
  std::string host;             // name or address; IPv6 without brackets
  int slots = 1;                // ranks this host may run
  std::optional<int> max_slots; // hostfile's max_slots=, when given
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

}  // namespace trainrun::hostfile
