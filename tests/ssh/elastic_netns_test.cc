// Elastic training across netns SSH hosts (issue 17): examples/elastic_train.py at 2 hosts x 2
// ranks under `trainrun --min-np 2`; once rank 0 has printed epoch 5, the second host's link goes
// down. The job must go on at the first host's 2 ranks (generation 1), finish with exit 0, the
// parameters bit-identical, and leave nothing but sshd on either host.
//
// A host added to the --host-discovery-script output mid-training: the job, started on host 0
// alone, grows onto host 1 (its agent connected while the job runs), finishes at 4 ranks; the
// figure is from the file's rewrite to the first step at 4 ranks (ELASTIC_GROW_ROUNDS=N: the
// median of N). A listed host that cannot be reached is one warning, and the job goes on.
//
// Also the figure for a lost host: from the link cut to the survivors' next completed step (rank 0
// writes that time through elastic_train.py --times). ELASTIC_NETNS_ROUNDS=N repeats the round
// and prints the median.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

struct Round {
  int status = -1;
  std::string log;
  double recovery_seconds = -1;  // link cut → the survivors' next step
};

// Reads "WHAT SECONDS" lines (elastic_train.py --times, and the cut's time).
std::map<std::string, double> ReadMarks(const std::string& path) {
  std::map<std::string, double> marks;
  std::istringstream in(ReadFileText(path));
  std::string what;
  double when = 0;
  while (in >> what >> when) marks[what] = when;
  return marks;
}

Round RunRound(const SshWorld& world, const NetnsCluster& cluster, int round) {
  const std::string out = absl::StrCat(world.dir(), "/elastic", round, ".out");
  const std::string times = absl::StrCat(world.dir(), "/elastic", round, ".times");
  const std::string hosts =
      absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2");
  const std::string args =
      absl::StrCat("-np 4 --min-np 2 -H ", hosts, " -x PYTHONPATH=", TRAINRUN_PYTHONPATH,
                   " -x TRAINRUN_TIMEOUT=60 -x PYTHONDONTWRITEBYTECODE=1 ", TRAINRUN_PYTHON, " ",
                   TRAINRUN_SOURCE_DIR, "/examples/elastic_train.py --times ", times);
  // Rank 0 prints "epoch   5" at the end of its fifth epoch: then host 1's link goes down.
  const std::string script =
      absl::StrCat("cd ", TRAINRUN_SOURCE_DIR, "; env HOME=", world.dir(), "/home ", TRAINRUN_BIN,
                   " -i ", world.user_ed25519(), " ", args, " > ", out, " 2>&1 & pid=$!; ",
                   "for i in $(seq 1200); do grep -q 'epoch   5' ", out,
                   " && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done; ",
                   "echo cut $(date +%s.%N) >> ", times, "; ip netns exec ", cluster.host_ns(1),
                   " ip link set eth0 down; wait $pid; echo status $?");
  std::string printed;
  RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &printed, 240);
  RunCommand({"ip", "netns", "exec", cluster.host_ns(1), "ip", "link", "set", "eth0", "up"});
  Round result;
  result.log = ReadFileText(out);
  if (size_t at = printed.find("status "); at != std::string::npos) {
    result.status = std::atoi(printed.c_str() + at + 7);
  }
  std::map<std::string, double> marks = ReadMarks(times);
  if (marks.count("cut") && marks.count("step")) {
    result.recovery_seconds = marks["step"] - marks["cut"];
  }
  return result;
}

// A job started by --host-discovery-script on host 0 (2 ranks, --max-np 4); once rank 0 has
// printed epoch 5 the script's file is rewritten to `hosts_then`. `train_flags` go to
// elastic_train.py.
Round RunDiscoveryRound(const SshWorld& world, const NetnsCluster& cluster, const std::string& name,
                        const std::string& hosts_then, const std::string& train_flags,
                        const std::string& trainrun_flags = "") {
  const std::string out = absl::StrCat(world.dir(), "/", name, ".out");
  const std::string times = absl::StrCat(world.dir(), "/", name, ".times");
  const std::string hosts = absl::StrCat(world.dir(), "/", name, ".hosts");
  const std::string args = absl::StrCat(
      trainrun_flags, " --min-np 2 --max-np 4 --host-discovery-script 'cat ", hosts,
      "' -x PYTHONPATH=", TRAINRUN_PYTHONPATH,
      " -x TRAINRUN_TIMEOUT=60 -x PYTHONDONTWRITEBYTECODE=1 ", TRAINRUN_PYTHON, " ",
      TRAINRUN_SOURCE_DIR, "/examples/elastic_train.py --times ", times, " ", train_flags);
  const std::string script = absl::StrCat(
      "cd ", TRAINRUN_SOURCE_DIR, "; echo ", cluster.host_address(0), ":2 > ", hosts,
      "; env HOME=", world.dir(), "/home ", TRAINRUN_BIN, " -i ", world.user_ed25519(), " ", args,
      " > ", out, " 2>&1 & pid=$!; ", "for i in $(seq 2400); do grep -q 'epoch   5' ", out,
      " && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done; printf '", hosts_then,
      "' > ", hosts, ".new; echo grow $(date +%s.%N) >> ", times, "; mv ", hosts, ".new ", hosts,
      "; wait $pid; echo status $?");
  std::string printed;
  RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &printed, 240);
  Round result;
  result.log = ReadFileText(out);
  if (size_t at = printed.find("status "); at != std::string::npos) {
    result.status = std::atoi(printed.c_str() + at + 7);
  }
  std::map<std::string, double> marks = ReadMarks(times);
  if (marks.count("grow") && marks.count("step")) {
    result.recovery_seconds = marks["step"] - marks["grow"];
  }
  return result;
}

// The "epoch N  step S" lines' step counts, in order.
std::vector<int> EpochSteps(const std::string& log) {
  std::vector<int> steps;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    const size_t epoch = line.find("epoch ");
    const size_t step = line.find("  step ");
    if (epoch == std::string::npos || step == std::string::npos || step < epoch) continue;
    steps.push_back(std::atoi(line.c_str() + step + 7));
  }
  return steps;
}

// The step every "resumed at step S" and "joined at step S" line of `log` names.
std::vector<int> ResumedSteps(const std::string& log) {
  std::vector<int> steps;
  for (const std::string& marker :
       {std::string("resumed at step "), std::string("joined at step ")}) {
    for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
      steps.push_back(std::atoi(log.c_str() + at + marker.size()));
    }
  }
  return steps;
}

}  // namespace

TEST_CASE("elastic: a netns host added to the discovery script's output; the job grows onto it",
          "[ssh][netns][slow][elastic]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  const char* rounds_env = std::getenv("ELASTIC_GROW_ROUNDS");
  const int rounds = rounds_env != nullptr ? std::max(1, std::atoi(rounds_env)) : 1;
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string first = cluster.host_address(0);
  const std::string added = cluster.host_address(1);
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    // From epoch 5 each step sleeps 0.3 s until the job has 4 ranks, however long the new host's
    // ranks take to start (a Python with torch each) and join. ELASTIC_GROW_LOG=1 prints the
    // output, with trainrun's --verbose lines.
    const bool show = std::getenv("ELASTIC_GROW_LOG") != nullptr;
    const std::string files = absl::StrCat(world.dir(), "/grow", round, ".files");
    Round result = RunDiscoveryRound(
        world, cluster, absl::StrCat("grow", round), absl::StrCat(first, ":2\\n", added, ":2\\n"),
        "--epochs 12 --min-accuracy 0.95 --step-sleep 0.3 --sleep-from-epoch 5 "
        "--sleep-until-size 4",
        absl::StrCat(show ? "--verbose " : "", "--output-filename ", files));
    if (show) std::cout << result.log << std::endl;
    INFO(result.log);
    CHECK(result.status == 0);
    CHECK(result.log.find(absl::StrCat("host ", added,
                                       " appeared in the host discovery script's output: starting "
                                       "ranks 2-3 on it")) != std::string::npos);
    CHECK(result.log.find(absl::StrCat(
              "host ", added,
              " joined (from the host discovery script): ranks 2-3 started; the job goes on at 4 "
              "ranks (generation 1, formed by ranks 0-1 of the start and 2-3), recovered in")) !=
          std::string::npos);
    // The new ranks' own lines come tagged with their ranks.
    for (int rank : {2, 3}) {
      CHECK(result.log.find(absl::StrCat("[", rank, "]<stdout>:rank ", rank, " (slot ", rank,
                                         ", on ", added, "): joined at step ")) !=
            std::string::npos);
      // And in their --output-filename files, as the start's ranks' are.
      CHECK(ReadFileText(absl::StrCat(files, "/rank.", rank, "/stdout"))
                .find(absl::StrCat("rank ", rank, " (slot ", rank, ", on ", added,
                                   "): joined at step ")) != std::string::npos);
    }
    CHECK(ReadFileText(files + "/rank.0/stdout").find("final test accuracy") != std::string::npos);
    // Ranks 0-1 resume at their last commit on 4 ranks, and the new ranks join at that same step:
    // the committed step never goes back, nor does the epochs' step count.
    const std::vector<int> resumed = ResumedSteps(result.log);
    CHECK(resumed.size() == 4);
    CHECK(std::adjacent_find(resumed.begin(), resumed.end(), std::not_equal_to<int>()) ==
          resumed.end());
    CHECK(result.log.find("on 4 ranks (last commit: step") != std::string::npos);
    const std::vector<int> steps = EpochSteps(result.log);
    CHECK(steps.size() >= 3);
    CHECK(std::is_sorted(steps.begin(), steps.end()));
    CHECK(result.log.find("final test accuracy 0.9") != std::string::npos);
    CHECK(result.log.find("on 4 rank(s)") != std::string::npos);
    CHECK(result.log.find("parameters bit-identical on every rank") != std::string::npos);
    CHECK(result.log.find(absl::StrCat("the job survived 1 membership change, 4 ranks at the end "
                                       "(2 at the start), 2 ranks joined (on ",
                                       added, ")")) != std::string::npos);
    INFO(cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(10)));
    CHECK(result.recovery_seconds > 0);
    times.push_back(result.recovery_seconds);
    std::cout << "round " << round + 1 << ": discovery file rewritten to the first step at 4 ranks "
              << static_cast<int>(result.recovery_seconds * 1000) << " ms" << std::endl;
  }
  std::sort(times.begin(), times.end());
  std::cout << "grew onto a netns host, discovery file rewritten to the first step at 4 ranks, "
            << rounds << " round(s): median " << static_cast<int>(times[times.size() / 2] * 1000)
            << " ms, min " << static_cast<int>(times.front() * 1000) << " ms, max "
            << static_cast<int>(times.back() * 1000) << " ms" << std::endl;
}

TEST_CASE(
    "elastic: a host in the discovery script's output that cannot be reached is blacklisted; "
    "the job goes on at its size",
    "[ssh][netns][slow][elastic]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(1, world.dir(), world.dir() + "/keys/authorized_keys");
  // No route leads there from the client's namespace: the connection fails at once.
  const std::string unreachable = "10.213.2.7";
  Round result =
      RunDiscoveryRound(world, cluster, "unreachable",
                        absl::StrCat(cluster.host_address(0), ":2\\n", unreachable, ":2\\n"),
                        "--epochs 12 --step-sleep 0.05 --sleep-from-epoch 5");
  if (std::getenv("ELASTIC_GROW_LOG") != nullptr) std::cout << result.log << std::endl;
  INFO(result.log);
  CHECK(result.status == 0);
  const std::string warning = absl::StrCat(
      "trainrun: warning: host ", unreachable,
      " blacklisted after trainrun could not reach its agent to grow the job onto it (");
  const size_t at = result.log.find(warning);
  CHECK(at != std::string::npos);
  CHECK(result.log.find(warning, at + 1) == std::string::npos);  // once
  CHECK(result.log.find("starting ranks") == std::string::npos);
  CHECK(result.log.find("on 2 rank(s)") != std::string::npos);
  CHECK(result.log.find("parameters bit-identical on every rank") != std::string::npos);
  CHECK(result.log.find("membership change") == std::string::npos);
  INFO(cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(10)));
}

TEST_CASE("elastic: a host whose link is cut mid-training is lost; the job ends on the other",
          "[ssh][netns][slow][elastic]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  const char* rounds_env = std::getenv("ELASTIC_NETNS_ROUNDS");
  const int rounds = rounds_env != nullptr ? std::max(1, std::atoi(rounds_env)) : 1;
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string lost_host = cluster.host_address(1);
  std::vector<double> recoveries;
  for (int round = 0; round < rounds; ++round) {
    Round result = RunRound(world, cluster, round);
    INFO(result.log);
    CHECK(result.status == 0);
    CHECK(result.log.find(absl::StrCat("host ", lost_host, " lost its agent or its link")) !=
          std::string::npos);
    CHECK(result.log.find("ranks 2-3 lost; the job goes on at 2 ranks (generation 1, formed by "
                          "ranks 0-1 of the start)") != std::string::npos);
    CHECK(result.log.find("on 2 rank(s)") != std::string::npos);
    CHECK(result.log.find("parameters bit-identical on every rank") != std::string::npos);
    CHECK(result.log.find(absl::StrCat("the job survived 1 membership change, 2 of 4 ranks remain, "
                                       "1 host lost (",
                                       lost_host, "): host ", lost_host, " lost its agent")) !=
          std::string::npos);
    INFO(cluster.ProcessList());
    CHECK(cluster.OnlySshdLeftWithin(std::chrono::seconds(10)));
    CHECK(result.recovery_seconds > 0);
    recoveries.push_back(result.recovery_seconds);
    std::cout << "round " << round + 1 << ": link cut to the survivors' next step "
              << static_cast<int>(result.recovery_seconds * 1000) << " ms" << std::endl;
  }
  std::sort(recoveries.begin(), recoveries.end());
  std::cout << "lost netns host, link cut to the survivors' next step, " << rounds
            << " round(s): median " << static_cast<int>(recoveries[recoveries.size() / 2] * 1000)
            << " ms, min " << static_cast<int>(recoveries.front() * 1000) << " ms, max "
            << static_cast<int>(recoveries.back() * 1000) << " ms" << std::endl;
}

}  // namespace trainrun::testing
