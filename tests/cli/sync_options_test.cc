// --sync-dst-dir, --sync-src-dir and --sync-exclude (MXNet's launch.py flag and its companions):
// what the launch spec gets, and one sentence naming the flag for each bad combination.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "trainrun/cli/make_launch_spec.h"
#include "trainrun/cli/run_options.h"

namespace trainrun::cli {
namespace {

using Words = std::vector<std::string>;

absl::StatusOr<launcher::LaunchSpec> Spec(const Words& args) {
  CLI::App app;
  RunOptions options;
  SetupRunOptions(app, options);
  auto outcome = ParseRunArgs(app, args, options);
  if (!outcome.ok()) return outcome.status();
  return MakeLaunchSpec(options, [](const std::string&) { return std::nullopt; });
}

std::string Error(const Words& args) {
  auto spec = Spec(args);
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST_CASE("sync flags: DIR becomes the ranks' directory, SRC defaults to trainrun's", "[cli]") {
  auto spec = Spec({"-np", "2", "-H", "a:1,b:1", "--sync-dst-dir", "/tmp/job/", "--sync-exclude",
                    "*.ckpt", "--sync-exclude", "data/raw", "python3", "train.py"});
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  REQUIRE(spec->sync.has_value());
  CHECK(spec->sync->dst_dir == "/tmp/job");
  CHECK(spec->working_dir == "/tmp/job");
  CHECK(spec->sync->src_dir == std::filesystem::current_path().lexically_normal().string());
  CHECK(spec->sync->excludes == Words{"*.ckpt", "data/raw"});
  CHECK(spec->command == Words{"python3", "train.py"});

  auto plain = Spec({"-np", "1", "true"});
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->sync.has_value());
}

TEST_CASE("sync flags: each bad combination is one sentence naming the flag", "[cli]") {
  CHECK(Error({"-np", "1", "--sync-src-dir", "/tmp", "true"}) ==
        "--sync-src-dir is for --sync-dst-dir, which copies the directory; add --sync-dst-dir DIR");
  CHECK(Error({"-np", "1", "--sync-dst-dir", "job", "true"}) ==
        "--sync-dst-dir 'job' is not an absolute path; give the directory the same way for every "
        "host, e.g. /tmp/job");
  CHECK(Error({"-np", "1", "--sync-dst-dir", "/tmp/job", "-wdir", "/tmp", "true"}) ==
        "--sync-dst-dir and -wdir both set the ranks' directory; give one of them");
  CHECK(
      Error({"-np", "1", "--sync-dst-dir", "/tmp/job", "--sync-src-dir", "/nonexistent/src",
             "true"}) ==
      "--sync-src-dir '/nonexistent/src' does not exist; give the directory to copy to the hosts");
  CHECK(Error({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "10.0.0.1:29500",
               "--nproc-per-node", "1", "--sync-dst-dir", "/tmp/job", "true"})
            .find("in per-node mode (--nnodes)") != std::string::npos);
  CHECK(Error({"-np", "2", "--min-np", "1", "--sync-dst-dir", "/tmp/job", "true"})
            .find("--sync-dst-dir does not work with --min-np yet") != std::string::npos);
}

}  // namespace
}  // namespace trainrun::cli
