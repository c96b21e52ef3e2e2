#include "trainrun/rendezvous/memory_store.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rank_threads.h"
#include "trainrun/rendezvous/client.h"

namespace trainrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using ::trainrun::testing::RequireNoFailures;
using ::trainrun::testing::RunRanks;
using ::trainrun::testing::ThreadFailures;

TEST_CASE("MemoryStore get waits for every key", "[memory_store]") {
  MemoryStore store;
  std::atomic<bool> done{false};
  ThreadFailures failures;
  std::thread getter([&] {
    auto values = store.Get({"a", "b"}, std::chrono::seconds(10));
    if (!failures.ExpectOk(values.status(), "the waiting Get")) return;
    failures.Expect(*values == std::vector<std::string>{"1", "2"}, "the Get's values in order");
    done = true;
  });
  REQUIRE(store.Set("a", "1").ok());
  std::this_thread::sleep_for(milliseconds(50));
  CHECK_FALSE(done.load());
  REQUIRE(store.Set("b", "2").ok());
  getter.join();
  RequireNoFailures(failures);
  CHECK(done.load());
}

TEST_CASE("MemoryStore get times out naming the missing keys", "[memory_store]") {
  MemoryStore store;
  REQUIRE(store.Set("present", "x").ok());
  auto values = store.Get({"present", "absent"}, milliseconds(20));
  REQUIRE(values.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(values.status().message()).find("absent") != std::string::npos);
  CHECK(std::string(values.status().message()).find("present") == std::string::npos);
}

TEST_CASE("MemoryStore add and barrier", "[memory_store]") {
  MemoryStore store;
  constexpr int kRanks = 8;
  std::atomic<int> passed{0};
  ThreadFailures failures;
  RunRanks(kRanks, failures, [&](int r) {
    if (!failures.ExpectOk(store.Add("counter", 2).status(), absl::StrCat("rank ", r, "'s Add"))) {
      return;
    }
    if (!failures.ExpectOk(store.Barrier("all", kRanks, std::chrono::seconds(10)),
                           absl::StrCat("rank ", r, "'s barrier"))) {
      return;
    }
    ++passed;
  });
  RequireNoFailures(failures);
  CHECK(passed == kRanks);
  auto sum = store.Add("counter", 0);
  REQUIRE(sum.ok());
  CHECK(*sum == 2 * kRanks);
  CHECK(store.Barrier("short", 2, milliseconds(10)).code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("ShareFromRoot over MemoryStore gives every rank the root's blob", "[memory_store]") {
  MemoryStore store;
  constexpr int kRanks = 5;
  std::vector<std::string> got(kRanks);
  std::atomic<int> made{0};
  ThreadFailures failures;
  RunRanks(kRanks, failures, [&](int r) {
    auto blob = ShareFromRoot(
        store, "nccl/world", r, /*root=*/2,
        [&] {
          ++made;
          return std::string("unique-id-\0bytes", 16);
        },
        std::chrono::seconds(10));
    if (!failures.ExpectOk(blob.status(), absl::StrCat("rank ", r, "'s ShareFromRoot"))) return;
    got[r] = *blob;
  });
  RequireNoFailures(failures);
  CHECK(made == 1);
  for (const auto& blob : got) CHECK(blob == std::string("unique-id-\0bytes", 16));
}

}  // namespace
}  // namespace trainrun::rendezvous
