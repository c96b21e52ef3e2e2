#include "ssh/tcp_connect.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainrun::launcher::ssh {
namespace {

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

std::string NumericHost(const sockaddr* addr, socklen_t length) {
  char host[NI_MAXHOST];
  if (getnameinfo(addr, length, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

// getaddrinfo cannot be given a deadline, so it runs on its own thread and we stop waiting for it
// when the deadline passes; the thread finishes on its own and frees what it shares with us.
absl::StatusOr<std::vector<Address>> Resolve(const std::string& alias, const std::string& hostname,
                                             int socktype, absl::Time deadline) {
  struct Shared {
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    int rc = 0;
    std::vector<Address> addresses;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, hostname, socktype] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = socktype;
    addrinfo* result = nullptr;
    int rc = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
    std::vector<Address> addresses;
    for (addrinfo* ai = rc == 0 ? result : nullptr; ai != nullptr; ai = ai->ai_next) {
      Address a;
      std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
      a.length = ai->ai_addrlen;
      a.family = ai->ai_family;
      addresses.push_back(a);
    }
    if (result != nullptr) freeaddrinfo(result);
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->rc = rc;
    shared->addresses = std::move(addresses);
    shared->done = true;
    shared->done_cv.notify_all();
  }).detach();

  std::unique_lock<std::mutex> lock(shared->mu);
  if (!shared->done_cv.wait_until(lock, absl::ToChronoTime(deadline),
                                  [&] { return shared->done; })) {
    return absl::DeadlineExceededError(absl::StrCat(
        "host ", alias, ": timed out resolving the name '", hostname,
        "'; check the name in -H/--hostfile (or HostName in ~/.ssh/config) and DNS, or raise "
        "--start-timeout"));
  }
  if (shared->rc != 0 || shared->addresses.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "host ", alias, ": name not resolved: '", hostname, "' (", gai_strerror(shared->rc),
        "); check the name in -H/--hostfile, or HostName in ~/.ssh/config"));
  }
  return shared->addresses;
}

}  // namespace

std::string FormatHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& alias, const std::string& hostname, int port,
                                    absl::Time deadline) {
  auto addresses = Resolve(alias, hostname, SOCK_STREAM, deadline);
  if (!addresses.ok()) return addresses.status();

  // The most telling failure wins when every address fails: refused over unreachable.
  std::string last_reason = "no address to connect to";
  absl::StatusCode last_code = absl::StatusCode::kUnavailable;
  std::string where = FormatHostPort(hostname, port);
  for (Address& address : *addresses) {
    if (address.family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port = htons(port);
    } else if (address.family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port = htons(port);
    } else {
      continue;
    }
    where = FormatHostPort(
        NumericHost(reinterpret_cast<sockaddr*>(&address.storage), address.length), port);
    UniqueFd fd(::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) return absl::InternalError(absl::StrCat("socket(): ", std::strerror(errno)));
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&address.storage), address.length);
    int error = rc == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      int ready = wait_ms > 0 ? ::poll(&p, 1, static_cast<int>(wait_ms)) : 0;
      if (ready == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            "host ", alias, " (", where,
            "): timed out connecting; check that the host is up and reachable from here, or "
            "raise --start-timeout"));
      }
      socklen_t len = sizeof error;
      if (ready < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
        error = errno;
      }
    }
    if (error == 0) {
      int flags = ::fcntl(fd.get(), F_GETFL);
      ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      return fd;
    }
    if (error == ECONNREFUSED) {
      last_code = absl::StatusCode::kUnavailable;
      last_reason =
          "connection refused; check that sshd runs there and listens on that port "
          "(-p/--ssh-port, Port in ~/.ssh/config)";
      break;
    }
    last_reason =
        absl::StrCat(std::strerror(error), "; check that the host is up and reachable from here");
  }
  return absl::Status(last_code, absl::StrCat("host ", alias, " (", where, "): ", last_reason));
}

std::string SocketLocalAddress(int fd) {
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return "";
  return NumericHost(reinterpret_cast<sockaddr*>(&local), length);
}

std::string SocketRemoteAddress(int fd) {
  sockaddr_storage remote{};
  socklen_t length = sizeof remote;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &length) != 0) return "";
  return NumericHost(reinterpret_cast<sockaddr*>(&remote), length);
}

RouteAddresses RouteToHost(const std::string& hostname, absl::Time deadline) {
  auto addresses = Resolve(hostname, hostname, SOCK_DGRAM, deadline);
  if (!addresses.ok() || addresses->empty()) return {};
  Address& address = addresses->front();
  if (address.family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port = htons(9);
  } else if (address.family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port = htons(9);
  }
  UniqueFd fd(::socket(address.family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return {};
  // connect() on a UDP socket only picks the route and the source address; nothing is sent.
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address.storage), address.length) != 0) {
    return {};
  }
  return {SocketLocalAddress(fd.get()), SocketRemoteAddress(fd.get())};
}

}  // namespace trainrun::launcher::ssh
