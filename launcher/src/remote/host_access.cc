#include "trainrun/launcher/host_access.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "remote/agent_connector.h"
#include "remote/remote_ranks.h"
#include "trainrun/launcher/local_host.h"

namespace trainrun::launcher {
namespace remote {
namespace {

std::string SelfExecutable() {
  char path[4096] = {};
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, n) : std::string("trainrun");
}

}  // namespace

absl::StatusOr<ssh::SshOptions> SshOptionsFor(const LaunchSpec& spec) {
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

}  // namespace remote

std::string DescribeHostAccess(const LaunchSpec& spec, const hostfile::HostSpec& host) {
  using remote::AgentCommand;
  using remote::RemoteTrainrunPath;
  using remote::SshOptionsFor;
  if (IsLocalHost(host.host)) return "local (no SSH)";
  auto options = SshOptionsFor(spec);
  if (!options.ok()) return std::string(options.status().message());
  auto target = ssh::ResolveSshTarget(host.user, host.host, *options);
  if (!target.ok()) return std::string(target.status().message());
  std::string keys = target->identity_files.empty()
                         ? "ssh-agent only"
                         : absl::StrCat(target->default_identities ? "ssh-agent, then default keys "
                                                                   : "ssh-agent, then ",
                                        absl::StrJoin(target->identity_files, ", "));
  return absl::StrCat("ssh ", target->user, "@", target->hostname, " port ", target->port, " (",
                      options->client == ssh::SshClient::kOpenssh ? "openssh" : "libssh2",
                      ", host keys ", ssh::HostKeyPolicyName(options->host_key_policy),
                      "), keys: ", keys, "; agent: ", AgentCommand(RemoteTrainrunPath(spec)));
}

}  // namespace trainrun::launcher
