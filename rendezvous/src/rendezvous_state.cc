#include "rendezvous_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

constexpr char kShuttingDown[] = "the rendezvous server is shutting down (the job is ending)";
constexpr char kStorageFull[] = "the rendezvous's storage limit is reached";

void Remove(std::vector<WaitId>& list, WaitId id) {
  auto it = std::find(list.begin(), list.end(), id);
  if (it != list.end()) {
    *it = list.back();
    list.pop_back();
  }
}

}  // namespace

RendezvousState::RendezvousState(const ServerLimits& limits, const Membership& membership,
                                 std::function<std::string(std::string table)> wrap_answer)
    : limits_(limits), membership_(membership), wrap_answer_(std::move(wrap_answer)) {}

RendezvousState::~RendezvousState() { Shutdown(); }

// --- Checks ------------------------------------------------------------------------------------

absl::Status RendezvousState::CheckKey(const std::string& key, const char* what) const {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("a ", what, " is empty"));
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", what, " of ", key.size(),
                                                   " bytes is over the limit of ",
                                                   limits_.max_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::CheckValue(const std::string& key, size_t value_bytes) const {
  if (value_bytes <= limits_.max_value_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the value of key '", key, "' has ", value_bytes,
                                                 " bytes, over the limit of ",
                                                 limits_.max_value_bytes, " bytes"));
}

absl::Status RendezvousState::CheckTimeout(int64_t timeout_ms) const {
  if (timeout_ms < 0 || timeout_ms > limits_.max_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a timeout of ", timeout_ms, " ms is outside 0 to ", limits_.max_timeout_ms, " ms"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::CheckContribution(const std::string& name, int rank, int count,
                                                size_t value_bytes, int64_t timeout_ms) const {
  if (absl::Status status = CheckKey(name, "gather name"); !status.ok()) return status;
  if (count <= 0 || static_cast<size_t>(count) > limits_.max_keys_per_get || rank < 0 ||
      rank >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("allgather '", name, "' was entered as rank ", rank, " of ", count,
                     " contributors; the count must be 1 to ", limits_.max_keys_per_get));
  }
  // Each contribution is a key of its own; the longest one must fit the key limit.
  if (absl::Status status =
          CheckKey(absl::StrCat(name, "/", count - 1), "gather name with its rank");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckValue(absl::StrCat(name, "/", rank), value_bytes); !status.ok()) {
    return status;
  }
  return CheckTimeout(timeout_ms);
}

absl::Status RendezvousState::CanWait() const {
  if (stopping_) return absl::UnavailableError(kShuttingDown);
  if (waiters_.size() >= limits_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "over ", limits_.max_waiters, " calls are waiting at once; is a worker looping?"));
  }
  return absl::OkStatus();
}

// --- Keys and counters -------------------------------------------------------------------------

absl::Status RendezvousState::Set(const std::string& key, const std::string& value) {
  std::vector<Completion> completions;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status = StoreLocked(key, value, completions);
  }
  RunAll(completions);
  return status;
}

absl::Status RendezvousState::StoreLocked(const std::string& key, const std::string& value,
                                          std::vector<Completion>& completions) {
  auto existing = values_.find(key);
  const size_t old_bytes =
      existing == values_.end() ? 0 : existing->first.size() + existing->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (stored_bytes_ - old_bytes + new_bytes > limits_.max_stored_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous holds ", stored_bytes_, " bytes; storing key '", key,
                     "' would pass its limit of ", limits_.max_stored_bytes, " bytes"));
  }
  stored_bytes_ = stored_bytes_ - old_bytes + new_bytes;
  values_[key] = value;
  auto waiting = key_waiters_.find(key);
  if (waiting == key_waiters_.end()) return absl::OkStatus();
  std::vector<WaitId> ids = std::move(waiting->second);
  key_waiters_.erase(waiting);
  for (WaitId id : ids) {
    GetWait& get = std::get<GetWait>(waiters_.at(id).what);
    if (--get.missing > 0) continue;
    absl::StatusOr<Values> values = ValuesOf(get.keys);
    std::optional<Waiter> waiter = Claim(id);
    Outcome outcome;
    if (values.ok()) {
      outcome.values = *std::move(values);
    } else {
      outcome.status = values.status();
    }
    completions.push_back({std::move(waiter->reply), std::move(outcome)});
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RendezvousState::Add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto counter = counters_.find(key);
  if (counter == counters_.end()) {
    if (stored_bytes_ + key.size() + 8 > limits_.max_stored_bytes) {
      return absl::ResourceExhaustedError(kStorageFull);
    }
    stored_bytes_ += key.size() + 8;
    counter = counters_.emplace(key, 0).first;
  }
  counter->second += delta;
  return counter->second;
}

void RendezvousState::SetCounter(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [counter, added] = counters_.emplace(key, 0);
  if (added) stored_bytes_ += key.size() + 8;
  counter->second = value;
}

absl::StatusOr<Values> RendezvousState::ValuesOf(const std::vector<std::string>& keys) const {
  size_t bytes = 0;
  for (const std::string& key : keys) bytes += values_.at(key).size();
  if (bytes > limits_.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the values of these ", keys.size(), " keys total ", bytes, " bytes, over the limit of ",
        limits_.max_response_bytes, " bytes for one Get; ask for fewer keys at a time"));
  }
  Values values;
  values.packed.reserve(bytes);
  values.ends.reserve(keys.size());
  for (const std::string& key : keys) {
    values.packed.append(values_.at(key));
    values.ends.push_back(static_cast<uint32_t>(values.packed.size()));
  }
  return values;
}

std::map<std::string, std::string> RendezvousState::ValuesWithPrefix(
    const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : values_) {
    if (key.compare(0, prefix.size(), prefix) == 0) out[key] = value;
  }
  return out;
}

// --- Waiting calls -----------------------------------------------------------------------------

WaitId RendezvousState::AddWaiter(std::variant<GetWait, BarrierWait, GatherWait> what,
                                  int64_t timeout_ms, Reply reply) {
  const WaitId id = next_id_++;
  const std::chrono::milliseconds timeout(timeout_ms);
  Waiter& waiter =
      waiters_
          .emplace(id, Waiter{std::move(what), timeout,
                              deadlines_.emplace(Clock::now() + timeout, id), std::move(reply)})
          .first->second;
  if (waiter.deadline == deadlines_.begin()) deadline_changed_.notify_one();
  return id;
}

std::optional<RendezvousState::Waiter> RendezvousState::Claim(WaitId id) {
  auto found = waiters_.find(id);
  if (found == waiters_.end()) return std::nullopt;
  Waiter waiter = std::move(found->second);
  waiters_.erase(found);
  deadlines_.erase(waiter.deadline);
  if (const auto* get = std::get_if<GetWait>(&waiter.what)) {
    // A Get whose keys all arrived is in no key list any more: each Set took its list away.
    for (size_t i = 0; get->missing > 0 && i < get->missing_keys.size(); ++i) {
      auto list = key_waiters_.find(get->missing_keys[i]);
      if (list == key_waiters_.end()) continue;
      Remove(list->second, id);
      if (list->second.empty()) key_waiters_.erase(list);
    }
  } else if (const auto* gather = std::get_if<GatherWait>(&waiter.what)) {
    auto state = gathers_.find(gather->name);
    if (state != gathers_.end()) Remove(state->second.waiters, id);
  } else {
    auto state = barriers_.find(std::get<BarrierWait>(waiter.what).name);
    if (state != barriers_.end()) Remove(state->second.waiters, id);
  }
  return waiter;
}

WaitId RendezvousState::Get(std::vector<std::string> keys, int64_t timeout_ms, Reply reply) {
  absl::Status refused;
  if (keys.size() > limits_.max_keys_per_get) {
    refused = absl::InvalidArgumentError(absl::StrCat("a Get of ", keys.size(),
                                                      " keys is over the limit of ",
                                                      limits_.max_keys_per_get, " keys per call"));
  }
  for (size_t i = 0; refused.ok() && i < keys.size(); ++i) refused = CheckKey(keys[i], "key");
  if (refused.ok()) refused = CheckTimeout(timeout_ms);
  if (!refused.ok()) {
    reply({refused, {}, nullptr});
    return 0;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (values_.count(key) == 0) missing.push_back(key);
  }
  if (missing.empty()) {
    absl::StatusOr<Values> values = ValuesOf(keys);
    lock.unlock();
    Outcome outcome;
    if (values.ok()) {
      outcome.values = *std::move(values);
    } else {
      outcome.status = values.status();
    }
    reply(std::move(outcome));
    return 0;
  }
  if (absl::Status status = CanWait(); !status.ok()) {
    lock.unlock();
    reply({status, {}, nullptr});
    return 0;
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  for (const std::string& key : missing) key_waiters_[key].push_back(next_id_);
  GetWait get;
  get.keys = std::move(keys);
  get.missing = missing.size();
  get.missing_keys = std::move(missing);
  return AddWaiter(std::move(get), timeout_ms, std::move(reply));
}

WaitId RendezvousState::Barrier(const std::string& name, int count, int64_t timeout_ms,
                                const std::vector<int>& ranks, Reply reply) {
  absl::Status refused = CheckKey(name, "barrier name");
  if (refused.ok()) refused = CheckTimeout(timeout_ms);
  if (refused.ok() && count <= 0) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "' needs a positive count, not ", count));
  }
  if (!refused.ok()) {
    reply({refused, {}, nullptr});
    return 0;
  }
  std::vector<Completion> completions;
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = barriers_.find(name);
  if (found == barriers_.end()) {
    if (stored_bytes_ + name.size() + 64 > limits_.max_stored_bytes) {
      lock.unlock();
      reply({absl::ResourceExhaustedError(kStorageFull), {}, nullptr});
      return 0;
    }
    stored_bytes_ += name.size() + 64;
    found = barriers_.emplace(name, BarrierState{}).first;
    found->second.count = count;
  }
  BarrierState& barrier = found->second;
  if (barrier.count != count) {
    const int entered = barrier.count;
    lock.unlock();
    reply({absl::InvalidArgumentError(absl::StrCat("barrier '", name, "' was entered with count ",
                                                   entered, " and now with count ", count,
                                                   "; all callers must agree")),
           {},
           nullptr});
    return 0;
  }
  for (int rank : ranks) {
    // A rank that enters again (a retried call) counts once.
    const bool counts = rank < 0 || barrier.ranks.insert(rank).second;
    if (counts) ++barrier.arrived;
  }
  if (barrier.arrived >= barrier.count) {
    std::vector<WaitId> ids = std::move(barrier.waiters);
    barrier.waiters.clear();
    for (WaitId id : ids) completions.push_back({std::move(Claim(id)->reply), {}});
    lock.unlock();
    RunAll(completions);
    reply({});
    return 0;
  }
  if (absl::Status status = CanWait(); !status.ok()) {
    lock.unlock();
    reply({status, {}, nullptr});
    return 0;
  }
  barrier.waiters.push_back(next_id_);
  return AddWaiter(BarrierWait{name}, timeout_ms, std::move(reply));
}

RendezvousState::GatherState* RendezvousState::FindGather(const std::string& name, int count,
                                                          absl::Status& status) {
  auto found = gathers_.find(name);
  if (found == gathers_.end()) {
    const size_t bytes = name.size() + 64 + static_cast<size_t>(count) / 8;
    if (stored_bytes_ + bytes > limits_.max_stored_bytes) {
      status = absl::ResourceExhaustedError(kStorageFull);
      return nullptr;
    }
    stored_bytes_ += bytes;
    found = gathers_.emplace(name, GatherState{}).first;
    found->second.count = count;
    found->second.contributed.resize(static_cast<size_t>(count));
  }
  GatherState& gather = found->second;
  if (gather.count != count) {
    status = absl::InvalidArgumentError(
        absl::StrCat("allgather '", name, "' was entered with count ", gather.count,
                     " and now with count ", count, "; all callers must agree"));
    return nullptr;
  }
  return &gather;
}

void RendezvousState::CompleteGather(const std::string& name, GatherState& gather,
                                     std::vector<Completion>& completions) {
  std::vector<const std::string*> values;
  values.reserve(static_cast<size_t>(gather.count));
  for (int r = 0; r < gather.count; ++r) values.push_back(&values_.at(absl::StrCat(name, "/", r)));
  std::string table = EncodeTable(values);
  if (table.size() > limits_.max_response_bytes) {
    gather.failed = absl::ResourceExhaustedError(
        absl::StrCat("allgather '", name, "' gathered ", table.size(), " bytes, over the limit of ",
                     limits_.max_response_bytes, " bytes for one answer; gather smaller values"));
  } else {
    stored_bytes_ += table.size();
    gather.answer = std::make_shared<const std::string>(
        wrap_answer_ ? wrap_answer_(std::move(table)) : std::move(table));
  }
  gather.contributed = {};
  std::vector<WaitId> ids = std::move(gather.waiters);
  gather.waiters.clear();
  for (WaitId id : ids) {
    completions.push_back({std::move(Claim(id)->reply), {gather.failed, {}, gather.answer}});
  }
}

WaitId RendezvousState::Allgather(const std::string& name, int count, int64_t timeout_ms,
                                  const std::vector<std::pair<int, const std::string*>>& members,
                                  Reply reply) {
  std::vector<Completion> completions;
  std::unique_lock<std::mutex> lock(mutex_);
  absl::Status status;
  GatherState* gather = FindGather(name, count, status);
  if (gather == nullptr) {
    lock.unlock();
    reply({status, {}, nullptr});
    return 0;
  }
  // A complete gather answers a late caller (a retry) with the answer it already built.
  for (const auto& [rank, value] : members) {
    if (gather->answer != nullptr || !gather->failed.ok() || !status.ok()) break;
    status = StoreLocked(absl::StrCat(name, "/", rank), *value, completions);
    if (status.ok() && !gather->contributed[static_cast<size_t>(rank)]) {
      gather->contributed[static_cast<size_t>(rank)] = true;
      if (++gather->arrived == gather->count) CompleteGather(name, *gather, completions);
    }
  }
  if (!status.ok() || gather->answer != nullptr || !gather->failed.ok()) {
    if (status.ok()) status = gather->failed;
    std::shared_ptr<const std::string> answer = status.ok() ? gather->answer : nullptr;
    lock.unlock();
    RunAll(completions);
    reply({status, {}, std::move(answer)});
    return 0;
  }
  if (status = CanWait(); !status.ok()) {
    lock.unlock();
    RunAll(completions);
    reply({status, {}, nullptr});
    return 0;
  }
  gather->waiters.push_back(next_id_);
  const WaitId id = AddWaiter(GatherWait{name}, timeout_ms, std::move(reply));
  lock.unlock();
  RunAll(completions);
  return id;
}

bool RendezvousState::Cancel(WaitId id) {
  std::optional<Waiter> waiter;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiter = Claim(id);
  }
  if (!waiter.has_value()) return false;
  waiter->reply({absl::CancelledError(), {}, nullptr});
  return true;
}

void RendezvousState::RunAll(std::vector<Completion>& completions) {
  for (Completion& completion : completions) completion.reply(std::move(completion.outcome));
  completions.clear();
}

size_t RendezvousState::WaitingCalls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiters_.size();
}

// --- Deadlines and shutdown --------------------------------------------------------------------

std::string RendezvousState::DescribeTimeout(const Waiter& waiter) const {
  const std::string after = absl::StrCat("timed out after ", FormatDuration(waiter.timeout));
  return std::visit([&](const auto& what) { return DescribeWait(after, what); }, waiter.what);
}

std::string RendezvousState::DescribeWait(const std::string& after, const GetWait& get) const {
  std::vector<int> all_ranks(static_cast<size_t>(membership_.size()));
  for (size_t r = 0; r < all_ranks.size(); ++r) all_ranks[r] = static_cast<int>(r);
  std::vector<std::string> missing;
  for (const std::string& key : get.missing_keys) {
    if (values_.count(key) == 0) missing.push_back(absl::StrCat("'", key, "'"));
  }
  return absl::StrCat(after, " waiting for ", missing.size() == 1 ? "key " : "keys ",
                      NameSome(missing), membership_.DescribeAbsent(all_ranks));
}

std::string RendezvousState::DescribeWait(const std::string& after, const GatherWait& wait) const {
  const int size = membership_.size();
  const GatherState& gather = gathers_.at(wait.name);
  std::string out = absl::StrCat(after, " in allgather '", wait.name, "': ", gather.arrived, " of ",
                                 gather.count, " contributed");
  std::vector<int> absent;
  for (int r = 0; r < gather.count; ++r) {
    if (!gather.contributed[static_cast<size_t>(r)]) absent.push_back(r);
  }
  if (gather.count == size) {
    // A gather of the whole job: its ranks are the job's ranks.
    absl::StrAppend(&out, ", waiting for ", NameRanks(absent), membership_.DescribeAbsent(absent));
    return out;
  }
  std::vector<int> all_ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all_ranks[static_cast<size_t>(r)] = r;
  absl::StrAppend(&out, membership_.DescribeAbsent(all_ranks));
  return out;
}

std::string RendezvousState::DescribeWait(const std::string& after, const BarrierWait& wait) const {
  const int size = membership_.size();
  std::vector<int> all_ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all_ranks[static_cast<size_t>(r)] = r;
  const BarrierState& barrier = barriers_.at(wait.name);
  std::string out = absl::StrCat(after, " in barrier '", wait.name, "': ", barrier.arrived, " of ",
                                 barrier.count, " arrived");
  if (barrier.count == size && static_cast<int>(barrier.ranks.size()) == barrier.arrived) {
    // Every rank was expected and each said who it is: name the ones missing.
    std::vector<int> absent;
    for (int r : all_ranks) {
      if (barrier.ranks.count(r) == 0) absent.push_back(r);
    }
    absl::StrAppend(&out, ", waiting for ", NameRanks(absent), membership_.DescribeAbsent(absent));
  } else {
    absl::StrAppend(&out, membership_.DescribeAbsent(all_ranks));
  }
  return out;
}

void RendezvousState::ExpireDue(Clock::time_point now) {
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const WaitId id = deadlines_.begin()->second;
      std::string message = DescribeTimeout(waiters_.at(id));
      completions.push_back({std::move(Claim(id)->reply),
                             {absl::DeadlineExceededError(std::move(message)), {}, nullptr}});
    }
  }
  RunAll(completions);
}

void RendezvousState::RunDeadlines() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (deadlines_.empty()) {
      deadline_changed_.wait(lock);
      continue;
    }
    const Clock::time_point next = deadlines_.begin()->first;
    if (Clock::now() < next) {
      deadline_changed_.wait_until(lock, next);
      continue;
    }
    lock.unlock();
    ExpireDue(Clock::now());
    lock.lock();
  }
}

void RendezvousState::Shutdown() {
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    while (!deadlines_.empty()) {
      completions.push_back({std::move(Claim(deadlines_.begin()->second)->reply),
                             {absl::UnavailableError(kShuttingDown), {}, nullptr}});
    }
  }
  deadline_changed_.notify_all();
  RunAll(completions);
}

}  // namespace trainrun::rendezvous::internal
