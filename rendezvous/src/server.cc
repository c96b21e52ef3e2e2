#include "trainrun/rendezvous/server.h"

#include <grpcpp/grpcpp.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "listener.h"
#include "proto/rendezvous.grpc.pb.h"
#include "tls.h"
#include "wire.h"

namespace trainrun::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using internal::FormatDuration;

// At most this many keys or ranks are named in one error; the rest are counted.
constexpr size_t kMaxNamed = 16;

std::string NameSome(const std::vector<std::string>& items) {
  std::vector<std::string> named(items.begin(), items.begin() + std::min(items.size(), kMaxNamed));
  std::string out = absl::StrJoin(named, ", ");
  if (items.size() > kMaxNamed) absl::StrAppend(&out, " and ", items.size() - kMaxNamed, " more");
  return out;
}

std::string NameRanks(const std::vector<int>& ranks) {
  std::vector<std::string> names;
  names.reserve(ranks.size());
  for (int r : ranks) names.push_back(absl::StrCat(r));
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", NameSome(names));
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace

// Impl is the service and all of the job's state, behind one mutex. Waiting calls are Waiter
// reactors indexed by the keys or barrier they wait for and by deadline; whoever takes a waiter
// out of those indexes (a Set, the barrier's last arrival, the deadline thread, a cancellation,
// shutdown) is the one that finishes it, after letting go of the mutex.
// Allgather is served raw: its answer is serialized once per gather and every caller's response
// refers to those same bytes (a 8192-rank gather's 40 KiB, once, not once per rank).
// A host's relay sends its ranks' calls batched (JoinBatch, AllgatherBatch, BarrierBatch); each
// member goes through the same checks and state as the call it stands for, and AllgatherBatch's
// answer, when every member succeeds, is that same serialized table (raw too).
class Server::Impl final : public proto::Rendezvous::WithRawCallbackMethod_Allgather<
                               proto::Rendezvous::WithRawCallbackMethod_AllgatherBatch<
                                   proto::Rendezvous::CallbackService>> {
 public:
  explicit Impl(ServerOptions options);
  ~Impl() override;

  absl::Status Listen();
  void Shutdown();

  std::string address() const {
    return internal::JoinHostPort(
        options_.advertise_host.empty() ? options_.bind_address : options_.advertise_host, port_);
  }
  int port() const { return port_; }
  void NoteRankExit(int rank, const std::string& how, bool success);
  int AddRanks(const std::vector<RankSlot>& slots);
  int RankCount() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(options_.ranks.size());
  }
  std::vector<RankState> Ranks() const;
  std::vector<PeerFailure> PeerFailures() const;
  std::map<std::string, std::string> ValuesWithPrefix(const std::string& prefix) const;
  // StoreValue is a Set: stores `value` under `key` and releases the Gets waiting for it.
  grpc::Status StoreValue(const std::string& key, const std::string& value);
  void SetCounter(const std::string& key, int64_t value);
  size_t WaitingCalls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiter_count_;
  }

 private:
  class Waiter;
  struct BarrierState {
    int count = 0;
    int arrived = 0;
    std::set<int> ranks;  // the ranks that entered, when they said who they are
    std::vector<Waiter*> waiters;
  };
  // An Allgather: who has contributed, who waits, and, once all have, the table every caller gets
  // (or why there is none: it passed the response limit).
  struct GatherState {
    int count = 0;
    int arrived = 0;
    std::vector<bool> contributed;
    std::vector<Waiter*> waiters;
    // The serialized AllgatherResponse every caller gets, once all have contributed.
    std::optional<grpc::Slice> answer;
    grpc::Status failed;
  };
  using Completion = std::pair<Waiter*, grpc::Status>;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const proto::JoinRequest* request,
                                 proto::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const proto::SetRequest* request,
                                proto::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const proto::GetRequest* request,
                                proto::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const proto::AddRequest* request,
                                proto::AddResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const proto::BarrierRequest* request,
                                    proto::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* Allgather(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* raw_request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const proto::ExitReport* request,
                                       proto::ExitResponse* response) override;
  grpc::ServerUnaryReactor* JoinBatch(grpc::CallbackServerContext* context,
                                      const proto::JoinBatchRequest* request,
                                      proto::JoinBatchResponse* response) override;
  grpc::ServerUnaryReactor* AllgatherBatch(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* raw_request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* BarrierBatch(grpc::CallbackServerContext* context,
                                         const proto::BarrierBatchRequest* request,
                                         proto::BarrierBatchResponse* response) override;

  // With mutex_ held: join one worker, filling its place (and host_names, for a worker that did
  // not ask for the host table) into `response`; the caller adds the runs, table and job id.
  grpc::Status JoinLocked(const proto::JoinRequest& request, proto::JoinResponse* response);
  // With mutex_ held: the runs of hosts that cover ranks 0 .. size-1.
  void FillRuns(proto::JoinResponse* response, int size) const;
  // With mutex_ held: host_names_ front-coded, encoded at the first call that needs it.
  std::shared_ptr<const std::string> HostTableLocked();
  // Checks one Allgather contribution against the limits: OK, or the error its caller gets.
  grpc::Status CheckContribution(const std::string& name, int rank, int count, size_t value_bytes,
                                 int64_t timeout_ms) const;
  // The checked contributions `members` ((rank, value) pairs) of gather `name` enter it as one
  // call: finishes at once when the gather is (or becomes) complete or refuses them, else waits.
  grpc::ServerUnaryReactor* EnterGather(
      grpc::CallbackServerContext* context, const std::string& name, int count, int64_t timeout_ms,
      const std::vector<std::pair<int, const std::string*>>& members, grpc::ByteBuffer* response);
  // The callers `ranks` (each a rank or -1) enter barrier `name` as one call.
  grpc::ServerUnaryReactor* EnterBarrier(grpc::CallbackServerContext* context,
                                         const std::string& name, int count, int64_t timeout_ms,
                                         const std::vector<int>& ranks);

  static grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                             const grpc::Status& status);
  grpc::Status Authenticate(grpc::CallbackServerContext* context) const;
  grpc::Status CheckKey(const std::string& key, const char* what) const;
  grpc::Status CheckTimeout(int64_t timeout_ms) const;
  // With mutex_ held: whether one more call may wait.
  grpc::Status CanWait() const;

  // With mutex_ held: StoreValue's work; the Gets it completes are added to `completions`.
  grpc::Status StoreLocked(const std::string& key, const std::string& value,
                           std::vector<Completion>& completions);
  // With mutex_ held: check an Allgather's request against the limits and find (or open) its
  // gather; nullptr with `status` set when it is refused.
  GatherState* FindGather(const std::string& name, int count, grpc::Status& status);
  // With mutex_ held: encode the table of a gather whose contributions have all arrived, and hand
  // it to every waiting caller through `completions`.
  void CompleteGather(const std::string& name, GatherState& gather,
                      std::vector<Completion>& completions);
  // With mutex_ held: fill a Get's response from values_, or fail when it is too large.
  grpc::Status FillValues(const proto::GetRequest& request, proto::GetResponse* response) const;
  // With mutex_ held: take `waiter` out of every index; false when someone already did.
  bool Claim(Waiter* waiter);
  // With mutex_ held: why `waiter` is still waiting, for its timeout error.
  std::string DescribeTimeout(const Waiter& waiter) const;
  // With mutex_ held: ", ranks 3, 7 have not joined; rank 3 exited with code 1" or "".
  std::string DescribeAbsentRanks(const std::vector<int>& ranks) const;
  void Cancel(Waiter* waiter);
  static void FinishAll(std::vector<Completion>& completions);
  void RunDeadlines();
  // With mutex_ held: the first rank that exited 0 without joining while a joined rank still
  // runs, once (see ServerOptions::on_exit_before_join); nullopt otherwise.
  std::optional<int> TakeExitBeforeJoin();

  ServerOptions options_;  // its ranks grow with AddRanks (under mutex_); the rest is fixed
  int port_ = 0;
  std::unique_ptr<internal::Listener> listener_;
  std::unique_ptr<grpc::Server> server_;
  std::thread deadline_thread_;

  mutable std::mutex mutex_;
  std::condition_variable deadline_changed_;
  bool stopping_ = false;
  std::map<std::pair<std::string, int>, int> rank_of_;  // (host, local_rank) -> rank
  int first_added_ = 0;  // the first rank AddRanks may add (the start's size)
  // Every rank's host, as the join answer sends it: distinct names, in rank order, and runs of
  // ranks on one host (rendezvous.proto). AddRanks extends them.
  std::vector<std::string> host_names_;
  std::vector<int> host_run_hosts_;
  std::vector<int> host_run_lengths_;
  void AppendHostRun(int host);  // one more rank, on host_names_[host]
  // host_names_ front-coded (JoinResponse.host_table), encoded at the first join that asks and
  // again after AddRanks changed them.
  std::shared_ptr<const std::string> host_table_;
  std::vector<RankState> ranks_;
  std::vector<PeerFailure> peer_failures_;
  std::set<int> exited_without_joining_;  // ranks that exited 0 and never joined
  int joined_running_ = 0;                // ranks that joined and have not exited
  bool exit_before_join_reported_ = false;
  std::unordered_map<std::string, std::string> values_;
  std::unordered_map<std::string, int64_t> counters_;
  size_t stored_bytes_ = 0;
  std::unordered_map<std::string, std::vector<Waiter*>> key_waiters_;
  std::unordered_map<std::string, BarrierState> barriers_;
  std::unordered_map<std::string, GatherState> gathers_;
  std::multimap<Clock::time_point, Waiter*> deadlines_;
  size_t waiter_count_ = 0;
};

// Waiter is a Get or Barrier call that could not finish at once. gRPC owns it as the call's reactor
// and it deletes itself in OnDone, gRPC's callback-API idiom; the indexes in Impl only point at it
// while it is pending.
class Server::Impl::Waiter final : public grpc::ServerUnaryReactor {
 public:
  Waiter(Impl* impl, std::chrono::milliseconds timeout) : impl_(impl), timeout_(timeout) {}

  void OnCancel() override { impl_->Cancel(this); }
  void OnDone() override { delete this; }

  Impl* impl_;
  std::chrono::milliseconds timeout_;
  bool pending = true;
  std::multimap<Clock::time_point, Waiter*>::iterator deadline;
  // A Get: its request and response, and how many distinct keys are still missing.
  const proto::GetRequest* get_request = nullptr;
  proto::GetResponse* get_response = nullptr;
  std::vector<std::string> missing_keys;
  size_t missing = 0;
  // A Barrier: its name.
  std::string barrier;
  // An Allgather: its name, its response, and (once complete) the serialized answer.
  std::string gather;
  grpc::ByteBuffer* gather_response = nullptr;
  std::optional<grpc::Slice> answer;
  int rank = -1;
};

Server::Impl::Impl(ServerOptions options) : options_(std::move(options)) {
  ranks_.resize(options_.ranks.size());
  std::map<std::string, int> host_index;
  for (size_t r = 0; r < options_.ranks.size(); ++r) {
    const std::string& host = options_.ranks[r].host;
    rank_of_[{host, options_.ranks[r].local_rank}] = static_cast<int>(r);
    auto [it, added] = host_index.emplace(host, static_cast<int>(host_names_.size()));
    if (added) host_names_.push_back(host);
    AppendHostRun(it->second);
  }
  first_added_ = static_cast<int>(options_.ranks.size());
}

void Server::Impl::AppendHostRun(int host) {
  if (host_run_hosts_.empty() || host_run_hosts_.back() != host) {
    host_run_hosts_.push_back(host);
    host_run_lengths_.push_back(0);
  }
  ++host_run_lengths_.back();
}

int Server::Impl::AddRanks(const std::vector<RankSlot>& slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int first = static_cast<int>(options_.ranks.size());
  for (const RankSlot& slot : slots) {
    options_.ranks.push_back(slot);
    ranks_.emplace_back();
    auto it = std::find(host_names_.begin(), host_names_.end(), slot.host);
    if (it == host_names_.end()) it = host_names_.insert(host_names_.end(), slot.host);
    AppendHostRun(static_cast<int>(it - host_names_.begin()));
  }
  host_table_.reset();
  return first;
}

Server::Impl::~Impl() { Shutdown(); }

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
  }
  builder.RegisterService(this);
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
  deadline_thread_ = std::thread([this] { RunDeadlines(); });
  return absl::OkStatus();
}

void Server::Impl::Shutdown() {
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    while (!deadlines_.empty()) {
      Waiter* waiter = deadlines_.begin()->second;
      Claim(waiter);
      completions.emplace_back(
          waiter, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the rendezvous server is shutting down (the job is ending)"));
    }
  }
  deadline_changed_.notify_all();
  FinishAll(completions);
  if (listener_ != nullptr) listener_->Stop();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (deadline_thread_.joinable()) deadline_thread_.join();
}

grpc::ServerUnaryReactor* Server::Impl::FinishNow(grpc::CallbackServerContext* context,
                                                  const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::Status Server::Impl::Authenticate(grpc::CallbackServerContext* context) const {
  const auto& metadata = context->client_metadata();
  auto token = metadata.find(internal::kTokenMetadata);
  if (token == metadata.end() ||
      !internal::ConstantTimeEquals(options_.token,
                                    std::string_view(token->second.data(), token->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the rendezvous refused a call without this job's token "
                        "(TRAINRUN_JOB_TOKEN); is the worker from another job?");
  }
  if (listener_ != nullptr) listener_->Proven(context->peer());
  return grpc::Status::OK;
}

grpc::Status Server::Impl::CheckKey(const std::string& key, const char* what) const {
  if (key.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("a ", what, " is empty"));
  }
  if (key.size() > options_.limits.max_key_bytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a ", what, " of ", key.size(), " bytes is over the limit of ",
                                     options_.limits.max_key_bytes, " bytes"));
  }
  return grpc::Status::OK;
}

grpc::Status Server::Impl::CheckTimeout(int64_t timeout_ms) const {
  if (timeout_ms < 0 || timeout_ms > options_.limits.max_timeout_ms) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a timeout of ", timeout_ms, " ms is outside 0 to ",
                                     options_.limits.max_timeout_ms, " ms"));
  }
  return grpc::Status::OK;
}

grpc::Status Server::Impl::CanWait() const {
  if (stopping_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the rendezvous server is shutting down (the job is ending)");
  }
  if (waiter_count_ >= options_.limits.max_waiters) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("over ", options_.limits.max_waiters,
                                     " calls are waiting at once; is a worker looping?"));
  }
  return grpc::Status::OK;
}

grpc::Status Server::Impl::JoinLocked(const proto::JoinRequest& request,
                                      proto::JoinResponse* response) {
  // A rank added while the job runs (Server::AddRanks, an elastic job that grew) joins by its
  // rank, which the launcher gave it, on the host it was started on.
  auto found = rank_of_.find({request.host(), request.local_rank()});
  const int claimed = request.has_rank() ? request.rank() : -1;
  int rank = -1;
  if (claimed >= first_added_ && claimed < static_cast<int>(ranks_.size()) &&
      options_.ranks[claimed].host == request.host()) {
    rank = claimed;
  } else if (found != rank_of_.end()) {
    rank = found->second;
  } else {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this job has no rank on host '", request.host().substr(0, 256),
                     "' with local_rank ", request.local_rank(),
                     "; check TRAINRUN_HOSTNAME and TRAINRUN_LOCAL_RANK"));
  }
  if (request.has_rank() && request.rank() != rank) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("a worker claiming rank ", request.rank(), " joined as host '", request.host(),
                     "' local_rank ", request.local_rank(), ", which is rank ", rank));
  }
  RankState& state = ranks_[rank];
  if (state.joined) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        absl::StrCat("rank ", rank, " already joined (pid ", state.pid,
                                     "); each rank joins once per job"));
  }
  state.joined = true;
  state.pid = request.pid();
  if (!state.exited.has_value()) ++joined_running_;
  exited_without_joining_.erase(rank);  // its Join overtook the news of its exit
  // A rank of the start is told the start's job (ranks AddRanks added later are no part of its
  // first generation); an added rank, the job as it is now.
  const int size = rank < first_added_ ? first_added_ : static_cast<int>(options_.ranks.size());
  const RankSlot& slot = options_.ranks[rank];
  response->set_rank(rank);
  response->set_size(size);
  response->set_local_rank(slot.local_rank);
  response->set_local_size(slot.local_size);
  response->set_cross_rank(slot.cross_rank);
  response->set_cross_size(slot.cross_size);
  if (!request.host_table())
    *response->mutable_host_names() = {host_names_.begin(), host_names_.end()};
  return grpc::Status::OK;
}

void Server::Impl::FillRuns(proto::JoinResponse* response, int size) const {
  // The runs that cover ranks 0 .. size-1 (the last one cut short where the start ends inside it).
  for (size_t k = 0, end = 0; k < host_run_hosts_.size() && end < static_cast<size_t>(size); ++k) {
    const int length = std::min(host_run_lengths_[k], size - static_cast<int>(end));
    response->add_host_run_hosts(host_run_hosts_[k]);
    response->add_host_run_lengths(length);
    end += static_cast<size_t>(length);
  }
}

std::shared_ptr<const std::string> Server::Impl::HostTableLocked() {
  if (host_table_ == nullptr) {
    std::vector<const std::string*> names;
    names.reserve(host_names_.size());
    for (const std::string& name : host_names_) names.push_back(&name);
    host_table_ = std::make_shared<const std::string>(internal::EncodeTable(names));
  }
  return host_table_;
}

grpc::ServerUnaryReactor* Server::Impl::Join(grpc::CallbackServerContext* context,
                                             const proto::JoinRequest* request,
                                             proto::JoinResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  std::unique_lock<std::mutex> lock(mutex_);
  if (grpc::Status status = JoinLocked(*request, response); !status.ok()) {
    return FinishNow(context, status);
  }
  std::shared_ptr<const std::string> host_table;
  if (request->host_table()) host_table = HostTableLocked();
  FillRuns(response, response->size());
  if (std::optional<int> early = TakeExitBeforeJoin(); early.has_value()) {
    // Reported on this thread, but only after the lock is let go: FinishNow below does not need it.
    lock.unlock();
    options_.on_exit_before_join(*early);
  }
  if (host_table != nullptr) response->set_host_table(*host_table);
  response->set_job_id(options_.job_id);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Server::Impl::JoinBatch(grpc::CallbackServerContext* context,
                                                  const proto::JoinBatchRequest* request,
                                                  proto::JoinBatchResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  std::optional<int> early;
  std::shared_ptr<const std::string> host_table;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (request->joins_size() > static_cast<int>(ranks_.size())) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             absl::StrCat("a batch of ", request->joins_size(),
                                                          " joins is more than the job's ",
                                                          ranks_.size(), " ranks")));
    }
    // Members of the start share one size, hence one set of runs: `common` carries them once.
    int common_size = -1;
    for (const proto::JoinRequest& join : request->joins()) {
      proto::MemberStatus* status = response->add_status();
      proto::JoinResponse* member = response->add_joins();
      bool shares = false;
      if (grpc::Status joined = JoinLocked(join, member); !joined.ok()) {
        status->set_code(joined.error_code());
        status->set_message(joined.error_message());
        member->Clear();
      } else {
        if (common_size < 0) {
          common_size = member->size();
          FillRuns(response->mutable_common(), common_size);
          host_table = HostTableLocked();
        }
        shares = join.host_table() && member->size() == common_size;
        if (!shares) {
          FillRuns(member, member->size());
          if (join.host_table()) member->set_host_table(*host_table);
          member->set_job_id(options_.job_id);
        }
      }
      response->add_shares_common(shares);
      if (!early.has_value()) early = TakeExitBeforeJoin();
    }
  }
  if (early.has_value()) options_.on_exit_before_join(*early);
  if (host_table != nullptr) response->mutable_common()->set_host_table(*host_table);
  response->mutable_common()->set_job_id(options_.job_id);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Server::Impl::Set(grpc::CallbackServerContext* context,
                                            const proto::SetRequest* request,
                                            proto::SetResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (grpc::Status status = CheckKey(request->key(), "key"); !status.ok()) {
    return FinishNow(context, status);
  }
  if (request->value().size() > options_.limits.max_value_bytes) {
    return FinishNow(
        context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("the value of key '", request->key(), "' has ",
                                           request->value().size(), " bytes, over the limit of ",
                                           options_.limits.max_value_bytes, " bytes")));
  }
  grpc::Status stored = StoreValue(request->key(), request->value());
  return FinishNow(context, stored);
}

grpc::Status Server::Impl::StoreValue(const std::string& key, const std::string& value) {
  std::vector<Completion> completions;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status = StoreLocked(key, value, completions);
  }
  FinishAll(completions);
  return status;
}

grpc::Status Server::Impl::StoreLocked(const std::string& key, const std::string& value,
                                       std::vector<Completion>& completions) {
  {
    auto existing = values_.find(key);
    const size_t old_bytes =
        existing == values_.end() ? 0 : existing->first.size() + existing->second.size();
    const size_t new_bytes = key.size() + value.size();
    if (stored_bytes_ - old_bytes + new_bytes > options_.limits.max_stored_bytes) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("the rendezvous holds ", stored_bytes_, " bytes; storing key '", key,
                       "' would pass its limit of ", options_.limits.max_stored_bytes, " bytes"));
    }
    stored_bytes_ = stored_bytes_ - old_bytes + new_bytes;
    values_[key] = value;
    auto waiting = key_waiters_.find(key);
    if (waiting != key_waiters_.end()) {
      std::vector<Waiter*> waiters = std::move(waiting->second);
      key_waiters_.erase(waiting);
      for (Waiter* waiter : waiters) {
        if (--waiter->missing > 0) continue;
        grpc::Status status = FillValues(*waiter->get_request, waiter->get_response);
        Claim(waiter);
        completions.emplace_back(waiter, std::move(status));
      }
    }
  }
  return grpc::Status::OK;
}

void Server::Impl::SetCounter(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [counter, added] = counters_.emplace(key, 0);
  if (added) stored_bytes_ += key.size() + 8;
  counter->second = value;
}

grpc::Status Server::Impl::FillValues(const proto::GetRequest& request,
                                      proto::GetResponse* response) const {
  size_t bytes = 0;
  for (const std::string& key : request.keys()) bytes += values_.at(key).size();
  if (bytes > options_.limits.max_response_bytes) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the values of these ", request.keys_size(), " keys total ", bytes,
                     " bytes, over the limit of ", options_.limits.max_response_bytes,
                     " bytes for one Get; ask for fewer keys at a time"));
  }
  std::string* packed = response->mutable_values();
  packed->reserve(bytes);
  response->mutable_value_ends()->Reserve(request.keys_size());
  for (const std::string& key : request.keys()) {
    packed->append(values_.at(key));
    response->add_value_ends(static_cast<uint32_t>(packed->size()));
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* Server::Impl::Get(grpc::CallbackServerContext* context,
                                            const proto::GetRequest* request,
                                            proto::GetResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (static_cast<size_t>(request->keys_size()) > options_.limits.max_keys_per_get) {
    return FinishNow(
        context,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("a Get of ", request->keys_size(), " keys is over the limit of ",
                                  options_.limits.max_keys_per_get, " keys per call")));
  }
  for (const std::string& key : request->keys()) {
    if (grpc::Status status = CheckKey(key, "key"); !status.ok()) return FinishNow(context, status);
  }
  if (grpc::Status status = CheckTimeout(request->timeout_ms()); !status.ok()) {
    return FinishNow(context, status);
  }

  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<std::string> missing;
  for (const std::string& key : request->keys()) {
    if (values_.count(key) == 0) missing.push_back(key);
  }
  if (missing.empty()) {
    grpc::Status status = FillValues(*request, response);
    lock.unlock();
    return FinishNow(context, status);
  }
  if (grpc::Status status = CanWait(); !status.ok()) return FinishNow(context, status);
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  auto* waiter = new Waiter(this, std::chrono::milliseconds(request->timeout_ms()));
  waiter->get_request = request;
  waiter->get_response = response;
  waiter->rank = request->rank();
  waiter->missing = missing.size();
  for (const std::string& key : missing) key_waiters_[key].push_back(waiter);
  waiter->missing_keys = std::move(missing);
  waiter->deadline = deadlines_.emplace(Clock::now() + waiter->timeout_, waiter);
  ++waiter_count_;
  if (waiter->deadline == deadlines_.begin()) deadline_changed_.notify_one();
  return waiter;
}

grpc::ServerUnaryReactor* Server::Impl::Add(grpc::CallbackServerContext* context,
                                            const proto::AddRequest* request,
                                            proto::AddResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (grpc::Status status = CheckKey(request->key(), "counter name"); !status.ok()) {
    return FinishNow(context, status);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto counter = counters_.find(request->key());
  if (counter == counters_.end()) {
    if (stored_bytes_ + request->key().size() + 8 > options_.limits.max_stored_bytes) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                             "the rendezvous's storage limit is reached"));
    }
    stored_bytes_ += request->key().size() + 8;
    counter = counters_.emplace(request->key(), 0).first;
  }
  counter->second += request->delta();
  response->set_value(counter->second);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Server::Impl::Barrier(grpc::CallbackServerContext* context,
                                                const proto::BarrierRequest* request,
                                                proto::BarrierResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  return EnterBarrier(context, request->name(), request->count(), request->timeout_ms(),
                      {request->rank()});
}

grpc::ServerUnaryReactor* Server::Impl::BarrierBatch(grpc::CallbackServerContext* context,
                                                     const proto::BarrierBatchRequest* request,
                                                     proto::BarrierBatchResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (request->ranks_size() == 0 || request->ranks_size() > std::max(request->count(), 1)) {
    return FinishNow(context,
                     grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  absl::StrCat("a batch of ", request->ranks_size(),
                                               " callers entered barrier '", request->name(),
                                               "' of count ", request->count())));
  }
  return EnterBarrier(context, request->name(), request->count(), request->timeout_ms(),
                      {request->ranks().begin(), request->ranks().end()});
}

grpc::ServerUnaryReactor* Server::Impl::EnterBarrier(grpc::CallbackServerContext* context,
                                                     const std::string& name, int count,
                                                     int64_t timeout_ms,
                                                     const std::vector<int>& ranks) {
  if (grpc::Status status = CheckKey(name, "barrier name"); !status.ok()) {
    return FinishNow(context, status);
  }
  if (grpc::Status status = CheckTimeout(timeout_ms); !status.ok()) {
    return FinishNow(context, status);
  }
  if (count <= 0) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           absl::StrCat("barrier '", name,
                                                        "' needs a positive count, not ", count)));
  }

  std::vector<Completion> completions;
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = barriers_.find(name);
  if (found == barriers_.end()) {
    if (stored_bytes_ + name.size() + 64 > options_.limits.max_stored_bytes) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                             "the rendezvous's storage limit is reached"));
    }
    stored_bytes_ += name.size() + 64;
    found = barriers_.emplace(name, BarrierState{}).first;
    found->second.count = count;
  }
  BarrierState& barrier = found->second;
  if (barrier.count != count) {
    return FinishNow(
        context,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("barrier '", name, "' was entered with count ", barrier.count,
                                  " and now with count ", count, "; all callers must agree")));
  }
  for (int rank : ranks) {
    // A rank that enters again (a retried call) counts once.
    const bool counts = rank < 0 || barrier.ranks.insert(rank).second;
    if (counts) ++barrier.arrived;
  }
  if (barrier.arrived >= barrier.count) {
    std::vector<Waiter*> waiters = std::move(barrier.waiters);
    barrier.waiters.clear();
    for (Waiter* waiter : waiters) {
      Claim(waiter);
      completions.emplace_back(waiter, grpc::Status::OK);
    }
    lock.unlock();
    FinishAll(completions);
    return FinishNow(context, grpc::Status::OK);
  }
  if (grpc::Status status = CanWait(); !status.ok()) return FinishNow(context, status);
  auto* waiter = new Waiter(this, std::chrono::milliseconds(timeout_ms));
  waiter->barrier = name;
  waiter->rank = ranks.size() == 1 ? ranks[0] : -1;
  barrier.waiters.push_back(waiter);
  waiter->deadline = deadlines_.emplace(Clock::now() + waiter->timeout_, waiter);
  ++waiter_count_;
  if (waiter->deadline == deadlines_.begin()) deadline_changed_.notify_one();
  return waiter;
}

Server::Impl::GatherState* Server::Impl::FindGather(const std::string& name, int count,
                                                    grpc::Status& status) {
  auto found = gathers_.find(name);
  if (found == gathers_.end()) {
    const size_t bytes = name.size() + 64 + static_cast<size_t>(count) / 8;
    if (stored_bytes_ + bytes > options_.limits.max_stored_bytes) {
      status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "the rendezvous's storage limit is reached");
      return nullptr;
    }
    stored_bytes_ += bytes;
    found = gathers_.emplace(name, GatherState{}).first;
    found->second.count = count;
    found->second.contributed.resize(static_cast<size_t>(count));
  }
  GatherState& gather = found->second;
  if (gather.count != count) {
    status =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("allgather '", name, "' was entered with count ", gather.count,
                                  " and now with count ", count, "; all callers must agree"));
    return nullptr;
  }
  return &gather;
}

void Server::Impl::CompleteGather(const std::string& name, GatherState& gather,
                                  std::vector<Completion>& completions) {
  std::vector<const std::string*> values;
  values.reserve(static_cast<size_t>(gather.count));
  for (int r = 0; r < gather.count; ++r) values.push_back(&values_.at(absl::StrCat(name, "/", r)));
  proto::AllgatherResponse response;
  response.set_table(internal::EncodeTable(values));
  const std::string* table = &response.table();
  if (table->size() > options_.limits.max_response_bytes) {
    gather.failed =
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("allgather '", name, "' gathered ", table->size(),
                                  " bytes, over the limit of ", options_.limits.max_response_bytes,
                                  " bytes for one answer; gather smaller values"));
  } else {
    stored_bytes_ += table->size();
    gather.answer.emplace(response.SerializeAsString());
  }
  gather.contributed = {};
  std::vector<Waiter*> waiters = std::move(gather.waiters);
  gather.waiters.clear();
  for (Waiter* waiter : waiters) {
    Claim(waiter);
    waiter->answer = gather.answer;
    completions.emplace_back(waiter, gather.failed);
  }
}

namespace {

// ParseRaw parses a raw callback method's request.
bool ParseRaw(const grpc::ByteBuffer& raw, google::protobuf::MessageLite& message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return message.ParseFromString(bytes);
}

}  // namespace

grpc::Status Server::Impl::CheckContribution(const std::string& name, int rank, int count,
                                             size_t value_bytes, int64_t timeout_ms) const {
  if (grpc::Status status = CheckKey(name, "gather name"); !status.ok()) return status;
  if (count <= 0 || static_cast<size_t>(count) > options_.limits.max_keys_per_get || rank < 0 ||
      rank >= count) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("allgather '", name, "' was entered as rank ", rank, " of ", count,
                     " contributors; the count must be 1 to ", options_.limits.max_keys_per_get));
  }
  // Each contribution is a key of its own; the longest one must fit the key limit.
  if (grpc::Status status =
          CheckKey(absl::StrCat(name, "/", count - 1), "gather name with its rank");
      !status.ok()) {
    return status;
  }
  if (value_bytes > options_.limits.max_value_bytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the value of key '", name, "/", rank, "' has ", value_bytes,
                     " bytes, over the limit of ", options_.limits.max_value_bytes, " bytes"));
  }
  return CheckTimeout(timeout_ms);
}

grpc::ServerUnaryReactor* Server::Impl::Allgather(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw_request,
                                                  grpc::ByteBuffer* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  proto::AllgatherRequest request;
  if (!ParseRaw(*raw_request, request)) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           "an allgather request could not be parsed; is the "
                                           "worker the same trainrun version?"));
  }
  if (grpc::Status status = CheckContribution(request.name(), request.rank(), request.count(),
                                              request.value().size(), request.timeout_ms());
      !status.ok()) {
    return FinishNow(context, status);
  }
  return EnterGather(context, request.name(), request.count(), request.timeout_ms(),
                     {{request.rank(), &request.value()}}, response);
}

grpc::ServerUnaryReactor* Server::Impl::AllgatherBatch(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  proto::AllgatherBatchRequest request;
  if (!ParseRaw(*raw_request, request) || request.ranks_size() != request.values_size() ||
      request.ranks_size() == 0) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           "an allgather batch could not be parsed; is the "
                                           "host's trainrun the same version?"));
  }
  // Every member is checked as its own call would be; when one is refused, none is applied, so the
  // others can be sent again alone without counting twice.
  std::vector<grpc::Status> checked;
  bool refused = false;
  for (int i = 0; i < request.ranks_size(); ++i) {
    checked.push_back(CheckContribution(request.name(), request.ranks(i), request.count(),
                                        request.values(i).size(), request.timeout_ms()));
    refused |= !checked.back().ok();
  }
  if (refused) {
    proto::AllgatherBatchResponse answer;
    for (const grpc::Status& status : checked) {
      proto::MemberStatus* member = answer.add_status();
      member->set_code(status.error_code());
      member->set_message(status.error_message());
      member->set_resend(status.ok());
    }
    grpc::Slice bytes(answer.SerializeAsString());
    *response = grpc::ByteBuffer(&bytes, 1);
    return FinishNow(context, grpc::Status::OK);
  }
  std::vector<std::pair<int, const std::string*>> members;
  for (int i = 0; i < request.ranks_size(); ++i) {
    members.emplace_back(request.ranks(i), &request.values(i));
  }
  return EnterGather(context, request.name(), request.count(), request.timeout_ms(), members,
                     response);
}

grpc::ServerUnaryReactor* Server::Impl::EnterGather(
    grpc::CallbackServerContext* context, const std::string& name, int count, int64_t timeout_ms,
    const std::vector<std::pair<int, const std::string*>>& members, grpc::ByteBuffer* response) {
  std::vector<Completion> completions;
  std::unique_lock<std::mutex> lock(mutex_);
  grpc::Status status;
  GatherState* gather = FindGather(name, count, status);
  if (gather == nullptr) return FinishNow(context, status);
  // A complete gather answers a late caller (a retry) with the table it already built.
  for (const auto& [rank, value] : members) {
    if (gather->answer.has_value() || !gather->failed.ok() || !status.ok()) break;
    status = StoreLocked(absl::StrCat(name, "/", rank), *value, completions);
    if (status.ok() && !gather->contributed[static_cast<size_t>(rank)]) {
      gather->contributed[static_cast<size_t>(rank)] = true;
      if (++gather->arrived == gather->count) CompleteGather(name, *gather, completions);
    }
  }
  if (!status.ok() || gather->answer.has_value() || !gather->failed.ok()) {
    if (status.ok()) status = gather->failed;
    std::optional<grpc::Slice> answer = gather->answer;
    lock.unlock();
    FinishAll(completions);
    if (status.ok()) *response = grpc::ByteBuffer(&*answer, 1);
    return FinishNow(context, status);
  }
  if (status = CanWait(); !status.ok()) {
    lock.unlock();
    FinishAll(completions);
    return FinishNow(context, status);
  }
  auto* waiter = new Waiter(this, std::chrono::milliseconds(timeout_ms));
  waiter->gather = name;
  waiter->gather_response = response;
  waiter->rank = members.size() == 1 ? members[0].first : -1;
  gather->waiters.push_back(waiter);
  waiter->deadline = deadlines_.emplace(Clock::now() + waiter->timeout_, waiter);
  ++waiter_count_;
  if (waiter->deadline == deadlines_.begin()) deadline_changed_.notify_one();
  lock.unlock();
  FinishAll(completions);
  return waiter;
}

grpc::ServerUnaryReactor* Server::Impl::ReportExit(grpc::CallbackServerContext* context,
                                                   const proto::ExitReport* request,
                                                   proto::ExitResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  const int size = RankCount();
  if (request->rank() < 0 || request->rank() >= size || request->peer_rank() >= size) {
    return FinishNow(
        context,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("an exit report names rank ", request->rank(), " or peer ",
                                  request->peer_rank(), "; the job has ", size, " ranks")));
  }
  std::optional<PeerFailure> reported;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (request->peer_rank() >= 0 && peer_failures_.size() < 4 * options_.ranks.size() + 16) {
      PeerFailure failure;
      failure.rank = request->rank();
      failure.peer_rank = request->peer_rank();
      failure.exit_code = request->exit_code();
      failure.message = request->message().substr(0, 1024);
      peer_failures_.push_back(failure);
      reported = std::move(failure);
    }
  }
  if (reported.has_value() && options_.on_peer_failure) options_.on_peer_failure(*reported);
  return FinishNow(context, grpc::Status::OK);
}

bool Server::Impl::Claim(Waiter* waiter) {
  if (!waiter->pending) return false;
  waiter->pending = false;
  deadlines_.erase(waiter->deadline);
  --waiter_count_;
  auto remove = [waiter](std::vector<Waiter*>& list) {
    auto it = std::find(list.begin(), list.end(), waiter);
    if (it != list.end()) {
      *it = list.back();
      list.pop_back();
    }
  };
  if (waiter->get_request != nullptr) {
    // A Get whose keys all arrived is in no key list any more: each Set took its list away.
    if (waiter->missing == 0) return true;
    for (const std::string& key : waiter->missing_keys) {
      auto list = key_waiters_.find(key);
      if (list == key_waiters_.end()) continue;
      remove(list->second);
      if (list->second.empty()) key_waiters_.erase(list);
    }
  } else if (!waiter->gather.empty()) {
    auto gather = gathers_.find(waiter->gather);
    if (gather != gathers_.end()) remove(gather->second.waiters);
  } else {
    auto barrier = barriers_.find(waiter->barrier);
    if (barrier != barriers_.end()) remove(barrier->second.waiters);
  }
  return true;
}

void Server::Impl::Cancel(Waiter* waiter) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!Claim(waiter)) return;
  }
  waiter->Finish(grpc::Status::CANCELLED);
}

void Server::Impl::FinishAll(std::vector<Completion>& completions) {
  for (auto& [waiter, status] : completions) {
    // A gather's answer: a reference to the bytes serialized once, without the server's lock.
    if (waiter->answer.has_value() && status.ok()) {
      *waiter->gather_response = grpc::ByteBuffer(&*waiter->answer, 1);
    }
    waiter->Finish(status);
  }
  completions.clear();
}

std::string Server::Impl::DescribeAbsentRanks(const std::vector<int>& ranks) const {
  std::vector<int> not_joined;
  std::vector<std::string> exits;
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(ranks_.size())) continue;
    if (!ranks_[r].joined) not_joined.push_back(r);
    if (ranks_[r].exited && exits.size() < kMaxNamed) {
      exits.push_back(absl::StrCat("rank ", r, " ", *ranks_[r].exited));
    }
  }
  std::string out;
  if (!not_joined.empty()) {
    absl::StrAppend(&out, "; ", NameRanks(not_joined), not_joined.size() == 1 ? " has" : " have",
                    " not joined");
  }
  if (!exits.empty()) absl::StrAppend(&out, "; ", absl::StrJoin(exits, "; "));
  return out;
}

std::string Server::Impl::DescribeTimeout(const Waiter& waiter) const {
  const std::string after = absl::StrCat("timed out after ", FormatDuration(waiter.timeout_));
  std::vector<int> all_ranks(ranks_.size());
  for (size_t r = 0; r < all_ranks.size(); ++r) all_ranks[r] = static_cast<int>(r);
  if (waiter.get_request != nullptr) {
    std::vector<std::string> missing;
    for (const std::string& key : waiter.missing_keys) {
      if (values_.count(key) == 0) missing.push_back(absl::StrCat("'", key, "'"));
    }
    return absl::StrCat(after, " waiting for ", missing.size() == 1 ? "key " : "keys ",
                        NameSome(missing), DescribeAbsentRanks(all_ranks));
  }
  if (!waiter.gather.empty()) {
    const GatherState& gather = gathers_.at(waiter.gather);
    std::string out = absl::StrCat(after, " in allgather '", waiter.gather, "': ", gather.arrived,
                                   " of ", gather.count, " contributed");
    std::vector<int> absent;
    for (int r = 0; r < gather.count; ++r) {
      if (!gather.contributed[static_cast<size_t>(r)]) absent.push_back(r);
    }
    if (gather.count == static_cast<int>(ranks_.size())) {
      // A gather of the whole job: its ranks are the job's ranks.
      absl::StrAppend(&out, ", waiting for ", NameRanks(absent), DescribeAbsentRanks(absent));
    } else {
      absl::StrAppend(&out, DescribeAbsentRanks(all_ranks));
    }
    return out;
  }
  const BarrierState& barrier = barriers_.at(waiter.barrier);
  std::string out = absl::StrCat(after, " in barrier '", waiter.barrier, "': ", barrier.arrived,
                                 " of ", barrier.count, " arrived");
  if (barrier.count == static_cast<int>(ranks_.size()) &&
      static_cast<int>(barrier.ranks.size()) == barrier.arrived) {
    // Every rank was expected and each said who it is: name the ones missing.
    std::vector<int> absent;
    for (int r : all_ranks) {
      if (barrier.ranks.count(r) == 0) absent.push_back(r);
    }
    absl::StrAppend(&out, ", waiting for ", NameRanks(absent), DescribeAbsentRanks(absent));
  } else {
    absl::StrAppend(&out, DescribeAbsentRanks(all_ranks));
  }
  return out;
}

void Server::Impl::RunDeadlines() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (deadlines_.empty()) {
      deadline_changed_.wait(lock);
      continue;
    }
    const Clock::time_point next = deadlines_.begin()->first;
    if (Clock::now() < next) {
      deadline_changed_.wait_until(lock, next);
      continue;
    }
    std::vector<Completion> completions;
    const Clock::time_point now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      Waiter* waiter = deadlines_.begin()->second;
      std::string message = DescribeTimeout(*waiter);
      Claim(waiter);
      completions.emplace_back(
          waiter, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, std::move(message)));
    }
    lock.unlock();
    FinishAll(completions);
    lock.lock();
  }
}

void Server::Impl::NoteRankExit(int rank, const std::string& how, bool success) {
  std::optional<int> early;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
    RankState& state = ranks_[rank];
    if (state.joined && !state.exited.has_value()) --joined_running_;
    state.exited = how;
    if (success && !state.joined) exited_without_joining_.insert(rank);
    early = TakeExitBeforeJoin();
  }
  if (early.has_value()) options_.on_exit_before_join(*early);
}

std::optional<int> Server::Impl::TakeExitBeforeJoin() {
  if (exit_before_join_reported_ || !options_.on_exit_before_join ||
      exited_without_joining_.empty() || joined_running_ == 0) {
    return std::nullopt;
  }
  exit_before_join_reported_ = true;
  return *exited_without_joining_.begin();
}

std::vector<RankState> Server::Impl::Ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ranks_;
}

std::vector<PeerFailure> Server::Impl::PeerFailures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peer_failures_;
}

std::map<std::string, std::string> Server::Impl::ValuesWithPrefix(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : values_) {
    if (key.compare(0, prefix.size(), prefix) == 0) out[key] = value;
  }
  return out;
}

// --- Server ------------------------------------------------------------------------------------

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
void Server::NoteRankExit(int rank, const std::string& how, bool success) {
  impl_->NoteRankExit(rank, how, success);
}
std::vector<RankState> Server::Ranks() const { return impl_->Ranks(); }
int Server::AddRanks(const std::vector<RankSlot>& slots) { return impl_->AddRanks(slots); }
std::vector<int> Server::JoinedRanks() const {
  std::vector<int> joined;
  std::vector<RankState> ranks = impl_->Ranks();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].joined) joined.push_back(static_cast<int>(r));
  }
  return joined;
}
std::vector<PeerFailure> Server::PeerFailures() const { return impl_->PeerFailures(); }
std::map<std::string, std::string> Server::ValuesWithPrefix(const std::string& prefix) const {
  return impl_->ValuesWithPrefix(prefix);
}
size_t Server::WaitingCalls() const { return impl_->WaitingCalls(); }
absl::Status Server::Set(const std::string& key, const std::string& value) {
  grpc::Status status = impl_->StoreValue(key, value);
  if (status.ok()) return absl::OkStatus();
  return absl::ResourceExhaustedError(status.error_message());
}
void Server::SetCounter(const std::string& key, int64_t value) { impl_->SetCounter(key, value); }
void Server::Shutdown() { impl_->Shutdown(); }

}  // namespace trainrun::rendezvous
