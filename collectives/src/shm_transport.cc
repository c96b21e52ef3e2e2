#include "shm_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "reduce.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kPage = 4096;
constexpr auto kSleepSlice = std::chrono::microseconds(20000);
// An adaptive wait spins this long whatever the peers do (a peer may be copying or reducing, which
// publishes nothing), unless the peer waited on last ran on this very CPU.
constexpr auto kGrace = std::chrono::microseconds(4);
// A spinning peer's heartbeat that has not moved for this long means it is not running (preempted).
constexpr auto kBeatWindow = std::chrono::microseconds(4);
// Spinning waiters beat, check the clock and look at their peers every this many polls.
constexpr int kPollsPerCheck = 16;
// An adaptive wait yields its CPU (PeerActivity::kNeedsCpu) at most this long before it sleeps: a
// preempted peer is back within about a scheduler tick (4 ms at HZ=250) and a time slice. Where
// ranks outnumber the CPUs, at most kLongGap, and then yielding backs off (NoYieldPeriod): ranks
// that share cores hand them over within µs, so a millisecond means that other work holds the CPU
// a peer needs (on another CPU, which no yield here gives it; seen with other jobs' compilers on
// the machine, whose waits yielded for their whole 5 ms without a gap here).
constexpr auto kYieldFor = std::chrono::microseconds(5000);
// A waiter that was kept off its CPU this long between two looks at its peers (a yield that gave
// the CPU away, or a preemption) lost a time slice to other work: a rank hands the CPU back within
// its step, in µs. When that happens twice within kLongGapsApart (once may be a stray
// interruption), the rank's waits sleep instead of yielding for kNoYieldFor, since a sleeper's
// wake-up preempts such work where a yielder waits out its slice. Measured beside busy processes
// (load 8-10 on 2 cores), yielding throughout took 100-1700 µs per small allreduce at n=2 and 0.9-4
// ms at n=4; the futex sleeps of the back-off, 20-160 µs and 120-900 µs.
constexpr auto kLongGap = std::chrono::microseconds(1000);
constexpr auto kLongGapsApart = std::chrono::milliseconds(20);
constexpr auto kNoYieldFor = std::chrono::milliseconds(100);
// Where ranks outnumber the CPUs, every yield may hand a busy process a slice while the ranks on
// the other CPUs wait for the yielder: one such gap turns yielding off at once, for a back-off that
// starts at kNoYieldOversubscribedMin and doubles with each gap that follows within kCalm of
// yielding coming back on, up to kNoYieldOversubscribedMax. (With the two-gap rule, 4 ranks on 2
// cores at load 6-7 took 100-1700 µs per small allreduce against 68-490 µs sleeping throughout.)
// The back-off starts small because one gap also comes from the job's own start-up (ranks still
// loading and connecting while the first collectives wait): a fixed second of sleeping after it
// made 4 ranks on 2 quiet cores take 30-39 µs per allreduce at 8-256 B, the sizes timed first,
// against 11-17 µs yielding at 512 B-8 KiB. Beside busy work every probe of yielding meets a gap
// within a slice, so the back-off soon sleeps for whole seconds between probes.
constexpr auto kNoYieldOversubscribedMin = std::chrono::milliseconds(20);
constexpr auto kNoYieldOversubscribedMax = std::chrono::milliseconds(1000);
constexpr auto kCalm = std::chrono::milliseconds(1000);

// Control::state values (ShmRankState).
constexpr uint32_t kOutside = static_cast<uint32_t>(ShmRankState::kOutside);
constexpr uint32_t kWorking = static_cast<uint32_t>(ShmRankState::kWorking);
constexpr uint32_t kSpinning = static_cast<uint32_t>(ShmRankState::kSpinning);
constexpr uint32_t kSleeping = static_cast<uint32_t>(ShmRankState::kSleeping);

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

// A slot holds a chunk of `chunk_bytes` after a head of ShmTransport::kChunkAt bytes, where an
// allreduce's first chunk carries its call record (TryCheckedAllreduce).
size_t SlotStride(size_t chunk_bytes) {
  return RoundUp(RoundUp(chunk_bytes, kPage) + ShmTransport::kChunkAt, kPage);
}

// LineElements: elements of `e` bytes in a 64-byte cache line (at least 1).
size_t LineElements(size_t e) { return std::max<size_t>(1, 64 / e); }

// ChunkElements: the chunked allreduce's unit, in elements of `e` bytes: at most `chunk_bytes`
// (but at least one line per rank) and a multiple of `ranks` lines, so that the ranks' parts of a
// chunk are whole cache lines and ranks do not share lines.
size_t ChunkElements(size_t chunk_bytes, size_t ranks, size_t e) {
  const size_t lines = ranks * LineElements(e);
  return std::max(lines, chunk_bytes / e / lines * lines);
}

// True when counter `value` has reached `target` (modulo 2^32).
bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

inline void CpuRelax() { __builtin_ia32_pause(); }

}  // namespace

// Control is one rank's block: counters others wait on, each on its own cache line.
struct ShmTransport::Control {
  alignas(64) std::atomic<uint32_t> step;      // allreduce progress (see TryAllreduce)
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped when a ring to or from this rank moved
  std::atomic<uint32_t> doorbell_waiters;
  alignas(64) std::atomic<uint32_t> state;  // kOutside, kWorking, kSpinning, kSleeping
  std::atomic<int32_t> cpu;                 // the CPU it was on when it last set state or beat
  std::atomic<uint32_t> beat;               // bumped while it spins
  alignas(64) std::atomic<int32_t> pid;
  std::atomic<int32_t> culprit;  // 0, or 1 + the rank this rank failed because of
  std::atomic<uint32_t> closed;  // 1 once this rank closed its communicator
};

// Shared is the block every rank's allreduce steps meet on: `epoch` moves whenever a step has been
// reached by every rank (and on a failure), so that a rank waiting for all its peers sleeps on one
// word and is woken once, by the last to arrive, instead of once per peer.
struct ShmTransport::Shared {
  alignas(64) std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> epoch_waiters;
};

// Channel is the state of the ring from one rank to another: bytes ever written and ever read.
struct ShmTransport::Channel {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
};

// WaitClock tracks one wait: when it started spinning, and when it must give up.
struct ShmTransport::WaitClock {
  Clock::time_point start;
  Clock::time_point spin_until;
  Clock::time_point deadline;
  int polls = 0;
  bool gave_up = false;  // an adaptive wait that stopped spinning

  explicit WaitClock(const ShmOptions& options) { Moved(options); }
  void Moved(const ShmOptions& options) {
    polls = 0;
    gave_up = false;
    start = Clock::now();
    spin_until = start + options.spin;
    deadline = start + options.timeout;
  }
};

size_t ShmTransport::SegmentBytes(int size, const ShmOptions& options) {
  const size_t n = static_cast<size_t>(size);
  size_t bytes = kHeaderBytes;
  bytes += RoundUp(sizeof(Shared) + n * sizeof(Control), kPage);
  bytes += RoundUp(n * n * sizeof(Channel), kPage);
  bytes += n * n * RoundUp(options.channel_bytes, kPage);
  bytes += n * 2 * SlotStride(options.chunk_bytes);
  return bytes;
}

ShmTransport::ShmTransport(ShmSegment segment, int rank, int size, ShmOptions options)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      options_(options),
      sends_(size),
      recvs_(size),
      last_beat_(size),
      last_change_(size) {
  cpu_set_t cpus;
  oversubscribed_ = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && size_ > CPU_COUNT(&cpus);
  options_.channel_bytes = RoundUp(options_.channel_bytes, kPage);
  options_.chunk_bytes = RoundUp(options_.chunk_bytes, kPage);
  const size_t n = static_cast<size_t>(size);
  TRAINRUN_ENFORCE(segment_.bytes() == SegmentBytes(size, options_), "segment of ",
                   segment_.bytes(), " bytes for a layout of ", SegmentBytes(size, options_));
  controls_offset_ = kHeaderBytes;
  channels_offset_ = controls_offset_ + RoundUp(sizeof(Shared) + n * sizeof(Control), kPage);
  rings_offset_ = channels_offset_ + RoundUp(n * n * sizeof(Channel), kPage);
  slots_offset_ = rings_offset_ + n * n * options_.channel_bytes;
  pid_ = ::getpid();
  control(rank_).pid.store(pid_);
}

ShmTransport::~ShmTransport() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    watcher_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  Control& me = control(rank_);
  me.closed.store(1);
  me.doorbell.fetch_add(1);
  FutexWakeAll(&me.doorbell);
}

void ShmTransport::WatchPeers() {
  watches_.resize(size_);
  std::vector<int> pidfds;
  for (int p = 0; p < size_; ++p) {
    const pid_t pid = control(p).pid.load();
    if (p != rank_ && pid != pid_) {
      watches_[p] = ProcessWatch(pid);
      if (watches_[p].fd() >= 0) pidfds.push_back(watches_[p].fd());
    }
  }
  if (pidfds.empty()) return;
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return;  // the periodic checks in Idle still notice, within a sleep slice
  watcher_ = std::thread([this, pidfds] { Watch(pidfds); });
}

void ShmTransport::Watch(std::vector<int> pidfds) {
  for (;;) {
    std::vector<pollfd> fds{{stop_fd_, POLLIN, 0}};
    for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    std::vector<int> alive;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) alive.push_back(fds[i].fd);
    }
    pidfds.swap(alive);
    // Wake this rank wherever it sleeps: on its doorbell, or on a peer's step.
    peer_ended_.store(true);
    FutexWakeAll(&control(rank_).doorbell);
    shared().epoch.fetch_add(1);
    FutexWakeAll(&shared().epoch);
    if (pidfds.empty()) return;
  }
}

ShmTransport::Control& ShmTransport::control(int r) const {
  return reinterpret_cast<Control*>(segment_.data() + controls_offset_ + sizeof(Shared))[r];
}

ShmTransport::Shared& ShmTransport::shared() const {
  return *reinterpret_cast<Shared*>(segment_.data() + controls_offset_);
}

ShmTransport::Channel& ShmTransport::channel(int from, int to) const {
  return reinterpret_cast<Channel*>(segment_.data() + channels_offset_)[from * size_ + to];
}

char* ShmTransport::ring(int from, int to) const {
  return segment_.data() + rings_offset_ +
         static_cast<size_t>(from * size_ + to) * options_.channel_bytes;
}

char* ShmTransport::slot(int r, uint32_t generation) const {
  return segment_.data() + slots_offset_ +
         (static_cast<size_t>(r) * 2 + (generation & 1)) * SlotStride(options_.chunk_bytes);
}

// --- Point to point ---------------------------------------------------------------------------

Request ShmTransport::NewRequest(size_t bytes) {
  done_.push_back(bytes == 0 ? 1 : 0);
  if (bytes > 0) ++pending_;
  return done_.size() - 1;
}

Request ShmTransport::Send(int peer, const void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "send to rank ", peer);
  Request request = NewRequest(bytes);
  SetState(kWorking);
  if (bytes > 0) {
    sends_[peer].push_back(Op{static_cast<char*>(const_cast<void*>(data)), bytes, request});
    ProgressSend(peer);
  }
  return request;
}

Request ShmTransport::Recv(int peer, void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "receive from rank ", peer);
  Request request = NewRequest(bytes);
  SetState(kWorking);
  if (bytes > 0) recvs_[peer].push_back(Op{static_cast<char*>(data), bytes, request});
  return request;
}

void ShmTransport::Ring(int peer) {
  Control& c = control(peer);
  c.doorbell.fetch_add(1);
  if (c.doorbell_waiters.load() != 0) FutexWakeAll(&c.doorbell);
}

bool ShmTransport::ProgressSend(int peer) {
  bool moved = false;
  Channel& ch = channel(rank_, peer);
  char* base = ring(rank_, peer);
  const size_t capacity = options_.channel_bytes;
  while (!sends_[peer].empty()) {
    Op& op = sends_[peer].front();
    const uint64_t head = ch.head.load(std::memory_order_relaxed);
    const uint64_t tail = ch.tail.load(std::memory_order_acquire);
    size_t space = capacity - static_cast<size_t>(head - tail);
    if (space == 0) break;
    size_t k = std::min(space, op.left);
    size_t at = static_cast<size_t>(head % capacity);
    size_t first = std::min(k, capacity - at);
    std::memcpy(base + at, op.data, first);
    if (k > first) std::memcpy(base, op.data + first, k - first);
    ch.head.store(head + k, std::memory_order_release);
    op.data += k;
    op.left -= k;
    moved = true;
    if (op.left == 0) {
      done_[op.request] = 1;
      --pending_;
      sends_[peer].pop_front();
    }
  }
  if (moved) Ring(peer);
  return moved;
}

bool ShmTransport::ProgressRecv(int peer) {
  bool moved = false;
  Channel& ch = channel(peer, rank_);
  const char* base = ring(peer, rank_);
  const size_t capacity = options_.channel_bytes;
  while (!recvs_[peer].empty()) {
    Op& op = recvs_[peer].front();
    const uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    const uint64_t head = ch.head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    if (avail == 0) break;
    size_t k = std::min(avail, op.left);
    size_t at = static_cast<size_t>(tail % capacity);
    size_t first = std::min(k, capacity - at);
    std::memcpy(op.data, base + at, first);
    if (k > first) std::memcpy(op.data + first, base, k - first);
    ch.tail.store(tail + k, std::memory_order_release);
    op.data += k;
    op.left -= k;
    moved = true;
    if (op.left == 0) {
      done_[op.request] = 1;
      --pending_;
      recvs_[peer].pop_front();
    }
  }
  if (moved) Ring(peer);
  return moved;
}

bool ShmTransport::Progress() {
  bool moved = false;
  for (int p = 0; p < size_; ++p) {
    if (!recvs_[p].empty()) moved |= ProgressRecv(p);
    if (!sends_[p].empty()) moved |= ProgressSend(p);
  }
  return moved;
}

void ShmTransport::Wait(Request request) {
  TRAINRUN_ENFORCE(request < done_.size(), "unknown request ", request);
  Control& me = control(rank_);
  WaitClock clock(options_);
  while (done_[request] == 0) {
    const uint32_t seen = me.doorbell.load();
    if (Progress()) {
      clock.Moved(options_);
      continue;
    }
    // Blame a peer this rank still waits on: the first pending receive, else the first send.
    int blame = -1;
    for (int p = 0; p < size_ && blame < 0; ++p) {
      if (!recvs_[p].empty()) blame = p;
    }
    for (int p = 0; p < size_ && blame < 0; ++p) {
      if (!sends_[p].empty()) blame = p;
    }
    Idle(me.doorbell, me.doorbell_waiters, seen, clock, blame);
  }
  SetState(kWorking);
}

void ShmTransport::WaitAll() {
  for (Request r = 0; r < done_.size(); ++r) {
    if (done_[r] == 0) Wait(r);
  }
  done_.clear();
  pending_ = 0;
}

// --- Waiting and failure ----------------------------------------------------------------------

void ShmTransport::SetState(uint32_t state, int cpu) {
  if (state == state_) return;
  state_ = state;
  Control& me = control(rank_);
  // Only a working or spinning rank's CPU means anything to its peers (ClassifyPeer).
  if (state == kWorking || state == kSpinning) {
    cpu_ = cpu >= 0 ? cpu : ::sched_getcpu();
    if (me.cpu.load(std::memory_order_relaxed) != cpu_) {
      me.cpu.store(cpu_, std::memory_order_relaxed);
    }
  }
  me.state.store(state, std::memory_order_relaxed);
}

PeerActivity ClassifyPeer(ShmRankState state, bool on_this_cpu, bool beating, bool awaiting_step) {
  switch (state) {
    case ShmRankState::kOutside:
      return PeerActivity::kIdle;
    case ShmRankState::kSleeping:
      return awaiting_step ? PeerActivity::kNeedsCpu : PeerActivity::kIdle;
    case ShmRankState::kWorking:
      return on_this_cpu ? PeerActivity::kNeedsCpu : PeerActivity::kRunning;
    case ShmRankState::kSpinning:
      return !on_this_cpu && beating ? PeerActivity::kRunning : PeerActivity::kNeedsCpu;
  }
  return PeerActivity::kIdle;
}

PeerActivity ShmTransport::Activity(int blame, Clock::time_point now, bool grace) {
  auto activity = [&](int p) {
    const Control& c = control(p);
    const auto state = static_cast<ShmRankState>(c.state.load(std::memory_order_relaxed));
    const bool here = c.cpu.load(std::memory_order_relaxed) == cpu_;
    const uint32_t beat = c.beat.load(std::memory_order_relaxed);
    if (beat != last_beat_[p]) {
      last_beat_[p] = beat;
      last_change_[p] = now;
    }
    // Until the grace ends, a peer on another CPU may be copying or reducing (which publishes
    // nothing) or about to enter: spin.
    if (grace && !here) return PeerActivity::kRunning;
    return ClassifyPeer(state, here, now - last_change_[p] < kBeatWindow, awaiting_step_);
  };
  if (!awaiting_step_) return blame < 0 ? PeerActivity::kRunning : activity(blame);
  PeerActivity least = PeerActivity::kRunning;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || Reached(control(p).step.load(std::memory_order_relaxed), awaited_step_)) {
      continue;
    }
    least = std::max(least, activity(p));
    if (least == PeerActivity::kIdle) break;
  }
  return least;
}

void ShmTransport::NoteGap(Clock::time_point now) {
  const auto gap = now - last_look_;
  last_look_ = now;
  if (gap <= kLongGap) return;
  if (oversubscribed_) {
    BackOff(now);
  } else if (now - last_long_gap_ < kLongGapsApart) {
    no_yield_until_ = now + kNoYieldFor;
  }
  last_long_gap_ = now;
}

std::chrono::nanoseconds NoYieldPeriod(std::chrono::nanoseconds last,
                                       std::chrono::nanoseconds yielding_for) {
  if (yielding_for > kCalm || last.count() <= 0) return kNoYieldOversubscribedMin;
  return std::min<std::chrono::nanoseconds>(2 * last, kNoYieldOversubscribedMax);
}

void ShmTransport::BackOff(Clock::time_point now) {
  no_yield_period_ = NoYieldPeriod(no_yield_period_, now - no_yield_until_);
  no_yield_until_ = now + no_yield_period_;
}

void ShmTransport::Idle(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiters, uint32_t seen,
                        WaitClock& clock, int blame) {
  ++clock.polls;
  if (options_.wait == ShmWait::kAdaptive && options_.spin.count() > 0 && !clock.gave_up) {
    if (clock.polls == 1) {
      // A new wait: every peer's heartbeat starts from what it is now.
      for (int p = 0; p < size_; ++p) {
        last_beat_[p] = control(p).beat.load(std::memory_order_relaxed);
        last_change_[p] = clock.start;
      }
    } else if (clock.polls % kPollsPerCheck != 0) {
      CpuRelax();
      return;
    }
    Control& me = control(rank_);
    const int cpu = ::sched_getcpu();
    if (state_ == kSpinning) {
      if (cpu != cpu_) me.cpu.store(cpu_ = cpu, std::memory_order_relaxed);
    } else {
      SetState(kSpinning, cpu);
    }
    me.beat.store(me.beat.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if ((clock.polls & 4095) == 0 || peer_ended_.load(std::memory_order_relaxed)) {
      CheckPeers(blame);
    }
    // The first look is at the wait's start, which the clock has just read.
    const auto now = clock.polls == 1 ? clock.start : Clock::now();
    if (clock.polls > 1) NoteGap(now);
    last_look_ = now;
    switch (Activity(blame, now, now - clock.start < kGrace)) {
      case PeerActivity::kRunning:
        if (now < clock.spin_until) {
          CpuRelax();
          return;
        }
        break;
      case PeerActivity::kNeedsCpu:
        if (now >= no_yield_until_) {
          if (now - clock.start < (oversubscribed_ ? kLongGap : kYieldFor)) {
            ::sched_yield();  // to a rank queued on this CPU, or whatever else runs here
            return;
          }
          if (oversubscribed_) BackOff(now);
        }
        break;
      case PeerActivity::kIdle:
        break;
    }
    clock.gave_up = true;  // this wait sleeps from now on, until something moves
  } else if (options_.wait == ShmWait::kSpin && options_.spin.count() > 0) {
    if ((clock.polls & 255) != 0 || Clock::now() < clock.spin_until) {
      CpuRelax();
      if ((clock.polls & 4095) == 0 || peer_ended_.load(std::memory_order_relaxed)) {
        CheckPeers(blame);
      }
      return;
    }
  } else if (options_.wait == ShmWait::kSpin && clock.polls < 16) {
    ::sched_yield();  // more ranks than cores: let the one we wait for run
    return;
  }
  SetState(kSleeping);
  waiters.fetch_add(1);
  // A step's last poster moves the epoch only when it sees a waiter (Post): look once more now that
  // this rank is one, in case that post came before.
  if (!awaiting_step_ || !StepReached(awaited_step_)) FutexWait(&word, seen, kSleepSlice);
  waiters.fetch_sub(1);
  SetState(kWorking);
  CheckPeers(blame);
  if (Clock::now() > clock.deadline) FailTimeout(blame);
}

void ShmTransport::CheckPeers(int blame) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Control& c = control(p);
    const int32_t culprit_plus_one = c.culprit.load(std::memory_order_acquire);
    if (culprit_plus_one != 0) {
      int culprit = culprit_plus_one - 1;
      if (culprit < 0 || culprit >= size_) culprit = p;
      // A peer that timed out waiting on this rank blames it, but this rank is alive and waiting
      // too: pass the blame on to whoever this rank waits on.
      if (culprit == rank_) FailTimeout(blame >= 0 ? blame : p);
      Fail(culprit, culprit == p ? MakeMessage("rank ", Global(p), " failed")
                                 : MakeMessage("rank ", Global(culprit), " failed, as rank ",
                                               Global(p), " reports"));
    }
    // A peer that closed its communicator may have finished its part; it is an error only when
    // this rank still waits on it. One that ended without closing failed, whoever waits on whom.
    const bool waiting_on = p == blame || !recvs_[p].empty() || !sends_[p].empty();
    const bool closed = c.closed.load() != 0;
    // What a peer sent before closing is visible once `closed` is: use it before blaming.
    if (closed && waiting_on && awaiting_step_ && Reached(c.step.load(), awaited_step_)) continue;
    if (closed && waiting_on && !awaiting_step_ && Progress()) continue;
    if (closed && waiting_on) {
      Fail(p, MakeMessage("rank ", Global(p),
                          " closed its communicator while this rank still waited on it"));
    }
    if (!closed && static_cast<size_t>(p) < watches_.size() && !watches_[p].Alive()) {
      Fail(p, MakeMessage("rank ", Global(p), " exited or was killed"));
    }
  }
}

void ShmTransport::Fail(int peer, const std::string& message) {
  failed_peer_ = peer;
  throw IoError(MakeMessage("rank ", Global(rank_), ": ", message));
}

void ShmTransport::FailTimeout(int peer) {
  failed_peer_ = peer;
  throw TimeoutError(MakeMessage("rank ", Global(rank_), ": no progress from rank ", Global(peer),
                                 " for ", options_.timeout.count() / 1000.0,
                                 " s over shared memory; is it stuck outside the collective?"));
}

void ShmTransport::Abort(int peer, const std::string& message) {
  Control& me = control(rank_);
  me.culprit.store(peer >= 0 ? peer + 1 : rank_ + 1, std::memory_order_release);
  me.step.fetch_add(0x10000000);  // wakes whoever waits on this rank's steps
  shared().epoch.fetch_add(1);
  FutexWakeAll(&shared().epoch);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) Ring(p);
  }
}

// --- Allreduce --------------------------------------------------------------------------------

void ShmTransport::Post(uint32_t step) {
  control(rank_).step.store(step);
  // The rank that completes a step for everyone moves the epoch and wakes the sleepers, if any: a
  // rank registers in epoch_waiters before it sleeps and then looks at the steps once more (Idle),
  // so of it and the last poster one sees the other (stores and loads here are sequentially
  // consistent). A step nobody sleeps on costs no write to the shared epoch's line.
  Shared& all = shared();
  if (all.epoch_waiters.load() == 0) return;
  if (!StepReached(step)) return;
  all.epoch.fetch_add(1);
  FutexWakeAll(&all.epoch);
}

bool ShmTransport::StepReached(uint32_t step) const {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && !Reached(control(p).step.load(), step)) return false;
  }
  return true;
}

void ShmTransport::AwaitSteps(uint32_t step) {
  Shared& all = shared();
  std::optional<WaitClock> clock;  // started when it must wait: a step already reached reads none
  awaiting_step_ = true;
  awaited_step_ = step;
  int last_missing = -1;
  for (;;) {
    const uint32_t seen = all.epoch.load();
    int missing = -1;
    for (int p = 0; p < size_ && missing < 0; ++p) {
      if (p == rank_) continue;
      Control& c = control(p);
      if (c.culprit.load(std::memory_order_relaxed) != 0) CheckPeers(p);
      if (!Reached(c.step.load(), step)) missing = p;
    }
    if (missing < 0) break;
    if (!clock) {
      clock.emplace(options_);
    } else if (last_missing >= 0 && missing != last_missing) {
      clock->Moved(options_);  // one arrived
    }
    last_missing = missing;
    Idle(all.epoch, all.epoch_waiters, seen, *clock, missing);
  }
  awaiting_step_ = false;
  SetState(kWorking, cpu_);  // the CPU its wait last looked from (Idle), at most µs ago
}

bool ShmTransport::TryAllreduce(const void* input, void* output, size_t count, DataType type,
                                ReduceOp op) {
  if (count == 0) return true;
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  const size_t e = ElementSize(type);
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, count * e);
    return true;
  }
  SetState(kWorking);
  if (count * e <= std::min(options_.small_bytes, options_.chunk_bytes)) {
    SmallAllreduce(in, out, count, type, op);
  } else {
    ChunkAllreduce(in, out, count, type, op, size_, nullptr);
  }
  SetState(kOutside);
  return true;
}

void ShmTransport::AllreduceAcrossGroups(const void* input, void* output, size_t count,
                                         DataType type, ReduceOp op, int divisor,
                                         const PartAllreduce& across) {
  if (count == 0) return;
  SetState(kWorking);
  if (count <= ChunkElements(options_.chunk_bytes, static_cast<size_t>(size_), ElementSize(type))) {
    ChunkAllreduce(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                   divisor, &across);
  } else {
    PipelinedAcross(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                    divisor, across);
  }
  SetState(kOutside);
}

// Chunk c goes through the phases of ChunkAllreduce: A(c) copies it in and reduces this rank's
// part; across(c) allreduces that part among the other groups, on a helper thread; B(c) copies the
// other ranks' finished parts out. They run in the order A(0), A(1), across(0) done, B(0), A(2),
// across(1) done, B(1), ..., so that across(c) (the network) overlaps A(c+1) and B(c-1) (memory).
// Every rank posts one step per phase in that order, so a peer's step tells which phases it has
// finished. Two slots per rank still suffice: A(c) writes the slot of chunk c-2 (the same parity)
// only outside this rank's own part, which is all that B(c-2) reads (parts sit at the same places
// in every chunk), and reduces into its own part only after every peer posted A(c), i.e. finished
// B(c-2).
void ShmTransport::PipelinedAcross(const char* in, char* out, size_t count, DataType type,
                                   ReduceOp op, int divisor, const PartAllreduce& across) {
  const size_t e = ElementSize(type);
  const size_t n = static_cast<size_t>(size_);
  const size_t chunk = ChunkElements(options_.chunk_bytes, n, e);
  const size_t chunks = (count + chunk - 1) / chunk;
  const uint32_t g0 = generation_;
  generation_ += static_cast<uint32_t>(chunks);
  const uint32_t base = 2 * g0;
  struct Part {
    size_t begin, length;
  };
  // Every chunk, the short last one too, is cut at the same places (chunk is a multiple of n
  // lines), so a rank's part of one chunk never overlaps another rank's part of another: A(c)'s
  // copy-in stays clear of what B(c-2) still reads.
  const size_t per = chunk / n;
  auto part = [&](size_t c, int p) {
    const size_t length = std::min(chunk, count - c * chunk);
    const size_t b = std::min(length, p * per);
    return Part{b, std::min(length, b + per) - b};
  };
  // A(c): copy in all but this rank's part, post, await, reduce this rank's part in its slot.
  auto phase_a = [&](size_t c, uint32_t step) {
    const size_t begin = c * chunk;
    const size_t length = std::min(chunk, count - begin);
    char* mine = chunk_at(rank_, g0 + static_cast<uint32_t>(c));
    const Part own = part(c, rank_);
    const size_t after = own.begin + own.length;
    const char* src = in + begin * e;
    std::memcpy(mine, src, own.begin * e);
    std::memcpy(mine + after * e, src + after * e, (length - after) * e);
    Post(step);
    AwaitSteps(step);
    if (own.length == 0) return;
    char* result = mine + own.begin * e;
    const char* first = in + (begin + own.begin) * e;
    bool reduced = false;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      Reduce(type, op, result, reduced ? result : first,
             chunk_at(p, g0 + static_cast<uint32_t>(c)) + own.begin * e, own.length);
      reduced = true;
    }
    if (!reduced) std::memcpy(result, first, own.length * e);
  };
  // across(c), on the helper thread: this rank's part among the groups, then the average's division
  // and the copy to the output.
  auto phase_across = [&](size_t c) {
    const Part own = part(c, rank_);
    if (own.length == 0) return;
    char* result = chunk_at(rank_, g0 + static_cast<uint32_t>(c)) + own.begin * e;
    across(result, own.length);
    if (op == ReduceOp::kAverage) Divide(type, result, own.length, divisor);
    std::memcpy(out + (c * chunk + own.begin) * e, result, own.length * e);
  };
  // B(c): post that this rank's part is final, await the others', copy theirs out.
  auto phase_b = [&](size_t c, uint32_t step) {
    Post(step);
    AwaitSteps(step);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Part theirs = part(c, p);
      if (theirs.length == 0) continue;
      std::memcpy(out + (c * chunk + theirs.begin) * e,
                  chunk_at(p, g0 + static_cast<uint32_t>(c)) + theirs.begin * e, theirs.length * e);
    }
  };
  std::future<void> running;
  try {
    phase_a(0, base + 1);
    running = std::async(std::launch::async, phase_across, size_t{0});
    for (size_t c = 1; c < chunks; ++c) {
      phase_a(c, base + 2 * static_cast<uint32_t>(c));
      running.get();  // rethrows the helper's failure
      running = std::async(std::launch::async, phase_across, c);
      phase_b(c - 1, base + 2 * static_cast<uint32_t>(c) + 1);
    }
    running.get();
    phase_b(chunks - 1, base + 2 * static_cast<uint32_t>(chunks));
  } catch (...) {
    // Never leave the helper running on this frame's lambdas; its transport fails or times out.
    if (running.valid()) running.wait();
    throw;
  }
}

void ShmTransport::Finished() { SetState(kOutside); }

void ShmTransport::PrefetchSlots(uint32_t generation, size_t bytes) const {
  constexpr size_t kMostBytes = 2048;  // beyond, the hardware's own prefetch follows the reads
  const size_t lines = (std::min(bytes, kMostBytes) + 63) / 64;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const char* from = slot(p, generation);
    for (size_t i = 0; i < lines; ++i) __builtin_prefetch(from + i * 64);
  }
}

bool ShmTransport::TryAllgather(const void* input, void* output, size_t bytes) {
  if (size_ == 1 || bytes == 0 || bytes > std::min(options_.small_bytes, options_.chunk_bytes)) {
    return false;
  }
  SetState(kWorking);
  char* out = static_cast<char*>(output);
  const uint32_t g = generation_++;
  std::memcpy(slot(rank_, g), input, bytes);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  for (int p = 0; p < size_; ++p) std::memcpy(out + p * bytes, slot(p, g), bytes);
  SetState(kOutside);
  return true;
}

bool ShmTransport::CompareRecords(uint32_t generation, const void* record, size_t record_bytes,
                                  void* records) const {
  bool same = true;
  for (int p = 0; p < size_ && same; ++p) {
    same = p == rank_ || std::memcmp(slot(p, generation), record, record_bytes) == 0;
  }
  if (!same) {
    char* all = static_cast<char*>(records);
    for (int p = 0; p < size_; ++p) {
      std::memcpy(all + p * record_bytes, slot(p, generation), record_bytes);
    }
  }
  return same;
}

bool ShmTransport::TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                                       ReduceOp op, const void* record, size_t record_bytes,
                                       void* records, FunctionRef<bool(bool)> reduce) {
  const size_t e = ElementSize(type);
  const size_t data_at = RoundUp(record_bytes, 64);
  if (size_ == 1 || count == 0) return false;
  if (data_at + count * e > std::min(options_.small_bytes, options_.chunk_bytes)) {
    if (record_bytes > kChunkAt) return false;
    const Check check{record, record_bytes, records, reduce};
    SetState(kWorking);
    ChunkAllreduce(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                   size_, nullptr, nullptr, &check);
    SetState(kOutside);
    return true;
  }
  SetState(kWorking);
  const uint32_t g = generation_++;
  char* mine = slot(rank_, g);
  std::memcpy(mine, record, record_bytes);
  std::memcpy(mine + data_at, input, count * e);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  PrefetchSlots(g, data_at + count * e);
  if (reduce(CompareRecords(g, record, record_bytes, records))) {
    char* out = static_cast<char*>(output);
    Reduce(type, op, out, slot(0, g) + data_at, slot(1, g) + data_at, count);
    for (int p = 2; p < size_; ++p) Reduce(type, op, out, out, slot(p, g) + data_at, count);
    if (op == ReduceOp::kAverage) Divide(type, out, count, size_);
  }
  SetState(kOutside);
  return true;
}

// Every rank copies its input to its slot, then reduces all slots in rank order. It posts step 2g+1
// only: that it has read the others' slots is told by its next generation's step, which every rank
// awaits before it writes a slot of this one's parity again. (TryAllgather and TryCheckedAllreduce
// alike.)
void ShmTransport::SmallAllreduce(const char* in, char* out, size_t count, DataType type,
                                  ReduceOp op) {
  const size_t bytes = count * ElementSize(type);
  const uint32_t g = generation_++;
  std::memcpy(slot(rank_, g), in, bytes);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  PrefetchSlots(g, bytes);
  Reduce(type, op, out, slot(0, g), slot(1, g), count);
  for (int p = 2; p < size_; ++p) Reduce(type, op, out, out, slot(p, g), count);
  if (op == ReduceOp::kAverage) Divide(type, out, count, size_);
}

// Pieces maps element ranges of the concatenation of the pieces onto the pieces.
struct ShmTransport::Pieces {
  const std::vector<Piece>& pieces;
  size_t e;
  std::vector<size_t> starts;  // element index at which each piece begins

  Pieces(const std::vector<Piece>& p, size_t element) : pieces(p), e(element) {
    size_t at = 0;
    for (const Piece& piece : pieces) {
      starts.push_back(at);
      at += piece.count;
    }
  }
  // Visit calls fn(piece bytes, offset in the range in bytes, bytes) for elements [begin,
  // begin+count).
  template <typename F>
  void Visit(size_t begin, size_t count, F&& fn) const {
    size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    size_t done = 0;
    while (done < count) {
      const size_t within = begin + done - starts[i];
      const size_t k = std::min(pieces[i].count - within, count - done);
      if (k > 0) fn(pieces[i].data + within * e, done * e, k * e);
      done += k;
      ++i;
    }
  }
  void Gather(char* to, size_t begin, size_t count) const {
    Visit(begin, count,
          [&](char* piece, size_t at, size_t bytes) { std::memcpy(to + at, piece, bytes); });
  }
  void Scatter(const char* from, size_t begin, size_t count) const {
    Visit(begin, count,
          [&](char* piece, size_t at, size_t bytes) { std::memcpy(piece, from + at, bytes); });
  }
};

bool ShmTransport::TryAllreducePieces(const std::vector<Piece>& pieces, size_t count, DataType type,
                                      ReduceOp op) {
  const size_t e = ElementSize(type);
  if (size_ == 1 || count * e <= std::min(options_.small_bytes, options_.chunk_bytes)) {
    return false;
  }
  Pieces map(pieces, e);
  SetState(kWorking);
  ChunkAllreduce(nullptr, nullptr, count, type, op, size_, nullptr, &map);
  SetState(kOutside);
  return true;
}

// Chunk by chunk: copy in what the peers need, reduce this rank's part from every slot, publish
// it, copy out the peers' parts.
bool ShmTransport::ChunkAllreduce(const char* in, char* out, size_t count, DataType type,
                                  ReduceOp op, int divisor, const PartAllreduce* across,
                                  const Pieces* pieces, const Check* check) {
  const size_t e = ElementSize(type);
  const size_t n = static_cast<size_t>(size_);
  // Parts of a chunk are whole cache lines where possible, so ranks do not share lines.
  const size_t line = LineElements(e);
  const size_t chunk = ChunkElements(options_.chunk_bytes, n, e);
  for (size_t begin = 0; begin < count; begin += chunk) {
    const size_t length = std::min(chunk, count - begin);
    const size_t per = RoundUp((length + n - 1) / n, line);
    auto part = [&](int p) {
      size_t b = std::min(length, p * per);
      return std::pair<size_t, size_t>{b, std::min(length, b + per) - b};
    };
    const uint32_t g = generation_++;
    char* mine = chunk_at(rank_, g);
    // The first chunk carries the call record, at the slot's start (where TryAllgather's is).
    if (check != nullptr && begin == 0)
      std::memcpy(slot(rank_, g), check->record, check->record_bytes);
    auto [own_begin, own_length] = part(rank_);
    const size_t after = own_begin + own_length;
    // Copy in everything but this rank's own part, which only this rank reads (from the input).
    if (pieces != nullptr) {
      pieces->Gather(mine, begin, own_begin);
      pieces->Gather(mine + after * e, begin + after, length - after);
    } else {
      const char* src = in + begin * e;
      std::memcpy(mine, src, own_begin * e);
      std::memcpy(mine + after * e, src + after * e, (length - after) * e);
    }
    Post(2 * g + 1);
    AwaitSteps(2 * g + 1);
    if (check != nullptr && begin == 0 &&
        !check->reduce(CompareRecords(g, check->record, check->record_bytes, check->records))) {
      return false;  // as a record exchange: step 2g+1 only, nothing written
    }
    // reduce_own reduces `n` elements of this rank's part, `at` bytes into it, from `own` (this
    // rank's input) and every peer's slot into `result` (this rank's slot), then finishes them
    // (across, average).
    auto reduce_own = [&](char* result, const char* own, size_t at, size_t n) {
      bool first = true;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        Reduce(type, op, result, first ? own : result, chunk_at(p, g) + own_begin * e + at, n);
        first = false;
      }
      if (first) std::memcpy(result, own, n * e);  // no peers
      if (across != nullptr) (*across)(result, n);
      if (op == ReduceOp::kAverage) Divide(type, result, n, divisor);
    };
    if (own_length > 0) {
      char* result = mine + own_begin * e;
      if (pieces != nullptr) {
        // Piece by piece, straight from the pieces and back into them while in cache: no gather
        // of this rank's part into its slot first (a copy of 1/n of the data, which the
        // contiguous path does not make either).
        pieces->Visit(begin + own_begin, own_length, [&](char* piece, size_t at, size_t bytes) {
          reduce_own(result + at, piece, at, bytes / e);
          std::memcpy(piece, result + at, bytes);
        });
      } else {
        reduce_own(result, in + (begin + own_begin) * e, 0, own_length);
        std::memcpy(out + (begin + own_begin) * e, result, own_length * e);
      }
    }
    Post(2 * g + 2);
    AwaitSteps(2 * g + 2);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto [b, l] = part(p);
      if (l == 0) continue;
      if (pieces != nullptr) {
        pieces->Scatter(chunk_at(p, g) + b * e, begin + b, l);
      } else {
        std::memcpy(out + (begin + b) * e, chunk_at(p, g) + b * e, l * e);
      }
    }
  }
  return true;
}

}  // namespace trainrun::collectives::internal
