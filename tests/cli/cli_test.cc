// Argument vectors through CLI11, as CLI11's own tests do: a fixture owns the App and the options.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "trainrun/cli/config_file.h"
#include "trainrun/cli/make_launch_spec.h"
#include "trainrun/cli/run_options.h"

namespace trainrun::cli {
namespace {

using Words = std::vector<std::string>;

class TApp {
 protected:
  TApp() { SetupRunOptions(app, options); }

  absl::StatusOr<ParseOutcome> Parse(const Words& args) { return ParseRunArgs(app, args, options); }

  // Parses `args` and requires success.
  void Run(const Words& args) {
    auto outcome = Parse(args);
    INFO((outcome.ok() ? "" : std::string(outcome.status().message())));
    REQUIRE(outcome.ok());
    REQUIRE(*outcome == ParseOutcome::kRun);
  }

  CLI::App app;
  RunOptions options;
};

TEST_CASE_METHOD(TApp, "trainrun's -np and the worker's own flags are kept apart", "[cli]") {
  Run({"-np", "4", "python", "train.py", "--lr", "0.1"});
  CHECK(options.num_proc == 4);
  CHECK(options.command == Words{"python", "train.py", "--lr", "0.1"});
}

TEST_CASE_METHOD(TApp, "the worker's -np and -x are not trainrun's", "[cli]") {
  Run({"-np", "2", "-x", "A", "mpirun", "-np", "3", "-x", "B", "prog"});
  CHECK(options.num_proc == 2);
  CHECK(options.exports == Words{"A"});
  CHECK(options.command == Words{"mpirun", "-np", "3", "-x", "B", "prog"});
}

TEST_CASE_METHOD(TApp, "a double dash ends trainrun's flags", "[cli]") {
  Run({"--num-proc", "2", "-H", "a:2", "--", "python", "-x", "--verbose"});
  CHECK(options.num_proc == 2);
  CHECK(options.hosts == "a:2");
  CHECK_FALSE(options.verbose);
  CHECK(options.command == Words{"python", "-x", "--verbose"});
}

TEST_CASE_METHOD(TApp, "a command that starts with a dash needs --", "[cli]") {
  Run({"-np", "1", "--", "-weird-program"});
  CHECK(options.command == Words{"-weird-program"});
}

TEST_CASE_METHOD(TApp, "repeated -x keeps each value whole", "[cli]") {
  Run({"-x", "A", "-x", "B=1", "-x", "C=", "-x", "D=x=y", "-np", "1", "env"});
  CHECK(options.exports == Words{"A", "B=1", "C=", "D=x=y"});
  CHECK(options.command == Words{"env"});
}

TEST_CASE_METHOD(TApp, "horovodrun's and mpirun's spellings work", "[cli]") {
  SECTION("single-dash long flags") {
    Run({"-np=3", "-hostfile", "hosts.txt", "-prefix-timestamp", "true"});
    CHECK(options.num_proc == 3);
    CHECK(options.hostfile == "hosts.txt");
    CHECK(options.prefix_timestamp);
    CHECK(options.command == Words{"true"});
  }
  SECTION("horovodrun's long names") {
    Run({"--num-proc", "8", "--hosts", "a:4,b:4", "--start-timeout", "90", "--output-filename",
         "logs", "--verbose", "--prefix-output-with-timestamp", "--gloo", "python", "t.py"});
    CHECK(options.num_proc == 8);
    CHECK(options.hosts == "a:4,b:4");
    CHECK(options.start_timeout_s == 90);
    CHECK(options.output_filename == "logs");
    CHECK(options.verbose);
    CHECK(options.prefix_timestamp);
  }
  SECTION("networking and ssh") {
    Run({"--network-interface", "eth0", "--network-interface", "ib0,ib1", "--network-interfaces",
         "eth9", "-p", "2222", "-i", "/dev/null", "x"});
    CHECK(options.network_interfaces == Words{"eth0", "ib0", "ib1", "eth9"});
    CHECK(options.ssh_port == 2222);
    CHECK(options.ssh_identity_file == "/dev/null");
  }
  SECTION("tagging and logging") {
    Run({"-n", "2", "--no-tag-output", "--log-level", "DEBUG", "--dry-run", "x"});
    CHECK(options.num_proc == 2);
    CHECK_FALSE(options.tag_output);
    CHECK(options.log_level == "debug");
    CHECK(options.dry_run);
  }
  SECTION("defaults") {
    Run({"x"});
    CHECK_FALSE(options.num_proc);
    CHECK(options.tag_output);
    CHECK_FALSE(options.prefix_timestamp);
    CHECK(options.start_timeout_s == 30);
    CHECK_FALSE(options.dry_run);
  }
}

TEST_CASE_METHOD(TApp, "help and version are outcomes, not errors", "[cli]") {
  CHECK(*Parse({"--help"}) == ParseOutcome::kHelp);
  CHECK(*Parse({"-h"}) == ParseOutcome::kHelp);
  CHECK(*Parse({"--version"}) == ParseOutcome::kVersion);
  CHECK(*Parse({"-v"}) == ParseOutcome::kVersion);
}

TEST_CASE_METHOD(TApp, "flag errors are one sentence naming the flag", "[cli]") {
  struct Case {
    Words args;
    std::string message_part;
  };
  auto c = GENERATE(values<Case>({
      {{}, "no command to run"},
      {{"-np", "4"}, "no command to run"},
      {{"-np", "4", "--"}, "no command to run"},
      {{"--bogus", "python"}, "unknown flag '--bogus'"},
      {{"-np", "abc", "python"}, "--num-proc"},
      {{"-np"}, "--num-proc"},
      {{"--start-timeout", "0", "x"}, "--start-timeout"},
      {{"-p", "70000", "x"}, "--ssh-port"},
      {{"-i", "/nonexistent/key", "x"}, "/nonexistent/key"},
      {{"--log-level", "chatty", "x"}, "chatty"},
  }));
  CAPTURE(c.args);
  auto outcome = Parse(c.args);
  REQUIRE_FALSE(outcome.ok());
  CHECK(outcome.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(outcome.status().message()), Catch::Contains(c.message_part));
  CHECK(std::string(outcome.status().message()).find('\n') == std::string::npos);
}

}  // namespace
}  // namespace trainrun::cli

namespace trainrun::cli {
namespace {

using Flags = std::vector<std::vector<std::string>>;

TEST_CASE("config file: the YAML subset, hosts with processes_per_host, lists", "[cli][config]") {
  auto config = ParseConfigFile(
      "---\n"
      "hosts: [a, 'b:8', \"[::1]\", user@c]   # flow list\n"
      "processes_per_host: 2\n"
      "environment:\n"
      "  A: '1 # not a comment'\n"
      "command:\n"
      "  - python3\n"
      "  - train.py\n"
      "timeline:\n"
      "  mark_cycles: false\n"
      "logging:\n"
      "  level: INFO\n",
      "job.yaml");
  INFO((config.ok() ? "" : std::string(config.status().message())));
  REQUIRE(config.ok());
  CHECK(config->flags == Flags{{"-x", "A=1 # not a comment"},
                               {"--log-level", "info"},
                               {"--hosts", "a:2,b:8,[::1]:2,user@c:2"}});
  CHECK(config->command == Words{"python3", "train.py"});
  CHECK(config->notes.empty());
}

TEST_CASE("config file: YAML outside the subset is one sentence with the line", "[cli][config]") {
  CHECK(ParseConfigFile("params:\n\tcycle_time_ms: 1\n", "f.yaml").status().message() ==
        "f.yaml line 2: indent with spaces, not tabs");
  CHECK(ParseConfigFile("hosts: a\n  - b\n", "f.yaml").status().message() ==
        "f.yaml line 2: a list item with no key above it");
  CHECK(ParseConfigFile("# hosts\nx y\n", "f.yaml").status().message() ==
        "f.yaml line 2: 'x y' is not `key: value`");
  CHECK(ParseConfigFile("processes_per_host: 2\n", "f.yaml").status().message() ==
        "f.yaml line 1: processes_per_host needs hosts: in the same file");
}

TEST_CASE("config file: any YAML: anchors, merge keys, flow lists and mappings, quoting, comments",
          "[cli][config]") {
  auto config = ParseConfigFile(
      "--- # a job file written with what YAML allows\n"
      "hosts: &hosts [a, \"b:8\"]     # a flow list, an anchor\n"
      "processes_per_host: &n 2\n"
      "environment: {NAME: \"x # not a comment\", QUOTE: 'it''s', TAB: \"a\\tb\", PLAIN: a b}\n"
      "params:\n"
      "  <<: &tuned {cycle_time_ms: 5, cache_capacity: 10}   # a merge key\n"
      "  cache_capacity: 20         # overrides the merged one\n"
      "\n"
      "stall_check:\n"
      "  # a comment line inside a section\n"
      "  warning_time_seconds: *n   # an alias\n"
      "logging: {level: \"DEBUG\"}\n"
      "command: [python3, 'train.py', \"--lr\", 0.1]\n",
      "job.yaml");
  INFO((config.ok() ? "" : std::string(config.status().message())));
  REQUIRE(config.ok());
  CHECK(config->flags == Flags{{"-x", "NAME=x # not a comment"},
                               {"-x", "QUOTE=it's"},
                               {"-x", "TAB=a\tb"},
                               {"-x", "PLAIN=a b"},
                               {"--cycle-time-ms", "5"},
                               {"--cache-capacity", "20"},
                               {"--stall-check-warning-time-seconds", "2"},
                               {"--log-level", "debug"},
                               {"--hosts", "a:2,b:8"}});
  CHECK(config->command == Words{"python3", "train.py", "--lr", "0.1"});

  // A merge key at the top, a block scalar for the command, a list of hosts under an alias.
  auto merged = ParseConfigFile(
      "<<: &job {num_proc: 4, command: echo no}\n"
      "num_proc: 3\n"
      "command: >\n"
      "  sh -c\n"
      "  'echo $RANK'\n",
      "job.yaml");
  INFO((merged.ok() ? "" : std::string(merged.status().message())));
  REQUIRE(merged.ok());
  CHECK(merged->flags == Flags{{"--num-proc", "3"}});
  CHECK(merged->command == Words{"sh", "-c", "echo $RANK"});
  // An empty file, or one of comments, sets nothing.
  CHECK(ParseConfigFile("# nothing yet\n", "f.yaml")->flags.empty());
  CHECK(ParseConfigFile("", "f.yaml")->command.empty());
}

TEST_CASE("config file: a bad YAML file is one sentence with its line", "[cli][config]") {
  CHECK(ParseConfigFile("hosts: [a, b\nnum_proc: 2\n", "f.yaml").status().message() ==
        "f.yaml line 2, column 9: not valid YAML: end of sequence flow not found");
  CHECK(ParseConfigFile("num_proc: *count\n", "f.yaml").status().message() ==
        "f.yaml line 1, column 11: not valid YAML: the referenced anchor is not defined");
  CHECK(ParseConfigFile("environment:\n  A: \"\\q\"\n", "f.yaml").status().message() ==
        "f.yaml line 2, column 9: not valid YAML: unknown escape character: q");
  CHECK(ParseConfigFile("params: {a: 1}\n", "f.yaml").status().message() ==
        "f.yaml line 1: 'params.a' is not a key trainrun knows (horovodrun's params, autotune, "
        "timeline, stall_check, library_options and logging keys, or a job file's hosts, "
        "processes_per_host, num_proc, environment, command)");
  CHECK(ParseConfigFile("params:\n  cycle_time_ms:\n    deep: 1\n", "f.yaml").status().message() ==
        "f.yaml line 2: 'params.cycle_time_ms' holds `key: value` lines, a level deeper than "
        "trainrun's keys go");
  CHECK(ParseConfigFile("hosts: [a, [b]]\n", "f.yaml").status().message() ==
        "f.yaml line 1: 'hosts' is a list whose items are lists or `key: value`; write one plain "
        "value per item");
  CHECK(ParseConfigFile("- a\n- b\n", "f.yaml").status().message() ==
        "f.yaml line 1: the file is a list; write `key: value` lines");
  // A command written as one string is split as a shell would; a quote left open is named, not
  // swallowed into the last word.
  CHECK(ParseConfigFile("num_proc: 2\ncommand: python3 train.py --tag 'a b\n", "f.yaml")
            .status()
            .message() == "f.yaml line 2: command 'python3 train.py --tag 'a b' has an unclosed '");
  CHECK(ParseConfigFile("num_proc: 1\n---\nnum_proc: 2\n", "f.yaml").status().message() ==
        "f.yaml line 2: a second YAML document (after ---); a config file holds one");
  // yaml-cpp 0.7 alone would read documents after a stray ',' for ever.
  CHECK(ParseConfigFile("- a\n- b\n,\n", "f.yaml").status().message() ==
        "f.yaml line 3, column 1: not valid YAML: ',' is out of place here");
  CHECK(ParseConfigFile(",", "f.yaml").status().message() ==
        "f.yaml line 1, column 1: not valid YAML: ',' is out of place here");
  CHECK(ParseConfigFile("? [a]\n: 1\n", "f.yaml").status().message() ==
        "f.yaml line 1: a key is not a name; write `name: value`");
  std::string deep(3000, '[');
  CHECK(ParseConfigFile("hosts: " + deep + "\n", "f.yaml").status().message() ==
        "f.yaml line 2: the YAML nests too deep (over 2000 levels)");
}

}  // namespace
}  // namespace trainrun::cli

namespace trainrun::cli {
namespace {

// The launch spec's error for `args`, which must fail.
std::string SpecError(const std::vector<std::string>& args) {
  CLI::App app;
  RunOptions options;
  SetupRunOptions(app, options);
  auto outcome = ParseRunArgs(app, args, options);
  REQUIRE(outcome.ok());
  auto spec = MakeLaunchSpec(options, [](const std::string&) { return std::nullopt; });
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST_CASE("an empty --rsh-agent or one with an open quote is one sentence naming it", "[cli]") {
  CHECK(SpecError({"-H", "a:1", "--rsh-agent", "ssh -o 'ProxyCommand=x", "true"}) ==
        "--rsh-agent 'ssh -o 'ProxyCommand=x' has an unclosed '");
  CHECK(SpecError({"-H", "a:1", "--rsh-agent", " ", "true"}) ==
        "--rsh-agent is empty; give the remote shell's command, e.g. --rsh-agent 'qrsh -inherit'");
}

}  // namespace
}  // namespace trainrun::cli
