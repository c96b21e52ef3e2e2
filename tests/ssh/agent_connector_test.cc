// Connecting to agents over a real sshd: the greeting, a missing trainrun, and the first failure
// ending the attempt at once.
#include "remote/agent_connector.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "remote/trainrun_probe.h"
#include "ssh/ssh_host_channel.h"
#include "sshd_fixture.h"

namespace trainrun::launcher::remote {
namespace {

hostfile::HostSpec Host(const std::string& name) {
  hostfile::HostSpec host;
  host.host = name;
  return host;
}

// A shell command that greets like an agent (of `release`, speaking protocol `version`), then
// waits for its stdin to end.
std::string FakeAgent(const std::string& hostname, const std::string& release = TrainrunRelease(),
                      uint32_t version = kProtocolVersion) {
  std::string frame = EncodeHello({version, hostname, 7, "127.0.0.1", 0, release});
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

TEST_CASE("agents: another release with the same protocol is one line naming hosts and releases",
          "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  auto agents = ConnectAgents(*channel, {Host("127.0.0.1"), Host("localhost")},
                              FakeAgent("fake", "9.9.9"), absl::Now() + absl::Seconds(10));
  INFO(agents.status().message());
  REQUIRE(agents.ok());
  CHECK((*agents)[0].hello.release == "9.9.9");
  CHECK(ReleaseMismatch(*agents) ==
        absl::StrCat("host 127.0.0.1 runs trainrun 9.9.9, host localhost runs trainrun 9.9.9, "
                     "this is trainrun ",
                     TRAINRUN_RELEASE,
                     " (the same agent protocol, so the job goes on); install the same trainrun "
                     "version on every host"));
  // The same release: nothing to say.
  agents = ConnectAgents(*channel, {Host("127.0.0.1")}, FakeAgent("fake"),
                         absl::Now() + absl::Seconds(10));
  REQUIRE(agents.ok());
  CHECK(ReleaseMismatch(*agents).empty());
}

TEST_CASE("agents: an agent of another protocol is refused, naming host, releases and protocols",
          "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  // Protocol 2 did not carry the release.
  auto agent = ConnectAgent(*channel, Host("127.0.0.1"), FakeAgent("fake", "", 2),
                            absl::Now() + absl::Seconds(10));
  REQUIRE_FALSE(agent.ok());
  CHECK(agent.status().message() ==
        absl::StrCat("host 127.0.0.1: its trainrun (an older release) speaks agent protocol 2, "
                     "this trainrun ",
                     TRAINRUN_RELEASE,
                     " speaks 5; install the same trainrun version on every host"));
}

TEST_CASE("probe: the trainrun on each host, its release or why there is none", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  const std::string fake = world.dir() + "/fake trainrun";
  REQUIRE(testing::RunCommand({"sh", "-c",
                               "printf '#!/bin/sh\\necho trainrun 7.7.7\\n' > \"$0\" && "
                               "chmod +x \"$0\"",
                               fake}) == 0);
  const std::vector<hostfile::HostSpec> hosts = {Host("127.0.0.1"), Host("localhost")};
  auto start = absl::Now();
  auto found = ProbeTrainrun(*channel, hosts, fake, absl::Now() + absl::Seconds(10));
  REQUIRE(found.size() == 2);
  INFO(found[0].status().message());
  REQUIRE(found[0].ok());
  CHECK(*found[0] == "7.7.7");
  CHECK(found[1].ok());

  found = ProbeTrainrun(*channel, hosts, "/nonexistent/trainrun", absl::Now() + absl::Seconds(10));
  CHECK(found[0].status().code() == absl::StatusCode::kNotFound);
  CHECK(found[0].status().message() ==
        "host 127.0.0.1: trainrun not found at /nonexistent/trainrun; install it there, or pass "
        "--remote-trainrun PATH");

  const std::string python = world.dir() + "/python";
  REQUIRE(testing::RunCommand({"sh", "-c",
                               "printf '#!/bin/sh\\necho Python 3.11.2\\n' > \"$0\" && "
                               "chmod +x \"$0\"",
                               python}) == 0);
  found = ProbeTrainrun(*channel, {Host("127.0.0.1")}, python, absl::Now() + absl::Seconds(10));
  CHECK(found[0].status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(found[0].status().message() ==
        "host 127.0.0.1: " + python + " is not trainrun (`--version` printed \"Python 3.11.2\")");

  // A host that never answers: bounded by the deadline.
  const std::string silent = world.dir() + "/silent";
  REQUIRE(testing::RunCommand({"sh", "-c",
                               "printf '#!/bin/sh\\nsleep 30\\n' > \"$0\" && chmod +x \"$0\"",
                               silent}) == 0);
  start = absl::Now();
  found = ProbeTrainrun(*channel, {Host("127.0.0.1")}, silent, absl::Now() + absl::Seconds(4));
  CHECK(absl::Now() - start < absl::Seconds(8));
  CHECK(found[0].status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(found[0].status().message().find("host 127.0.0.1: ") == 0);
}

}  // namespace
}  // namespace trainrun::launcher::remote
