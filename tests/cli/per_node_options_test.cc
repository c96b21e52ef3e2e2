// Per-node mode's flags: torchrun's spellings, and one sentence naming the flag for each bad
// combination.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trainrun/cli/dry_run.h"
#include "trainrun/cli/make_launch_spec.h"
#include "trainrun/cli/run_options.h"

namespace trainrun::cli {
namespace {

using Words = std::vector<std::string>;

class PerNodeApp {
 protected:
  PerNodeApp() { SetupRunOptions(app, options); }

  // Parses `args` and makes the launch spec with `env` as trainrun's environment.
  absl::StatusOr<launcher::LaunchSpec> Spec(const Words& args,
                                            std::map<std::string, std::string> env = {}) {
    auto outcome = ParseRunArgs(app, args, options);
    if (!outcome.ok()) return outcome.status();
    return MakeLaunchSpec(options, [env](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    });
  }

  // The one-sentence error of `args`, parsed by a fresh app (flags must not carry over).
  static std::string Error(const Words& args) {
    PerNodeApp fresh;
    auto spec = fresh.Spec(args);
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(spec.status().message());
  }

  CLI::App app;
  RunOptions options;
};

TEST_CASE_METHOD(PerNodeApp, "per-node mode: torchrun's flags make the whole job's plan",
                 "[cli][per_node]") {
  auto spec = Spec({"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29500",
                    "--nproc-per-node", "4", "python", "train.py"});
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  REQUIRE(spec->per_node.has_value());
  CHECK(spec->per_node->nnodes == 2);
  CHECK(spec->per_node->node_rank == 1);
  CHECK(spec->per_node->nproc_per_node == 4);
  CHECK(spec->per_node->endpoint_host == "10.0.0.1");
  CHECK(spec->per_node->endpoint_port == 29500);
  CHECK(spec->per_node->rdzv_id == "none");
  CHECK(spec->per_node->token.empty());
  REQUIRE(spec->plan.size() == 8);
  // Ranks by node rank, then local rank.
  CHECK(spec->plan.hosts[0].host == "10.0.0.1");
  CHECK(spec->plan.hosts[1].host == "node1");
  CHECK(spec->plan.ranks[5].host_index == 1);
  CHECK(spec->plan.ranks[5].local_rank == 1);
  // The rendezvous listens at the endpoint's address, on a port of its own (the endpoint's port
  // stays the join port).
  CHECK(spec->rendezvous_addr == "10.0.0.1");
  CHECK(spec->rendezvous_port == 0);
  CHECK(spec->command == Words{"python", "train.py"});
}

TEST_CASE_METHOD(PerNodeApp, "per-node mode: underscore spellings and --master-addr/--master-port",
                 "[cli][per_node]") {
  auto spec = Spec({"--nnodes=3", "--node_rank=2", "--master_addr", "head", "--master_port", "1234",
                    "--nproc_per_node", "2", "--rdzv_id", "job7", "-np", "6", "prog"});
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  REQUIRE(spec->per_node.has_value());
  CHECK(spec->per_node->nnodes == 3);
  CHECK(spec->per_node->node_rank == 2);
  CHECK(spec->per_node->endpoint_host == "head");
  CHECK(spec->per_node->endpoint_port == 1234);
  CHECK(spec->per_node->rdzv_id == "job7");
  CHECK(spec->plan.size() == 6);
  // --master-port is also the MASTER_PORT the ranks see; --rdzv-endpoint's port is not.
  CHECK(spec->per_node->master_port == 1234);
  CHECK(spec->plan.ranks[5].local_rank == 1);
}

TEST_CASE_METHOD(PerNodeApp,
                 "per-node mode: --nnodes N:N is N nodes, the endpoint's port is no MASTER_PORT",
                 "[cli][per_node]") {
  auto spec = Spec({"--nnodes", "2:2", "--node-rank", "1", "--rdzv-endpoint", "head:29500",
                    "--nproc-per-node", "3", "prog"});
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  CHECK(spec->per_node->nnodes == 2);
  CHECK(spec->per_node->master_port == 0);
  CHECK(spec->per_node->min_nnodes == 0);
  CHECK(Error({"--nnodes", "3:2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--nproc-per-node",
               "1", "prog"}) == "--nnodes 3:2: give N, or MIN:MAX with 1 <= MIN <= MAX <= 65536");
  CHECK(Error({"--nnodes", "two", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--nproc-per-node",
               "1", "prog"}) == "--nnodes two: give one number of nodes");
}

TEST_CASE_METHOD(PerNodeApp,
                 "per-node mode: the endpoint's port defaults to 29400, IPv6 goes in brackets",
                 "[cli][per_node]") {
  auto spec = Spec({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "head",
                    "--nproc-per-node", "1", "prog"});
  REQUIRE(spec.ok());
  CHECK(spec->per_node->endpoint_port == 29400);
  auto v6 = Spec({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "[fd00::1]:5000",
                  "--nproc-per-node", "1", "prog"});
  REQUIRE(v6.ok());
  CHECK(v6->per_node->endpoint_host == "fd00::1");
  CHECK(v6->per_node->endpoint_port == 5000);
}

TEST_CASE_METHOD(PerNodeApp,
                 "per-node flags: --nproc-per-node without --nnodes is -np on this host",
                 "[cli][per_node]") {
  auto spec = Spec({"--nproc-per-node", "3", "prog"});
  REQUIRE(spec.ok());
  CHECK_FALSE(spec->per_node.has_value());
  CHECK(spec->plan.size() == 3);
}

TEST_CASE_METHOD(PerNodeApp, "per-node mode: the token from the flag, a file or the environment",
                 "[cli][per_node]") {
  const Words base = {"--nnodes",        "2",   "--node-rank",      "0",
                      "--rdzv-endpoint", "h:1", "--nproc-per-node", "1"};
  SECTION("flag") {
    Words args = base;
    args.insert(args.end(), {"--rdzv-token", "s3cret", "prog"});
    auto spec = Spec(args, {{"TRAINRUN_RDZV_TOKEN", "other"}});
    REQUIRE(spec.ok());
    CHECK(spec->per_node->token == "s3cret");
  }
  SECTION("variable") {
    Words args = base;
    args.push_back("prog");
    auto spec = Spec(args, {{"TRAINRUN_RDZV_TOKEN", "from-env"}});
    REQUIRE(spec.ok());
    CHECK(spec->per_node->token == "from-env");
  }
  SECTION("file") {
    const std::string path = "per_node_token_test.txt";
    std::ofstream(path) << "in-a-file\n";
    Words args = base;
    args.insert(args.end(), {"--rdzv-token-file", path, "prog"});
    auto spec = Spec(args);
    std::remove(path.c_str());
    REQUIRE(spec.ok());
    CHECK(spec->per_node->token == "in-a-file");
  }
}

TEST_CASE_METHOD(PerNodeApp, "per-node mode: each bad combination is one sentence naming the flag",
                 "[cli][per_node]") {
  CHECK_THAT(Error({"--node-rank", "1", "prog"}),
             Catch::Contains("--node-rank is for per-node mode; give --nnodes"));
  CHECK_THAT(Error({"--rdzv-endpoint", "h:1", "-np", "2", "prog"}),
             Catch::Contains("--rdzv-endpoint is for per-node mode"));
  CHECK_THAT(Error({"--nnodes", "2", "--rdzv-endpoint", "h:1", "--nproc-per-node", "2", "prog"}),
             Catch::Contains("--nnodes 2 needs --node-rank"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "2", "prog"}),
             Catch::Contains("--node-rank 2 is out of range for --nnodes 2 (0 to 1)"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "prog"}),
             Catch::Contains("--nnodes 2 needs --rdzv-endpoint HOST:PORT"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "prog"}),
             Catch::Contains("needs --nproc-per-node"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "4", "-np", "6", "prog"}),
             Catch::Contains("-np 6 is the job's total, but --nnodes 2 x --nproc-per-node 4 "
                             "makes 8"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--master-addr",
                    "h", "--nproc-per-node", "1", "prog"}),
             Catch::Contains("either --rdzv-endpoint or --master-addr/--master-port"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--master-port", "1", "--nproc-per-node",
                    "1", "prog"}),
             Catch::Contains("--master-port needs --master-addr"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:x",
                    "--nproc-per-node", "1", "prog"}),
             Catch::Contains("--rdzv-endpoint 'h:x': the port must be a number"));
  CHECK_THAT(Error({"--nnodes", "0:4", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "prog"}),
             Catch::Contains("--nnodes 0:4: give N, or MIN:MAX"));
  CHECK_THAT(
      Error({"--nnodes", "1:4", "--node-rank", "0", "--rdzv-endpoint", "h:1", "-np", "4", "prog"}),
      Catch::Contains("--nnodes 1:4 needs --nproc-per-node"));
  CHECK_THAT(Error({"--nnodes", "1:4", "--node-rank", "0", "--rdzv-endpoint", "h:1", "-np", "4",
                    "--nproc-per-node", "1", "prog"}),
             Catch::Contains("-np does not go with --nnodes 1:4"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "--rdzv-last-call", "5", "prog"}),
             Catch::Contains("--rdzv-last-call is for --nnodes MIN:MAX"));
  CHECK_THAT(Error({"--rdzv-last-call", "5", "-np", "1", "prog"}),
             Catch::Contains("--rdzv-last-call is for per-node mode"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "-H", "a:1,b:1", "prog"}),
             Catch::Contains("give one or the other"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "--rendezvous-port", "5", "prog"}),
             Catch::Contains("--rendezvous-port and --rendezvous-addr are not used with --nnodes"));
  CHECK_THAT(
      Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--nproc-per-node", "1",
             "--rdzv-token", "a", "--rdzv-token-file", "f", "prog"}),
      Catch::Contains("either --rdzv-token or --rdzv-token-file"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "--rdzv-token-file", "/nonexistent/t", "prog"}),
             Catch::Contains("--rdzv-token-file /nonexistent/t: cannot read it"));
  CHECK_THAT(Error({"--nproc-per-node", "2", "-np", "3", "prog"}),
             Catch::Contains("-np 3 and --nproc-per-node 2 disagree"));
  CHECK_THAT(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                    "--nproc-per-node", "1", "--launcher", "ssh", "prog"}),
             Catch::Contains("--launcher ssh does not go with --nnodes"));
}

TEST_CASE_METHOD(PerNodeApp, "per-node mode: the dry run says which node this is, asking no host",
                 "[cli][per_node]") {
  auto spec = Spec({"--dry-run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                    "10.0.0.1:29500", "--nproc-per-node", "2", "true"});
  REQUIRE(spec.ok());
  std::ostringstream out;
  PrintPlan(*spec, out);
  CHECK_THAT(out.str(), Catch::Contains("node1     3     1           1           true"));
  CHECK_THAT(out.str(),
             Catch::Contains("per-node mode: this is node 1 of 2 (ranks 2 to 3 when every "
                             "node runs 2; node 0 numbers them once all have joined); "
                             "it joins node 0 at 10.0.0.1:29500"));
}

}  // namespace
}  // namespace trainrun::cli

namespace trainrun::cli {
namespace {

TEST_CASE_METHOD(PerNodeApp, "per-node mode: --nnodes MIN:MAX is torchrun's elastic node range",
                 "[cli][per_node]") {
  auto spec = Spec({"--nnodes", "1:4", "--node-rank", "3", "--rdzv-endpoint", "head:29500",
                    "--nproc-per-node", "2", "--rdzv-last-call", "5", "prog"});
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  CHECK(spec->per_node->nnodes == 4);
  CHECK(spec->per_node->min_nnodes == 1);
  CHECK(spec->per_node->node_rank == 3);
  CHECK(spec->per_node->last_call == std::chrono::seconds(5));
  // Planned for MAX nodes until they join; node 0 plans again with those that came.
  CHECK(spec->plan.size() == 8);
  CHECK(Error({"--nnodes", "1:4", "--node-rank", "4", "--rdzv-endpoint", "h:1", "--nproc-per-node",
               "1", "prog"}) == "--node-rank 4 is out of range for --nnodes 1:4 (0 to 3)");
}

TEST_CASE_METHOD(PerNodeApp, "per-node mode: --nnodes MIN:MAX waits 30 s for more nodes by default",
                 "[cli][per_node]") {
  auto spec = Spec({"--dry-run", "--nnodes", "2:3", "--node-rank", "0", "--rdzv-endpoint",
                    "head:29500", "--nproc-per-node", "1", "prog"});
  REQUIRE(spec.ok());
  CHECK(spec->per_node->min_nnodes == 2);
  CHECK(spec->per_node->last_call == std::chrono::seconds(30));
  std::ostringstream out;
  PrintPlan(*spec, out);
  CHECK_THAT(out.str(), Catch::Contains("per-node mode: this is node 0 of 2:3 (ranks 0 to 0)"));
  CHECK_THAT(out.str(),
             Catch::Contains("the job starts once 2 nodes have joined and 30 s more have passed "
                             "(--rdzv-last-call), or once all 3 have, on the nodes that joined "
                             "(the plan above is all 3)"));
  CHECK_THAT(out.str(), Catch::Contains("per-node mode: an elastic job (trainrun's elastic API): "
                                        "a node that joins the running job (up to 3) is grown "
                                        "onto, a node that leaves is a membership change while at "
                                        "least 2 nodes remain, fewer end the job"));
}

TEST_CASE_METHOD(
    PerNodeApp, "per-node mode: a range re-forms elastically, or by restarting with --max-restarts",
    "[cli][per_node]") {
  // Without --max-restarts: an elastic job whose floor is MIN nodes.
  auto elastic = Spec({"--nnodes", "2:3", "--node-rank", "0", "--rdzv-endpoint", "head:29500",
                       "--nproc-per-node", "2", "prog"});
  REQUIRE(elastic.ok());
  REQUIRE(elastic->elastic.has_value());
  CHECK(elastic->elastic->min_nodes == 2);
  CHECK(elastic->elastic->min_np == 1);
  CHECK(elastic->max_restarts == 0);
  // With it (torchrun's way): restarts, no elastic job; the dry run says what a join does.
  auto restart = Spec({"--dry-run", "--nnodes", "1:3", "--node-rank", "0", "--rdzv-endpoint",
                       "head:29500", "--nproc-per-node", "2", "--max-restarts", "2", "prog"});
  REQUIRE(restart.ok());
  CHECK_FALSE(restart->elastic.has_value());
  CHECK(restart->max_restarts == 2);
  std::ostringstream out;
  PrintPlan(*restart, out);
  CHECK_THAT(out.str(), Catch::Contains("a node that joins the running job (up to 3) makes every "
                                        "node's ranks start again with it (not counted against "
                                        "--max-restarts 2)"));
  // A fixed node count takes --max-restarts too (each node joins again); no range, no elastic.
  auto fixed = Spec({"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1",
                     "--nproc-per-node", "1", "--max-restarts", "2", "prog"});
  REQUIRE(fixed.ok());
  CHECK_FALSE(fixed->elastic.has_value());
}

}  // namespace
}  // namespace trainrun::cli
