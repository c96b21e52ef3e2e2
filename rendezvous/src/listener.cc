#include "listener.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainrun::rendezvous::internal {
namespace {

using Clock = std::chrono::steady_clock;

// Refusals logged one by one; after that only every 1000th, so a flood cannot flood the console.
constexpr size_t kMaxLoggedRefusals = 3;

ino_t InodeOf(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

}  // namespace

size_t RaiseFdLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<size_t>(limit.rlim_cur);
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& host_in, int port,
                                                         size_t max_connections) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int error =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(error)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // not SO_REUSEPORT
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 4096) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      why = std::strerror(errno);
      close(fd);
      continue;
    }
    freeaddrinfo(found);
    int bound_port = bound.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return std::unique_ptr<Listener>(new Listener(fd, bound_port, max_connections));
  }
  freeaddrinfo(found);
  return absl::UnavailableError(why);
}

Listener::Listener(int fd, int port, size_t max_connections)
    : fd_(fd),
      port_(port),
      max_connections_(max_connections),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Listener::~Listener() { Stop(); }

void Listener::Start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Run(); });
}

void Listener::Stop() {
  stop_ = true;
  if (wake_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (wake_ >= 0) close(wake_);
  wake_ = -1;
}

void Listener::Refused(const char* why) {
  ++refused_;
  if (refused_ <= kMaxLoggedRefusals || refused_ % 1000 == 0) {
    std::fprintf(stderr, "trainrun rendezvous: refused a connection (%zu so far): %s\n", refused_,
                 why);
  }
}

void Listener::Sweep(bool all) {
  const Clock::time_point now = Clock::now();
  // Forgets the connections of `list` whose fd gRPC closed (the number may already be reused).
  auto forget_closed = [](std::vector<Connection>& list, size_t& i) {
    if (InodeOf(list[i].fd) == list[i].inode) return false;
    list[i] = list.back();
    list.pop_back();
    return true;
  };
  for (size_t i = 0; i < quiet_.size();) {
    if (forget_closed(quiet_, i)) continue;
    Connection& c = quiet_[i];
    tcp_info info{};
    socklen_t length = sizeof(info);
    if (getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &info, &length) == 0 &&
        length >= offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
      c.spoke = info.tcpi_bytes_received > 0;
    } else {
      c.spoke = true;  // cannot tell: leave it to gRPC
    }
    if (!c.spoke && now - c.accepted >= kSilentTimeout) {
      // gRPC sees the end of the stream and closes its fd; a later sweep forgets it.
      shutdown(c.fd, SHUT_RDWR);
      c.spoke = true;
    }
    if (c.spoke) {
      spoken_.push_back(c);
      quiet_[i] = quiet_.back();
      quiet_.pop_back();
      continue;
    }
    ++i;
  }
  if (!all) return;
  for (size_t i = 0; i < spoken_.size();) {
    if (!forget_closed(spoken_, i)) ++i;
  }
}

void Listener::Run() {
  Clock::time_point next_sweep = Clock::now();
  Clock::time_point next_full_sweep = next_sweep;
  Clock::time_point rest_until{};
  // Connections accepted but not yet given to gRPC. The loop empties the kernel's accept queue
  // (a few microseconds a connection) before giving a few to gRPC (tens of microseconds each), so
  // thousands of workers connecting at once wait here rather than overflow the queue, whose
  // dropped connections their kernels would retry only a second or more later.
  std::vector<int> accepted;
  size_t given = 0;
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    if (now >= next_sweep) {
      const bool all = now >= next_full_sweep;
      Sweep(all);
      next_sweep = now + std::chrono::milliseconds(100);
      if (all) next_full_sweep = now + kSpokenSweepPeriod;
    }
    // The eventfd ends the wait at once when Stop() is called (a job's end waits for this thread).
    pollfd p[2] = {{now >= rest_until ? fd_ : -1, POLLIN, 0}, {wake_, POLLIN, 0}};
    const bool waiting = given < accepted.size();
    if (poll(p, 2, waiting ? 0 : 50) > 0 && (p[0].revents & POLLIN) != 0) {
      for (int batch = 0; batch < 4096 && !stop_; ++batch) {
        int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // Out of descriptors: the connection waits in the backlog; try again shortly, once
            // gRPC or the sweep has closed some.
            Refused("out of file descriptors; accepting again in 100 ms");
            rest_until = Clock::now() + std::chrono::milliseconds(100);
            next_sweep = next_full_sweep = Clock::now();
          }
          break;
        }
        if (quiet_.size() + spoken_.size() >= max_connections_) {
          Sweep(/*all=*/true);
          if (quiet_.size() + spoken_.size() >= max_connections_) {
            close(fd);
            Refused("too many connections open at once");
            continue;
          }
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        quiet_.push_back(Connection{fd, InodeOf(fd), Clock::now()});
        accepted.push_back(fd);
      }
    }
    for (int batch = 0; batch < 32 && given < accepted.size(); ++batch) {
      grpc::AddInsecureChannelFromFd(server_, accepted[given++]);
    }
    if (given == accepted.size()) {
      accepted.clear();
      given = 0;
    }
  }
  // Stopped: the connections gRPC never got are closed here.
  for (; given < accepted.size(); ++given) close(accepted[given]);
}

}  // namespace trainrun::rendezvous::internal
