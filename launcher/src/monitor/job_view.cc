#include "monitor/job_view.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rank_ranges.h"

namespace trainrun::launcher::monitor {
namespace {

// A rank's reports are kept this much longer than the window, so that a window's start has one.
constexpr int kHistoryWindows = 3;
// The page's timeline: this many of a rank's latest report intervals.
constexpr size_t kTimelinePoints = 60;

std::string Duration(double ns) {
  if (ns >= 1e9) return absl::StrFormat("%.1f s", ns / 1e9);
  if (ns >= 1e6) return absl::StrFormat("%.0f ms", ns / 1e6);
  if (ns >= 1e3) return absl::StrFormat("%.0f us", ns / 1e3);
  return absl::StrFormat("%.0f ns", ns);
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, units[u])
                : absl::StrFormat("%.1f %s", bytes, units[u]);
}

std::string Percent(double share) {
  return absl::StrFormat("%.0f%%", 100 * std::clamp(share, 0.0, 1.0));
}

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0 : static_cast<double>(part) / static_cast<double>(whole);
}

std::string Label(std::string_view text) {  // a Prometheus label value
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else if (c == '<') {
          out += "\\u003c";  // never "</script>" in a page
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string Thousands(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::optional<Report> ParseReport(const std::string& text) {
  // Version 1: eleven numbers; version 2: thirteen, the last two the rank's GPU.
  std::vector<absl::string_view> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  const bool gpu = words.size() == 13 && words[0] == "2";
  if (!gpu && (words.size() != 11 || words[0] != "1")) return std::nullopt;
  uint64_t v[12] = {};
  for (size_t i = 1; i < words.size(); ++i) {
    if (!absl::SimpleAtoi(words[i], &v[i - 1])) return std::nullopt;
  }
  Report report{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
  report.has_gpu = gpu;
  report.gpu_percent = v[10];
  report.gpu_memory_bytes = v[11];
  return report;
}

double Report::Waited() const {
  if (sampled_ns == 0) return 0;
  return static_cast<double>(busy_ns) * static_cast<double>(sampled_waited_ns) /
         static_cast<double>(sampled_ns);
}

double Report::LastShare() const { return Share(last_samples, samples); }

Report Minus(const Report& a, const Report& b) {
  auto d = [](uint64_t x, uint64_t y) { return x >= y ? x - y : 0; };
  return Report{d(a.collectives, b.collectives),
                d(a.bytes, b.bytes),
                d(a.busy_ns, b.busy_ns),
                d(a.samples, b.samples),
                d(a.last_samples, b.last_samples),
                d(a.last_gap_ns, b.last_gap_ns),
                d(a.sampled_ns, b.sampled_ns),
                d(a.sampled_waited_ns, b.sampled_waited_ns),
                d(a.cpu_ns, b.cpu_ns),
                a.rss_bytes,
                a.has_gpu,
                a.gpu_percent,
                a.gpu_memory_bytes};
}

std::optional<Straggler> FindStraggler(const std::vector<RankWindow>& ranks, double threshold) {
  if (ranks.size() < 2 || threshold <= 0) return std::nullopt;
  const RankWindow* worst = nullptr;
  double worst_share = 0;
  for (const RankWindow& r : ranks) {
    // Every rank must have been compared, often enough for a verdict.
    if (r.delta.samples < kMinSamples || r.seconds <= 0) return std::nullopt;
    const double share = r.delta.LastShare();
    if (worst == nullptr || share > worst_share) worst = &r, worst_share = share;
  }
  Straggler s;
  std::vector<const RankWindow*> late;  // the straggler's ranks
  if (worst_share > 0.5) {
    // Last at most collectives: more than half of them.
    late = {worst};
    s.last_share = worst_share;
    s.late_ns = Share(worst->delta.last_gap_ns, worst->delta.last_samples);
  } else {
    // A host whose ranks together were last at more than half of them.
    std::map<std::string, std::vector<const RankWindow*>> hosts;
    for (const RankWindow& r : ranks) hosts[r.host].push_back(&r);
    if (hosts.size() < 2) return std::nullopt;
    for (const auto& [host, members] : hosts) {
      if (members.size() < 2) continue;
      uint64_t last = 0, gap = 0;
      double samples = 0;
      for (const RankWindow* r : members) {
        last += r->delta.last_samples;
        gap += r->delta.last_gap_ns;
        samples += static_cast<double>(r->delta.samples);
      }
      const double share =
          static_cast<double>(last) / (samples / static_cast<double>(members.size()));
      // By chance alone a host of k of the n ranks is last at k/n of the collectives: it must be
      // more than halfway from that to all of them (and at more than half).
      const double fair = static_cast<double>(members.size()) / static_cast<double>(ranks.size());
      if (share > std::max(0.5, (1 + fair) / 2) && share > s.last_share) {
        late = members;
        s.last_share = std::min(share, 1.0);
        s.late_ns = Share(gap, last);
      }
    }
    if (late.empty()) return std::nullopt;
    s.whole_host = true;
  }
  s.rank = late[0]->rank;
  s.host = late[0]->host;
  s.collectives = late[0]->delta.collectives;
  s.window_seconds = late[0]->seconds;
  // The straggler's own share of its time in collectives (arriving last, it hardly waits).
  double its = 0;
  for (const RankWindow* r : late) {
    s.ranks.push_back(r->rank);
    its += static_cast<double>(r->delta.busy_ns) / (r->seconds * 1e9);
  }
  its /= static_cast<double>(late.size());
  double waited = 0;
  for (const RankWindow& r : ranks) {
    if (std::find(late.begin(), late.end(), &r) != late.end()) continue;
    s.others.push_back(r.rank);
    // What it cost r: r's time in collectives beyond the straggler's own.
    const double busy = static_cast<double>(r.delta.busy_ns) / (r.seconds * 1e9);
    waited += std::clamp(busy - its, 0.0, 1.0);
  }
  s.others_waited = waited / static_cast<double>(s.others.size());
  if (s.others_waited < threshold) return std::nullopt;
  return s;
}

// Who a straggler line names: "rank 3", or "host b".
std::string Named(const Straggler& s) {
  return s.whole_host ? absl::StrCat("host ", s.host) : absl::StrCat("rank ", s.rank);
}

std::string StragglerLine(const Straggler& s) {
  const std::string who =
      s.whole_host ? absl::StrCat("host ", s.host, " (", RankRanges(s.ranks), ")")
                   : absl::StrCat("rank ", s.rank, s.host.empty() ? "" : " (host " + s.host + ")");
  return absl::StrCat("straggler: ", who, " arrived last at ", Percent(s.last_share), " of ",
                      Thousands(s.collectives), " collectives in the last ",
                      absl::StrFormat("%.0f", s.window_seconds), " s, ", Duration(s.late_ns),
                      " after the first on average; ", RankRanges(s.others), " waited ",
                      Percent(s.others_waited), " of their time for it");
}

JobView::JobView(JobViewOptions options) : options_(std::move(options)) {
  ranks_.resize(options_.rank_hosts.size());
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r].host = options_.rank_hosts[r];
}

void JobView::OnStarted(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].started = true;
  ranks_[rank].started_at = Clock::now();
}

void JobView::OnExit(int rank, const ExitInfo& exit) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].exited = true;
  ranks_[rank].exit = exit;
}

void JobView::OnOutput(int rank, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[rank];
  const size_t end = bytes.rfind('\n');
  if (end == std::string_view::npos) {
    if (r.partial.size() < 4096) r.partial.append(bytes.substr(0, 4096 - r.partial.size()));
    return;
  }
  std::string_view whole = bytes.substr(0, end);
  const size_t begin = whole.rfind('\n');
  if (begin == std::string_view::npos) {
    r.line = r.partial + std::string(whole);
  } else {
    r.line = std::string(whole.substr(begin + 1));
  }
  if (!r.line.empty() && r.line.back() == '\r') r.line.pop_back();
  if (r.line.size() > 512) r.line.resize(512);
  r.partial = std::string(bytes.substr(end + 1, 4096));
}

void JobView::OnStalls(const std::map<int, std::string>& waiting, const std::vector<int>& stalled,
                       const std::string& warning) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Rank& r : ranks_) r.waiting.clear(), r.stalled = false;
  for (const auto& [rank, op] : waiting) {
    if (rank >= 0 && rank < static_cast<int>(ranks_.size())) ranks_[rank].waiting = op;
  }
  for (int rank : stalled) {
    if (rank >= 0 && rank < static_cast<int>(ranks_.size())) ranks_[rank].stalled = true;
  }
  stall_ = warning;
}

void JobView::OnMembershipChanges(int changes) {
  std::lock_guard<std::mutex> lock(mutex_);
  membership_changes_ = changes;
}

std::vector<RankWindow> JobView::Windows(Clock::time_point now) const {
  std::vector<RankWindow> windows;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.exited || r.samples.empty()) continue;
    const Sample& latest = r.samples.back();
    // The window's start: the newest report at least ~a window older than the latest (or the
    // rank's start, when it has reported for less than a window).
    const auto start_by = latest.at - options_.window + options_.window / 10;
    Sample base{r.started ? r.started_at : born_, Report{}};
    for (const Sample& s : r.samples) {
      if (s.at <= start_by) base = s;
    }
    RankWindow w;
    w.rank = static_cast<int>(i);
    w.host = r.host;
    w.delta = Minus(latest.report, base.report);
    w.seconds = std::chrono::duration<double>(latest.at - base.at).count();
    (void)now;
    windows.push_back(std::move(w));
  }
  return windows;
}

std::string JobView::OnReports(const std::map<int, std::string>& reports, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool changed = false;
  for (const auto& [rank, text] : reports) {
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) continue;
    std::optional<Report> report = ParseReport(text);
    if (!report.has_value()) continue;
    Rank& r = ranks_[rank];
    if (!r.samples.empty() && r.samples.back().report.collectives == report->collectives &&
        r.samples.back().report.cpu_ns == report->cpu_ns) {
      continue;  // the same report, read again
    }
    r.samples.push_back({now, *report});
    while (r.samples.size() > 2 &&
           r.samples.front().at <
               now - kHistoryWindows * options_.window - std::chrono::seconds(kTimelinePoints)) {
      r.samples.pop_front();
    }
    changed = true;
  }
  if (!changed) return "";
  std::vector<RankWindow> windows = Windows(now);
  // Only when every running rank has reported: a rank that has not cannot be compared.
  size_t running = 0;
  for (const Rank& r : ranks_) running += r.started && !r.exited ? 1 : 0;
  if (windows.size() < running) return "";
  straggler_ = FindStraggler(windows, options_.threshold);
  if (straggler_.has_value()) {
    straggler_line_ = StragglerLine(*straggler_);
    if (named_ == Named(*straggler_)) return "";
    named_ = Named(*straggler_);
    ever_named_ = true;
    return straggler_line_;
  }
  straggler_line_.clear();
  if (!named_.has_value()) return "";
  const std::string was = *named_;
  named_.reset();
  return absl::StrCat("straggler: none in the last ", options_.window.count(), " s (", was,
                      " was)");
}

void JobView::OnEnd(const std::string& summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  ended_ = true;
  summary_ = summary;
}

bool JobView::straggler_named() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ever_named_;
}

bool JobView::has_reports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Rank& r : ranks_) {
    if (!r.samples.empty()) return true;
  }
  return false;
}

std::string JobView::Table() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string table = absl::StrFormat(
      "collectives over the whole run, per rank:\n%6s  %-12s %12s %10s %9s %9s %9s %9s", "rank",
      "host", "collectives", "data", "in coll.", "last", "late by", "waited");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.samples.empty()) {
      absl::StrAppend(&table, absl::StrFormat("\n%6d  %-12s %12s", i, r.host, "no report"));
      continue;
    }
    const Report& t = r.samples.back().report;
    const double seconds = std::max(
        1e-9,
        std::chrono::duration<double>(r.samples.back().at - (r.started ? r.started_at : born_))
            .count());
    absl::StrAppend(
        &table, absl::StrFormat("\n%6d  %-12s %12s %10s %9s %9s %9s %9s", i, r.host,
                                Thousands(t.collectives), Bytes(static_cast<double>(t.bytes)),
                                Percent(static_cast<double>(t.busy_ns) / (seconds * 1e9)),
                                Percent(t.LastShare()),
                                t.last_samples == 0 ? std::string("-")
                                                    : Duration(static_cast<double>(t.last_gap_ns) /
                                                               static_cast<double>(t.last_samples)),
                                Percent(t.Waited() / (seconds * 1e9))));
  }
  absl::StrAppend(&table,
                  "\n(in coll.: share of the run inside collectives; last: share of collectives "
                  "it arrived last at; late by: how long after the first, then; waited: share of "
                  "the run spent waiting for the last rank)");
  return table;
}

std::string JobView::StateOf(const Rank& r) const {
  if (r.exited) {
    if (r.exit.exec_errno != 0) return "could not start";
    return r.exit.signal != 0 ? absl::StrCat("killed by ", SignalName(r.exit.signal))
                              : absl::StrCat("exited with code ", r.exit.code);
  }
  if (!r.started) return "starting";
  if (r.stalled) return "stalled";
  if (!r.waiting.empty()) return absl::StrCat("waiting in ", r.waiting);
  return "running";
}

double JobView::Rate(const Rank& r, uint64_t Report::*field) {
  if (r.samples.size() < 2) return 0;
  const Sample& a = r.samples[r.samples.size() - 2];
  const Sample& b = r.samples.back();
  const double seconds = std::chrono::duration<double>(b.at - a.at).count();
  if (seconds <= 0) return 0;
  const uint64_t x = a.report.*field, y = b.report.*field;
  return y >= x ? static_cast<double>(y - x) / seconds : 0;
}

std::string JobView::Json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  auto since = [&](Clock::time_point t) {
    return absl::StrFormat("%.3f", std::chrono::duration<double>(t - born_).count());
  };
  std::string out = absl::StrCat(
      "{\"job\":{\"id\":", JsonString(options_.job_id),
      ",\"command\":", JsonString(options_.command), ",\"size\":", ranks_.size(),
      ",\"now\":", since(now), ",\"window\":", options_.window.count(),
      ",\"ended\":", ended_ ? "true" : "false", ",\"summary\":", JsonString(summary_),
      ",\"stall\":", JsonString(stall_), ",\"straggler\":", JsonString(straggler_line_),
      ",\"straggler_rank\":",
      straggler_.has_value() && !straggler_->whole_host ? absl::StrCat(straggler_->rank) : "-1",
      ",\"straggler_ranks\":[", straggler_.has_value() ? absl::StrJoin(straggler_->ranks, ",") : "",
      "]", ",\"restarts\":", options_.restarts, ",\"membership_changes\":", membership_changes_,
      "},\"ranks\":[");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    double wait = 0, last = 0;
    if (r.samples.size() >= 2) {
      const Report d = Minus(r.samples.back().report, r.samples[r.samples.size() - 2].report);
      const double s =
          std::chrono::duration<double>(r.samples.back().at - r.samples[r.samples.size() - 2].at)
              .count();
      wait = s > 0 ? std::min(1.0, d.Waited() / (s * 1e9)) : 0;
      last = d.LastShare();
    }
    absl::StrAppend(
        &out, i == 0 ? "" : ",", "{\"rank\":", i, ",\"host\":", JsonString(r.host),
        ",\"state\":", JsonString(StateOf(r)),
        ",\"collectives_per_s\":", absl::StrFormat("%.1f", Rate(r, &Report::collectives)),
        ",\"bytes_per_s\":", absl::StrFormat("%.0f", Rate(r, &Report::bytes)),
        ",\"wait_share\":", absl::StrFormat("%.3f", wait),
        ",\"last_share\":", absl::StrFormat("%.3f", last),
        ",\"cpu\":", absl::StrFormat("%.3f", Rate(r, &Report::cpu_ns) / 1e9),
        ",\"rss\":", r.samples.empty() ? 0 : r.samples.back().report.rss_bytes,
        // The GPU: -1 without one (no NVML, or no CUDA_VISIBLE_DEVICES).
        ",\"gpu\":",
        r.samples.empty() || !r.samples.back().report.has_gpu
            ? std::string("-1")
            : absl::StrFormat("%.2f", r.samples.back().report.gpu_percent / 100.0),
        ",\"gpu_memory\":", r.samples.empty() ? 0 : r.samples.back().report.gpu_memory_bytes,
        ",\"collectives\":", r.samples.empty() ? 0 : r.samples.back().report.collectives,
        ",\"line\":", JsonString(r.line), ",\"timeline\":[");
    // The timeline: per report interval [end (s since start), share in collectives, share waited
    // for the last rank, share of samples where this rank was last].
    const size_t first =
        r.samples.size() > kTimelinePoints + 1 ? r.samples.size() - kTimelinePoints - 1 : 0;
    for (size_t k = first + 1; k < r.samples.size(); ++k) {
      const Report d = Minus(r.samples[k].report, r.samples[k - 1].report);
      const double s = std::chrono::duration<double>(r.samples[k].at - r.samples[k - 1].at).count();
      if (s <= 0) continue;
      absl::StrAppend(&out, k == first + 1 ? "" : ",", "[", since(r.samples[k].at), ",",
                      absl::StrFormat("%.3f", std::min(1.0, d.busy_ns / (s * 1e9))), ",",
                      absl::StrFormat("%.3f", std::min(1.0, d.Waited() / (s * 1e9))), ",",
                      absl::StrFormat("%.3f", d.LastShare()), "]");
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "]}");
  return out;
}

std::string JobView::Metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  auto labels = [&](size_t i) {
    return absl::StrCat("{rank=\"", i, "\",host=\"", Label(ranks_[i].host), "\"}");
  };
  family("trainrun_rank_state", "gauge", "1 for each rank's current state.");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    std::string state = StateOf(ranks_[i]);
    if (absl::StartsWith(state, "waiting in")) state = "waiting";
    if (ranks_[i].exited) state = ranks_[i].exit.ok() ? "exited" : "failed";
    absl::StrAppend(&out, "trainrun_rank_state{rank=\"", i, "\",host=\"", Label(ranks_[i].host),
                    "\",state=\"", Label(state), "\"} 1\n");
  }
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const Report&);
  };
  const Family families[] = {
      {"trainrun_collectives_total", "counter", "Collectives the rank has joined.",
       [](const Report& r) { return static_cast<double>(r.collectives); }},
      {"trainrun_collective_bytes_total", "counter", "Bytes of the rank's data in its collectives.",
       [](const Report& r) { return static_cast<double>(r.bytes); }},
      {"trainrun_collective_seconds_total", "counter", "Seconds the rank spent inside collectives.",
       [](const Report& r) { return static_cast<double>(r.busy_ns) * 1e-9; }},
      {"trainrun_sampled_collectives_total", "counter",
       "Collectives at which the ranks compared their times (straggler attribution's samples).",
       [](const Report& r) { return static_cast<double>(r.samples); }},
      {"trainrun_last_arrivals_total", "counter",
       "Sampled collectives at which the rank arrived last.",
       [](const Report& r) { return static_cast<double>(r.last_samples); }},
      {"trainrun_last_arrival_delay_seconds_total", "counter",
       "Seconds after the first rank that the rank arrived, summed over its sampled last arrivals.",
       [](const Report& r) { return static_cast<double>(r.last_gap_ns) * 1e-9; }},
      {"trainrun_wait_for_last_seconds", "gauge",
       "Seconds the rank spent waiting for the last rank to arrive (estimated from the samples).",
       [](const Report& r) { return r.Waited() * 1e-9; }},
      {"trainrun_cpu_seconds_total", "counter", "CPU time of the rank's process.",
       [](const Report& r) { return static_cast<double>(r.cpu_ns) * 1e-9; }},
  };
  for (const Family& f : families) {
    family(f.name, f.type, f.help);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].samples.empty()) continue;
      absl::StrAppend(&out, f.name, labels(i), " ",
                      absl::StrFormat("%.9g", f.value(ranks_[i].samples.back().report)), "\n");
    }
  }
  family("trainrun_resident_memory_bytes", "gauge", "Resident memory of the rank's process.");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].samples.empty()) continue;
    absl::StrAppend(&out, "trainrun_resident_memory_bytes", labels(i), " ",
                    ranks_[i].samples.back().report.rss_bytes, "\n");
  }
  family("trainrun_gpu_utilization_ratio", "gauge",
         "Share of the last sample period the rank's GPU was busy (NVML).");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].samples.empty() || !ranks_[i].samples.back().report.has_gpu) continue;
    absl::StrAppend(&out, "trainrun_gpu_utilization_ratio", labels(i), " ",
                    absl::StrFormat("%.2f", ranks_[i].samples.back().report.gpu_percent / 100.0),
                    "\n");
  }
  family("trainrun_gpu_memory_used_bytes", "gauge", "Memory the rank holds on its GPU (NVML).");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].samples.empty() || !ranks_[i].samples.back().report.has_gpu) continue;
    absl::StrAppend(&out, "trainrun_gpu_memory_used_bytes", labels(i), " ",
                    ranks_[i].samples.back().report.gpu_memory_bytes, "\n");
  }
  family("trainrun_straggler", "gauge", "1 for the rank the straggler line names.");
  for (size_t i = 0; i < ranks_.size(); ++i) {
    absl::StrAppend(&out, "trainrun_straggler", labels(i), " ",
                    IsStraggler(static_cast<int>(i)) ? 1 : 0, "\n");
  }
  family("trainrun_restarts_total", "counter", "Times the job was started again (--max-restarts).");
  absl::StrAppend(&out, "trainrun_restarts_total ", options_.restarts, "\n");
  family("trainrun_membership_changes_total", "counter",
         "Elastic membership changes (ranks lost or added).");
  absl::StrAppend(&out, "trainrun_membership_changes_total ", membership_changes_, "\n");
  family("trainrun_job_ended", "gauge", "1 once the job has ended.");
  absl::StrAppend(&out, "trainrun_job_ended ", ended_ ? 1 : 0, "\n");
  return out;
}

std::string JobView::Text(int width) const {
  std::lock_guard<std::mutex> lock(mutex_);
  width = std::clamp(width, 40, 400);
  std::string out = absl::StrCat("trainrun job ", options_.job_id, ": ", options_.command, "\n",
                                 ranks_.size(), " ranks", ended_ ? ", ended" : "", "\n");
  auto clip = [width](std::string line) {
    if (static_cast<int>(line.size()) > width) line.resize(width);
    return line + "\n";
  };
  if (!straggler_line_.empty()) absl::StrAppend(&out, clip(straggler_line_));
  if (!stall_.empty()) absl::StrAppend(&out, clip(stall_));
  // GPU and its memory: columns only when a rank reports its GPU.
  bool gpus = false;
  for (const Rank& r : ranks_)
    gpus = gpus || (!r.samples.empty() && r.samples.back().report.has_gpu);
  absl::StrAppend(
      &out, clip(absl::StrFormat("%5s %-10s %-24s %9s %10s %6s %6s %6s %9s%s  %s", "RANK", "HOST",
                                 "STATE", "COLL/S", "BYTES/S", "WAIT", "LAST", "CPU", "RSS",
                                 gpus ? "    GPU  GPU MEM" : "", "OUTPUT")));
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    double wait = 0, last = 0;
    if (r.samples.size() >= 2) {
      const Report d = Minus(r.samples.back().report, r.samples[r.samples.size() - 2].report);
      const double s =
          std::chrono::duration<double>(r.samples.back().at - r.samples[r.samples.size() - 2].at)
              .count();
      wait = s > 0 ? d.Waited() / (s * 1e9) : 0;
      last = d.LastShare();
    }
    const bool straggler = IsStraggler(static_cast<int>(i));
    std::string gpu;
    if (gpus) {
      const Report* now = r.samples.empty() ? nullptr : &r.samples.back().report;
      gpu = now != nullptr && now->has_gpu
                ? absl::StrFormat(" %6s %8s", Percent(now->gpu_percent / 100.0),
                                  Bytes(static_cast<double>(now->gpu_memory_bytes)))
                : absl::StrFormat(" %6s %8s", "-", "-");
    }
    absl::StrAppend(
        &out,
        clip(absl::StrFormat(
            "%5d %-10s %-24s %9.0f %10s %6s %6s %5.0f%% %9s%s  %s%s", i, r.host.substr(0, 10),
            StateOf(r).substr(0, 24), Rate(r, &Report::collectives), Bytes(Rate(r, &Report::bytes)),
            Percent(wait), Percent(last), 100 * Rate(r, &Report::cpu_ns) / 1e9,
            Bytes(r.samples.empty() ? 0.0 : static_cast<double>(r.samples.back().report.rss_bytes)),
            gpu, straggler ? "<- straggler  " : "", r.line)));
  }
  if (!summary_.empty()) absl::StrAppend(&out, summary_, "\n");
  return out;
}

}  // namespace trainrun::launcher::monitor
