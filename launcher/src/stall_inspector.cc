#include "trainrun/launcher/stall_inspector.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rank_ranges.h"
#include "trainrun/rendezvous/stall_report.h"

namespace trainrun::launcher {

StallInspector::StallInspector(int size, std::chrono::seconds warning,
                               std::chrono::seconds shutdown)
    : size_(size), warning_(warning), shutdown_(shutdown) {}

std::string StallInspector::Update(const std::map<int, std::string>& waiting,
                                   Clock::time_point now) {
  std::map<int, std::string> current;
  std::map<int, std::chrono::milliseconds> reported;
  for (const auto& [rank, value] : waiting) {
    rendezvous::StallReport report = rendezvous::StallReport::Decode(value);
    if (report.collective.empty() || rank < 0 || rank >= size_) continue;
    current[rank] = report.collective;
    // A report that does not say how long its rank had waited: the warning time, when it is sent.
    reported[rank] = report.waited.count() >= 0 ? report.waited : warning_;
  }
  if (current == waiting_) return "";
  for (auto it = seen_.begin(); it != seen_.end();) {
    auto now_op = current.find(it->first);
    if (now_op == current.end() || now_op->second != waiting_[it->first]) {
      it = seen_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [rank, op] : current) {
    if (seen_.emplace(rank, now).second) reported_[rank] = reported[rank];
  }
  waiting_ = std::move(current);
  if (waiting_.empty()) return "";
  std::string line = absl::StrCat("stall: ", Describe(now));
  if (shutdown_.count() > 0) {
    absl::StrAppend(&line, "; the job ends if it lasts ", shutdown_.count(),
                    " s (--stall-check-shutdown-time-seconds)");
  }
  return line;
}

std::string StallInspector::Collective() const {
  std::map<std::string, int> count;
  for (const auto& [rank, op] : waiting_) ++count[op];
  std::string best;
  int most = 0;
  for (const auto& [op, n] : count) {
    if (n > most) most = n, best = op;
  }
  return best;
}

std::chrono::seconds StallInspector::Waited(int rank, Clock::time_point now) const {
  auto it = seen_.find(rank);
  if (it == seen_.end()) return std::chrono::seconds(0);
  return std::chrono::duration_cast<std::chrono::seconds>(reported_.at(rank) + (now - it->second));
}

bool StallInspector::ShutdownDue(Clock::time_point now) const {
  if (shutdown_.count() <= 0) return false;
  for (const auto& [rank, op] : waiting_) {
    if (Waited(rank, now) >= shutdown_) return true;
  }
  return false;
}

std::vector<int> StallInspector::Stalled() const {
  // A rank waiting inside a collective is not stalled: it waits for others (over TCP a rank can
  // finish its share of #125 and wait in #126 for the stopped rank too). The stalled ones are in
  // no collective.
  std::vector<int> stalled;
  for (int rank = 0; rank < size_; ++rank) {
    if (waiting_.count(rank) == 0) stalled.push_back(rank);
  }
  if (!stalled.empty()) return stalled;
  // Every rank waits in one: they call collectives in different orders. Those outside the one most
  // ranks wait in are named.
  const std::string collective = Collective();
  for (const auto& [rank, op] : waiting_) {
    if (op != collective) stalled.push_back(rank);
  }
  return stalled;
}

std::string StallInspector::Describe(Clock::time_point now) const {
  const std::string collective = Collective();
  std::vector<int> in_it, absent;
  std::map<std::string, std::vector<int>> elsewhere;
  std::chrono::seconds longest(0);
  for (int rank = 0; rank < size_; ++rank) {
    auto it = waiting_.find(rank);
    if (it == waiting_.end()) {
      absent.push_back(rank);
    } else if (it->second == collective) {
      in_it.push_back(rank);
      longest = std::max(longest, Waited(rank, now));
    } else {
      elsewhere[it->second].push_back(rank);
    }
  }
  std::string text = absl::StrCat(RankRanges(in_it), in_it.size() == 1 ? " has" : " have",
                                  " waited ", longest.count(), " s in ", collective);
  std::vector<int> not_joined = absent;
  for (const auto& [op, ranks] : elsewhere) {
    not_joined.insert(not_joined.end(), ranks.begin(), ranks.end());
  }
  std::sort(not_joined.begin(), not_joined.end());
  if (!not_joined.empty()) {
    absl::StrAppend(&text, ", which ", RankRanges(not_joined),
                    not_joined.size() == 1 ? " has" : " have", " not joined");
  }
  for (const auto& [op, ranks] : elsewhere) {
    absl::StrAppend(&text, "; ", RankRanges(ranks), ranks.size() == 1 ? " waits" : " wait", " in ",
                    op, " instead");
  }
  return text;
}

}  // namespace trainrun::launcher
