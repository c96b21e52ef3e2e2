// CPU binding (mpirun's --bind-to core|socket): which CPUs each local rank may run on.
//
// A pure decision (CpusForRank) over a topology read once from sysfs (ReadCpuTopology), restricted
// to the CPUs trainrun itself may use (a cgroup, taskset or Slurm step limit is kept). The rank's
// shim applies the set with sched_setaffinity before it execs the command (rank_shim.h), on this
// host and, through the agent, on remote hosts.
//
//   CpuTopology topology = ReadCpuTopology();
//   std::vector<int> cpus = CpusForRank(topology, BindTo::kCore, local_rank, local_size);
//   // {} for BindTo::kNone: the rank inherits trainrun's affinity
#pragma once

#include <string>
#include <vector>

#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// CpuTopology is this host's usable CPUs, grouped into physical cores (hardware threads that share
// a core together) and sockets, in the order of their first CPU.
struct CpuTopology {
  struct Core {
    int socket = 0;         // index into the sockets, in order of appearance
    std::vector<int> cpus;  // its hardware threads
  };
  std::vector<Core> cores;
  int sockets = 0;
};

// ReadCpuTopology reads the CPUs this process may run on (sched_getaffinity) and groups them by
// /sys/devices/system/cpu/cpuN/topology/{physical_package_id,core_id}; a CPU without topology files
// is a core of its own on socket 0.
CpuTopology ReadCpuTopology();

// CpusForRank returns the CPUs of local rank `local_rank` of `local_size`:
//   kNone:   {} (no binding).
//   kCore:   core `local_rank` (all its hardware threads): disjoint cores while local_size is at
//            most the number of cores; beyond that, ranks wrap around and share (oversubscribed).
//   kSocket: one socket, the ranks spread over the sockets in blocks (ranks 0..k-1 on the first).
std::vector<int> CpusForRank(const CpuTopology& topology, BindTo bind_to, int local_rank,
                             int local_size);

// CpuListString writes CPUs as Linux writes Cpus_allowed_list: "0-3,8,10-11".
std::string CpuListString(std::vector<int> cpus);

// DescribeBinding is --report-bindings' words for one rank: "to core 1 (cpus 1)", "to socket 0
// (cpus 0-7)", or "to nothing (any cpu this host allows: 0-15)" for kNone.
std::string DescribeBinding(const CpuTopology& topology, BindTo bind_to, int local_rank,
                            int local_size);

}  // namespace trainrun::launcher
