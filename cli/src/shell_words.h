#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainrun::cli {

// SplitShellWords splits a command written as one string (or a block of lines) into words as a
// shell splits plain words and quotes: blanks, tabs and newlines separate words, and a part in
// single or double quotes stays whole (its quotes dropped). An unclosed quote is an
// InvalidArgumentError that says which quote; the caller names where the text came from.
absl::StatusOr<std::vector<std::string>> SplitShellWords(const std::string& text);

}  // namespace trainrun::cli
