// trainrun.run(fn) over SSH: tests/python_run/over_ssh.py, run in the client namespace of a
// NetnsCluster (two host namespaces, each with its own sshd), calls trainrun.run with
// hosts="10.213.1.11:2,10.213.1.12:2"; the ranks connect back to the caller across the bridge.
// Afterwards nothing may be left on either host.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

TEST_CASE("trainrun.run over two SSH hosts returns every rank's value", "[python][ssh][netns]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string hosts =
      absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2");
  std::string out;
  int status =
      RunCommand(InClient(world, cluster,
                          {"env", "PYTHONPATH=" TRAINRUN_PYTHONPATH, "TRAINRUN_BIN=" TRAINRUN_BIN,
                           "TRAINRUN_TIMEOUT=60", TRAINRUN_PYTHON, TRAINRUN_OVER_SSH, hosts,
                           world.user_ed25519()}),
                 &out, 120);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("over ssh: OK") != std::string::npos);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!cluster.HostProcesses(0).empty() || !cluster.HostProcesses(1).empty()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(cluster.HostProcesses(0).empty());
  CHECK(cluster.HostProcesses(1).empty());
}

}  // namespace
}  // namespace trainrun::testing
