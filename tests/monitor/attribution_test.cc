// Straggler attribution (collectives/src/attribution.h) without a transport: four ranks' records
// exchanged by hand, as ExchangeRecords would, with the time each spent in a collective given.
#include "attribution.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

namespace trainrun::collectives::internal {
namespace {

// Runs `collectives` collectives on `n` ranks, where rank r spends spent(r, i) ticks in the i-th;
// the ranks' records are exchanged whenever they are due (all ranks agree on when).
// Each simulated collective also takes `wall` of real time, which sets how often ranks sample.
template <typename F>
std::vector<std::unique_ptr<Attribution>> Run(int n, int collectives, F spent,
                                              std::chrono::nanoseconds wall = {}) {
  std::vector<std::unique_ptr<Attribution>> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<Attribution>(nullptr, r));
  for (int i = 0; i < collectives; ++i) {
    std::vector<CallRecord> records(n);
    int due = 0;
    for (int r = 0; r < n; ++r) {
      if (ranks[r]->Due()) {
        ranks[r]->Stamp(records[r]);
        ++due;
      }
    }
    REQUIRE((due == 0 || due == n));  // every rank agrees on the samples
    for (int r = 0; r < n; ++r) {
      if (due > 0) ranks[r]->Observe(records.data(), records.size(), r);
      ranks[r]->Spent(spent(r, i), 64);
    }
    const auto until = std::chrono::steady_clock::now() + wall;
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  return ranks;
}

TEST_CASE("the rank that spends least in its collectives is the one the others wait for") {
  // Rank 2 arrives 1,000,000 ticks late: it spends 10,000 in each collective, the others 1,010,000.
  auto ranks = Run(4, 2000, [](int r, int) { return r == 2 ? 10000u : 1010000u; });
  const AttributionCounters& slow = ranks[2]->counters();
  CHECK(slow.collectives.load() == 2000);
  CHECK(slow.bytes.load() == 2000 * 64);
  CHECK(slow.samples.load() > 0);
  CHECK(slow.last_samples.load() == slow.samples.load());
  CHECK(slow.sampled_waited_ns.load() == 0);
  // Late by 1,000,000 ticks each time, in nanoseconds (the tick rate is measured as the process
  // runs: within 10% so early).
  CHECK(static_cast<double>(slow.last_gap_ns.load()) / slow.last_samples.load() ==
        Approx(static_cast<double>(TicksToNs(1000000))).epsilon(0.1));
  for (int r : {0, 1, 3}) {
    const AttributionCounters& c = ranks[r]->counters();
    CHECK(c.last_samples.load() == 0);
    CHECK(c.samples.load() == slow.samples.load());
    // They waited 1,000,000 of every 1,010,000 ticks they spent.
    const double waited = static_cast<double>(c.sampled_waited_ns.load()) / c.sampled_ns.load();
    CHECK(waited == Approx(1000000.0 / 1010000).epsilon(0.01));
  }
}

TEST_CASE("in a balanced job last arrivals are spread over the ranks") {
  // Who is last changes from collective to collective; 20 us each: about 50 between samples.
  auto last = [](int i) {
    return static_cast<int>((static_cast<uint32_t>(i) * 2654435761u) >> 7) % 4;
  };
  auto ranks = Run(
      4, 4000, [&](int r, int i) { return r == last(i) ? 1000u : 50000u; },
      std::chrono::microseconds(20));
  uint64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    const AttributionCounters& c = ranks[r]->counters();
    total += c.last_samples.load();
    CHECK(c.last_samples.load() < c.samples.load() * 3 / 4);
  }
  CHECK(total > 0);
}

TEST_CASE("equal times name nobody") {
  auto ranks = Run(3, 100, [](int, int) { return 5000u; });
  for (const auto& r : ranks) {
    CHECK(r->counters().last_samples.load() == 0);
    CHECK(r->counters().sampled_waited_ns.load() == 0);
    CHECK(r->counters().samples.load() > 0);
  }
}

TEST_CASE("fast collectives are sampled about once a millisecond, not every time") {
  // 1,000 ticks each (well under a microsecond): after the first samples, many collectives pass
  // between two samples.
  auto ranks = Run(2, 200000, [](int r, int) { return r == 0 ? 100u : 1000u; });
  const AttributionCounters& c = ranks[0]->counters();
  CHECK(c.samples.load() < 20000);
  CHECK(c.samples.load() > 0);
}

TEST_CASE("TRAINRUN_STRAGGLER_SAMPLE_EVERY spaces samples by collectives, not by the clock") {
  // 256 collectives apart on average (128 to 383 by the jitter), however long each one takes:
  // the first collective is a sample, then about 100,000 / 256 more.
  ::setenv("TRAINRUN_STRAGGLER_SAMPLE_EVERY", "256", 1);
  for (auto wall : {std::chrono::nanoseconds(0), std::chrono::nanoseconds(2000)}) {
    auto ranks = Run(
        2, 100000, [](int r, int) { return r == 0 ? 100u : 1000u; }, wall);
    const uint64_t samples = ranks[0]->counters().samples.load();
    CHECK(samples >= 100000 / 384);
    CHECK(samples <= 100000 / 128 + 1);
  }
  ::unsetenv("TRAINRUN_STRAGGLER_SAMPLE_EVERY");
}

TEST_CASE("a report is one line of eleven numbers") {
  AttributionReport report;
  report.collectives = 1204;
  report.rss_bytes = 1 << 20;
  CHECK(FormatReport(report) == "1 1204 0 0 0 0 0 0 0 0 1048576");
  report.has_gpu = true;
  report.gpu_percent = 37;
  report.gpu_memory_bytes = 1ull << 30;
  CHECK(FormatReport(report) == "2 1204 0 0 0 0 0 0 0 0 1048576 37 1073741824");
}

}  // namespace
}  // namespace trainrun::collectives::internal
