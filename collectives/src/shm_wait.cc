// ShmTransport's wait policy (ShmWait: adaptive, spin, sleep; see shm_transport.h) and the steps
// an allreduce's ranks post and await.
#include <sched.h>

#include <optional>

#include "cpu_relax.h"
#include "shm_internal.h"

namespace trainrun::collectives::internal {

using Clock = std::chrono::steady_clock;
using namespace shm;  // NOLINT: this transport's own internals

namespace {

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

}  // namespace

// --- Waiting and failure ----------------------------------------------------------------------

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
        clock.ran_out = clock.spin;
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
  } else if (options_.wait == ShmWait::kSpin && options_.spin.count() > 0 && clock.spin &&
             !clock.ran_out) {
    if ((clock.polls & 255) != 0 || Clock::now() < clock.spin_until) {
      CpuRelax();
      if ((clock.polls & 4095) == 0 || peer_ended_.load(std::memory_order_relaxed)) {
        CheckPeers(blame);
      }
      return;
    }
    clock.ran_out = true;
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

// --- Allreduce steps ----------------------------------------------------------------------------

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
      clock.emplace(options_, MaySpin());
    } else if (last_missing >= 0 && missing != last_missing) {
      clock->Moved(options_);  // one arrived
    }
    last_missing = missing;
    Idle(all.epoch, all.epoch_waiters, seen, *clock, missing);
  }
  awaiting_step_ = false;
  if (clock) EndWait(*clock);
  SetState(kWorking, cpu_);  // the CPU its wait last looked from (Idle), at most µs ago
}

bool ShmTransport::MaySpin() {
  if (spin_skip_ == 0) return true;
  --spin_skip_;
  return false;
}

void ShmTransport::EndWait(const WaitClock& clock) {
  if (!clock.spin || options_.spin.count() == 0) return;
  spin_misses_ = clock.ran_out ? std::min(spin_misses_ + 1, 6) : 0;
  spin_skip_ = (1 << spin_misses_) - 1;
}

}  // namespace trainrun::collectives::internal
