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

#include "skip_test.h"

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

// RunJob runs `trainrun ARGS` through the shell, after the shell commands `setup` when given
// ("cd DIR").
JobResult RunJob(const std::string& args, const std::string& setup = "") {
  TempDir dir;
  const std::string command = (setup.empty() ? "" : setup + " && ") + "timeout -s KILL 60 " +
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

TEST_CASE("bind-to core pins local ranks to disjoint cores, and report-bindings says which",
          "[integration][flags]") {
  if (UsableCpus() < 2) {
    trainrun::testing::SkipTest("one usable CPU: disjoint cores cannot be shown here");
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

TEST_CASE("without bind-to a rank keeps trainrun's CPUs, and bind-to socket gives a whole socket",
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
  JobResult job = RunJob("-np 2 -wdir " + work.path() + " ./where.sh", "cd " + elsewhere.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  auto pwd = ByRank(job.out, R"(\[(\d+)\]<stdout>:(\S+))");
  CHECK(pwd == std::map<int, std::string>{{0, work.path()}, {1, work.path()}});
  // --wdir relative to trainrun's directory.
  ::mkdir((elsewhere.path() + "/sub").c_str(), 0755);
  JobResult relative = RunJob("-np 1 --wdir sub pwd", "cd " + elsewhere.path());
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

TEST_CASE("a .py that is not executable runs with the package's python3, said once",
          "[integration][flags][torchrun]") {
  TempDir dir;
  // Another python3 first on PATH: trainrun runs the interpreter its own package is for.
  ::mkdir((dir.path() + "/bin").c_str(), 0755);
  REQUIRE(::symlink("/usr/bin/python3", (dir.path() + "/bin/python3").c_str()) == 0);
  std::ofstream(dir.path() + "/train.py") << "import sys\nprint('python', sys.executable)\n";
  JobResult job = RunJob("-np 2 train.py", "PATH=" + dir.path() + "/bin:$PATH; cd " + dir.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out.find("[0]<stdout>:python /usr/bin/python3\n") != std::string::npos);
  CHECK(job.out.find("[1]<stdout>:python /usr/bin/python3\n") != std::string::npos);
  CHECK(std::regex_match(
      job.err,
      std::regex("trainrun: info: train.py is not executable: running it as `/usr/bin/python3 "
                 "train.py` \\(the interpreter trainrun's Python package is for\\); "
                 "--no-python runs the command as given\n"
                 "trainrun: info: 2 ranks on 1 host started in [0-9.]+ s\n")));
  // --no-python: as given, so it cannot be executed.
  JobResult as_given = RunJob("--no-python -np 1 ./train.py", "cd " + dir.path());
  CHECK(as_given.exit_code == 127);  // trainrun's one code for a command it cannot execute
  CHECK(as_given.err.find("cannot execute './train.py': Permission denied") != std::string::npos);
  CHECK(as_given.err.find("python3") == std::string::npos);
}

// The files of --log-dir: rank → stdout.log, stderr.log ("" when absent).
std::map<int, std::pair<std::string, std::string>> LogFiles(const std::string& dir, int ranks) {
  std::map<int, std::pair<std::string, std::string>> files;
  for (int rank = 0; rank < ranks; ++rank) {
    std::string base = dir + "/" + std::to_string(rank);
    files[rank] = {ReadFile(base + "/stdout.log"), ReadFile(base + "/stderr.log")};
  }
  return files;
}

TEST_CASE("log-dir, tee and redirects: per-rank files, and the console as torchrun has it",
          "[integration][flags][torchrun]") {
  TempDir dir;
  const std::string rank_says = " sh -c 'echo out $RANK; echo err $RANK >&2'";
  // --log-dir alone: both streams to the files and the console.
  JobResult both = RunJob("-np 2 --log-dir " + dir.path() + "/a" + rank_says);
  INFO(both.out << both.err);
  CHECK(both.exit_code == 0);
  auto files = LogFiles(dir.path() + "/a", 2);
  CHECK(files[0] == std::make_pair(std::string("out 0\n"), std::string("err 0\n")));
  CHECK(files[1] == std::make_pair(std::string("out 1\n"), std::string("err 1\n")));
  CHECK(both.out.find("[1]<stdout>:out 1\n") != std::string::npos);
  CHECK(both.err.find("[1]<stderr>:err 1\n") != std::string::npos);

  // --redirects 3: to the files only; the console has none of the ranks' lines.
  JobResult redirected = RunJob("-np 2 --log-dir " + dir.path() + "/b --redirects 3" + rank_says);
  CHECK(redirected.exit_code == 0);
  CHECK(redirected.out.empty());
  CHECK(redirected.err.find("<stderr>") == std::string::npos);
  CHECK(LogFiles(dir.path() + "/b", 2)[1] ==
        std::make_pair(std::string("out 1\n"), std::string("err 1\n")));

  // -r 1 -t 2: stdout to its file only; stderr to its file and the console.
  JobResult mixed = RunJob("-np 1 --log_dir " + dir.path() + "/c -r 1 -t 2" + rank_says);
  CHECK(mixed.exit_code == 0);
  CHECK(mixed.out.empty());
  CHECK(mixed.err.find("[0]<stderr>:err 0\n") != std::string::npos);
  CHECK(LogFiles(dir.path() + "/c", 1)[0] ==
        std::make_pair(std::string("out 0\n"), std::string("err 0\n")));

  // --tee 1: only stdout gets a file; both stay on the console.
  JobResult tee = RunJob("-np 1 --log-dir " + dir.path() + "/d --tee 1" + rank_says);
  CHECK(tee.out == "[0]<stdout>:out 0\n");
  CHECK(LogFiles(dir.path() + "/d", 1)[0] == std::make_pair(std::string("out 0\n"), std::string()));
  CHECK(::access((dir.path() + "/d/0/stderr.log").c_str(), F_OK) != 0);
}

TEST_CASE("tee and redirects: bad values get one sentence", "[integration][flags][torchrun]") {
  JobResult four = RunJob("-np 1 --log-dir /tmp --tee 4 true");
  CHECK(four.exit_code == 2);
  CHECK(four.err ==
        "trainrun: error: --tee 4 is not one of 0 (none), 1 (stdout), 2 (stderr), 3 (both)\n");
  JobResult mapping = RunJob("-np 1 --log-dir /tmp --redirects 0:1,1:2 true");
  CHECK(mapping.err ==
        "trainrun: error: --redirects 0:1,1:2: per-local-rank values are torchrun's; trainrun "
        "takes one value for every rank: 0 none, 1 stdout, 2 stderr, 3 both\n");
  JobResult no_dir = RunJob("-np 1 --redirects 3 true");
  CHECK(no_dir.err ==
        "trainrun: error: --redirects writes the ranks' output to files: give --log-dir DIR for "
        "them\n");
}

TEST_CASE("help: the usage names the command, and no CLI11 internals show",
          "[integration][flags]") {
  JobResult help = RunJob("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("\nUsage: trainrun [OPTIONS] COMMAND [ARGS...]\n") != std::string::npos);
  for (const char* internal : {"{false}", "{true}", ":INT", ":FLOAT", " in [", "TEXT", ":FILE"}) {
    INFO(internal);
    CHECK(help.out.find(internal) == std::string::npos);
  }
  CHECK(help.out.find("--pty,--no-pty ") != std::string::npos);
  CHECK(help.out.find("--bind-to WHAT:{core,socket,none}") != std::string::npos);
}

TEST_CASE("a start line when every rank has started, which --quiet turns off",
          "[integration][flags]") {
  JobResult job = RunJob("-np 2 true");
  CHECK(job.exit_code == 0);
  CHECK(std::regex_match(
      job.err, std::regex("trainrun: info: 2 ranks on 1 host started in [0-9]+\\.[0-9]{2} "
                          "s\n")));
  JobResult quiet = RunJob("--quiet -np 2 true");
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.err.empty());
  // A job that cannot start has no start line.
  JobResult failed = RunJob("-np 2 /nonexistent/worker");
  CHECK(failed.err.find("started in") == std::string::npos);
}

TEST_CASE("gRPC's own log lines never reach the console, and --verbose shows them as debug lines",
          "[integration][flags]") {
  // GRPC_VERBOSITY=DEBUG makes gRPC log at every start (its experiments list, its poller).
  JobResult job = RunJob("-q -np 1 true", "export GRPC_VERBOSITY=DEBUG");
  CHECK(job.exit_code == 0);
  CHECK(job.err.empty());
  JobResult bad_address =
      RunJob("--rendezvous-addr 10.9.9.9 -np 1 true", "export GRPC_VERBOSITY=DEBUG");
  CHECK(bad_address.exit_code != 0);
  CHECK(bad_address.err ==
        "trainrun: error: cannot start the job's rendezvous server: the rendezvous server cannot "
        "listen on 10.9.9.9:0; check --rendezvous-addr\n");
  JobResult verbose = RunJob("--verbose -np 1 true", "export GRPC_VERBOSITY=DEBUG");
  CHECK(verbose.err.find("trainrun: debug: grpc: ") != std::string::npos);
  CHECK_FALSE(std::regex_search(verbose.err, std::regex("(^|\n)[DIEW][0-9]{4} ")));
}

TEST_CASE("horovodrun's --tcp and --fusion-threshold-mb reach the ranks, an -x of one wins",
          "[integration][flags]") {
  const std::string show = " -np 1 sh -c 'echo $TRAINRUN_TRANSPORT $TRAINRUN_FUSION_BYTES'";
  JobResult job = RunJob("--tcp --fusion-threshold-mb 2" + show);
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out == "[0]<stdout>:tcp 2097152\n");
  JobResult given = RunJob(
      "--tcp --fusion-threshold-mb 2 -x TRAINRUN_TRANSPORT=shm -x TRAINRUN_FUSION_BYTES=4096" +
      show);
  CHECK(given.exit_code == 0);
  CHECK(given.out == "[0]<stdout>:shm 4096\n");
  JobResult dry = RunJob("--dry-run --tcp --fusion-threshold-mb 2 -np 1 true");
  CHECK(dry.exit_code == 0);
  CHECK(dry.out.find("export TRAINRUN_FUSION_BYTES=2097152\nexport TRAINRUN_TRANSPORT=tcp\n") !=
        std::string::npos);
}

TEST_CASE("an elastic job's ranks wait --elastic-timeout plus 30 s for a generation, over any -x",
          "[integration][flags]") {
  JobResult job = RunJob(
      "--min-np 1 --elastic-timeout 45 -x TRAINRUN_ELASTIC_TIMEOUT=5 -np 1 sh -c 'echo "
      "$TRAINRUN_ELASTIC $HOROVOD_ELASTIC $TRAINRUN_ELASTIC_TIMEOUT'");
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out == "[0]<stdout>:1 1 75\n");
}

TEST_CASE("config-file: a job file gives hosts, processes per host, environment and command",
          "[integration][flags][config]") {
  TempDir dir;
  std::ofstream(dir.path() + "/job.yaml") << R"(# a RiseML-style job file
hosts:
  - localhost
processes_per_host: 2
environment:
  GREETING: "hello there"   # quoted, with a space
command: sh -c 'echo $GREETING $RANK of $WORLD_SIZE'
)";
  JobResult job = RunJob("-q --config-file job.yaml", "cd " + dir.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out.find("[0]<stdout>:hello there 0 of 2\n") != std::string::npos);
  CHECK(job.out.find("[1]<stdout>:hello there 1 of 2\n") != std::string::npos);
  // The command line overrides the file: its -np, its -x, its command.
  JobResult overridden = RunJob(
      "-q --config-file job.yaml -np 1 -x GREETING=hi sh -c 'echo $GREETING'", "cd " + dir.path());
  CHECK(overridden.out == "[0]<stdout>:hi\n");
}

TEST_CASE("config-file: anchors, merge keys, flow mappings and block scalars run a job",
          "[integration][flags][config]") {
  TempDir dir;
  std::ofstream(dir.path() + "/job.yaml") << R"(--- # YAML beyond plain `key: value` lines
<<: &job {num_proc: 2}
environment: {GREETING: &hi "hello, there", ECHO: *hi}
stall_check: {warning_time_seconds: 90}
command: >-
  sh -c 'echo "$GREETING|$ECHO|$TRAINRUN_STALL_CHECK_TIME_SECONDS"'
)";
  JobResult job = RunJob("-q --config-file job.yaml", "cd " + dir.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out.find("[0]<stdout>:hello, there|hello, there|90\n") != std::string::npos);
  CHECK(job.out.find("[1]<stdout>:hello, there|hello, there|90\n") != std::string::npos);
  // A file yaml-cpp refuses: the file, the line and column, and why.
  std::ofstream(dir.path() + "/broken.yaml") << "hosts: [a, b\nnum_proc: 2\n";
  JobResult broken = RunJob("--config-file broken.yaml -np 1 true", "cd " + dir.path());
  CHECK(broken.exit_code == 2);
  CHECK(broken.err ==
        "trainrun: error: broken.yaml line 2, column 9: not valid YAML: end of sequence flow not "
        "found\n");
}

TEST_CASE("config-file: horovodrun's keys act as its flags, and the command line wins",
          "[integration][flags][config]") {
  TempDir dir;
  std::ofstream(dir.path() + "/horovod.yaml") << R"(controller: gloo
params:
  fusion_threshold_mb: 32
  hierarchical_allreduce: true
autotune:
  enabled: true
stall_check:
  enabled: true
  warning_time_seconds: 120
library_options:
  gloo_timeout_seconds: 60
)";
  const std::string show =
      " -np 1 sh -c 'echo $TRAINRUN_FUSION_BYTES $TRAINRUN_TIMEOUT "
      "$TRAINRUN_STALL_CHECK_TIME_SECONDS'";
  JobResult job = RunJob("--config-file horovod.yaml" + show, "cd " + dir.path());
  INFO(job.out << job.err);
  CHECK(job.exit_code == 0);
  CHECK(job.out == "[0]<stdout>:33554432 60 120\n");
  CHECK(job.err.find("trainrun: info: horovod.yaml: autotune.enabled is accepted for horovodrun "
                     "compatibility and changes nothing: ") != std::string::npos);
  CHECK(job.err.find("--hierarchical-allreduce is accepted for horovodrun compatibility") !=
        std::string::npos);
  JobResult overridden = RunJob(
      "--config-file horovod.yaml --stall-check-warning-time-seconds 7 --fusion-threshold-mb 1" +
          show,
      "cd " + dir.path());
  CHECK(overridden.out == "[0]<stdout>:1048576 60 7\n");
}

TEST_CASE("config-file: a bad key, value or file gets one sentence naming file, line and key",
          "[integration][flags][config]") {
  TempDir dir;
  std::ofstream(dir.path() + "/typo.yaml") << "params:\n  fusion_thresold_mb: 32\n";
  JobResult typo = RunJob("--config-file typo.yaml -np 1 true", "cd " + dir.path());
  CHECK(typo.exit_code == 2);
  CHECK(typo.err ==
        "trainrun: error: typo.yaml line 2: 'params.fusion_thresold_mb' is not a key trainrun "
        "knows (horovodrun's params, autotune, timeline, stall_check, library_options and logging "
        "keys, or a job file's hosts, processes_per_host, num_proc, environment, command)\n");
  std::ofstream(dir.path() + "/value.yaml") << "# ok\nstall_check:\n  enabled: maybe\n";
  JobResult value = RunJob("--config-file value.yaml -np 1 true", "cd " + dir.path());
  CHECK(value.err ==
        "trainrun: error: value.yaml line 3: stall_check.enabled: 'maybe' is not true or false\n");
  std::ofstream(dir.path() + "/mpi.yaml") << "controller: mpi\n";
  JobResult mpi = RunJob("--config-file mpi.yaml -np 1 true", "cd " + dir.path());
  CHECK(
      mpi.err ==
      "trainrun: error: mpi.yaml line 1: controller: mpi: trainrun needs no MPI; remove the key\n");
  JobResult missing = RunJob("--config-file nope.yaml -np 1 true", "cd " + dir.path());
  CHECK(missing.exit_code == 2);
  CHECK(missing.err ==
        "trainrun: error: --config-file nope.yaml: cannot read it: No such file or directory\n");
}

TEST_CASE("a rank that cannot import trainrun: the summary names both interpreters",
          "[integration][flags]") {
  TempDir dir;
  // A second python3 first on PATH, one without trainrun (a fake that answers as one would).
  ::mkdir((dir.path() + "/bin").c_str(), 0755);
  std::ofstream(dir.path() + "/bin/python3")
      << "#!/bin/sh\n"
         "if [ \"$1\" = --version ]; then echo 'Python 3.99.0'; exit 0; fi\n"
         "echo 'Traceback (most recent call last):' >&2\n"
         "echo \"ModuleNotFoundError: No module named 'trainrun'\" >&2\n"
         "exit 1\n";
  ::chmod((dir.path() + "/bin/python3").c_str(), 0755);
  JobResult job = RunJob("-np 1 python3 -c 'import trainrun'", "PATH=" + dir.path() + "/bin:$PATH");
  INFO(job.out << job.err);
  CHECK(job.exit_code == 1);
  CHECK(job.err.find("python3 on the job's PATH is " + dir.path() +
                     "/bin/python3 (Python 3.99.0), but trainrun's Python package is installed "
                     "for /usr/bin/python3 (Python 3.") != std::string::npos);
}
