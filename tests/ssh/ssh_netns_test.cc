// The SSH client between network namespaces the test makes (10.213.1.0/24, inside them only):
// reaching a host's sshd on port 22, and the failures that need a real network to show.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>

#include "skip_test.h"
#include "ssh/remote_channel.h"
#include "sshd_fixture.h"

namespace trainrun::launcher::ssh {
namespace {

using testing::NetnsCluster;
using testing::ScopedNetns;
using testing::SshWorld;

absl::StatusOr<std::string> RunIn(const std::string& ns, const std::string& host,
                                  const std::string& command, const SshOptions& options,
                                  double* seconds = nullptr) {
  ScopedNetns in(ns);
  auto start = std::chrono::steady_clock::now();
  auto target = ResolveSshTarget("", host, options);
  if (!target.ok()) return target.status();
  auto channel = OpenRemoteCommand(*target, command, options);
  if (seconds) {
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (!channel.ok()) return channel.status();
  (*channel)->CloseStdin();
  std::string output;
  char buffer[1024];
  for (;;) {
    auto n = (*channel)->Read(buffer, sizeof buffer, absl::Seconds(10));
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    output.append(buffer, *n);
  }
  if (absl::Status end = (*channel)->EndStatus(); !end.ok()) return end;
  return output;
}

TEST_CASE("netns: two hosts reached on port 22, and the local address toward them",
          "[ssh][netns]") {
  if (!testing::CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  for (int i = 0; i < 2; ++i) {
    auto out = RunIn(cluster.client_ns(), cluster.host_address(i),
                     "ip -4 -o addr show dev eth0 | awk '{print $4}'; echo ${SSH_CONNECTION%% *}",
                     options);
    INFO(out.status().message());
    REQUIRE(out.ok());
    CHECK(*out == cluster.host_address(i) + "/24\n10.213.1.1\n");
  }
  {
    ScopedNetns in(cluster.client_ns());
    auto target = ResolveSshTarget("", cluster.host_address(0), options);
    auto channel = OpenRemoteCommand(*target, "true", options);
    REQUIRE(channel.ok());
    CHECK((*channel)->LocalAddress() == "10.213.1.1");
  }
  // The openssh client through the same namespaces.
  options.client = SshClient::kOpenssh;
  auto out = RunIn(cluster.client_ns(), cluster.host_address(1), "hostname -I", options);
  INFO(out.status().message());
  REQUIRE(out.ok());
  CHECK(out->find(cluster.host_address(1)) != std::string::npos);
}

TEST_CASE("netns: unresolvable name and unreachable host, each in its own words", "[ssh][netns]") {
  if (!testing::CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(1, world.dir(), world.dir() + "/keys/authorized_keys");
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.connect_timeout = absl::Seconds(2);
  double seconds = 0;
  // No resolver is reachable from inside the namespace, so the lookup fails at once.
  auto out = RunIn(cluster.client_ns(), "no-such-host.invalid", "true", options, &seconds);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().message().find("host no-such-host.invalid: name not resolved") !=
        std::string::npos);
  CHECK(seconds < 3);
  // An address on the test subnet that nobody holds: no ARP answer.
  out = RunIn(cluster.client_ns(), "10.213.1.99", "true", options, &seconds);
  REQUIRE_FALSE(out.ok());
  INFO(out.status().message());
  CHECK(out.status().message().find("host 10.213.1.99") != std::string::npos);
  bool timed_out = out.status().message().find("timed out") != std::string::npos ||
                   out.status().message().find("No route to host") != std::string::npos;
  CHECK(timed_out);
  CHECK(seconds < 4);
}

}  // namespace
}  // namespace trainrun::launcher::ssh
