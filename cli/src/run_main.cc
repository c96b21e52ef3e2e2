#include "trainrun/cli/run_main.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "absl/strings/ascii.h"
#include "trainrun/cli/dry_run.h"
#include "trainrun/cli/run_options.h"
#include "trainrun/rendezvous/grpc_log.h"

namespace trainrun::cli {
namespace {

int Fail(const absl::Status& status) {
  spdlog::error("{}", std::string(status.message()));
  return ExitCodeFor(status);
}

// The gRPC library's own log lines (its rendezvous server runs in this process) are trainrun's
// debug lines: --verbose shows them; nobody else sees a raw "chttp2_server.cc" line.
void RouteGrpcLogsToDebug() {
  rendezvous::RouteGrpcLogs(
      [](rendezvous::GrpcLogSeverity, const char* file, int line, const char* message) {
        spdlog::debug("grpc: {}:{}: {}", file, line, message);
      });
}

void ApplyLogLevel(const RunOptions& options) {
  spdlog::level::level_enum level = options.verbose ? spdlog::level::debug : spdlog::level::info;
  if (options.log_level) {
    std::string name = absl::AsciiStrToLower(*options.log_level);
    level = name == "warning" ? spdlog::level::warn : spdlog::level::from_str(name);
  }
  spdlog::set_level(level);
}

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
      return kExitBadInput;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kPermissionDenied:
      return kExitCannotExecute;
    case absl::StatusCode::kDeadlineExceeded:
      return kExitTimeout;
    default:
      return kExitInternal;
  }
}

void InstallLogger(spdlog::sink_ptr sink) {
  auto logger = std::make_shared<spdlog::logger>("trainrun", std::move(sink));
  logger->set_pattern("trainrun: %l: %v");
  spdlog::set_default_logger(std::move(logger));
}

void InstallStderrLogger() { InstallLogger(std::make_shared<spdlog::sinks::stderr_sink_mt>()); }

std::vector<std::string> Arguments(int argc, char** argv) {
  return argc > 1 ? std::vector<std::string>(argv + 1, argv + argc) : std::vector<std::string>{};
}

int RunMain(const std::vector<std::string>& args, const LaunchFunction& launch,
            const EnvironmentLookup& env, std::ostream& out) {
  RouteGrpcLogsToDebug();
  CLI::App app;
  RunOptions options;
  SetupRunOptions(app, options);
  absl::StatusOr<ParseOutcome> outcome = ParseRunArgs(app, args, options, env);
  if (!outcome.ok()) return Fail(outcome.status());
  switch (*outcome) {
    case ParseOutcome::kHelp:
      out << app.help();
      return 0;
    case ParseOutcome::kVersion:
      out << "trainrun " << TRAINRUN_VERSION << "\n";
      return 0;
    case ParseOutcome::kRun:
      break;
  }
  ApplyLogLevel(options);
  if (!options.quiet) {
    for (const std::string& note : options.notes) spdlog::info("{}", note);
  }

  absl::StatusOr<launcher::LaunchSpec> spec = MakeLaunchSpec(options, env);
  if (!spec.ok()) return Fail(spec.status());
  if (spec->dry_run) {
    PrintPlan(*spec, out);
    return 0;
  }
  if (options.display_map) {
    // Before the ranks write to the same stdout.
    PrintPlan(*spec, out);
    out << std::flush;
  }
  absl::StatusOr<int> exit_code = launch(*spec);
  if (!exit_code.ok()) return Fail(exit_code.status());
  return *exit_code;
}

}  // namespace trainrun::cli
