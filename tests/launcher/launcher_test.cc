// Launcher tests with real processes: jobs run through launch_driver (LaunchSpec from argv →
// Launch), each rank a real shell; the tests look at output, exit codes, and which pids are alive.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitUntil(const std::function<bool()>& done, milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// Alive is true while `pid` exists and is not a zombie.
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// Pids returns the numbers that follow `word ` in `text` ("pid 123").
std::vector<pid_t> Pids(const std::string& text, const std::string& word) {
  std::vector<pid_t> out;
  std::regex re(word + " ([0-9]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Driver runs launch_driver with its output in files under a fresh directory.
class Driver {
 public:
  // stdin_mode: "null", "file:<contents>", "pipe" (then WriteStdin/CloseStdin).
  explicit Driver(std::vector<std::string> args, const std::string& stdin_mode = "null") {
    char dir_template[] = "/tmp/trainrun_launcher_test.XXXXXX";
    dir_ = mkdtemp(dir_template);
    int stdin_fd = -1;
    int pipe_fds[2] = {-1, -1};
    if (stdin_mode == "null") {
      stdin_fd = open("/dev/null", O_RDONLY);
    } else if (stdin_mode.rfind("file:", 0) == 0) {
      std::ofstream(dir_ + "/stdin") << stdin_mode.substr(5);
      stdin_fd = open((dir_ + "/stdin").c_str(), O_RDONLY);
    } else {
      REQUIRE(pipe(pipe_fds) == 0);
      stdin_fd = pipe_fds[0];
      stdin_write_ = pipe_fds[1];
    }
    args.insert(args.begin(), TRAINRUN_LAUNCH_DRIVER);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string out = dir_ + "/out", err = dir_ + "/err";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(stdin_fd, 0);
      dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
      dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
      if (stdin_write_ >= 0) close(stdin_write_);
      execv(argv[0], argv.data());
      _exit(126);
    }
    close(stdin_fd);
  }
  ~Driver() {
    if (stdin_write_ >= 0) close(stdin_write_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::system(("rm -rf " + dir_).c_str());
  }

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string Out() const { return ReadFile(dir_ + "/out"); }
  std::string Err() const { return ReadFile(dir_ + "/err"); }
  void WriteStdin(const std::string& data) {
    REQUIRE(write(stdin_write_, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
  }
  void CloseStdin() {
    close(stdin_write_);
    stdin_write_ = -1;
  }

  // Wait returns the driver's exit code (128+N for signal N), or -1 after `timeout`.
  int Wait(milliseconds timeout = milliseconds(10000)) {
    int status = 0;
    bool done = WaitUntil([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!done) return -1;
    reaped_ = true;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int stdin_write_ = -1;
  bool reaped_ = false;
};

// Each rank's environment, from `env` run under the driver: rank → NAME → value.
std::map<int, std::map<std::string, std::string>> RankEnvironments(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> by_rank;
  std::regex line_re(R"(\[(\d+)\]<stdout>:([^=\n]+)=([^\n]*))");
  for (std::sregex_iterator it(out.begin(), out.end(), line_re), end; it != end; ++it) {
    by_rank[std::stoi((*it)[1])][(*it)[2]] = (*it)[3];
  }
  return by_rank;
}

}  // namespace

TEST_CASE("every rank gets the worker environment of DESIGN.md", "[launcher]") {
  unsetenv("OMP_NUM_THREADS");
  setenv("TRAINRUN_TEST_PASSED_ON", "yes", 1);
  setenv("RANK", "stale", 1);  // an enclosing job's value must not leak through
  // Nor an enclosing job's host relay: these ranks would call that job's.
  setenv("TRAINRUN_RENDEZVOUS_RELAY", "@trainrun-relay-stale", 1);
  Driver driver({"-H", "localhost:2,127.0.0.1:1", "-x", "FORCED=1", "-x", "TRAINRUN_TEST_PASSED_ON",
                 "/usr/bin/env"});
  REQUIRE(driver.Wait() == 0);
  unsetenv("RANK");
  unsetenv("TRAINRUN_RENDEZVOUS_RELAY");
  auto env = RankEnvironments(driver.Out());
  REQUIRE(env.size() == 3);
  struct Expected {
    int rank, local_rank, local_size, cross_rank, cross_size, group_rank;
    const char* host;
  };
  const Expected expected[] = {{0, 0, 2, 0, 2, 0, "localhost"},
                               {1, 1, 2, 0, 1, 0, "localhost"},
                               {2, 0, 1, 1, 2, 1, "127.0.0.1"}};
  for (const Expected& e : expected) {
    auto& v = env[e.rank];
    INFO("rank " << e.rank);
    for (const char* prefix : {"TRAINRUN_", "HOROVOD_"}) {
      std::string p = prefix;
      CHECK(v[p + "RANK"] == std::to_string(e.rank));
      CHECK(v[p + "SIZE"] == "3");
      CHECK(v[p + "LOCAL_RANK"] == std::to_string(e.local_rank));
      CHECK(v[p + "LOCAL_SIZE"] == std::to_string(e.local_size));
      CHECK(v[p + "CROSS_RANK"] == std::to_string(e.cross_rank));
      CHECK(v[p + "CROSS_SIZE"] == std::to_string(e.cross_size));
      CHECK(v[p + "HOSTNAME"] == e.host);
    }
    CHECK(v["RANK"] == std::to_string(e.rank));
    CHECK(v["WORLD_SIZE"] == "3");
    CHECK(v["LOCAL_RANK"] == std::to_string(e.local_rank));
    CHECK(v["LOCAL_WORLD_SIZE"] == std::to_string(e.local_size));
    CHECK(v["GROUP_RANK"] == std::to_string(e.group_rank));
    CHECK(v["MASTER_ADDR"] == "localhost");
    CHECK(v["MASTER_PORT"] == env[0]["MASTER_PORT"]);
    CHECK(std::stoi(v["MASTER_PORT"]) > 0);
    CHECK(v["OMPI_COMM_WORLD_RANK"] == std::to_string(e.rank));
    CHECK(v["OMPI_COMM_WORLD_SIZE"] == "3");
    CHECK(v["OMPI_COMM_WORLD_LOCAL_RANK"] == std::to_string(e.local_rank));
    CHECK(v["OMPI_COMM_WORLD_LOCAL_SIZE"] == std::to_string(e.local_size));
    CHECK(std::regex_match(v["TRAINRUN_JOB_TOKEN"], std::regex("[0-9a-f]{64}")));
    CHECK(v["TRAINRUN_JOB_TOKEN"] == env[0]["TRAINRUN_JOB_TOKEN"]);
    CHECK(!v["TRAINRUN_JOB_ID"].empty());
    CHECK(v["TRAINRUN_JOB_ID"] == env[0]["TRAINRUN_JOB_ID"]);
    // The job's rendezvous server, on loopback for a job on this host; one address for all ranks.
    CHECK(std::regex_match(v["TRAINRUN_RENDEZVOUS_ADDR"], std::regex(R"(127\.0\.0\.1:[0-9]+)")));
    CHECK(v["TRAINRUN_RENDEZVOUS_ADDR"] == env[0]["TRAINRUN_RENDEZVOUS_ADDR"]);
    CHECK(v.count("TRAINRUN_RENDEZVOUS_RELAY") == 0);
    CHECK(v["TRAINRUN_TEST_PASSED_ON"] == "yes");
    CHECK(v["FORCED"] == "1");
    if (e.local_size > 1) {
      CHECK(v["OMP_NUM_THREADS"] == "1");
    } else {
      CHECK(v.count("OMP_NUM_THREADS") == 0);
    }
  }
  unsetenv("TRAINRUN_TEST_PASSED_ON");
}

TEST_CASE("each job gets a fresh token, and OMP_NUM_THREADS set by the user is kept",
          "[launcher]") {
  setenv("OMP_NUM_THREADS", "7", 1);
  Driver a({"-np", "2", "/usr/bin/env"});
  Driver b({"-np", "2", "/usr/bin/env"});
  REQUIRE(a.Wait() == 0);
  REQUIRE(b.Wait() == 0);
  unsetenv("OMP_NUM_THREADS");
  auto ea = RankEnvironments(a.Out()), eb = RankEnvironments(b.Out());
  CHECK(ea[0]["TRAINRUN_JOB_TOKEN"] != eb[0]["TRAINRUN_JOB_TOKEN"]);
  CHECK(ea[1]["OMP_NUM_THREADS"] == "7");
}

TEST_CASE("output is tagged per line, and partial last lines, CRs and non-UTF-8 bytes pass",
          "[launcher]") {
  // --quiet: the rank's bytes alone on stderr (no start line, which may come before or after them).
  Driver driver({"--quiet", "-np", "1", "sh", "-c",
                 R"(printf 'one\ntwo'; printf 'bar \r50%%\r100%%\377\n' >&2)"});
  REQUIRE(driver.Wait() == 0);
  CHECK(driver.Out() == "[0]<stdout>:one\n[0]<stdout>:two\n");
  CHECK(driver.Err() == "[0]<stderr>:bar \r50%\r100%\377\n");

  Driver untagged({"--no-tag", "-np", "1", "sh", "-c", "printf 'a\\nb'"});
  REQUIRE(untagged.Wait() == 0);
  CHECK(untagged.Out() == "a\nb\n");
}

TEST_CASE("a 10 MB line without a newline blocks no other rank", "[launcher]") {
  // Rank 0 writes 10 MB with no newline; rank 1's line must get out meanwhile. Both also go to
  // --output-filename files, byte for byte.
  char dir_template[] = "/tmp/trainrun_output_test.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  Driver driver(
      {"--output-filename", dir + "/out", "-np", "2", "sh", "-c",
       R"(if [ $RANK = 0 ]; then head -c 10000000 /dev/zero | tr '\0' a; sleep 0.3; echo; else echo hello; fi)"});
  REQUIRE(driver.Wait() == 0);
  std::string out = driver.Out();
  CHECK(Count(out, "[1]<stdout>:hello\n") == 1);
  CHECK(Count(out, "a") >= 10000000);
  CHECK(ReadFile(dir + "/out/rank.0/stdout") == std::string(10000000, 'a') + "\n");
  CHECK(ReadFile(dir + "/out/rank.1/stdout") == "hello\n");
  CHECK(ReadFile(dir + "/out/rank.1/stderr").empty());
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("exit codes pass through: code, 128+signal, 0 when all succeed", "[launcher]") {
  // Nothing on stderr but the start line (4 ranks may be more than this machine's cores:
  // --oversubscribe says that is intended, without which trainrun would warn).
  Driver ok({"--oversubscribe", "-np", "4", "/bin/true"});
  CHECK(ok.Wait() == 0);
  CHECK(std::regex_match(ok.Err(),
                         std::regex("trainrun: info: 4 ranks on 1 host started in [0-9.]+ s\n")));

  Driver code({"-np", "3", "sh", "-c", "if [ $RANK = 2 ]; then exit 7; fi; sleep 30"});
  CHECK(code.Wait() == 7);
  CHECK(Count(code.Err(), "rank 2 on localhost exited with code 7") == 1);

  Driver segv({"-np", "2", "sh", "-c",
               "if [ $RANK = 1 ]; then echo dying >&2; kill -SEGV $$; fi; sleep 30"});
  CHECK(segv.Wait() == 139);
  std::string err = segv.Err();
  CHECK(Count(err, "rank 1 on localhost was killed by SIGSEGV") == 1);
  CHECK(Count(err, "| dying") == 1);  // its last lines of stderr
  CHECK(Count(err, "stopped as a consequence: rank 0 (ended: SIGTERM)") == 1);
}

TEST_CASE("the summary blames the first failure, not a rank that failed because of it",
          "[launcher]") {
  // Rank 0 fails; ranks 1-3 exit 1 when stopped (as a collective on a dead peer would).
  Driver driver(
      {"-np", "4", "sh", "-c",
       "trap 'exit 1' TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 5; fi; sleep 30 & wait"});
  CHECK(driver.Wait() == 5);
  std::string err = driver.Err();
  INFO(err);
  CHECK(Count(err, "rank 0 on localhost exited with code 5; it failed first") == 1);
  CHECK(Count(err, "stopped as a consequence: ranks 1-3 (ended: code 1)") == 1);
}

TEST_CASE("kill -9 of one rank ends the others within 2 s", "[launcher]") {
  Driver driver({"-np", "4", "sh", "-c", "echo pid $$; exec sleep 30"});
  REQUIRE(WaitUntil([&] { return Pids(driver.Out(), "pid").size() == 4; }, milliseconds(5000)));
  std::vector<pid_t> pids = Pids(driver.Out(), "pid");
  auto killed_at = Clock::now();
  REQUIRE(kill(pids[2], SIGKILL) == 0);
  CHECK(driver.Wait(milliseconds(5000)) == 137);
  CHECK(Clock::now() - killed_at < milliseconds(2000));
  for (pid_t pid : pids) CHECK_FALSE(Alive(pid));
  CHECK(Count(driver.Err(), "was killed by SIGKILL") == 1);
}

TEST_CASE("SIGINT to the launcher: exit 130 and no rank left", "[launcher]") {
  Driver driver({"-np", "3", "sh", "-c", "echo pid $$; exec sleep 30"});
  REQUIRE(WaitUntil([&] { return Pids(driver.Out(), "pid").size() == 3; }, milliseconds(5000)));
  std::vector<pid_t> pids = Pids(driver.Out(), "pid");
  REQUIRE(kill(driver.pid(), SIGINT) == 0);
  CHECK(driver.Wait(milliseconds(5000)) == 130);
  for (pid_t pid : pids) CHECK_FALSE(Alive(pid));
  CHECK(Count(driver.Err(), "interrupted by SIGINT") == 1);

  Driver term({"-np", "2", "sh", "-c", "echo pid $$; exec sleep 30"});
  REQUIRE(WaitUntil([&] { return Pids(term.Out(), "pid").size() == 2; }, milliseconds(5000)));
  REQUIRE(kill(term.pid(), SIGTERM) == 0);
  CHECK(term.Wait(milliseconds(5000)) == 143);
}

TEST_CASE("a rank that ignores SIGTERM is killed after the grace period", "[launcher]") {
  Driver driver({"--grace-ms", "300", "-np", "2", "sh", "-c",
                 "trap '' TERM; echo pid $$; if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; while "
                 ":; do sleep 0.05; done"});
  auto start = Clock::now();
  CHECK(driver.Wait(milliseconds(5000)) == 3);
  CHECK(Clock::now() - start < milliseconds(3000));
  for (pid_t pid : Pids(driver.Out(), "pid")) CHECK_FALSE(Alive(pid));
  CHECK(Count(driver.Err(), "stopped as a consequence: rank 0 (ended: SIGKILL)") == 1);
}

TEST_CASE("a stopped rank ends at once on SIGTERM, not at the grace period's SIGKILL",
          "[launcher]") {
  // SIGTERM stays pending on a stopped process; the launcher follows it with SIGCONT.
  // The lines come in any order: each names its rank.
  Driver driver({"-np", "3", "sh", "-c", "echo pid-of-rank-$TRAINRUN_RANK $$; exec sleep 30"});
  REQUIRE(WaitUntil([&] { return Pids(driver.Out(), "pid-of-rank-[0-9]").size() == 3; },
                    milliseconds(5000)));
  std::vector<pid_t> pids = Pids(driver.Out(), "pid-of-rank-[0-9]");
  REQUIRE(kill(Pids(driver.Out(), "pid-of-rank-1").at(0), SIGSTOP) == 0);
  auto killed_at = Clock::now();
  REQUIRE(kill(Pids(driver.Out(), "pid-of-rank-2").at(0), SIGKILL) == 0);
  CHECK(driver.Wait(milliseconds(10000)) == 137);
  CHECK(Clock::now() - killed_at < milliseconds(1500));  // the grace period is 3 s
  for (pid_t pid : pids) CHECK_FALSE(Alive(pid));
  INFO(driver.Err());
  CHECK(Count(driver.Err(), "stopped as a consequence: ranks 0-1 (ended: SIGTERM)") == 1);
}

TEST_CASE("SIGKILL to the launcher leaves no worker and no grandchild alive", "[launcher]") {
  // Each rank starts a background child that ignores SIGTERM, and one that left for a session of
  // its own (setsid), then waits.
  Driver driver({"-np", "2", "sh", "-c",
                 "echo worker $$; "
                 "sh -c 'trap \"\" TERM; echo grandchild $$; exec sleep 60' & "
                 "setsid sh -c 'echo escaped $$; exec sleep 60' & "
                 "wait"});
  REQUIRE(WaitUntil(
      [&] {
        std::string out = driver.Out();
        return Pids(out, "worker").size() == 2 && Pids(out, "grandchild").size() == 2 &&
               Pids(out, "escaped").size() == 2;
      },
      milliseconds(5000)));
  std::string out = driver.Out();
  std::vector<pid_t> pids;
  for (const char* word : {"worker", "grandchild", "escaped"}) {
    for (pid_t pid : Pids(out, word)) pids.push_back(pid);
  }
  for (pid_t pid : pids) REQUIRE(Alive(pid));
  REQUIRE(kill(driver.pid(), SIGKILL) == 0);
  CHECK(driver.Wait(milliseconds(2000)) == 137);
  bool all_gone = WaitUntil(
      [&] {
        for (pid_t pid : pids) {
          if (Alive(pid)) return false;
        }
        return true;
      },
      milliseconds(2000));
  for (pid_t pid : pids) {
    INFO("pid " << pid);
    CHECK_FALSE(Alive(pid));
    if (Alive(pid)) kill(pid, SIGKILL);
  }
  CHECK(all_gone);
}

TEST_CASE("a rank's leftover background process does not outlive the job", "[launcher]") {
  Driver driver(
      {"-np", "1", "sh", "-c", "sh -c 'trap \"\" TERM; echo bg $$; exec sleep 60' & sleep 0.1"});
  CHECK(driver.Wait() == 0);
  std::vector<pid_t> pids = Pids(driver.Out(), "bg");
  REQUIRE(pids.size() == 1);
  CHECK_FALSE(Alive(pids[0]));
}

TEST_CASE(
    "local ranks stay in the launcher's session (one scheduler autogroup), each in a process group "
    "of its own",
    "[launcher]") {
  // Fields 5 and 6 of /proc/PID/stat are the process group and the session.
  Driver driver({"-np", "2", "sh", "-c",
                 "set -- $(cut -d' ' -f5,6 /proc/$$/stat); "
                 "echo \"pid $$\"; echo \"group $1\"; echo \"session $2\""});
  REQUIRE(driver.Wait() == 0);
  const std::string out = driver.Out();
  INFO(out);
  std::vector<pid_t> pids = Pids(out, "pid");
  std::vector<pid_t> groups = Pids(out, "group");
  const std::vector<pid_t> sessions = Pids(out, "session");
  REQUIRE(pids.size() == 2);
  REQUIRE(sessions.size() == 2);
  // Ranks in sessions of their own would be task groups of their own, which cannot hand a shared
  // core to each other by yielding (rank_shim.cc).
  for (pid_t session : sessions) CHECK(session == getsid(0));
  // Out of the terminal's foreground group, as before: each rank leads a group of its own.
  std::sort(pids.begin(), pids.end());
  std::sort(groups.begin(), groups.end());
  CHECK(groups == pids);
  for (pid_t group : groups) CHECK(group != getpgrp());
}

TEST_CASE("a command that cannot be executed is reported once, exit 127", "[launcher]") {
  Driver missing({"-np", "3", "trainrun_no_such_command"});
  CHECK(missing.Wait() == 127);
  CHECK(Count(missing.Err(),
              "cannot execute 'trainrun_no_such_command': No such file or directory") == 1);
  CHECK(missing.Out().empty());

  // Found, but not a program (no #! line): every rank's exec fails; one "cannot execute".
  Driver bad({"-np", "3", "sh", "-c", "true"});  // placeholder to get a directory
  REQUIRE(bad.Wait() == 0);
  std::string path = bad.dir() + "/not_a_program";
  std::ofstream(path) << "\x7f\x01garbage";
  chmod(path.c_str(), 0755);
  Driver garbage({"-np", "3", path});
  CHECK(garbage.Wait() == 127);
  CHECK(Count(garbage.Err(), "cannot execute") == 1);
  CHECK(Count(garbage.Err(), "Exec format error") >= 1);
}

TEST_CASE("a rank shim that cannot be executed is reported, and nothing starts", "[launcher]") {
  // Missing: refused before any process is made, naming the shim and the variable.
  setenv("TRAINRUN_RANK_SHIM", "/nonexistent/trainrun-rank-shim", 1);
  Driver missing({"-np", "3", "sh", "-c", "echo started"});
  CHECK(missing.Wait() != 0);
  CHECK(Count(missing.Err(), "cannot execute the rank shim /nonexistent/trainrun-rank-shim") == 1);
  CHECK(Count(missing.Err(), "TRAINRUN_RANK_SHIM") == 1);
  CHECK(missing.Out().empty());

  // Executable but not a program: its execve fails in the clone, after trainrun went on; each
  // rank ends as not executed (127), reported once, and no command ran.
  std::string path = missing.dir() + "/not_a_shim";
  std::ofstream(path) << "\x7f\x01garbage";
  chmod(path.c_str(), 0755);
  setenv("TRAINRUN_RANK_SHIM", path.c_str(), 1);
  Driver garbage({"-np", "3", "sh", "-c", "echo started"});
  CHECK(garbage.Wait() == 127);
  CHECK(Count(garbage.Err(), "cannot execute") == 1);
  CHECK(Count(garbage.Err(), "Exec format error") >= 1);
  CHECK(garbage.Out().empty());
  unsetenv("TRAINRUN_RANK_SHIM");
}

TEST_CASE("stdin goes to rank 0 only", "[launcher]") {
  const std::vector<std::string> command = {"-np", "3", "sh", "-c",
                                            "while read line; do echo got:$line; done; echo eof"};
  Driver from_file(command, "file:alpha\nbeta\n");
  REQUIRE(from_file.Wait() == 0);
  std::string out = from_file.Out();
  CHECK(Count(out, "[0]<stdout>:got:alpha\n") == 1);
  CHECK(Count(out, "[0]<stdout>:got:beta\n") == 1);
  CHECK(Count(out, "got:") == 2);
  CHECK(Count(out, "<stdout>:eof\n") == 3);

  Driver from_pipe(command, "pipe");
  from_pipe.WriteStdin("gamma\n");
  REQUIRE(WaitUntil([&] { return Count(from_pipe.Out(), "got:gamma") == 1; }, milliseconds(5000)));
  from_pipe.CloseStdin();
  REQUIRE(from_pipe.Wait() == 0);
  CHECK(Count(from_pipe.Out(), "[0]<stdout>:got:gamma\n") == 1);
  CHECK(Count(from_pipe.Out(), "got:") == 1);
}

TEST_CASE("rank_info prints every variable", "[launcher]") {
  Driver driver({"-np", "2", TRAINRUN_RANK_INFO});
  REQUIRE(driver.Wait() == 0);
  std::string out = driver.Out();
  CHECK(Count(out, "[1]<stdout>:rank 1 of 2 on localhost (local_rank 1 of 2, cross_rank 0 of 1)") ==
        1);
  CHECK(Count(out, "MASTER_PORT=") == 2);
  CHECK(Count(out, "(64 hex digits, not shown)") == 2);
}

// LiveOutput runs `worker` (which prints "step 1", sleeps 4 s, prints "step 2") and returns
// whether "step 1" reached the launcher's stdout while the worker still slept.
bool StepOneArrivesDuringSleep(std::vector<std::string> args, std::string* out) {
  unsetenv("PYTHONUNBUFFERED");
  Driver driver(std::move(args));
  bool live = WaitUntil([&] { return driver.Out().find("step 1") != std::string::npos; },
                        milliseconds(3000));
  bool still_sleeping = driver.Out().find("step 2") == std::string::npos;
  CHECK(driver.Wait() == 0);
  *out = driver.Out();
  return live && still_sleeping;
}

TEST_CASE("a rank's stdout is live: Python print and C printf arrive before the sleep ends",
          "[launcher][live]") {
  std::string out;
  // Python with PYTHONUNBUFFERED unset in trainrun's environment: trainrun sets it, and stdout is
  // a terminal anyway.
  CHECK(StepOneArrivesDuringSleep(
      {"-np", "1", "/usr/bin/python3", "-c",
       "import os, sys, time\nprint('step 1', os.environ.get('PYTHONUNBUFFERED'), "
       "sys.stdout.isatty())\ntime.sleep(4)\nprint('step 2')"},
      &out));
  CHECK(out == "[0]<stdout>:step 1 1 True\n[0]<stdout>:step 2\n");
  // Python with PYTHONUNBUFFERED removed again in the worker: the pty alone makes it line by line.
  CHECK(StepOneArrivesDuringSleep(
      {"-np", "1", "env", "-u", "PYTHONUNBUFFERED", "/usr/bin/python3", "-c",
       "import time\nprint('step 1')\ntime.sleep(4)\nprint('step 2')"},
      &out));
  // C stdio without fflush.
  CHECK(StepOneArrivesDuringSleep({"-np", "2", TRAINRUN_PRINT_THEN_SLEEP, "4"}, &out));
  CHECK(Count(out, "<stdout>:step 1 isatty=1\n") == 2);
  CHECK(Count(out, "<stdout>:step 2\n") == 2);
}

TEST_CASE("with --no-pty a rank gets a pipe: C stdio then holds its lines until exit",
          "[launcher][live]") {
  std::string out;
  CHECK_FALSE(
      StepOneArrivesDuringSleep({"--no-pty", "-np", "1", TRAINRUN_PRINT_THEN_SLEEP, "4"}, &out));
  CHECK(out == "[0]<stdout>:step 1 isatty=0\n[0]<stdout>:step 2\n");
}

TEST_CASE("a pty changes no byte: LF stays LF, no echo of stdin, stdout closed early",
          "[launcher][live]") {
  // Rank 0's stdin is trainrun's: what it reads is not echoed into its output. --quiet: no start
  // line on stderr, only the rank's bytes.
  Driver driver({"--quiet", "-np", "1", "sh", "-c",
                 "read line; printf 'got %s\\n\\001\\n' \"$line\"; "
                 "exec 1>&-; sleep 0.3; echo after >&2"},
                "file:hello\n");
  REQUIRE(driver.Wait() == 0);
  CHECK(driver.Out() == "[0]<stdout>:got hello\n[0]<stdout>:\001\n");
  CHECK(driver.Err() == "[0]<stderr>:after\n");
}
