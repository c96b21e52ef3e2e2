// ConnectWorld: the communicator choice of a worker that is not elastic (Runtime::Init).
#pragma once

#include <memory>
#include <optional>

#include "trainrun/collectives/communicator.h"

namespace trainrun::collectives {

// ConnectWorld builds the communicator the environment asks for: the job of the trainrun that
// started this process (TRAINRUN_RENDEZVOUS_ADDR); else the ranks meeting in the directory
// TRAINRUN_FILE_STORE (each rank's TRAINRUN_RANK and TRAINRUN_SIZE set by hand, as torch's
// file:// init); else a job of one. Throws Error naming the variable that is missing or not an
// integer, and Error when TRAINRUN_SIZE says several ranks but nothing says how to meet them.
std::unique_ptr<Communicator> ConnectWorld();

// IntFromEnvironment reads integer variable `name`: `fallback` when it is unset or empty (Error
// saying `why` when there is no fallback), Error naming the variable and value when it is not an
// integer.
int IntFromEnvironment(const char* name, std::optional<int> fallback, const char* why);

}  // namespace trainrun::collectives
