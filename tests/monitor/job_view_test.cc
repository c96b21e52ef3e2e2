// The straggler rule and the views (launcher/src/monitor/job_view.h), from made-up reports.
#include "monitor/job_view.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

namespace trainrun::launcher::monitor {
namespace {

// A window where `slow` arrived last at `last_share` of the samples and the others waited
// `waited` of their 10 s.
std::vector<RankWindow> Windows(int n, int slow, double last_share, double waited) {
  std::vector<RankWindow> w(n);
  for (int r = 0; r < n; ++r) {
    w[r].rank = r;
    w[r].host = r < n / 2 ? "a" : "b";
    w[r].seconds = 10;
    w[r].delta.collectives = 1204;
    w[r].delta.samples = 1000;
    if (r == slow) {
      w[r].delta.last_samples = static_cast<uint64_t>(1000 * last_share);
      w[r].delta.last_gap_ns = w[r].delta.last_samples * 180000000ull;
      w[r].delta.busy_ns = 1000000000ull;  // 10% of its time in collectives
    } else {
      w[r].delta.last_samples = static_cast<uint64_t>(1000 * (1 - last_share) / (n - 1));
      w[r].delta.busy_ns = static_cast<uint64_t>((0.1 + waited) * 10e9);
    }
  }
  return w;
}

TEST_CASE("a rank last at most collectives that costs the others over the threshold is named") {
  std::optional<Straggler> s = FindStraggler(Windows(8, 3, 0.96, 0.38), 0.10);
  REQUIRE(s.has_value());
  CHECK(s->rank == 3);
  CHECK(StragglerLine(*s) ==
        "straggler: rank 3 (host a) arrived last at 96% of 1,204 collectives in the last 10 s, "
        "180 ms after the first on average; ranks 0-2,4-7 waited 38% of their time for it");
}

TEST_CASE("no straggler when last arrivals are spread, or the others hardly wait") {
  CHECK_FALSE(FindStraggler(Windows(4, 1, 0.30, 0.38), 0.10).has_value());
  CHECK_FALSE(FindStraggler(Windows(4, 1, 0.96, 0.05), 0.10).has_value());
  CHECK_FALSE(FindStraggler(Windows(4, 1, 0.96, 0.38), 0).has_value());  // turned off
  std::vector<RankWindow> partial = Windows(4, 1, 0.96, 0.38);
  partial[2].delta.samples = 9;  // too few samples of a rank: no verdict
  CHECK_FALSE(FindStraggler(partial, 0.10).has_value());
}

TEST_CASE("a host whose ranks together arrive last is named when no one rank is") {
  // Host b's ranks 4-7 arrive last in turn (each at a quarter of the 1,000 samples, 0.96 of them
  // together), 150 ms late; they spend 10% of their time in collectives, ranks 0-3 48%.
  std::vector<RankWindow> w = Windows(8, -1, 0, 0.38);
  for (RankWindow& r : w) {
    const bool late = r.host == "b";
    r.delta.last_samples = late ? 240 : 10;
    r.delta.last_gap_ns = late ? r.delta.last_samples * 150000000ull : 0;
    r.delta.busy_ns = late ? 1000000000ull : 4800000000ull;
  }
  std::optional<Straggler> s = FindStraggler(w, 0.10);
  REQUIRE(s.has_value());
  CHECK(s->whole_host);
  CHECK(s->ranks == std::vector<int>{4, 5, 6, 7});
  CHECK(StragglerLine(*s) ==
        "straggler: host b (ranks 4-7) arrived last at 96% of 1,204 collectives in the last 10 s, "
        "150 ms after the first on average; ranks 0-3 waited 38% of their time for it");
  // Spread over both hosts: nobody. One host only: the rank rule alone.
  for (RankWindow& r : w) r.delta.last_samples = 125;
  CHECK_FALSE(FindStraggler(w, 0.10).has_value());
  std::vector<RankWindow> one_host = Windows(4, -1, 0, 0.38);
  for (RankWindow& r : one_host) r.host = "a", r.delta.last_samples = 250;
  CHECK_FALSE(FindStraggler(one_host, 0.10).has_value());
}

TEST_CASE("reports are read back, and anything else is refused") {
  std::optional<Report> r = ParseReport("1 10 20 30 40 50 60 70 80 90 100");
  REQUIRE(r.has_value());
  CHECK(r->collectives == 10);
  CHECK(r->rss_bytes == 100);
  CHECK_FALSE(ParseReport("2 10 20 30 40 50 60 70 80 90 100").has_value());
  CHECK_FALSE(ParseReport("1 10 20").has_value());
  CHECK_FALSE(ParseReport("1 x 20 30 40 50 60 70 80 90 100").has_value());
  // Version 2: the rank's GPU at the end.
  std::optional<Report> gpu = ParseReport("2 10 20 30 40 50 60 70 80 90 100 37 1073741824");
  REQUIRE(gpu.has_value());
  CHECK(gpu->has_gpu);
  CHECK(gpu->gpu_percent == 37);
  CHECK(gpu->gpu_memory_bytes == 1073741824);
  CHECK(gpu->rss_bytes == 100);
  CHECK_FALSE(r->has_gpu);
  CHECK_FALSE(ParseReport("1 10 20 30 40 50 60 70 80 90 100 37 1073741824").has_value());
}

TEST_CASE("the straggler line is said once, and once more when it is gone") {
  JobViewOptions options;
  options.job_id = "j";
  options.rank_hosts = {"a", "a"};
  options.window = std::chrono::seconds(10);
  JobView view(options);
  view.OnStarted(0);
  view.OnStarted(1);
  const Clock::time_point t0 = Clock::now();
  // collectives, time in collectives (ns) and samples where last, of 10 per collective.
  auto report = [](uint64_t collectives, uint64_t busy, uint64_t last) {
    return absl::StrCat("1 ", collectives, " 0 ", busy, " ", collectives * 10, " ", last, " ",
                        last * 1000000, " ", busy, " ", busy / 2, " 0 0");
  };
  // Rank 1 last at every sample; rank 0 in collectives 5 s of 10, rank 1 hardly.
  std::string line =
      view.OnReports({{0, report(100, 5000000000ull, 0)}, {1, report(100, 1000, 1000)}},
                     t0 + std::chrono::seconds(10));
  CHECK(line.rfind("straggler: rank 1 (host a) arrived last at 100% of 100", 0) == 0);
  CHECK(line.find("rank 0 waited 50% of their time for it") != std::string::npos);
  CHECK(view.OnReports({{0, report(200, 10000000000ull, 0)}, {1, report(200, 2000, 2000)}},
                       t0 + std::chrono::seconds(20)) == "");
  // Then balanced: gone.
  CHECK(view.OnReports({{0, report(300, 10000002000ull, 500)}, {1, report(300, 4000, 2500)}},
                       t0 + std::chrono::seconds(30)) ==
        "straggler: none in the last 10 s (rank 1 was)");
  CHECK(view.straggler_named());
  CHECK(view.Table().find("collectives over the whole run") == 0);
  CHECK(view.Metrics().find("trainrun_collectives_total{rank=\"1\",host=\"a\"} 300") !=
        std::string::npos);
  CHECK(view.Json().find("\"size\":2") != std::string::npos);
}

TEST_CASE("output lines and states for the page, no markup gets through") {
  JobViewOptions options;
  options.rank_hosts = {"a", "b"};
  JobView view(options);
  view.OnStarted(0);
  view.OnOutput(0, "step 1\nstep 2 </script><b>\npart");
  CHECK(view.Json().find("step 2 \\u003c/script>\\u003cb>") != std::string::npos);
  ExitInfo killed;
  killed.signal = 9;
  view.OnExit(1, killed);
  view.OnStalls({{0, "allreduce #3"}}, {1}, "stall: ...");
  const std::string json = view.Json();
  CHECK(json.find("\"state\":\"waiting in allreduce #3\"") != std::string::npos);
  CHECK(json.find("\"state\":\"killed by SIGKILL\"") != std::string::npos);
}

}  // namespace
}  // namespace trainrun::launcher::monitor
