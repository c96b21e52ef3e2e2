#include "trainrun/collectives/communicator.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "adasum.h"
#include "algorithms.h"
#include "attribution.h"
#include "call_check.h"
#include "negotiation.h"
#include "socket.h"
#include "subset_transport.h"
#include "tcp_transport.h"
#include "timeline.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/stall_report.h"
#include "transport_select.h"

namespace trainrun::collectives {

using ::trainrun::internal::MakeMessage;

namespace {

// StallWatch publishes, through the rendezvous, a collective that has waited longer than the stall
// warning time (env::kStallWarningSeconds), so that the launcher can say which ranks wait in which
// collective and which have not joined it; and clears it when the collective completes.
//
// A collective only notes, in atomics of its own, which it is and since when (a coarse clock, a
// few ns): it never wakes the thread and takes no lock unless a warning is out. The thread sleeps
// until the collective it last saw would be due (or a whole warning time when none was running),
// so it wakes about once per warning time, and a collective that started while it slept is due no
// earlier than it wakes. Waking it per collective cost a thread switch and a contended lock per
// call (hundreds of µs per small allreduce on a loaded machine); an uncontended lock around each
// note, ~100 instructions of a small allreduce's ~1,100.
class StallWatch {
 public:
  StallWatch(rendezvous::Store& store, int rank, std::string communicator)
      : store_(store),
        key_(MakeMessage(env::kStallKeyPrefix, rank)),
        communicator_(std::move(communicator)),
        warning_(std::chrono::seconds(env::kStallWarningSeconds.Get())) {}
  ~StallWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // `op` must outlive the communicator (the collectives pass string literals); `name` is the
  // collective's name as its call record holds it (kNameBytes, NUL-padded), or null. The name is
  // copied, in words, so that Watch may read it while the caller goes on (the sequence number
  // tells a torn copy).
  void Enter(const char* op, const char* name) {
    if (warning_.count() == 0) return;
    if (!started_) {
      std::lock_guard<std::mutex> lock(mutex_);
      thread_ = std::thread([this] { Watch(); });
      started_ = true;
    }
    // The sequence first (a seqlock's writer): Watch, having read the name, sees it moved.
    sequence_.store(sequence_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    uint64_t words[kNameWords] = {};
    if (name != nullptr) std::memcpy(words, name, sizeof(words));
    for (int i = 0; i < kNameWords; ++i) name_[i].store(words[i], std::memory_order_relaxed);
    op_.store(op, std::memory_order_relaxed);
    since_.store(CoarseNow(), std::memory_order_relaxed);
    in_collective_.store(true, std::memory_order_release);
  }

  void Leave() {
    if (warning_.count() == 0) return;
    // No fence here (a fence would wait for this call's stores to shared memory to reach the
    // peers): a warning Watch publishes as this collective ends is either seen here and cleared,
    // after Watch's Set (it holds the lock through it), or cleared by Watch itself, which looks at
    // in_collective_ again after its Set (a store to the rendezvous, long after this one).
    in_collective_.store(false, std::memory_order_release);
    if (!published_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!published_.load()) return;
    published_.store(false);
    (void)store_.Set(key_, "");
  }

 private:
  // CoarseNow: CLOCK_MONOTONIC_COARSE in ns (a tick's resolution, for warnings of seconds).
  static int64_t CoarseNow() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  }

  void Watch() {
    const int64_t warning_ns = std::chrono::nanoseconds(warning_).count();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      const uint64_t sequence = sequence_.load(std::memory_order_acquire);
      if (!in_collective_.load(std::memory_order_acquire) || published_.load()) {
        wake_.wait_for(lock, warning_);
        continue;
      }
      const int64_t due = since_.load(std::memory_order_relaxed) + warning_ns;
      const int64_t now = CoarseNow();
      if (now < due || sequence_.load(std::memory_order_acquire) != sequence) {
        wake_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(due - now, 1000000)));
        continue;
      }
      published_.store(true);
      if (!in_collective_.load() || sequence_.load() != sequence) {
        published_.store(false);  // it left meanwhile; Leave waits for the lock, then sees false
        continue;
      }
      const char* op = op_.load(std::memory_order_relaxed);
      uint64_t words[kNameWords + 1] = {};  // NUL-terminated whatever the copy holds
      for (int i = 0; i < kNameWords; ++i) words[i] = name_[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (sequence_.load(std::memory_order_relaxed) != sequence) {
        published_.store(false);  // a later collective began while the name was read
        continue;
      }
      rendezvous::StallReport report;
      report.collective =
          rendezvous::DescribeCollective(op, reinterpret_cast<const char*>(words), sequence);
      if (!communicator_.empty() && communicator_ != "world") {
        report.collective += MakeMessage(" of '", communicator_, "'");
      }
      report.waited =
          std::chrono::milliseconds((now - since_.load(std::memory_order_relaxed)) / 1000000);
      (void)store_.Set(key_, report.Encode());
      if (!in_collective_.load() || sequence_.load() != sequence) {
        published_.store(false);  // it ended while the warning went out (Leave)
        (void)store_.Set(key_, "");
      }
    }
  }

  rendezvous::Store& store_;
  const std::string key_;
  const std::string communicator_;
  const std::chrono::seconds warning_;
  std::mutex mutex_;  // the thread's sleep and stop; a published warning's Set and clearing
  std::condition_variable wake_;
  std::thread thread_;
  bool started_ = false;  // the collective's thread only
  bool stop_ = false;
  std::atomic<bool> in_collective_{false};
  std::atomic<bool> published_{false};
  std::atomic<uint64_t> sequence_{0};
  std::atomic<const char*> op_{""};
  std::atomic<int64_t> since_{0};
  static constexpr int kNameWords = internal::CallRecord::kNameBytes / 8;
  std::atomic<uint64_t> name_[kNameWords] = {};
};

}  // namespace

class Communicator::Impl {
 public:
  bool broken() const { return !broken_.empty(); }
  Impl(std::shared_ptr<rendezvous::Store> store, const RankInfo& info,
       const CommunicatorOptions& options)
      : store_(std::move(store)), info_(info), job_rank_(info.rank) {
    if (store_ == nullptr) throw InvalidArgumentError("a communicator needs a store (got null)");
    CheckRankSettings();
    stall_watch_ = std::make_unique<StallWatch>(*store_, info_.rank, options.name);
    attribution_ = std::make_unique<internal::Attribution>(store_, info_.rank);
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
    tcp.interrupt = options.interrupt;
    tcp.sockets_per_peer = static_cast<int>(env::kSocketsPerPeer.Get());
    tcp.buffer_bytes = static_cast<int>(env::kSocketBufferBytes.Get());
    // Spinning only pays when every rank on this host has a core of its own.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    if (static_cast<unsigned>(info_.local_size) <= cores) {
      tcp.spin = std::chrono::microseconds(env::kSpinMicroseconds.Get());
    }
    segment_bytes_ = static_cast<size_t>(env::kRingSegmentBytes.Get());
    small_bytes_ = static_cast<size_t>(env::kSmallAllreduceBytes.Get());
    internal::ShmOptions shm;
    shm.timeout = tcp.timeout;
    shm.spin = tcp.spin;
    const std::string wait = env::kShmWait.Get();
    if (wait == "adaptive") {
      // An adaptive wait spins only while the ranks waited on run on other CPUs, so it may spin
      // however many ranks share the cores.
      shm.wait = internal::ShmWait::kAdaptive;
      shm.spin = std::chrono::microseconds(env::kSpinMicroseconds.Get());
    } else if (wait == "spin") {
      shm.wait = internal::ShmWait::kSpin;
    } else {  // "sleep": kShmWait accepts nothing else
      shm.wait = internal::ShmWait::kSleep;
    }
    shm.chunk_bytes = static_cast<size_t>(env::kShmChunkBytes.Get());
    shm.across_chunk_bytes = static_cast<size_t>(env::kHierarchicalChunkBytes.Get());
    shm.small_bytes = static_cast<size_t>(env::kShmSmallBytes.Get());
    shm.channel_bytes = static_cast<size_t>(env::kShmChannelBytes.Get());
    std::string mode = env::kTransport.Get();
    if (!options.transport.empty()) {
      absl::StatusOr<std::string> given = env::kTransport.Parse(options.transport);
      if (!given.ok()) {
        throw InvalidArgumentError(MakeMessage("CommunicatorOptions::transport '",
                                               options.transport, "' is not auto, tcp or shm"));
      }
      mode = *given;
    }
    check_calls_ = env::kCheckShapes.Get() != 0;
    timeline_ = std::make_shared<internal::Timeline>();
    std::string trace = env::kTimeline.Get();
    if (trace.empty()) trace = EnvOr(env::kHorovodTimeline);
    // Horovod's "DYNAMIC" means: no timeline now, start_timeline() may start one later.
    if (!trace.empty() && trace != "DYNAMIC") timeline_->Start(trace, info_.rank);
    try {
      transport_ =
          internal::MakeTransport(*store_, info_, mode, tcp, shm, segment_bytes_, small_bytes_);
    } catch (const Error& e) {
      Report(-1, e.what());
      throw;
    }
  }

  // Impl for a subset `ranks` of `parent`'s ranks, over its connections.
  Impl(const Impl& parent, const std::vector<int>& ranks, std::string set_name)
      : store_(parent.store_),
        job_rank_(parent.job_rank_),
        set_name_(std::move(set_name)),
        segment_bytes_(parent.segment_bytes_),
        small_bytes_(parent.small_bytes_),
        check_calls_(parent.check_calls_),
        timeline_(parent.timeline_) {
    const int me =
        static_cast<int>(std::find(ranks.begin(), ranks.end(), parent.info_.rank) - ranks.begin());
    info_.rank = me;
    info_.size = static_cast<int>(ranks.size());
    info_.local_rank = me;
    info_.local_size = info_.size;
    transport_ = std::make_shared<internal::SubsetTransport>(parent.transport_, ranks, me);
    stall_watch_ = std::make_unique<StallWatch>(*store_, job_rank_, set_name_);
    attribution_ = std::make_unique<internal::Attribution>(store_, job_rank_);
  }

  const RankInfo& info() const { return info_; }
  int job_rank() const { return job_rank_; }
  const char* transport_name() const { return transport_->name(); }
  const std::string& set_name() const { return set_name_; }

  // Run runs one collective; a failure breaks the communicator, tells the peers and the rendezvous
  // who is to blame, and propagates.
  // `call` describes it to the peers first (call_check.h); a mismatch throws MismatchError on every
  // rank and leaves the communicator as it was.
  template <typename F>
  void Run(const internal::CallRecord& call, F&& body) {
    const bool traced = timeline_->enabled();
    const int64_t start = traced ? internal::Timeline::Now() : 0;
    int64_t agreed = start;
    Guard(internal::KindName(call.kind), call.name, BytesOf(call),
          [&](internal::AlgorithmContext& ctx) {
            if (check_calls_ && info_.size > 1) {
              const internal::CallRecord& mine = Sampled(call);
              const std::vector<internal::CallRecord> records =
                  internal::ExchangeRecords(ctx, mine);
              if (&mine == &sampled_)
                attribution_->Observe(records.data(), records.size(), info_.rank);
              internal::CheckAgreement(records, set_name_);
            }
            if (traced) agreed = internal::Timeline::Now();
            body(ctx);
          });
    if (traced) timeline_->Record(call, set_name_, start, agreed, internal::Timeline::Now());
  }

  // RunReady runs Communicator::AllreduceReady (see there) and sets `k` (1 until the ranks have
  // agreed); what the k together fail with propagates.
  void RunReady(const std::vector<Communicator::ReadyAllreduce>& ready, DataType type, ReduceOp op,
                size_t& k) {
    const bool traced = timeline_->enabled();
    const int64_t start = traced ? internal::Timeline::Now() : 0;
    int64_t agreed = start;
    internal::CallRecord call =
        internal::DescribeCall(internal::CollectiveKind::kAllreduce, type, ready[0].count,
                               static_cast<int>(op), *ready[0].check);
    call.ready = ready.size();
    if (check_calls_ && ready.size() > 1) call.ready_hash = RestHash(ready, ready.size());
    k = 1;
    uint64_t bytes = 0;
    for (const Communicator::ReadyAllreduce& r : ready) bytes += r.count * ElementSize(type);
    if (attribution_->Due()) attribution_->Stamp(call);
    const bool sampled = call.sample_sequence != 0;
    Guard("allreduce", call.name, bytes, [&](internal::AlgorithmContext& ctx) {
      size_t agreed_k = ready.size();
      if (info_.size > 1) {
        // The exchange happens even when checks are off: it is how the ranks agree on k. Where
        // the transport can, ready[0]'s data goes with it, and is reduced right there when k is 1
        // (one synchronisation, as a lone Allreduce).
        std::vector<internal::CallRecord> records(info_.size);
        bool joined = false;
        auto fewest_ready = [&] {
          size_t fewest = ready.size();
          joined = false;
          for (const internal::CallRecord& r : records) {
            // A joined rank (or one whose call cannot be fused) takes part in one allreduce.
            joined |= r.kind == kJoinKind;
            const uint64_t theirs = r.kind == kJoinKind ? 1 : std::max<uint64_t>(r.ready, 1);
            fewest = std::min<size_t>(fewest, theirs);
          }
          return fewest;
        };
        bool reduced = false;
        const bool folded = ctx.transport.TryCheckedAllreduce(
            ready[0].data, ready[0].data, ready[0].count, type, op, &call, sizeof(call),
            records.data(), [&](bool same) {
              if (same) records.assign(records.size(), call);
              if (sampled) attribution_->Observe(records.data(), records.size(), info_.rank);
              reduced = fewest_ready() == 1 && !joined &&
                        (!check_calls_ || internal::Disagreement(records, set_name_).empty());
              return reduced;
            });
        if (!folded) {
          records = internal::ExchangeRecords(ctx, call);
          if (sampled) attribution_->Observe(records.data(), records.size(), info_.rank);
        }
        if (check_calls_) internal::CheckAgreement(records, set_name_);
        if (reduced) {
          if (traced) agreed = internal::Timeline::Now();
          return;  // k = 1, done
        }
        agreed_k = fewest_ready();
        // Every rank has the same allreduces ready (the common case: each queued them all before
        // its thread looked): agreed, without a second synchronisation.
        const bool all_agree = std::all_of(records.begin(), records.end(), [&](const auto& r) {
          return r.ready == ready.size() && r.ready_hash == call.ready_hash;
        });
        if (agreed_k > 1 && check_calls_ && !all_agree) {
          // The other k - 1 as one record: on a disagreement, ready[0] runs alone and the caller
          // goes on one call at a time, so that the culprit gets its own message.
          internal::CallRecord rest = internal::DescribeCall(
              internal::CollectiveKind::kAllreduce, type, 0, static_cast<int>(op), CallCheck{},
              false, RestHash(ready, agreed_k));
          for (size_t i = 1; i < agreed_k; ++i) rest.count += ready[i].count;
          if (!internal::Disagreement(internal::ExchangeRecords(ctx, rest), set_name_).empty()) {
            agreed_k = 1;
          }
        }
      }
      k = agreed_k;
      if (traced) agreed = internal::Timeline::Now();
      if (k == 1) {
        RunAllreduce(ctx, ready[0].data, ready[0].data, ready[0].count, type, op);
        return;
      }
      std::vector<internal::Transport::Piece> pieces;
      size_t total = 0;
      const size_t e = ElementSize(type);
      for (size_t i = 0; i < k; ++i) {
        total += ready[i].count;
        if (ready[i].count == 0) continue;
        auto* data = static_cast<char*>(ready[i].data);
        // Buffers one after another in memory (GPU buffers staged together) are one piece; not
        // for Adasum, whose pieces are tensors, each with dot products of its own.
        if (op != ReduceOp::kAdasum && !pieces.empty() &&
            pieces.back().data + pieces.back().count * e == data) {
          pieces.back().count += ready[i].count;
        } else {
          pieces.push_back({data, ready[i].count});
        }
      }
      AllreducePieces(ctx, pieces, total, type, op, /*overlap=*/false);
    });
    if (traced) {
      for (size_t i = 1; i < k; ++i) call.count += ready[i].count;
      timeline_->Record(call, set_name_, start, agreed, internal::Timeline::Now());
    }
  }

  // AllreducePieces reduces `pieces` (`total` elements in all) in place as one allreduce of their
  // concatenation: where they are when the transport can and they do not overlap, else through
  // one contiguous copy (kept for the next call).
  void AllreducePieces(internal::AlgorithmContext& ctx,
                       const std::vector<internal::Transport::Piece>& pieces, size_t total,
                       DataType type, ReduceOp op, bool overlap) {
    if (ctx.transport.size() == 1) return;  // in place among one rank: nothing to do
    if (op == ReduceOp::kAdasum) return AdasumPieces(ctx, pieces, total, type);
    if (pieces.size() <= 1) {  // as Allreduce of that buffer (or of nothing)
      char* data = pieces.empty() ? nullptr : pieces[0].data;
      RunAllreduce(ctx, data, data, total, type, op);
      return;
    }
    if (!overlap && ctx.transport.TryAllreducePieces(pieces, total, type, op)) return;
    const size_t e = ElementSize(type);
    if (fusion_buffer_.size() < total * e) fusion_buffer_.resize(total * e);
    char* flat = fusion_buffer_.data();
    size_t at = 0;
    for (const auto& piece : pieces) {
      std::memcpy(flat + at, piece.data, piece.count * e);
      at += piece.count * e;
    }
    RunAllreduce(ctx, flat, flat, total, type, op);
    at = 0;
    for (const auto& piece : pieces) {
      std::memcpy(piece.data, flat + at, piece.count * e);
      at += piece.count * e;
    }
  }

  // AdasumPieces is AllreducePieces for Adasum: each piece is a tensor of its own (its own dot
  // products), combined in one contiguous copy unless there is a single piece.
  void AdasumPieces(internal::AlgorithmContext& ctx,
                    const std::vector<internal::Transport::Piece>& pieces, size_t total,
                    DataType type) {
    if (pieces.size() == 1) {
      internal::AdasumAllreduce(ctx, pieces[0].data, {pieces[0].count}, type);
      return;
    }
    const size_t e = ElementSize(type);
    if (fusion_buffer_.size() < total * e) fusion_buffer_.resize(total * e);
    char* flat = fusion_buffer_.data();
    std::vector<size_t> counts;
    size_t at = 0;
    for (const auto& piece : pieces) {
      std::memcpy(flat + at, piece.data, piece.count * e);
      at += piece.count * e;
      counts.push_back(piece.count);
    }
    internal::AdasumAllreduce(ctx, flat, counts, type);
    at = 0;
    for (const auto& piece : pieces) {
      std::memcpy(piece.data, flat + at, piece.count * e);
      at += piece.count * e;
    }
  }

  // RunAllreduceChecked is Run(call, RunAllreduce(...)), with the call records exchanged in the
  // allreduce's own step where the transport can (a small allreduce over shared memory): one
  // synchronisation instead of two. A mismatch still throws on every rank; when a rank has
  // joined, its zeros come in a second step, as it expects (Join).
  void RunAllreduceChecked(const internal::CallRecord& call, const void* input, void* output,
                           size_t count, DataType type, ReduceOp op) {
    if (!check_calls_ || info_.size == 1) {
      Run(call, [&](internal::AlgorithmContext& ctx) {
        RunAllreduce(ctx, input, output, count, type, op);
      });
      return;
    }
    const bool traced = timeline_->enabled();
    const int64_t start = traced ? internal::Timeline::Now() : 0;
    int64_t agreed = start;
    const internal::CallRecord& mine = Sampled(call);
    Guard(internal::KindName(call.kind), call.name, count * ElementSize(type),
          [&](internal::AlgorithmContext& ctx) {
            // The records' buffer is kept from call to call (no allocation on a small allreduce's
            // path), and the common case (every rank made the same call) is one comparison of
            // bytes.
            std::vector<internal::CallRecord>& records = records_;
            records.resize(info_.size);
            bool unanimous = false;
            const bool folded = ctx.transport.TryCheckedAllreduce(
                input, output, count, type, op, &mine, sizeof(mine), records.data(),
                [&](bool same) { return FoldedRecordsAgree(mine, same, unanimous); });
            SettleRecords(ctx, mine, folded, unanimous);
            if (traced) agreed = internal::Timeline::Now();
            if (!folded || (!unanimous && AnyJoined()))
              RunAllreduce(ctx, input, output, count, type, op);
          });
    if (traced) timeline_->Record(call, set_name_, start, agreed, internal::Timeline::Now());
  }

  // FoldedRecordsAgree is the decision a transport's checked allreduce asks for once every rank's
  // record is in records_ (`same`: every record the same bytes as `mine`, and not copied): whether
  // to reduce in that same step. Every rank the same call and none joined: yes (`unanimous`); a
  // join or a disagreement: no.
  bool FoldedRecordsAgree(const internal::CallRecord& mine, bool same, bool& unanimous) {
    std::vector<internal::CallRecord>& records = records_;
    unanimous = same ? mine.kind != kJoinKind : internal::Unanimous(records.data(), records.size());
    if (same && !unanimous) records.assign(records.size(), mine);
    if (&mine == &sampled_) {
      attribution_->Observe(same ? &mine : records.data(), same ? 1 : records.size(), info_.rank);
    }
    return unanimous || (!AnyJoined() && internal::Disagreement(records, set_name_).empty());
  }

  // SettleRecords follows a checked allreduce: the records exchanged on their own where the
  // transport could not fold them, then a mismatch thrown on every rank.
  void SettleRecords(internal::AlgorithmContext& ctx, const internal::CallRecord& mine, bool folded,
                     bool unanimous) {
    if (!folded) {
      records_ = internal::ExchangeRecords(ctx, mine);
      if (&mine == &sampled_) attribution_->Observe(records_.data(), records_.size(), info_.rank);
    }
    if (!unanimous) internal::CheckAgreement(records_, set_name_);
  }

  bool AnyJoined() const {
    return std::any_of(records_.begin(), records_.end(),
                       [](const internal::CallRecord& r) { return r.kind == kJoinKind; });
  }

  // RunAllreduceCopies is RunAllreduceChecked of a buffer reached through `copies`, where the
  // transport takes it (Transport::CanAllreduceCopies); false, having done nothing, where not.
  bool RunAllreduceCopies(const internal::CallRecord& call, BufferCopies& copies, size_t count,
                          DataType type, ReduceOp op) {
    if (!transport_->CanAllreduceCopies(count, type, op)) return false;
    auto run = [&](internal::AlgorithmContext& ctx) {
      TRAINRUN_ENFORCE(ctx.transport.TryAllreduceCopies(copies, count, type, op),
                       "the transport refused an allreduce through copies it said it takes");
    };
    if (!check_calls_ || info_.size == 1) {
      Run(call, run);
      return true;
    }
    const bool traced = timeline_->enabled();
    const int64_t start = traced ? internal::Timeline::Now() : 0;
    int64_t agreed = start;
    const internal::CallRecord& mine = Sampled(call);
    Guard(internal::KindName(call.kind), call.name, count * ElementSize(type),
          [&](internal::AlgorithmContext& ctx) {
            std::vector<internal::CallRecord>& records = records_;
            records.resize(info_.size);
            bool unanimous = false;
            const bool folded = ctx.transport.TryCheckedAllreduceCopies(
                copies, count, type, op, &mine, sizeof(mine), records.data(),
                [&](bool same) { return FoldedRecordsAgree(mine, same, unanimous); });
            SettleRecords(ctx, mine, folded, unanimous);
            if (traced) agreed = internal::Timeline::Now();
            if (!folded || (!unanimous && AnyJoined())) run(ctx);
          });
    if (traced) timeline_->Record(call, set_name_, start, agreed, internal::Timeline::Now());
    return true;
  }

  internal::Timeline& timeline() { return *timeline_; }

  // Refuse stands in for a `kind` collective this rank refused for its arguments
  // (Communicator::Refuse): a call record of kind kRefused, named as the call, that the others
  // compare with theirs. Only the name goes with it: the rest was what this rank got wrong.
  void Refuse(internal::CollectiveKind kind, const CallCheck& check) {
    if (!check_calls_ || info_.size == 1) return;
    CallCheck named;
    named.name = check.name;
    Run(internal::DescribeCall(internal::CollectiveKind::kRefused, DataType::kUInt8, 0,
                               static_cast<int>(kind), named),
        [](internal::AlgorithmContext&) {});
  }

  // Checked runs `checks`, the argument checks of a `kind` collective; what they refuse is told
  // to the other ranks (Refuse) before it propagates, and the error this rank raises is its own.
  template <typename F>
  void Checked(internal::CollectiveKind kind, const CallCheck& check, F&& checks) {
    try {
      checks();
    } catch (const MismatchError&) {
      throw;
    } catch (const InvalidArgumentError&) {
      try {
        Refuse(kind, check);
      } catch (const InvalidArgumentError&) {  // some ranks made the call: they raise too
      }
      throw;
    }
  }

  std::vector<uint64_t> ExchangeKeys(const std::vector<uint64_t>& mine) {
    const size_t words = mine.size();
    const size_t n = static_cast<size_t>(info_.size);
    std::vector<uint64_t> all(words * n);
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(words * info_.rank));
    if (n == 1) return all;
    Guard("negotiation", nullptr, words * 8, [&](internal::AlgorithmContext& ctx) {
      internal::Allgatherv(ctx, all.data() + words * info_.rank, all.data(),
                           std::vector<size_t>(n, words * sizeof(uint64_t)), DataType::kUInt8);
    });
    return all;
  }

  // Join takes part, with zeros, in the allreduces (sum, average) and barriers the other ranks
  // run, until every rank has joined; returns the last rank to join (the highest of those that
  // joined in the same round), the same on every rank.
  int Join() {
    if (info_.size == 1) return 0;
    if (!check_calls_) {
      throw InvalidArgumentError(
          "join() needs the ranks to describe their collectives to each other; unset "
          "TRAINRUN_CHECK_SHAPES=0");
    }
    int last = -1;
    Guard("join", nullptr, 0, [&](internal::AlgorithmContext& ctx) {
      for (int round = 0; last < 0; ++round) {
        if (round > 0) attribution_->Skip();  // each round meets one collective of the others
        auto records = internal::ExchangeRecords(
            ctx, internal::DescribeCall(internal::CollectiveKind::kJoin, DataType::kUInt8, 0, round,
                                        CallCheck{}));
        last = LastToJoin(records);
        if (last >= 0) continue;
        if (!internal::Disagreement(records, set_name_).empty()) {
          // The others' next collectives differ by name: they negotiate their order
          // (comm_thread.h), and this rank takes part, with no collectives of its own.
          if (internal::NamesDiffer(records)) NegotiateJoined(ctx);
          continue;
        }
        const internal::CallRecord& call =
            *std::find_if(records.begin(), records.end(),
                          [](const internal::CallRecord& r) { return r.kind != kJoinKind; });
        if (call.kind == static_cast<uint32_t>(internal::CollectiveKind::kBarrier)) {
          internal::Barrier(ctx);
          continue;
        }
        const auto type = static_cast<DataType>(call.dtype);
        join_zeros_.assign(call.count * ElementSize(type), 0);
        RunAllreduce(ctx, join_zeros_.data(), join_zeros_.data(), call.count, type,
                     static_cast<ReduceOp>(call.op_or_root));
      }
    });
    return last;
  }

  // NegotiateJoined takes part, for a rank in join(), in the rounds of the others' negotiation
  // (CommThread::Negotiate, negotiation.h) with no keys, until they decide alike.
  void NegotiateJoined(internal::AlgorithmContext& ctx) {
    using internal::Negotiation;
    const size_t n = static_cast<size_t>(info_.size);
    const uint64_t tag = Negotiation::Tag(set_name_, n);
    const int64_t timeout_ms = env::kTimeoutSeconds.Get() * 1000;
    const auto started = std::chrono::steady_clock::now();
    std::vector<uint64_t> all(Negotiation::kWords * n);
    std::vector<uint64_t> common;
    int stuck_rounds = 0;
    while (true) {
      std::fill(all.begin(), all.end(), 0);
      uint64_t* mine = all.data() + Negotiation::kWords * static_cast<size_t>(info_.rank);
      mine[1] = Negotiation::kJoined;
      mine[2] = tag;
      mine[3] = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - started)
                                          .count());
      internal::Allgatherv(ctx, mine, all.data(),
                           std::vector<size_t>(n, Negotiation::kWords * sizeof(uint64_t)),
                           DataType::kUInt8);
      if (Negotiation::Decide(all, n, tag, timeout_ms, &stuck_rounds, &common) !=
          Negotiation::Outcome::kAgain) {
        return;
      }
    }
  }

  // RunAllreduce is the allreduce every rank runs, joined ones included: the transport's own way
  // when it has one, else the algorithms.
  static void RunAllreduce(internal::AlgorithmContext& ctx, const void* input, void* output,
                           size_t count, DataType type, ReduceOp op) {
    if (op == ReduceOp::kAdasum) {  // over Send/Recv on every transport
      if (input != output) std::memcpy(output, input, count * ElementSize(type));
      internal::AdasumAllreduce(ctx, output, {count}, type);
      return;
    }
    if (!ctx.transport.TryAllreduce(input, output, count, type, op)) {
      internal::Allreduce(ctx, input, output, count, type, op);
    }
  }

 private:
  static constexpr uint32_t kJoinKind = static_cast<uint32_t>(internal::CollectiveKind::kJoin);

  // RestHash is a hash of what must agree about ready[1..k): each one's call record (its compared
  // fields, a word at a time: 200 queued allreduces hash in a few µs).
  static uint64_t RestHash(const std::vector<Communicator::ReadyAllreduce>& ready, size_t k) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t word) {
      h = (h ^ word) * 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
    };
    for (size_t i = 1; i < k; ++i) {
      internal::CallRecord r =
          internal::DescribeCall(internal::CollectiveKind::kAllreduce, DataType::kUInt8,
                                 ready[i].count, 0, *ready[i].check);
      mix(r.count);
      mix(r.name_hash);
      mix(static_cast<uint64_t>(static_cast<uint32_t>(r.ndim)));
      for (int64_t d : r.dims) mix(static_cast<uint64_t>(d));
    }
    return h | 1;
  }

  // LastToJoin returns the last rank to join once every record is a join, else -1.
  static int LastToJoin(const std::vector<internal::CallRecord>& records) {
    int last = -1;
    int fewest = 0;
    for (int r = 0; r < static_cast<int>(records.size()); ++r) {
      if (records[r].kind != kJoinKind) return -1;
      if (last < 0 || records[r].op_or_root <= fewest) {
        last = r;
        fewest = records[r].op_or_root;
      }
    }
    return last;
  }

  // Guard runs `body` on this communicator; a failure other than bad arguments (a mismatch
  // included) breaks the communicator, tells the peers and the rendezvous who is to blame, and
  // propagates.
  // `name`: the collective's name as its call record holds it (kNameBytes), or null.
  template <typename F>
  void Guard(const char* op, const char* name, uint64_t bytes, F&& body) {
    if (!broken_.empty()) {
      throw IoError(MakeMessage("rank ", job_rank_, ": this communicator failed earlier (", broken_,
                                "); it cannot be used again"));
    }
    internal::AlgorithmContext ctx{*transport_, segment_bytes_, small_bytes_, scratch_};
    stall_watch_->Enter(op, name);
    const uint64_t entered = attribution_->Enter();
    try {
      body(ctx);
      transport_->Finished();
      stall_watch_->Leave();
      attribution_->Leave(entered, bytes);
    } catch (const Error& e) {
      transport_->Finished();
      stall_watch_->Leave();
      if (dynamic_cast<const InvalidArgumentError*>(&e) != nullptr) throw;  // mismatch included
      broken_ = e.what();
      const int peer = transport_->failed_peer();
      transport_->Abort(peer, e.what());
      Report(peer, e.what());
      throw;
    }
  }

 private:
  static std::string EnvOr(const char* name) { return env::Lookup(name).value_or(""); }

  // BytesOf is how much of this rank's data a call moves (attribution's byte counts).
  static uint64_t BytesOf(const internal::CallRecord& call) {
    return call.dtype < 0 ? 0 : call.count * ElementSize(static_cast<DataType>(call.dtype));
  }

  // Sampled is `call`, or, when this collective is an attribution sample, `call` copied into
  // sampled_ with the sample's fields (attribution.h).
  const internal::CallRecord& Sampled(const internal::CallRecord& call) {
    if (!attribution_->Due()) return call;
    sampled_ = call;
    attribution_->Stamp(sampled_);
    return sampled_;
  }

  // CheckRankSettings throws InvalidArgumentError with the sentence of the first setting a rank
  // reads whose value its parser refuses, so that later reads (env::...::Get) cannot fail.
  static void CheckRankSettings() {
    for (const env::SettingRef& setting : env::kSettings) {
      if (setting.side() == env::Side::kTrainrun) continue;
      absl::Status status = setting.CheckEnvironment();
      if (!status.ok()) throw InvalidArgumentError(std::string(status.message()));
    }
  }

  void Report(int peer, const std::string& message) {
    if (peer < 0 && transport_ != nullptr) peer = transport_->failed_peer();
    if (peer >= 0) (void)store_->ReportPeerFailure(job_rank_, peer, message);
  }

  std::shared_ptr<rendezvous::Store> store_;
  RankInfo info_;
  int job_rank_ = 0;      // this rank in the communicator the transport was made for
  std::string set_name_;  // "" for a communicator of its own; a subset's name otherwise
  std::shared_ptr<internal::Transport> transport_;
  std::vector<char> scratch_;
  std::vector<char> join_zeros_;               // what a joined rank contributes
  std::vector<internal::CallRecord> records_;  // RunAllreduceChecked's, kept between calls
  std::vector<char> fusion_buffer_;            // AllreducePieces' contiguous copy
  size_t segment_bytes_ = 0;
  size_t small_bytes_ = 0;
  bool check_calls_ = true;
  std::shared_ptr<internal::Timeline> timeline_;  // shared with subsets
  std::string broken_;
  std::unique_ptr<StallWatch> stall_watch_;  // after transport_: stopped before it is destroyed
  std::unique_ptr<internal::Attribution> attribution_;
  internal::CallRecord sampled_;  // Sampled's copy of a sample's record
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

using internal::CollectiveKind;
using internal::DescribeCall;

void CheckType(DataType type) {
  if (static_cast<int>(type) < 0 || static_cast<int>(type) >= kDataTypeCount) {
    throw InvalidArgumentError(MakeMessage("unknown data type ", static_cast<int>(type)));
  }
}

// CheckOp refuses an op that an allreduce (`allreduce`) or a reduce-scatter cannot apply to
// `type`.
void CheckOp(ReduceOp op, DataType type, bool allreduce) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= kReduceOpCount) {
    throw InvalidArgumentError(MakeMessage("unknown reduce op ", static_cast<int>(op)));
  }
  if (op != ReduceOp::kAdasum) return;
  if (!allreduce) {
    throw InvalidArgumentError(
        "Adasum combines whole vectors and is an allreduce op only; a reduce-scatter takes sum, "
        "average, min, max or product");
  }
  if (!internal::AdasumSupports(type)) {
    throw InvalidArgumentError(
        MakeMessage("Adasum reduces float16, bfloat16, float32 or float64, "
                    "not ",
                    DataTypeName(type)));
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

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::Subset(const std::vector<int>& ranks,
                                                   const std::string& name) {
  if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= size()) {
    throw InvalidArgumentError(
        MakeMessage("a subset of a communicator of ", size(),
                    " ranks needs distinct ranks in ascending order, each in [0, ", size(), ")"));
  }
  if (!std::binary_search(ranks.begin(), ranks.end(), rank())) {
    throw InvalidArgumentError(
        MakeMessage("rank ", rank(), " is not in the subset ", name, "; only its members make it"));
  }
  return std::unique_ptr<Communicator>(
      new Communicator(std::make_unique<Impl>(*impl_, ranks, name)));
}

int Communicator::rank() const { return impl_->info().rank; }
int Communicator::size() const { return impl_->info().size; }
const RankInfo& Communicator::info() const { return impl_->info(); }
bool Communicator::broken() const { return impl_->broken(); }
const char* Communicator::transport() const { return impl_->transport_name(); }
const std::string& Communicator::set_name() const { return impl_->set_name(); }

void Communicator::Allreduce(const void* input, void* output, size_t count, DataType type,
                             ReduceOp op, const CallCheck& check) {
  impl_->Checked(CollectiveKind::kAllreduce, check, [&] {
    CheckType(type);
    CheckOp(op, type, /*allreduce=*/true);
    CheckBuffer(input, count, "allreduce input");
    CheckBuffer(output, count, "allreduce output");
  });
  auto call = DescribeCall(CollectiveKind::kAllreduce, type, count, static_cast<int>(op), check);
  impl_->RunAllreduceChecked(call, input, output, count, type, op);
}

bool Communicator::TryAllreduceCopies(BufferCopies& copies, size_t count, DataType type,
                                      ReduceOp op, const CallCheck& check) {
  CheckType(type);
  CheckOp(op, type, /*allreduce=*/true);
  auto call = DescribeCall(CollectiveKind::kAllreduce, type, count, static_cast<int>(op), check);
  return impl_->RunAllreduceCopies(call, copies, count, type, op);
}

void Communicator::GroupedAllreduce(const std::vector<Buffer>& buffers, DataType type, ReduceOp op,
                                    const CallCheck& check) {
  impl_->Checked(CollectiveKind::kAllreduce, check, [&] {
    CheckType(type);
    CheckOp(op, type, /*allreduce=*/true);
    for (const Buffer& b : buffers) CheckBuffer(b.data, b.count, "grouped allreduce buffer");
  });
  size_t total = 0;
  std::vector<internal::Transport::Piece> pieces;
  for (const Buffer& b : buffers) {
    total += b.count;
    if (b.count > 0) pieces.push_back({static_cast<char*>(b.data), b.count});
  }
  const size_t e = ElementSize(type);
  // Pieces that overlap are reduced through one copy, as their concatenation.
  std::vector<internal::Transport::Piece> sorted = pieces;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.data < b.data; });
  bool overlap = false;
  for (size_t i = 1; i < sorted.size(); ++i) {
    overlap |= sorted[i - 1].data + sorted[i - 1].count * e > sorted[i].data;
  }
  auto call = DescribeCall(CollectiveKind::kAllreduce, type, total, static_cast<int>(op), check);
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) {
    impl_->AllreducePieces(ctx, pieces, total, type, op, overlap);
  });
}

size_t Communicator::AllreduceReady(const std::vector<ReadyAllreduce>& ready, DataType type,
                                    ReduceOp op, std::exception_ptr* error) {
  size_t k = 1;
  try {
    if (ready.empty()) throw InvalidArgumentError("AllreduceReady needs at least one allreduce");
    // Refused alone: the others' first ready allreduce meets the refusal, and k is 1.
    impl_->Checked(CollectiveKind::kAllreduce, *ready[0].check, [&] {
      CheckType(type);
      CheckOp(op, type, /*allreduce=*/true);
      for (const ReadyAllreduce& r : ready) CheckBuffer(r.data, r.count, "allreduce buffer");
    });
    impl_->RunReady(ready, type, op, k);
  } catch (...) {
    *error = std::current_exception();
  }
  return k;
}

void Communicator::Broadcast(void* data, size_t count, DataType type, int root,
                             const CallCheck& check) {
  impl_->Checked(CollectiveKind::kBroadcast, check, [&] {
    CheckType(type);
    CheckBuffer(data, count, "broadcast buffer");
    if (root < 0 || root >= size()) {
      throw InvalidArgumentError(
          MakeMessage("broadcast root ", root, " is not a rank of this communicator of ", size()));
    }
  });
  auto call = DescribeCall(CollectiveKind::kBroadcast, type, count, root, check);
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) {
    internal::Broadcast(ctx, data, count * ElementSize(type), root);
  });
}

void Communicator::Allgather(const void* input, void* output, size_t count, DataType type,
                             const CallCheck& check) {
  Allgatherv(input, output, std::vector<size_t>(size(), count), type, check);
}

void Communicator::Allgatherv(const void* input, void* output, const std::vector<size_t>& counts,
                              DataType type, const CallCheck& check) {
  size_t total = 0;
  impl_->Checked(CollectiveKind::kAllgather, check, [&] {
    CheckType(type);
    if (static_cast<int>(counts.size()) != size()) {
      throw InvalidArgumentError(MakeMessage("allgatherv got ", counts.size(), " counts for ",
                                             size(), " ranks; pass one count per rank"));
    }
    for (size_t c : counts) total += c;
    CheckBuffer(input, counts[rank()], "allgather input");
    CheckBuffer(output, total, "allgather output");
  });
  uint64_t counts_hash = 1469598103934665603ull;  // FNV-1a over the counts: they must agree
  for (size_t c : counts) counts_hash = (counts_hash ^ c) * 1099511628211ull;
  auto call = DescribeCall(CollectiveKind::kAllgather, type, counts[rank()], 0, check,
                           /*count_varies=*/true, counts_hash);
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) {
    internal::Allgatherv(ctx, input, output, counts, type);
  });
}

void Communicator::ReduceScatter(const void* input, void* output, size_t count, DataType type,
                                 ReduceOp op, const CallCheck& check) {
  impl_->Checked(CollectiveKind::kReduceScatter, check, [&] {
    CheckType(type);
    CheckOp(op, type, /*allreduce=*/false);
    CheckBuffer(input, count, "reduce-scatter input");
    CheckBuffer(output, count, "reduce-scatter output");
  });
  auto call =
      DescribeCall(CollectiveKind::kReduceScatter, type, count, static_cast<int>(op), check);
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) {
    internal::ReduceScatter(ctx, input, output, count, type, op);
  });
}

void Communicator::Alltoallv(const void* input, const std::vector<size_t>& send_counts,
                             void* output, const std::vector<size_t>& recv_counts, DataType type,
                             const CallCheck& check) {
  size_t sent = 0;
  size_t received = 0;
  impl_->Checked(CollectiveKind::kAlltoall, check, [&] {
    CheckType(type);
    if (static_cast<int>(send_counts.size()) != size() ||
        static_cast<int>(recv_counts.size()) != size()) {
      throw InvalidArgumentError(MakeMessage("alltoallv got ", send_counts.size(), " send and ",
                                             recv_counts.size(), " receive counts for ", size(),
                                             " ranks; pass one of each per rank"));
    }
    for (int r = 0; r < size(); ++r) {
      sent += send_counts[r];
      received += recv_counts[r];
    }
    CheckBuffer(input, sent, "alltoall input");
    CheckBuffer(output, received, "alltoall output");
  });
  auto call = DescribeCall(CollectiveKind::kAlltoall, type, sent, 0, check, /*count_varies=*/true);
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) {
    internal::Alltoallv(ctx, input, send_counts, output, recv_counts, type);
  });
}

int Communicator::Join() { return impl_->Join(); }

void Communicator::StartTimeline(const std::string& path) {
  impl_->timeline().Start(path, impl_->job_rank());
}

void Communicator::StopTimeline() { impl_->timeline().Stop(); }

std::vector<uint64_t> Communicator::ExchangeKeys(const std::vector<uint64_t>& mine) {
  return impl_->ExchangeKeys(mine);
}

void Communicator::Refuse(const std::string& collective, const CallCheck& check) {
  // By the kinds' own names (KindName), as the call records' messages spell them.
  for (CollectiveKind kind :
       {CollectiveKind::kAllreduce, CollectiveKind::kBroadcast, CollectiveKind::kAllgather,
        CollectiveKind::kReduceScatter, CollectiveKind::kAlltoall, CollectiveKind::kBarrier}) {
    if (collective == internal::KindName(static_cast<uint32_t>(kind))) {
      return impl_->Refuse(kind, check);
    }
  }
  throw InvalidArgumentError(MakeMessage("Refuse got collective '", collective,
                                         "'; it takes allreduce, broadcast, allgather, "
                                         "reducescatter, alltoall or barrier"));
}

void Communicator::Barrier() {
  auto call = DescribeCall(CollectiveKind::kBarrier, DataType::kUInt8, 0, 0, CallCheck{});
  impl_->Run(call, [&](internal::AlgorithmContext& ctx) { internal::Barrier(ctx); });
}

}  // namespace trainrun::collectives
