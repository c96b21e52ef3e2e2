// Sockets for the TCP transport: an owning file descriptor, addresses, and deadline-bounded
// connect/read/write used while connections are being set up.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "wait_limit.h"

namespace trainrun::collectives::internal {

// Fd owns a file descriptor and closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

// SocketAddress is an IPv4 or IPv6 address with a port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  // Parse reads "1.2.3.4:port" or "[::1]:port"; throws InvalidArgumentError.
  static SocketAddress Parse(const std::string& text);
  // FromHost makes an address of a numeric host and a port; throws InvalidArgumentError.
  static SocketAddress FromHost(const std::string& host, int port);
  // ToString writes the form Parse reads.
  std::string ToString() const;
};

// ChooseListenHost returns the numeric address to listen on: `requested` when not empty, else the
// address of TRAINRUN_NETWORK_INTERFACE, else the local address routing to
// TRAINRUN_RENDEZVOUS_ADDR, else 127.0.0.1.
std::string ChooseListenHost(const std::string& requested);

// Listen opens a non-blocking listening socket on `host` with a kernel-chosen port.
Fd Listen(const std::string& host, int buffer_bytes, SocketAddress* bound);

// Connect opens a non-blocking connection to `address`, retrying refused attempts until the
// limit's deadline; throws IoError, TimeoutError or InterruptedError (wait_limit.h).
Fd Connect(const SocketAddress& address, int buffer_bytes, const WaitLimit& limit);

// ConfigureDataSocket sets non-blocking mode, TCP_NODELAY and (when > 0) the buffer sizes.
void ConfigureDataSocket(int fd, int buffer_bytes);

// ReadFull / WriteFull move exactly `bytes` bytes or throw: IoError on a closed or failed socket,
// TimeoutError at the limit's deadline, InterruptedError when its interrupt says so.
void ReadFull(int fd, void* data, size_t bytes, const WaitLimit& limit);
void WriteFull(int fd, const void* data, size_t bytes, const WaitLimit& limit);

// PeerName describes the remote end of a connected socket ("127.0.0.1:4242") for log lines.
std::string PeerName(int fd);

}  // namespace trainrun::collectives::internal
