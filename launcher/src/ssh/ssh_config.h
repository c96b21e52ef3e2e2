// How a remote host is reached: the subset of OpenSSH's client configuration that people rely on
// (Host patterns, HostName, User, Port, IdentityFile), merged with trainrun's own flags.
//
//   SshOptions options;                       // -p, -i, --ssh-strict-host-key-checking, ...
//   auto target = ResolveSshTarget("root", "h1", options);
//   // target->hostname, target->user, target->port, target->identity_files
//
// Precedence is OpenSSH's: `user@host` and the command-line flags win over ~/.ssh/config, and
// within the config the first value found for a keyword wins (IdentityFile accumulates).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher::ssh {

// The SSH choices of a launch are the LaunchSpec's (trainrun/launcher/launch_spec.h).
using launcher::HostKeyPolicy;
using launcher::HostKeyPolicyName;
using launcher::ParseHostKeyPolicy;
using launcher::ParseSshClient;
using launcher::SshClient;

// SshOptions are trainrun's SSH flags and where the user's SSH files are.
struct SshOptions {
  SshClient client = kDefaultSshClient;
  // -p/--ssh-port: overrides Port from the config (as `ssh -p` does).
  std::optional<int> port;
  // -i/--ssh-identity-file: tried before the config's IdentityFile entries.
  std::optional<std::string> identity_file;
  HostKeyPolicy host_key_policy = kDefaultHostKeyPolicy;
  // The directory holding config, known_hosts and the default keys. Empty: $HOME/.ssh (or the
  // passwd entry's home when HOME is unset). Tests point it at a temporary directory.
  std::string ssh_dir;
  // Bound on resolving, connecting, the SSH handshake and authentication, per host.
  absl::Duration connect_timeout = absl::FromChrono(kDefaultStartTimeout);
  // The `ssh` binary for SshClient::kOpenssh.
  std::string ssh_binary = "ssh";
};

// SshTarget is one host, fully resolved: everything needed to open a session to it.
struct SshTarget {
  std::string alias;     // the name as the user wrote it (-H, hostfile)
  std::string hostname;  // what to connect to: HostName from the config, else the alias
  std::string user;
  int port = 22;
  // Keys to try after the agent's, in order: -i, then the config's IdentityFile entries; when both
  // are absent, OpenSSH's defaults in the SSH directory (id_ed25519, id_ecdsa, id_rsa).
  std::vector<std::string> identity_files;
  bool default_identities = false;  // identity_files are the defaults (none were named)
  std::string known_hosts_file;
  std::string config_file;  // the config that was read ("" when there is none)
};

// SshDirectory returns options.ssh_dir, or the user's ~/.ssh.
std::string SshDirectory(const SshOptions& options);

// LocalUserName is the name of the user running trainrun (the default remote user).
std::string LocalUserName();

// ResolveSshTarget reads `<ssh dir>/config` (when present) and resolves `alias` for
// `user_from_spec` (the `user@` part, "" when absent). A malformed config is an InvalidArgument
// naming FILE:LINE.
absl::StatusOr<SshTarget> ResolveSshTarget(const std::string& user_from_spec,
                                           const std::string& alias, const SshOptions& options);

// ResolveSshTargetFromText is ResolveSshTarget over config text, for tests; `config_name` names it
// in messages, and `home` expands `~` and `%d`.
absl::StatusOr<SshTarget> ResolveSshTargetFromText(absl::string_view config_text,
                                                   const std::string& config_name,
                                                   const std::string& user_from_spec,
                                                   const std::string& alias,
                                                   const SshOptions& options,
                                                   const std::string& home);

// MatchHostPattern is OpenSSH's pattern match: `*` and `?` wildcards, case-insensitive.
bool MatchHostPattern(absl::string_view pattern, absl::string_view host);

}  // namespace trainrun::launcher::ssh
