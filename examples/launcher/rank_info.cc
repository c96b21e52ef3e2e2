// rank_info: prints what trainrun told this rank, one variable per line — every variable of
// DESIGN.md's "A worker's environment" (the job token only as its length: it is a secret).
//
//   build/bin/trainrun -np 4 build/bin/rank_info
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "trainrun/rendezvous/environment.h"

namespace {

namespace env = trainrun::env;

constexpr const char* kVariables[] = {
    env::kRank,
    env::kSize,
    env::kLocalRank,
    env::kLocalSize,
    env::kCrossRank,
    env::kCrossSize,
    env::kHostname,
    env::kRendezvousAddr,
    env::kJobId,
    env::kJobToken,
    env::kHorovodRank,
    env::kHorovodSize,
    env::kHorovodLocalRank,
    env::kHorovodLocalSize,
    env::kHorovodCrossRank,
    env::kHorovodCrossSize,
    env::kHorovodHostname,
    env::kTorchRank,
    env::kTorchWorldSize,
    env::kTorchLocalRank,
    env::kTorchLocalWorldSize,
    env::kTorchGroupRank,
    env::kTorchMasterAddr,
    env::kTorchMasterPort,
    env::kOmpiRank,
    env::kOmpiSize,
    env::kOmpiLocalRank,
    env::kOmpiLocalSize,
    env::kOmpNumThreads,
};

const char* Get(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "(unset)";
}

}  // namespace

int main() {
  // One write, so that the ranks' blocks do not interleave line by line.
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "rank %s of %s on %s (local_rank %s of %s, cross_rank %s of %s)\n", Get(env::kRank),
                Get(env::kSize), Get(env::kHostname), Get(env::kLocalRank), Get(env::kLocalSize),
                Get(env::kCrossRank), Get(env::kCrossSize));
  out += line;
  for (const char* name : kVariables) {
    if (std::strcmp(name, env::kJobToken) == 0 && std::getenv(name) != nullptr) {
      std::snprintf(line, sizeof(line), "  %s=(%zu hex digits, not shown)\n", name,
                    std::strlen(std::getenv(name)));
    } else {
      std::snprintf(line, sizeof(line), "  %s=%s\n", name, Get(name));
    }
    out += line;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
