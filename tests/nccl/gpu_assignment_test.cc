// launcher/gpu_assignment: CUDA_VISIBLE_DEVICES per local rank, and counting GPUs without CUDA.
#include "trainrun/launcher/gpu_assignment.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace trainrun::launcher {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> Assign(int local_rank, int local_size, std::optional<std::string> user,
                                  int gpus, bool enabled = true) {
  auto result = AssignGpu({local_rank, local_size, std::move(user), gpus, enabled});
  REQUIRE(result.ok());
  return *result;
}

// TempDir is a directory removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainrun-gpus-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

  void Touch(const std::string& name) const { std::ofstream(path_ / name).put('\n'); }
  void MakeDir(const std::string& name) const { fs::create_directories(path_ / name); }

 private:
  fs::path path_;
};

TEST_CASE("without CUDA_VISIBLE_DEVICES each local rank gets its own GPU", "[gpu_assignment]") {
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Assign(rank, 4, std::nullopt, 4) == std::to_string(rank));
  }
  // More ranks than GPUs: they wrap around and share.
  CHECK(Assign(3, 4, std::nullopt, 2) == "1");
  CHECK(Assign(2, 4, std::nullopt, 2) == "0");
}

TEST_CASE("a host without GPUs leaves CUDA_VISIBLE_DEVICES alone", "[gpu_assignment]") {
  CHECK(Assign(0, 2, std::nullopt, 0) == std::nullopt);
  CHECK(Assign(1, 2, std::nullopt, 0) == std::nullopt);
}

TEST_CASE("the switch turns assignment off", "[gpu_assignment]") {
  CHECK(Assign(1, 2, std::nullopt, 8, /*enabled=*/false) == std::nullopt);
  CHECK(Assign(1, 2, std::string("4,5"), 8, /*enabled=*/false) == std::nullopt);
}

TEST_CASE("a user's CUDA_VISIBLE_DEVICES is respected", "[gpu_assignment]") {
  CHECK(Assign(0, 2, std::string("4,6"), 8) == "4");
  CHECK(Assign(1, 2, std::string("4,6"), 8) == "6");
  // Fewer entries than local ranks: modulo.
  CHECK(Assign(2, 3, std::string("4,6"), 8) == "4");
  // UUIDs pass through, trimmed; empty entries are ignored.
  CHECK(Assign(1, 2, std::string(" GPU-1a2b , ,GPU-3c4d "), 2) == "GPU-3c4d");
  CHECK(Assign(0, 1, std::string("MIG-aaaa-bbbb"), 1) == "MIG-aaaa-bbbb");
  // Set although no GPUs were detected (e.g. a container without /dev/nvidia*): still respected.
  CHECK(Assign(1, 2, std::string("0,1"), 0) == "1");
  // Set empty: the user wants no GPUs.
  CHECK(Assign(0, 2, std::string(""), 4) == std::nullopt);
}

TEST_CASE("a local rank outside its host is an error", "[gpu_assignment]") {
  CHECK(absl::IsInvalidArgument(AssignGpu({2, 2, std::nullopt, 4, true}).status()));
  CHECK(absl::IsInvalidArgument(AssignGpu({-1, 2, std::nullopt, 4, true}).status()));
  CHECK(absl::IsInvalidArgument(AssignGpu({0, 0, std::nullopt, 4, true}).status()));
  CHECK(absl::IsInvalidArgument(AssignGpu({0, 1, std::nullopt, -1, true}).status()));
}

TEST_CASE("GPUs are counted from device nodes, else from the driver's proc entries",
          "[gpu_assignment]") {
  TempDir dev;
  TempDir proc;
  for (const char* name : {"nvidia0", "nvidia1", "nvidia12", "nvidiactl", "nvidia-uvm",
                           "nvidia-modeset", "null", "nvidia"}) {
    dev.Touch(name);
  }
  proc.MakeDir("0000:17:00.0");
  CHECK(CountHostGpus(dev.path().string(), proc.path().string()) == 3);

  TempDir empty_dev;
  empty_dev.Touch("nvidiactl");
  proc.MakeDir("0000:65:00.0");
  proc.MakeDir("0000:ca:00.0");
  CHECK(CountHostGpus(empty_dev.path().string(), proc.path().string()) == 3);

  CHECK(CountHostGpus((empty_dev.path() / "missing").string(),
                      (proc.path() / "missing").string()) == 0);
}

}  // namespace
}  // namespace trainrun::launcher
