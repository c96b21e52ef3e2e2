#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::rendezvous {
namespace {

using std::chrono::milliseconds;

TEST_CASE("MemoryStore get waits for every key", "[memory_store]") {
  MemoryStore store;
  std::atomic<bool> done{false};
  std::thread getter([&] {
    auto values = store.Get({"a", "b"}, std::chrono::seconds(10));
    REQUIRE(values.ok());
    CHECK(*values == std::vector<std::string>{"1", "2"});
    done = true;
  });
  REQUIRE(store.Set("a", "1").ok());
  std::this_thread::sleep_for(milliseconds(50));
  CHECK_FALSE(done.load());
  REQUIRE(store.Set("b", "2").ok());
  getter.join();
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
  std::vector<std::thread> ranks;
  std::atomic<int> passed{0};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&] {
      REQUIRE(store.Add("counter", 2).ok());
      REQUIRE(store.Barrier("all", kRanks, std::chrono::seconds(10)).ok());
      ++passed;
    });
  }
  for (auto& t : ranks) t.join();
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
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      auto blob = ShareFromRoot(
          store, "nccl/world", r, /*root=*/2,
          [&] {
            ++made;
            return std::string("unique-id-\0bytes", 16);
          },
          std::chrono::seconds(10));
      REQUIRE(blob.ok());
      got[r] = *blob;
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(made == 1);
  for (const auto& blob : got) CHECK(blob == std::string("unique-id-\0bytes", 16));
}

}  // namespace
}  // namespace trainrun::rendezvous
