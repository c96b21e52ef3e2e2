// The agent protocol's frames: round trips, frames split anywhere, and corrupt streams refused.
#include "remote/agent_protocol.h"

#include <time.h>

#include <catch2/catch.hpp>

namespace trainrun::launcher::remote {
namespace {

TEST_CASE("agent protocol: a job description round-trips, token in the env only", "[ssh]") {
  Job job;
  job.cwd = "/work/dir with space";
  job.argv = {"python3", "train.py", "--lr", "0.1"};
  job.grace_period_ms = 1500;
  job.silence_limit_ms = 1500;  // an elastic job's
  job.ranks = {{2, {"TRAINRUN_RANK=2", "TRAINRUN_JOB_TOKEN=s3cret"}}, {3, {"TRAINRUN_RANK=3"}}};
  std::string frame = EncodeJob(job);
  FrameReader reader;
  reader.Append(frame);
  auto next = reader.Next();
  REQUIRE(next.ok());
  REQUIRE(next->has_value());
  CHECK((*next)->type == MessageType::kJob);
  auto decoded = DecodeJob((*next)->payload);
  REQUIRE(decoded.ok());
  CHECK(decoded->cwd == job.cwd);
  CHECK(decoded->argv == job.argv);
  CHECK(decoded->grace_period_ms == 1500);
  CHECK(decoded->silence_limit_ms == 1500);
  REQUIRE(decoded->ranks.size() == 2);
  CHECK(decoded->ranks[0].rank == 2);
  CHECK(decoded->ranks[0].env == job.ranks[0].env);
}

TEST_CASE(
    "agent protocol: a version 1 Hello (no GPU count) still decodes, to be refused by version",
    "[ssh]") {
  // Version 1: u32 version, bytes hostname, u32 pid, bytes address; nothing after.
  std::string v1 = EncodeHello({2, "old", 7, "10.0.0.1", 0, ""});
  v1 = v1.substr(5, v1.size() - 5 - 4);  // the payload, without version 2's GPU count
  v1[3] = 1;                             // version 1
  auto hello = DecodeHello(v1);
  REQUIRE(hello.ok());
  CHECK(hello->version == 1);
  CHECK(hello->hostname == "old");
}

TEST_CASE("agent protocol: a Job claiming 2^32 ranks in 16 bytes fails at once", "[ssh]") {
  // cwd "", argv [], grace 0, then a rank count of 0xFFFFFFFF and nothing after it.
  const std::string payload("\0\0\0\0\0\0\0\0\0\0\0\0\xff\xff\xff\xff", 16);
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  const double start = cpu_ms();
  auto job = DecodeJob(payload);
  const double spent_ms = cpu_ms() - start;
  CHECK_FALSE(job.ok());
  CHECK(spent_ms < 20);  // 318 ms and 70 MB before: the loop went on past the overrun
}

TEST_CASE("agent protocol: the Hello carries the trainrun release, a version 2 Hello has none",
          "[ssh]") {
  auto frame = [](const Hello& hello) { return EncodeHello(hello).substr(5); };
  auto hello = DecodeHello(frame({kProtocolVersion, "h1", 7, "10.0.0.1", 4, "0.9.1"}));
  REQUIRE(hello.ok());
  CHECK(hello->release == "0.9.1");
  CHECK(hello->gpu_count == 4);
  CHECK(std::string(TrainrunRelease()) == TRAINRUN_RELEASE);
  // Version 2 ended with the GPU count: it still decodes, with no release, to be refused by
  // version.
  std::string v2 = frame({2, "old", 7, "10.0.0.1", 4, "ignored"});
  CHECK(v2.size() == frame({3, "old", 7, "10.0.0.1", 4, ""}).size() - 4);
  hello = DecodeHello(v2);
  REQUIRE(hello.ok());
  CHECK(hello->version == 2);
  CHECK(hello->gpu_count == 4);
  CHECK(hello->release.empty());
}

TEST_CASE("agent protocol: the Hello carries the machine, and an earlier version 4 Hello has none",
          "[ssh]") {
  auto frame = [](const Hello& hello) { return EncodeHello(hello).substr(5); };
  Hello sent{kProtocolVersion, "h1", 7, "10.0.0.1", 4, "0.9.1"};
  sent.machine = "0f1e boot net:[4026531840]";
  auto hello = DecodeHello(frame(sent));
  REQUIRE(hello.ok());
  CHECK(hello->machine == "0f1e boot net:[4026531840]");
  CHECK(hello->release == "0.9.1");
  // Before the machine was added, version 4's Hello ended with the release.
  std::string earlier = frame({kProtocolVersion, "h1", 7, "10.0.0.1", 4, "0.9.1"});
  earlier.resize(earlier.size() - 4);
  hello = DecodeHello(earlier);
  REQUIRE(hello.ok());
  CHECK(hello->machine.empty());
  CHECK(hello->release == "0.9.1");
}

TEST_CASE("agent protocol: a JobEnd may say rejoin, and an earlier JobEnd without it does not",
          "[ssh]") {
  auto payload = [](const JobEnd& end) { return EncodeJobEnd(end).substr(5); };
  auto again = DecodeJobEnd(payload({1, "", true}));
  REQUIRE(again.ok());
  CHECK(again->exit_code == 1);
  CHECK(again->rejoin);
  auto last = DecodeJobEnd(payload({3, "rank 2 failed", false}));
  REQUIRE(last.ok());
  CHECK(last->summary == "rank 2 failed");
  CHECK_FALSE(last->rejoin);
  // Before rejoin was added, a JobEnd ended with the summary.
  std::string earlier = payload({3, "rank 2 failed", true});
  earlier.resize(earlier.size() - 4);
  auto old = DecodeJobEnd(earlier);
  REQUIRE(old.ok());
  CHECK(old->summary == "rank 2 failed");
  CHECK_FALSE(old->rejoin);
}

TEST_CASE("agent protocol: frames split at every byte and joined", "[ssh]") {
  std::string stream = EncodeHello({kProtocolVersion, "h1", 42, "10.0.0.1", 8, "0.1.0"}) +
                       EncodeOutput({1, 1, std::string("a\0b\r\n", 5)}) + EncodeExit({1, 0, 9, 0}) +
                       EncodeFrame(MessageType::kDone);
  FrameReader reader;
  std::vector<Frame> frames;
  for (char c : stream) {
    reader.Append(absl::string_view(&c, 1));
    for (;;) {
      auto next = reader.Next();
      REQUIRE(next.ok());
      if (!next->has_value()) break;
      frames.push_back(**next);
    }
  }
  REQUIRE(frames.size() == 4);
  auto hello = DecodeHello(frames[0].payload);
  REQUIRE(hello.ok());
  CHECK(hello->hostname == "h1");
  CHECK(hello->pid == 42);
  CHECK(hello->ssh_client_address == "10.0.0.1");
  CHECK(hello->gpu_count == 8);
  auto output = DecodeOutput(frames[1].payload);
  REQUIRE(output.ok());
  CHECK(output->bytes == std::string("a\0b\r\n", 5));
  auto exit = DecodeExit(frames[2].payload);
  REQUIRE(exit.ok());
  CHECK(exit->signal == 9);
  CHECK(frames[3].type == MessageType::kDone);
}

TEST_CASE("agent protocol: text where frames belong is refused, not trusted", "[ssh]") {
  FrameReader reader;
  reader.Append("Welcome to host1!\n");  // a .bashrc that prints
  auto next = reader.Next();
  REQUIRE_FALSE(next.ok());
  CHECK(next.status().message().find(".bashrc") != std::string::npos);
  CHECK_FALSE(DecodeExit("xx").ok());
}

}  // namespace
}  // namespace trainrun::launcher::remote
