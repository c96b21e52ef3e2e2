// Straggler attribution: which rank the others wait for, measured without comparing clocks.
//
// A collective equalizes the ranks' step times, so a rank that computes too long looks like its
// peers, who wait for it. What differs is the time each spends inside the collective: the rank that
// arrives last waits least, and the first to arrive waits longest, by about the time between the
// two arrivals. So each rank times its own collectives (its clock only: a difference of two reads
// of the time stamp counter, no syscall, no allocation), and now and then (a *sample*) the ranks
// tell each other how long they spent in their previous collective, in fields of the call record
// that they exchange anyway (call_check.h; not compared). Every rank sees the same records, so
// every rank agrees on who was last at that collective and by how much, and on when the next
// sample is (each proposes a spacing that keeps samples about 1 ms of its time apart; the largest
// wins; a hash of the sample's number jitters it, so that a periodic step cannot alias), with no
// message of its own.
//
//   Attribution a(store, job_rank);          // one per communicator
//   uint64_t entered = a.Enter();            // Communicator::Impl::Guard
//   ... if (a.Due()) a.Stamp(record); exchange records; a.Observe(records, n, rank); ...
//   a.Leave(entered, bytes);
//
// Each process's counters (every communicator's, summed) go to trainrun once per
// env::kMonitorPeriodMs as one Set of env::kMonitorKeyPrefix<rank> (FormatReport), from a thread of
// their own; the collectives never wait for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "call_check.h"
#include "trainrun/rendezvous/store.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <time.h>

namespace trainrun::collectives::internal {

// Ticks is a cheap monotonic count: the time stamp counter on x86-64 (constant rate on every CPU
// this runs on), nanoseconds elsewhere. TicksToNs converts a count of them.
inline uint64_t Ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
#endif
}
uint64_t TicksToNs(uint64_t ticks);

// AttributionCounters are one rank's totals since it started: what the collectives write (relaxed
// atomics, written by one thread) and the reporter reads. Every collective counts in the first
// three; the rest are sums over the samples, from which shares are estimated (trainrun scales
// them by the exact counts: e.g. the time waited for the last rank is busy time times
// sampled_waited_ns / sampled_ns).
struct AttributionCounters {
  std::atomic<uint64_t> collectives{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> busy_ticks{0};         // time inside collectives
  std::atomic<uint64_t> samples{0};            // collectives whose times were compared
  std::atomic<uint64_t> last_samples{0};       // of those, where this rank arrived last
  std::atomic<uint64_t> last_gap_ns{0};        // then, how long after the first it arrived
  std::atomic<uint64_t> sampled_ns{0};         // this rank's time in the sampled collectives
  std::atomic<uint64_t> sampled_waited_ns{0};  // of which waiting for the last to arrive
};

// Report is what a rank sends trainrun: its counters summed over its communicators, its CPU time
// and resident memory. FormatReport/ParseReport are its text form (one line of numbers).
struct AttributionReport {
  uint64_t collectives = 0;
  uint64_t bytes = 0;
  uint64_t busy_ns = 0;
  uint64_t samples = 0;
  uint64_t last_samples = 0;
  uint64_t last_gap_ns = 0;
  uint64_t sampled_ns = 0;
  uint64_t sampled_waited_ns = 0;
  uint64_t cpu_ns = 0;
  uint64_t rss_bytes = 0;
  // The rank's GPU (gpu_usage.h), when it has one and NVML loads: the report is then version 2,
  // two numbers longer.
  bool has_gpu = false;
  uint32_t gpu_percent = 0;
  uint64_t gpu_memory_bytes = 0;
};
std::string FormatReport(const AttributionReport& report);

class Attribution {
 public:
  // Reports go through `store` under `job_rank` when env::kMonitorPeriodMs is set (under trainrun).
  Attribution(std::shared_ptr<rendezvous::Store> store, int job_rank);
  ~Attribution();
  Attribution(const Attribution&) = delete;
  Attribution& operator=(const Attribution&) = delete;

  uint64_t Enter() const { return Ticks(); }
  // Leave ends the collective entered at `entered`, which moved `bytes` of this rank's data.
  void Leave(uint64_t entered, uint64_t bytes) { Spent(Ticks() - entered, bytes); }
  // Spent is Leave with the time in the collective given (in ticks).
  void Spent(uint64_t spent, uint64_t bytes) {
    last_ticks_ = spent;
    Bump(counters_->collectives, 1);
    Bump(counters_->bytes, bytes);
    Bump(counters_->busy_ticks, spent);
    ++sequence_;
  }
  // Skip counts a collective that was not timed (a joined rank's further rounds), so that every
  // rank numbers the collectives alike.
  void Skip() { ++sequence_; }
  // Due says that this collective is a sample: its record must go through Stamp.
  bool Due() const { return sequence_ == next_sample_; }
  void Stamp(CallRecord& record);
  // Observe reads a sample's records (`n` of them in rank order; n == 1: every rank sent the same
  // bytes as `records[0]`); `me` is this rank in the communicator.
  void Observe(const CallRecord* records, size_t n, int me);
  const AttributionCounters& counters() const { return *counters_; }

 private:
  static void Bump(std::atomic<uint64_t>& counter, uint64_t by) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  std::shared_ptr<AttributionCounters> counters_;
  uint64_t sequence_ = 0;     // collectives completed on this communicator
  uint64_t next_sample_ = 1;  // the collective whose record carries the next sample
  uint64_t last_sample_ = 0;  // the previous sample's collective
  uint64_t last_ticks_ = 0;   // time spent in the latest collective
  uint64_t last_sample_at_ = 0;
  uint32_t proposal_ = 1;
  // env::kStragglerSampleEvery: collectives between samples, or 0 for about one a millisecond.
  uint32_t fixed_spacing_ = 0;
};

}  // namespace trainrun::collectives::internal
