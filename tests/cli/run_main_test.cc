// The whole command in-process: bad input is one `trainrun: error:` line, exit 2, nothing
// launched; --dry-run prints the plan; the launcher's result becomes the exit code.
#include "trainrun/cli/run_main.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "trainrun/launcher/job_environment.h"

namespace trainrun::cli {
namespace {

using Words = std::vector<std::string>;

// Runs RunMain with a fake launcher and environment, capturing trainrun's log and output.
class TrainrunFixture {
 protected:
  TrainrunFixture() : previous_logger_(spdlog::default_logger()) {
    InstallLogger(std::make_shared<spdlog::sinks::ostream_sink_mt>(log_));
    spdlog::set_level(spdlog::level::info);
  }
  ~TrainrunFixture() {
    spdlog::set_default_logger(previous_logger_);
    spdlog::set_level(spdlog::level::info);
    for (const std::string& file : files_) ::unlink(file.c_str());
  }

  int Run(const Words& args) {
    log_.str("");
    out_.str("");
    launches_.clear();
    auto launch = [this](const launcher::LaunchSpec& spec) -> absl::StatusOr<int> {
      launches_.push_back(spec);
      return launch_result_;
    };
    auto env = [this](const std::string& name) -> std::optional<std::string> {
      auto it = env_.find(name);
      if (it == env_.end()) return std::nullopt;
      return it->second;
    };
    return RunMain(args, launch, env, out_);
  }

  // The lines trainrun logged.
  std::vector<std::string> LogLines() const {
    return absl::StrSplit(log_.str(), '\n', absl::SkipEmpty());
  }

  // Writes `text` to a file named after `name` and this process (the same path on every run of
  // a generated test case), removed with the fixture; returns its path.
  std::string TempFile(const std::string& name, const std::string& text) {
    std::string path = "/tmp/trainrun_cli_test." + std::to_string(::getpid()) + "." + name;
    std::ofstream(path) << text;
    files_.emplace_back(path);
    return path;
  }

  std::map<std::string, std::string> env_;
  absl::StatusOr<int> launch_result_ = 0;
  std::vector<launcher::LaunchSpec> launches_;
  std::ostringstream out_;
  std::ostringstream log_;

 private:
  std::shared_ptr<spdlog::logger> previous_logger_;
  std::vector<std::string> files_;  // removed by the destructor
};

TEST_CASE_METHOD(TrainrunFixture, "bad input: one error line, exit 2, nothing started",
                 "[cli][bad-input]") {
  std::string bad_hostfile = TempFile("hosts", "# hosts\na slots=2\nb slots=two\n");
  struct Case {
    Words args;
    std::string message;  // the whole line after "trainrun: error: ", or its start
  };
  auto c = GENERATE_COPY(values<Case>({
      {{"-H", "h:", "python"}, "-H: host 'h' has an empty slot count"},
      {{"-H", "h:-1", "python"}, "-H: slot count '-1' for host 'h' is not a positive whole number"},
      {{"-H", "h:abc", "python"}, "-H: slot count 'abc' for host 'h' is not a positive whole"},
      {{"-H", ":3", "python"}, "-H: entry ':3' has no host name"},
      {{"-H", "", "python"}, "-H: the host list is empty"},
      {{"-H", "a:2, b:2", "python"}, "-H: the host list 'a:2, b:2' contains whitespace"},
      {{"-H", "a:0", "python"}, "-H: host 'a' has 0 slots; give it at least 1"},
      {{"-H", "a:100000", "python"},
       "-H: host 'a' asks for 100000 slots; one host may have at "
       "most 4096"},
      {{"-np", "5000", "python"}, "-np 5000 is more than the 4096 ranks one host may run"},
      {{"--hostfile", "/nonexistent/hosts", "python"},
       "hostfile '/nonexistent/hosts' does not exist"},
      {{"--hostfile", "/", "python"}, "hostfile '/' is a directory, not a file"},
      {{"--hostfile", bad_hostfile, "python"},
       bad_hostfile + ":3: slot count 'two' for host 'b' is not a positive whole number"},
      {{"-np", "0", "python"}, "-np must be at least 1, not 0"},
      {{"-np", "0", "-H", "a:2", "python"}, "-np must be at least 1, not 0"},
      {{"-np", "8", "-H", "a:2,b:2", "python"},
       "-np 8 asks for more processes than the 4 slots on 2 hosts"},
      {{"-np", "4"}, "no command to run"},
      {{}, "no command to run"},
      {{"-np", "2", "-x", "1BAD=2", "python"}, "-x 1BAD=2: '1BAD' is not a valid variable name"},
      {{"-np", "2", "-x", "A-B", "python"}, "-x A-B: 'A-B' is not a valid variable name"},
      {{"-np", "2", "-x", "=v", "python"}, "-x =v: '' is not a valid variable name"},
      {{"-H", "a", "--hostfile", bad_hostfile, "x"}, "give either -H or --hostfile, not both"},
      {{"python", "train.py"}, "give -np (ranks on this host) or hosts"},
      {{"--bogus", "-np", "2", "python"}, "unknown flag '--bogus'"},
      {{"-np", "two", "python"}, "Could not convert: --num-proc = two"},
      {{"-np2", "python"}, "'-np2': write -np 2 (the number after a space)"},
      {{"-H", "a:1", "-np4", "python"}, "'-np4': write -np 4"},
      {{"-npernode", "1", "python"}, "-npernode is mpirun's; give each host's ranks as -H"},
      {{"--mpi", "-np", "2", "python"}, "--mpi: trainrun needs no MPI or jsrun"},
      {{"--jsrun", "-np", "2", "python"}, "--jsrun: trainrun needs no MPI or jsrun"},
      {{"--mpi-args=-mca x", "-np", "2", "python"}, "--mpi-args: trainrun needs no MPI"},
      {{"--stall-check-shutdown-time-seconds", "5", "--stall-check-warning-time-seconds", "10",
        "-np", "2", "python"},
       "--stall-check-shutdown-time-seconds 5 is less than the warning time 10"},
      {{"-np", "2", "--min-np", "3", "python"},
       "--min-np 3 is more than the job's 2 ranks; give at most -np"},
      {{"-np", "4", "--min-np", "2", "--max-np", "3", "python"},
       "--max-np 3 is less than the job's 4 ranks; give at least -np"},
      {{"-np", "4", "--max-np", "8", "python"},
       "--max-np is for elastic jobs, which --min-np makes; add --min-np N"},
      {{"-np", "4", "--elastic-timeout", "8", "python"},
       "--elastic-timeout is for elastic jobs, which --min-np makes"},
      {{"-np", "4", "--min-np", "2", "--max-restarts", "1", "python"},
       "--max-restarts and --min-np are two ways to survive a failure"},
  }));
  CAPTURE(c.args);
  CHECK(Run(c.args) == 2);
  CHECK(launches_.empty());
  CHECK(out_.str().empty());
  std::vector<std::string> lines = LogLines();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("trainrun: error: " + c.message));
}

TEST_CASE_METHOD(TrainrunFixture, "dry run prints the plan and starts nothing", "[cli]") {
  CHECK(Run({"--dry-run", "-H", "a:2,ubuntu@bb:1", "-x", "A=1 2", "-x", "HOME", "python",
             "train.py", "--name", "it's"}) == 0);
  CHECK(launches_.empty());
  CHECK_THAT(out_.str(),
             Catch::StartsWith(
                 "trainrun: dry run: 3 ranks on 2 hosts; nothing is started\n"
                 "HOST       RANK  LOCAL_RANK  CROSS_RANK  COMMAND\n"
                 "a          0     0           0           python train.py --name 'it'\\''s'\n"
                 "a          1     1           0           python train.py --name 'it'\\''s'\n"
                 "ubuntu@bb  2     0           1           python train.py --name 'it'\\''s'\n"
                 "export A='1 2'\n"
                 "export HOME (from trainrun's environment)\n"
                 "hosts:\n"
                 "  a: ssh "));
  // How each host is reached (the keys and paths depend on the machine).
  CHECK_THAT(out_.str(), Catch::Contains("\n  ubuntu@bb: ssh ubuntu@bb port 22 (libssh2"));
  CHECK_THAT(out_.str(), Catch::Contains(" --agent\n"));
}

TEST_CASE_METHOD(TrainrunFixture, "an -np below the slot total uses the first slots", "[cli]") {
  CHECK(Run({"--dry-run", "-np", "3", "-H", "a:2,b:2,c:2", "x"}) == 0);
  CHECK_THAT(out_.str(), Catch::StartsWith("trainrun: dry run: 3 ranks on 2 hosts"));
  CHECK_THAT(out_.str(), Catch::Contains("b     2     0           1           x\n"));
}

TEST_CASE_METHOD(TrainrunFixture, "a Slurm allocation gives the hosts", "[cli][slurm]") {
  env_["SLURM_JOB_NODELIST"] = "node[01-02],gpu5";
  env_["SLURM_TASKS_PER_NODE"] = "2(x2),1";
  SECTION("without -H") {
    CHECK(Run({"python", "t.py"}) == 0);
    REQUIRE(launches_.size() == 1);
    const hostfile::SlotPlan& plan = launches_[0].plan;
    REQUIRE(plan.size() == 5);
    CHECK(plan.HostOf(0).host == "node01");
    CHECK(plan.HostOf(3).host == "node02");
    CHECK(plan.HostOf(4).host == "gpu5");
    CHECK(plan.ranks[4].cross_rank == 2);
  }
  SECTION("-H wins over the allocation") {
    CHECK(Run({"-H", "a:1", "python"}) == 0);
    REQUIRE(launches_.size() == 1);
    CHECK(launches_[0].plan.HostOf(0).host == "a");
  }
  SECTION("errors say where the hosts came from") {
    CHECK(Run({"-np", "6", "python"}) == 2);
    REQUIRE(LogLines().size() == 1);
    CHECK(LogLines()[0] ==
          "trainrun: error: in this Slurm allocation (SLURM_JOB_NODELIST=node[01-02],gpu5): -np 6 "
          "asks for more processes than the 5 slots on 3 hosts; lower -np or add slots (host:N)");
  }
  SECTION("GPUs per node and one task each: one rank per GPU") {
    env_["SLURM_TASKS_PER_NODE"] = "1(x3)";
    env_["SLURM_GPUS_ON_NODE"] = "4";
    CHECK(Run({"python"}) == 0);
    REQUIRE(launches_.size() == 1);
    const hostfile::SlotPlan& plan = launches_[0].plan;
    REQUIRE(plan.size() == 12);
    CHECK(plan.HostOf(3).host == "node01");
    CHECK(plan.HostOf(4).host == "node02");
    CHECK(plan.ranks[11].local_rank == 3);
  }
  SECTION("GPUs per node with tasks the user asked for: the tasks count") {
    env_["SLURM_GPUS_ON_NODE"] = "4";
    CHECK(Run({"python"}) == 0);
    REQUIRE(launches_.size() == 1);
    CHECK(launches_[0].plan.size() == 5);
    env_["SLURM_TASKS_PER_NODE"] = "1(x3)";
    env_["SLURM_NTASKS_PER_NODE"] = "1";
    CHECK(Run({"python"}) == 0);
    REQUIRE(!launches_.empty());
    CHECK(launches_.back().plan.size() == 3);
  }
  SECTION("a GPU count that is not one") {
    env_["SLURM_GPUS_ON_NODE"] = "4x";
    CHECK(Run({"python"}) == 2);
    REQUIRE(LogLines().size() == 1);
    CHECK(LogLines()[0] ==
          "trainrun: error: in this Slurm allocation: SLURM_GPUS_ON_NODE='4x' is "
          "not a GPU count from 0 to " +
              std::to_string(hostfile::kMaxSlotsPerHost));
  }
  SECTION("a malformed node list") {
    env_["SLURM_JOB_NODELIST"] = "node[01-02";
    CHECK(Run({"python"}) == 2);
    CHECK_THAT(log_.str(), Catch::Contains("SLURM_JOB_NODELIST"));
  }
}

TEST_CASE_METHOD(TrainrunFixture, "the spec carries every flag to the launcher", "[cli]") {
  launch_result_ = 3;
  CHECK(Run({"-np",
             "2",
             "-x",
             "A",
             "-x",
             "B=",
             "--output-filename",
             "out",
             "--no-tag-output",
             "--prefix-timestamp",
             "--start-timeout",
             "7",
             "--verbose",
             "--network-interface",
             "lo",
             "-p",
             "2200",
             "-i",
             "/dev/null",
             "python",
             "t.py",
             "--lr",
             "0.1"}) == 3);
  REQUIRE(launches_.size() == 1);
  const launcher::LaunchSpec& spec = launches_[0];
  CHECK(spec.plan.size() == 2);
  CHECK(spec.plan.HostOf(1).host == "localhost");
  CHECK(spec.plan.ranks[1].local_rank == 1);
  CHECK(spec.command == Words{"python", "t.py", "--lr", "0.1"});
  REQUIRE(spec.exported.size() == 2);
  CHECK(spec.exported[0].name == "A");
  CHECK_FALSE(spec.exported[0].value.has_value());
  CHECK(spec.exported[1].value == "");
  CHECK(spec.output_dir == "out");
  CHECK_FALSE(spec.tag_output);
  CHECK(spec.prefix_timestamp);
  CHECK(spec.start_timeout == std::chrono::seconds(7));
  CHECK(spec.verbose);
  CHECK(spec.network_interfaces == Words{"lo"});
  CHECK(spec.ssh_port == 2200);
  CHECK(spec.ssh_identity_file == "/dev/null");
  CHECK_FALSE(spec.dry_run);
}

TEST_CASE_METHOD(
    TrainrunFixture,
    "elastic flags: --min-np (with --max-np and --elastic-timeout) makes an elastic job",
    "[cli][elastic]") {
  CHECK(Run({"-np", "4", "python"}) == 0);
  REQUIRE(launches_.size() == 1);
  CHECK_FALSE(launches_[0].elastic.has_value());
  CHECK(Run({"-np", "4", "--min-np", "2", "python"}) == 0);
  REQUIRE(launches_.size() == 1);
  REQUIRE(launches_[0].elastic.has_value());
  CHECK(launches_[0].elastic->min_np == 2);
  CHECK(launches_[0].elastic->max_np == 4);
  CHECK(launches_[0].elastic->timeout == std::chrono::seconds(600));
  CHECK(Run({"-np", "4", "--min_np", "3", "--max-np", "6", "--elastic-timeout", "5", "python"}) ==
        0);
  REQUIRE(launches_.size() == 1);
  CHECK(launches_[0].elastic->min_np == 3);
  CHECK(launches_[0].elastic->max_np == 6);
  CHECK(launches_[0].elastic->timeout == std::chrono::seconds(5));
}

TEST_CASE_METHOD(TrainrunFixture,
                 "elastic flags: --host-discovery-script plans the job from its output",
                 "[cli][elastic]") {
  CHECK(Run({"--min-np", "1", "--host-discovery-script", "printf 'localhost:2\\n127.0.0.1\\n'",
             "--slots-per-host", "3", "--reset-limit", "4", "python"}) == 0);
  REQUIRE(launches_.size() == 1);
  REQUIRE(launches_[0].elastic.has_value());
  CHECK(launches_[0].plan.size() == 5);  // every discovered slot
  CHECK(launches_[0].plan.hosts[1].host == "127.0.0.1");
  CHECK(launches_[0].plan.hosts[1].slots == 3);
  CHECK(launches_[0].elastic->slots_per_host == 3);
  CHECK(launches_[0].elastic->reset_limit == 4);
  CHECK(launches_[0].elastic->discovery_script == "printf 'localhost:2\\n127.0.0.1\\n'");
  CHECK(Run({"--min-np", "1", "--max-np", "2", "--host-discovery-script", "echo localhost:8",
             "python"}) == 0);
  REQUIRE(launches_.size() == 1);
  CHECK(launches_[0].plan.size() == 2);  // up to --max-np
  auto error = [this](const Words& args) {
    const int code = Run(args);
    const std::vector<std::string> lines = LogLines();
    return std::make_pair(code, lines.size() == 1 ? lines[0] : log_.str());
  };
  CHECK(error({"--host-discovery-script", "echo localhost", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: --host-discovery-script is for elastic "
                                      "jobs, which --min-np makes; add --min-np N (the fewest "
                                      "ranks the job may go on with)")));
  CHECK(error({"--min-np", "1", "-H", "a", "--host-discovery-script", "echo a", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: give either --host-discovery-script or "
                                      "-H, not both: the script's output is the job's host "
                                      "list")));
  CHECK(error({"--min-np", "1", "--host-discovery-script", "echo 'a b'", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: the host discovery script 'echo 'a b'' "
                                      "printed \"a b\" on line 1: host name 'a b' contains the "
                                      "character ' ', which is not allowed there; each line "
                                      "must be host or host:slots")));
  CHECK(error({"-np", "2", "--reset-limit", "1", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: --reset-limit is for elastic jobs, which "
                                      "--min-np makes; add --min-np N (the fewest ranks the job "
                                      "may go on with)")));
}

TEST_CASE_METHOD(TrainrunFixture,
                 "elastic flags: --blacklist-cooldown-range MIN MAX, and each bad one named",
                 "[cli][elastic]") {
  CHECK(Run({"--min-np", "1", "--max-np", "4", "--host-discovery-script", "echo localhost:2",
             "--blacklist-cooldown-range", "10", "300", "python"}) == 0);
  REQUIRE(launches_.size() == 1);
  REQUIRE(launches_[0].elastic->blacklist_cooldown.has_value());
  CHECK(launches_[0].elastic->blacklist_cooldown->first == std::chrono::seconds(10));
  CHECK(launches_[0].elastic->blacklist_cooldown->second == std::chrono::seconds(300));
  CHECK(launches_[0].elastic->max_np == 4);
  CHECK(Run({"--min-np", "1", "--host-discovery-script", "echo localhost:2", "python"}) == 0);
  CHECK_FALSE(launches_[0].elastic->blacklist_cooldown.has_value());  // forever
  auto error = [this](const Words& args) {
    const int code = Run(args);
    const std::vector<std::string> lines = LogLines();
    return std::make_pair(code, lines.size() == 1 ? lines[0] : log_.str());
  };
  const Words discovery = {"--min-np", "1", "--host-discovery-script", "echo localhost:2"};
  auto with = [&](Words flags) {
    Words args = discovery;
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("python");
    return args;
  };
  CHECK(error(with({"--blacklist-cooldown-range", "30", "10"})) ==
        std::make_pair(2, std::string("trainrun: error: --blacklist-cooldown-range 30 10: MIN 30 "
                                      "is more than MAX 10; give the shorter cooldown first")));
  CHECK(error(with({"--blacklist-cooldown-range", "0", "10"})) ==
        std::make_pair(2, std::string("trainrun: error: --blacklist-cooldown-range 0 10: MIN 0 "
                                      "is below 1 s; a failing host needs some cooldown")));
  CHECK(error(with({"--blacklist-cooldown-range", "1", "9999999"})) ==
        std::make_pair(2, std::string("trainrun: error: --blacklist-cooldown-range 1 9999999: "
                                      "MAX 9999999 is above a week (604800 s)")));
  CHECK(error({"--min-np", "1", "-np", "2", "--blacklist-cooldown-range", "1", "2", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: --blacklist-cooldown-range is for jobs "
                                      "with --host-discovery-script: a blacklisted host is one "
                                      "the script may list again")));
  CHECK(error({"-np", "2", "--blacklist-cooldown-range", "1", "2", "python"}) ==
        std::make_pair(2, std::string("trainrun: error: --blacklist-cooldown-range is for elastic "
                                      "jobs, which --min-np makes; add --min-np N (the fewest "
                                      "ranks the job may go on with)")));
  const int code = Run(with({"--blacklist-cooldown-range", "5"}));
  CHECK(code == 2);
  CHECK(log_.str().find("--blacklist-cooldown-range") != std::string::npos);
}

TEST_CASE_METHOD(TrainrunFixture, "launcher errors are reported once and mapped", "[cli]") {
  launch_result_ = absl::NotFoundError("cannot execute 'foo': No such file or directory");
  CHECK(Run({"-np", "4", "foo"}) == 127);
  CHECK(LogLines() == std::vector<std::string>{
                          "trainrun: error: cannot execute 'foo': No such file or directory"});
}

TEST_CASE_METHOD(TrainrunFixture, "help and version print and exit 0", "[cli]") {
  CHECK(Run({"--help"}) == 0);
  CHECK_THAT(out_.str(), Catch::Contains("trainrun -np 4 python train.py"));
  CHECK_THAT(out_.str(), Catch::Contains("--num-proc"));
  CHECK_THAT(out_.str(), Catch::Contains("--ssh-identity-file"));
  CHECK(Run({"--version"}) == 0);
  CHECK_THAT(out_.str(), Catch::StartsWith("trainrun "));
  CHECK(launches_.empty());
}

TEST_CASE("ExitCodeFor is the one mapping from errors to exit codes", "[cli]") {
  CHECK(ExitCodeFor(absl::OkStatus()) == 0);
  CHECK(ExitCodeFor(absl::InvalidArgumentError("x")) == 2);
  CHECK(ExitCodeFor(absl::NotFoundError("x")) == 127);
  CHECK(ExitCodeFor(absl::PermissionDeniedError("x")) == 126);
  CHECK(ExitCodeFor(absl::DeadlineExceededError("x")) == 124);
  CHECK(ExitCodeFor(absl::InternalError("x")) == 1);
  CHECK(ExitCodeFor(absl::UnavailableError("x")) == 1);
}

TEST_CASE_METHOD(TrainrunFixture, "the first hour's flags reach the spec", "[cli][compat]") {
  // Defaults: a pty for stdout, CUDA_VISIBLE_DEVICES left alone, a 60 s stall warning.
  REQUIRE(Run({"-np", "2", "python", "t.py"}) == 0);
  CHECK(launches_[0].stdout_pty);
  CHECK_FALSE(launches_[0].assign_gpus);
  CHECK(launches_[0].stall_warning == std::chrono::seconds(60));
  CHECK(launches_[0].stall_shutdown == std::chrono::seconds(0));
  CHECK(launches_[0].exported.empty());
  CHECK(LogLines().empty());

  REQUIRE(Run({"--no-pty", "--assign-gpus", "--stall-check-warning-time-seconds", "5",
               "--stall-check-shutdown-time-seconds", "9", "--timestamp-output", "--tcp",
               "--fusion-threshold-mb", "64", "-np", "2", "python", "t.py"}) == 0);
  const launcher::LaunchSpec& spec = launches_[0];
  CHECK_FALSE(spec.stdout_pty);
  CHECK(spec.assign_gpus);
  CHECK(spec.prefix_timestamp);
  CHECK(spec.stall_warning == std::chrono::seconds(5));
  CHECK(spec.stall_shutdown == std::chrono::seconds(9));
  // --tcp and --fusion-threshold-mb are typed; only JobEnvironment makes them variables.
  CHECK(spec.exported.empty());
  CHECK(spec.tcp);
  CHECK(spec.fusion_threshold_bytes == std::optional<int64_t>(int64_t{64} << 20));
  const std::vector<launcher::ExportedVariable> told =
      launcher::JobEnvironment::SpecVariables(spec);
  REQUIRE(told.size() == 2);
  CHECK(told[0].name == "TRAINRUN_FUSION_BYTES");
  CHECK(told[0].value == std::to_string(64 << 20));
  CHECK(told[1].name == "TRAINRUN_TRANSPORT");
  CHECK(told[1].value == "tcp");

  // The variables, when no flag is given; --no-stall-check turns the warning off.
  env_["TRAINRUN_STALL_CHECK_TIME_SECONDS"] = "7";
  env_["TRAINRUN_ASSIGN_GPUS"] = "1";
  REQUIRE(Run({"-np", "2", "python", "t.py"}) == 0);
  CHECK(launches_[0].stall_warning == std::chrono::seconds(7));
  REQUIRE(Run({"--no-stall-check", "-np", "2", "python", "t.py"}) == 0);
  CHECK(launches_[0].stall_warning == std::chrono::seconds(0));

  // horovodrun's knobs trainrun has no use for: accepted, one line each saying why.
  REQUIRE(Run({"--cycle-time-ms", "5", "--cache-capacity", "1024", "--disable-cache",
               "--hierarchical-allreduce", "--hierarchical-allgather", "--log-hide-timestamp",
               "-np", "2", "python", "t.py"}) == 0);
  std::vector<std::string> lines = LogLines();
  REQUIRE(lines.size() == 6);
  for (const std::string& line : lines) {
    CHECK_THAT(line, Catch::Contains("is accepted for horovodrun compatibility and changes "
                                     "nothing: trainrun"));
  }
  CHECK(launches_[0].command == Words{"python", "t.py"});
}

}  // namespace
}  // namespace trainrun::cli
