#include "trainrun/launcher/exit_info.h"

#include <csignal>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainrun::launcher {

std::string SignalName(int signal) {
  // sigabbrev_np (glibc 2.32+) gives "KILL" for SIGKILL; real-time signals have no abbreviation.
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev == nullptr) return absl::StrCat("signal ", signal);
  return absl::StrCat("SIG", abbrev);
}

std::string ExitInfo::Describe() const {
  if (exec_errno != 0) return absl::StrCat("could not be executed: ", std::strerror(exec_errno));
  if (signal != 0) return absl::StrCat("was killed by ", SignalName(signal));
  return absl::StrCat("exited with code ", code);
}

}  // namespace trainrun::launcher
