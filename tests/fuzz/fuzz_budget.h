// FuzzBudget: a libFuzzer target's per-input cost bound. An input that costs more CPU time than
// the target's limit (100 ms unless it says otherwise; TRAINRUN_FUZZ_SLOW_MS overrides every
// target) aborts, so libFuzzer saves it as a crash: a short input that takes long is an
// amplification bug (issue 22), not a slow machine, hence CPU time, not wall time.
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     trainrun::fuzz::FuzzBudget budget("host_list");
//     ...
#pragma once

#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace trainrun::fuzz {

class FuzzBudget {
 public:
  explicit FuzzBudget(const char* what, long long limit_ms = 100)
      : what_(what), limit_ms_(limit_ms), start_ns_(CpuNs()) {}
  ~FuzzBudget() {
    const char* ms = std::getenv("TRAINRUN_FUZZ_SLOW_MS");
    const long long limit_ns = (ms != nullptr ? std::atoll(ms) : limit_ms_) * 1000000LL;
    const long long spent = CpuNs() - start_ns_;
    if (spent > limit_ns) {
      std::fprintf(stderr, "trainrun fuzz: %s spent %lld ms of CPU on one input (limit %lld ms)\n",
                   what_, spent / 1000000, limit_ns / 1000000);
      std::abort();
    }
  }
  FuzzBudget(const FuzzBudget&) = delete;
  FuzzBudget& operator=(const FuzzBudget&) = delete;

 private:
  static long long CpuNs() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
  }
  const char* what_;
  long long limit_ms_;
  long long start_ns_;
};

}  // namespace trainrun::fuzz
