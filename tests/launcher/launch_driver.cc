// launch_driver: a LaunchSpec from argv, then Launch — the launcher's tests (and its timing) run
// real jobs through this instead of the `trainrun` binary, which the cli module builds.
//
//   launch_driver [-np N] [-H host:slots,...] [--no-tag] [--no-pty] [--timestamp] [--oversubscribe]
//   [--quiet] [--output-filename DIR]
//                 [--grace-ms MS] [-x NAME[=VALUE]]... [--verbose] COMMAND ARGS...
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainrun/cli/run_main.h"
#include "trainrun/launcher/launcher.h"
#include "trainrun/launcher/logging.h"

namespace {

using trainrun::hostfile::HostSpec;
using trainrun::hostfile::RankAssignment;
using trainrun::hostfile::SlotPlan;

// Plan lays ranks out host-major, as DESIGN.md's rank layout says.
SlotPlan Plan(const std::vector<HostSpec>& hosts) {
  SlotPlan plan;
  plan.hosts = hosts;
  for (int h = 0; h < static_cast<int>(hosts.size()); ++h) {
    for (int l = 0; l < hosts[h].slots; ++l) {
      RankAssignment a;
      a.rank = plan.size();
      a.local_rank = l;
      a.local_size = hosts[h].slots;
      a.host_index = h;
      for (int other = 0; other < static_cast<int>(hosts.size()); ++other) {
        if (hosts[other].slots > l) {
          if (other < h) ++a.cross_rank;
          ++a.cross_size;
        }
      }
      plan.ranks.push_back(a);
    }
  }
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  trainrun::launcher::LaunchSpec spec;
  std::vector<HostSpec> hosts;
  int np = 1;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-np" && i + 1 < argc) {
      np = std::atoi(argv[++i]);
    } else if (arg == "-H" && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        std::string entry =
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        size_t colon = entry.rfind(':');
        HostSpec host;
        host.host = entry.substr(0, colon);
        host.slots = colon == std::string::npos ? 1 : std::atoi(entry.c_str() + colon + 1);
        hosts.push_back(host);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--no-tag") {
      spec.tag_output = false;
    } else if (arg == "--no-pty") {
      spec.stdout_pty = false;
    } else if (arg == "--quiet") {
      spec.quiet = true;
    } else if (arg == "--oversubscribe") {
      spec.oversubscribe = true;
    } else if (arg == "--timestamp") {
      spec.prefix_timestamp = true;
    } else if (arg == "--output-filename" && i + 1 < argc) {
      spec.output_dir = argv[++i];
    } else if (arg == "--grace-ms" && i + 1 < argc) {
      spec.grace_period = std::chrono::milliseconds(std::atoi(argv[++i]));
    } else if (arg == "-x" && i + 1 < argc) {
      std::string x = argv[++i];
      size_t eq = x.find('=');
      trainrun::launcher::ExportedVariable variable;
      variable.name = x.substr(0, eq);
      if (eq != std::string::npos) variable.value = x.substr(eq + 1);
      spec.exported.push_back(variable);
    } else if (arg == "--verbose") {
      trainrun::launcher::SetLogLevel(spdlog::level::debug);
    } else {
      break;
    }
  }
  if (hosts.empty()) {
    HostSpec local;
    local.host = "localhost";
    local.slots = np;
    hosts.push_back(local);
  }
  spec.plan = Plan(hosts);
  spec.command.assign(argv + i, argv + argc);
  absl::StatusOr<int> code = trainrun::launcher::Launch(spec);
  if (!code.ok()) {
    trainrun::launcher::Logger().error("{}", std::string(code.status().message()));
    return trainrun::cli::ExitCodeFor(code.status());  // as `trainrun` maps it
  }
  return *code;
}
