// WaitLimit: when one wait of a communicator gives up. Every wait of its bootstrap (the store's
// gathers and gets, TCP connects, handshakes and accepts) and of its collectives over TCP ends at a
// deadline (TimeoutError) or, when CommunicatorOptions::interrupt is set, once it returns true
// (InterruptedError). A wait that has moved nothing for kInterruptCheck asks it, then every
// kInterruptCheck, so that an elastic worker whose job lost a member while it waited moves on to
// the job's next generation in a fraction of a second instead of sitting out the timeout.
//
//   WaitLimit limit = WaitLimit::After(timeout, &options.interrupt);
//   while (!ready()) {
//     if (!BlockFor(limit.Slice())) limit.Poll("rank 3: waiting for rank 5");  // nothing came
//   }
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using Clock = std::chrono::steady_clock;

// How long a wait moves nothing before it asks CommunicatorOptions::interrupt, and how often after.
inline constexpr std::chrono::milliseconds kInterruptCheck{100};

// InterruptedError: a wait gave up because CommunicatorOptions::interrupt said so (the job's
// membership changed). An IoError, so that callers treat it as a lost peer (an elastic worker joins
// the job's next generation), but it blames no peer.
class InterruptedError : public IoError {
 public:
  using IoError::IoError;
};

// ThrowInterrupted throws the InterruptedError of a wait described by `what` ("rank 3: waiting for
// ...").
[[noreturn]] void ThrowInterrupted(const std::string& what);

struct WaitLimit {
  // A limit of `deadline` alone (implicit: most waits have only a deadline).
  WaitLimit(Clock::time_point deadline) : deadline(deadline) {}  // NOLINT(runtime/explicit)
  // `interrupt` (not owned; null or empty: never) is asked as the file's comment says.
  WaitLimit(Clock::time_point deadline, const std::function<bool()>* interrupt)
      : deadline(deadline), interrupt(interrupt) {}
  static WaitLimit After(std::chrono::milliseconds timeout,
                         const std::function<bool()>* interrupt = nullptr) {
    return WaitLimit(Clock::now() + timeout, interrupt);
  }

  bool interruptible() const { return interrupt != nullptr && *interrupt; }
  // Left: the time to the deadline (0 once past).
  std::chrono::milliseconds Left() const;
  // Slice: how long the wait may block before it calls Poll: what is Left, and when interruptible
  // at most kInterruptCheck.
  std::chrono::milliseconds Slice() const;
  // Poll: called after a slice in which nothing came; throws InterruptedError naming `what` when
  // the interrupt says so.
  void Poll(const std::string& what) const;

  Clock::time_point deadline;
  const std::function<bool()>* interrupt = nullptr;
};

}  // namespace trainrun::collectives::internal
