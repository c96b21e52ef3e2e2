// --config-file FILE: horovodrun's YAML config (params, autotune, timeline, stall_check,
// library_options, logging: each key maps to the trainrun flag of the same meaning) and a
// RiseML-style job file (hosts, processes_per_host, num_proc, environment, command), in one file or
// two kinds of keys in the same one. The file is read into trainrun flags; ParseRunArgs puts
// them before the command line's own, so that a flag on the command line overrides the file.
//
//   # job.yaml
//   hosts: [server1, server2]
//   processes_per_host: 4
//   environment:
//     NCCL_DEBUG: INFO
//   command: python train.py --lr 0.1
//   params:
//     fusion_threshold_mb: 32
//   stall_check:
//     warning_time_seconds: 120
//
// The file is read by yaml-cpp, so any YAML does: comments, quoting, block and flow lists and
// mappings, anchors and aliases, merge keys (`<<: *defaults`). trainrun's keys go two levels deep
// (`section: {key: value}`); a value deeper than that, or YAML yaml-cpp refuses, is an error
// naming the file and the line.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainrun::cli {

struct ConfigFile {
  // Each entry is one flag with its value, if any: {"--fusion-threshold-mb", "32"},
  // {"--hierarchical-allreduce"}, {"-x", "NCCL_DEBUG=INFO"}.
  std::vector<std::vector<std::string>> flags;
  std::vector<std::string> command;  // `command:`; empty when the file has none
  // Keys accepted that change nothing in trainrun, one line each saying why.
  std::vector<std::string> notes;
};

// ParseConfigFile reads `text`, the contents of the file named `path` (for messages). Errors
// (InvalidArgument, one sentence naming the file, the line and the key): an unknown key, a value of
// the wrong kind, invalid YAML (with yaml-cpp's column and reason), `controller: mpi`.
absl::StatusOr<ConfigFile> ParseConfigFile(absl::string_view text, const std::string& path);

// ReadConfigFile reads and parses the file at `path`; a file that cannot be read is an
// InvalidArgument naming it.
absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& path);

}  // namespace trainrun::cli
