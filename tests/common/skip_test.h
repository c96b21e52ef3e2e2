// SkipTest: this test cannot run here (no root to make network or PID namespaces, no Slurm, too
// few GPUs). It says why on stderr and ends the test program with CTest's skip code, 77, which the
// CTest entry's SKIP_RETURN_CODE property reports as "Skipped", not as a pass. Use it only where
// the CTest entry runs nothing else that could run here: one entry per test case
// (catch_discover_tests), or an entry whose test cases all need the same thing.
//
//   if (!CanUseNetns()) trainrun::testing::SkipTest("needs root and iproute2");
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace trainrun::testing {

inline constexpr int kSkipReturnCode = 77;

[[noreturn]] inline void SkipTest(const std::string& why) {
  std::fprintf(stderr, "skipped: %s\n", why.c_str());
  std::exit(kSkipReturnCode);
}

}  // namespace trainrun::testing
