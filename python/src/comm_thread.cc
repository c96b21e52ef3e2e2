#include "comm_thread.h"

#include "trainrun/collectives/errors.h"

namespace trainrun::python {

CommThread::CommThread(collectives::Communicator& comm)
    : comm_(&comm), thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

CommThread::Handle CommThread::Submit(Job job) {
  Handle handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handle = next_handle_++;
    outcomes_.emplace(handle, Outcome{});
    queue_.emplace_back(handle, std::move(job));
  }
  queued_.notify_one();
  return handle;
}

bool CommThread::Done(Handle handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = outcomes_.find(handle);
  if (it == outcomes_.end()) {
    throw InvalidArgumentError(internal::MakeMessage(
        "handle ", handle, " is not a pending operation (already synchronized, or never started)"));
  }
  return it->second.done;
}

bool CommThread::WaitFor(Handle handle, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Look the handle up afresh after every wake-up: another waiter may have erased it meanwhile.
  auto pending = [&] {
    auto it = outcomes_.find(handle);
    if (it == outcomes_.end()) {
      throw InvalidArgumentError(internal::MakeMessage(
          "handle ", handle,
          " is not a pending operation (already synchronized, or never started)"));
    }
    return it;
  };
  if (!finished_.wait_for(lock, timeout, [&] { return pending()->second.done; })) return false;
  auto it = pending();
  std::exception_ptr error = it->second.error;
  outcomes_.erase(it);
  if (error) std::rethrow_exception(error);
  return true;
}

void CommThread::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping_, and nothing left to run
    auto [handle, job] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      job(*comm_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    auto it = outcomes_.find(handle);
    if (it != outcomes_.end()) {
      it->second.done = true;
      it->second.error = error;
    }
    finished_.notify_all();
  }
}

}  // namespace trainrun::python
