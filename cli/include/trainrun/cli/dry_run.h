// --dry-run: the plan as a table, one row per rank, and nothing started.
//
//   trainrun: dry run: 3 ranks on 2 hosts; nothing is started
//   HOST  RANK  LOCAL_RANK  CROSS_RANK  COMMAND
//   a     0     0           0           python train.py --lr 0.1
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "trainrun/launcher/launch_spec.h"

namespace trainrun::cli {

// PrintPlan writes `spec`'s plan to `out`: a summary line, then host, rank, local_rank,
// cross_rank and the command of every rank, then the -x variables and output directory if any.
void PrintPlan(const launcher::LaunchSpec& spec, std::ostream& out);

}  // namespace trainrun::cli
