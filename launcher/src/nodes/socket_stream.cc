#include "nodes/socket_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nodes/node_join.h"

namespace trainrun::launcher::nodes {

std::string NumericAddress(int fd, bool peer) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  int got = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length)
                 : ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&address)->sin_addr, text, sizeof text);
  } else if (address.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<sockaddr_in6*>(&address)->sin6_addr;
    // An IPv4 peer of the dual-stack listener is named as IPv4 (ranks dial it, MASTER_ADDR).
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      ::inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &v6, text, sizeof text);
    }
  }
  return text;
}

absl::StatusOr<std::unique_ptr<SocketStream>> SocketStream::Create(
    posix::UniqueFd fd, std::string name, std::shared_ptr<void> keep_alive, int joined_slots,
    std::string seal_key, std::function<void()> on_end) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("cannot make a pipe: ", std::strerror(errno)));
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  std::unique_ptr<SocketStream> stream(new SocketStream(
      std::move(fd), posix::UniqueFd(pipe_fds[0]), posix::UniqueFd(pipe_fds[1]), std::move(name)));
  stream->keep_alive_ = std::move(keep_alive);
  stream->joined_slots_ = joined_slots;
  stream->seal_key_ = std::move(seal_key);
  stream->on_end_ = std::move(on_end);
  return stream;
}

SocketStream::~SocketStream() { Ended(); }

void SocketStream::Ended() {
  if (on_end_ && !ended_.exchange(true)) on_end_();
}

std::string SocketStream::Seal(const std::string& secret) const {
  return nodes::Seal(seal_key_, secret);
}

SocketStream::SocketStream(posix::UniqueFd fd, posix::UniqueFd wake_read,
                           posix::UniqueFd wake_write, std::string name)
    : fd_(std::move(fd)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)),
      name_(std::move(name)) {}

absl::Status SocketStream::Write(absl::string_view data, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!data.empty()) {
    ssize_t n = ::send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(name_, ": ", std::strerror(errno)));
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return absl::DeadlineExceededError(absl::StrCat(name_, ": cannot send"));
    pollfd p{fd_.get(), POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> SocketStream::Read(char* buffer, size_t size, absl::Duration timeout) {
  if (interrupted_) return absl::CancelledError("interrupted");
  pollfd p[2] = {{fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
  int ready = ::poll(p, 2, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (interrupted_) return absl::CancelledError("interrupted");
  if (ready == 0) return absl::DeadlineExceededError("nothing to read");
  if (ready < 0) {
    if (errno == EINTR) return absl::DeadlineExceededError("interrupted by a signal");
    return absl::InternalError(std::strerror(errno));
  }
  ssize_t n = ::recv(fd_.get(), buffer, size, 0);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) {
    end_ = absl::UnavailableError(absl::StrCat(name_, ": its trainrun closed the connection"));
    Ended();
    return 0;
  }
  if (errno == EAGAIN || errno == EINTR) return absl::DeadlineExceededError("nothing to read");
  end_ = absl::UnavailableError(
      absl::StrCat(name_, ": the connection failed: ", std::strerror(errno)));
  Ended();
  return end_;
}

void SocketStream::Interrupt() {
  interrupted_ = true;
  char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &byte, 1);
}

void SocketStream::CloseStdin() { ::shutdown(fd_.get(), SHUT_WR); }

absl::Status SocketStream::EndStatus() { return end_; }

std::string SocketStream::LocalAddress() const { return NumericAddress(fd_.get(), false); }

std::string SocketStream::RemoteAddress() const { return NumericAddress(fd_.get(), true); }

}  // namespace trainrun::launcher::nodes
