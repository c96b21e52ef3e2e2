// JobView: what trainrun knows of a running job, for the straggler line, the end-of-job table,
// the live page (--monitor), /metrics and `trainrun top`.
//
// The ranks' attribution reports (collectives/src/attribution.h: cumulative counters, one line of
// numbers under env::kMonitorKeyPrefix<rank>) arrive through the rendezvous; JobView keeps each
// rank's recent reports and works out, over the straggler window, who arrived last and who waited
// (FindStraggler). The supervisor's events (start, exit, output, stalls) complete the picture.
// Every method locks: the io thread writes, the monitor's HTTP thread reads (Json, Metrics, Text).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trainrun/launcher/exit_info.h"

namespace trainrun::launcher::monitor {

using Clock = std::chrono::steady_clock;

// Report is one rank's counters (attribution.h's AttributionReport, as parsed).
struct Report {
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
  // Version 2 reports: the rank's GPU through NVML (busy share in percent, the rank's memory
  // there).
  bool has_gpu = false;
  uint64_t gpu_percent = 0;
  uint64_t gpu_memory_bytes = 0;

  // Waited estimates the time spent waiting for the last rank: the time in collectives times the
  // share of it the samples spent waiting.
  double Waited() const;
  // LastShare is the share of the samples where this rank arrived last.
  double LastShare() const;
};
// ParseReport reads a report's text; nullopt for anything else.
std::optional<Report> ParseReport(const std::string& text);
// Minus is the counters' growth from `before` to `after` (rss_bytes: after's).
Report Minus(const Report& after, const Report& before);

// RankWindow is one rank's counters over a window of `seconds`.
struct RankWindow {
  int rank = 0;
  std::string host;
  Report delta;
  double seconds = 0;
};

// Straggler is the rank, or the host, the others waited for over a window.
struct Straggler {
  int rank = 0;  // the rank; for a host, its first rank
  std::string host;
  // A host whose ranks together arrived last (a slow machine, or its link), when no one rank did.
  bool whole_host = false;
  std::vector<int> ranks;    // the straggler's ranks: {rank}, or the host's
  double last_share = 0;     // of the sampled collectives, where it arrived last
  uint64_t collectives = 0;  // it joined in the window
  double late_ns = 0;        // how long after the first it arrived then, on average
  std::vector<int> others;   // the ranks that waited
  double others_waited = 0;  // their mean share of the window spent waiting for the last
  double window_seconds = 0;
};

// FindStraggler names the rank that arrived last at more than half of the window's sampled
// collectives (at least kMinSamples of them), when it cost the others more than `threshold` (a
// fraction) of their time: the share of the window they spent in collectives beyond its own.
// When no rank did, a host of two or more ranks (of two or more hosts) whose ranks together
// arrived last at more than half of them, and more than halfway from its fair share (k/n for k of
// the n ranks) to all of them, is named in the same way: its ranks share the lateness, as on a
// slower machine or behind a slower link.
inline constexpr uint64_t kMinSamples = 10;
std::optional<Straggler> FindStraggler(const std::vector<RankWindow>& ranks, double threshold);
// StragglerLine is the line trainrun prints: "straggler: rank 3 (host b) arrived last at 96% of
// 1,204 collectives in the last 10 s, 180 ms after the first on average; ranks 0-2,4-7 waited 38%
// of their time for it", or for a host "straggler: host b (ranks 4-7) arrived last at ...".
std::string StragglerLine(const Straggler& s);

struct JobViewOptions {
  std::string job_id;
  std::string command;                  // argv, for the page's title (never the environment)
  std::vector<std::string> rank_hosts;  // by rank
  std::chrono::seconds window{10};
  double threshold = 0.10;
  int restarts = 0;
};

class JobView {
 public:
  explicit JobView(JobViewOptions options);

  // The supervisor's events.
  void OnStarted(int rank);
  void OnExit(int rank, const ExitInfo& exit);
  void OnOutput(int rank, std::string_view bytes);
  // OnStalls: the ranks' current stall reports (rank -> "allreduce #17"), the stalled ranks, and
  // the latest stall warning ("" when none is out).
  void OnStalls(const std::map<int, std::string>& waiting, const std::vector<int>& stalled,
                const std::string& warning);
  void OnMembershipChanges(int changes);
  // OnReports takes the ranks' report texts (rank -> text) read at `now`, and returns the
  // straggler line when it changed since the last one returned ("" otherwise; once a straggler
  // is gone: "straggler: none in the last 10 s (rank 3 was)").
  std::string OnReports(const std::map<int, std::string>& reports, Clock::time_point now);
  void OnEnd(const std::string& summary);

  // Whether a straggler was ever named, and the whole run's table (empty without reports).
  bool straggler_named() const;
  bool has_reports() const;
  std::string Table() const;

  // The live views.
  std::string Json() const;
  std::string Metrics() const;
  std::string Text(int width) const;

 private:
  struct Sample {
    Clock::time_point at;
    Report report;
  };
  struct Rank {
    std::string host;
    bool started = false;
    bool exited = false;
    ExitInfo exit;
    std::string waiting;  // the collective of its stall report
    bool stalled = false;
    std::string line;     // its last complete output line
    std::string partial;  // output after that line's end
    std::deque<Sample> samples;
    Clock::time_point started_at;
  };
  std::string StateOf(const Rank& rank) const;
  std::vector<RankWindow> Windows(Clock::time_point now) const;
  // Rate is (after - before) / seconds between the rank's last two reports.
  static double Rate(const Rank& rank, uint64_t Report::*field);

  mutable std::mutex mutex_;
  const JobViewOptions options_;
  const Clock::time_point born_ = Clock::now();
  std::vector<Rank> ranks_;
  std::string stall_;
  std::string straggler_line_;
  std::optional<Straggler> straggler_;
  std::optional<std::string> named_;  // what the last printed line named: "rank 3", "host b"
  bool ever_named_ = false;

  // IsStraggler says whether `rank` is (one of) the straggler the line names now.
  bool IsStraggler(int rank) const {
    return straggler_.has_value() && std::find(straggler_->ranks.begin(), straggler_->ranks.end(),
                                               rank) != straggler_->ranks.end();
  }
  std::string summary_;
  bool ended_ = false;
  int membership_changes_ = 0;
};

// Helpers shared with `trainrun top`.
std::string JsonString(std::string_view text);
std::string Thousands(uint64_t n);

}  // namespace trainrun::launcher::monitor
