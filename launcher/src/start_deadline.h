// StartDeadline: --start-timeout as one deadline, from the first connection to a host to the last
// rank's start, read on both clocks the phases wait with.
#pragma once

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainrun::launcher {

struct StartDeadline {
  std::chrono::seconds timeout{0};             // as given, for messages
  absl::Time at;                               // for the hosts' connections
  std::chrono::steady_clock::time_point when;  // for the ranks' start, on the job's io_context

  // From starts the clock now.
  static StartDeadline From(std::chrono::seconds timeout) {
    return {timeout, absl::Now() + absl::FromChrono(timeout),
            std::chrono::steady_clock::now() + timeout};
  }
};

}  // namespace trainrun::launcher
