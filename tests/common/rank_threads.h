// Threads in tests (ranks, a waiter beside the main thread) never call Catch2's assertions, which
// are not thread-safe: they report what they found wrong to a ThreadFailures, whose first failure
// cancels their peers (`cancel`, e.g. a server's Shutdown, so that their waits end now rather than
// at their timeouts; cancelled() for loops), and the main thread asserts on what it collected
// (RequireNoFailures) after joining them. RunRanks runs ranks 0 .. size-1 so.
//
//   ThreadFailures failures([&] { job.server->Shutdown(); });
//   RunRanks(4, failures, [&](int rank) {
//     auto table = store.Allgather("x", rank, 4, "v", seconds(10));
//     if (!failures.ExpectOk(table.status(), "rank's allgather")) return;
//     failures.Expect(table->size() == 4, "four values");
//   });
//   RequireNoFailures(failures);
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainrun::testing {

class ThreadFailures {
 public:
  explicit ThreadFailures(std::function<void()> cancel = {}) : cancel_(std::move(cancel)) {}

  // Expect records `what` as a failure unless `ok`; returns `ok`.
  bool Expect(bool ok, const std::string& what) {
    if (!ok) Fail(what);
    return ok;
  }
  // ExpectOk records `what` and the status unless it is OK; returns whether it is.
  bool ExpectOk(const absl::Status& status, const std::string& what) {
    if (!status.ok()) Fail(absl::StrCat(what, ": ", status.ToString()));
    return status.ok();
  }
  // Fail records `what`; the first failure cancels the peers.
  void Fail(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failures_.push_back(what);
    }
    if (!cancelled_.exchange(true) && cancel_) cancel_();
  }
  bool cancelled() const { return cancelled_.load(); }
  // failures, once the threads have been joined.
  std::vector<std::string> failures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failures_;
  }

 private:
  std::function<void()> cancel_;
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;
  std::atomic<bool> cancelled_{false};
};

// RunRanks runs `body(rank)` for ranks 0 .. size-1 on threads of their own and joins them; an
// exception escaping `body` is a failure of that rank.
inline void RunRanks(int size, ThreadFailures& failures, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        failures.Fail(absl::StrCat("rank ", rank, " threw: ", e.what()));
      } catch (...) {
        failures.Fail(absl::StrCat("rank ", rank, " threw something not a std::exception"));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// RequireNoFailures, on the main thread after the threads were joined: each failure is one failed
// assertion that says it, and the test stops when there was any.
inline void RequireNoFailures(const ThreadFailures& failures) {
  const std::vector<std::string> all = failures.failures();
  for (const std::string& failure : all) FAIL_CHECK(failure);
  REQUIRE(all.empty());
}

}  // namespace trainrun::testing
