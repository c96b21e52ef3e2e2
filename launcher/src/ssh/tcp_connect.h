// Resolving a host name and opening a TCP connection to it, both bounded by a deadline, with
// failures as one line naming the host and the reason.
#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "posix/unique_fd.h"

namespace trainrun::launcher::ssh {

using posix::UniqueFd;

// ConnectTcp resolves `hostname` and connects to `port` on the first address that answers, all
// before `deadline`. Errors name `alias` (the host as the user wrote it) and say why: the name was
// not resolved, the connection was refused, the host was unreachable, or it timed out. The returned
// socket is blocking.
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& alias, const std::string& hostname, int port,
                                    absl::Time deadline);

// SocketLocalAddress is the numeric local address of a connected socket ("" on failure).
std::string SocketLocalAddress(int fd);

// RouteLocalAddress is the address this machine would use toward `hostname` (resolved without
// waiting longer than `deadline`), found by connecting a UDP socket, which sends nothing.
std::string RouteLocalAddress(const std::string& hostname, absl::Time deadline);

// FormatHostPort writes "host:port", bracketing IPv6 addresses.
std::string FormatHostPort(const std::string& host, int port);

}  // namespace trainrun::launcher::ssh
