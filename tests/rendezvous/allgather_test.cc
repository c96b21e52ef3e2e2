// Store::Allgather through the server (one call per rank, one table built for all of them), its
// default over MemoryStore, and the table's encoding.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rank_threads.h"
#include "test_job.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/memory_store.h"
#include "trainrun/rendezvous/server.h"
#include "wire.h"

namespace trainrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using ::trainrun::testing::RequireNoFailures;
using ::trainrun::testing::RunRanks;
using ::trainrun::testing::ThreadFailures;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// n ranks, 8 to a host, as the slot plan lays them out.
std::vector<RankSlot> Plan(int n) {
  std::vector<RankSlot> ranks;
  const int hosts = (n + 7) / 8;
  for (int r = 0; r < n; ++r) {
    ranks.push_back({absl::StrCat("node", r / 8), r % 8, std::min(8, n - r / 8 * 8), r / 8, hosts});
  }
  return ranks;
}

using testing::Job;

Job StartJob(int n, ServerLimits limits = {}) { return testing::StartJob(Plan(n), limits); }

// What rank r contributes: addresses of one host share most bytes, some values are empty or
// binary, so the front coding meets every case.
std::string ValueOf(int r) {
  if (r % 5 == 4) return "";
  if (r % 7 == 6) return std::string("\0\xff\x80", 3) + std::to_string(r);
  return absl::StrCat("10.0.", r / 8, ".", r % 8, ":", 40000 + r);
}

// Runs `n` joined ranks as threads, each gathering ValueOf(rank) under `name`; returns their
// tables.
std::vector<std::vector<std::string>> GatherAll(const Job& job, int n, const std::string& name) {
  std::vector<std::vector<std::string>> got(n);
  ThreadFailures failures([&] { job.server->Shutdown(); });
  RunRanks(n, failures, [&](int r) {
    absl::StatusOr<WorkerSession> s = job.TryJoinAs(r);
    if (!failures.ExpectOk(s.status(), absl::StrCat("rank ", r, " joins"))) return;
    auto table = s->store->Allgather(name, r, n, ValueOf(r), seconds(20));
    if (!failures.ExpectOk(table.status(), absl::StrCat("rank ", r, "'s allgather"))) return;
    got[r] = *std::move(table);
  });
  RequireNoFailures(failures);
  return got;
}

TEST_CASE("Allgather gives every rank every value in rank order", "[rendezvous][allgather]") {
  for (int n : {1, 3, 64}) {
    INFO("n = " << n);
    Job job = StartJob(n);
    const std::vector<std::vector<std::string>> got = GatherAll(job, n, "collectives/world/addr");
    std::vector<std::string> expected;
    for (int r = 0; r < n; ++r) expected.push_back(ValueOf(r));
    for (int r = 0; r < n; ++r) CHECK(got[r] == expected);
    // Each contribution is also a key of its own, as the default Allgather leaves it.
    CHECK(job.server->ValuesWithPrefix("collectives/world/addr/").size() == static_cast<size_t>(n));
    MemoryStore memory;
    std::vector<std::vector<std::string>> by_default(n);
    ThreadFailures failures;
    RunRanks(n, failures, [&](int r) {
      auto table = memory.Allgather("collectives/world/addr", r, n, ValueOf(r), seconds(20));
      if (!failures.ExpectOk(table.status(), absl::StrCat("rank ", r, "'s allgather"))) return;
      by_default[r] = *std::move(table);
    });
    RequireNoFailures(failures);
    CHECK(by_default == got);
    CHECK(job.server->WaitingCalls() == 0);
  }
}

TEST_CASE("Each elastic generation's gather gets a table of its own", "[rendezvous][allgather]") {
  Job job = StartJob(4);
  std::vector<WorkerSession> sessions;
  for (int r = 0; r < 4; ++r) sessions.push_back(job.JoinAs(r));
  // Generation 0: all four; generation 1 (after slot 2 was lost): slots 0, 1, 3 as ranks 0, 1, 2,
  // with new addresses. The communicator's name carries the generation ("world.g1").
  std::vector<std::vector<std::string>> first(4), second(3);
  ThreadFailures failures([&] { job.server->Shutdown(); });
  RunRanks(4, failures, [&](int r) {
    auto table = sessions[r].store->Allgather("collectives/world/addr", r, 4,
                                              absl::StrCat("g0-rank", r), seconds(10));
    if (!failures.ExpectOk(table.status(), absl::StrCat("rank ", r, "'s gather"))) return;
    first[r] = *table;
  });
  RequireNoFailures(failures);
  const int slots[3] = {0, 1, 3};
  RunRanks(3, failures, [&](int r) {
    auto table = sessions[slots[r]].store->Allgather(
        "collectives/world.g1/addr", r, 3, absl::StrCat("g1-slot", slots[r]), seconds(10));
    if (!failures.ExpectOk(table.status(), absl::StrCat("rank ", r, "'s gather"))) return;
    second[r] = *table;
  });
  RequireNoFailures(failures);
  for (const auto& table : first) {
    CHECK(table == std::vector<std::string>{"g0-rank0", "g0-rank1", "g0-rank2", "g0-rank3"});
  }
  for (const auto& table : second) {
    CHECK(table == std::vector<std::string>{"g1-slot0", "g1-slot1", "g1-slot3"});
  }
  // A late call (a retry) gets the table already built, unchanged by what it brings now.
  auto again = sessions[1].store->Allgather("collectives/world/addr", 1, 4, "other", seconds(1));
  REQUIRE(again.ok());
  CHECK(*again == first[1]);
  // A gather's callers must agree on its size.
  auto mismatch = sessions[0].store->Allgather("collectives/world.g1/addr", 0, 4, "x", seconds(1));
  CHECK(mismatch.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(mismatch.status(), "entered with count 3 and now with count 4"));
}

TEST_CASE("An early rank waits for the last contribution, or times out naming the absent ranks",
          "[rendezvous][allgather]") {
  Job job = StartJob(4);
  WorkerSession r0 = job.JoinAs(0);
  WorkerSession r1 = job.JoinAs(1);
  job.server->NoteRankExit(3, "exited with code 1");
  const auto start = Clock::now();
  auto alone = r0.store->Allgather("addr", 0, 4, "a0", milliseconds(400));
  const auto elapsed = Clock::now() - start;
  REQUIRE(alone.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(elapsed >= milliseconds(400));
  CHECK(elapsed < milliseconds(1500));
  INFO(alone.status().message());
  CHECK(Contains(alone.status(), "timed out after 400 ms in allgather 'addr': 1 of 4 contributed"));
  CHECK(Contains(alone.status(), "waiting for ranks 1, 2, 3"));
  CHECK(Contains(alone.status(), "ranks 2, 3 have not joined"));
  CHECK(Contains(alone.status(), "rank 3 exited with code 1"));
  CHECK(job.server->WaitingCalls() == 0);

  // Two ranks of a gather of two: the first waits until the second arrives, and not after.
  std::atomic<bool> released{false};
  Clock::time_point released_at;
  ThreadFailures failures([&] { job.server->Shutdown(); });
  std::thread waiter([&] {
    auto table = r0.store->Allgather("pair", 0, 2, "first", seconds(20));
    released_at = Clock::now();
    released = true;
    if (!failures.ExpectOk(table.status(), "the first rank's gather")) return;
    failures.Expect(*table == std::vector<std::string>{"first", "second"},
                    "the first rank gets both values in rank order");
  });
  std::this_thread::sleep_for(milliseconds(300));
  CHECK_FALSE(released.load());
  CHECK(job.server->WaitingCalls() == 1);
  const Clock::time_point last_at = Clock::now();
  auto table = r1.store->Allgather("pair", 1, 2, "second", seconds(20));
  waiter.join();
  RequireNoFailures(failures);
  REQUIRE(table.ok());
  CHECK(*table == std::vector<std::string>{"first", "second"});
  CHECK(released_at >= last_at);
  CHECK(released_at - last_at < milliseconds(200));
}

TEST_CASE("Allgather calls past the limits are refused naming the limit",
          "[rendezvous][allgather]") {
  ServerLimits limits;
  limits.max_value_bytes = 1000;
  limits.max_keys_per_get = 16;
  limits.max_response_bytes = 2500;
  limits.max_waiters = 2;
  Job job = StartJob(4, limits);
  WorkerSession s = job.JoinAs(0);
  auto status = s.store->Allgather("g", 4, 4, "v", seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "rank 4 of 4"));
  status = s.store->Allgather("g", -1, 4, "v", seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  status = s.store->Allgather("g", 0, 17, "v", seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "count must be 1 to 16"));
  status = s.store->Allgather("g", 0, 2, std::string(1001, 'v'), seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "limit of 1000 bytes"));
  status = s.store->Allgather(std::string(1023, 'n'), 0, 10, "v", seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "limit of 1024 bytes"));
  status = s.store->Allgather("", 0, 1, "v", seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);

  // Three values of 1000 bytes make a table past 2500 bytes: every caller hears so, now and later.
  std::vector<absl::Status> results(3);
  ThreadFailures failures;
  RunRanks(3, failures, [&](int r) {
    absl::StatusOr<WorkerSession> mine = job.TryJoinAs(r + 1);
    if (!failures.ExpectOk(mine.status(), absl::StrCat("rank ", r + 1, " joins"))) return;
    results[r] =
        mine->store->Allgather("big", r, 3, std::string(1000, 'a' + r), seconds(10)).status();
  });
  RequireNoFailures(failures);
  for (const absl::Status& result : results) {
    CHECK(result.code() == absl::StatusCode::kResourceExhausted);
    CHECK(Contains(result, "over the limit of 2500 bytes"));
  }
  CHECK(s.store->Allgather("big", 0, 3, "x", seconds(1)).status().code() ==
        absl::StatusCode::kResourceExhausted);

  // Waiting gathers count against the waiting calls' limit.
  std::vector<std::thread> waiting;
  ThreadFailures timeouts;
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back([&, i] {
      timeouts.Expect(
          s.store->Allgather(absl::StrCat("w", i), 0, 2, "v", milliseconds(500)).status().code() ==
              absl::StatusCode::kDeadlineExceeded,
          absl::StrCat("waiting gather w", i, " times out"));
    });
  }
  const auto until = Clock::now() + seconds(5);
  while (job.server->WaitingCalls() < 2 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  status = s.store->Allgather("w-third", 0, 2, "v", milliseconds(500)).status();
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  for (auto& t : waiting) t.join();
  RequireNoFailures(timeouts);

  // A caller without the job's token is refused.
  ClientOptions stranger;
  stranger.address = job.server->address();
  stranger.job_id = job.options.job_id;
  stranger.token = "not-the-token";
  auto store = ConnectStore(stranger);
  REQUIRE(store.ok());
  CHECK((*store)->Allgather("g", 0, 1, "v", seconds(1)).status().code() ==
        absl::StatusCode::kUnauthenticated);
  CHECK(job.server->ValuesWithPrefix("g/").empty());
}

TEST_CASE("MemoryStore's Allgather checks the rank and times out like Get", "[memory_store]") {
  MemoryStore store;
  CHECK(store.Allgather("g", 2, 2, "v", seconds(1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto alone = store.Allgather("g", 0, 2, "v", milliseconds(50));
  CHECK(alone.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(alone.status(), "g/1"));
}

TEST_CASE("The gather table is compact and its decoder refuses malformed input",
          "[rendezvous][allgather]") {
  std::vector<std::string> addresses;
  for (int r = 0; r < 8192; ++r)
    addresses.push_back(absl::StrCat("10.0.", r / 8, ".1:", 41000 + r));
  std::vector<const std::string*> pointers;
  for (const std::string& a : addresses) pointers.push_back(&a);
  const std::string table = internal::EncodeTable(pointers);
  // 8192 addresses of ~15 bytes: ~120 KiB as they are, far less as a table.
  CHECK(table.size() < 64 * 1024);
  auto decoded = internal::DecodeTable(table, addresses.size());
  REQUIRE(decoded.ok());
  CHECK(*decoded == addresses);
  CHECK_FALSE(internal::DecodeTable(table, addresses.size() - 1).ok());
  // Without an expected count (the join answer's host names), the table's own count is read.
  auto uncounted = internal::DecodeTable(table);
  REQUIRE(uncounted.ok());
  CHECK(*uncounted == addresses);
  CHECK_FALSE(internal::DecodeTable(table + "x").ok());
  CHECK_FALSE(internal::DecodeTable("").ok());
  CHECK_FALSE(internal::DecodeTable(std::string("\xff\xff\x03", 3)).ok());  // 65535 in 0 bytes
  CHECK_FALSE(internal::DecodeTable(table + "x", addresses.size()).ok());
  // Every truncation, and random damage, fails cleanly or decodes to something of the right count.
  for (size_t cut = 0; cut < 200; ++cut) {
    CHECK_FALSE(internal::DecodeTable(table.substr(0, cut), addresses.size()).ok());
    CHECK_FALSE(internal::DecodeTable(table.substr(0, cut)).ok());
  }
  std::vector<const std::string*> four(pointers.begin(), pointers.begin() + 4);
  const std::string small = internal::EncodeTable(four);
  std::mt19937 random(7);
  for (int i = 0; i < 2000; ++i) {
    std::string damaged = small;
    damaged[random() % damaged.size()] = static_cast<char>(random());
    auto result = internal::DecodeTable(damaged, 4);
    if (result.ok()) CHECK(result->size() == 4);
  }
  CHECK(internal::DecodeTable(std::string("\x01\x05\x01x", 4), 1).status().code() ==
        absl::StatusCode::kInternal);  // shares 5 bytes with a value that does not exist
}

TEST_CASE("DecodeGatherTable gives the values DecodeTable does, short and long, in one buffer",
          "[rendezvous][allgather]") {
  // Short values (the 16-byte path), long ones (hostnames, IPv6), empty ones, and switches
  // between them, with prefixes shared across the 16-byte boundary.
  std::vector<std::string> values;
  std::mt19937 random(11);
  for (int r = 0; r < 4000; ++r) {
    switch (random() % 6) {
      case 0:
        values.push_back("");
        break;
      case 1:
        values.push_back(absl::StrCat("[fd00::1:", r, "]:", 40000 + r));
        break;
      case 2:
        values.push_back(absl::StrCat("node-", r / 16, ".cluster.example.org:", 41000 + r));
        break;
      case 3:
        values.push_back(std::string(16, 'a') + std::to_string(r % 3));
        break;
      default:
        values.push_back(absl::StrCat("10.0.", r / 8, ".1:", 41000 + r));
    }
  }
  std::vector<const std::string*> pointers;
  for (const std::string& v : values) pointers.push_back(&v);
  const std::string table = internal::EncodeTable(pointers);
  auto gathered = internal::DecodeGatherTable(table, values.size());
  REQUIRE(gathered.ok());
  REQUIRE(gathered->size() == values.size());
  for (size_t i = 0; i < values.size(); ++i) CHECK((*gathered)[i] == values[i]);
  CHECK(gathered->ToStrings() == values);
  CHECK_FALSE(internal::DecodeGatherTable(table, values.size() - 1).ok());
  CHECK_FALSE(internal::DecodeGatherTable(table + "x", values.size()).ok());
  for (size_t cut = 0; cut < 200; ++cut) {
    CHECK_FALSE(internal::DecodeGatherTable(table.substr(0, cut), values.size()).ok());
  }
  CHECK(internal::DecodeGatherTable(std::string("\x01\x05\x01x", 4), 1).status().code() ==
        absl::StatusCode::kInternal);
  // Values far longer than their coding (each shares 499 bytes with the one before): the
  // decoder's buffer, sized for addresses, grows.
  std::vector<std::string> long_values;
  for (int r = 0; r < 1000; ++r) long_values.push_back(std::string(499, 'p') + char('a' + r % 26));
  std::vector<const std::string*> long_pointers;
  for (const std::string& v : long_values) long_pointers.push_back(&v);
  const std::string long_table = internal::EncodeTable(long_pointers);
  CHECK(long_table.size() < 8 * 1024);
  auto long_gathered = internal::DecodeGatherTable(long_table, long_values.size());
  REQUIRE(long_gathered.ok());
  CHECK(long_gathered->ToStrings() == long_values);
  // A one-value table ending right after its value (no 16 bytes of table left to read).
  auto one = internal::DecodeGatherTable(std::string("\x01\x00\x03"
                                                     "abc",
                                                     6),
                                         1);
  REQUIRE(one.ok());
  CHECK((*one)[0] == "abc");
}

TEST_CASE("A store's AllgatherTable answers what its Allgather does", "[memory_store]") {
  MemoryStore store;
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<GatherTable>> tables(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      tables[r] = store.AllgatherTable("t", r, 3, r == 1 ? "" : absl::StrCat("v", r), seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& table : tables) {
    REQUIRE(table.ok());
    CHECK(table->ToStrings() == std::vector<std::string>{"v0", "", "v2"});
  }
  const GatherTable packed = GatherTable::FromValues({"a", "", "bc"});
  CHECK(packed.size() == 3);
  CHECK(packed[0] == "a");
  CHECK(packed[1].empty());
  CHECK(packed[2] == "bc");
}

}  // namespace
}  // namespace trainrun::rendezvous
