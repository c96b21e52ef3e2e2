// RunJob: `trainrun ARGS` through the shell, for the tests that judge a whole job by what trainrun
// printed and how it ended (job_test, chaos_test). TRAINRUN_EXECUTABLE is the trainrun under test;
// a job is killed after 60 s.
//
//   JobResult job = RunJob("-np 3 " + worker);
//   CHECK(job.exit_code == 0);
#pragma once

#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>

struct JobResult {
  int exit_code = -1;  // 128 + N when trainrun was killed by signal N
  std::string output;  // trainrun's stdout and stderr together
  double seconds = 0;
};

inline JobResult RunJob(const std::string& args) {
  const std::string command =
      std::string("timeout -s KILL 60 ") + TRAINRUN_EXECUTABLE + " " + args + " 2>&1";
  JobResult result;
  auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  int status = pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}
