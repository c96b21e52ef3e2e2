// Slurm's compressed node lists and tasks-per-node strings.
#include "trainrun/hostfile/slurm.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace trainrun::hostfile {
namespace {

using Names = std::vector<std::string>;

TEST_CASE("ExpandSlurmNodelist expands ranges and keeps padding", "[hostfile][slurm]") {
  struct Case {
    std::string nodelist;
    Names expected;
  };
  auto c = GENERATE(values<Case>({
      {"gpu5", {"gpu5"}},
      {"node[01-03,07],gpu5", {"node01", "node02", "node03", "node07", "gpu5"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"rack[1-2]-n[1,3]", {"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}},
      {"a,b[1-2].cluster", {"a", "b1.cluster", "b2.cluster"}},
  }));
  CAPTURE(c.nodelist);
  auto names = ExpandSlurmNodelist(c.nodelist);
  REQUIRE(names.ok());
  CHECK(*names == c.expected);
}

TEST_CASE("ExpandSlurmNodelist rejects malformed lists", "[hostfile][slurm]") {
  auto bad = GENERATE(as<std::string>{}, "node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "a,,b",
                      "[1-2]", "n[1-99999999]", "n[]");
  CAPTURE(bad);
  CHECK_FALSE(ExpandSlurmNodelist(bad).ok());
}

TEST_CASE("ExpandSlurmTasksPerNode expands repeats", "[hostfile][slurm]") {
  auto counts = ExpandSlurmTasksPerNode("2(x3),1");
  REQUIRE(counts.ok());
  CHECK(*counts == std::vector<int>{2, 2, 2, 1});
  for (std::string bad : {"", "2(x)", "2(x3", "0", "x", "2(x0)", "5000"}) {
    CAPTURE(bad);
    CHECK_FALSE(ExpandSlurmTasksPerNode(bad).ok());
  }
}

TEST_CASE("SlurmHosts pairs nodes with their task counts", "[hostfile][slurm]") {
  auto hosts = SlurmHosts("node[01-03],gpu5", "2(x3),1");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 4);
  CHECK((*hosts)[0].host == "node01");
  CHECK((*hosts)[2].slots == 2);
  CHECK((*hosts)[3].host == "gpu5");
  CHECK((*hosts)[3].slots == 1);

  auto one_each = SlurmHosts("a,b", std::nullopt);
  REQUIRE(one_each.ok());
  CHECK((*one_each)[1].slots == 1);

  auto mismatch = SlurmHosts("node[1-3]", "2(x2)");
  REQUIRE_FALSE(mismatch.ok());
  CHECK(std::string(mismatch.status().message()) ==
        "SLURM_TASKS_PER_NODE '2(x2)' gives counts for 2 nodes but SLURM_JOB_NODELIST "
        "'node[1-3]' has 3");
}

}  // namespace
}  // namespace trainrun::hostfile
