#include "store_calls.h"

#include <algorithm>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

namespace {

// InSlices runs `call(timeout)`, one of the store's waits, within `limit`: once, with all the time
// left, when the limit cannot be interrupted; else in slices of kInterruptCheck, asking the
// interrupt after each that timed out. Repeating is harmless: Get only reads, and a gather counts
// a rank's contribution once and answers a late caller with the table it built.
template <typename Call>
auto InSlices(const WaitLimit& limit, const std::string& what, Call call) {
  const bool sliced = limit.interruptible();
  for (;;) {
    auto result = call(std::max(limit.Slice(), std::chrono::milliseconds(1)));
    if (result.ok()) return *std::move(result);
    const absl::Status& status = result.status();
    if (sliced && absl::IsDeadlineExceeded(status) && limit.Left().count() > 0) {
      limit.Poll(what);
      continue;
    }
    if (!absl::IsDeadlineExceeded(status)) {
      throw IoError(MakeMessage(what, ": ", status.message()));
    }
    // A sliced wait's last message speaks of its last slice only.
    throw TimeoutError(sliced ? MakeMessage(what, ": timed out; at the end: ", status.message())
                              : MakeMessage(what, ": ", status.message()));
  }
}

}  // namespace

std::vector<std::string> StoreGet(rendezvous::Store& store, const std::vector<std::string>& keys,
                                  const WaitLimit& limit, const std::string& what) {
  return InSlices(limit, what,
                  [&](std::chrono::milliseconds timeout) { return store.Get(keys, timeout); });
}

rendezvous::GatherTable StoreAllgather(rendezvous::Store& store, const std::string& name, int rank,
                                       int count, const std::string& value, const WaitLimit& limit,
                                       const std::string& what) {
  return InSlices(limit, what, [&](std::chrono::milliseconds timeout) {
    return store.AllgatherTable(name, rank, count, value, timeout);
  });
}

void StorePut(rendezvous::Store& store, const std::string& key, const std::string& value) {
  auto status = store.Set(key, value);
  if (!status.ok()) throw IoError(MakeMessage("cannot publish ", key, ": ", status.ToString()));
}

}  // namespace trainrun::collectives::internal
