// Host discovery for elastic jobs (--host-discovery-script, Horovod's): a script that prints the
// hosts the job may use now, one "host" or "host:slots" line each. trainrun runs it once to plan
// the job, then every ElasticSpec::discovery_interval while the job runs (JobRun): a host that
// leaves the output has its ranks stopped and the job shrinks.
//
//   absl::StatusOr<std::vector<hostfile::HostSpec>> hosts = RunDiscoveryScript(script, 1);
//   if (!hosts.ok()) ... one sentence naming the script and, for garbage, the line ...
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::launcher {

// How long one run of the discovery script may take before it is killed and counted a failure.
inline constexpr std::chrono::seconds kDiscoveryScriptTimeout{10};

// ParseDiscoveryOutput reads the script's output: one "host", "host:slots", "user@host[:slots]"
// or "[v6]:slots" per line; blank lines and lines starting with '#' are skipped; a line without
// slots gets `default_slots`. Fails with one sentence naming `script`, the line and its number.
absl::StatusOr<std::vector<hostfile::HostSpec>> ParseDiscoveryOutput(absl::string_view script,
                                                                     absl::string_view output,
                                                                     int default_slots);

// RunDiscoveryScript runs `script` with /bin/sh -c (stdin /dev/null, stderr trainrun's), at most
// kDiscoveryScriptTimeout, and parses what it printed. A script that cannot be run, exits
// non-zero, is killed or prints garbage fails with one sentence naming it.
absl::StatusOr<std::vector<hostfile::HostSpec>> RunDiscoveryScript(const std::string& script,
                                                                   int default_slots);

}  // namespace trainrun::launcher
