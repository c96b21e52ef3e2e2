#include "job_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "network_interface.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {

bool JobPlan::any_local() const {
  return std::find(rank_is_local.begin(), rank_is_local.end(), true) != rank_is_local.end();
}

bool JobPlan::is_remote(int host_index) const {
  return std::find(remote_hosts.begin(), remote_hosts.end(), host_index) != remote_hosts.end();
}

absl::StatusOr<JobPlan> PlanJob(const LaunchSpec& spec) {
  if (spec.command.empty()) {
    return absl::InvalidArgumentError(
        "no command given; put it after trainrun's flags, e.g. `trainrun -np 2 python3 train.py`");
  }
  if (spec.plan.size() == 0) return absl::InvalidArgumentError("the slot plan has no ranks");
  std::vector<int> remote_hosts;
  for (size_t i = 0; i < spec.plan.hosts.size(); ++i) {
    // Per-node mode: host 0 is this node (node 0); the others join it (nodes/node_join.h).
    const bool remote = spec.per_node ? i > 0 : !IsLocalHost(spec.plan.hosts[i].host);
    if (remote) remote_hosts.push_back(static_cast<int>(i));
  }
  std::vector<bool> rank_is_local(spec.plan.size(), true);
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    if (std::count(remote_hosts.begin(), remote_hosts.end(), a.host_index)) {
      rank_is_local[a.rank] = false;
    }
  }
  // --network-interface: the rendezvous binds that interface's address here, and every worker
  // gets TRAINRUN_NETWORK_INTERFACE (its data plane listens on that interface of its own host);
  // passed as an -x the user's own -x can still override.
  std::string interface_address;
  LaunchSpec job_spec = spec;
  if (!spec.network_interfaces.empty()) {
    if (spec.rendezvous_addr.empty()) {
      absl::StatusOr<std::string> address = NetworkInterfaceAddress(spec.network_interfaces[0]);
      if (!address.ok()) return address.status();
      interface_address = *address;
    }
    job_spec.exported.insert(job_spec.exported.begin(),
                             {env::kNetworkInterface.name, spec.network_interfaces[0]});
  }
  absl::StatusOr<JobEnvironment> environment =
      JobEnvironment::Create(job_spec, CurrentEnvironment());
  if (!environment.ok()) return environment.status();
  std::string command = spec.command[0];
  if (!spec.working_dir.empty() && command.find('/') != std::string::npos && command[0] != '/') {
    command = absl::StrCat(spec.working_dir, "/", command);
  }
  posix::Executable executable =
      posix::ResolveOnPath(command, environment->Lookup(env::kPath).value_or(posix::kDefaultPath));
  JobPlan plan{std::move(remote_hosts), std::move(rank_is_local),     *std::move(environment),
               std::move(executable),   std::move(interface_address), ReadCpuTopology(),
               spec.working_dir};
  if (!plan.working_dir.empty() && plan.any_local()) {
    struct stat st {};
    const char* problem = ::stat(plan.working_dir.c_str(), &st) != 0 ? std::strerror(errno)
                          : !S_ISDIR(st.st_mode)                     ? "not a directory"
                                                                     : nullptr;
    if (problem != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("-wdir ", plan.working_dir, ": ", problem,
                                                     "; give an existing directory for the ranks"));
    }
  }
  if (plan.executable.error != 0 && plan.any_local()) {
    // Reported once, before anything starts; trainrun exits 127 through ExitCodeFor, as a shell.
    return absl::NotFoundError(absl::StrCat("cannot execute '", spec.command[0],
                                            "': ", std::strerror(plan.executable.error)));
  }
  return plan;
}

}  // namespace trainrun::launcher
