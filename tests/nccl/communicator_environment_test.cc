// Communicator::FromEnvironment outside a trainrun job fails with one clear sentence, before it
// touches a GPU, so this runs without one.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/communicator.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::nccl {
namespace {

TEST_CASE("FromEnvironment outside trainrun says to start the worker with trainrun",
          "[nccl][environment]") {
  unsetenv(env::kRendezvousAddr);
  unsetenv(env::kJobToken);
  try {
    Communicator::FromEnvironment();
    FAIL("FromEnvironment succeeded outside a job");
  } catch (const InvalidArgumentError& error) {
    const std::string message = error.what();
    CHECK_THAT(message, Catch::Contains("could not join the job's rendezvous"));
    CHECK_THAT(message, Catch::Contains("start the worker with trainrun"));
  }
}

// Hidden ([.]): run by the test "nccl: a CUDA runtime or NCCL that does not load is one sentence"
// with TRAINRUN_CUDA_LIBRARY and TRAINRUN_NCCL_LIBRARY pointing nowhere
// (tests/nccl/CMakeLists.txt).
TEST_CASE("Create where CUDA's runtime and NCCL do not load says what and why in one sentence",
          "[.][unloaded]") {
  rendezvous::MemoryStore store;
  try {
    Communicator::Create(store, 0, 1, 0);
    FAIL("Create succeeded without CUDA's runtime");
  } catch (const Error& error) {
    const std::string message = error.what();
    CHECK_THAT(message, Catch::Contains("did not load from TRAINRUN_CUDA_LIBRARY="));
    CHECK(message.find('\n') == std::string::npos);
  }
}

}  // namespace
}  // namespace trainrun::collectives::nccl
