#include "wait_limit.h"

#include <algorithm>

namespace trainrun::collectives::internal {

void ThrowInterrupted(const std::string& what) {
  throw InterruptedError(::trainrun::internal::MakeMessage(
      what,
      ": interrupted: the job's membership changed while this rank waited (a peer was "
      "lost)"));
}

std::chrono::milliseconds WaitLimit::Left() const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

std::chrono::milliseconds WaitLimit::Slice() const {
  const std::chrono::milliseconds left = Left();
  return interruptible() ? std::min(left, kInterruptCheck) : left;
}

void WaitLimit::Poll(const std::string& what) const {
  if (interruptible() && (*interrupt)()) ThrowInterrupted(what);
}

}  // namespace trainrun::collectives::internal
