#include "trainrun/launcher/shell_quote.h"

#include "absl/strings/str_join.h"

namespace trainrun::launcher {

std::string ShellQuote(absl::string_view word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-./=:@,+%") == absl::string_view::npos) {
    return std::string(word);
  }
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

std::string ShellJoin(const std::vector<std::string>& words) {
  return absl::StrJoin(
      words, " ", [](std::string* out, const std::string& word) { out->append(ShellQuote(word)); });
}

}  // namespace trainrun::launcher
