// RendezvousState: the job's key-value store as the server keeps it — keys, counters, barriers,
// allgathers and the calls waiting on them, with their deadlines and the limits of ServerLimits.
// No gRPC here: a call that cannot finish at once leaves a Reply, which the state calls exactly
// once, without its lock, when the call ends (a Set, a barrier's or gather's last arrival, its
// deadline, Cancel or Shutdown). The server (server.cc) turns RPCs into these calls and Replies
// into finished reactors; tests drive the state directly (tests/rendezvous/state_test.cc).
//
//   Membership members(ranks);
//   RendezvousState state(limits, members);
//   std::thread deadlines([&] { state.RunDeadlines(); });
//   state.Get({"k"}, 5000, [](Outcome done) { ... done.values ... });
//   state.Set("k", "v");  // the Get's Reply runs here, on this thread
//   state.Shutdown(); deadlines.join();
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "membership.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::rendezvous::internal {

// Values is a Get's answer: its keys' values, in its order, end to end; ends[i] is where the i-th
// ends (GetResponse's packing).
struct Values {
  std::string packed;
  std::vector<uint32_t> ends;
};

// Outcome is how a call ended: its status and, when it is OK, a Get's values or an Allgather's
// answer (the encoded table, as the state's `wrap_answer` made it; shared by every caller).
struct Outcome {
  absl::Status status;
  Values values;
  std::shared_ptr<const std::string> answer;
};

// Reply receives a call's Outcome, once, without the state's lock: on the caller's thread when the
// call finishes at once, else on the thread that ends its wait.
using Reply = std::function<void(Outcome)>;

// WaitId names a waiting call for Cancel; 0 means the call did not wait.
using WaitId = uint64_t;

class RendezvousState {
 public:
  using Clock = std::chrono::steady_clock;

  // `membership` must outlive the state; its ranks name the absent in timeout errors.
  // `wrap_answer` turns a complete gather's table into the bytes every caller gets (the server
  // serializes an AllgatherResponse there, once per gather); by default the table itself.
  RendezvousState(const ServerLimits& limits, const Membership& membership,
                  std::function<std::string(std::string table)> wrap_answer = {});
  ~RendezvousState();
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // CheckKey: `key` is not empty and within max_key_bytes (`what` names it: "key", "barrier name").
  absl::Status CheckKey(const std::string& key, const char* what) const;
  // CheckValue: `value`, stored under `key`, is within max_value_bytes.
  absl::Status CheckValue(const std::string& key, size_t value_bytes) const;
  // CheckTimeout: 0 to max_timeout_ms.
  absl::Status CheckTimeout(int64_t timeout_ms) const;
  // CheckContribution checks one Allgather contribution as its call would be checked.
  absl::Status CheckContribution(const std::string& name, int rank, int count, size_t value_bytes,
                                 int64_t timeout_ms) const;

  // Set stores `value` under `key` and releases the Gets waiting for it (their Replies run on
  // this thread). RESOURCE_EXHAUSTED past max_stored_bytes. The caller checks key and value.
  absl::Status Set(const std::string& key, const std::string& value);
  // Add adds `delta` to counter `key` (created at 0) and returns its value.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // SetCounter sets counter `key` to `value`.
  void SetCounter(const std::string& key, int64_t value);

  // Get answers `keys`' values once all are set, or fails after `timeout_ms` naming those missing.
  // Refused (at once, through `reply`) past the limits or while shutting down.
  WaitId Get(std::vector<std::string> keys, int64_t timeout_ms, Reply reply);
  // Barrier enters `ranks` (each a rank, or -1 for a caller that did not say) into barrier `name`
  // of `count` callers as one call; a rank that enters again counts once.
  WaitId Barrier(const std::string& name, int count, int64_t timeout_ms,
                 const std::vector<int>& ranks, Reply reply);
  // Allgather enters the already checked contributions `members` ((rank, value) pairs) into gather
  // `name` of `count` as one call. A complete gather answers a late caller (a retry) at once.
  WaitId Allgather(const std::string& name, int count, int64_t timeout_ms,
                   const std::vector<std::pair<int, const std::string*>>& members, Reply reply);

  // Cancel ends waiting call `id` with CANCELLED; false when it had already ended.
  bool Cancel(WaitId id);
  // Shutdown ends every waiting call with UNAVAILABLE, refuses new waits and stops RunDeadlines.
  void Shutdown();
  // RunDeadlines ends waiting calls as their deadlines pass (DEADLINE_EXCEEDED, saying what they
  // waited for), until Shutdown. Run it on a thread of its own.
  void RunDeadlines();
  // ExpireDue ends the waiting calls whose deadline is at or before `now`, as RunDeadlines does.
  void ExpireDue(Clock::time_point now);

  size_t WaitingCalls() const;
  // ValuesWithPrefix returns the stored keys that start with `prefix`, with their values.
  std::map<std::string, std::string> ValuesWithPrefix(const std::string& prefix) const;

 private:
  // What a waiting call waits for.
  struct GetWait {
    std::vector<std::string> keys;          // as asked, in order
    std::vector<std::string> missing_keys;  // distinct, sorted, when it started waiting
    size_t missing = 0;                     // how many of those are still missing
  };
  struct BarrierWait {
    std::string name;
  };
  struct GatherWait {
    std::string name;
  };
  struct Waiter {
    std::variant<GetWait, BarrierWait, GatherWait> what;
    std::chrono::milliseconds timeout;
    std::multimap<Clock::time_point, WaitId>::iterator deadline;
    Reply reply;
  };
  struct BarrierState {
    int count = 0;
    int arrived = 0;
    std::set<int> ranks;  // the ranks that entered, when they said who they are
    std::vector<WaitId> waiters;
  };
  // An Allgather: who has contributed, who waits, and, once all have, the answer every caller gets
  // (or why there is none: it passed the response limit).
  struct GatherState {
    int count = 0;
    int arrived = 0;
    std::vector<bool> contributed;
    std::vector<WaitId> waiters;
    std::shared_ptr<const std::string> answer;
    absl::Status failed;
  };
  // A call ended under the lock, whose Reply runs once the lock is let go.
  struct Completion {
    Reply reply;
    Outcome outcome;
  };

  // With mutex_ held: whether one more call may wait.
  absl::Status CanWait() const;
  // With mutex_ held: start waiting as call next_id_ (which the caller has put in the index of
  // what it waits for); returns that id.
  WaitId AddWaiter(std::variant<GetWait, BarrierWait, GatherWait> what, int64_t timeout_ms,
                   Reply reply);
  // With mutex_ held: take waiter `id` out of every index and return it; nullopt when it had
  // already ended.
  std::optional<Waiter> Claim(WaitId id);
  // With mutex_ held: Set's work; the Gets it completes are added to `completions`.
  absl::Status StoreLocked(const std::string& key, const std::string& value,
                           std::vector<Completion>& completions);
  // With mutex_ held: `keys`' values, or RESOURCE_EXHAUSTED past max_response_bytes.
  absl::StatusOr<Values> ValuesOf(const std::vector<std::string>& keys) const;
  // With mutex_ held: find (or open) gather `name`; nullptr with `status` set when refused.
  GatherState* FindGather(const std::string& name, int count, absl::Status& status);
  // With mutex_ held: encode a complete gather's table and hand it to its waiting callers.
  void CompleteGather(const std::string& name, GatherState& gather,
                      std::vector<Completion>& completions);
  // With mutex_ held: why waiter `waiter` still waits, for its timeout error.
  std::string DescribeTimeout(const Waiter& waiter) const;
  std::string DescribeWait(const std::string& after, const GetWait& get) const;
  std::string DescribeWait(const std::string& after, const BarrierWait& barrier) const;
  std::string DescribeWait(const std::string& after, const GatherWait& gather) const;
  static void RunAll(std::vector<Completion>& completions);

  const ServerLimits limits_;
  const Membership& membership_;
  std::function<std::string(std::string)> wrap_answer_;

  mutable std::mutex mutex_;
  std::condition_variable deadline_changed_;
  bool stopping_ = false;
  std::unordered_map<std::string, std::string> values_;
  std::unordered_map<std::string, int64_t> counters_;
  size_t stored_bytes_ = 0;
  std::unordered_map<std::string, std::vector<WaitId>> key_waiters_;
  std::unordered_map<std::string, BarrierState> barriers_;
  std::unordered_map<std::string, GatherState> gathers_;
  std::unordered_map<WaitId, Waiter> waiters_;
  std::multimap<Clock::time_point, WaitId> deadlines_;
  WaitId next_id_ = 1;
};

}  // namespace trainrun::rendezvous::internal
