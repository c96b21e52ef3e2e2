// The agent over a real sshd: a job's ranks start with their environment, their output and exits
// come back as frames, and closing the connection kills the ranks.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <thread>

#include "remote/agent_connector.h"
#include "skip_test.h"
#include "ssh/ssh_host_channel.h"
#include "sshd_fixture.h"

#ifndef TRAINRUN_TEST_AGENT
#error "TRAINRUN_TEST_AGENT must name the agent binary"
#endif

namespace trainrun::launcher::remote {
namespace {

hostfile::HostSpec Host(const std::string& name) {
  hostfile::HostSpec host;
  host.host = name;
  return host;
}

std::vector<Frame> ReadUntilDone(RemoteAgent& agent, absl::Duration timeout) {
  std::vector<Frame> frames;
  absl::Time deadline = absl::Now() + timeout;
  char buffer[4096];
  while (absl::Now() < deadline) {
    for (;;) {
      auto next = agent.reader.Next();
      REQUIRE(next.ok());
      if (!next->has_value()) break;
      frames.push_back(**next);
      if (frames.back().type == MessageType::kDone) return frames;
    }
    auto n = agent.stream->Read(buffer, sizeof buffer, absl::Seconds(1));
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) continue;
    if (!n.ok() || *n == 0) break;
    agent.reader.Append(absl::string_view(buffer, *n));
  }
  return frames;
}

TEST_CASE("agent: runs its ranks and reports output and exits", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  auto agent = ConnectAgent(*channel, Host("127.0.0.1"), AgentCommand(TRAINRUN_TEST_AGENT),
                            absl::Now() + absl::Seconds(10));
  INFO(agent.status().message());
  REQUIRE(agent.ok());
  Job job;
  job.cwd = "/tmp";
  job.argv = {"sh", "-c", "echo rank=$TRAINRUN_RANK pwd=$(pwd); exit $TRAINRUN_RANK"};
  job.ranks = {{0, {"TRAINRUN_RANK=0", "PATH=/usr/bin:/bin"}},
               {3, {"TRAINRUN_RANK=3", "PATH=/usr/bin:/bin"}}};
  REQUIRE(agent->stream->Write(EncodeJob(job), absl::Seconds(5)).ok());
  std::vector<Frame> frames = ReadUntilDone(*agent, absl::Seconds(10));
  std::map<int, std::string> output;
  std::map<int, int> codes;
  int started = 0;
  for (const Frame& f : frames) {
    if (f.type == MessageType::kStarted) ++started;
    if (f.type == MessageType::kOutput) {
      auto o = *DecodeOutput(f.payload);
      output[o.rank] += o.bytes;
    }
    if (f.type == MessageType::kExit) {
      auto e = *DecodeExit(f.payload);
      codes[e.rank] = e.code;
    }
  }
  REQUIRE(!frames.empty());
  CHECK(frames.back().type == MessageType::kDone);
  CHECK(started == 2);
  CHECK(output[0] == "rank=0 pwd=/tmp\n");
  CHECK(output[3] == "rank=3 pwd=/tmp\n");
  CHECK(codes[0] == 0);
  CHECK(codes[3] == 3);
}

TEST_CASE("agent: --bind-to core pins the host's ranks to disjoint cores and says which",
          "[ssh][flags]") {
  if (std::thread::hardware_concurrency() < 2) {
    trainrun::testing::SkipTest("one CPU: disjoint cores cannot be shown here");
  }
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  auto agent = ConnectAgent(*channel, Host("127.0.0.1"), AgentCommand(TRAINRUN_TEST_AGENT),
                            absl::Now() + absl::Seconds(10));
  REQUIRE(agent.ok());
  Job job;
  job.argv = {"sh", "-c", "sed -n 's/^Cpus_allowed_list:\\s*//p' /proc/self/status"};
  job.ranks = {{4, {"PATH=/usr/bin:/bin"}}, {5, {"PATH=/usr/bin:/bin"}}};
  job.bind_to = static_cast<uint32_t>(BindTo::kCore);
  REQUIRE(agent->stream->Write(EncodeJob(job), absl::Seconds(5)).ok());
  std::map<int, std::string> output, binding;
  for (const Frame& f : ReadUntilDone(*agent, absl::Seconds(10))) {
    if (f.type == MessageType::kStarted) {
      auto started = *DecodeStarted(f.payload);
      binding[started.rank] = started.binding;
    }
    if (f.type == MessageType::kOutput) {
      auto o = *DecodeOutput(f.payload);
      output[o.rank] += o.bytes;
    }
  }
  // Local ranks 0 and 1 of that host: cores 0 and 1, and the rank's own view agrees.
  REQUIRE(output.size() == 2);
  CHECK(output[4] != output[5]);
  for (int rank : {4, 5}) {
    std::string cpus = output[rank].substr(0, output[rank].find('\n'));
    CHECK(binding[rank] == "to core " + std::to_string(rank - 4) + " (cpus " + cpus + ")");
  }
}

TEST_CASE("agent: the connection closing kills its ranks", "[ssh]") {
  testing::SshWorld world;
  ssh::SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  auto channel = ssh::MakeSshHostChannel(options);
  auto agent = ConnectAgent(*channel, Host("127.0.0.1"), AgentCommand(TRAINRUN_TEST_AGENT),
                            absl::Now() + absl::Seconds(10));
  REQUIRE(agent.ok());
  std::string marker = "/tmp/trainrun-agent-test-" + std::to_string(getpid());
  Job job;
  job.argv = {"sh", "-c", "echo $$ > " + marker + "; exec sleep 100"};
  job.ranks = {{0, {"PATH=/usr/bin:/bin"}}};
  REQUIRE(agent->stream->Write(EncodeJob(job), absl::Seconds(5)).ok());
  pid_t rank_pid = 0;
  for (int i = 0; i < 100 && rank_pid == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rank_pid = std::atoi(testing::ReadFileText(marker).c_str());
  }
  REQUIRE(rank_pid > 0);
  REQUIRE(kill(rank_pid, 0) == 0);
  agent->stream.reset();  // the launcher goes away
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = kill(rank_pid, 0) != 0 ||
           testing::ReadFileText("/proc/" + std::to_string(rank_pid) + "/stat").find(") Z") !=
               std::string::npos;
  }
  unlink(marker.c_str());
  CHECK(gone);
}

}  // namespace
}  // namespace trainrun::launcher::remote
