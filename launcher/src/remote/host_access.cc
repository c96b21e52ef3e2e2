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
#include "rsh/rsh_host_channel.h"
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

// JoinedHost: JoinedHostChannel's channel.
class JoinedHost final : public channel::HostChannel {
 public:
  explicit JoinedHost(std::unique_ptr<channel::HostStream> stream) : stream_(std::move(stream)) {}

  std::string Describe(const hostfile::HostSpec& host, const std::string&) const override {
    return absl::StrCat(host.host, " joined by itself");
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string&, absl::Time,
             channel::StreamCallback on_stream) override {
    if (hosts.size() != 1 || !stream_) {
      for (size_t i = 0; i < hosts.size(); ++i) {
        on_stream(static_cast<int>(i), absl::InternalError("no stream for this host"));
      }
      return;
    }
    on_stream(0, std::move(stream_));
  }

 private:
  std::unique_ptr<channel::HostStream> stream_;
};

}  // namespace

std::shared_ptr<channel::HostChannel> JoinedHostChannel(
    std::unique_ptr<channel::HostStream> stream) {
  return std::make_shared<JoinedHost>(std::move(stream));
}

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
  if (spec.launcher == Launcher::kRsh) return rsh::MakeRshHostChannel(spec.rsh_agent);
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

std::vector<std::string> DescribeHostsAccess(const LaunchSpec& spec) {
  std::vector<std::string> lines;
  lines.reserve(spec.plan.hosts.size());
  std::unique_ptr<channel::HostChannel> channel;
  const std::string agent = remote::AgentCommand(remote::RemoteTrainrunPath(spec));
  for (const hostfile::HostSpec& host : spec.plan.hosts) {
    if (IsLocalHost(host.host)) {
      lines.emplace_back(remote::UsesSlurm(spec) ? "local" : "local (no SSH)");
      continue;
    }
    if (!channel) channel = remote::MakeHostChannel(spec);
    lines.push_back(channel->Describe(host, agent));
  }
  return lines;
}

namespace {

// ProbeLine says in one line what host `label`'s probe found.
std::string ProbeLine(const hostfile::HostSpec& host, const std::string& trainrun,
                      const absl::StatusOr<std::string>& found) {
  const std::string label = hostfile::HostLabel(host);
  if (!found.ok()) {
    // The reasons name the host already; the line starts with it once.
    absl::string_view reason = found.status().message();
    absl::ConsumePrefix(&reason, absl::StrCat("host ", host.host, ": "));
    return absl::StrCat(label, ": ", reason);
  }
  const std::string release = found->substr(0, found->find('\n'));
  const std::string gpu = release.size() < found->size()
                              ? absl::StrCat("; ", found->substr(release.size() + 1))
                              : std::string();
  if (release == remote::TrainrunRelease()) {
    return absl::StrCat(label, ": trainrun ", release, " at ", trainrun, ", as here", gpu);
  }
  return absl::StrCat(label, ": trainrun ", release, " at ", trainrun, ", but this is trainrun ",
                      remote::TrainrunRelease(), gpu);
}

}  // namespace

std::vector<std::string> ProbeRemoteTrainrun(
    const LaunchSpec& spec, const std::function<void(const std::string& line)>& on_line) {
  std::vector<hostfile::HostSpec> hosts;
  std::set<std::string> seen;
  for (const hostfile::HostSpec& host : spec.plan.hosts) {
    if (!IsLocalHost(host.host) && seen.insert(hostfile::HostLabel(host)).second) {
      hosts.push_back(host);
    }
  }
  if (hosts.empty()) return {};
  const std::string trainrun = remote::RemoteTrainrunPath(spec);
  std::vector<char> told(hosts.size(), 0);  // written under the probe's lock, read after it
  remote::ProbeCallback tell;
  if (on_line) {
    tell = [&](int i, const absl::StatusOr<std::string>& found) {
      told[i] = 1;
      on_line(ProbeLine(hosts[i], trainrun, found));
    };
  }
  std::vector<absl::StatusOr<std::string>> found =
      remote::ProbeTrainrun(*remote::MakeHostChannel(spec), hosts, trainrun,
                            absl::Now() + absl::FromChrono(spec.start_timeout), tell);
  std::vector<std::string> lines;
  for (size_t i = 0; i < hosts.size(); ++i) {
    lines.push_back(ProbeLine(hosts[i], trainrun, found[i]));
    // Hosts that never answered are said at the end.
    if (on_line && !told[i]) on_line(lines.back());
  }
  return lines;
}

}  // namespace trainrun::launcher
