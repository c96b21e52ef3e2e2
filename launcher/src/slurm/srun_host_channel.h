// Slurm's HostChannel: inside an allocation, each host's agent is one job step,
// `srun -u -N1 -n1 -w HOST --kill-on-bad-exit=1 ... sh -c 'trainrun --agent'`, whose stdin and
// stdout carry the agent protocol. No SSH anywhere.
//
// Facts that shaped it (Slurm 22.05): one srun per node, because srun's stdin goes to every task of
// a step; `-u`, because slurmstepd otherwise holds a partial line back (the protocol's frames are
// binary); under `-u` the task's stdout is a pty, already raw (every byte value passes), which the
// agent accepts inside a step (SLURM_STEP_ID); --overlap, so the steps may share the allocation's
// CPUs with each other and with the ranks. scancel, a node failure and the step's time limit end
// the step, so its stream ends, which the launcher reports as that host lost.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "channel/host_channel.h"

namespace trainrun::launcher::slurm {

std::unique_ptr<channel::HostChannel> MakeSrunHostChannel();

// AllocationEnded says why this Slurm allocation (SLURM_JOB_ID) ended, when it did: "Slurm job 7
// reached its time limit (TimeLimit=00:01:00)", "... was cancelled (scancel)", "a node of Slurm job
// 7 failed"; "" while it runs, outside Slurm, or when scontrol cannot tell within 2 s. While the
// job still runs, asks again every 250 ms for up to `settle` (the controller records a node's
// failure a moment after the steps end).
std::string AllocationEnded(absl::Duration settle = absl::ZeroDuration());

}  // namespace trainrun::launcher::slurm
