// CommThread: the one thread that drives a worker's Communicator (runtime.h owns it), running
// collectives in the order they were submitted, so the caller can start an allreduce and go on
// (backward keeps computing gradients) while this thread waits on the network (in Python, without
// the GIL).
//
//   CommThread thread(*comm);
//   auto h = thread.Submit([=](Communicator& c) { c.Allreduce(p, n, type, op); });
//   ... other work ...
//   thread.WaitFor(h, std::chrono::milliseconds(100));  // rethrows what the collective threw
//
// Every collective, synchronous ones included, goes through Submit, so the order on every rank is
// the order of the calls.
//
// Tensor fusion (Horovod's): in-place allreduces submitted with SubmitAllreduce that wait in the
// queue one after another (same communicator, element type and op, buffers apart, at most
// `fusion_bytes` together) run as one allreduce (Communicator::AllreduceReady: as many as every
// rank has queued), so 200 small allreduce_async_ calls cost about one allreduce of their total.
// Whatever queued while the previous collective ran is fused; and while Python is still queueing
// allreduces (one queued within the last kHold, and nobody waiting for any job), the thread waits
// for more (Horovod's cycle time), up to `fusion_bytes` queued. Waiting for a job (WaitFor:
// Python's synchronize) ends the wait at once, so a synchronous allreduce is not held back.
// In-place allreduces of GPU buffers (Allreduce::device) fuse alike among themselves, through
// gpu::DeviceWork::RunFused (a fusion buffer on the device), never with host ones.
//
// Matching by name (Horovod's): collectives submitted with a communicator may be called in
// different orders on different ranks. As long as every rank's next collective is the same (the
// call check every collective makes anyway), nothing else happens. When their names differ, every
// rank gets an OrderError from that same check (nothing ran) and the thread negotiates: the ranks
// allgather the keys of what they have pending on that communicator (a name's hash; an unnamed
// collective's key is its place among the unnamed ones, so those keep call order), move the ones
// every rank has to the front of the queue in the lowest rank's order, and go on as usual (fused
// as usual). With none in common they negotiate again, about once a millisecond, until something
// new comes; a rank pending for TRAINRUN_STALL_CHECK_TIME_SECONDS logs the names the others lack.
// A rank in join() takes part in the others' negotiation with no keys of its own and is left out
// of what must be common, so ranks that have not joined still match by name.
// When every rank waits for its collectives and none is in common for Negotiation::kStuckRounds
// rounds (the library's src/negotiation.h),
// nothing can come to resolve it: each rank's first pending collective fails with the
// MismatchError naming what each called. A second pending collective with the same name on one
// communicator throws InvalidArgumentError at the submit, on that rank only; a name is free
// again once its collective has been waited for, or has finished and a later one has too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "trainrun/collectives/communicator.h"

namespace trainrun::collectives {

namespace gpu {
class DeviceWork;
}  // namespace gpu

class CommThread {
 public:
  using Handle = int64_t;
  using Job = std::function<void(Communicator&)>;
  // How long after the last allreduce was queued the thread waits for another before it runs the
  // ones queued (unless someone waits for one of them, or the fusion cap is queued).
  static constexpr std::chrono::microseconds kHold{1000};

  // An in-place allreduce that may be fused with the ones queued next to it.
  struct Allreduce {
    Communicator* comm;  // kept alive by the caller until the job has run
    void* data;
    size_t count;
    DataType type;
    ReduceOp op;
    CallCheck check;
    // Set for a GPU buffer (`data` is on the device): the work Start-ed for it, which runs it.
    std::shared_ptr<gpu::DeviceWork> device = nullptr;
  };

  // CommThread starts the thread, which drives `comm` (the caller keeps it alive longer).
  // `fusion_bytes` caps one fused allreduce (0: no fusion, every allreduce runs alone).
  explicit CommThread(Communicator& comm, size_t fusion_bytes = 0);
  // ~CommThread finishes the jobs already submitted, then stops the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  const Communicator& comm() const { return *comm_; }

  // Submit queues `job` and returns its handle at once. `comm`: the communicator whose collective
  // the job runs (null: none; such a job is never reordered past), `name` its name ("": unnamed).
  // Throws InvalidArgumentError when a collective named `name` is already pending on `comm`.
  Handle Submit(Job job, Communicator* comm = nullptr, std::string name = {});
  // SubmitAllreduce queues an in-place allreduce, which may run fused with its neighbours.
  // `prompt`: run it, with what is queued before it, without waiting for more (the caller waits
  // for it next, as a synchronous allreduce does, or it must start now, as a gradient bucket).
  Handle SubmitAllreduce(Allreduce allreduce, bool prompt = false);

  // Done returns whether the job `handle` has finished (successfully or not). Throws
  // InvalidArgumentError for a handle that is unknown or already waited for.
  bool Done(Handle handle);

  // WaitFor waits up to `timeout` for job `handle`; returns false if it is still running. Once it
  // has finished, it forgets the handle and rethrows the job's exception if it threw.
  bool WaitFor(Handle handle, std::chrono::milliseconds timeout);
  // TryCollect is WaitFor without waiting, and without ending the thread's wait for more
  // allreduces to fuse (a poll, not a wait).
  bool TryCollect(Handle handle);

 private:
  struct Entry {
    Handle handle = 0;
    Job job;  // when not an allreduce
    std::optional<Allreduce> allreduce;
    bool prompt = false;
    Communicator* comm = nullptr;  // the collective's communicator; null: not a collective
    std::string name;              // "" when unnamed
    uint64_t key = 0;              // what negotiation matches (odd: a name's; even: unnamed's)
  };
  // How long a negotiation round waits for something new (the exchange and its limits: the
  // library's src/negotiation.h).
  static constexpr std::chrono::milliseconds kRoundWait{2};

  Handle Enqueue(Entry entry);
  // Negotiate (lock held, released while the ranks exchange) agrees with the other ranks of
  // `comm` on which pending collectives of `comm` run next and in which order, and moves them to
  // the front of the queue. `why`: the OrderError's message (what each rank called).
  void Negotiate(std::unique_lock<std::mutex>& lock, Communicator* comm, const std::string& why);
  // Pop removes the queue's head, which has finished.
  void Pop();
  // StallWarning logs, once, the collectives of `comm` this rank has pending that other ranks
  // lack, by name (`all`: every rank's keys from the last round).
  void StallWarning(Communicator* comm, const std::vector<uint64_t>& all, size_t words,
                    std::chrono::seconds waited);
  void Loop();
  // RunFused runs the allreduce at the queue's head with the fusable ones after it (lock held on
  // entry and exit, released meanwhile), then records how the ones that ran ended. On an
  // OrderError nothing ran: it returns the error's message for Negotiate, else "".
  std::string RunFused(std::unique_lock<std::mutex>& lock);
  // WithoutOverlap returns how many of `ready` (buffers of `element`-byte elements) run together:
  // all, or up to the first whose buffer overlaps an earlier one's.
  static size_t WithoutOverlap(const std::vector<Communicator::ReadyAllreduce>& ready,
                               size_t element);
  // HoldForMore waits (lock held) while more allreduces are likely to come to fuse with the head.
  void HoldForMore(std::unique_lock<std::mutex>& lock);
  void Finish(Handle handle, std::exception_ptr error);

  Communicator* comm_;
  std::mutex mutex_;
  std::condition_variable queued_;    // a job arrived, or stopping_
  std::condition_variable finished_;  // a job finished
  // Only Loop pops, so references to queued entries stay valid while it runs them unlocked.
  std::deque<Entry> queue_;
  // How each job submitted and not yet waited for ended, by handle: handles are consecutive, so
  // outcomes_[h - first_outcome_] is job h's (no hashing, no allocation per job: 200 small
  // allreduces in a row are 200 submits, finishes and collects). Entries already collected stay
  // until every one before them is too; one never collected (a handle nobody waits for) moves to
  // stragglers_ once kMostOutcomes newer ones are kept behind it.
  struct Outcome {
    enum State : uint8_t { kPending, kDone, kCollected } state = kPending;
    std::exception_ptr error;
  };
  static constexpr size_t kMostOutcomes = 4096;
  std::deque<Outcome> outcomes_;
  Handle first_outcome_ = 1;  // the handle of outcomes_.front()
  std::map<Handle, Outcome> stragglers_;
  // Find returns job `handle`'s outcome, or null when it is unknown or already collected.
  Outcome* Find(Handle handle);
  // Collect forgets job `handle` (its outcome found by Find, done) and rethrows its exception.
  void Collect(Handle handle, Outcome* outcome);
  // Trim drops collected outcomes from the front, and moves old uncollected ones to stragglers_.
  void Trim();
  // The handle of the last entry of each name, by communicator: the name is taken while that
  // entry is queued or running, and once it has finished until it is waited for or a later
  // entry has finished (done_up_to_).
  std::map<std::pair<const Communicator*, std::string>, Handle> pending_names_;
  Handle done_up_to_ = 0;  // the newest handle finished
  // Unnamed collectives submitted so far, by communicator (their keys).
  std::map<const Communicator*, uint64_t> unnamed_;
  const Communicator* last_unnamed_comm_ = nullptr;  // unnamed_'s entry for it, cached
  uint64_t* last_unnamed_ = nullptr;
  // How many entries at the queue's head the ranks agreed on in the last negotiation (the same on
  // every rank, in the same order): RunFused fuses no further, so that every rank has as many
  // ready.
  size_t agreed_ = 0;
  uint64_t enqueued_ = 0;                            // entries submitted so far
  int waiters_ = 0;                                  // threads in WaitFor
  bool holding_ = false;                             // the thread waits in HoldForMore
  std::chrono::steady_clock::time_point queued_at_;  // of the last job queued
  Handle next_handle_ = 1;
  size_t fusion_bytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trainrun::collectives
