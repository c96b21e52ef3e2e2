// JobSupervisor's policy with a fake RankControl: who is blamed, what trainrun exits with.
#include "trainrun/launcher/job_supervisor.h"

#include <signal.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "trainrun/launcher/stall_inspector.h"

namespace {

using trainrun::launcher::ExitInfo;
using trainrun::launcher::JobSupervisor;
using trainrun::launcher::StallInspector;
using trainrun::launcher::SupervisorOptions;

class FakeRanks : public trainrun::launcher::RankControl {
 public:
  void TerminateAll() override { ++terminated; }
  void KillAll() override { ++killed; }
  int terminated = 0;
  int killed = 0;
};

trainrun::hostfile::SlotPlan Plan(int n) {
  trainrun::hostfile::SlotPlan plan;
  plan.hosts.push_back({"", "localhost", n, std::nullopt});
  for (int r = 0; r < n; ++r) plan.ranks.push_back({r, r, n, 0, 1, 0});
  return plan;
}

ExitInfo Exit(int code, std::chrono::steady_clock::time_point time, int signal = 0) {
  ExitInfo e;
  e.code = code;
  e.signal = signal;
  e.time = time;
  return e;
}

struct Fixture {
  explicit Fixture(int n)
      : plan(Plan(n)), supervisor(io, plan, ranks, SupervisorOptions{}, [this] { done = true; }) {
    for (int r = 0; r < n; ++r) supervisor.OnRankStarted(r);
    supervisor.OnStartsComplete();
  }
  boost::asio::io_context io;
  trainrun::hostfile::SlotPlan plan;
  FakeRanks ranks;
  bool done = false;
  JobSupervisor supervisor;
};

}  // namespace

TEST_CASE("all ranks exit 0: exit 0, no summary", "[launcher][supervisor]") {
  Fixture f(2);
  auto now = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(0, Exit(0, now));
  CHECK_FALSE(f.done);
  f.supervisor.OnRankExit(1, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.Summary().empty());
  CHECK(f.ranks.terminated == 0);
}

TEST_CASE("an earlier failure reported later is still the one blamed", "[launcher][supervisor]") {
  Fixture f(3);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  // Rank 2 (failed at t0+5ms) is reaped before rank 1 (failed at t0): rank 1 is blamed.
  f.supervisor.OnRankExit(2, Exit(1, t0 + std::chrono::milliseconds(5)));
  CHECK(f.ranks.terminated == 1);
  f.supervisor.OnRankExit(1, Exit(0, t0, SIGSEGV));
  f.supervisor.OnRankExit(
      0, Exit(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 128 + SIGSEGV);
  std::string summary = f.supervisor.Summary();
  CHECK(summary.rfind("rank 1 on localhost was killed by SIGSEGV", 0) == 0);
  CHECK(summary.find("rank 2 also exited with code 1, after the first failure") !=
        std::string::npos);
  CHECK(summary.find("stopped as a consequence: rank 0 (ended: SIGTERM)") != std::string::npos);
}

TEST_CASE("a rank that reported a peer's failure is not blamed", "[launcher][supervisor]") {
  Fixture f(2);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(0, 1);
  f.supervisor.OnRankExit(0, Exit(1, t0));
  f.supervisor.OnRankExit(1, Exit(3, t0 + std::chrono::milliseconds(1)));
  CHECK(f.supervisor.exit_code() == 3);
  std::string summary = f.supervisor.Summary();
  CHECK(summary.rfind("rank 1 on localhost exited with code 3", 0) == 0);
  CHECK(summary.find("rank 0 reported failing because rank 1 had") != std::string::npos);
}

TEST_CASE("a peer that broke off without failing first is still named the cause",
          "[launcher][supervisor]") {
  // Ranks 0 and 2 lose their connections to rank 1 and exit 1 at once; rank 1 (say it closed its
  // sockets and went on) is only stopped by the teardown. The summary names rank 1 anyway.
  Fixture f(3);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(0, 1);
  f.supervisor.ReportPeerFailure(2, 1);
  f.supervisor.OnRankExit(0, Exit(1, t0));
  f.supervisor.OnRankExit(2, Exit(1, t0 + std::chrono::milliseconds(1)));
  f.supervisor.OnRankExit(
      1, Exit(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  std::string summary = f.supervisor.Summary();
  INFO(summary);
  CHECK(summary.rfind("rank 1 on localhost failed first: its peers lost their connections to it",
                      0) == 0);
  CHECK(summary.find("rank 1 then was killed by SIGTERM") != std::string::npos);
  CHECK(summary.find("ranks 0,2 reported failing because rank 1 had") != std::string::npos);
}

TEST_CASE("a peer that exited on its own but was reaped after the reports is blamed with its code",
          "[launcher][supervisor]") {
  // Rank 0 exits with code 3; its sockets close at once, so ranks 1-3 report it and the teardown
  // begins before rank 0's own exit is reaped (CI's chaos run saw exit 1 and "lost their
  // connections" here). Its exit code is its own failure: trainrun exits 3 and blames it so.
  Fixture f(4);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(3, 0);
  f.supervisor.ReportPeerFailure(2, 0);
  f.supervisor.ReportPeerFailure(1, 0);
  f.supervisor.OnRankExit(3, Exit(1, t0));
  CHECK(f.ranks.terminated == 1);
  auto later = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  f.supervisor.OnRankExit(2, Exit(1, later));
  f.supervisor.OnRankExit(0, Exit(3, later));
  f.supervisor.OnRankExit(1, Exit(1, later));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 3);
  std::string summary = f.supervisor.Summary();
  INFO(summary);
  CHECK(summary.rfind("rank 0 on localhost exited with code 3; it failed first", 0) == 0);
  CHECK(summary.find("ranks 1-3 reported failing because rank 0 had") != std::string::npos);
}

TEST_CASE("a peer killed by the teardown's SIGKILL is not taken for a failure of its own",
          "[launcher][supervisor]") {
  // Rank 1 broke off (its peer reports it), ran on, ignored SIGTERM and was killed by the grace
  // period's SIGKILL: that SIGKILL is the teardown's, so the reporter's code stands.
  Fixture f(2);
  f.supervisor.ReportPeerFailure(0, 1);
  f.supervisor.OnRankExit(0, Exit(1, std::chrono::steady_clock::now()));
  f.supervisor.OnSignal(SIGINT);  // during the teardown: SIGKILL now
  CHECK(f.ranks.killed == 1);
  f.supervisor.OnRankExit(
      1, Exit(0, std::chrono::steady_clock::now() + std::chrono::milliseconds(5), SIGKILL));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  CHECK(f.supervisor.Summary().rfind("rank 1 on localhost failed first", 0) == 0);
}

TEST_CASE("a signal to trainrun: 128+N, a second one kills at once", "[launcher][supervisor]") {
  Fixture f(2);
  f.supervisor.OnSignal(SIGINT);
  CHECK(f.ranks.terminated == 1);
  CHECK(f.ranks.killed == 0);
  f.supervisor.OnSignal(SIGINT);
  CHECK(f.ranks.killed == 1);
  auto later = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  f.supervisor.OnRankExit(0, Exit(0, later, SIGTERM));
  f.supervisor.OnRankExit(1, Exit(0, later, SIGKILL));
  CHECK(f.supervisor.exit_code() == 130);
  CHECK(f.supervisor.Summary().rfind("interrupted by SIGINT", 0) == 0);
}

TEST_CASE("a stalled rank is blamed: the chain of peer reports is followed to its end",
          "[launcher][supervisor]") {
  // Rank 1 is stopped (SIGSTOP): rank 2 times out waiting on it, rank 3 on rank 2, rank 0 on rank
  // 3, each naming the neighbour it waited on. Rank 3 happens to end first. Rank 1 reported
  // nothing: it is the cause, not rank 2 (rank 3's peer).
  Fixture f(4);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(3, 2);
  f.supervisor.ReportPeerFailure(2, 1);
  f.supervisor.ReportPeerFailure(0, 3);
  f.supervisor.OnRankExit(3, Exit(1, t0));
  f.supervisor.OnRankExit(2, Exit(1, t0 + std::chrono::milliseconds(1)));
  f.supervisor.OnRankExit(0, Exit(1, t0 + std::chrono::milliseconds(2)));
  f.supervisor.OnRankExit(
      1, Exit(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  std::string summary = f.supervisor.Summary();
  INFO(summary);
  CHECK(summary.rfind("rank 1 on localhost failed first", 0) == 0);
  CHECK(summary.find("stopped as a consequence") == std::string::npos);
}

TEST_CASE("peer reports that form a loop end where the loop closes", "[launcher][supervisor]") {
  Fixture f(3);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(0, 1);
  f.supervisor.ReportPeerFailure(1, 0);
  f.supervisor.OnRankExit(0, Exit(1, t0));
  f.supervisor.OnRankExit(1, Exit(1, t0 + std::chrono::milliseconds(1)));
  f.supervisor.OnRankExit(
      2, Exit(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  CHECK(f.supervisor.Summary().rfind("rank 1 on localhost failed first", 0) == 0);
}

TEST_CASE("timeouts that race around the ring blame the one rank that said nothing",
          "[launcher][supervisor]") {
  // Rank 1 is stopped mid-allreduce over TCP. Rank 3 times out on rank 2 and rank 0 on rank 3
  // before rank 2 times out on rank 1; rank 2 then learns of rank 3's report first and names it.
  // The reports loop (3 -> 2 -> 3) and rank 1, the only rank that neither reported nor failed, is
  // the stalled one (seen in CI: the summary blamed rank 3).
  Fixture f(4);
  auto t0 = std::chrono::steady_clock::now() - std::chrono::milliseconds(50);
  f.supervisor.ReportPeerFailure(3, 2, "rank 3: rank 2 moved no data for 2000 ms: stalled");
  f.supervisor.ReportPeerFailure(0, 3, "rank 0: rank 3 moved no data for 2000 ms: stalled");
  f.supervisor.ReportPeerFailure(2, 3);
  f.supervisor.OnRankExit(3, Exit(1, t0));
  f.supervisor.OnRankExit(2, Exit(1, t0 + std::chrono::milliseconds(1)));
  f.supervisor.OnRankExit(0, Exit(1, t0 + std::chrono::milliseconds(2)));
  f.supervisor.OnRankExit(
      1, Exit(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  std::string summary = f.supervisor.Summary();
  INFO(summary);
  CHECK(summary.rfind("rank 1 on localhost stalled: its peers timed out waiting in a collective, "
                      "and it alone neither reported nor failed",
                      0) == 0);
}

TEST_CASE("the stall inspector: who waits where, who has not joined, and when to shut down",
          "[launcher][stall]") {
  using std::chrono::seconds;
  StallInspector inspector(4, seconds(60), seconds(120));
  const auto t0 = StallInspector::Clock::now();
  CHECK(inspector.Update({}, t0).empty());
  std::string warning =
      inspector.Update({{1, "allreduce #7"}, {2, "allreduce #7"}, {3, "barrier #7"}}, t0);
  CHECK(warning ==
        "stall: ranks 1-2 have waited 60 s in allreduce #7, which ranks 0,3 have not joined; rank "
        "3 waits in barrier #7 instead; the job ends if it lasts 120 s "
        "(--stall-check-shutdown-time-seconds)");
  // The same reports again: nothing new to say.
  CHECK(inspector
            .Update({{1, "allreduce #7"}, {2, "allreduce #7"}, {3, "barrier #7"}}, t0 + seconds(5))
            .empty());
  CHECK_FALSE(inspector.ShutdownDue(t0 + seconds(59)));
  CHECK(inspector.ShutdownDue(t0 + seconds(60)));
  // Rank 3 waits, in another collective: only rank 0, in none, is stalled.
  CHECK(inspector.Stalled() == std::vector<int>{0});
  // The collective completes: its reports are cleared, and the clock starts again.
  CHECK(inspector.Update({{1, ""}, {2, ""}}, t0 + seconds(61)).empty());
  CHECK_FALSE(inspector.ShutdownDue(t0 + seconds(200)));
}

TEST_CASE(
    "the stall inspector never names a rank that waits inside a collective: over TCP a "
    "rank can be one collective ahead of the stalled one's peers",
    "[launcher][stall]") {
  using std::chrono::seconds;
  StallInspector inspector(4, seconds(5), seconds(10));
  const auto t0 = StallInspector::Clock::now();
  // Rank 2 is stopped in no collective; rank 1 finished its share of allreduce #125 and waits in
  // #126, which needs rank 2 too.
  inspector.Update({{0, "allreduce #125"}, {1, "allreduce #126"}, {3, "allreduce #125"}}, t0);
  REQUIRE(inspector.ShutdownDue(t0 + seconds(5)));
  CHECK(inspector.Stalled() == std::vector<int>{2});
  // With every rank inside some collective (a program that calls them in different orders), no
  // rank is in none: those outside the collective most ranks wait in are named.
  StallInspector mismatch(3, seconds(5), seconds(10));
  mismatch.Update({{0, "allreduce #3"}, {1, "allreduce #3"}, {2, "broadcast #3"}}, t0);
  CHECK(mismatch.Stalled() == std::vector<int>{2});
}

namespace {

using trainrun::launcher::ElasticSpec;
using trainrun::launcher::MembershipChange;

// An elastic job of n ranks that may go on with `min_np`.
struct ElasticFixture {
  ElasticFixture(int n, int min_np, std::chrono::seconds timeout = std::chrono::seconds(600))
      : plan(Plan(n)),
        supervisor(
            io, plan, ranks, Options(min_np, timeout), [this] { done = true; },
            [this](const MembershipChange& change) { changes.push_back(change); }) {
    for (int r = 0; r < n; ++r) supervisor.OnRankStarted(r);
    supervisor.OnStartsComplete();
  }
  static SupervisorOptions Options(int min_np, std::chrono::seconds timeout) {
    SupervisorOptions options;
    options.elastic = ElasticSpec{min_np, 0, timeout};
    return options;
  }
  boost::asio::io_context io;
  trainrun::hostfile::SlotPlan plan;
  FakeRanks ranks;
  bool done = false;
  std::vector<MembershipChange> changes;
  JobSupervisor supervisor;
};

}  // namespace

TEST_CASE("elastic: a lost rank makes a new generation of the survivors, not a teardown",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(4, 2);
  auto now = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(2, Exit(0, now, SIGKILL));
  CHECK(f.ranks.terminated == 0);
  CHECK_FALSE(f.done);
  REQUIRE(f.changes.size() == 1);
  CHECK(f.changes[0].generation == 1);
  CHECK(f.changes[0].lost_ranks == std::vector<int>{2});
  CHECK(f.changes[0].members == std::vector<int>{0, 1, 3});
  CHECK(f.changes[0].why == "rank 2 on localhost was killed by SIGKILL");
  const std::string line = f.supervisor.OnGenerationFormed(1);
  CHECK(line.rfind("rank 2 on localhost was killed by SIGKILL; the job goes on at 3 ranks "
                   "(generation 1, formed by ranks 0-1,3 of the start), recovered in ",
                   0) == 0);
  // A second loss: generation 2 of two ranks.
  f.supervisor.OnRankExit(0, Exit(1, now));
  REQUIRE(f.changes.size() == 2);
  CHECK(f.changes[1].members == std::vector<int>{1, 3});
  CHECK(f.ranks.terminated == 0);
  for (int r : {1, 3}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.Summary().empty());
  const std::string summary = f.supervisor.ElasticSummary();
  CHECK(summary.rfind("the job survived 2 membership changes, 2 of 4 ranks remain: rank 2 on "
                      "localhost was killed by SIGKILL (recovered in ",
                      0) == 0);
  CHECK(summary.find("rank 0 on localhost exited with code 1 (not recovered)") !=
        std::string::npos);
}

TEST_CASE("elastic: below --min-np the job waits for the elastic timeout, then ends saying why",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2, std::chrono::seconds(1));
  const auto lost = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(1, Exit(0, lost, SIGKILL));
  CHECK(f.changes.empty());
  CHECK(f.ranks.terminated == 0);
  // The survivor waits with trainrun: not done before the timeout, then stopped.
  CHECK_FALSE(f.done);
  f.io.run_one();  // the elastic timer
  CHECK(std::chrono::steady_clock::now() - lost >= std::chrono::seconds(1));
  CHECK(f.ranks.terminated == 1);
  f.supervisor.OnRankExit(0, Exit(0, std::chrono::steady_clock::now(), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 128 + SIGKILL);
  const std::string summary = f.supervisor.Summary();
  CHECK(summary.rfind("rank 1 on localhost was killed by SIGKILL; 1 rank was left, fewer than "
                      "--min-np 2, and no rank came within 1 s (--elastic-timeout), so the job "
                      "was stopped",
                      0) == 0);
}

TEST_CASE("elastic: when every rank has failed the job ends at once, with the last failure's code",
          "[launcher][supervisor][elastic]") {
  // Horovod's: no rank is left to wait with, so the elastic timeout (600 s here) is not waited.
  ElasticFixture f(2, 2, std::chrono::seconds(600));
  const auto lost = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(1, Exit(0, lost, SIGKILL));
  CHECK_FALSE(f.done);
  f.supervisor.OnRankExit(0, Exit(3, lost));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 3);
  const std::string summary = f.supervisor.Summary();
  CHECK(summary.rfind("rank 0 on localhost exited with code 3; no rank was left (every rank had "
                      "failed), so the job was stopped",
                      0) == 0);
  CHECK(summary.find("rank was left, fewer") == std::string::npos);
}

TEST_CASE("not elastic: the first failure still ends the job", "[launcher][supervisor][elastic]") {
  Fixture f(4);
  f.supervisor.OnRankExit(2, Exit(0, std::chrono::steady_clock::now(), SIGKILL));
  CHECK(f.ranks.terminated == 1);
}

TEST_CASE("elastic: a lost host's ranks are lost together, one generation of the others",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(4, 2);
  f.supervisor.OnHostLost({2, 3}, "host b lost its agent or its link (no word)");
  CHECK(f.ranks.terminated == 0);
  CHECK_FALSE(f.done);
  REQUIRE(f.changes.size() == 1);
  CHECK(f.changes[0].lost_ranks == std::vector<int>{2, 3});
  CHECK(f.changes[0].members == std::vector<int>{0, 1});
  CHECK(f.changes[0].why == "host b lost its agent or its link (no word): ranks 2-3 lost");
  const auto now = std::chrono::steady_clock::now();
  for (int r : {0, 1}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.ElasticSummary().rfind(
            "the job survived 1 membership change, 2 of 4 ranks remain, 1 host lost (localhost): "
            "host b lost",
            0) == 0);
}

TEST_CASE("elastic: a lost host that leaves fewer than --min-np ranks makes the job wait",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(4, 3, std::chrono::seconds(1));
  f.supervisor.OnHostLost({2, 3}, "host b lost its agent or its link (no word)");
  CHECK(f.changes.empty());
  CHECK(f.ranks.terminated == 0);
  f.io.run_one();  // the elastic timer
  CHECK(f.ranks.terminated == 1);
  CHECK(f.supervisor.Summary().rfind(
            "host b lost its agent or its link (no word): ranks 2-3 lost; 2 ranks were left, "
            "fewer than --min-np 3, and no rank came within 1 s",
            0) == 0);
}

TEST_CASE("elastic per-node range: nodes below --nnodes MIN end the job at once, not ranks",
          "[launcher][supervisor][elastic]") {
  // --nnodes 2:3 with 2 ranks per node: node0, node1, node2.
  trainrun::hostfile::SlotPlan plan;
  for (int node = 0; node < 3; ++node) {
    plan.hosts.push_back({"", absl::StrCat("node", node), 2, std::nullopt});
    for (int local = 0; local < 2; ++local) {
      plan.ranks.push_back({node * 2 + local, local, 2, node, 3, node});
    }
  }
  boost::asio::io_context io;
  FakeRanks ranks;
  std::vector<MembershipChange> changes;
  SupervisorOptions options;
  ElasticSpec range;
  range.min_nodes = 2;
  options.elastic = range;
  bool done = false;
  JobSupervisor supervisor(
      io, plan, ranks, options, [&] { done = true; },
      [&](const MembershipChange& change) { changes.push_back(change); });
  for (int r = 0; r < 6; ++r) supervisor.OnRankStarted(r);
  supervisor.OnStartsComplete();
  // One rank of node 0 fails: node 0 still has one, so three nodes remain.
  supervisor.OnRankExit(0, Exit(1, std::chrono::steady_clock::now()));
  REQUIRE(changes.size() == 1);
  // Node 2 lost: two nodes remain, MIN: a new generation.
  supervisor.OnHostLost({4, 5}, "host node2 lost its agent or its link (no word)");
  REQUIRE(changes.size() == 2);
  CHECK(changes[1].members == std::vector<int>{1, 2, 3});
  CHECK(ranks.terminated == 0);
  // Node 1 lost: one node, fewer than MIN: the job ends now, with no elastic-timeout wait.
  supervisor.OnHostLost({2, 3}, "host node1 lost its agent or its link (no word)");
  CHECK(changes.size() == 2);
  CHECK(ranks.terminated == 1);
  CHECK(supervisor.Summary().rfind(
            "host node1 lost its agent or its link (no word): ranks 2-3 lost; 1 node was left, "
            "fewer than the 2 that --nnodes asks for at least, so the job was stopped",
            0) == 0);
}

TEST_CASE("not elastic: a lost host still ends the job", "[launcher][supervisor][elastic]") {
  Fixture f(4);
  f.supervisor.OnHostLost({2, 3}, "host b lost its agent or its link (no word)");
  CHECK(f.ranks.terminated == 1);
}

TEST_CASE("elastic: a host removed by discovery has its ranks stopped, one change",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(4, 2);
  f.supervisor.OnRanksRemoved({2, 3}, "host b left the host discovery script's output");
  REQUIRE(f.changes.size() == 1);
  CHECK(f.changes[0].members == std::vector<int>{0, 1});
  CHECK(f.changes[0].why == "host b left the host discovery script's output: ranks 2-3 stopped");
  CHECK(f.ranks.terminated == 0);  // not everyone: the fake counts TerminateAll only
  // Their SIGTERM exits are the removal's consequence, not news.
  const auto now = std::chrono::steady_clock::now();
  for (int r : {2, 3}) f.supervisor.OnRankExit(r, Exit(0, now, SIGTERM));
  CHECK(f.changes.size() == 1);
  for (int r : {0, 1}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
}

TEST_CASE("elastic: --reset-limit ends the job at the change past it, saying so",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(4, 1);
  // ElasticFixture has no reset limit; this one allows one change.
  SupervisorOptions options = ElasticFixture::Options(1, std::chrono::seconds(600));
  options.elastic->reset_limit = 1;
  bool done = false;
  std::vector<MembershipChange> changes;
  JobSupervisor supervisor(
      f.io, f.plan, f.ranks, options, [&] { done = true; },
      [&](const MembershipChange& change) { changes.push_back(change); });
  for (int r = 0; r < 4; ++r) supervisor.OnRankStarted(r);
  supervisor.OnStartsComplete();
  const auto now = std::chrono::steady_clock::now();
  supervisor.OnRankExit(3, Exit(0, now, SIGKILL));
  CHECK(changes.size() == 1);
  CHECK(f.ranks.terminated == 0);
  supervisor.OnRankExit(2, Exit(0, now, SIGKILL));
  CHECK(changes.size() == 1);
  CHECK(f.ranks.terminated == 1);
  for (int r : {0, 1}) supervisor.OnRankExit(r, Exit(0, now, SIGTERM));
  CHECK(done);
  CHECK(supervisor.exit_code() == 1);
  CHECK(supervisor.Summary().rfind(
            "rank 2 on localhost was killed by SIGKILL; the job's membership had already changed "
            "1 time, as many as --reset-limit 1 allows, so the job was stopped",
            0) == 0);
}

namespace {

// The fixture's plan grown by `n` ranks on host `host` (what ElasticController::Grow does to the
// slots).
std::vector<int> GrowPlan(trainrun::hostfile::SlotPlan& plan, const std::string& host, int n) {
  plan.hosts.push_back({"", host, n, std::nullopt});
  std::vector<int> added;
  for (int i = 0; i < n; ++i) {
    const int rank = plan.size();
    plan.ranks.push_back({rank, i, n, 0, 1, static_cast<int>(plan.hosts.size()) - 1});
    added.push_back(rank);
  }
  return added;
}

}  // namespace

TEST_CASE("elastic: ranks the job grows by are pending, then one change when they joined",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2);
  const std::vector<int> added = GrowPlan(f.plan, "b", 2);
  f.supervisor.OnRanksAdded(added);
  CHECK(f.supervisor.Live(2));
  CHECK(f.changes.empty());
  // A member lost meanwhile: the new generation leaves the pending ranks out.
  const auto since = std::chrono::steady_clock::now();
  REQUIRE(f.supervisor.OnRanksJoined(added,
                                     "host b joined (from the host discovery script): "
                                     "ranks 2-3 started",
                                     since, "b"));
  REQUIRE(f.changes.size() == 1);
  CHECK(f.changes[0].generation == 1);
  CHECK(f.changes[0].joined_ranks == added);
  CHECK(f.changes[0].lost_ranks.empty());
  CHECK(f.changes[0].members == std::vector<int>{0, 1, 2, 3});
  CHECK(f.supervisor.OnGenerationFormed(1).rfind(
            "host b joined (from the host discovery script): ranks 2-3 started; the job goes on "
            "at 4 ranks (generation 1, formed by ranks 0-1 of the start and 2-3), recovered in ",
            0) == 0);
  CHECK(f.supervisor.ElasticSummary().rfind(
            "the job survived 1 membership change, 4 ranks at the end (2 at the start), 2 ranks "
            "joined (on b): ",
            0) == 0);
  const auto now = std::chrono::steady_clock::now();
  for (int r = 0; r < 4; ++r) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
}

TEST_CASE("elastic: a pending rank that fails is no change and never blamed",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2);
  const std::vector<int> added = GrowPlan(f.plan, "b", 2);
  f.supervisor.OnRanksAdded(added);
  const auto now = std::chrono::steady_clock::now();
  CHECK_FALSE(f.supervisor.StoppedOnPurpose(2));
  f.supervisor.OnRankExit(2, Exit(1, now));
  CHECK_FALSE(f.supervisor.Live(2));
  CHECK(f.changes.empty());
  CHECK(f.ranks.terminated == 0);
  // The other joins alone.
  REQUIRE(f.supervisor.OnRanksJoined(added, "host b joined", now, "b"));
  CHECK(f.changes[0].joined_ranks == std::vector<int>{3});
  CHECK(f.changes[0].members == std::vector<int>{0, 1, 3});
  for (int r : {0, 1, 3}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.Summary().empty());
}

TEST_CASE("elastic: a remote host lost while its ranks were pending is no change, never blamed",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2);
  const std::vector<int> added = GrowPlan(f.plan, "b", 2);
  f.supervisor.OnRanksAdded(added);
  // The agent connected for them fell silent (or could not start them) before they joined.
  f.supervisor.OnHostLost(added, "host b lost its agent or its link (no word)");
  CHECK_FALSE(f.supervisor.Live(2));
  CHECK_FALSE(f.supervisor.Live(3));
  CHECK(f.changes.empty());
  CHECK_FALSE(f.supervisor.ending());
  CHECK_FALSE(
      f.supervisor.OnRanksJoined(added, "host b joined", std::chrono::steady_clock::now(), "b"));
  const auto now = std::chrono::steady_clock::now();
  for (int r : {0, 1}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.Summary().empty());
  CHECK(f.supervisor.ElasticSummary().empty());
}

TEST_CASE("elastic: a member that finishes gives up the pending ranks, no growth then",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2);
  const std::vector<int> added = GrowPlan(f.plan, "b", 2);
  f.supervisor.OnRanksAdded(added);
  const auto now = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(0, Exit(0, now));
  CHECK(f.supervisor.finishing());
  CHECK_FALSE(f.supervisor.Live(2));
  CHECK(f.supervisor.StoppedOnPurpose(2));  // their SIGTERM blacklists nothing
  CHECK_FALSE(f.supervisor.OnRanksJoined(added, "host b joined", now, "b"));
  f.supervisor.OnRankExit(1, Exit(0, now));
  for (int r : added) f.supervisor.OnRankExit(r, Exit(0, now, SIGTERM));
  CHECK(f.done);
  CHECK(f.changes.empty());
  CHECK(f.supervisor.exit_code() == 0);
}

TEST_CASE("elastic: ranks that join a job waiting below --min-np end the wait",
          "[launcher][supervisor][elastic]") {
  ElasticFixture f(2, 2);
  const auto now = std::chrono::steady_clock::now();
  f.supervisor.OnRankExit(1, Exit(0, now, SIGKILL));
  CHECK(f.changes.empty());  // 1 rank left: waiting
  const std::vector<int> added = GrowPlan(f.plan, "b", 1);
  f.supervisor.OnRanksAdded(added);
  REQUIRE(f.supervisor.OnRanksJoined(added, "host b joined", now, "b"));
  REQUIRE(f.changes.size() == 1);
  CHECK(f.changes[0].members == std::vector<int>{0, 2});
  for (int r : {0, 2}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 0);
}

TEST_CASE("a rank that exits 0 without joining while a joined rank runs ends the job, naming it",
          "[launcher][supervisor]") {
  Fixture f(3);
  const auto now = std::chrono::steady_clock::now();
  // Rank 2 exits 0 before anyone joined: nobody waits for it yet.
  f.supervisor.OnRankExit(2, Exit(0, now));
  CHECK(f.ranks.terminated == 0);
  // Rank 0 joins: now it would wait for rank 2 until its timeout.
  f.supervisor.OnRankJoined(0);
  CHECK(f.ranks.terminated == 1);
  // Rank 1's join overtook the news of its exit: not the rank named.
  f.supervisor.OnRankJoined(1);
  f.supervisor.OnRankExit(1, Exit(0, now));
  f.supervisor.OnRankExit(0, Exit(0, std::chrono::steady_clock::now(), SIGTERM));
  CHECK(f.done);
  CHECK(f.supervisor.exit_code() == 1);
  CHECK(f.supervisor.Summary().rfind(
            "rank 2 on localhost exited with code 0 without joining the job, while the other "
            "ranks waited for it; the job was stopped",
            0) == 0);
}

TEST_CASE("ranks that all exit 0 after joining, or before anyone joined, end the job well",
          "[launcher][supervisor]") {
  Fixture f(2);
  const auto now = std::chrono::steady_clock::now();
  f.supervisor.OnRankJoined(0);
  f.supervisor.OnRankExit(0, Exit(0, now));
  f.supervisor.OnRankExit(1, Exit(0, now));  // it never joined, but nobody runs to wait for it
  CHECK(f.done);
  CHECK(f.ranks.terminated == 0);
  CHECK(f.supervisor.exit_code() == 0);
  CHECK(f.supervisor.Summary().empty());
}

TEST_CASE("the failure mode: elastic with --min-np, restart with --max-restarts, else fail fast",
          "[launcher][supervisor]") {
  using trainrun::launcher::FailureMode;
  using trainrun::launcher::FailureModeOf;
  trainrun::launcher::LaunchSpec spec;
  CHECK(FailureModeOf(spec) == FailureMode::kFailFast);
  spec.max_restarts = 2;
  CHECK(FailureModeOf(spec) == FailureMode::kRestart);
  spec.max_restarts = 0;
  spec.elastic = ElasticSpec{};
  CHECK(FailureModeOf(spec) == FailureMode::kElastic);
}

TEST_CASE("fail fast: membership events change nothing, and there is no membership summary",
          "[launcher][supervisor]") {
  Fixture f(2);
  f.supervisor.OnRanksRemoved({1}, "host b left the host discovery script's output");
  CHECK(f.supervisor.Live(1));
  CHECK(f.supervisor.MembershipChanges().empty());
  CHECK_FALSE(f.supervisor.finishing());
  const auto now = std::chrono::steady_clock::now();
  for (int r : {0, 1}) f.supervisor.OnRankExit(r, Exit(0, now));
  CHECK(f.done);
  CHECK(f.supervisor.ElasticSummary().empty());
  CHECK(f.supervisor.Summary().empty());
}
