// The C++ and C elastic examples (examples/collectives/elastic_worker.cc, elastic_worker.c) under
// the real trainrun: a C++ worker rejoins an elastic job through the worker runtime, a C worker
// through the C API's trainrun_comm_rejoin, as a Python one does.
#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "run_job.h"

namespace {

const std::string kElasticWorker = TRAINRUN_ELASTIC_WORKER;
const std::string kElasticWorkerC = TRAINRUN_ELASTIC_WORKER_C;

// Survive: 4 ranks, --min-np 2; the rank that started as rank 2 SIGKILLs itself after step 30
// (the last commit is step 28). The job goes on at 3 ranks from that commit and finishes.
void CheckSurvives(const std::string& worker, const std::string& flags) {
  JobResult job = RunJob("-np 4 --min-np 2 " + flags + " " + worker +
                         " --kill-rank 2 --kill-at-step 30 --batches-per-commit 4 --steps 300");
  INFO(job.output);
  CHECK(job.exit_code == 0);
  CHECK(std::regex_search(job.output,
                          std::regex("rank 2 on localhost was killed by SIGKILL; the job goes on "
                                     "at 3 ranks \\(generation 1, formed by ranks 0-1,3 of the "
                                     "start\\)")));
  // Every survivor resumed at the last commit, in generation 1, on 3 ranks.
  for (int slot : {0, 1, 3}) {
    CHECK(std::regex_search(job.output, std::regex("\\(started as " + std::to_string(slot) +
                                                   "\\): resumed at step 28 on 3 ranks "
                                                   "\\(generation 1\\)")));
  }
  CHECK(std::regex_search(job.output,
                          std::regex("final loss [^ ]+ on 3 rank\\(s\\) after 300 steps "
                                     "\\(generation 1\\); weights bit-identical on every rank")));
  CHECK(job.output.find("the job survived 1 membership change, 3 of 4 ranks remain") !=
        std::string::npos);
}

}  // namespace

TEST_CASE("a C++ elastic worker survives a SIGKILLed rank over shared memory",
          "[integration][elastic]") {
  CheckSurvives(kElasticWorker, "");
}

TEST_CASE("a C++ elastic worker survives a SIGKILLed rank over TCP", "[integration][elastic]") {
  CheckSurvives(kElasticWorker, "--tcp");
}

TEST_CASE("a C elastic worker survives a SIGKILLed rank over shared memory",
          "[integration][elastic]") {
  CheckSurvives(kElasticWorkerC, "");
}

TEST_CASE("a C elastic worker survives a SIGKILLed rank over TCP", "[integration][elastic]") {
  CheckSurvives(kElasticWorkerC, "--tcp");
}
