// Whole jobs under the real trainrun: correct results, and one clear summary when a rank dies.
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

#include "run_job.h"

namespace {

const std::string kWorker = TRAINRUN_JOB_WORKER;

}  // namespace

TEST_CASE("trainrun -np 3 runs a job whose allreduces are correct on every rank", "[integration]") {
  JobResult job = RunJob("-np 3 " + kWorker + " 5");
  INFO(job.output);
  CHECK(job.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(job.output.find("[" + std::to_string(rank) + "]<stdout>:rank " + std::to_string(rank) +
                          ": ok") != std::string::npos);
  }
}

TEST_CASE("a rank killed mid-allreduce: the job ends at once and blames it", "[integration]") {
  JobResult job = RunJob("-np 3 " + kWorker + " 1000 1 3 kill");
  INFO(job.output);
  CHECK(job.exit_code == 137);
  CHECK(job.output.find("rank 1 on localhost was killed by SIGKILL; it failed first") !=
        std::string::npos);
  // Ranks 0 and 2 are each listed as a consequence: as having reported (through the rendezvous)
  // failing because of rank 1, as stopped when the teardown's SIGTERM reached them first, or as
  // having failed after rank 1 did.
  std::string consequences;
  const std::regex line(R"((ranks? [0-9,-]+) reported failing because rank 1 had|)"
                        R"(stopped as a consequence: (ranks? [0-9,-]+)|)"
                        R"((ranks? [0-9,-]+) also [^\n]* after the first failure)");
  for (std::sregex_iterator it(job.output.begin(), job.output.end(), line), end; it != end; ++it) {
    consequences += (*it)[1].str() + (*it)[2].str() + (*it)[3].str() + ";";
  }
  CHECK(std::regex_search(consequences, std::regex(R"(ranks? (0[,;]|0-2))")));
  CHECK(std::regex_search(consequences, std::regex(R"(ranks? ([0-9],)*2[;])")));
  CHECK(job.seconds < 10);
}

TEST_CASE("a rank that breaks off without failing is still named the cause", "[integration]") {
  JobResult job = RunJob("-np 3 " + kWorker + " 1000 1 3 close");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  CHECK(
      job.output.find("rank 1 on localhost failed first: its peers lost their connections to it") !=
      std::string::npos);
  CHECK(job.output.find("rank 1 then was killed by SIGTERM") != std::string::npos);
  CHECK(job.output.find("ranks 0,2 reported failing because rank 1 had") != std::string::npos);
  CHECK(job.seconds < 15);
}

TEST_CASE("a rank that exits 0 before joining ends the job at once, naming it", "[integration]") {
  // The others wait for it in the rendezvous; without the rendezvous telling, they would wait
  // for the whole TRAINRUN_TIMEOUT.
  JobResult job = RunJob("-x TRAINRUN_TIMEOUT=40 -np 4 " + kWorker + " 5 3 -1 exit0");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  CHECK(job.output.find("rank 3 on localhost exited with code 0 without joining the job") !=
        std::string::npos);
  CHECK(job.output.find("stopped as a consequence: ranks 0-2") != std::string::npos);
  CHECK(job.seconds < 5);
}

TEST_CASE("a stalled rank (SIGSTOP) is blamed, and ended by SIGTERM", "[integration]") {
  JobResult job = RunJob("-x TRAINRUN_TIMEOUT=2 -np 4 " + kWorker + " 1000 1 3 stop");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  // A stopped rank is named stalled (issue 15's wording): in the words of rank 2, which waited for
  // it, or, when the timeouts raced around the ring, as the one rank that said nothing.
  CHECK(job.output.find("trainrun: error: rank 1 on localhost stalled: ") != std::string::npos);
  CHECK(job.output.find("rank 1 then was killed by SIGTERM") != std::string::npos);
  CHECK(job.seconds < 10);
}

TEST_CASE("a rank that skips a collective: a stall warning, then a summary naming it stalled",
          "[integration][stall]") {
  JobResult job =
      RunJob("--stall-check-warning-time-seconds 1 --stall-check-shutdown-time-seconds 4 -np 3 " +
             kWorker + " 1000 0 2 skip");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  // At the warning time: who waits in which collective, and who has not joined it.
  CHECK(std::regex_search(job.output, std::regex(R"(stall: ranks 1-2 have waited [0-9]+ s in )"
                                                 R"(allreduce #3, which rank 0 has not joined)")));
  // At the shutdown time: rank 0 named as stalled, not as failed.
  CHECK(std::regex_search(
      job.output, std::regex(R"(rank 0 on localhost stalled: ranks 1-2 have waited [4-9] s )"
                             R"(in allreduce #3, which rank 0 has not joined; the job was )"
                             R"(stopped)")));
  CHECK(job.output.find("failed first") == std::string::npos);
  CHECK(job.seconds < 15);
}

TEST_CASE(
    "a rank that skips a collective until its peers time out is named stalled, in their words",
    "[integration][stall]") {
  JobResult job = RunJob("-x TRAINRUN_TIMEOUT=3 -np 2 " + kWorker + " 1000 0 2 skip");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  CHECK(job.output.find("rank 0 on localhost stalled: rank 1 waited for it and reported") !=
        std::string::npos);
  CHECK(job.output.find("no progress from rank 0 for 3 s") != std::string::npos);
  CHECK(job.output.find("failed first") == std::string::npos);
  CHECK(job.seconds < 15);
}

// The stall warning time given with -x is the one trainrun acts on, and a stall message says how
// long the ranks have waited, not the warning time (both wrong before: trainrun refused a shutdown
// time below its own default of 60 s, and said "waited 60 s" 3 s in).
TEST_CASE("a stall warning time given with -x is the one trainrun acts on",
          "[integration][stall]") {
  JobResult job =
      RunJob("-x TRAINRUN_STALL_CHECK_TIME_SECONDS=1 --stall-check-shutdown-time-seconds 4 -np 3 " +
             kWorker + " 1000 0 2 skip");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  CHECK(std::regex_search(job.output, std::regex(R"(stall: ranks 1-2 have waited [12] s in )"
                                                 R"(allreduce #3, which rank 0 has not joined)")));
  CHECK(std::regex_search(
      job.output, std::regex(R"(rank 0 on localhost stalled: ranks 1-2 have waited [4-6] s )"
                             R"(in allreduce #3, which rank 0 has not joined; the job was )"
                             R"(stopped)")));
  CHECK(job.seconds < 15);
}

TEST_CASE("a stall warning says how long the ranks have waited", "[integration][stall]") {
  JobResult job = RunJob("-x TRAINRUN_STALL_CHECK_TIME_SECONDS=1 -x TRAINRUN_TIMEOUT=5 -np 2 " +
                         kWorker + " 1000 0 2 skip");
  INFO(job.output);
  CHECK(job.exit_code == 1);
  CHECK(std::regex_search(job.output, std::regex(R"(stall: rank 1 has waited [12] s in )"
                                                 R"(allreduce #3, which rank 0 has not joined)")));
  CHECK_FALSE(std::regex_search(job.output, std::regex(R"(waited 60 s)")));
}

TEST_CASE("a stall warning time given both with -x and its flag must agree",
          "[integration][stall]") {
  JobResult job = RunJob(
      "-x TRAINRUN_STALL_CHECK_TIME_SECONDS=10 "
      "--stall-check-warning-time-seconds 2 -np 2 " +
      kWorker + " 1");
  INFO(job.output);
  CHECK(job.exit_code == 2);
  CHECK(job.output.find("trainrun: error: --stall-check-warning-time-seconds 2 and -x "
                        "TRAINRUN_STALL_CHECK_TIME_SECONDS=10 disagree; give one of them") !=
        std::string::npos);
}

TEST_CASE("a setting's bad value is one sentence naming it, before any rank starts",
          "[integration][settings]") {
  JobResult job = RunJob("-x TRAINRUN_SOCKETS_PER_PEER=many -np 2 " + kWorker + " 1");
  INFO(job.output);
  CHECK(job.exit_code == 2);
  CHECK(
      job.output ==
      "trainrun: error: -x TRAINRUN_SOCKETS_PER_PEER: TRAINRUN_SOCKETS_PER_PEER is 'many'; set it "
      "to an integer from 1 to 64 (or unset it)\n");
}

namespace {

// --max-restarts (issue 17): the job's first start runs the worker with `first_start`'s arguments,
// every later start with `later_starts`'; each rank first prints the restart counts it was given.
std::string RestartingJob(const std::string& first_start, const std::string& later_starts) {
  return "sh -c 'echo restart $TRAINRUN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT of "
         "$TORCHELASTIC_MAX_RESTARTS; if [ $TRAINRUN_RESTART_COUNT = 0 ]; then exec " +
         kWorker + " " + first_start + "; else exec " + kWorker + " " + later_starts + "; fi'";
}

}  // namespace

TEST_CASE("max-restarts: a rank killed on the first start, and the job succeeds on the second",
          "[integration][restart]") {
  JobResult job = RunJob("--max-restarts 2 -np 3 " + RestartingJob("1000 1 3 kill", "5"));
  INFO(job.output);
  CHECK(job.exit_code == 0);
  CHECK(job.output.find("rank 1 on localhost was killed by SIGKILL; it failed first") !=
        std::string::npos);
  CHECK(job.output.find("restarting it (restart 1 of 2)") != std::string::npos);
  CHECK(job.output.find("the job succeeded on its restart 1 of 2") != std::string::npos);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string tag = "[" + std::to_string(rank) + "]<stdout>:";
    CHECK(job.output.find(tag + "restart 0 0 of 2") != std::string::npos);
    CHECK(job.output.find(tag + "restart 1 1 of 2") != std::string::npos);
    // The second start's allreduces, over its new rendezvous, are right on every rank.
    CHECK(job.output.find(tag + "rank " + std::to_string(rank) + ": ok") != std::string::npos);
  }
  CHECK(job.output.find("restart 2 2") == std::string::npos);
}

TEST_CASE("max-restarts: out of restarts, the last failure's code and every start's cause",
          "[integration][restart]") {
  JobResult job =
      RunJob("--max-restarts 1 -np 2 " + RestartingJob("1000 1 2 exit3", "1000 0 2 kill"));
  INFO(job.output);
  CHECK(job.exit_code == 137);
  CHECK(job.output.find("trainrun: error: the job failed 2 times (--max-restarts 1):\n"
                        "  start 1: rank 1 on localhost exited with code 3; it failed first, so "
                        "the job was stopped\n"
                        "  start 2: rank 0 on localhost was killed by SIGKILL; it failed first, so "
                        "the job was stopped") != std::string::npos);
}

TEST_CASE("max-restarts: trainrun told to stop does not restart the job",
          "[integration][restart]") {
  // SIGTERM to trainrun after 2 s, while the first start's ranks sleep.
  const std::string command = std::string("timeout -s TERM 2 ") + TRAINRUN_EXECUTABLE +
                              " --max-restarts 3 -np 2 sleep 30 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
    output.append(buffer.data(), n);
  }
  int status = pclose(pipe);
  INFO(output);
  CHECK(WEXITSTATUS(status) == 124);  // timeout's code: trainrun ended on its SIGTERM
  CHECK(output.find("restarting") == std::string::npos);
  CHECK(output.find("started") == output.rfind("started"));
}
