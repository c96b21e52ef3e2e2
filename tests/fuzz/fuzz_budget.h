// FuzzBudget: a libFuzzer target's per-input cost bound. An input that costs more user CPU time
// than the target's limit (100 ms unless it says otherwise; TRAINRUN_FUZZ_SLOW_MS overrides every
// target) aborts, so libFuzzer saves it as a crash: a short input that takes long is an
// amplification bug (issue 22), not a slow machine, hence CPU time, not wall time; and user time,
// not system time, as on a loaded machine the kernel charged inputs that take 3 ms with 260 ms
// (page faults into memory being compacted), which made the fuzz run fail at random.
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     trainrun::fuzz::FuzzBudget budget("host_list");
//     ...
#pragma once

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

namespace trainrun::fuzz {

class FuzzBudget {
 public:
  explicit FuzzBudget(const char* what, long long limit_ms = 100)
      : what_(what), limit_ms_(limit_ms), start_(Usage()) {}
  ~FuzzBudget() {
    const char* ms = std::getenv("TRAINRUN_FUZZ_SLOW_MS");
    const long long limit_ns = (ms != nullptr ? std::atoll(ms) : limit_ms_) * 1000000LL;
    const rusage end = Usage();
    const long long user = Ns(end.ru_utime) - Ns(start_.ru_utime);
    const long long system = Ns(end.ru_stime) - Ns(start_.ru_stime);
    if (user > limit_ns) {
      std::fprintf(stderr,
                   "trainrun fuzz: %s spent %lld ms of user CPU on one input (limit %lld ms; "
                   "%lld ms in the kernel)\n",
                   what_, user / 1000000, limit_ns / 1000000, system / 1000000);
      std::abort();
    }
  }
  FuzzBudget(const FuzzBudget&) = delete;
  FuzzBudget& operator=(const FuzzBudget&) = delete;

 private:
  static rusage Usage() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage;
  }
  static long long Ns(const timeval& tv) { return tv.tv_sec * 1000000000LL + tv.tv_usec * 1000LL; }
  const char* what_;
  long long limit_ms_;
  rusage start_;
};

}  // namespace trainrun::fuzz
