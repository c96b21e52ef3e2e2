// Chaos: 4-rank jobs under the real trainrun, over TCP and over shared memory, in which one rank
// chosen at random is SIGKILLed, stops (SIGSTOP: a hung rank), exits 3 mid-run, or exits 0 before
// joining, at a random step. Each trial asserts the blamed rank, trainrun's exit code, the time
// to end, and that no process of the job is left. Prints good/total per scenario.
//
//   chaos_test                       # CHAOS_TRIALS (default 4) trials per scenario
//   CHAOS_TRIALS=30 chaos_test       # the figures in issue 22's closing note
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_job.h"

namespace {

// Survivors lists the processes whose environment holds `marker` (every rank of one trial has it).
std::vector<int> Survivors(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream environ("/proc/" + std::string(entry->d_name) + "/environ", std::ios::binary);
    std::stringstream text;
    text << environ.rdbuf();
    if (text.str().find(marker) != std::string::npos) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

bool NothingLeft(const std::string& marker) {
  for (int i = 0; i < 50; ++i) {
    if (Survivors(marker).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct Scenario {
  std::string transport;  // tcp or shm
  std::string how;        // the worker's failure: kill, stop, exit3, exit0
};

// Expected: what trainrun must say and exit with when rank `victim` fails as `how`.
struct Expected {
  int exit_code;
  std::string blame;
  double max_seconds;
};

Expected Expect(const std::string& how, int victim) {
  const std::string rank = "rank " + std::to_string(victim) + " on localhost ";
  if (how == "kill") return {137, rank + "was killed by SIGKILL; it failed first", 5};
  if (how == "exit3") return {3, rank + "exited with code 3; it failed first", 5};
  if (how == "exit0") return {1, rank + "exited with code 0 without joining the job", 5};
  // stop: the others time out after TRAINRUN_TIMEOUT (2 s), name it stalled, and it ends on
  // SIGTERM.
  return {1, rank + "stalled", 9};
}

}  // namespace

TEST_CASE("chaos: one of 4 ranks killed, stopped or exiting early, over TCP and shared memory",
          "[integration][chaos]") {
  const char* trials_env = std::getenv("CHAOS_TRIALS");
  const int trials = trials_env != nullptr ? std::atoi(trials_env) : 4;
  const char* seed_env = std::getenv("CHAOS_SEED");  // to replay a run
  const unsigned seed =
      seed_env != nullptr ? static_cast<unsigned>(std::atoll(seed_env)) : std::random_device()();
  std::mt19937 random(seed);
  INFO("seed " << seed);
  std::vector<Scenario> scenarios;
  for (const char* transport : {"tcp", "shm"}) {
    for (const char* how : {"kill", "stop", "exit3", "exit0"})
      scenarios.push_back({transport, how});
  }
  std::string table;
  int failures = 0;
  std::string failed;  // what each failed trial printed
  for (const Scenario& scenario : scenarios) {
    int good = 0;
    double worst = 0;
    for (int trial = 0; trial < trials; ++trial) {
      const int victim = std::uniform_int_distribution<int>(0, 3)(random);
      const int step =
          scenario.how == "exit0" ? -1 : std::uniform_int_distribution<int>(0, 8)(random);
      const std::string marker = "TRAINRUN_CHAOS_ID=" + std::to_string(getpid()) + "-" +
                                 scenario.transport + scenario.how + std::to_string(trial);
      JobResult job =
          RunJob("-x " + marker + " -x TRAINRUN_TRANSPORT=" + scenario.transport +
                 " -x TRAINRUN_TIMEOUT=2 -np 4 " + TRAINRUN_JOB_WORKER + " 200 " +
                 std::to_string(victim) + " " + std::to_string(step) + " " + scenario.how);
      const Expected expected = Expect(scenario.how, victim);
      const bool left = !NothingLeft(marker);
      const bool ok = job.exit_code == expected.exit_code &&
                      job.output.find(expected.blame) != std::string::npos &&
                      job.seconds < expected.max_seconds && !left;
      worst = std::max(worst, job.seconds);
      if (ok) {
        ++good;
      } else {
        ++failures;
        std::ostringstream what;
        what << scenario.transport << " " << scenario.how << " rank " << victim << " step " << step
             << ": exit " << job.exit_code << " (expected " << expected.exit_code << "), "
             << job.seconds << " s" << (left ? ", processes left" : "") << "\n"
             << job.output;
        failed += what.str() + "\n";
      }
    }
    char line[160];
    std::snprintf(line, sizeof line, "chaos %-4s %-6s %3d/%-3d good, slowest end %.2f s\n",
                  scenario.transport.c_str(), scenario.how.c_str(), good, trials, worst);
    table += line;
  }
  std::fputs(table.c_str(), stdout);
  std::fputs(failed.c_str(), stdout);
  INFO(failed);
  CHECK(failures == 0);
}

// Over TCP a rank can finish its share of a collective and wait in the next one for the stopped
// rank too; the stall check (warning 5 s, shutdown 10 s) must name only the rank in no collective.
TEST_CASE("stall check over TCP: a SIGSTOPped rank, and only it, is named stalled",
          "[integration][stall_blame]") {
  const char* trials_env = std::getenv("STALL_TRIALS");
  const int trials = trials_env != nullptr ? std::atoi(trials_env) : 30;
  const unsigned seed = std::random_device()();
  std::mt19937 random(seed);
  INFO("seed " << seed);
  int good = 0;
  std::string failed;
  for (int trial = 0; trial < trials; ++trial) {
    const int victim = std::uniform_int_distribution<int>(0, 3)(random);
    const int step = std::uniform_int_distribution<int>(0, 8)(random);
    const std::string marker =
        "TRAINRUN_CHAOS_ID=" + std::to_string(getpid()) + "-stall" + std::to_string(trial);
    JobResult job = RunJob("-x " + marker +
                           " -x TRAINRUN_TRANSPORT=tcp -x TRAINRUN_TIMEOUT=60"
                           " --stall-check-warning-time-seconds 5"
                           " --stall-check-shutdown-time-seconds 10 -np 4 " +
                           TRAINRUN_JOB_WORKER + " 200 " + std::to_string(victim) + " " +
                           std::to_string(step) + " stop");
    const std::string blame = "rank " + std::to_string(victim) + " on localhost stalled: ";
    const bool left = !NothingLeft(marker);
    if (job.exit_code == 1 && job.output.find(blame) != std::string::npos && job.seconds < 25 &&
        !left) {
      ++good;
    } else {
      failed += "rank " + std::to_string(victim) + " step " + std::to_string(step) + ": exit " +
                std::to_string(job.exit_code) + ", " + std::to_string(job.seconds) + " s" +
                (left ? ", processes left" : "") + "\n" + job.output + "\n";
    }
  }
  std::printf("stall check over TCP: %d/%d blamed exactly\n%s", good, trials, failed.c_str());
  INFO(failed);
  CHECK(good == trials);
}
