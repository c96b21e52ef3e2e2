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

// SocketRemoteAddress is the numeric address of a connected socket's peer ("" on failure).
std::string SocketRemoteAddress(int fd);

// RouteAddresses are both ends of the route toward a host, numeric ("" when unknown).
struct RouteAddresses {
  std::string local;   // the address this machine would use toward the host
  std::string remote;  // the host's address that `hostname` resolved to
};

// RouteToHost resolves `hostname` (waiting no longer than `deadline`) and finds the route toward
// its first address by connecting a UDP socket, which sends nothing.
RouteAddresses RouteToHost(const std::string& hostname, absl::Time deadline);

// FormatHostPort writes "host:port", bracketing IPv6 addresses.
std::string FormatHostPort(const std::string& host, int port);

}  // namespace trainrun::launcher::ssh
