// CommThread: the one thread that drives the process's Communicator, running collectives in the
// order they were submitted, so Python can start an allreduce and go on (backward keeps computing
// gradients) while this thread waits on the network without the GIL.
//
//   CommThread thread(*comm);
//   auto h = thread.Submit([=](Communicator& c) { c.Allreduce(p, n, type, op); });
//   ... other work ...
//   thread.Wait(h);  // rethrows what the collective threw
//
// Every collective, synchronous ones included, goes through Submit, so the order on every rank is
// the order of the calls in Python.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "trainrun/collectives/communicator.h"

namespace trainrun::python {

class CommThread {
 public:
  using Handle = int64_t;
  using Job = std::function<void(collectives::Communicator&)>;

  // CommThread starts the thread, which drives `comm` (the caller keeps it alive longer).
  explicit CommThread(collectives::Communicator& comm);
  // ~CommThread finishes the jobs already submitted, then stops the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  const collectives::Communicator& comm() const { return *comm_; }

  // Submit queues `job` and returns its handle at once.
  Handle Submit(Job job);

  // Done returns whether the job `handle` has finished (successfully or not). Throws
  // InvalidArgumentError for a handle that is unknown or already waited for.
  bool Done(Handle handle);

  // WaitFor waits up to `timeout` for job `handle`; returns false if it is still running. Once it
  // has finished, it forgets the handle and rethrows the job's exception if it threw.
  bool WaitFor(Handle handle, std::chrono::milliseconds timeout);

 private:
  void Loop();

  collectives::Communicator* comm_;
  std::mutex mutex_;
  std::condition_variable queued_;    // a job arrived, or stopping_
  std::condition_variable finished_;  // a job finished
  std::deque<std::pair<Handle, Job>> queue_;
  // Jobs submitted and not yet waited for; the value is set (maybe to null) once it has run.
  struct Outcome {
    bool done = false;
    std::exception_ptr error;
  };
  std::unordered_map<Handle, Outcome> outcomes_;
  Handle next_handle_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trainrun::python
