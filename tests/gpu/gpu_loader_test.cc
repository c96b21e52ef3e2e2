// The loader's answers where a library is missing: one sentence naming what is missing and where
// it was looked for. Run with TRAINRUN_NCCL_LIBRARY and TRAINRUN_CUDA_LIBRARY pointing nowhere
// (CMakeLists.txt), since a process opens each library once.
#include <catch2/catch.hpp>
#include <string>

#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/collectives/gpu/runtime.h"

namespace trainrun::collectives::gpu {
namespace {

bool OneSentence(const std::string& text) {
  return !text.empty() && text.find('\n') == std::string::npos;
}

TEST_CASE("missing NCCL", "[gpu_loader]") {
  const LibraryLoad& nccl = OpenNccl();
  REQUIRE(nccl.handle == nullptr);
  REQUIRE(OneSentence(nccl.why_not));
  REQUIRE_THAT(nccl.why_not,
               Catch::StartsWith("NCCL (libnccl.so.2) did not load from "
                                 "TRAINRUN_NCCL_LIBRARY=/nonexistent/libnccl.so.2: "));
  const RuntimeLoad& cuda = CudaRuntime();
  REQUIRE(cuda.runtime == nullptr);
  REQUIRE(OneSentence(cuda.why_not));
  REQUIRE_THAT(cuda.why_not, Catch::Contains("TRAINRUN_CUDA_LIBRARY=/nonexistent"));
  const GpuProbe probe = ProbeHost();
  REQUIRE(probe.nccl_version == 0);
  const std::string described = DescribeProbe(probe);
  REQUIRE(OneSentence(described));
  REQUIRE_THAT(described, Catch::Contains("no NCCL (NCCL (libnccl.so.2) did not load"));
}

TEST_CASE("version numbers as CUDA and NCCL write them", "[gpu_loader]") {
  REQUIRE(VersionString(13000, false) == "13.0");
  REQUIRE(VersionString(12040, false) == "12.4");
  REQUIRE(VersionString(22809, true) == "2.28.9");
  REQUIRE(VersionString(2804, true) == "2.8.4");
}

}  // namespace
}  // namespace trainrun::collectives::gpu
