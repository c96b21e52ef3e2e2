// The flags people bring from mpirun, torchrun and horovodrun (issue 15), each checked by its
// effect on real ranks under the real trainrun: the CPUs a rank may run on, its directory, where
// its output goes, what trainrun prints.
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

struct JobResult {
  int exit_code = -1;
  std::string out;  // trainrun's stdout
  std::string err;  // trainrun's stderr
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/trainrun_flags_test.XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// RunJob runs `trainrun ARGS` through the shell (from `cwd` when given).
JobResult RunJob(const std::string& args, const std::string& cwd = "") {
  TempDir dir;
  const std::string command = (cwd.empty() ? "" : "cd " + cwd + " && ") + "timeout -s KILL 60 " +
                              TRAINRUN_EXECUTABLE + " " + args + " >" + dir.path() + "/out 2>" +
                              dir.path() + "/err </dev/null";
  int status = std::system(command.c_str());
  JobResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(dir.path() + "/out");
  result.err = ReadFile(dir.path() + "/err");
  return result;
}

// The rank → text captured by `pattern`'s first group on lines "[rank]<stdout>:...".
std::map<int, std::string> ByRank(const std::string& text, const std::string& pattern) {
  std::map<int, std::string> by_rank;
  std::regex re(pattern);
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    by_rank[std::stoi((*it)[1])] = (*it)[2];
  }
  return by_rank;
}

// The CPUs a Cpus_allowed_list names ("0-3,8").
std::set<int> CpuSet(const std::string& list) {
  std::set<int> cpus;
  std::stringstream in(list);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t dash = part.find('-');
    int first = std::stoi(part.substr(0, dash));
    int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

const char kShowCpus[] = "sh -c 'grep Cpus_allowed_list /proc/self/status'";

}  // namespace

TEST_CASE("bind-to core pins local ranks to disjoint cores; report-bindings says which",
          "[integration][flags]") {
  if (UsableCpus() < 2) {
    WARN("one usable CPU: disjoint cores cannot be shown here");
    return;
  }
  JobResult job = RunJob(std::string("-np 2 --bind-to core --report-bindings ") + kShowCpus);
  INFO(job.out << job.err);
  REQUIRE(job.exit_code == 0);
  auto allowed = ByRank(job.out, R"(\[(\d+)\]<stdout>:Cpus_allowed_list:\s*([0-9,-]+))");
  auto reported =
      ByRank(job.err, R"(rank (\d+) on localhost bound to core \d+ \(cpus ([0-9,-]+)\))");
  REQUIRE(allowed.size() == 2);
  REQUIRE(reported.size() == 2);
  for (int rank = 0; rank < 2; ++rank) CHECK(allowed[rank] == reported[rank]);
  std::set<int> zero = CpuSet(allowed[0]), one = CpuSet(allowed[1]);
  CHECK_FALSE(zero.empty());
  for (int cpu : zero) CHECK(one.count(cpu) == 0);
  // mpirun's single-dash spellings, and --map-by core, bind the same way.
  JobResult dash = RunJob(std::string("-np 2 -map-by core -report-bindings ") + kShowCpus);
  CHECK(ByRank(dash.out, R"(\[(\d+)\]<stdout>:Cpus_allowed_list:\s*([0-9,-]+))") == allowed);
}

TEST_CASE("without bind-to a rank keeps trainrun's CPUs; bind-to socket gives a whole socket",
          "[integration][flags]") {
  JobResult free = RunJob(std::string("-np 1 --report-bindings ") + kShowCpus);
  INFO(free.out << free.err);
  REQUIRE(free.exit_code == 0);
  auto allowed = ByRank(free.out, R"(\[(\d+)\]<stdout>:Cpus_allowed_list:\s*([0-9,-]+))");
  REQUIRE(allowed.size() == 1);
  CHECK(static_cast<int>(CpuSet(allowed[0]).size()) == UsableCpus());
  CHECK(free.err.find("rank 0 on localhost bound to nothing (any cpu this host allows: " +
                      allowed[0] + ")") != std::string::npos);

  JobResult socket = RunJob(std::string("-np 1 --bind-to socket --report-bindings ") + kShowCpus);
  INFO(socket.out << socket.err);
  auto reported =
      ByRank(socket.err, R"(rank (\d+) on localhost bound to socket 0 \(cpus ([0-9,-]+)\))");
  auto in_rank = ByRank(socket.out, R"(\[(\d+)\]<stdout>:Cpus_allowed_list:\s*([0-9,-]+))");
  REQUIRE(reported.size() == 1);
  CHECK(in_rank[0] == reported[0]);
}

TEST_CASE("map-by and bind-to refuse what trainrun does not do, in one sentence",
          "[integration][flags]") {
  JobResult node = RunJob("-np 2 --map-by node true");
  CHECK(node.exit_code == 2);
  CHECK(node.err ==
        "trainrun: error: --map-by node: trainrun fills each host's slots in order (rank 0..N-1 on "
        "the first host); to spread ranks over hosts give each fewer slots, e.g. -H a:1,b:1\n");
  JobResult bind = RunJob("-np 2 --bind-to board true");
  CHECK(bind.exit_code == 2);
  CHECK(bind.err.find("--bind-to: board not in {core,socket,none}") != std::string::npos);
}

TEST_CASE("wdir: every rank starts there, and a relative command is found there",
          "[integration][flags]") {
  TempDir work, elsewhere;
  std::ofstream(work.path() + "/where.sh") << "#!/bin/sh\npwd\n";
  REQUIRE(::chmod((work.path() + "/where.sh").c_str(), 0755) == 0);
  JobResult job = RunJob("-np 2 -wdir " + work.path() + " ./where.sh", elsewhere.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  auto pwd = ByRank(job.out, R"(\[(\d+)\]<stdout>:(\S+))");
  CHECK(pwd == std::map<int, std::string>{{0, work.path()}, {1, work.path()}});
  // --wdir relative to trainrun's directory.
  ::mkdir((elsewhere.path() + "/sub").c_str(), 0755);
  JobResult relative = RunJob("-np 1 --wdir sub pwd", elsewhere.path());
  CHECK(relative.out == "[0]<stdout>:" + elsewhere.path() + "/sub\n");
  JobResult missing = RunJob("-np 1 -wdir " + work.path() + "/nope pwd");
  CHECK(missing.exit_code == 2);
  CHECK(missing.err == "trainrun: error: -wdir " + work.path() +
                           "/nope: No such file or directory; give an existing directory for the "
                           "ranks\n");
}

TEST_CASE("more ranks than cores: a warning, unless --oversubscribe", "[integration][flags]") {
  const int ranks = UsableCpus() + 1;
  JobResult warned = RunJob("-np " + std::to_string(ranks) + " true");
  INFO(warned.err);
  CHECK(warned.exit_code == 0);
  CHECK(warned.err.find("trainrun: warning: " + std::to_string(ranks) +
                        " ranks on this host, which has " + std::to_string(ranks - 1)) !=
        std::string::npos);
  CHECK(warned.err.find("--oversubscribe says this is intended") != std::string::npos);
  JobResult quiet = RunJob("--oversubscribe -np " + std::to_string(ranks) + " true");
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.err.find("warning") == std::string::npos);
  JobResult fits = RunJob("-np 1 true");
  CHECK(fits.err.find("warning") == std::string::npos);
}

TEST_CASE("display-map prints the plan, then runs the job", "[integration][flags]") {
  JobResult job = RunJob("-np 2 --display-map --bind-to core echo hi");
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out.find("trainrun: job map: 2 ranks on 1 host\nHOST") == 0);
  CHECK(job.out.find("bound to: one core per local rank\n") != std::string::npos);
  CHECK(job.out.find("[0]<stdout>:hi\n") != std::string::npos);
  CHECK(job.out.find("[1]<stdout>:hi\n") != std::string::npos);
  CHECK(job.out.find("[0]<stdout>:hi") > job.out.find("localhost  1 "));
}
