#include "trainrun/rendezvous/server.h"

#include <grpcpp/grpcpp.h>
#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
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

  absl::Status Listen();
  void Shutdown();

  std::string address() const {
    return internal::JoinHostPort(
        options_.advertise_host.empty() ? options_.bind_address : options_.advertise_host, port_);
  }
  int port() const { return port_; }
  internal::Membership& membership() { return membership_; }
  internal::RendezvousState& state() { return state_; }

 private:
  const ServerOptions options_;
  internal::Membership membership_;
  internal::RendezvousState state_;
  internal::Service service_;
  int port_ = 0;
  std::unique_ptr<internal::Listener> listener_;
  std::unique_ptr<grpc::Server> server_;
  std::thread deadline_thread_;
  std::atomic<bool> shut_down_{false};
};

absl::Status Server::Impl::Listen() {
  grpc::ServerBuilder builder;
  const std::string listen = internal::JoinHostPort(options_.bind_address, options_.port);
  // Our own listener accepts and hands connections to gRPC (see listener.h). It never sets
  // SO_REUSEPORT: two jobs must not share a fixed port silently.
  absl::StatusOr<std::unique_ptr<internal::Listener>> listener = internal::Listener::Bind(
      options_.bind_address, options_.port, options_.limits.max_connections + options_.ranks.size(),
      internal::Listener::AdmissionFor(options_.ranks.size()));
  if (listener.ok()) {
    listener_ = *std::move(listener);
    port_ = listener_->port();
    service_.SetOnProven(
        [listener = listener_.get()](const std::string& peer) { listener->Proven(peer); });
  }
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
  // With TLS (tls.h) connections reach gRPC through an acceptor with the job's credentials.
  absl::StatusOr<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> tls = nullptr;
  if (options_.tls) {
    tls = internal::AddTlsAcceptor(builder, options_.token);
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                               static_cast<int>(internal::Listener::kTlsHandshakeTimeout.count()));
  }
  if (!tls.ok()) return tls.status();
  if (listener_ != nullptr) server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    listener_.reset();
    return absl::UnavailableError(absl::StrCat(
        "the rendezvous server cannot listen on ", listen,
        options_.port != 0 ? "; the port may be in use: choose another with --rendezvous-port"
                           : "; check --rendezvous-addr"));
  }
  listener_->Start(server_.get(), *std::move(tls));
  deadline_thread_ = std::thread([this] { state_.RunDeadlines(); });
  return absl::OkStatus();
}

void Server::Impl::Shutdown() {
  if (shut_down_.exchange(true)) return;
  state_.Shutdown();  // fails the waiting calls and ends RunDeadlines
  if (listener_ != nullptr) listener_->Stop();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (deadline_thread_.joinable()) deadline_thread_.join();
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
