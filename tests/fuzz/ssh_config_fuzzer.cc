// ~/.ssh/config as trainrun reads it: the first line is the host alias to resolve, the rest the
// config text. The SSH directory does not exist, so Include reads nothing of the user's; an input
// that Includes an absolute path is passed over, as globbing this machine's whole filesystem
// (`Include /*/*/*/*`) is slow by the user's request, not by a fault of the reader.
#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "fuzz_budget.h"
#include "ssh/ssh_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("ssh_config");
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string alias = "node1";
  if (size_t newline = text.find('\n'); newline != std::string::npos) {
    alias = text.substr(0, newline);
    text.erase(0, newline + 1);
  }
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // The reader's tokenizer drops quotes wherever they stand, so drop them here too.
    // Leading whitespace and `=` separate nothing from the keyword.
    std::string bare = absl::AsciiStrToLower(line);
    bare.erase(std::remove(bare.begin(), bare.end(), '"'), bare.end());
    bare.erase(0, bare.find_first_not_of(" \t\n\v\f\r="));
    if (absl::StartsWith(bare, "include") && absl::StrContains(bare, '/')) return 0;
  }
  trainrun::launcher::ssh::SshOptions options;
  options.ssh_dir = "/nonexistent/trainrun-fuzz/.ssh";
  (void)trainrun::launcher::ssh::ResolveSshTargetFromText(text, "fuzz_config", "", alias, options,
                                                          "/nonexistent/trainrun-fuzz");
  (void)trainrun::launcher::ssh::ParseHostKeyPolicy(alias);
  (void)trainrun::launcher::ssh::MatchHostPattern(alias, text.substr(0, 256));
  return 0;
}
