// The NCCL unique-ID exchange over the in-memory Store, ranks as threads, with blobs that are not
// real NCCL IDs: no GPU needed.
#include "trainrun/collectives/nccl/unique_id_exchange.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/types.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::nccl {
namespace {

using std::chrono::milliseconds;

// RunRanks runs `body(rank)` on `size` threads and returns each rank's result.
template <typename Body>
std::vector<std::string> RunRanks(int size, Body body) {
  std::vector<std::future<std::string>> futures;
  for (int rank = 0; rank < size; ++rank) {
    futures.push_back(std::async(std::launch::async, body, rank));
  }
  std::vector<std::string> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

// FailingStore's waits fail as a broken rendezvous connection would.
class FailingStore : public rendezvous::MemoryStore {
 public:
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               milliseconds timeout) override {
    return absl::UnavailableError("connection to the rendezvous at 127.0.0.1:1 refused");
  }
};

TEST_CASE("every rank receives the root's blob, created once", "[nccl][unique_id]") {
  for (int size : {1, 2, 3, 5}) {
    for (int root : {0, size - 1}) {
      rendezvous::MemoryStore store;
      std::atomic<int> made{0};
      const std::string blob = "not-a-real-nccl-id:" + std::to_string(size);
      auto results = RunRanks(size, [&](int rank) {
        return ExchangeUniqueId(
            store, "world", rank, root,
            [&] {
              ++made;
              return blob;
            },
            milliseconds(5000));
      });
      CAPTURE(size, root);
      CHECK(made == 1);
      for (const auto& result : results) CHECK(result == blob);
    }
  }
}

TEST_CASE("ranks wait for a root that publishes late", "[nccl][unique_id]") {
  rendezvous::MemoryStore store;
  auto results = RunRanks(3, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(200));
    return ExchangeUniqueId(
        store, "late", rank, 0, [] { return std::string("\x01\x00\x02", 3); }, milliseconds(5000));
  });
  for (const auto& result : results) CHECK(result == std::string("\x01\x00\x02", 3));
}

TEST_CASE("a binary blob of NCCL's size travels unchanged", "[nccl][unique_id]") {
  rendezvous::MemoryStore store;
  std::string blob(128, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(255 - i);
  auto results = RunRanks(2, [&](int rank) {
    return ExchangeUniqueId(
        store, "bytes", rank, 0, [&] { return blob; }, milliseconds(5000));
  });
  CHECK(results[1] == blob);
}

TEST_CASE("a missing root times out, naming the root and the waiting rank", "[nccl][unique_id]") {
  rendezvous::MemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  try {
    ExchangeUniqueId(
        store, "world", 2, 0, [] { return std::string("never"); }, milliseconds(300));
    FAIL("ExchangeUniqueId returned without a root");
  } catch (const TimeoutError& error) {
    const std::string message = error.what();
    CHECK_THAT(message, Catch::Contains("rank 2 waited 300 ms"));
    CHECK_THAT(message, Catch::Contains("from rank 0, which never published it"));
    CHECK_THAT(message, Catch::Contains("communicator 'world'"));
    CHECK_THAT(message, Catch::Contains(UniqueIdKey("world")));  // the store's own account
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed >= milliseconds(300));
  CHECK(elapsed < milliseconds(3000));
}

TEST_CASE("communicators with different names do not share IDs", "[nccl][unique_id]") {
  rendezvous::MemoryStore store;
  CHECK(ExchangeUniqueId(
            store, "a", 0, 0, [] { return std::string("id-a"); }, milliseconds(100)) == "id-a");
  CHECK(ExchangeUniqueId(
            store, "b", 0, 0, [] { return std::string("id-b"); }, milliseconds(100)) == "id-b");
  CHECK(ExchangeUniqueId(
            store, "a", 1, 0, [] { return std::string(); }, milliseconds(100)) == "id-a");
  CHECK(ExchangeUniqueId(
            store, "b", 1, 0, [] { return std::string(); }, milliseconds(100)) == "id-b");
  CHECK_THROWS_AS(ExchangeUniqueId(
                      store, "c", 1, 0, [] { return std::string(); }, milliseconds(50)),
                  TimeoutError);
}

TEST_CASE("bad arguments and a failing store raise the right errors", "[nccl][unique_id]") {
  rendezvous::MemoryStore store;
  CHECK_THROWS_AS(ExchangeUniqueId(
                      store, "w", 0, 0, [] { return std::string(); }, milliseconds(100)),
                  InvalidArgumentError);
  CHECK_THROWS_AS(ExchangeUniqueId(
                      store, "w", -1, 0, [] { return std::string("x"); }, milliseconds(100)),
                  InvalidArgumentError);
  FailingStore failing;
  try {
    ExchangeUniqueId(
        failing, "w", 1, 0, [] { return std::string("x"); }, milliseconds(100));
    FAIL("a failing store went unnoticed");
  } catch (const IoError& error) {
    CHECK_THAT(std::string(error.what()), Catch::Contains("connection to the rendezvous"));
  }
}

TEST_CASE("local ranks map onto the visible devices", "[nccl][device]") {
  CHECK(DeviceForLocalRank(0, 1) == 0);
  CHECK(DeviceForLocalRank(3, 1) == 0);  // the launcher's one-GPU-per-rank CUDA_VISIBLE_DEVICES
  CHECK(DeviceForLocalRank(3, 2) == 1);
  CHECK(DeviceForLocalRank(5, 8) == 5);
  CHECK_THROWS_AS(DeviceForLocalRank(0, 0), InvalidArgumentError);
  CHECK_THROWS_AS(DeviceForLocalRank(-1, 4), InvalidArgumentError);
}

TEST_CASE("data types and ops have nccl-tests' names", "[nccl][types]") {
  for (DataType type : kAllDataTypes) {
    CHECK(ParseDataType(DataTypeName(type)) == type);
  }
  for (ReduceOp op : kAllReduceOps) CHECK(ParseReduceOp(ReduceOpName(op)) == op);
  CHECK(ParseDataType("float32") == DataType::kFloat32);
  CHECK(ParseDataType("float16") == DataType::kFloat16);
  CHECK_FALSE(ParseDataType("float8").has_value());
  CHECK(ElementSize(DataType::kBfloat16) == 2);
  CHECK(ElementSize(DataType::kInt64) == 8);
  CHECK(ElementSize(DataType::kUint8) == 1);
}

}  // namespace
}  // namespace trainrun::collectives::nccl
