#include "listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
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

Admission::Limits Listener::AdmissionFor(size_t ranks) {
  Admission::Limits limits;
  rlimit files{};
  const size_t half = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                          ? static_cast<size_t>(files.rlim_cur) / 2
                          : 65536;
  limits.total = std::max<size_t>(64, std::min(1024 + ranks, half));
  // One address (a flood from one host) may hold three quarters: others still get in.
  limits.per_address = std::max<size_t>(ranks, limits.total * 3 / 4);
  return limits;
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& host_in, int port,
                                                         size_t max_connections,
                                                         Admission::Limits admission) {
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
    return std::unique_ptr<Listener>(new Listener(fd, bound_port, max_connections, admission));
  }
  freeaddrinfo(found);
  return absl::UnavailableError(why);
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::BindUnix(const std::string& path,
                                                             size_t max_connections,
                                                             Admission::Limits admission) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::UnavailableError(absl::StrCat("the socket path '", path, "' is too long"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(std::strerror(errno));
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 4096) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", path, "': ", std::strerror(error)));
  }
  return std::unique_ptr<Listener>(new Listener(fd, 0, max_connections, admission));
}

Listener::Listener(int fd, int port, size_t max_connections, Admission::Limits admission)
    : fd_(fd),
      port_(port),
      max_connections_(max_connections),
      admission_("the rendezvous", admission,
                 [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Listener::~Listener() { Stop(); }

void Listener::Start(grpc::Server* server,
                     std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tls) {
  server_ = server;
  tls_ = std::move(tls);
  tls_mode_ = tls_ != nullptr;
  thread_ = std::thread([this] { Run(); });
}

void Listener::StartOnDemand(std::function<absl::StatusOr<Target>()> make, bool tls, bool eager) {
  make_ = std::move(make);
  tls_mode_ = tls;
  eager_ = eager;
  thread_ = std::thread([this] { Run(); });
}

bool Listener::MakeServer() {
  if (server_ != nullptr) return true;
  if (!make_) return false;
  absl::StatusOr<Target> made = make_();
  make_ = nullptr;
  if (!made.ok()) {
    std::fprintf(stderr, "trainrun rendezvous: %s\n", std::string(made.status().message()).c_str());
    return false;
  }
  server_ = made->server;
  tls_ = std::move(made->tls);
  return server_ != nullptr;
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

void Listener::Proven(const std::string& peer) {
  std::lock_guard<std::mutex> lock(proven_mutex_);
  if (!proven_peers_.insert(peer).second) return;
  newly_proven_.push_back(peer);
}

std::string Listener::PeerName(int fd) const {
  // A channel given as plain text is named by its fd (grpc_server_add_channel_from_fd); one given
  // to the TLS acceptor by its peer's address, as grpc_sockaddr_to_uri writes it.
  if (!tls_mode_) return absl::StrCat("fd:", fd);
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "";
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, a->sin6_addr.s6_addr + 12, sizeof(v4));
      inet_ntop(AF_INET, &v4, text, sizeof(text));
      return absl::StrCat("ipv4:", text, ":", ntohs(a->sin6_port));
    }
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return absl::StrCat("ipv6:[", text, "]:", ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
  inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return absl::StrCat("ipv4:", text, ":", ntohs(a->sin_port));
}

namespace {

// PeerAddress is the address part of a peer name ("ipv4:10.0.0.7:5000" -> "10.0.0.7"): the
// per-address cap counts connections from one host, whatever their ports.
std::string PeerAddress(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = "?";
  if (peer.ss_family == AF_UNIX) return "local";
  if (peer.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr, text,
              sizeof(text));
  } else {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

void Listener::TakeProven() {
  std::vector<std::string> proven;
  {
    std::lock_guard<std::mutex> lock(proven_mutex_);
    proven.swap(newly_proven_);
  }
  for (const std::string& peer : proven) {
    auto by_peer = unproven_by_peer_.find(peer);
    if (by_peer == unproven_by_peer_.end()) continue;
    auto it = unproven_.find(by_peer->second);
    unproven_by_peer_.erase(by_peer);
    if (it == unproven_.end()) continue;
    admission_.Proven(it->first);
    proven_.push_back(std::move(it->second));
    unproven_.erase(it);
  }
}

void Listener::CloseUnproven(uint64_t id) {
  auto it = unproven_.find(id);
  if (it == unproven_.end()) return;
  // gRPC sees the end of the stream and closes its fd (and its own state for it) itself.
  shutdown(it->second.fd, SHUT_RDWR);
  unproven_by_peer_.erase(it->second.peer);
  unproven_.erase(it);
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
  TakeProven();
  // Forgets the unproven connections whose fd gRPC closed (the number may already be reused).
  for (auto it = unproven_.begin(); it != unproven_.end();) {
    if (InodeOf(it->second.fd) == it->second.inode) {
      ++it;
      continue;
    }
    admission_.Closed(it->first);
    unproven_by_peer_.erase(it->second.peer);
    it = unproven_.erase(it);
  }
  for (uint64_t late : admission_.Expired(now)) CloseUnproven(late);
  if (!all) return;
  std::vector<std::string> gone;
  for (size_t i = 0; i < proven_.size();) {
    if (InodeOf(proven_[i].fd) == proven_[i].inode) {
      ++i;
      continue;
    }
    gone.push_back(std::move(proven_[i].peer));
    proven_[i] = std::move(proven_.back());
    proven_.pop_back();
  }
  if (!gone.empty()) {
    std::lock_guard<std::mutex> lock(proven_mutex_);
    for (const std::string& peer : gone) proven_peers_.erase(peer);
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
  if (eager_) MakeServer();
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
        if (unproven_.size() + proven_.size() >= max_connections_) {
          Sweep(/*all=*/true);
          if (unproven_.size() + proven_.size() >= max_connections_) {
            close(fd);
            Refused("too many connections open at once");
            continue;
          }
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        Connection connection{fd, InodeOf(fd), Clock::now(), next_id_++, PeerName(fd)};
        {
          // A name seen before belonged to a connection now closed (an fd number or a port
          // reused): this one has proved nothing yet.
          std::lock_guard<std::mutex> lock(proven_mutex_);
          proven_peers_.erase(connection.peer);
        }
        if (auto old = unproven_by_peer_.find(connection.peer); old != unproven_by_peer_.end()) {
          admission_.Closed(old->second);
          unproven_.erase(old->second);
          unproven_by_peer_.erase(old);
        }
        for (uint64_t evicted :
             admission_.Admit(connection.id, PeerAddress(fd), connection.accepted)) {
          CloseUnproven(evicted);
        }
        unproven_by_peer_[connection.peer] = connection.id;
        unproven_.emplace(connection.id, std::move(connection));
        accepted.push_back(fd);
      }
    }
    if (given < accepted.size() && !MakeServer()) {
      for (; given < accepted.size(); ++given) close(accepted[given]);  // nothing to serve them
    }
    for (int batch = 0; batch < 32 && given < accepted.size(); ++batch) {
      const int fd = accepted[given++];
      if (tls_ != nullptr) {
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
        connection.listener_fd = fd_;
        connection.fd = fd;
        tls_->HandleNewConnection(&connection);
      } else {
        grpc::AddInsecureChannelFromFd(server_, fd);
      }
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
