// The compatibility table's translation (cli/src/foreign_flags.cc) in-process: what each kind of
// spelling becomes, and the flags the environment gives (torchrun's PET_*, the training operator's
// MASTER_ADDR/WORLD_SIZE/RANK, an MPIJob's OMPI_MCA_*). tests/cli/spellings_test.sh runs a real
// job with every spelling.
#include "trainrun/cli/foreign_flags.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "trainrun/cli/run_options.h"

namespace trainrun::cli {
namespace {

using Words = std::vector<std::string>;

class Translate {
 protected:
  Translate() { SetupRunOptions(app, options); }

  absl::StatusOr<Translation> Run(const Words& args) {
    EnvLookup lookup = [this](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    return TranslateForeignFlags(app, args, lookup);
  }

  Words Args(const Words& args) {
    absl::StatusOr<Translation> t = Run(args);
    INFO((t.ok() ? "" : std::string(t.status().message())));
    REQUIRE(t.ok());
    return t->args;
  }

  CLI::App app;
  RunOptions options;
  std::map<std::string, std::string> env;
};

TEST_CASE_METHOD(Translate, "foreign spellings become trainrun's flags up to the command",
                 "[cli][foreign]") {
  CHECK(Args({"-host", "a:2", "-np", "2", "x", "-host", "y"}) ==
        Words{"--hosts", "a:2", "--num-proc", "2", "x", "-host", "y"});
  CHECK(Args({"-np=3", "-verbose", "x"}) == Words{"--num-proc=3", "--verbose", "x"});
  CHECK(Args({"-tag-output", "-quiet", "x"}) == Words{"--tag-output", "--quiet", "x"});
  CHECK(Args({"--start_timeout", "9", "x"}) == Words{"--start-timeout", "9", "x"});
  CHECK(Args({"-byslot", "x"}) == Words{"--map-by=slot", "x"});
  CHECK(Args({"--gloo-timeout-seconds", "7", "x"}) == Words{"-x", "TRAINRUN_TIMEOUT=7", "x"});
}

TEST_CASE_METHOD(Translate, "a flag's values are skipped whole, two for a two-value flag",
                 "[cli][foreign]") {
  CHECK(Args({"--blacklist-cooldown-range", "1", "2", "-np", "1", "x"}) ==
        Words{"--blacklist-cooldown-range", "1", "2", "--num-proc", "1", "x"});
  CHECK(Args({"-x", "-np", "-np", "1", "x"}) == Words{"-x", "-np", "--num-proc", "1", "x"});
}

TEST_CASE_METHOD(Translate, "mca: a known key acts, another is one note", "[cli][foreign]") {
  CHECK(Args({"-mca", "plm_rsh_agent", "qrsh -inherit", "x"}) ==
        Words{"--rsh-agent", "qrsh -inherit", "x"});
  CHECK(Args({"--mca", "btl_tcp_if_include", "eth0", "x"}) ==
        Words{"--network-interface", "eth0", "x"});
  absl::StatusOr<Translation> t = Run({"-mca", "pml", "ob1", "-mca", "btl", "^openib", "x"});
  REQUIRE(t.ok());
  CHECK(t->args == Words{"x"});
  REQUIRE(t->notes.size() == 2);
  CHECK_THAT(t->notes[1], Catch::Contains("btl ^openib") && Catch::Contains("changes nothing"));
}

TEST_CASE_METHOD(Translate, "torchrun's -m runs the command as a module, --standalone is one node",
                 "[cli][foreign]") {
  CHECK(Args({"-m", "--nproc-per-node", "2", "pkg.train", "--lr", "1"}) ==
        Words{"--nproc-per-node", "2", "--", "python3", "-m", "pkg.train", "--lr", "1"});
  CHECK(Args({"--standalone", "--nproc-per-node", "2", "x"}) ==
        Words{"--nproc-per-node", "2", "x"});
  absl::StatusOr<Translation> t = Run({"--standalone", "--nnodes", "2", "x"});
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("drop --nnodes"));
}

TEST_CASE_METHOD(Translate, "unknown words are one sentence naming them, never help",
                 "[cli][foreign]") {
  for (const char* word : {"-hots", "-verbosex", "-qv", "-n4", "-xFOO", "--bogus", "-tag"}) {
    CAPTURE(word);
    absl::StatusOr<Translation> t = Run({word, "2", "x"});
    REQUIRE_FALSE(t.ok());
    const std::string message(t.status().message());
    CHECK_THAT(message, Catch::Contains(std::string("'") + word + "'"));
    CHECK(message.find('\n') == std::string::npos);
  }
  absl::StatusOr<Translation> t = Run({"-verbosex", "x"});
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("did you mean --verbose?"));
  t = Run({"-npernode", "2", "x"});
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("-H host1:N"));
}

TEST_CASE_METHOD(Translate, "PET_* variables give torchrun's flags the command line does not",
                 "[cli][foreign]") {
  env = {{"PET_NNODES", "2"},          {"PET_NPROC_PER_NODE", "3"},
         {"PET_NODE_RANK", "1"},       {"PET_MASTER_ADDR", "10.0.0.1"},
         {"PET_MASTER_PORT", "23456"}, {"PET_STANDALONE", "0"}};
  CHECK(Args({"--node-rank", "0", "x"}) == Words{"--nnodes", "2", "--nproc-per-node", "3",
                                                 "--master-addr", "10.0.0.1", "--master-port",
                                                 "23456", "--node-rank", "0", "x"});
}

TEST_CASE_METHOD(Translate, "the training operator's MASTER_ADDR, WORLD_SIZE and RANK make a node",
                 "[cli][foreign]") {
  env = {{"MASTER_ADDR", "pod-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "2"}, {"RANK", "1"}};
  CHECK(Args({"x"}) == Words{"--nnodes", "2", "--node-rank", "1", "--master-addr", "pod-0",
                             "--master-port", "23456", "--nproc-per-node", "1", "x"});
  CHECK(Args({"-np", "4", "x"}) == Words{"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                         "pod-0", "--master-port", "23456", "--num-proc", "4",
                                         "x"});
  SECTION("the worker command's own flags are not trainrun's") {
    CHECK(Args({"perf", "-n", "5", "--nnodes", "3"}) ==
          Words{"--nnodes", "2", "--node-rank", "1", "--master-addr", "pod-0", "--master-port",
                "23456", "--nproc-per-node", "1", "perf", "-n", "5", "--nnodes", "3"});
  }
  SECTION("not inside a rank of trainrun or torchrun (LOCAL_RANK), nor with hosts given") {
    env["LOCAL_RANK"] = "0";
    CHECK(Args({"x"}) == Words{"x"});
    env.erase("LOCAL_RANK");
    CHECK(Args({"-H", "a:1", "x"}) == Words{"-H", "a:1", "x"});
  }
}

TEST_CASE_METHOD(Translate, "an MPIJob's launcher: OMPI_MCA_plm_rsh_agent and the hostfile",
                 "[cli][foreign]") {
  env = {{"OMPI_MCA_plm_rsh_agent", "/etc/mpi/kubexec.sh"},
         {"OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"}};
  CHECK(Args({"x"}) ==
        Words{"--rsh-agent", "/etc/mpi/kubexec.sh", "--hostfile", "/etc/mpi/hostfile", "x"});
  CHECK(Args({"-H", "a:1", "--rsh-agent", "ssh", "x"}) ==
        Words{"-H", "a:1", "--rsh-agent", "ssh", "x"});
}

TEST_CASE("the compatibility help lists every spelling once, with its tool", "[cli][foreign]") {
  const std::string help = CompatibilityHelp();
  for (const ForeignFlag& row : ForeignFlags()) {
    CAPTURE(row.spelling);
    CHECK_THAT(help, Catch::Contains(std::string(row.tool) + " ") &&
                         Catch::Contains(" " + std::string(row.spelling) + " "));
  }
}

}  // namespace
}  // namespace trainrun::cli
