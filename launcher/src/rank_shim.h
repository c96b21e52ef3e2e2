// The rank shim: the small supervisor process between trainrun and one rank's command.
//
// Why a process of its own, rather than Boost.Process: no Boost.Process version can make a process
// a child subreaper, set PR_SET_PDEATHSIG, put the command in a new session/process group without
// racing, or report an exec failure as an errno; and a process group alone does not stop a
// grandchild that left the group, nor anything at all once trainrun is SIGKILLed. The shim does:
//
//   trainrun ──clone+exec──▶ trainrun-rank-shim (own process group, PR_SET_CHILD_SUBREAPER,
//                            │                      PR_SET_PDEATHSIG=SIGUSR1)
//                            └──vfork──▶ command (own process group, PR_SET_PDEATHSIG=SIGKILL,
//                                                 execve)
//
//   The shim is its own static executable (rank_shim_main.cc), started by ShimSpawn
//   (shim_spawn.h) without copying trainrun; where it is not installed, or with
//   TRAINRUN_RANK_SHIM=fork, RunRankShim runs in a fork() of trainrun instead, with the same
//   guarantees.
//
//   * SIGTERM to the shim: relayed to the command's process group (the job's teardown).
//   * SIGUSR1 to the shim, or trainrun's death (PDEATHSIG): SIGKILL to the group and to every
//     process that was reparented to the shim, repeated until it has no children left.
//   * The command exits: the same SIGKILL sweep of whatever it left behind, so nothing a rank
//     started outlives it; the shim then writes the command's wait status and exits.
//
// In the fork() case the shim is a fork of a possibly multithreaded process and never execs, so it
// uses only async-signal-safe system calls; everything it needs is prepared before the fork.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstdint>

namespace trainrun::launcher::internal {

// ShimRecord is what the shim writes on its status pipe: kStarted, then kExited or kExecFailed.
struct ShimRecord {
  enum Kind : int32_t { kStarted = 1, kExited = 2, kExecFailed = 3 };
  int32_t kind;
  int32_t value;    // kStarted: the command's pid; kExited: its wait status; kExecFailed: errno
  int64_t time_ns;  // CLOCK_MONOTONIC when it happened
};

// ShimArgs is everything the shim needs, prepared before the fork.
struct ShimArgs {
  const char* executable;
  char* const* argv;
  char* const* envp;
  int stdin_fd;   // becomes fd 0 (an open fd, e.g. /dev/null)
  int stdout_fd;  // becomes fd 1
  int stderr_fd;  // becomes fd 2
  int status_fd;  // ShimRecords go here
  pid_t parent;   // trainrun's pid, to detect that it died before PR_SET_PDEATHSIG took effect
  const cpu_set_t* cpus;  // the command's CPU affinity (--bind-to); nullptr: inherited
  const char* cwd;        // the command's working directory (--wdir); nullptr: inherited
};

// The signal trainrun sends a shim to end its rank at once (and the shim's PDEATHSIG).
inline constexpr int kShimKillSignal = 10;  // SIGUSR1, checked in rank_shim.cc

// RunRankShim is the shim's whole life: trainrun-rank-shim's main, or the child right after fork().
// Never returns.
[[noreturn]] void RunRankShim(const ShimArgs& args);

}  // namespace trainrun::launcher::internal
