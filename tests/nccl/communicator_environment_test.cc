// Communicator::FromEnvironment outside a trainrun job fails with one clear sentence, before it
// touches a GPU, so this runs without one.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/communicator.h"
#include "trainrun/rendezvous/environment.h"

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

}  // namespace
}  // namespace trainrun::collectives::nccl
