// ShmTransport: the ranks of one host exchange through one shared segment (shm_segment.h) instead
// of sockets. Defined in shm_transport.cc (layout, peers, failure), shm_ring.cc (point to point),
// shm_wait.cc (the wait policy, the allreduce steps) and shm_allreduce.cc (the allreduce paths).
//
// Point-to-point Send/Recv (what broadcast, allgather, reduce-scatter and barrier use) go through a
// single-producer single-consumer ring per ordered pair of ranks. Allreduce has its own path
// (TryAllreduce) that skips the rings: every rank copies its input, chunk by chunk, into its own
// slot of the segment; rank r then reduces part r of the chunk straight from every peer's slot and
// publishes the result in its slot, from which the others copy it out. A chunk is small enough to
// stay in cache between the copy and the reduction, and two slots per rank let one chunk's copy-in
// overlap a slower peer's work on the previous one. Small messages skip the second phase: every
// rank reduces the whole buffer from all slots, in rank order, so the results stay bit-identical.
//
// Synchronisation is by per-rank counters in the segment: spin briefly, then sleep on a futex
// with a short timeout, after which the waiter checks that its peers are alive (pidfd) and have not
// aborted, so a dead peer is noticed within milliseconds and a stalled one after `timeout`.
//
// How long to spin is the wait policy (ShmWait). Spinning pays only while the ranks waited on run
// on other CPUs at the same time; when there are more runnable threads than CPUs (more ranks than
// cores, or other work on the machine) a spinning waiter takes the CPU from the very rank it waits
// for, and a woken one is often placed on its waker's CPU. So by default (kAdaptive) each rank
// publishes what it is doing (working, spinning with a heartbeat, sleeping) and on which CPU, and a
// waiter spins past a short grace period only while every rank it still waits on is on another CPU
// and running (working, or spinning with a beating heart). A rank it waits on that is in the
// transport but not running (preempted, queued on the waiter's own CPU, woken and not yet run)
// needs a CPU, not a wake-up: the waiter yields its CPU (sched_yield) for a few ms, so that ranks
// sharing cores hand the CPU to each other without a futex sleep and wake-up per step (tens of µs
// each here). A rank outside the transport (computing) or asleep in another wait makes it sleep at
// once; and a waiter kept off its CPU for whole time slices while waiting (busy processes took it,
// which a sleeper's wake-up would have preempted) sleeps instead of yielding for 100 ms. Where
// ranks outnumber the CPUs, one such gap, or a millisecond of yielding without progress, turns
// yielding off for a back-off that starts at 20 ms and doubles while yielding keeps failing, up to
// a second (NoYieldPeriod).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shm_segment.h"
#include "transport.h"

namespace trainrun::collectives::internal {

// ShmWait is what a waiting rank does (TRAINRUN_SHM_WAIT): kAdaptive spins at most `spin` while
// the ranks it waits on are running on other CPUs, then sleeps; kSpin spins `spin` whatever they do
// (with `spin` 0: yields a few times), then sleeps; kSleep sleeps at once.
enum class ShmWait { kAdaptive, kSpin, kSleep };

// ShmRankState is what each rank publishes about itself for its peers' adaptive waits.
enum class ShmRankState : uint32_t {
  kOutside = 0,   // not in a transport operation (computing, or between calls)
  kWorking = 1,   // copying, reducing, or about to wait
  kSpinning = 2,  // spinning or yielding in a wait (heartbeat moving while it runs)
  kSleeping = 3,  // asleep on a futex (or woken and not yet running again)
};

// PeerActivity is what an adaptive waiter makes of one rank it waits on: kRunning (on another CPU:
// spin, it will post soon), kNeedsCpu (in the transport but not running: preempted, queued behind
// this very waiter on its CPU, or woken and not yet run; give up the CPU with sched_yield so that
// it, or whoever took its CPU, runs), kIdle (outside the transport, or asleep waiting for another
// rank: sleep on the futex, as a wait of unknown length).
enum class PeerActivity { kRunning, kNeedsCpu, kIdle };

// ClassifyPeer decides from the peer's published `state`, whether it last ran on the waiter's CPU,
// whether its heartbeat moved lately (`beating`) and whether the waiter awaits allreduce steps
// (where a sleeping peer has been or is about to be woken, since the step it waits for is one the
// waiter has posted; in a point-to-point wait it may wait on a third rank). For the first few µs
// of a wait the caller counts a peer on another CPU as running whatever it says (it may be copying
// or reducing, which publishes nothing).
PeerActivity ClassifyPeer(ShmRankState state, bool on_this_cpu, bool beating, bool awaiting_step);

// NoYieldPeriod is how long an adaptive waiter sleeps instead of yielding, where ranks outnumber
// the CPUs, after yielding failed (its CPU was taken for a time slice between two looks at its
// peers, or it yielded for a millisecond without progress): 20 ms where yielding had been back on
// for a second (or never turned off: `last` 0), else twice `last`, at most a second. `yielding_for`
// is how long yielding has been back on (negative while still off).
std::chrono::nanoseconds NoYieldPeriod(std::chrono::nanoseconds last,
                                       std::chrono::nanoseconds yielding_for);

struct ShmOptions {
  std::chrono::milliseconds timeout{300000};
  std::chrono::microseconds spin{50};  // busy wait before sleeping on a futex
  ShmWait wait = ShmWait::kAdaptive;
  size_t chunk_bytes = 1 << 20;         // allreduce pipelining unit (per slot)
  size_t across_chunk_bytes = 4 << 20;  // chunk_bytes of a host's group in a hierarchical job
  size_t small_bytes = 32 << 10;        // allreduce of at most this: one phase, whole buffer
  size_t channel_bytes = 512 << 10;     // ring buffer per ordered pair of ranks
  int rank_offset = 0;  // global rank of this group's rank 0, for messages (hierarchical.h)
};

class ShmTransport : public Transport {
 public:
  // SegmentBytes is the size of the segment `size` ranks with `options` need; the first
  // kHeaderBytes of it are free for the caller (same_host.h keeps its nonce there).
  static size_t SegmentBytes(int size, const ShmOptions& options);
  static constexpr size_t kHeaderBytes = 4096;
  // Where a slot's chunk starts: the call record of a chunked allreduce's first chunk goes before,
  // at the slot's start, where the small paths put theirs (TryCheckedAllreduce).
  static constexpr size_t kChunkAt = 256;

  // ShmTransport takes over `segment`, which every rank of the communicator has mapped with the
  // same size and options. Registers this process in it; the caller must make every rank finish
  // construction (e.g. a store barrier) before the first operation.
  ShmTransport(ShmSegment segment, int rank, int size, ShmOptions options);
  ~ShmTransport() override;

  // WatchPeers starts watching peers' processes; call once every rank has been constructed. A
  // thread sleeps in poll(2) on their pidfds and, when one ends, wakes this rank wherever it
  // waits, so a killed peer is noticed at once (as a TCP peer's reset connection is).
  void WatchPeers();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Request Send(int peer, const void* data, size_t bytes) override;
  Request Recv(int peer, void* data, size_t bytes) override;
  void Wait(Request request) override;
  void WaitAll() override;
  int failed_peer() const override { return failed_peer_; }
  void Abort(int peer, const std::string& message) override;
  bool TryAllreduce(const void* input, void* output, size_t count, DataType type,
                    ReduceOp op) override;
  // Allreduces above ShmOptions::small_bytes gather from and scatter to the pieces chunk by chunk,
  // as they copy a contiguous buffer in and out: no more copies than one buffer's allreduce.
  bool TryAllreducePieces(const std::vector<Piece>& pieces, size_t count, DataType type,
                          ReduceOp op) override;
  // Small allgathers (at most ShmOptions::small_bytes per rank, e.g. the call records every
  // collective exchanges first) go through the allreduce slots: one synchronisation, where the
  // ring over Send/Recv takes n-1 (each a sleep and a wake-up when ranks share cores).
  bool TryAllgather(const void* input, void* output, size_t bytes) override;
  // The record always goes at the slot's start, where TryAllgather puts it. An allreduce whose
  // input fits ShmOptions::small_bytes (as TryAllreduce's one step; the record takes the slot's
  // head beside it): the input one cache line further, one synchronisation in all. A larger one
  // (record of at most kChunkAt bytes): the chunked allreduce, whose first step carries the record
  // beside the first chunk, so the records cost no step of their own either; when `reduce(same)`
  // says no, it stops after that step, before anything is written to `output`.
  bool TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                           ReduceOp op, const void* record, size_t record_bytes, void* records,
                           FunctionRef<bool(bool)> reduce) override;
  // An allreduce above ShmOptions::small_bytes of a buffer reached through copies (a GPU buffer):
  // each chunk is copied from it straight into this rank's slot and the results straight from the
  // slots back into it, the chunked allreduce's steps unchanged; no host copy of the whole buffer.
  bool CanAllreduceCopies(size_t count, DataType type, ReduceOp op) const override;
  bool TryAllreduceCopies(BufferCopies& copies, size_t count, DataType type, ReduceOp op) override;
  bool TryCheckedAllreduceCopies(BufferCopies& copies, size_t count, DataType type, ReduceOp op,
                                 const void* record, size_t record_bytes, void* records,
                                 FunctionRef<bool(bool)> reduce) override;
  void Finished() override;
  const char* name() const override { return "shm"; }

  // PartAllreduce allreduces `count` elements at `data` in place among other groups (hosts).
  using PartAllreduce = std::function<void(char* data, size_t count)>;
  // AllreduceAcrossGroups is the chunked allreduce with one more step: each rank passes its reduced
  // part of every chunk through `across` before the others copy it, and kAverage divides by
  // `divisor` (the size of the whole job). `across` must treat kAverage as kSum. Above one chunk,
  // `across` runs on a helper thread (one chunk at a time, never two at once) while this thread
  // moves the neighbouring chunks through shared memory, so the network and memory work overlap.
  void AllreduceAcrossGroups(const void* input, void* output, size_t count, DataType type,
                             ReduceOp op, int divisor, const PartAllreduce& across);

 private:
  struct Shared;
  struct Control;
  struct Channel;
  struct Op {
    char* data;
    size_t left;
    Request request;
  };
  struct WaitClock;
  using Clock = std::chrono::steady_clock;

  Shared& shared() const;
  Control& control(int r) const;
  Channel& channel(int from, int to) const;
  char* ring(int from, int to) const;
  char* slot(int r, uint32_t generation) const;
  // chunk_at is where slot(r, generation)'s chunk of a chunked allreduce starts.
  char* chunk_at(int r, uint32_t generation) const { return slot(r, generation) + kChunkAt; }

  Request NewRequest(size_t bytes);
  bool Progress();
  bool ProgressSend(int peer);
  bool ProgressRecv(int peer);
  void Ring(int peer);
  void Post(uint32_t step);
  void AwaitSteps(uint32_t step);
  bool StepReached(uint32_t step) const;  // every peer has posted `step`
  // Sleeps (after spinning) until `word` may have moved from `seen`; checks peers and the deadline.
  void Idle(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters, uint32_t seen,
            WaitClock& clock, int blame);
  void CheckPeers(int blame);
  // MaySpin says whether the next wait may spin, EndWait notes whether its spin paid: after a spin
  // that ran out, the next 2^k - 1 waits do not spin (k: spins that ran out in a row, at most 6).
  // Two ranks that share one CPU (woken onto their waker's CPU, or a stale published CPU) would
  // otherwise spin out every wait while the one they wait for cannot run.
  bool MaySpin();
  void EndWait(const WaitClock& clock);
  // Activity is, in an adaptive wait, the least active of the ranks this one waits on (kIdle over
  // kNeedsCpu over kRunning; see ClassifyPeer); `blame` is the one a point-to-point wait waits on.
  PeerActivity Activity(int blame, Clock::time_point now, bool grace);
  // NoteGap notes, at each look at the peers in an adaptive wait, how long since the last one: a
  // gap of a whole time slice means other work took this rank's CPU (a yield gave it away, or a
  // preemption); two close together turn yielding off for a while (see kLongGap); where ranks
  // outnumber the CPUs, one (BackOff).
  void NoteGap(Clock::time_point now);
  // BackOff turns yielding off, where ranks outnumber the CPUs, for a period that doubles while
  // yielding keeps failing (see kNoYieldOversubscribedMin).
  void BackOff(Clock::time_point now);
  // SetState publishes what this rank does; with a working or spinning `state`, also its CPU:
  // `cpu` when known (>= 0), else sched_getcpu's.
  void SetState(uint32_t state, int cpu = -1);
  void Watch(std::vector<int> pidfds);
  [[noreturn]] void Fail(int peer, const std::string& message);
  [[noreturn]] void FailTimeout(int peer);

  void SmallAllreduce(const char* in, char* out, size_t count, DataType type, ReduceOp op);
  // PrefetchSlots asks for the first `bytes` of every peer's slot of `generation` (their final
  // values, once its step is reached) at once, so that their transfers between CPUs overlap
  // instead of following one another through the record comparison and the reduction.
  void PrefetchSlots(uint32_t generation, size_t bytes) const;
  // Pieces is a logical buffer made of pieces (TryAllreducePieces); null: `in` and `out`.
  struct Pieces;
  // Check is a call record that rides with the first chunk (TryCheckedAllreduce).
  struct Check {
    const void* record;
    size_t record_bytes;
    void* records;
    FunctionRef<bool(bool)> reduce;
  };
  // ChunkAllreduce returns false when `check` said not to reduce (after its first step). With
  // `copies`, the buffer is reached through them (in place; `in`, `out` and `pieces` unused).
  bool ChunkAllreduce(const char* in, char* out, size_t count, DataType type, ReduceOp op,
                      int divisor, const PartAllreduce* across, const Pieces* pieces = nullptr,
                      const Check* check = nullptr, BufferCopies* copies = nullptr);
  // CompareRecords compares every rank's record of `generation` with this rank's `record`; when
  // one differs, copies them all to `records`. Returns whether all were the same.
  bool CompareRecords(uint32_t generation, const void* record, size_t record_bytes,
                      void* records) const;
  // AllreduceAcrossGroups above one chunk: the chunks' `across` steps run on a helper thread,
  // overlapping the next chunk's copy-in and reduction and the previous chunk's copy-out.
  void PipelinedAcross(const char* in, char* out, size_t count, DataType type, ReduceOp op,
                       int divisor, const PartAllreduce& across);
  int Global(int r) const { return r + options_.rank_offset; }

  ShmSegment segment_;
  int rank_;
  int size_;
  ShmOptions options_;
  size_t controls_offset_ = 0;
  size_t channels_offset_ = 0;
  size_t rings_offset_ = 0;
  size_t slots_offset_ = 0;
  pid_t pid_ = 0;
  std::vector<ProcessWatch> watches_;  // per peer; empty entries for this process's own threads
  std::thread watcher_;
  int stop_fd_ = -1;                     // eventfd that ends watcher_
  std::atomic<bool> peer_ended_{false};  // set by watcher_
  std::vector<std::deque<Op>> sends_;
  std::vector<std::deque<Op>> recvs_;
  std::vector<uint8_t> done_;  // per request since the last WaitAll
  size_t pending_ = 0;
  uint32_t generation_ = 0;  // allreduce chunks so far; steps 2g+1 and 2g+2 belong to chunk g
  int failed_peer_ = -1;
  bool awaiting_step_ = false;  // in AwaitSteps, for awaited_step_
  uint32_t awaited_step_ = 0;
  uint32_t state_ = 0;                          // what control(rank_).state last said
  int cpu_ = -1;                                // the CPU this rank last ran on
  std::vector<uint32_t> last_beat_;             // per peer, in the current wait
  std::vector<Clock::time_point> last_change_;  // when that beat last moved
  Clock::time_point last_look_{};               // NoteGap: the last look at the peers
  Clock::time_point last_long_gap_{};           // the last gap of a time slice
  Clock::time_point no_yield_until_{};          // set by NoteGap and BackOff
  std::chrono::nanoseconds no_yield_period_{};  // BackOff's last, where ranks outnumber the CPUs
  bool oversubscribed_ = false;                 // more ranks than CPUs this process may use
  int spin_misses_ = 0;                         // MaySpin/EndWait
  int spin_skip_ = 0;
};

}  // namespace trainrun::collectives::internal
