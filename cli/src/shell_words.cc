#include "shell_words.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainrun::cli {

absl::StatusOr<std::vector<std::string>> SplitShellWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0) {
    return absl::InvalidArgumentError(absl::StrCat("has an unclosed ", std::string(1, quote)));
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

}  // namespace trainrun::cli
