// The live view of a running job, from outside it: `trainrun top [ADDR:]PORT` and the check of
// --monitor's address (the page itself is served by trainrun, launcher/src/monitor/).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainrun::launcher {

// CheckMonitorAddress says whether --monitor's [ADDR:]PORT can be used (one sentence if not).
absl::Status CheckMonitorAddress(const std::string& text);

// IsTopCommand says whether trainrun's arguments (argv without argv[0]) ask for `trainrun top
// [ADDR:]PORT [--once] [--token TOKEN]` rather than a job running a program named top.
bool IsTopCommand(const std::vector<std::string>& args);
// RunTop shows a running job's ranks in the terminal, refreshed in place every second, from the
// --monitor page of the trainrun at ADDR:PORT (127.0.0.1 when ADDR is left out), until that
// trainrun ends or Ctrl-C; --once prints the view once. The token, off loopback: --token or
// TRAINRUN_MONITOR_TOKEN. Returns the exit code.
int RunTop(const std::vector<std::string>& args);

}  // namespace trainrun::launcher
