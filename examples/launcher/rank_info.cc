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

std::string Get(const char* name) { return env::Lookup(name).value_or("(unset)"); }

}  // namespace

int main() {
  // One write, so that the ranks' blocks do not interleave line by line.
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "rank %s of %s on %s (local_rank %s of %s, cross_rank %s of %s)\n",
                Get(env::kRank).c_str(), Get(env::kSize).c_str(), Get(env::kHostname).c_str(),
                Get(env::kLocalRank).c_str(), Get(env::kLocalSize).c_str(),
                Get(env::kCrossRank).c_str(), Get(env::kCrossSize).c_str());
  out += line;
  for (const char* name : kVariables) {
    if (std::strcmp(name, env::kJobToken) == 0 && env::Lookup(name).has_value()) {
      std::snprintf(line, sizeof(line), "  %s=(%zu hex digits, not shown)\n", name,
                    env::Lookup(name)->size());
    } else {
      std::snprintf(line, sizeof(line), "  %s=%s\n", name, Get(name).c_str());
    }
    out += line;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
