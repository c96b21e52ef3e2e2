// The whole `trainrun` command, so main.cc is a few lines and tests can run it in-process:
// parse, plan, then dry-run or launch; and the one place where an error becomes an exit code.
//
//   int main(int argc, char** argv) {
//     trainrun::cli::InstallStderrLogger();
//     return trainrun::cli::RunMain(trainrun::cli::Arguments(argc, argv),
//     trainrun::launcher::Launch);
//   }
#pragma once

#include <spdlog/common.h>

#include <functional>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainrun/cli/make_launch_spec.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::cli {

// LaunchFunction runs a job and returns its exit code (trainrun::launcher::Launch, or a fake).
using LaunchFunction = std::function<absl::StatusOr<int>(const launcher::LaunchSpec&)>;

// Exit codes of trainrun's own failures; a job's exit code is passed through unchanged.
inline constexpr int kExitBadInput = 2;         // nothing was started
inline constexpr int kExitInternal = 1;         // an error that is not the user's input
inline constexpr int kExitTimeout = 124;        // as timeout(1)
inline constexpr int kExitCannotExecute = 126;  // the command exists but cannot run
inline constexpr int kExitNotFound = 127;       // the command does not exist, as the shell says

// ExitCodeFor maps an error to trainrun's exit code, the only such mapping: InvalidArgument (bad
// input; every parse and plan error is one) -> 2, NotFound -> 127, PermissionDenied -> 126,
// DeadlineExceeded -> 124, anything else -> 1, OK -> 0.
int ExitCodeFor(const absl::Status& status);

// InstallLogger makes spdlog's default logger, through which all of trainrun's own messages go,
// write to `sink` as `trainrun: LEVEL: message` (e.g. `trainrun: error: -H: ...`).
void InstallLogger(spdlog::sink_ptr sink);

// InstallStderrLogger is InstallLogger with stderr, apart from the workers' tagged output.
void InstallStderrLogger();

// Arguments returns argv without argv[0].
std::vector<std::string> Arguments(int argc, char** argv);

// RunMain is `trainrun`: it parses `args` (argv without argv[0]), sets the log level, builds the
// LaunchSpec, and then prints the plan to `out` (--dry-run) or calls `launch`. Help and version go
// to `out`, exit 0. Any error is logged once through spdlog and mapped by ExitCodeFor; on bad
// input `launch` is never called.
int RunMain(const std::vector<std::string>& args, const LaunchFunction& launch,
            const EnvironmentLookup& env = ProcessEnvironment(), std::ostream& out = std::cout);

}  // namespace trainrun::cli
