#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "trainrun/collectives/errors.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::internal {
namespace {

using ::trainrun::internal::MakeMessage;

std::string ErrnoText(int error) { return std::strerror(error); }

// Waits for `events` on `fd` within `limit`; returns false at its deadline. `what` names the wait
// in an InterruptedError.
bool PollOne(int fd, short events, const WaitLimit& limit, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(limit.Slice().count(), 1 << 30));
    int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n == 0) {
      if (!limit.interruptible() || Clock::now() >= limit.deadline) return false;
      limit.Poll(what);
      continue;
    }
    if (errno != EINTR) throw IoError(MakeMessage("poll failed: ", ErrnoText(errno)));
  }
}

void SetBuffers(int fd, int buffer_bytes) {
  if (buffer_bytes <= 0) return;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
}

std::string HostOf(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
                sizeof text);
  } else if (address->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
                sizeof text);
  }
  return text;
}

std::string InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw IoError(MakeMessage("cannot list network interfaces: ", ErrnoText(errno)));
  }
  std::string v4, v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || name != it->ifa_name) continue;
    if (it->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = HostOf(it->ifa_addr);
    if (it->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) v6 = HostOf(it->ifa_addr);
    }
  }
  ::freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  throw InvalidArgumentError(
      MakeMessage("network interface '", name, "' (", env::kNetworkInterface.name,
                  ") has no IPv4 or IPv6 address on this host; pick one that `ip addr` lists"));
}

// The local address the kernel would use to reach host:port (a UDP connect sends nothing).
std::string RouteTo(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), host_port.substr(colon + 1).c_str(), &hints, &found) != 0) {
    return "";
  }
  std::string local;
  for (addrinfo* it = found; it != nullptr && local.empty(); it = it->ai_next) {
    Fd fd(::socket(it->ai_family, SOCK_DGRAM, 0));
    if (!fd.valid() || ::connect(fd.get(), it->ai_addr, it->ai_addrlen) != 0) continue;
    sockaddr_storage me{};
    socklen_t length = sizeof me;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&me), &length) == 0) {
      local = HostOf(reinterpret_cast<sockaddr*>(&me));
    }
  }
  ::freeaddrinfo(found);
  return local;
}

}  // namespace

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SocketAddress SocketAddress::FromHost(const std::string& host, int port) {
  SocketAddress out;
  auto* in4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (::inet_pton(AF_INET, host.c_str(), &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(port));
    out.length = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    out.length = sizeof(sockaddr_in6);
  } else {
    throw InvalidArgumentError(MakeMessage("'", host, "' is not a numeric IPv4 or IPv6 address"));
  }
  return out;
}

SocketAddress SocketAddress::Parse(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    throw InvalidArgumentError(MakeMessage("'", text, "' is not an address of the form host:port"));
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return FromHost(host, std::stoi(text.substr(colon + 1)));
}

std::string SocketAddress::ToString() const {
  const auto* address = reinterpret_cast<const sockaddr*>(&storage);
  if (address->sa_family == AF_INET6) {
    return MakeMessage("[", HostOf(address),
                       "]:", ntohs(reinterpret_cast<const sockaddr_in6*>(address)->sin6_port));
  }
  return MakeMessage(HostOf(address), ":",
                     ntohs(reinterpret_cast<const sockaddr_in*>(address)->sin_port));
}

std::string ChooseListenHost(const std::string& requested) {
  if (!requested.empty()) return requested;
  std::string interface = env::kNetworkInterface.Get();
  if (!interface.empty()) return InterfaceAddress(interface);
  if (std::optional<std::string> rendezvous = env::Lookup(env::kRendezvousAddr)) {
    std::string local = RouteTo(*rendezvous);
    if (!local.empty()) return local;
  }
  return "127.0.0.1";
}

Fd Listen(const std::string& host, int buffer_bytes, SocketAddress* bound) {
  SocketAddress address = SocketAddress::FromHost(host, 0);
  Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw IoError(MakeMessage("socket() failed: ", ErrnoText(errno)));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  SetBuffers(fd.get(), buffer_bytes);  // inherited by accepted sockets, before the window is set
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address.storage), address.length) != 0) {
    throw IoError(MakeMessage("cannot listen on ", host, ": ", ErrnoText(errno)));
  }
  if (::listen(fd.get(), 1024) != 0) {
    throw IoError(MakeMessage("listen() on ", host, " failed: ", ErrnoText(errno)));
  }
  bound->length = sizeof bound->storage;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->length);
  return fd;
}

Fd Connect(const SocketAddress& address, int buffer_bytes, const WaitLimit& limit) {
  auto asked = Clock::now();
  for (;;) {
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) throw IoError(MakeMessage("socket() failed: ", ErrnoText(errno)));
    SetBuffers(fd.get(), buffer_bytes);
    int error = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) !=
        0) {
      error = errno;
      if (error == EINPROGRESS) {
        if (!PollOne(fd.get(), POLLOUT, limit, "connecting")) {
          throw TimeoutError(MakeMessage("timed out connecting to ", address.ToString()));
        }
        socklen_t length = sizeof error;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    if (error == 0) return fd;
    const auto now = Clock::now();
    if ((error != ECONNREFUSED && error != EAGAIN) || now >= limit.deadline) {
      throw IoError(MakeMessage("cannot connect to ", address.ToString(), ": ", ErrnoText(error)));
    }
    // Refused again: the peer is not listening (yet, or any more).
    if (now - asked >= kInterruptCheck) {
      asked = now;
      limit.Poll("connecting");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void ConfigureDataSocket(int fd, int buffer_bytes) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SetBuffers(fd, buffer_bytes);
}

void ReadFull(int fd, void* data, size_t bytes, const WaitLimit& limit) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw IoError("connection closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!PollOne(fd, POLLIN, limit, "reading")) throw TimeoutError("timed out reading");
    } else if (errno != EINTR) {
      throw IoError(ErrnoText(errno));
    }
  }
}

void WriteFull(int fd, const void* data, size_t bytes, const WaitLimit& limit) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!PollOne(fd, POLLOUT, limit, "writing")) throw TimeoutError("timed out writing");
    } else if (n < 0 && errno != EINTR) {
      throw IoError(ErrnoText(errno));
    }
  }
}

std::string PeerName(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "unknown";
  SocketAddress out;
  out.storage = address;
  out.length = length;
  return out.ToString();
}

}  // namespace trainrun::collectives::internal
