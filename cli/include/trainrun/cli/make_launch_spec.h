// Turning parsed flags into a LaunchSpec: the hosts (from -H, --hostfile, a Slurm allocation, or
// this host), the slot plan, and checked -x names.
//
//   auto spec = trainrun::cli::MakeLaunchSpec(options, trainrun::cli::ProcessEnvironment());
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "trainrun/cli/run_options.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::cli {

// EnvironmentLookup returns the value of an environment variable of trainrun's own, or nullopt.
// Tests pass a fake one.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// ProcessEnvironment looks variables up in this process's environment (env::Lookup).
EnvironmentLookup ProcessEnvironment();

// kLocalHost names this host when no hosts are given.
inline constexpr char kLocalHost[] = "localhost";

// MakeLaunchSpec checks `options` and resolves them into what the launcher needs. Hosts come from
// -H, else --hostfile, else the Slurm allocation `env` describes (SLURM_JOB_NODELIST and
// SLURM_TASKS_PER_NODE), else this host with -np slots. Every error is bad input and comes back
// as InvalidArgument with one sentence naming the culprit: the flag, FILE:LINE, the variable.
absl::StatusOr<launcher::LaunchSpec> MakeLaunchSpec(const RunOptions& options,
                                                    const EnvironmentLookup& env);

// IsValidVariableName says whether `name` can be an environment variable a shell can set:
// letters, digits and '_', not starting with a digit.
bool IsValidVariableName(const std::string& name);

}  // namespace trainrun::cli
