#include "ssh/ssh_host_channel.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ssh/remote_channel.h"

namespace trainrun::launcher::ssh {
namespace {

class SshHostChannel final : public channel::HostChannel {
 public:
  explicit SshHostChannel(SshOptions options) : options_(std::move(options)) {}

  std::string Describe(const hostfile::HostSpec& host,
                       const std::string& agent_command) const override {
    absl::StatusOr<SshTarget> target = ResolveSshTarget(host.user, host.host, options_);
    if (!target.ok()) return std::string(target.status().message());
    std::string keys =
        target->identity_files.empty()
            ? "ssh-agent only"
            : absl::StrCat(
                  target->default_identities ? "ssh-agent, then default keys " : "ssh-agent, then ",
                  absl::StrJoin(target->identity_files, ", "));
    return absl::StrCat("ssh ", target->user, "@", target->hostname, " port ", target->port, " (",
                        SshClientName(options_.client), ", host keys ",
                        HostKeyPolicyName(options_.host_key_policy), "), keys: ", keys,
                        "; agent: ", agent_command);
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string& agent_command,
             absl::Time deadline, channel::StreamCallback on_stream) override {
    // Every host's configuration first: a mistake there fails the start before any connection.
    std::vector<SshTarget> targets;
    for (size_t i = 0; i < hosts.size(); ++i) {
      absl::StatusOr<SshTarget> target = ResolveSshTarget(hosts[i].user, hosts[i].host, options_);
      if (!target.ok()) {
        on_stream(static_cast<int>(i), target.status());
        for (size_t j = 0; j < hosts.size(); ++j) {
          if (j != i) on_stream(static_cast<int>(j), absl::CancelledError("another host failed"));
        }
        return;
      }
      targets.push_back(*std::move(target));
    }
    SshOptions bounded = options_;
    bounded.connect_timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    for (size_t i = 0; i < targets.size(); ++i) {
      if (options_.client == SshClient::kOpenssh) {
        // `ssh` is a child that dies with the thread that forked it (PR_SET_PDEATHSIG), so it is
        // forked here, on the caller's thread, which outlives the job; it connects in the
        // background, so this costs no parallelism.
        on_stream(static_cast<int>(i), OpenOpensshCommand(targets[i], agent_command, bounded));
      } else {
        std::thread([i, target = targets[i], agent_command, bounded, on_stream] {
          on_stream(static_cast<int>(i), OpenLibssh2Command(target, agent_command, bounded));
        }).detach();
      }
    }
  }

 private:
  const SshOptions options_;
};

}  // namespace

std::unique_ptr<channel::HostChannel> MakeSshHostChannel(SshOptions options) {
  return std::make_unique<SshHostChannel>(std::move(options));
}

}  // namespace trainrun::launcher::ssh
