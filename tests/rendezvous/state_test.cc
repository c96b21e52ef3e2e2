// The rendezvous's state and membership with no server and no gRPC: calls and their Replies
// directly, deadlines by ExpireDue.
#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "membership.h"
#include "rendezvous_state.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

using Clock = RendezvousState::Clock;

// Outcomes collects what a call's Reply got. Declared before the RendezvousState: its destructor
// answers the waits still pending.
struct Outcomes {
  std::vector<Outcome> got;
  Reply Recorder() {
    return [this](Outcome outcome) { got.push_back(std::move(outcome)); };
  }
};

std::vector<RankSlot> Ranks(int n) {
  std::vector<RankSlot> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back({"h", r, n, 0, 1});
  return ranks;
}

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("state: a Get waits for its keys and gets their values in its order",
          "[rendezvous][state]") {
  Membership members(Ranks(2));
  Outcomes get;
  Outcomes now;
  RendezvousState state(ServerLimits{}, members);
  REQUIRE(state.Set("b", "22").ok());
  const WaitId id = state.Get({"a", "b", "a"}, 60000, get.Recorder());
  CHECK(id != 0);
  CHECK(get.got.empty());
  CHECK(state.WaitingCalls() == 1);
  REQUIRE(state.Set("a", "1").ok());  // the Reply runs here
  REQUIRE(get.got.size() == 1);
  CHECK(get.got[0].status.ok());
  CHECK(get.got[0].values.packed == "1221");
  CHECK(get.got[0].values.ends == std::vector<uint32_t>{1, 3, 4});
  CHECK(state.WaitingCalls() == 0);
  CHECK_FALSE(state.Cancel(id));  // already ended
  // Every key already set: answered at once, without waiting.
  CHECK(state.Get({"b"}, 0, now.Recorder()) == 0);
  REQUIRE(now.got.size() == 1);
  CHECK(now.got[0].values.packed == "22");
}

TEST_CASE("state: a timed-out Get names its missing keys and the ranks not joined",
          "[rendezvous][state]") {
  Membership members(Ranks(3));
  REQUIRE(members.Join({"h", 0, std::nullopt, 100}, nullptr).ok());
  REQUIRE(members.Join({"h", 1, std::nullopt, 101}, nullptr).ok());
  members.NoteExit(2, "exited with code 1");
  Outcomes get;
  RendezvousState state(ServerLimits{}, members);
  state.Get({"x", "y"}, 1500, get.Recorder());
  REQUIRE(state.Set("y", "").ok());
  state.ExpireDue(Clock::now());  // not yet due
  CHECK(get.got.empty());
  state.ExpireDue(Clock::now() + std::chrono::seconds(2));
  REQUIRE(get.got.size() == 1);
  CHECK(get.got[0].status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(get.got[0].status.message() ==
        "timed out after 1.5 s waiting for key 'x'; rank 2 has not joined; rank 2 exited with "
        "code 1");
  CHECK(state.WaitingCalls() == 0);
}

TEST_CASE("state: a barrier opens at its last arrival, a rank entering twice counts once",
          "[rendezvous][state]") {
  Membership members(Ranks(3));
  Outcomes first, again, last;
  Outcomes wrong;
  RendezvousState state(ServerLimits{}, members);
  CHECK(state.Barrier("b", 3, 60000, {0}, first.Recorder()) != 0);
  CHECK(state.Barrier("b", 3, 60000, {0}, again.Recorder()) != 0);  // a retry of rank 0
  state.Barrier("b", 2, 60000, {1}, wrong.Recorder());
  REQUIRE(wrong.got.size() == 1);
  CHECK(wrong.got[0].status.message() ==
        "barrier 'b' was entered with count 3 and now with count 2; all callers must agree");
  CHECK(first.got.empty());
  CHECK(state.Barrier("b", 3, 60000, {1, 2}, last.Recorder()) == 0);  // a relay's batch
  REQUIRE(first.got.size() == 1);
  REQUIRE(again.got.size() == 1);
  REQUIRE(last.got.size() == 1);
  CHECK(first.got[0].status.ok());
  CHECK(last.got[0].status.ok());
}

TEST_CASE("state: a timed-out barrier of every rank names the ranks missing",
          "[rendezvous][state]") {
  Membership members(Ranks(4));
  Outcomes waiting;
  RendezvousState state(ServerLimits{}, members);
  state.Barrier("start", 4, 250, {0, 1}, waiting.Recorder());
  state.ExpireDue(Clock::now() + std::chrono::seconds(1));
  REQUIRE(waiting.got.size() == 1);
  CHECK(waiting.got[0].status.message() ==
        "timed out after 250 ms in barrier 'start': 2 of 4 arrived, waiting for ranks 2, 3; "
        "ranks 2, 3 have not joined");
}

TEST_CASE("state: an allgather's answer is made once and shared, a late caller gets it too",
          "[rendezvous][state]") {
  Membership members(Ranks(2));
  int wraps = 0;
  Outcomes first, second, late;
  Outcomes get;
  RendezvousState state(ServerLimits{}, members, [&wraps](std::string table) {
    ++wraps;
    return "wrapped:" + table;
  });
  const std::string v0 = "alpha", v1 = "beta";
  CHECK(state.Allgather("g", 2, 60000, {{0, &v0}}, first.Recorder()) != 0);
  CHECK(state.Allgather("g", 2, 60000, {{1, &v1}}, second.Recorder()) == 0);
  REQUIRE(first.got.size() == 1);
  REQUIRE(second.got.size() == 1);
  REQUIRE(first.got[0].answer != nullptr);
  CHECK(first.got[0].answer == second.got[0].answer);  // the same bytes
  CHECK(wraps == 1);
  const std::string wrapped = *first.got[0].answer;
  CHECK(wrapped.rfind("wrapped:", 0) == 0);
  absl::StatusOr<std::vector<std::string>> table = DecodeTable(wrapped.substr(8), 2);
  REQUIRE(table.ok());
  CHECK(*table == std::vector<std::string>{"alpha", "beta"});
  // A retry after completion: the same answer at once.
  CHECK(state.Allgather("g", 2, 60000, {{1, &v1}}, late.Recorder()) == 0);
  REQUIRE(late.got.size() == 1);
  CHECK(late.got[0].answer == first.got[0].answer);
  // Each contribution is a key of its own.
  state.Get({"g/1"}, 0, get.Recorder());
  CHECK(get.got.at(0).values.packed == "beta");
}

TEST_CASE("state: an allgather past the response limit fails every caller, naming the gather",
          "[rendezvous][state]") {
  Membership members(Ranks(2));
  ServerLimits limits;
  limits.max_response_bytes = 8;
  Outcomes first, second;
  RendezvousState state(limits, members);
  const std::string value(6, 'x');
  state.Allgather("big", 2, 60000, {{0, &value}}, first.Recorder());
  state.Allgather("big", 2, 60000, {{1, &value}}, second.Recorder());
  REQUIRE(first.got.size() == 1);
  REQUIRE(second.got.size() == 1);
  CHECK(first.got[0].status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(first.got[0].status, "allgather 'big' gathered"));
  CHECK(second.got[0].status == first.got[0].status);
  CHECK(first.got[0].answer == nullptr);
}

TEST_CASE("state: contributions are checked as their calls would be", "[rendezvous][state]") {
  Membership members(Ranks(2));
  ServerLimits limits;
  limits.max_value_bytes = 4;
  RendezvousState state(limits, members);
  CHECK(state.CheckContribution("g", 0, 2, 4, 1000).ok());
  CHECK(state.CheckContribution("g", 2, 2, 1, 1000).message() ==
        "allgather 'g' was entered as rank 2 of 2 contributors; the count must be 1 to 65536");
  CHECK(state.CheckContribution("g", 1, 2, 5, 1000).message() ==
        "the value of key 'g/1' has 5 bytes, over the limit of 4 bytes");
  CHECK(state.CheckContribution("g", 1, 2, 1, -1).message() ==
        "a timeout of -1 ms is outside 0 to 604800000 ms");
  CHECK(state.CheckKey("", "barrier name").message() == "a barrier name is empty");
}

TEST_CASE("state: Cancel ends one wait, the others stay", "[rendezvous][state]") {
  Membership members(Ranks(2));
  Outcomes cancelled, kept;
  RendezvousState state(ServerLimits{}, members);
  const WaitId id = state.Get({"k"}, 60000, cancelled.Recorder());
  state.Get({"k"}, 60000, kept.Recorder());
  CHECK(state.Cancel(id));
  REQUIRE(cancelled.got.size() == 1);
  CHECK(cancelled.got[0].status.code() == absl::StatusCode::kCancelled);
  CHECK_FALSE(state.Cancel(id));
  REQUIRE(state.Set("k", "v").ok());
  REQUIRE(kept.got.size() == 1);
  CHECK(kept.got[0].values.packed == "v");
  CHECK(cancelled.got.size() == 1);  // never answered twice
}

TEST_CASE("state: waits past the limit and stores past the limit are refused",
          "[rendezvous][state]") {
  Membership members(Ranks(2));
  ServerLimits limits;
  limits.max_waiters = 2;
  limits.max_stored_bytes = 100;  // the barrier takes 65
  Outcomes waiting, refused;
  RendezvousState state(limits, members);
  state.Get({"a"}, 60000, waiting.Recorder());
  state.Barrier("b", 2, 60000, {0}, waiting.Recorder());
  CHECK(state.Get({"c"}, 60000, refused.Recorder()) == 0);
  REQUIRE(refused.got.size() == 1);
  CHECK(refused.got[0].status.message() ==
        "over 2 calls are waiting at once; is a worker looping?");
  absl::Status full = state.Set("key", std::string(40, 'v'));
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(full.message() ==
        "the rendezvous holds 65 bytes; storing key 'key' would pass its limit of 100 bytes");
  CHECK(waiting.got.empty());
}

TEST_CASE("state: Shutdown ends every wait with UNAVAILABLE and refuses new ones",
          "[rendezvous][state]") {
  Membership members(Ranks(2));
  Outcomes waiting, after;
  RendezvousState state(ServerLimits{}, members);
  state.Get({"k"}, 60000, waiting.Recorder());
  state.Barrier("b", 2, 60000, {0}, waiting.Recorder());
  state.Shutdown();
  REQUIRE(waiting.got.size() == 2);
  for (const Outcome& outcome : waiting.got) {
    CHECK(outcome.status.code() == absl::StatusCode::kUnavailable);
  }
  state.Get({"k"}, 60000, after.Recorder());
  REQUIRE(after.got.size() == 1);
  CHECK(after.got[0].status.code() == absl::StatusCode::kUnavailable);
  CHECK(state.WaitingCalls() == 0);
}

TEST_CASE("membership: places, refusals, grown ranks and host runs", "[rendezvous][state]") {
  Membership members({{"a", 0, 2, 0, 2}, {"a", 1, 2, 0, 2}, {"b", 0, 1, 1, 2}});
  std::vector<std::string> names;
  absl::StatusOr<Placement> b0 = members.Join({"b", 0, std::nullopt, 7}, &names);
  REQUIRE(b0.ok());
  CHECK(b0->rank == 2);
  CHECK(b0->size == 3);
  CHECK(b0->slot.cross_rank == 1);
  CHECK(names == std::vector<std::string>{"a", "b"});
  CHECK(members.Join({"b", 0, std::nullopt, 8}, nullptr).status().code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(members.Join({"c", 0, std::nullopt, 9}, nullptr).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(members.Join({"a", 1, 0, 9}, nullptr).status().message() ==
        "a worker claiming rank 0 joined as host 'a' local_rank 1, which is rank 1");
  // A grown rank joins by its number on its host, and is told the job as it is now.
  CHECK(members.AddRanks({{"c", 0, 1, 0, 1}, {"a", 0, 1, 0, 1}}) == 3);
  absl::StatusOr<Placement> grown = members.Join({"a", 0, 4, 10}, nullptr);
  REQUIRE(grown.ok());
  CHECK(grown->rank == 4);
  CHECK(grown->size == 5);
  CHECK(members.Runs(3) == std::vector<std::pair<int, int>>{{0, 2}, {1, 1}});
  CHECK(members.Runs(5) == std::vector<std::pair<int, int>>{{0, 2}, {1, 1}, {2, 1}, {0, 1}});
  CHECK(members.DescribeAbsent({0, 1, 2}) == "; ranks 0, 1 have not joined");
  members.NoteExit(0, "was killed by SIGKILL");
  CHECK(members.DescribeAbsent({0}) == "; rank 0 has not joined; rank 0 was killed by SIGKILL");
  CHECK(members.Ranks()[2].pid == 7);
}

}  // namespace trainrun::rendezvous::internal
