#include "trainrun/collectives/comm_thread.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/device_collectives.h"

namespace trainrun::collectives {

CommThread::CommThread(Communicator& comm, size_t fusion_bytes)
    : comm_(&comm), fusion_bytes_(fusion_bytes), thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

CommThread::Handle CommThread::Submit(Job job) {
  return Enqueue(Entry{0, std::move(job), std::nullopt});
}

CommThread::Handle CommThread::SubmitAllreduce(Allreduce allreduce, bool prompt) {
  return Enqueue(Entry{0, nullptr, std::move(allreduce), prompt});
}

CommThread::Handle CommThread::Enqueue(Entry entry) {
  Handle handle;
  bool idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handle = next_handle_++;
    entry.handle = handle;
    outcomes_.emplace_back();
    if (outcomes_.size() > kMostOutcomes) Trim();
    // A thread holding for more allreduces must see one to run promptly, or something else.
    idle = queue_.empty() || (holding_ && (entry.prompt || !entry.allreduce));
    queue_.push_back(std::move(entry));
    queued_at_ = std::chrono::steady_clock::now();
  }
  // A busy thread looks at the queue again before it sleeps: waking it costs a system call.
  if (idle) queued_.notify_one();
  return handle;
}

CommThread::Outcome* CommThread::Find(Handle handle) {
  if (handle < first_outcome_) {
    auto it = stragglers_.find(handle);
    return it == stragglers_.end() ? nullptr : &it->second;
  }
  if (handle - first_outcome_ >= static_cast<Handle>(outcomes_.size())) return nullptr;
  Outcome& outcome = outcomes_[static_cast<size_t>(handle - first_outcome_)];
  return outcome.state == Outcome::kCollected ? nullptr : &outcome;
}

void CommThread::Collect(Handle handle, Outcome* outcome) {
  std::exception_ptr error = std::move(outcome->error);
  if (handle < first_outcome_) {
    stragglers_.erase(handle);
  } else {
    outcome->state = Outcome::kCollected;
    outcome->error = nullptr;
    Trim();
  }
  if (error) std::rethrow_exception(error);
}

void CommThread::Trim() {
  while (!outcomes_.empty() &&
         (outcomes_.front().state == Outcome::kCollected || outcomes_.size() > kMostOutcomes)) {
    if (outcomes_.front().state != Outcome::kCollected) {
      stragglers_.emplace(first_outcome_, std::move(outcomes_.front()));
    }
    outcomes_.pop_front();
    ++first_outcome_;
  }
}

namespace {

[[noreturn]] void ThrowUnknown(CommThread::Handle handle) {
  throw InvalidArgumentError(internal::MakeMessage(
      "handle ", handle, " is not a pending operation (already synchronized, or never started)"));
}

}  // namespace

bool CommThread::Done(Handle handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  Outcome* outcome = Find(handle);
  if (outcome == nullptr) ThrowUnknown(handle);
  return outcome->state == Outcome::kDone;
}

bool CommThread::TryCollect(Handle handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  Outcome* outcome = Find(handle);
  if (outcome == nullptr) ThrowUnknown(handle);
  if (outcome->state != Outcome::kDone) return false;
  Collect(handle, outcome);
  return true;
}

bool CommThread::WaitFor(Handle handle, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // A waiter ends the communication thread's wait for more allreduces to fuse.
  ++waiters_;
  if (holding_) queued_.notify_one();
  struct Leave {
    int& waiters;
    ~Leave() { --waiters; }
  } leave{waiters_};
  // Look the handle up afresh after every wake-up: another waiter may have collected it meanwhile
  // (and the deque may have moved).
  auto pending = [&] {
    Outcome* outcome = Find(handle);
    if (outcome == nullptr) ThrowUnknown(handle);
    return outcome;
  };
  if (!finished_.wait_for(lock, timeout, [&] { return pending()->state == Outcome::kDone; })) {
    return false;
  }
  Collect(handle, pending());
  return true;
}

void CommThread::Finish(Handle handle, std::exception_ptr error) {
  Outcome* outcome = Find(handle);
  if (outcome != nullptr) {
    outcome->state = Outcome::kDone;
    outcome->error = std::move(error);
  }
}

void CommThread::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping_, and nothing left to run
    if (queue_.front().allreduce) {
      HoldForMore(lock);
      RunFused(lock);
      finished_.notify_all();
      continue;
    }
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      entry.job(*comm_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    Finish(entry.handle, error);
    finished_.notify_all();
  }
}

void CommThread::HoldForMore(std::unique_lock<std::mutex>& lock) {
  if (fusion_bytes_ == 0) return;
  while (!stopping_ && waiters_ == 0) {
    const auto until = queued_at_ + kHold;
    if (std::chrono::steady_clock::now() >= until) return;
    size_t bytes = 0;
    for (const Entry& entry : queue_) {
      // Something else comes next, or someone waits: run what there is.
      if (!entry.allreduce || entry.prompt) return;
      bytes += entry.allreduce->count * collectives::ElementSize(entry.allreduce->type);
    }
    if (bytes >= fusion_bytes_) return;
    holding_ = true;
    queued_.wait_until(lock, until);
    holding_ = false;
  }
}

size_t CommThread::WithoutOverlap(const std::vector<Communicator::ReadyAllreduce>& ready,
                                  size_t element) {
  // The common case (nothing overlaps) is one sort of the ranges, no map.
  std::vector<std::pair<const char*, const char*>> ranges;
  ranges.reserve(ready.size());
  for (const auto& r : ready) {
    const char* begin = static_cast<const char*>(r.data);
    if (r.count > 0) ranges.emplace_back(begin, begin + r.count * element);
  }
  std::sort(ranges.begin(), ranges.end());
  bool overlap = false;
  for (size_t i = 1; i < ranges.size() && !overlap; ++i) {
    overlap = ranges[i - 1].second > ranges[i].first;
  }
  if (!overlap) return ready.size();
  // Buffers taken so far, by start: the first buffer that overlaps one of them ends the group
  // (reduced twice in a row is not reduced once).
  std::map<const char*, const char*> taken;
  for (size_t i = 0; i < ready.size(); ++i) {
    if (ready[i].count == 0) continue;
    const char* begin = static_cast<const char*>(ready[i].data);
    const char* end = begin + ready[i].count * element;
    auto next = taken.lower_bound(begin);
    if (next != taken.end() && next->first < end) return i;
    if (next != taken.begin() && std::prev(next)->second > begin) return i;
    taken.emplace(begin, end);
  }
  return ready.size();
}

void CommThread::RunFused(std::unique_lock<std::mutex>& lock) {
  const Allreduce& head = *queue_.front().allreduce;
  Communicator* comm = head.comm;
  std::vector<Communicator::ReadyAllreduce> ready;
  const size_t element = collectives::ElementSize(head.type);
  size_t bytes = 0;
  for (const Entry& entry : queue_) {
    if (!entry.allreduce) break;
    const Allreduce& a = *entry.allreduce;
    if (a.comm != comm || a.type != head.type || a.op != head.op) break;
    if ((a.device != nullptr) != (head.device != nullptr)) break;
    const size_t size = a.count * element;
    if (!ready.empty() && (fusion_bytes_ == 0 || bytes + size > fusion_bytes_)) break;
    bytes += size;
    ready.push_back({a.data, a.count, &a.check});
  }
  ready.resize(WithoutOverlap(ready, element));
  // Taken under the lock: indexing the deque races with a Submit's push_back.
  std::vector<gpu::DeviceWork*> works;
  if (head.device != nullptr) {
    for (size_t i = 0; i < ready.size(); ++i) works.push_back(queue_[i].allreduce->device.get());
  }
  lock.unlock();
  std::exception_ptr error;
  size_t k;
  if (head.device != nullptr) {
    k = gpu::DeviceWork::RunFused(works, &error);
  } else if (ready.size() == 1 && fusion_bytes_ == 0) {
    k = 1;
    try {
      comm->Allreduce(head.data, head.count, head.type, head.op, head.check);
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    k = comm->AllreduceReady(ready, head.type, head.op, &error);
  }
  lock.lock();
  for (size_t i = 0; i < k; ++i) {
    Finish(queue_.front().handle, error);
    queue_.pop_front();
  }
}

}  // namespace trainrun::collectives
