// The rank layout of DESIGN.md: host-major, local_rank, cross_rank, cross_size.
#include "trainrun/hostfile/slot_plan.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "trainrun/hostfile/host_list.h"

namespace trainrun::hostfile {
namespace {

// One rank's expected layout: host, local_rank, local_size, cross_rank, cross_size.
struct Expected {
  std::string host;
  int local_rank, local_size, cross_rank, cross_size;
};

void CheckPlan(const std::string& list, std::optional<int> np,
               const std::vector<Expected>& expected) {
  CAPTURE(list, np.value_or(-1));
  auto hosts = ParseHostList(list);
  REQUIRE(hosts.ok());
  auto plan = PlanSlots(*hosts, np);
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == static_cast<int>(expected.size()));
  for (int rank = 0; rank < plan->size(); ++rank) {
    CAPTURE(rank);
    const RankAssignment& r = plan->ranks[rank];
    CHECK(r.rank == rank);
    CHECK(plan->HostOf(rank).host == expected[rank].host);
    CHECK(r.local_rank == expected[rank].local_rank);
    CHECK(r.local_size == expected[rank].local_size);
    CHECK(r.cross_rank == expected[rank].cross_rank);
    CHECK(r.cross_size == expected[rank].cross_size);
  }
}

TEST_CASE("PlanSlots fills hosts in order", "[hostfile][plan]") {
  CheckPlan("a:2,b:2", std::nullopt,
            {{"a", 0, 2, 0, 2}, {"a", 1, 2, 0, 2}, {"b", 0, 2, 1, 2}, {"b", 1, 2, 1, 2}});
  CheckPlan("localhost:4", 4,
            {{"localhost", 0, 4, 0, 1},
             {"localhost", 1, 4, 0, 1},
             {"localhost", 2, 4, 0, 1},
             {"localhost", 3, 4, 0, 1}});
}

TEST_CASE("PlanSlots gives uneven hosts Horovod's cross ranks", "[hostfile][plan]") {
  // local_rank 0 and 1 exist on a, b, c; local_rank 2 and 3 only on a and c.
  CheckPlan("a:4,b:2,c:4", std::nullopt,
            {{"a", 0, 4, 0, 3},
             {"a", 1, 4, 0, 3},
             {"a", 2, 4, 0, 2},
             {"a", 3, 4, 0, 2},
             {"b", 0, 2, 1, 3},
             {"b", 1, 2, 1, 3},
             {"c", 0, 4, 2, 3},
             {"c", 1, 4, 2, 3},
             {"c", 2, 4, 1, 2},
             {"c", 3, 4, 1, 2}});
}

TEST_CASE("PlanSlots with -np below the total takes the first slots", "[hostfile][plan]") {
  CheckPlan("a:2,b:2,c:2", 3, {{"a", 0, 2, 0, 2}, {"a", 1, 2, 0, 1}, {"b", 0, 1, 1, 2}});
  auto hosts = ParseHostList("a:2,b:2,c:2");
  auto plan = PlanSlots(*hosts, 3);
  REQUIRE(plan.ok());
  CHECK(plan->hosts.size() == 2);  // c runs nothing, so it is not in the plan
}

TEST_CASE("PlanSlots rejects impossible sizes, naming the numbers", "[hostfile][plan]") {
  auto hosts = ParseHostList("a:2,b:2");
  REQUIRE(hosts.ok());
  auto too_many = PlanSlots(*hosts, 8);
  REQUIRE_FALSE(too_many.ok());
  CHECK(std::string(too_many.status().message()) ==
        "-np 8 asks for more processes than the 4 slots on 2 hosts; lower -np or add slots "
        "(host:N)");
  auto zero = PlanSlots(*hosts, 0);
  REQUIRE_FALSE(zero.ok());
  CHECK(std::string(zero.status().message()) == "-np must be at least 1, not 0");
  CHECK_FALSE(PlanSlots(*hosts, -3).ok());
  CHECK_FALSE(PlanSlots({}, 1).ok());
}

}  // namespace
}  // namespace trainrun::hostfile
