// --config-file: horovodrun's YAML config and the job-file keys, as ParseConfigFile reads them. A
// file that parses must give flags that start with a dash and, like every error, cost little.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_budget.h"
#include "trainrun/cli/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("config_file");
  std::string text(reinterpret_cast<const char*>(data), size);
  auto config = trainrun::cli::ParseConfigFile(text, "fuzz.yaml");
  if (!config.ok()) {
    // Every refusal is one sentence naming the file.
    if (config.status().message().find("fuzz.yaml") == std::string::npos) {
      std::fprintf(stderr, "trainrun fuzz: config_file error without the file's name: %s\n",
                   std::string(config.status().message()).c_str());
      std::abort();
    }
    return 0;
  }
  for (const auto& flag : config->flags) {
    if (flag.empty() || flag[0].empty() || flag[0][0] != '-') {
      std::fprintf(stderr, "trainrun fuzz: config_file gave a flag that is not one\n");
      std::abort();
    }
  }
  return 0;
}
