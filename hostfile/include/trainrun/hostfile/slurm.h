// Hosts of a Slurm allocation, from the variables Slurm sets in a job step:
//
//   SLURM_JOB_NODELIST=node[01-03,07],gpu5   SLURM_TASKS_PER_NODE=2(x3),1,1
//
//   auto hosts = trainrun::hostfile::SlurmHosts("node[01-03,07],gpu5", "2(x3),1,1");
//   // node01:2 node02:2 node03:2 node07:1 gpu5:1
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::hostfile {

// ExpandSlurmNodelist expands Slurm's compressed host list: comma separated names, each with any
// number of bracketed groups of numbers and ranges (`rack[1-2]-n[01-04,09]`); a range keeps the
// zero padding of its first bound. Errors (InvalidArgument): unbalanced brackets, an empty name,
// a reversed or malformed range, more than 65536 hosts.
absl::StatusOr<std::vector<std::string>> ExpandSlurmNodelist(absl::string_view nodelist);

// ExpandSlurmTasksPerNode expands `2(x3),1` to {2, 2, 2, 1}. Counts are checked as slot counts.
absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view tasks_per_node);

// SlurmHosts pairs the expanded node list with the tasks per node (1 each when `tasks_per_node`
// is omitted). Errors name the variable at fault, including a count that does not match the nodes.
absl::StatusOr<std::vector<HostSpec>> SlurmHosts(absl::string_view nodelist,
                                                 std::optional<absl::string_view> tasks_per_node);

}  // namespace trainrun::hostfile
