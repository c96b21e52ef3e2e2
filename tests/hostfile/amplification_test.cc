// Inputs that are short but expand a lot: each is refused or planned quickly, not after seconds
// of work and gigabytes of memory.
#include <time.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/hostfile/slurm.h"

namespace {

// CPU time, not wall time: the bound is on the work done, whatever else the machine runs.
struct CpuClock {
  using time_point = double;
  static double now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
};
using Clock = CpuClock;

double SecondsSince(double start) { return Clock::now() - start; }

}  // namespace

TEST_CASE("a short node list that expands past the cap is refused before it is expanded",
          "[hostfile][slurm]") {
  // 3.2 KB: one group of 400 whole 0-65535 ranges, 26 million names if expanded.
  std::string nodelist = "a[0-65535";
  while (nodelist.size() < 3200) nodelist += ",0-65535";
  nodelist += "]";
  auto start = Clock::now();
  auto hosts = trainrun::hostfile::SlurmHosts(nodelist, std::nullopt);
  const double seconds = SecondsSince(start);
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().message().find("expands to more than 65536 hosts") != std::string::npos);
  CHECK(seconds < 0.5);  // 18.6 s and 1.9 GB before
}

TEST_CASE("65536 Slurm nodes are listed and planned in linear time", "[hostfile][slurm]") {
  auto start = Clock::now();
  auto hosts = trainrun::hostfile::SlurmHosts("node[00000-65535]", std::nullopt);
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 65536);
  auto plan = trainrun::hostfile::PlanSlots(*hosts, std::nullopt);
  REQUIRE(plan.ok());
  const double seconds = SecondsSince(start);
  CHECK(plan->size() == 65536);
  CHECK(plan->ranks[65535].cross_rank == 65535);
  CHECK(plan->ranks[65535].cross_size == 65536);
  CHECK(seconds < 1.0);  // 6.6 s before: quadratic
}

TEST_CASE("cross ranks count only the hosts that have that local rank", "[hostfile][plan]") {
  // a:3 b:1 c:2 → local_rank 0 on a,b,c; 1 on a,c; 2 on a only.
  std::vector<trainrun::hostfile::HostSpec> hosts(3);
  hosts[0].host = "a";
  hosts[0].slots = 3;
  hosts[1].host = "b";
  hosts[1].slots = 1;
  hosts[2].host = "c";
  hosts[2].slots = 2;
  auto plan = trainrun::hostfile::PlanSlots(hosts, std::nullopt);
  REQUIRE(plan.ok());
  const int expected[6][2] = {{0, 3}, {0, 2}, {0, 1}, {1, 3}, {2, 3}, {1, 2}};  // cross rank, size
  for (int r = 0; r < 6; ++r) {
    INFO("rank " << r);
    CHECK(plan->ranks[r].cross_rank == expected[r][0]);
    CHECK(plan->ranks[r].cross_size == expected[r][1]);
  }
}
