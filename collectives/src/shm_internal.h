// Internals of ShmTransport shared by its files (shm_transport.cc: the segment, the peers and
// failure; shm_ring.cc: point-to-point rings; shm_wait.cc: the wait policy and the allreduce
// steps; shm_allreduce.cc: the allreduce and allgather paths). Not part of any interface.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "shm_transport.h"

namespace trainrun::collectives::internal::shm {

constexpr size_t kPage = 4096;

// Control::state values (ShmRankState).
constexpr uint32_t kOutside = static_cast<uint32_t>(ShmRankState::kOutside);
constexpr uint32_t kWorking = static_cast<uint32_t>(ShmRankState::kWorking);
constexpr uint32_t kSpinning = static_cast<uint32_t>(ShmRankState::kSpinning);
constexpr uint32_t kSleeping = static_cast<uint32_t>(ShmRankState::kSleeping);

inline size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

// A slot holds a chunk of `chunk_bytes` after a head of ShmTransport::kChunkAt bytes, where an
// allreduce's first chunk carries its call record (TryCheckedAllreduce).
inline size_t SlotStride(size_t chunk_bytes) {
  return RoundUp(RoundUp(chunk_bytes, kPage) + ShmTransport::kChunkAt, kPage);
}

// True when counter `value` has reached `target` (modulo 2^32).
inline bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

}  // namespace trainrun::collectives::internal::shm

namespace trainrun::collectives::internal {

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
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  Clock::time_point spin_until;
  Clock::time_point deadline;
  int polls = 0;
  bool gave_up = false;  // an adaptive wait that stopped spinning
  bool spin = true;      // this wait may spin (ShmTransport::spin_skip_)
  bool ran_out = false;  // it spun its whole budget and went on waiting

  explicit WaitClock(const ShmOptions& options, bool may_spin = true) : spin(may_spin) {
    Moved(options);
  }
  void Moved(const ShmOptions& options) {
    polls = 0;
    gave_up = false;
    start = Clock::now();
    spin_until = spin ? start + options.spin : start;
    deadline = start + options.timeout;
  }
};

inline ShmTransport::Control& ShmTransport::control(int r) const {
  return reinterpret_cast<Control*>(segment_.data() + controls_offset_ + sizeof(Shared))[r];
}

inline ShmTransport::Shared& ShmTransport::shared() const {
  return *reinterpret_cast<Shared*>(segment_.data() + controls_offset_);
}

inline ShmTransport::Channel& ShmTransport::channel(int from, int to) const {
  return reinterpret_cast<Channel*>(segment_.data() + channels_offset_)[from * size_ + to];
}

inline char* ShmTransport::ring(int from, int to) const {
  return segment_.data() + rings_offset_ +
         static_cast<size_t>(from * size_ + to) * options_.channel_bytes;
}

inline char* ShmTransport::slot(int r, uint32_t generation) const {
  return segment_.data() + slots_offset_ +
         (static_cast<size_t>(r) * 2 + (generation & 1)) * shm::SlotStride(options_.chunk_bytes);
}

// Inline: every allreduce calls these a few times (the library is not built with LTO).

inline void ShmTransport::SetState(uint32_t state, int cpu) {
  if (state == state_) return;
  state_ = state;
  Control& me = control(rank_);
  // Only a working or spinning rank's CPU means anything to its peers (ClassifyPeer).
  if (state == shm::kWorking || state == shm::kSpinning) {
    cpu_ = cpu >= 0 ? cpu : ::sched_getcpu();
    if (me.cpu.load(std::memory_order_relaxed) != cpu_) {
      me.cpu.store(cpu_, std::memory_order_relaxed);
    }
  }
  me.state.store(state, std::memory_order_relaxed);
}

inline bool ShmTransport::StepReached(uint32_t step) const {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && !shm::Reached(control(p).step.load(), step)) return false;
  }
  return true;
}

inline void ShmTransport::Post(uint32_t step) {
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

}  // namespace trainrun::collectives::internal
