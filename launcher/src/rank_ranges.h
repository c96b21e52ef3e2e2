// RankRanges names ranks for messages: {3} -> "rank 3", {0, 1, 2, 5} -> "ranks 0-2,5" (the ranks
// sorted, no duplicates).
#pragma once

#include <string>
#include <vector>

namespace trainrun::launcher {

std::string RankRanges(const std::vector<int>& ranks);

}  // namespace trainrun::launcher
