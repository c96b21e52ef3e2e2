#include "trainrun/launcher/host_access.h"

#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nodes/node_join.h"
#include "posix/resolve_on_path.h"
#include "remote/agent_connector.h"
#include "remote/host_access.h"
#include "remote/trainrun_probe.h"
#include "slurm/srun_host_channel.h"
#include "ssh/ssh_host_channel.h"
#include "trainrun/hostfile/host_list.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace remote {
namespace {

std::string SelfExecutable() {
  char path[4096] = {};
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, n) : std::string("trainrun");
}

}  // namespace

ssh::SshOptions SshOptionsFor(const LaunchSpec& spec) {
  ssh::SshOptions options;
  options.client = spec.ssh_client;
  options.host_key_policy = spec.ssh_host_key_checking;
  options.port = spec.ssh_port;
  options.identity_file = spec.ssh_identity_file;
  options.connect_timeout = absl::FromChrono(spec.start_timeout);
  return options;
}

std::string RemoteTrainrunPath(const LaunchSpec& spec) {
  return spec.remote_trainrun.empty() ? SelfExecutable() : spec.remote_trainrun;
}

bool UsesSlurm(const LaunchSpec& spec) {
  if (spec.launcher == Launcher::kSlurm) return true;
  return spec.launcher == Launcher::kAuto && spec.hosts_from_slurm &&
         posix::ResolveOnPath(
             "srun", ::trainrun::env::Lookup(::trainrun::env::kPath).value_or(posix::kDefaultPath))
                 .error == 0;
}

std::unique_ptr<channel::HostChannel> MakeHostChannel(const LaunchSpec& spec) {
  if (spec.per_node) return nodes::MakeNodeJoinChannel(*spec.per_node, spec.start_timeout);
  if (UsesSlurm(spec)) return slurm::MakeSrunHostChannel();
  return ssh::MakeSshHostChannel(SshOptionsFor(spec));
}

std::string SchedulerEnded(const LaunchSpec& spec, bool settle) {
  return UsesSlurm(spec) ? slurm::AllocationEnded(settle ? absl::Seconds(3) : absl::ZeroDuration())
                         : "";
}

}  // namespace remote

std::string DescribeHostAccess(const LaunchSpec& spec, const hostfile::HostSpec& host) {
  if (IsLocalHost(host.host)) return remote::UsesSlurm(spec) ? "local" : "local (no SSH)";
  return remote::MakeHostChannel(spec)->Describe(
      host, remote::AgentCommand(remote::RemoteTrainrunPath(spec)));
}

std::vector<std::string> ProbeRemoteTrainrun(const LaunchSpec& spec) {
  std::vector<hostfile::HostSpec> hosts;
  std::set<std::string> seen;
  for (const hostfile::HostSpec& host : spec.plan.hosts) {
    if (!IsLocalHost(host.host) && seen.insert(hostfile::HostLabel(host)).second) {
      hosts.push_back(host);
    }
  }
  if (hosts.empty()) return {};
  const std::string trainrun = remote::RemoteTrainrunPath(spec);
  std::vector<absl::StatusOr<std::string>> found =
      remote::ProbeTrainrun(*remote::MakeHostChannel(spec), hosts, trainrun,
                            absl::Now() + absl::FromChrono(spec.start_timeout));
  std::vector<std::string> lines;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string label = hostfile::HostLabel(hosts[i]);
    if (!found[i].ok()) {
      // The reasons name the host already; the line starts with it once.
      absl::string_view reason = found[i].status().message();
      absl::ConsumePrefix(&reason, absl::StrCat("host ", hosts[i].host, ": "));
      lines.push_back(absl::StrCat(label, ": ", reason));
      continue;
    }
    const std::string release = found[i]->substr(0, found[i]->find('\n'));
    const std::string gpu = release.size() < found[i]->size()
                                ? absl::StrCat("; ", found[i]->substr(release.size() + 1))
                                : std::string();
    if (release == remote::TrainrunRelease()) {
      lines.push_back(
          absl::StrCat(label, ": trainrun ", release, " at ", trainrun, ", as here", gpu));
    } else {
      lines.push_back(absl::StrCat(label, ": trainrun ", release, " at ", trainrun,
                                   ", but this is trainrun ", remote::TrainrunRelease(), gpu));
    }
  }
  return lines;
}

}  // namespace trainrun::launcher
