#include "trainrun/rendezvous/memory_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainrun::rendezvous {

absl::Status MemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemoryStore::Get(const std::vector<std::string>& keys,
                                                          std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& key : keys) {
      if (values_.count(key) == 0) out.push_back(key);
    }
    return out;
  };
  if (!changed_.wait_for(lock, timeout, [&] { return missing().empty(); })) {
    return absl::DeadlineExceededError(absl::StrCat("timed out after ", timeout.count(),
                                                    " ms waiting for keys ",
                                                    absl::StrJoin(missing(), ", ")));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(values_[key]);
  return out;
}

absl::StatusOr<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t sum;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sum = counters_[key] += delta;
  }
  changed_.notify_all();
  return sum;
}

absl::Status MemoryStore::Barrier(const std::string& name, int count,
                                  std::chrono::milliseconds timeout) {
  const std::string key = "barrier/" + name;
  std::unique_lock<std::mutex> lock(mutex_);
  ++counters_[key];
  changed_.notify_all();
  if (!changed_.wait_for(lock, timeout, [&] { return counters_[key] >= count; })) {
    return absl::DeadlineExceededError(absl::StrCat("timed out after ", timeout.count(),
                                                    " ms in barrier '", name, "': ", counters_[key],
                                                    " of ", count, " arrived"));
  }
  return absl::OkStatus();
}

}  // namespace trainrun::rendezvous
