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
#include <thread>
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

  // Submit queues `job` and returns its handle at once.
  Handle Submit(Job job);
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
    Handle handle;
    Job job;  // when not an allreduce
    std::optional<Allreduce> allreduce;
    bool prompt = false;
  };

  Handle Enqueue(Entry entry);
  void Loop();
  // RunFused runs the allreduce at the queue's head with the fusable ones after it (lock held on
  // entry and exit, released meanwhile), then records how the ones that ran ended.
  void RunFused(std::unique_lock<std::mutex>& lock);
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
  int waiters_ = 0;                                  // threads in WaitFor
  bool holding_ = false;                             // the thread waits in HoldForMore
  std::chrono::steady_clock::time_point queued_at_;  // of the last job queued
  Handle next_handle_ = 1;
  size_t fusion_bytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trainrun::collectives
