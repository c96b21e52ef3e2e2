#include "trainrun/rendezvous/relay.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc_store.h"
#include "proto/rendezvous.pb.h"
#include "relay_wire.h"
#include "trainrun/rendezvous/admission.h"
#include "trainrun/rendezvous/environment.h"
#include "wire.h"

namespace trainrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using internal::RelayMethod;

// How often the loop looks for connections past the admission deadline while some are unproven.
constexpr std::chrono::milliseconds kAdmissionSweep{100};

// RelayAdmission: every rank of the host may connect at once (all peers are "local").
Admission::Limits RelayAdmission(int local_ranks) {
  Admission::Limits limits;
  limits.total = 1024 + static_cast<size_t>(std::max(local_ranks, 0));
  limits.per_address = limits.total;
  return limits;
}

constexpr char kJoinBatch[] = "/trainrun.rendezvous.proto.Rendezvous/JoinBatch";
constexpr char kAllgatherBatch[] = "/trainrun.rendezvous.proto.Rendezvous/AllgatherBatch";
constexpr char kBarrierBatch[] = "/trainrun.rendezvous.proto.Rendezvous/BarrierBatch";
constexpr char kSetBatch[] = "/trainrun.rendezvous.proto.Rendezvous/SetBatch";
constexpr char kHello[] = "/trainrun.rendezvous.proto.Rendezvous/Hello";
// How long the relay's Hello waits for the server (wait_for_ready: the launcher's server may still
// be starting). Should it fail, the ranks' first call connects anew and proves the token itself.
constexpr std::chrono::seconds kHelloTimeout{60};

// IsReport says whether a Set's body is a rank's monitor report, which the relay batches.
bool IsReport(const std::string& body, proto::SetRequest& request) {
  return request.ParseFromString(body) && absl::StartsWith(request.key(), env::kMonitorKeyPrefix);
}

// Flatten copies a ByteBuffer's slices into one string.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// SocketAddress fills `address` for `name` ("@abstract" or a path); returns its length, or 0 when
// the name does not fit.
socklen_t SocketAddress(const std::string& name, sockaddr_un& address) {
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  if (name.empty() || name.size() >= sizeof(address.sun_path)) return 0;
  std::memcpy(address.sun_path, name.data(), name.size());
  if (name[0] == '@') address.sun_path[0] = '\0';
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                (name[0] == '@' ? 0 : 1));
}

}  // namespace

namespace internal {
socklen_t RelaySocketAddress(const std::string& name, sockaddr_un& address) {
  return SocketAddress(name, address);
}
}  // namespace internal

class Relay::Impl {
 public:
  explicit Impl(RelayOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  absl::Status Listen();
  void Stop();
  const std::string& socket() const { return options_.socket; }
  int64_t upstream_calls() const { return upstream_calls_.load(); }
  bool WaitConnected(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    hello_done_.wait_for(lock, timeout, [this] { return hello_answered_; });
    return hello_answered_ && hello_ != nullptr && hello_->status.ok();
  }

 private:
  // One rank's call: where to answer it, and its request.
  struct Call {
    uint64_t connection = 0;
    uint32_t call_id = 0;
    RelayMethod method = RelayMethod::kHello;
    Clock::time_point deadline;
    std::string body;  // the serialized request, as the rank sent it
  };
  // A call to the server in flight: one rank's call, or a batch of several.
  struct Upstream {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::string method;  // the gRPC method's full name
    std::vector<Call> members;
  };
  // Calls of one kind waiting to go as a batch: Joins, or the calls of one Allgather or Barrier
  // (same name, count and timeout).
  struct Batch {
    std::vector<Call> members;
    Clock::time_point flush_at;
  };
  using BatchKey = std::tuple<std::string, int, int64_t>;
  struct Connection {
    int fd = -1;
    std::string in;
    std::string out;
    bool authenticated = false;
    bool closing = false;  // close once `out` is written
  };

  void Run();
  void Accept();
  void Read(uint64_t id);
  void Write(uint64_t id);
  void Close(uint64_t id);
  void Handle(uint64_t id, const internal::RelayRequest& request);
  void Reply(const Call& call, int code, std::string_view message, std::string_view body,
             std::string_view body2 = {});
  void Add(Batch& batch, Call call);
  void FlushDue(bool all);
  void Flush(RelayMethod method, const BatchKey* key, Batch& batch);
  void Send(std::string method, grpc::ByteBuffer request, std::vector<Call> members);
  // SayHello sends the Hello that proves the relay's connection (tls.h, listener.h) as soon as it
  // is up, so the server keeps it while the agent starts the ranks.
  void SayHello();
  void Finish(Upstream* upstream);
  void FinishJoins(Upstream& upstream);
  void FinishGather(Upstream& upstream);
  void FinishReports(Upstream& upstream);

  RelayOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> upstream_calls_{0};

  // The loop thread's own state.
  uint64_t next_connection_ = 2;  // 0: the listener, 1: the wake-up eventfd
  std::unordered_map<uint64_t, Connection> connections_;
  // Connections that have not said the token yet: closed at the deadline, capped (admission.h;
  // every peer of a Unix socket is "local").
  Admission admission_{"the rendezvous relay", RelayAdmission(options_.local_ranks)};
  Batch joins_;
  std::map<BatchKey, Batch> gathers_;
  std::map<BatchKey, Batch> barriers_;
  Batch reports_;  // monitor reports (Sets of env::kMonitorKeyPrefix<rank>)

  // Upstream calls in flight, and those gRPC has finished, for the loop to answer.
  std::mutex mutex_;
  std::condition_variable idle_;
  std::vector<Upstream*> in_flight_;
  std::vector<Upstream*> finished_;
  // The Hello (in in_flight_ until answered; not counted in upstream_calls_), and its answer.
  std::unique_ptr<Upstream> hello_;
  bool hello_answered_ = false;
  std::condition_variable hello_done_;
};

absl::Status Relay::Impl::Listen() {
  sockaddr_un address;
  const socklen_t length = SocketAddress(options_.socket, address);
  if (length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the relay's socket name '", options_.socket, "' is empty or too long"));
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listen_fd_, 4096) != 0) {
    return absl::UnavailableError(absl::StrCat("the rendezvous relay cannot listen on '",
                                               options_.socket, "': ", std::strerror(errno)));
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("the rendezvous relay cannot poll: ", std::strerror(errno)));
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 0;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &event);
  event.data.u64 = 1;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      internal::NewChannel(options_.server_address, options_.token, options_.tls);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  stub_ = std::make_unique<grpc::GenericStub>(channel_);
  // Connect and prove the token now, while the agent starts its ranks, not on their first call:
  // the TCP, TLS and HTTP/2 handshakes (about a third of the relay's work at start-up) then leave
  // the ranks' path, and the server keeps a connection that has proved the token.
  SayHello();
  thread_ = std::thread([this] { Run(); });
  // So that `top -H`, `ps -L` and profiles tell the relay from the agent's other threads.
  pthread_setname_np(thread_.native_handle(), "trainrun-relay");
  return absl::OkStatus();
}

void Relay::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof(one)) < 0) {
      // The loop wakes at its next batch deadline anyway.
    }
    thread_.join();
  }
  {
    // gRPC's callbacks refer to this relay: cancel what is in flight and wait for them.
    std::unique_lock<std::mutex> lock(mutex_);
    for (Upstream* upstream : in_flight_) upstream->context.TryCancel();
    idle_.wait(lock, [&] { return in_flight_.empty(); });
    for (Upstream* upstream : finished_) delete upstream;
    finished_.clear();
  }
  for (auto& [id, connection] : connections_) ::close(connection.fd);
  connections_.clear();
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
  listen_fd_ = epoll_fd_ = wake_fd_ = -1;
}

void Relay::Impl::Run() {
  epoll_event events[64];
  while (!stopping_.load()) {
    int timeout_ms = -1;
    Clock::time_point next = Clock::time_point::max();
    if (!joins_.members.empty()) next = joins_.flush_at;
    if (!reports_.members.empty()) next = std::min(next, reports_.flush_at);
    for (auto* batches : {&gathers_, &barriers_}) {
      for (auto& [key, batch] : *batches) next = std::min(next, batch.flush_at);
    }
    // While a connection has not said the token, wake for its deadline.
    if (admission_.unproven() > 0) next = std::min(next, Clock::now() + kAdmissionSweep);
    if (next != Clock::time_point::max()) {
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, wait.count()));
    }
    const int ready = epoll_wait(epoll_fd_, events, 64, timeout_ms);
    for (int i = 0; i < ready; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == 0) {
        Accept();
      } else if (id == 1) {
        uint64_t count = 0;
        if (::read(wake_fd_, &count, sizeof(count)) < 0) {
          // Nothing to drain.
        }
        std::vector<Upstream*> finished;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          finished.swap(finished_);
        }
        for (Upstream* upstream : finished) Finish(upstream);
      } else {
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) Read(id);
        if ((events[i].events & EPOLLOUT) && connections_.count(id) != 0) Write(id);
      }
    }
    FlushDue(false);
    if (admission_.unproven() > 0) {
      for (uint64_t late : admission_.Expired(Clock::now())) Close(late);
    }
  }
}

void Relay::Impl::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    const uint64_t id = next_connection_++;
    for (uint64_t evicted : admission_.Admit(id, "local", Clock::now())) Close(evicted);
    connections_[id].fd = fd;
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
    // A rank writes its first call as soon as it has connected: read it now rather than wake
    // again for it.
    Read(id);
  }
}

void Relay::Impl::Read(uint64_t id) {
  auto found = connections_.find(id);
  if (found == connections_.end()) return;
  Connection& connection = found->second;
  char buffer[16384];
  bool open = true;
  while (true) {
    const ssize_t got = ::read(connection.fd, buffer, sizeof(buffer));
    if (got > 0) {
      connection.in.append(buffer, static_cast<size_t>(got));
      if (got < static_cast<ssize_t>(sizeof(buffer))) break;
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    open = false;  // the rank closed its end, or died
    break;
  }
  size_t used = 0;
  while (true) {
    // Handle may have closed the connection (a failed write) or marked it closing (a wrong token).
    found = connections_.find(id);
    if (found == connections_.end()) return;
    if (found->second.closing) break;
    std::string_view rest(found->second.in.data() + used, found->second.in.size() - used);
    const size_t length = internal::FrameLength(rest);
    const size_t most =
        found->second.authenticated ? internal::kMaxRelayFrame : internal::kMaxUnauthenticatedFrame;
    if (length == 0 || length > most) {
      if (length > most) open = false;
      break;
    }
    if (rest.size() < length) break;
    internal::RelayRequest request;
    if (!internal::ParseRequest(rest.substr(0, length), request)) {
      open = false;
      break;
    }
    Handle(id, request);
    used += length;
  }
  found->second.in.erase(0, used);
  if (!open) Close(id);
}

void Relay::Impl::Write(uint64_t id) {
  Connection& connection = connections_.at(id);
  while (!connection.out.empty()) {
    const ssize_t wrote =
        ::send(connection.fd, connection.out.data(), connection.out.size(), MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (wrote <= 0) {
      Close(id);
      return;
    }
    connection.out.erase(0, static_cast<size_t>(wrote));
  }
  if (connection.out.empty() && connection.closing) {
    Close(id);
    return;
  }
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | (connection.out.empty() ? 0u : uint32_t{EPOLLOUT});
  event.data.u64 = id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, connection.fd, &event);
}

void Relay::Impl::Close(uint64_t id) {
  auto found = connections_.find(id);
  if (found == connections_.end()) return;
  ::close(found->second.fd);
  connections_.erase(found);
  admission_.Closed(id);
  // A rank that went away no longer waits: cancel its calls upstream, unless a batch still
  // carries another rank's.
  std::lock_guard<std::mutex> lock(mutex_);
  for (Upstream* upstream : in_flight_) {
    const bool orphaned =
        std::all_of(upstream->members.begin(), upstream->members.end(), [&](const Call& call) {
          return call.connection == id || connections_.count(call.connection) == 0;
        });
    if (orphaned) upstream->context.TryCancel();
  }
}

void Relay::Impl::Handle(uint64_t id, const internal::RelayRequest& request) {
  Connection& connection = connections_.at(id);  // Read found it
  Call call;
  call.connection = id;
  call.call_id = request.call_id;
  call.method = request.method;
  call.deadline =
      Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, request.deadline_ms));
  if (request.method == RelayMethod::kHello) {
    // No answer: a wrong token is refused on the connection's first call, in that call's answer.
    connection.authenticated = internal::ConstantTimeEquals(options_.token, request.body);
    if (connection.authenticated) admission_.Proven(id);
    return;
  }
  if (!connection.authenticated) {
    connection.closing = true;  // once the refusal is written
    Reply(call, static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
          "the rendezvous relay refused a call without this job's token (TRAINRUN_JOB_TOKEN); "
          "is the worker from another job?",
          {});
    return;
  }
  call.body.assign(request.body.data(), request.body.size());
  switch (request.method) {
    case RelayMethod::kJoin:
      Add(joins_, std::move(call));
      break;
    case RelayMethod::kAllgather:
    case RelayMethod::kBarrier: {
      BatchKey key;
      bool parsed = false;
      if (request.method == RelayMethod::kAllgather) {
        proto::AllgatherRequest parsed_request;
        parsed = parsed_request.ParseFromString(call.body);
        key = {parsed_request.name(), parsed_request.count(), parsed_request.timeout_ms()};
      } else {
        proto::BarrierRequest parsed_request;
        parsed = parsed_request.ParseFromString(call.body);
        key = {parsed_request.name(), parsed_request.count(), parsed_request.timeout_ms()};
      }
      if (!parsed) {
        Reply(call, static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
              "the rendezvous relay could not parse a call; is the worker the same trainrun "
              "version as the host's agent?",
              {});
        break;
      }
      auto& batches = request.method == RelayMethod::kAllgather ? gathers_ : barriers_;
      Batch& batch = batches[key];
      Add(batch, std::move(call));
      if (options_.local_ranks > 0 &&
          static_cast<int>(batch.members.size()) >= options_.local_ranks) {
        Flush(request.method, &key, batch);
        batches.erase(key);
      }
      return;
    }
    case RelayMethod::kSet: {
      proto::SetRequest set;
      if (IsReport(call.body, set)) {
        if (reports_.members.empty()) reports_.flush_at = Clock::now() + options_.report_window;
        reports_.members.push_back(std::move(call));
        if (options_.local_ranks > 0 &&
            static_cast<int>(reports_.members.size()) >= options_.local_ranks) {
          Flush(RelayMethod::kSet, nullptr, reports_);
        }
        return;
      }
      [[fallthrough]];
    }
    default: {
      std::string method = internal::RelayMethodPath(request.method);
      grpc::ByteBuffer buffer = ToBuffer(call.body);
      std::vector<Call> members;
      members.push_back(std::move(call));
      Send(std::move(method), std::move(buffer), std::move(members));
      return;
    }
  }
  if (options_.local_ranks > 0 && static_cast<int>(joins_.members.size()) >= options_.local_ranks) {
    Flush(RelayMethod::kJoin, nullptr, joins_);
  }
}

void Relay::Impl::Add(Batch& batch, Call call) {
  if (batch.members.empty()) batch.flush_at = Clock::now() + options_.batch_window;
  batch.members.push_back(std::move(call));
}

void Relay::Impl::FlushDue(bool all) {
  const Clock::time_point now = Clock::now();
  if (!joins_.members.empty() && (all || joins_.flush_at <= now)) {
    Flush(RelayMethod::kJoin, nullptr, joins_);
  }
  if (!reports_.members.empty() && (all || reports_.flush_at <= now)) {
    Flush(RelayMethod::kSet, nullptr, reports_);
  }
  for (auto [batches, method] : {std::pair{&gathers_, RelayMethod::kAllgather},
                                 std::pair{&barriers_, RelayMethod::kBarrier}}) {
    for (auto it = batches->begin(); it != batches->end();) {
      if (all || it->second.flush_at <= now) {
        Flush(method, &it->first, it->second);
        it = batches->erase(it);
      } else {
        ++it;
      }
    }
  }
}

void Relay::Impl::Flush(RelayMethod method, const BatchKey* key, Batch& batch) {
  std::vector<Call> members = std::move(batch.members);
  batch.members.clear();
  if (members.empty()) return;
  if (members.size() == 1) {
    // One member: its own call, as the rank would have sent it.
    grpc::ByteBuffer buffer = ToBuffer(members[0].body);
    Send(internal::RelayMethodPath(method), std::move(buffer), std::move(members));
    return;
  }
  std::string bytes;
  const char* path = nullptr;
  if (method == RelayMethod::kJoin) {
    proto::JoinBatchRequest request;
    for (const Call& call : members) {
      if (!request.add_joins()->ParseFromString(call.body)) request.mutable_joins()->RemoveLast();
    }
    if (request.joins_size() != static_cast<int>(members.size())) {
      for (const Call& call : members) {
        Reply(call, static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
              "the rendezvous relay could not parse a join; is the worker the same trainrun "
              "version as the host's agent?",
              {});
      }
      return;
    }
    bytes = request.SerializeAsString();
    path = kJoinBatch;
  } else if (method == RelayMethod::kSet) {
    proto::SetBatchRequest request;
    for (const Call& call : members) {
      request.add_sets()->ParseFromString(call.body);  // parsed once already, in Handle
    }
    bytes = request.SerializeAsString();
    path = kSetBatch;
  } else if (method == RelayMethod::kAllgather) {
    proto::AllgatherBatchRequest request;
    request.set_name(std::get<0>(*key));
    request.set_count(std::get<1>(*key));
    request.set_timeout_ms(std::get<2>(*key));
    for (const Call& call : members) {
      proto::AllgatherRequest member;
      member.ParseFromString(call.body);  // parsed once already, in Handle
      request.add_ranks(member.rank());
      *request.add_values() = std::move(*member.mutable_value());
    }
    bytes = request.SerializeAsString();
    path = kAllgatherBatch;
  } else {
    proto::BarrierBatchRequest request;
    request.set_name(std::get<0>(*key));
    request.set_count(std::get<1>(*key));
    request.set_timeout_ms(std::get<2>(*key));
    for (const Call& call : members) {
      proto::BarrierRequest member;
      member.ParseFromString(call.body);
      request.add_ranks(member.rank());
    }
    bytes = request.SerializeAsString();
    path = kBarrierBatch;
  }
  Send(path, ToBuffer(bytes), std::move(members));
}

void Relay::Impl::Send(std::string method, grpc::ByteBuffer request, std::vector<Call> members) {
  auto* upstream = new Upstream;
  upstream->method = std::move(method);
  upstream->request = std::move(request);
  Clock::time_point deadline = Clock::now();
  for (const Call& call : members) deadline = std::max(deadline, call.deadline);
  upstream->members = std::move(members);
  upstream->context.AddMetadata(internal::kTokenMetadata, options_.token);
  upstream->context.AddMetadata(internal::kJobIdMetadata, options_.job_id);
  upstream->context.set_deadline(std::chrono::system_clock::now() + (deadline - Clock::now()));
  // A rank may start a moment before the launcher's server accepts: joins wait for it.
  if (upstream->members[0].method == RelayMethod::kJoin) upstream->context.set_wait_for_ready(true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(upstream);
  }
  ++upstream_calls_;
  stub_->UnaryCall(&upstream->context, upstream->method, grpc::StubOptions(), &upstream->request,
                   &upstream->response, [this, upstream](grpc::Status status) {
                     upstream->status = std::move(status);
                     std::lock_guard<std::mutex> lock(mutex_);
                     in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), upstream));
                     finished_.push_back(upstream);
                     const uint64_t one = 1;
                     if (wake_fd_ >= 0 && ::write(wake_fd_, &one, sizeof(one)) < 0) {
                       // The loop is stopping; Stop frees what finished.
                     }
                     if (in_flight_.empty()) idle_.notify_all();
                   });
}

void Relay::Impl::SayHello() {
  hello_ = std::make_unique<Upstream>();
  Upstream* upstream = hello_.get();
  upstream->method = kHello;
  upstream->request = ToBuffer(proto::HelloRequest().SerializeAsString());
  upstream->context.AddMetadata(internal::kTokenMetadata, options_.token);
  upstream->context.AddMetadata(internal::kJobIdMetadata, options_.job_id);
  upstream->context.set_deadline(std::chrono::system_clock::now() + kHelloTimeout);
  upstream->context.set_wait_for_ready(true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(upstream);
  }
  stub_->UnaryCall(&upstream->context, upstream->method, grpc::StubOptions(), &upstream->request,
                   &upstream->response, [this, upstream](grpc::Status status) {
                     std::lock_guard<std::mutex> lock(mutex_);
                     upstream->status = std::move(status);
                     in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), upstream));
                     hello_answered_ = true;
                     hello_done_.notify_all();
                     if (in_flight_.empty()) idle_.notify_all();
                   });
}

void Relay::Impl::Reply(const Call& call, int code, std::string_view message, std::string_view body,
                        std::string_view body2) {
  auto found = connections_.find(call.connection);
  if (found == connections_.end()) return;  // the rank went away
  Connection& connection = found->second;
  if (!connection.out.empty()) {  // waiting for the socket to drain: queue behind what waits
    internal::AppendResponse(connection.out, call.call_id, code, message, body, body2);
    return;
  }
  // Sent from where the parts are (a gather's answer, ~40 KiB at 8192 ranks, is one buffer for
  // the host's ranks): one sendmsg, no copy into the connection's buffer and no epoll change,
  // unless the socket takes only part of it.
  std::string head;
  internal::AppendResponseHead(head, call.call_id, code, message, body.size() + body2.size());
  iovec parts[3] = {{head.data(), head.size()},
                    {const_cast<char*>(body.data()), body.size()},
                    {const_cast<char*>(body2.data()), body2.size()}};
  msghdr frame{};
  frame.msg_iov = parts;
  frame.msg_iovlen = 3;
  ssize_t wrote = -1;
  do {
    wrote = ::sendmsg(connection.fd, &frame, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (wrote < 0 && errno == EINTR);
  if (wrote < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
    Close(call.connection);
    return;
  }
  size_t sent = wrote < 0 ? 0 : static_cast<size_t>(wrote);
  for (const iovec& part : parts) {
    const size_t skip = std::min(sent, part.iov_len);
    connection.out.append(static_cast<const char*>(part.iov_base) + skip, part.iov_len - skip);
    sent -= skip;
  }
  if (!connection.out.empty() || connection.closing) Write(call.connection);
}

void Relay::Impl::Finish(Upstream* upstream) {
  std::unique_ptr<Upstream> owned(upstream);
  const grpc::Status& status = upstream->status;
  const bool batch = upstream->members.size() > 1;
  if (!status.ok() || !batch) {
    const std::string body = status.ok() ? Flatten(upstream->response) : std::string();
    for (const Call& call : upstream->members) {
      Reply(call, static_cast<int>(status.error_code()), status.error_message(), body);
    }
    return;
  }
  switch (upstream->members[0].method) {
    case RelayMethod::kJoin:
      FinishJoins(*upstream);
      break;
    case RelayMethod::kAllgather:
      FinishGather(*upstream);
      break;
    case RelayMethod::kSet:
      FinishReports(*upstream);
      break;
    default:
      for (const Call& call : upstream->members) Reply(call, 0, {}, {});
      break;
  }
}

void Relay::Impl::FinishJoins(Upstream& upstream) {
  proto::JoinBatchResponse response;
  const size_t count = upstream.members.size();
  if (!response.ParseFromString(Flatten(upstream.response)) ||
      static_cast<size_t>(response.status_size()) != count ||
      static_cast<size_t>(response.joins_size()) != count ||
      static_cast<size_t>(response.shares_common_size()) != count) {
    for (const Call& call : upstream.members) {
      Reply(call, static_cast<int>(grpc::StatusCode::INTERNAL),
            "the rendezvous server sent the relay a malformed join batch; is it the same trainrun "
            "version?",
            {});
    }
    return;
  }
  // Protobuf merges concatenated messages: each member's place, then the shared host table.
  const std::string common = response.common().SerializeAsString();
  for (size_t i = 0; i < count; ++i) {
    const proto::MemberStatus& status = response.status(static_cast<int>(i));
    if (status.code() != 0) {
      Reply(upstream.members[i], status.code(), status.message(), {});
      continue;
    }
    Reply(upstream.members[i], 0, {}, response.joins(static_cast<int>(i)).SerializeAsString(),
          response.shares_common(static_cast<int>(i)) ? std::string_view(common)
                                                      : std::string_view());
  }
}

void Relay::Impl::FinishGather(Upstream& upstream) {
  const std::string bytes = Flatten(upstream.response);
  proto::AllgatherBatchResponse response;
  if (!response.ParseFromString(bytes)) {
    for (const Call& call : upstream.members) {
      Reply(call, static_cast<int>(grpc::StatusCode::INTERNAL),
            "the rendezvous server sent the relay a malformed allgather answer", {});
    }
    return;
  }
  if (response.status_size() == 0) {
    // Every member succeeded: the answer is the gather's AllgatherResponse itself.
    for (const Call& call : upstream.members) Reply(call, 0, {}, bytes);
    return;
  }
  for (size_t i = 0; i < upstream.members.size(); ++i) {
    Call& call = upstream.members[i];
    const proto::MemberStatus* status = static_cast<int>(i) < response.status_size()
                                            ? &response.status(static_cast<int>(i))
                                            : nullptr;
    if (status != nullptr && status->resend()) {
      // Refused because of another member, not applied: this one goes alone.
      grpc::ByteBuffer buffer = ToBuffer(call.body);
      std::vector<Call> members;
      members.push_back(std::move(call));
      Send(internal::RelayMethodPath(RelayMethod::kAllgather), std::move(buffer),
           std::move(members));
      continue;
    }
    Reply(call, status != nullptr ? status->code() : static_cast<int>(grpc::StatusCode::INTERNAL),
          status != nullptr ? status->message() : "the rendezvous server's answer lacks a member",
          {});
  }
}

void Relay::Impl::FinishReports(Upstream& upstream) {
  proto::SetBatchResponse response;
  const bool parsed = response.ParseFromString(Flatten(upstream.response)) &&
                      response.status_size() == static_cast<int>(upstream.members.size());
  for (size_t i = 0; i < upstream.members.size(); ++i) {
    if (!parsed) {
      Reply(upstream.members[i], static_cast<int>(grpc::StatusCode::INTERNAL),
            "the rendezvous server sent the relay a malformed answer to its ranks' reports", {});
      continue;
    }
    const proto::MemberStatus& status = response.status(static_cast<int>(i));
    Reply(upstream.members[i], status.code(), status.message(), {});
  }
}

absl::StatusOr<std::unique_ptr<Relay>> Relay::Start(RelayOptions options) {
  if (options.server_address.empty() || options.token.empty() || options.socket.empty()) {
    return absl::InvalidArgumentError(
        "the rendezvous relay needs a socket name, the server's address and the job's token");
  }
  internal::QuietAbseilMutexes();
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() = default;
const std::string& Relay::socket() const { return impl_->socket(); }
int64_t Relay::upstream_calls() const { return impl_->upstream_calls(); }

bool Relay::WaitConnected(std::chrono::milliseconds timeout) {
  return impl_->WaitConnected(timeout);
}

}  // namespace trainrun::rendezvous
