#include "trainrun/rendezvous/server.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "listener.h"
#include "membership.h"
#include "rendezvous_state.h"
#include "service.h"
#include "tls.h"
#include "wire.h"

namespace trainrun::rendezvous {
namespace {

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// PrivateDirectory makes a fresh directory only this user can enter (mkdtemp: mode 0700) under
// $TMPDIR, else /tmp (also where $TMPDIR would make the socket's path too long for sockaddr_un).
// "" when none can be made.
std::string PrivateDirectory() {
  std::string base = "/tmp";
  if (const char* tmp = getenv("TMPDIR"); tmp != nullptr && tmp[0] == '/' && strlen(tmp) < 64) {
    base = tmp;
  }
  std::string path = base + "/trainrun-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) return "";
  return path;
}

}  // namespace

// Impl is one job's rendezvous as it runs: the ranks (Membership), the store (RendezvousState) and
// its deadline thread, and the gRPC service (Service) behind our own listener (listener.h).
class Server::Impl {
 public:
  explicit Impl(ServerOptions options)
      : options_(std::move(options)),
        membership_(options_.ranks),
        state_(options_.limits, membership_, &internal::Service::WrapAnswer),
        service_(options_, membership_, state_) {}
  ~Impl() { Shutdown(); }

  // Listen binds the TCP port (and the local socket, whose plain-text server it builds), then has
  // the listener build the TCP port's server (BuildNetwork) on its thread, which Ready waits for.
  absl::Status Listen();
  void Configure(grpc::ServerBuilder& builder);
  absl::StatusOr<internal::Listener::Target> BuildNetwork();
  absl::Status Ready();
  void Shutdown();
  // RemoveSocket removes the local socket and its directory, if any.
  void RemoveSocket();

  std::string address() const {
    return internal::JoinHostPort(
        options_.advertise_host.empty() ? options_.bind_address : options_.advertise_host, port_);
  }
  int port() const { return port_; }
  const std::string& socket_path() const { return socket_path_; }
  internal::Membership& membership() { return membership_; }
  internal::RendezvousState& state() { return state_; }

 private:
  const ServerOptions options_;
  internal::Membership membership_;
  internal::RendezvousState state_;
  internal::Service service_;
  int port_ = 0;
  std::string socket_dir_;   // ServerOptions::local_socket's private directory, "" without one
  std::string socket_path_;  // and the socket in it
  std::unique_ptr<internal::Listener> listener_;
  std::unique_ptr<internal::Listener> local_listener_;  // on socket_path_
  std::unique_ptr<grpc::Server> local_server_;          // local_listener_'s
  std::unique_ptr<grpc::Server> server_;  // the TCP port's, set by BuildNetwork under build_mutex_
  bool network_on_demand_ = false;
  std::mutex build_mutex_;
  std::condition_variable build_done_;
  bool built_ = false;
  absl::Status build_status_;
  std::thread deadline_thread_;
  std::atomic<bool> shut_down_{false};
};

absl::Status Server::Impl::Listen() {
  const std::string listen = internal::JoinHostPort(options_.bind_address, options_.port);
  // Our own listener accepts and hands connections to gRPC (see listener.h). It never sets
  // SO_REUSEPORT: two jobs must not share a fixed port silently.
  absl::StatusOr<std::unique_ptr<internal::Listener>> listener = internal::Listener::Bind(
      options_.bind_address, options_.port, options_.limits.max_connections + options_.ranks.size(),
      internal::Listener::AdmissionFor(options_.ranks.size()));
  if (!listener.ok() || (*listener)->port() == 0) {
    return absl::UnavailableError(absl::StrCat(
        "the rendezvous server cannot listen on ", listen,
        options_.port != 0 ? "; the port may be in use: choose another with --rendezvous-port"
                           : "; check --rendezvous-addr"));
  }
  listener_ = *std::move(listener);
  port_ = listener_->port();
  if (options_.local_socket) {
    // The ranks on this machine: plain text on a socket in a directory only this user can enter
    // (ServerOptions::local_socket), behind a listener of its own as the TCP port is.
    socket_dir_ = PrivateDirectory();
    if (!socket_dir_.empty()) {
      socket_path_ = socket_dir_ + "/rendezvous";
      absl::StatusOr<std::unique_ptr<internal::Listener>> local = internal::Listener::BindUnix(
          socket_path_, options_.limits.max_connections + options_.ranks.size(),
          internal::Listener::AdmissionFor(options_.ranks.size()));
      if (local.ok()) {
        local_listener_ = *std::move(local);
      } else {
        RemoveSocket();  // the ranks here then dial the TCP port, as remote ones do
      }
    }
  }
  service_.SetOnProven([this](const std::string& peer) {
    listener_->Proven(peer);
    if (local_listener_ != nullptr) local_listener_->Proven(peer);
  });
  if (local_listener_ != nullptr) {
    // Plain text, no port of gRPC's own: quick to build, so the ranks here are served at once.
    grpc::ServerBuilder builder;
    Configure(builder);
    local_server_ = builder.BuildAndStart();
    if (local_server_ == nullptr) {
      local_listener_.reset();
      RemoveSocket();
    } else {
      local_listener_->Start(local_server_.get());
    }
  }
  deadline_thread_ = std::thread([this] { state_.RunDeadlines(); });
  // The TCP port's server (with TLS, OpenSSL's context and the job's certificate: milliseconds)
  // is built on the listener's thread: at once, overlapping the ranks' start, whose connections
  // wait in the backlog meanwhile; or, when every rank dials the local socket, only if a
  // connection ever arrives there.
  network_on_demand_ = options_.network_on_demand && local_server_ != nullptr;
  listener_->StartOnDemand([this] { return BuildNetwork(); }, options_.tls, !network_on_demand_);
  return absl::OkStatus();
}

void Server::Impl::Configure(grpc::ServerBuilder& builder) {
  builder.RegisterService(&service_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      options_.limits.max_value_bytes + options_.limits.max_key_bytes +
      options_.limits.max_keys_per_get * (options_.limits.max_key_bytes + 8) + 4096));
  builder.SetMaxSendMessageSize(static_cast<int>(options_.limits.max_response_bytes + 4096));
  // Notice a worker whose host vanished without closing its connection.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  // Per connection and call, what the server never uses (grpc_store.cc's NewChannel says the
  // same for the clients): channelz's registry and traces, and HTTP/2 bandwidth probes.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CHANNEL_TRACE_EVENT_MEMORY_PER_NODE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

absl::StatusOr<internal::Listener::Target> Server::Impl::BuildNetwork() {
  internal::Listener::Target target;
  absl::Status status = [&]() -> absl::Status {
    grpc::ServerBuilder builder;
    Configure(builder);
    // With TLS (tls.h) connections reach gRPC through an acceptor with the job's credentials.
    if (options_.tls) {
      absl::StatusOr<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> tls =
          internal::AddTlsAcceptor(builder, options_.token);
      if (!tls.ok()) return tls.status();
      target.tls = *std::move(tls);
      builder.AddChannelArgument(
          GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
          static_cast<int>(internal::Listener::kTlsHandshakeTimeout.count()));
    }
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (server == nullptr) return absl::InternalError("the rendezvous server did not start (gRPC)");
    target.server = server.get();
    std::lock_guard<std::mutex> lock(build_mutex_);
    server_ = std::move(server);
    return absl::OkStatus();
  }();
  std::lock_guard<std::mutex> lock(build_mutex_);
  build_status_ = status;
  built_ = true;
  build_done_.notify_all();
  if (!status.ok()) return status;
  return target;
}

absl::Status Server::Impl::Ready() {
  if (network_on_demand_) return absl::OkStatus();  // the ranks' socket is served already
  std::unique_lock<std::mutex> lock(build_mutex_);
  build_done_.wait(lock, [this] { return built_; });
  return build_status_;
}

void Server::Impl::Shutdown() {
  if (shut_down_.exchange(true)) return;
  state_.Shutdown();                            // fails the waiting calls and ends RunDeadlines
  if (listener_ != nullptr) listener_->Stop();  // after BuildNetwork, if it had begun
  if (local_listener_ != nullptr) local_listener_->Stop();
  if (local_server_ != nullptr) {
    local_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (deadline_thread_.joinable()) deadline_thread_.join();
  RemoveSocket();
}

void Server::Impl::RemoveSocket() {
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
  if (!socket_dir_.empty()) rmdir(socket_dir_.c_str());
  socket_path_.clear();
  socket_dir_.clear();
}

// --- Server --------------------------------------------------------------------------------------

absl::StatusOr<std::string> RandomToken() {
  unsigned char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t got = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot draw a job token from getrandom(2): ", std::strerror(errno)));
    }
    filled += static_cast<size_t>(got);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError("the rendezvous server needs a job token");
  }
  if (options.ranks.empty()) {
    return absl::InvalidArgumentError("the rendezvous server needs at least one rank");
  }
  if (options.advertise_host.empty() && IsWildcard(options.bind_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rendezvous server binds '", options.bind_address,
        "', which workers cannot dial; give the address they should use (--rendezvous-addr)"));
  }
  std::set<std::pair<std::string, int>> seen;
  for (size_t r = 0; r < options.ranks.size(); ++r) {
    if (!seen.insert({options.ranks[r].host, options.ranks[r].local_rank}).second) {
      return absl::InvalidArgumentError(absl::StrCat("ranks share host '", options.ranks[r].host,
                                                     "' and local_rank ",
                                                     options.ranks[r].local_rank));
    }
  }
  internal::QuietAbseilMutexes();
  internal::RaiseFdLimit();
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }
std::string Server::address() const { return impl_->address(); }
int Server::port() const { return impl_->port(); }
std::string Server::socket_path() const { return impl_->socket_path(); }
absl::Status Server::Ready() { return impl_->Ready(); }
void Server::NoteRankExit(int rank, const std::string& how) {
  impl_->membership().NoteExit(rank, how);
}
std::vector<RankState> Server::Ranks() const { return impl_->membership().Ranks(); }
int Server::AddRanks(const std::vector<RankSlot>& slots) {
  return impl_->membership().AddRanks(slots);
}
std::vector<int> Server::JoinedRanks() const {
  std::vector<int> joined;
  std::vector<RankState> ranks = Ranks();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].joined) joined.push_back(static_cast<int>(r));
  }
  return joined;
}
std::vector<PeerFailure> Server::PeerFailures() const { return impl_->membership().PeerFailures(); }
std::map<std::string, std::string> Server::ValuesWithPrefix(const std::string& prefix) const {
  return impl_->state().ValuesWithPrefix(prefix);
}
size_t Server::WaitingCalls() const { return impl_->state().WaitingCalls(); }
absl::Status Server::Set(const std::string& key, const std::string& value) {
  return impl_->state().Set(key, value);
}
void Server::SetCounter(const std::string& key, int64_t value) {
  impl_->state().SetCounter(key, value);
}
void Server::Shutdown() { impl_->Shutdown(); }

}  // namespace trainrun::rendezvous
