// The straggler line across hosts: trainrun in the client namespace of a NetnsCluster (a real sshd
// in each host namespace, tests/ssh/sshd_fixture.h) runs 4 ranks of straggler_worker on two hosts,
// 2 each, where rank 3 (the second host's) sleeps 200 ms before each allreduce; trainrun must name
// it, with its host, within 15 s of starting, and leave nothing behind.
#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

TEST_CASE("netns: the straggler line names a slow rank on another host within 15 s",
          "[ssh][netns][straggler]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string hosts =
      absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2");
  // Each line of trainrun's output with the second it arrived, after a first line with the start.
  const std::string stamp =
      "echo START $(date +%s.%N); \"$0\" \"$@\" 2>&1 | "
      "while IFS= read -r l; do echo \"$(date +%s.%N) $l\"; done";
  std::vector<std::string> argv =
      TrainrunInClient(world, cluster, TRAINRUN_BIN,
                       {"-np", "4", "-H", hosts, STRAGGLER_WORKER, "20", "3", "200", world.dir()});
  // Run through `sh -c STAMP trainrun ARGS...`: ip netns exec CLIENT env HOME=... sh -c STAMP ...
  argv.insert(argv.begin() + 6, {"sh", "-c", stamp});
  std::string out;
  const int status = RunCommand(argv, &out, 90);
  INFO(out);
  CHECK(status == 0);
  double start = 0, named = -1;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string first;
    words >> first;
    if (first == "START") {
      words >> start;
    } else if (named < 0 && line.find("straggler: rank 3 (host " + cluster.host_address(1) + ")") !=
                                std::string::npos) {
      named = std::stod(first);
    }
  }
  REQUIRE(named > 0);
  INFO("named after " << named - start << " s");
  CHECK(named - start <= 15);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

}  // namespace
}  // namespace trainrun::testing
