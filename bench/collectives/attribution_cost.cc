// What straggler attribution (collectives/src/attribution.h) adds to one collective, alone: the
// per-collective hooks (Enter, Due, Leave) in a loop, and one sample's work (Stamp, then Observe
// of n records) at several rank counts. Medians of 7 rounds, in ns of this thread's CPU time (on a
// machine shared with other work, wall time would time the other work's slices too).
//
//   attribution_cost
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "attribution.h"

using trainrun::collectives::internal::Attribution;
using trainrun::collectives::internal::CallRecord;

namespace {

double CpuNs() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

template <typename F>
double MedianNs(int iterations, F body) {
  std::vector<double> rounds;
  for (int round = 0; round < 7; ++round) {
    const double start = CpuNs();
    for (int i = 0; i < iterations; ++i) body(i);
    rounds.push_back((CpuNs() - start) / iterations);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace

int main() {
  Attribution a(nullptr, 0);
  volatile uint64_t sink = 0;
  const double hooks = MedianNs(2000000, [&](int) {
    const uint64_t entered = a.Enter();
    sink = sink + (a.Due() ? 1 : 0);
    a.Leave(entered, 32);
  });
  const double tsc =
      MedianNs(2000000, [&](int) { sink = sink + trainrun::collectives::internal::Ticks(); });
  std::printf("one read of the time stamp counter: %.1f ns\n", tsc);
  std::printf("per collective (Enter, Due, Leave): %.1f ns\n", hooks);
  for (int n : {2, 4, 64}) {
    std::vector<CallRecord> records(n);
    Attribution r(nullptr, 0);
    const double sample = MedianNs(200000, [&](int i) {
      r.Stamp(records[0]);
      for (int p = 1; p < n; ++p) {
        records[p] = records[0];
        records[p].sample_wait_ns += static_cast<uint64_t>((i + p) % 7);
      }
      r.Observe(records.data(), records.size(), 0);
      r.Skip();
    });
    std::printf("per sample, n=%d (Stamp, records copied, Observe): %.1f ns\n", n, sample);
  }
  return sink == 12345 ? 1 : 0;
}
