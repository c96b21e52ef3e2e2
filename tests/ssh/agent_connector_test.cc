// Connecting to agents over a real sshd: the greeting, a missing trainrun, and the first failure
// ending the attempt at once.
#include "remote/agent_connector.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "ssh/ssh_host_channel.h"
#include "sshd_fixture.h"

namespace trainrun::launcher::remote {
namespace {

hostfile::HostSpec Host(const std::string& name) {
  hostfile::HostSpec host;
  host.host = name;
  return host;
}

// A shell command that greets like an agent, then waits for its stdin to end.
std::string FakeAgent(const std::string& hostname) {
  std::string frame = EncodeHello({kProtocolVersion, hostname, 7, "127.0.0.1"});
  std::string printf_arg;
  for (unsigned char c : frame) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "\\%03o", c);
    printf_arg += octal;
  }
  return "printf '" + printf_arg + "'; cat >/dev/null";
}

TEST_CASE("agents: hosts connect in parallel and greet", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  std::vector<std::pair<int, int>> progress;
  auto agents = ConnectAgents(*channel, {Host("127.0.0.1"), Host("localhost")}, FakeAgent("fake"),
                              absl::Now() + absl::Seconds(10),
                              [&](int n, int total) { progress.emplace_back(n, total); });
  INFO(agents.status().message());
  REQUIRE(agents.ok());
  REQUIRE(agents->size() == 2);
  CHECK((*agents)[0].hello.hostname == "fake");
  CHECK((*agents)[0].hello.pid == 7);
  CHECK(progress.back() == std::make_pair(2, 2));
  CHECK(RendezvousBindAddress(*agents) == "127.0.0.1");
}

TEST_CASE("agents: trainrun missing on the host says so", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  auto agent = ConnectAgent(*channel, Host("127.0.0.1"), AgentCommand("/nonexistent/trainrun"),
                            absl::Now() + absl::Seconds(10));
  REQUIRE_FALSE(agent.ok());
  CHECK(agent.status().message().find("trainrun is not installed at that path") !=
        std::string::npos);
  CHECK(agent.status().message().find("--remote-trainrun") != std::string::npos);
}

TEST_CASE("agents: the first failure returns at once, naming its host", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  // Each host's port from the SSH config: the first is the sshd, the second refuses.
  REQUIRE(
      testing::RunCommand({"sh", "-c",
                           "printf 'Host 127.0.0.1\\n  Port %s\\nHost localhost\\n  Port %s\\n' "
                           "\"$0\" \"$1\" > " +
                               world.ssh_dir() + "/config",
                           std::to_string(world.sshd().port()),
                           std::to_string(testing::FreeLoopbackPort())}) == 0);
  auto channel = ssh::MakeSshHostChannel(options);
  auto start = std::chrono::steady_clock::now();
  // The first host's agent never greets; the second host refuses.
  auto agents = ConnectAgents(*channel, {Host("127.0.0.1"), Host("localhost")}, "sleep 30",
                              absl::Now() + absl::Seconds(10));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(agents.ok());
  CHECK(agents.status().message().find("host localhost") != std::string::npos);
  CHECK(agents.status().message().find("connection refused") != std::string::npos);
  CHECK(seconds < 3);
}

}  // namespace
}  // namespace trainrun::launcher::remote
