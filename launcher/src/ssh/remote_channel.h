// RemoteChannel: a command running on another host, reached over SSH, seen as a byte stream (its
// stdin and stdout) — the SSH implementations of the HostChannel seam's HostStream. The launcher
// speaks the agent protocol over it; which SSH client carries it (in-process libssh2, or the system
// `ssh` binary) is chosen by SshOptions::client.
//
//   auto target = ResolveSshTarget("", "h1", options);
//   auto channel = OpenRemoteCommand(*target, "/usr/bin/trainrun --agent", options);
//   if (!channel.ok()) { /* one line: host and reason */ }
//   (*channel)->Write("hello", absl::Seconds(5));
//   char buf[4096];
//   auto n = (*channel)->Read(buf, sizeof buf, absl::Seconds(5));  // 0: the command's stdout ended
//
// Read and Write may be called from two threads at once (one reader, one writer); everything else
// from one thread. Destroying the channel closes the connection, which makes the remote agent tear
// down its ranks.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "channel/host_channel.h"
#include "ssh/ssh_config.h"

namespace trainrun::launcher::ssh {

// RemoteChannel is the SSH clients' HostStream (channel/host_channel.h): Read, Write, Interrupt,
// CloseStdin, EndStatus, LocalAddress, RemoteAddress.
using RemoteChannel = channel::HostStream;

// OpenRemoteCommand connects to `target` and starts `command` there, within
// options.connect_timeout. Its errors are one line naming the host and the reason: name not
// resolved, connection refused, timed out, host key mismatch or unknown, authentication failed
// (with the RSA/SHA-1 explanation where that is the cause).
//
// With SshClient::kOpenssh the connection is made by `ssh` in the background: failures then appear
// as Read returning 0 or an error, and EndStatus says what they were.
absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenRemoteCommand(const SshTarget& target,
                                                                 const std::string& command,
                                                                 const SshOptions& options);

// OpenLibssh2Command and OpenOpensshCommand are the two implementations behind OpenRemoteCommand.
absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenLibssh2Command(const SshTarget& target,
                                                                  const std::string& command,
                                                                  const SshOptions& options);
absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenOpensshCommand(const SshTarget& target,
                                                                  const std::string& command,
                                                                  const SshOptions& options);

}  // namespace trainrun::launcher::ssh
