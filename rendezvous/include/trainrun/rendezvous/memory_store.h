// MemoryStore: a Store that lives in one process, for tests that run ranks as threads.
//
//   auto store = std::make_shared<trainrun::rendezvous::MemoryStore>();
//   std::thread t([&] { store->Set("k", "v"); });
//   auto v = store->Get({"k"}, std::chrono::seconds(1));
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous {

// MemoryStore is thread-safe; waits sleep on a condition variable.
class MemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Barrier(const std::string& name, int count,
                       std::chrono::milliseconds timeout) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int64_t> counters_;
};

}  // namespace trainrun::rendezvous
