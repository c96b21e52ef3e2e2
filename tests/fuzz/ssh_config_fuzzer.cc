// ~/.ssh/config as trainrun reads it: the first line is the host alias to resolve, the rest the
// config text. The SSH directory does not exist, so Include reads nothing of the user's.
#include <cstdint>
#include <string>

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
  trainrun::launcher::ssh::SshOptions options;
  options.ssh_dir = "/nonexistent/trainrun-fuzz/.ssh";
  (void)trainrun::launcher::ssh::ResolveSshTargetFromText(text, "fuzz_config", "", alias, options,
                                                          "/nonexistent/trainrun-fuzz");
  (void)trainrun::launcher::ssh::ParseHostKeyPolicy(alias);
  (void)trainrun::launcher::ssh::MatchHostPattern(alias, text.substr(0, 256));
  return 0;
}
