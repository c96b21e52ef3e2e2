// Chaos across hosts (slow, netns): the real trainrun in the client namespace of a NetnsCluster
// runs 4 ranks on two SSH hosts; at a random moment one host's agent is SIGKILLed, or one host's
// link goes down, or one rank (chosen at random) of a collective job over TCP is SIGKILLed or
// stopped. Each trial asserts what the summary blames, trainrun's exit code, the time to end and
// that nothing but sshd is left on the hosts. Prints good/total per scenario.
//
//   CHAOS_TRIALS=10 ssh_chaos_netns_test      # default 2 trials per scenario
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

struct Outcome {
  int status = -1;  // trainrun's exit code, from "status N" printed by the script
  std::string log;  // trainrun's output
  double seconds = 0;
};

// Runs `trainrun ARGS` in the client namespace, in the background; once `ready` lines of "up"
// (or of the worker's first output) are in its log, waits `delay_ms` and runs `chaos` (a shell
// command) in the namespace of host `host`; returns when trainrun has exited.
Outcome RunWithChaos(const SshWorld& world, const NetnsCluster& cluster, const std::string& args,
                     const std::string& ready_pattern, int ready, int host, int delay_ms,
                     const std::string& chaos) {
  const std::string out = world.dir() + "/chaos.out";
  std::string script = absl::StrCat(
      "start=$(date +%s%N); env HOME=", world.dir(), "/home ", TRAINRUN_BIN, " -i ",
      world.user_ed25519(), " ", args, " > ", out, " 2>&1 & pid=$!; ",
      "for i in $(seq 200); do [ \"$(grep -c '", ready_pattern, "' ", out, ")\" -ge ", ready,
      " ] && break; sleep 0.05; done; sleep ", delay_ms / 1000.0, "; ip netns exec ",
      cluster.host_ns(host), " sh -c '", chaos, "'; wait $pid; echo status $?; ",
      "echo ms $(( ($(date +%s%N) - start) / 1000000 ))");
  std::string printed;
  RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &printed, 120);
  Outcome outcome;
  outcome.log = ReadFileText(out);
  if (size_t at = printed.find("status "); at != std::string::npos) {
    outcome.status = std::atoi(printed.c_str() + at + 7);
  }
  if (size_t at = printed.find("ms "); at != std::string::npos) {
    outcome.seconds = std::atof(printed.c_str() + at + 3) / 1000.0;
  }
  return outcome;
}

}  // namespace

TEST_CASE("chaos: an agent killed, a host link down, a rank killed or stopped on netns hosts",
          "[ssh][netns][slow][chaos]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  const char* trials_env = std::getenv("CHAOS_TRIALS");
  const int trials = trials_env != nullptr ? std::atoi(trials_env) : 2;
  const char* seed_env = std::getenv("CHAOS_SEED");  // to replay a run
  const unsigned seed =
      seed_env != nullptr ? static_cast<unsigned>(std::atoll(seed_env)) : std::random_device()();
  std::mt19937 random(seed);
  INFO("seed " << seed);
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string hosts =
      absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2");
  std::string table;
  int failures = 0;
  std::string failed;  // what each failed trial printed
  for (const std::string scenario : {"agent", "link", "kill", "stop"}) {
    int good = 0;
    double slowest = 0;
    for (int trial = 0; trial < trials; ++trial) {
      const int host = std::uniform_int_distribution<int>(0, 1)(random);
      const int delay_ms = std::uniform_int_distribution<int>(0, 1000)(random);
      const int victim = std::uniform_int_distribution<int>(0, 3)(random);
      const int step = std::uniform_int_distribution<int>(0, 8)(random);
      const std::string address = cluster.host_address(host);
      Outcome outcome;
      std::vector<std::string> expected;
      int expected_status = 1;
      double max_seconds = 15;
      if (scenario == "agent" || scenario == "link") {
        // `ip netns exec` changes only the network namespace: the agent is found among that
        // namespace's pids, not by name across the machine. The shell running this loop is in
        // that namespace too, and its own command line says --agent: it skips itself (pids wrap
        // at 32768 here, so it is not always the newest, and killing itself killed no agent).
        const std::string chaos =
            scenario == "agent"
                ? absl::StrCat(
                      "for p in $(ip netns pids ", cluster.host_ns(host),
                      "); do [ $p != $$ ] && grep -qa -- --agent /proc/$p/cmdline && kill -9 $p && "
                      "break; done")
                : "ip link set eth0 down";
        outcome = RunWithChaos(world, cluster, "-np 4 -H " + hosts + " sh -c 'echo up; sleep 60'",
                               "up", 4, host, delay_ms, chaos);
        if (scenario == "link") {
          RunCommand(
              {"ip", "netns", "exec", cluster.host_ns(host), "ip", "link", "set", "eth0", "up"});
          max_seconds = 60;
        }
        expected = {"host " + address + ": lost its agent"};
      } else {
        // A collective job over TCP across both hosts; rank `victim` fails at step `step`.
        outcome = RunWithChaos(
            world, cluster,
            absl::StrCat("-x TRAINRUN_TIMEOUT=2 -np 4 -H ", hosts, " ", TRAINRUN_JOB_WORKER,
                         " 200 ", victim, " ", step, " ", scenario),
            "rank", 0, host, 0, "true");
        const std::string rank_host = cluster.host_address(victim / 2);
        expected = {absl::StrCat("rank ", victim, " on ", rank_host,
                                 scenario == "kill" ? " was killed by SIGKILL" : " stalled")};
        expected_status = scenario == "kill" ? 137 : 1;
      }
      const bool clean = cluster.OnlySshdLeftWithin(std::chrono::seconds(10));
      bool ok = outcome.status == expected_status && outcome.seconds < max_seconds && clean;
      for (const std::string& text : expected)
        ok = ok && outcome.log.find(text) != std::string::npos;
      slowest = std::max(slowest, outcome.seconds);
      if (ok) {
        ++good;
      } else {
        ++failures;
        std::ostringstream what;
        what << scenario << " host " << host << " victim " << victim << " step " << step
             << " delay " << delay_ms << " ms: status " << outcome.status << " (expected "
             << expected_status << "), " << outcome.seconds << " s"
             << (clean ? "" : ", processes left") << "\n"
             << outcome.log;
        failed += what.str() + "\n";
      }
    }
    char line[160];
    std::snprintf(line, sizeof line, "chaos netns %-6s %3d/%-3d good, slowest end %.2f s\n",
                  scenario.c_str(), good, trials, slowest);
    table += line;
  }
  std::fputs(table.c_str(), stdout);
  std::fputs(failed.c_str(), stdout);
  INFO(failed);
  CHECK(failures == 0);
}

}  // namespace trainrun::testing
