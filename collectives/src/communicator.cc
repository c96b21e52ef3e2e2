#include "trainrun/collectives/communicator.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "algorithms.h"
#include "socket.h"
#include "tcp_transport.h"
#include "trainrun/rendezvous/environment.h"
#include "transport_select.h"

namespace trainrun::collectives {

using ::trainrun::internal::MakeMessage;

namespace {

// StallWatch publishes, through the rendezvous, a collective that has waited longer than the stall
// warning time (env::kStallWarningSeconds), so that the launcher can say which ranks wait in which
// collective and which have not joined it; and clears it when the collective completes.
class StallWatch {
 public:
  StallWatch(rendezvous::Store& store, int rank, std::string communicator)
      : store_(store),
        key_(MakeMessage(env::kStallKeyPrefix, rank)),
        communicator_(std::move(communicator)),
        warning_(std::chrono::seconds(std::max<int64_t>(0, env::kStallWarningSeconds.Get()))) {}
  ~StallWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void Enter(const char* op) {
    if (warning_.count() == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Watch(); });
    op_ = MakeMessage(op, " #", ++sequence_,
                      communicator_.empty() || communicator_ == "world"
                          ? ""
                          : MakeMessage(" of '", communicator_, "'"));
    since_ = std::chrono::steady_clock::now();
    in_collective_ = true;
    wake_.notify_all();
  }

  void Leave() {
    if (warning_.count() == 0) return;
    bool clear = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_collective_ = false;
      clear = published_;
      published_ = false;
    }
    if (clear) (void)store_.Set(key_, "");
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (!in_collective_ || published_) {
        wake_.wait_for(lock, std::chrono::seconds(1));
        continue;
      }
      auto due = since_ + warning_;
      if (std::chrono::steady_clock::now() < due) {
        wake_.wait_until(lock, due);
        continue;
      }
      published_ = true;
      std::string value = op_;
      lock.unlock();
      (void)store_.Set(key_, value);
      lock.lock();
    }
  }

  rendezvous::Store& store_;
  const std::string key_;
  const std::string communicator_;
  const std::chrono::seconds warning_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stop_ = false;
  bool in_collective_ = false;
  bool published_ = false;
  uint64_t sequence_ = 0;
  std::string op_;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace

class Communicator::Impl {
 public:
  Impl(std::shared_ptr<rendezvous::Store> store, const RankInfo& info,
       const CommunicatorOptions& options)
      : store_(std::move(store)), info_(info) {
    if (store_ == nullptr) throw InvalidArgumentError("a communicator needs a store (got null)");
    stall_watch_ = std::make_unique<StallWatch>(*store_, info_.rank, options.name);
    if (info_.size < 1 || info_.rank < 0 || info_.rank >= info_.size) {
      throw InvalidArgumentError(MakeMessage("rank ", info_.rank, " is not in [0, ", info_.size,
                                             "); pass a rank below the communicator's size"));
    }
    internal::TcpOptions tcp;
    tcp.name = options.name;
    tcp.listen_host = internal::ChooseListenHost(options.listen_address);
    tcp.token = options.job_token.empty() ? EnvOr(env::kJobToken) : options.job_token;
    tcp.job_id = options.job_id.empty() ? EnvOr(env::kJobId) : options.job_id;
    tcp.timeout = options.timeout.count() > 0
                      ? options.timeout
                      : std::chrono::milliseconds(env::kTimeoutSeconds.Get() * 1000);
    tcp.sockets_per_peer = static_cast<int>(std::max<int64_t>(1, env::kSocketsPerPeer.Get()));
    tcp.buffer_bytes = static_cast<int>(env::kSocketBufferBytes.Get());
    // Spinning only pays when every rank on this host has a core of its own.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    if (static_cast<unsigned>(info_.local_size) <= cores) {
      tcp.spin = std::chrono::microseconds(env::kSpinMicroseconds.Get());
    }
    segment_bytes_ = static_cast<size_t>(std::max<int64_t>(4096, env::kRingSegmentBytes.Get()));
    small_bytes_ = static_cast<size_t>(std::max<int64_t>(0, env::kSmallAllreduceBytes.Get()));
    internal::ShmOptions shm;
    shm.timeout = tcp.timeout;
    shm.spin = tcp.spin;
    shm.chunk_bytes = static_cast<size_t>(std::max<int64_t>(4096, env::kShmChunkBytes.Get()));
    shm.small_bytes = static_cast<size_t>(std::max<int64_t>(0, env::kShmSmallBytes.Get()));
    shm.channel_bytes = static_cast<size_t>(std::max<int64_t>(4096, env::kShmChannelBytes.Get()));
    const std::string mode = options.transport.empty() ? env::kTransport.Get() : options.transport;
    try {
      transport_ =
          internal::MakeTransport(*store_, info_, mode, tcp, shm, segment_bytes_, small_bytes_);
    } catch (const Error& e) {
      Report(-1, e.what());
      throw;
    }
  }

  const RankInfo& info() const { return info_; }
  const char* transport_name() const { return transport_->name(); }

  // Run runs one collective; a failure breaks the communicator, tells the peers and the rendezvous
  // who is to blame, and propagates.
  template <typename F>
  void Run(const char* op, F&& body) {
    if (!broken_.empty()) {
      throw IoError(MakeMessage("rank ", info_.rank, ": this communicator failed earlier (",
                                broken_, "); it cannot be used again"));
    }
    internal::AlgorithmContext ctx{*transport_, segment_bytes_, small_bytes_, scratch_};
    stall_watch_->Enter(op);
    try {
      body(ctx);
      stall_watch_->Leave();
    } catch (const Error& e) {
      stall_watch_->Leave();
      if (dynamic_cast<const InvalidArgumentError*>(&e) != nullptr) throw;
      broken_ = e.what();
      const int peer = transport_->failed_peer();
      transport_->Abort(peer, e.what());
      Report(peer, e.what());
      throw;
    }
  }

 private:
  static std::string EnvOr(const char* name) { return env::Lookup(name).value_or(""); }

  void Report(int peer, const std::string& message) {
    if (peer < 0 && transport_ != nullptr) peer = transport_->failed_peer();
    if (peer >= 0) (void)store_->ReportPeerFailure(info_.rank, peer, message);
  }

  std::shared_ptr<rendezvous::Store> store_;
  RankInfo info_;
  std::unique_ptr<internal::Transport> transport_;
  std::vector<char> scratch_;
  size_t segment_bytes_ = 0;
  size_t small_bytes_ = 0;
  std::string broken_;
  std::unique_ptr<StallWatch> stall_watch_;  // after transport_: stopped before it is destroyed
};

namespace {

RankInfo SingleHost(int rank, int size) {
  RankInfo info;
  info.rank = rank;
  info.size = size;
  info.local_rank = rank;
  info.local_size = size;
  return info;
}

void CheckType(DataType type) {
  if (static_cast<int>(type) < 0 || static_cast<int>(type) > static_cast<int>(DataType::kInt8)) {
    throw InvalidArgumentError(MakeMessage("unknown data type ", static_cast<int>(type)));
  }
}

void CheckOp(ReduceOp op) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) > static_cast<int>(ReduceOp::kProduct)) {
    throw InvalidArgumentError(MakeMessage("unknown reduce op ", static_cast<int>(op)));
  }
}

void CheckBuffer(const void* p, size_t count, const char* what) {
  if (p == nullptr && count > 0) {
    throw InvalidArgumentError(MakeMessage(what, " is null but ", count, " elements were asked"));
  }
}

}  // namespace

Communicator::Communicator(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                           CommunicatorOptions options)
    : Communicator(std::move(store), SingleHost(rank, size), std::move(options)) {}

Communicator::Communicator(std::shared_ptr<rendezvous::Store> store, const RankInfo& info,
                           CommunicatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(store), info, options)) {}

Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->info().rank; }
int Communicator::size() const { return impl_->info().size; }
const RankInfo& Communicator::info() const { return impl_->info(); }
const char* Communicator::transport() const { return impl_->transport_name(); }

void Communicator::Allreduce(const void* input, void* output, size_t count, DataType type,
                             ReduceOp op) {
  CheckType(type);
  CheckOp(op);
  CheckBuffer(input, count, "allreduce input");
  CheckBuffer(output, count, "allreduce output");
  impl_->Run("allreduce", [&](internal::AlgorithmContext& ctx) {
    if (!ctx.transport.TryAllreduce(input, output, count, type, op)) {
      internal::Allreduce(ctx, input, output, count, type, op);
    }
  });
}

void Communicator::Broadcast(void* data, size_t count, DataType type, int root) {
  CheckType(type);
  CheckBuffer(data, count, "broadcast buffer");
  if (root < 0 || root >= size()) {
    throw InvalidArgumentError(
        MakeMessage("broadcast root ", root, " is not a rank of this communicator of ", size()));
  }
  impl_->Run("broadcast", [&](internal::AlgorithmContext& ctx) {
    internal::Broadcast(ctx, data, count * ElementSize(type), root);
  });
}

void Communicator::Allgather(const void* input, void* output, size_t count, DataType type) {
  Allgatherv(input, output, std::vector<size_t>(size(), count), type);
}

void Communicator::Allgatherv(const void* input, void* output, const std::vector<size_t>& counts,
                              DataType type) {
  CheckType(type);
  if (static_cast<int>(counts.size()) != size()) {
    throw InvalidArgumentError(MakeMessage("allgatherv got ", counts.size(), " counts for ", size(),
                                           " ranks; pass one count per rank"));
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  CheckBuffer(input, counts[rank()], "allgather input");
  CheckBuffer(output, total, "allgather output");
  impl_->Run("allgather", [&](internal::AlgorithmContext& ctx) {
    internal::Allgatherv(ctx, input, output, counts, type);
  });
}

void Communicator::ReduceScatter(const void* input, void* output, size_t count, DataType type,
                                 ReduceOp op) {
  CheckType(type);
  CheckOp(op);
  CheckBuffer(input, count, "reduce-scatter input");
  CheckBuffer(output, count, "reduce-scatter output");
  impl_->Run("reduce_scatter", [&](internal::AlgorithmContext& ctx) {
    internal::ReduceScatter(ctx, input, output, count, type, op);
  });
}

void Communicator::Barrier() {
  impl_->Run("barrier", [&](internal::AlgorithmContext& ctx) { internal::Barrier(ctx); });
}

}  // namespace trainrun::collectives
