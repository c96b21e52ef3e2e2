#include "negotiation.h"

#include <functional>
#include <unordered_set>

namespace trainrun::collectives::internal {

uint64_t Negotiation::Tag(const std::string& set_name, size_t n) {
  return (std::hash<std::string>{}(set_name) ^ static_cast<uint64_t>(n) << 48) | 1;
}

Negotiation::Outcome Negotiation::Decide(const std::vector<uint64_t>& all, size_t n, uint64_t tag,
                                         int64_t timeout_ms, int* stuck_rounds,
                                         std::vector<uint64_t>* common) {
  common->clear();
  auto words = [&](size_t rank) { return all.data() + rank * kWords; };
  for (size_t r = 0; r < n; ++r) {
    if (words(r)[2] != tag) return Outcome::kOtherSets;
  }
  // The keys every rank not in join() has, in the lowest such rank's order.
  std::vector<size_t> members;
  for (size_t r = 0; r < n; ++r) {
    if (words(r)[1] != kJoined) members.push_back(r);
  }
  if (!members.empty()) {
    std::vector<std::unordered_set<uint64_t>> others;
    for (size_t i = 1; i < members.size(); ++i) {
      const uint64_t* w = words(members[i]);
      others.emplace_back(w + kHeader, w + kHeader + w[0]);
    }
    const uint64_t* first = words(members[0]);
    for (const uint64_t* k = first + kHeader; k != first + kHeader + first[0]; ++k) {
      bool everywhere = true;
      for (size_t i = 0; i < others.size() && everywhere; ++i) everywhere = others[i].count(*k);
      if (everywhere) common->push_back(*k);
    }
  }
  if (!common->empty()) return Outcome::kAgreed;
  bool everyone_waits = true;
  for (size_t r = 0; r < n; ++r) everyone_waits &= words(r)[1] != 0;
  *stuck_rounds = everyone_waits ? *stuck_rounds + 1 : 0;
  if (*stuck_rounds >= kStuckRounds) return Outcome::kStuck;
  // As any collective, none waits longer than TRAINRUN_TIMEOUT for the others (the lowest rank's
  // clock decides, so every rank decides alike).
  if (static_cast<int64_t>(words(0)[3]) >= timeout_ms) return Outcome::kTimedOut;
  return Outcome::kAgain;
}

}  // namespace trainrun::collectives::internal
