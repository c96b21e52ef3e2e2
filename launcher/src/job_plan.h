// The first phase of a job (launcher.cc): what runs where, decided before anything starts — which
// hosts are this machine and which are reached through a HostChannel, the job's environment, and
// the command, resolved once so that a missing one is reported once.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posix/resolve_on_path.h"
#include "trainrun/launcher/cpu_binding.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

struct JobPlan {
  std::vector<int> remote_hosts;    // indices into spec.plan.hosts that are not this machine
  std::vector<bool> rank_is_local;  // by rank
  JobEnvironment environment;
  posix::Executable executable;  // the command on the job's PATH (what local ranks exec)
  // --network-interface's IPv4 address here, for the rendezvous to bind ("" when not given, or
  // when --rendezvous-addr says where to bind).
  std::string interface_address;
  // This host's CPUs (--bind-to, --report-bindings, the oversubscription warning).
  CpuTopology cpus;
  // The ranks' working directory (-wdir, absolute); "" when they run in trainrun's.
  std::string working_dir;

  bool any_local() const;
  bool is_remote(int host_index) const;
};

// PlanJob checks `spec` and plans it. Errors: an empty command or plan, an unknown
// --network-interface, a bad -x (InvalidArgument); a command that cannot be executed on this host
// when ranks run here (NotFound, "cannot execute 'NAME': REASON"); a -wdir that is not a directory
// here when ranks run here (InvalidArgument). A relative command path ("./train.sh") is found in
// -wdir when one is given, as mpirun does.
absl::StatusOr<JobPlan> PlanJob(const LaunchSpec& spec);

}  // namespace trainrun::launcher
