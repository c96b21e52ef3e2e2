#include "trainrun/collectives/comm_thread.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "log.h"
#include "negotiation.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/device_collectives.h"
#include "trainrun/rendezvous/environment.h"

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

CommThread::Handle CommThread::Submit(Job job, Communicator* comm, std::string name) {
  Entry entry;
  entry.job = std::move(job);
  entry.comm = comm;
  entry.name = std::move(name);
  return Enqueue(std::move(entry));
}

CommThread::Handle CommThread::SubmitAllreduce(Allreduce allreduce, bool prompt) {
  Entry entry;
  entry.allreduce = std::move(allreduce);
  entry.prompt = prompt;
  entry.comm = entry.allreduce->comm;
  entry.name = entry.allreduce->check.name;
  return Enqueue(std::move(entry));
}

CommThread::Handle CommThread::Enqueue(Entry entry) {
  Handle handle;
  bool idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entry.comm != nullptr) {
      if (!entry.name.empty()) {
        auto [it, fresh] = pending_names_.emplace(std::make_pair(entry.comm, entry.name), 0);
        if (!fresh) {
          // The name's last holder: still queued or running, or finished but neither waited for
          // nor followed by any later collective that has finished (Horovod raises there too:
          // an async call repeated at once must not pass because the first was quick).
          const Outcome* held = Find(it->second);
          if (held != nullptr && (held->state == Outcome::kPending || done_up_to_ <= it->second)) {
            throw InvalidArgumentError(::trainrun::internal::MakeMessage(
                "a collective named '", entry.name,
                "' is already in flight on this rank (submitted, and not yet synchronized); "
                "wait for it first, or give this one another name"));
          }
        }
        it->second = next_handle_;  // this entry's handle, given below
        entry.key = std::hash<std::string>{}(entry.name) | 1;
      } else {
        if (entry.comm != last_unnamed_comm_) {
          last_unnamed_ = &unnamed_[entry.comm];
          last_unnamed_comm_ = entry.comm;
        }
        entry.key = ++*last_unnamed_ << 1;
      }
    }
    ++enqueued_;
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
  throw InvalidArgumentError(::trainrun::internal::MakeMessage(
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
  done_up_to_ = std::max(done_up_to_, handle);
  Outcome* outcome = Find(handle);
  if (outcome != nullptr) {
    outcome->state = Outcome::kDone;
    outcome->error = std::move(error);
  }
}

void CommThread::Pop() {
  queue_.pop_front();
  if (agreed_ > 0) --agreed_;
}

void CommThread::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping_, and nothing left to run
    if (queue_.front().allreduce) {
      HoldForMore(lock);
      Communicator* comm = queue_.front().comm;
      const std::string order = RunFused(lock);
      finished_.notify_all();
      if (!order.empty()) Negotiate(lock, comm, order);
      continue;
    }
    // The entry stays queued while it runs (a deque's references survive push_back): an
    // OrderError leaves it pending.
    Entry& entry = queue_.front();
    lock.unlock();
    std::exception_ptr error;
    std::string order;
    try {
      entry.job(*comm_);
    } catch (const OrderError& e) {
      if (entry.comm != nullptr) {
        order = e.what();
      } else {
        error = std::current_exception();
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (!order.empty()) {
      Negotiate(lock, entry.comm, order);
      continue;
    }
    Finish(entry.handle, error);
    Pop();
    finished_.notify_all();
  }
}

void CommThread::Negotiate(std::unique_lock<std::mutex>& lock, Communicator* comm,
                           const std::string& why) {
  using internal::Negotiation;
  const size_t n = static_cast<size_t>(comm->size());
  // The header (negotiation.h): how many keys; whether this rank is stuck; which communicator
  // this is (ranks whose heads were collectives of different communicators over one transport
  // met in one exchange: that cannot be negotiated); how long this rank has negotiated, in ms.
  constexpr size_t kHeader = Negotiation::kHeader;
  constexpr size_t kWords = Negotiation::kWords;
  const auto started = std::chrono::steady_clock::now();
  const std::chrono::seconds warning(env::kStallWarningSeconds.Get());
  const int64_t timeout_ms = env::kTimeoutSeconds.Get() * 1000;
  const uint64_t tag = Negotiation::Tag(comm->set_name(), n);
  bool warned = false;
  int stuck_rounds = 0;
  uint64_t seen = enqueued_;
  std::vector<uint64_t> mine(kWords);
  std::vector<uint64_t> common;
  while (true) {
    std::fill(mine.begin(), mine.end(), 0);
    size_t count = 0;
    for (const Entry& e : queue_) {
      if (e.comm == nullptr) break;  // not a collective: nothing is moved past it
      if (e.comm == comm && e.key != 0 && count < Negotiation::kMostKeys) {
        mine[kHeader + count++] = e.key;
      }
    }
    mine[0] = count;
    mine[1] = waiters_ > 0 && enqueued_ == seen ? 1 : 0;
    mine[2] = tag;
    mine[3] = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - started)
                                        .count());
    seen = enqueued_;
    lock.unlock();
    std::vector<uint64_t> all;
    std::exception_ptr error;
    try {
      all = comm->ExchangeKeys(mine);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    // The head is the collective of comm that met the OrderError: on a failure of the
    // communicator, or when nothing can resolve the order, it is the one that fails.
    auto fail_head = [&](std::exception_ptr e) {
      agreed_ = 0;
      Finish(queue_.front().handle, std::move(e));
      Pop();
      finished_.notify_all();
    };
    if (error) return fail_head(error);
    switch (Negotiation::Decide(all, n, tag, timeout_ms, &stuck_rounds, &common)) {
      case Negotiation::Outcome::kOtherSets:
        return fail_head(std::make_exception_ptr(MismatchError(
            why + " (the ranks' next collectives belong to different process sets)")));
      case Negotiation::Outcome::kStuck:
        // Every rank waits for collectives no other rank has called, and none called anything
        // new: nothing can resolve it. Each rank's head fails alike.
        return fail_head(std::make_exception_ptr(MismatchError(why)));
      case Negotiation::Outcome::kTimedOut:
        return fail_head(std::make_exception_ptr(MismatchError(::trainrun::internal::MakeMessage(
            why, " (no rank submitted a collective every rank has for ", timeout_ms / 1000,
            " s, TRAINRUN_TIMEOUT)"))));
      case Negotiation::Outcome::kAgreed: {
        // Move them to the front in that order; the rest keep their order behind.
        std::unordered_map<uint64_t, size_t> place;
        for (size_t i = 0; i < common.size(); ++i) place.emplace(common[i], i);
        std::vector<Entry> front(common.size());
        std::deque<Entry> rest;
        bool fence = false;
        for (Entry& e : queue_) {
          fence |= e.comm == nullptr;
          auto it = fence || e.comm != comm ? place.end() : place.find(e.key);
          if (it != place.end()) {
            front[it->second] = std::move(e);
          } else {
            rest.push_back(std::move(e));
          }
        }
        queue_.clear();
        for (Entry& e : front) queue_.push_back(std::move(e));
        for (Entry& e : rest) queue_.push_back(std::move(e));
        agreed_ = common.size();
        return;
      }
      case Negotiation::Outcome::kAgain:
        break;
    }
    const auto waited = std::chrono::steady_clock::now() - started;
    if (!warned && warning.count() > 0 && waited >= warning) {
      warned = true;
      StallWarning(comm, all, kWords, warning);
    }
    // Wait a little for something new before the next round (every rank goes round alike).
    const uint64_t before = enqueued_;
    queued_.wait_for(lock, kRoundWait, [&] { return enqueued_ != before; });
  }
}

void CommThread::StallWarning(Communicator* comm, const std::vector<uint64_t>& all, size_t words,
                              std::chrono::seconds waited) {
  const size_t n = static_cast<size_t>(comm->size());
  std::vector<std::unordered_set<uint64_t>> has(n);
  for (size_t r = 0; r < n; ++r) {
    const uint64_t* w = all.data() + r * words;
    has[r].insert(w + internal::Negotiation::kHeader, w + internal::Negotiation::kHeader + w[0]);
  }
  std::string list;
  for (const Entry& e : queue_) {
    if (e.comm != comm || e.key == 0) continue;
    std::string missing;
    int lacking = 0;
    for (size_t r = 0; r < n; ++r) {
      // A rank in join() calls nothing more: it is not waited for.
      if (all[r * words + 1] != internal::Negotiation::kJoined && has[r].count(e.key) == 0) {
        missing += ::trainrun::internal::MakeMessage(lacking++ ? ", " : "", r);
      }
    }
    if (lacking == 0) continue;
    list += ::trainrun::internal::MakeMessage(
        list.empty() ? "" : "; ",
        e.name.empty()
            ? ::trainrun::internal::MakeMessage("an unnamed collective (#", e.key >> 1, ")")
            : "'" + e.name + "'",
        " (missing on rank", lacking > 1 ? "s " : " ", missing, ")");
  }
  internal::LogWarning(::trainrun::internal::MakeMessage(
      "rank ", comm->rank(), ": collectives submitted by this rank have waited more than ",
      waited.count(), " s for other ranks to submit them (Horovod's stall check): ", list));
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

std::string CommThread::RunFused(std::unique_lock<std::mutex>& lock) {
  const Allreduce& head = *queue_.front().allreduce;
  Communicator* comm = head.comm;
  std::vector<Communicator::ReadyAllreduce> ready;
  const size_t element = collectives::ElementSize(head.type);
  size_t bytes = 0;
  // After a negotiation, no further than what every rank agreed on (then every rank has as many).
  const size_t most = agreed_ > 0 ? agreed_ : queue_.size();
  for (const Entry& entry : queue_) {
    if (!entry.allreduce || ready.size() == most) break;
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
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const OrderError& e) {
      return e.what();  // nothing ran; the head stays pending
    } catch (...) {
    }
  }
  for (size_t i = 0; i < k; ++i) {
    Finish(queue_.front().handle, error);
    Pop();
  }
  return "";
}

}  // namespace trainrun::collectives
