#include "trainrun/launcher/host_access.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "posix/resolve_on_path.h"
#include "remote/agent_connector.h"
#include "remote/host_access.h"
#include "slurm/srun_host_channel.h"
#include "ssh/ssh_host_channel.h"
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
  if (UsesSlurm(spec)) return slurm::MakeSrunHostChannel();
  return ssh::MakeSshHostChannel(SshOptionsFor(spec));
}

}  // namespace remote

std::string DescribeHostAccess(const LaunchSpec& spec, const hostfile::HostSpec& host) {
  if (IsLocalHost(host.host)) return remote::UsesSlurm(spec) ? "local" : "local (no SSH)";
  return remote::MakeHostChannel(spec)->Describe(
      host, remote::AgentCommand(remote::RemoteTrainrunPath(spec)));
}

}  // namespace trainrun::launcher
