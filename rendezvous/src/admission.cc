#include "trainrun/rendezvous/admission.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainrun::rendezvous {
namespace {

constexpr const char* kReasonText[] = {"past the deadline", "over the per-address cap",
                                       "over the cap in all", "sending too much first", "refused"};
// The report names this many addresses, the busiest first.
constexpr size_t kAddressesNamed = 3;

}  // namespace

Admission::Admission(std::string what, Limits limits,
                     std::function<void(const std::string&)> report)
    : what_(std::move(what)), limits_(limits), report_(std::move(report)) {
  if (!report_) {
    report_ = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
}

size_t Admission::unproven_from(const std::string& address) const {
  auto it = per_address_.find(address);
  return it == per_address_.end() ? 0 : it->second;
}

void Admission::Forget(uint64_t id, const Held& held) {
  auto count = per_address_.find(held.address);
  if (count != per_address_.end() && --count->second == 0) {
    per_address_.erase(count);
    order_by_address_.erase(held.address);
  }
  held_.erase(id);
}

uint64_t Admission::Oldest(const std::string* address) {
  std::deque<uint64_t>* order = &order_;
  if (address != nullptr) {
    auto it = order_by_address_.find(*address);
    if (it == order_by_address_.end()) return 0;
    order = &it->second;
  }
  while (!order->empty()) {
    const uint64_t id = order->front();
    if (held_.count(id) != 0) return id;
    order->pop_front();  // proven or closed since
  }
  return 0;
}

std::vector<uint64_t> Admission::Admit(uint64_t id, const std::string& address,
                                       Clock::time_point now) {
  std::vector<uint64_t> evict;
  while (unproven_from(address) >= std::max<size_t>(limits_.per_address, 1)) {
    const uint64_t oldest = Oldest(&address);
    if (oldest == 0) break;
    evict.push_back(oldest);
    Closed(oldest, Reason::kPerAddress);
  }
  while (held_.size() >= std::max<size_t>(limits_.total, 1)) {
    const uint64_t oldest = Oldest(nullptr);
    if (oldest == 0) break;
    evict.push_back(oldest);
    Closed(oldest, Reason::kTotal);
  }
  held_[id] = Held{address, now};
  ++per_address_[address];
  order_.push_back(id);
  order_by_address_[address].push_back(id);
  // The queues keep ids no longer held until they reach the front; trim them when they are mostly
  // such, so a long flood of proven connections cannot grow them without bound.
  if (order_.size() > 2 * held_.size() + 1024) {
    std::deque<uint64_t> kept;
    for (uint64_t held : order_) {
      if (held_.count(held) != 0) kept.push_back(held);
    }
    order_.swap(kept);
    for (auto& [from, queue] : order_by_address_) {
      std::deque<uint64_t> still;
      for (uint64_t held : queue) {
        if (held_.count(held) != 0) still.push_back(held);
      }
      queue.swap(still);
    }
  }
  if (!evict.empty()) Report(now);
  return evict;
}

bool Admission::Proven(uint64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  Forget(id, it->second);
  return true;
}

void Admission::Closed(uint64_t id) {
  auto it = held_.find(id);
  if (it != held_.end()) Forget(id, it->second);
}

void Admission::Closed(uint64_t id, Reason why) {
  auto it = held_.find(id);
  if (it != held_.end()) {
    ++closed_from_[it->second.address];
    Forget(id, it->second);
  }
  ++counts_[static_cast<int>(why)];
  ++closed_total_;
}

std::vector<uint64_t> Admission::Expired(Clock::time_point now) {
  std::vector<uint64_t> late;
  for (;;) {
    const uint64_t oldest = Oldest(nullptr);
    if (oldest == 0 || now - held_[oldest].accepted < limits_.deadline) break;
    late.push_back(oldest);
    Closed(oldest, Reason::kDeadline);
  }
  Report(now);
  return late;
}

void Admission::Report(Clock::time_point now) {
  uint64_t pending = 0;
  for (uint64_t count : counts_) pending += count;
  if (pending == 0) return;
  if (reported_once_ && now - last_report_ < kReportPeriod) return;
  std::vector<std::string> reasons;
  for (int i = 0; i < 5; ++i) {
    if (counts_[i] != 0) reasons.push_back(absl::StrCat(counts_[i], " ", kReasonText[i]));
    counts_[i] = 0;
  }
  std::vector<std::pair<std::string, uint64_t>> from(closed_from_.begin(), closed_from_.end());
  std::sort(from.begin(), from.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> named;
  for (size_t i = 0; i < from.size() && i < kAddressesNamed; ++i) {
    named.push_back(absl::StrCat(from[i].first, " (", from[i].second, ")"));
  }
  if (from.size() > kAddressesNamed) {
    named.push_back(absl::StrCat(from.size() - kAddressesNamed, " more"));
  }
  report_(absl::StrCat("trainrun: ", what_, " closed ", pending,
                       pending == 1 ? " connection" : " connections",
                       " that did not prove this job's token (", absl::StrJoin(reasons, ", "), ")",
                       named.empty() ? "" : absl::StrCat(" from ", absl::StrJoin(named, ", ")),
                       reported_once_ ? " in the last minute" : "",
                       "; the next such line comes a minute later at the soonest"));
  closed_from_.clear();
  reported_once_ = true;
  last_report_ = now;
}

}  // namespace trainrun::rendezvous
