// Connecting to agents over a real sshd: the greeting, a missing trainrun, and the first failure
// ending the attempt at once.
#include "remote/agent_connector.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "sshd_fixture.h"

namespace trainrun::launcher::remote {
namespace {

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
  std::vector<ssh::SshTarget> targets;
  for (const char* host : {"127.0.0.1", "localhost"}) {
    targets.push_back(*ssh::ResolveSshTarget("", host, options));
  }
  std::vector<std::pair<int, int>> progress;
  auto agents = ConnectAgents(targets, FakeAgent("fake"), options, absl::Now() + absl::Seconds(10),
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
  auto target = *ssh::ResolveSshTarget("", "127.0.0.1", options);
  auto agent = ConnectAgent(target, AgentCommand("/nonexistent/trainrun"), options,
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
  options.port = world.sshd().port();
  std::vector<ssh::SshTarget> targets = {*ssh::ResolveSshTarget("", "127.0.0.1", options)};
  ssh::SshOptions refused = options;
  refused.port = testing::FreeLoopbackPort();
  targets.push_back(*ssh::ResolveSshTarget("", "localhost", refused));
  auto start = std::chrono::steady_clock::now();
  // The first host's agent never greets; the second host refuses.
  auto agents = ConnectAgents(targets, "sleep 30", options, absl::Now() + absl::Seconds(10), {});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(agents.ok());
  CHECK(agents.status().message().find("host localhost") != std::string::npos);
  CHECK(agents.status().message().find("connection refused") != std::string::npos);
  CHECK(seconds < 3);
}

}  // namespace
}  // namespace trainrun::launcher::remote
