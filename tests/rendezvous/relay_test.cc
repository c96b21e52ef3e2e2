// A host's relay (relay.h) between ranks (threads here, each with its own Unix-socket connections)
// and a real server over 127.0.0.1: the frames, the batching of the start-up calls, the calls that
// pass through, errors reaching the rank they belong to, and a relay that goes away.
#include "trainrun/rendezvous/relay.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rank_threads.h"
#include "relay_wire.h"
#include "test_job.h"
#include "trainrun/rendezvous/admission.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using testing::Job;
using testing::StartJob;
using ::trainrun::testing::RequireNoFailures;
using ::trainrun::testing::ThreadFailures;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// Two hosts of four ranks each.
std::vector<RankSlot> TwoHosts() {
  std::vector<RankSlot> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back({r < 4 ? "a" : "b", r % 4, 4, r / 4, 2});
  return ranks;
}

std::unique_ptr<Relay> StartRelay(const Job& job, const std::string& host, int local_ranks,
                                  milliseconds window = milliseconds(2),
                                  milliseconds report_window = milliseconds(100)) {
  RelayOptions options;
  static std::atomic<int> serial{0};
  options.socket = absl::StrCat("@trainrun-relay-test-", getpid(), "-", serial++);
  options.server_address = job.server->address();
  options.job_id = job.options.job_id;
  options.token = job.options.token;
  options.host = host;
  options.local_ranks = local_ranks;
  options.batch_window = window;
  options.report_window = report_window;
  auto relay = Relay::Start(options);
  REQUIRE(relay.ok());
  return *std::move(relay);
}

ClientOptions Through(const Job& job, const Relay& relay, int rank) {
  ClientOptions client = job.ClientFor(rank);
  client.relay = relay.socket();
  return client;
}

// Runs `body(rank)` for each rank on a thread of its own, returning their statuses.
std::vector<absl::Status> OnThreads(int n, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> statuses(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = body(r); });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

TEST_CASE("relay frames round-trip and arrive whole only", "[rendezvous][relay]") {
  using namespace internal;
  std::string frames;
  AppendRequest(frames, RelayMethod::kBarrier, 7, 65000, "request-bytes");
  const size_t first = frames.size();
  AppendResponse(frames, 7, 4, "timed out", "body", "+more");
  CHECK(FrameLength(std::string_view(frames).substr(0, 3)) == 0);
  REQUIRE(FrameLength(frames) == first);
  RelayRequest request;
  REQUIRE(ParseRequest(std::string_view(frames).substr(0, first), request));
  CHECK(request.method == RelayMethod::kBarrier);
  CHECK(request.call_id == 7);
  CHECK(request.deadline_ms == 65000);
  CHECK(request.body == "request-bytes");
  std::string_view rest = std::string_view(frames).substr(first);
  REQUIRE(FrameLength(rest) == rest.size());
  RelayResponse response;
  REQUIRE(ParseResponse(rest, response));
  CHECK(response.call_id == 7);
  CHECK(response.code == 4);
  CHECK(response.message == "timed out");
  CHECK(response.body == "body+more");
  // A frame cut short, or one whose method is unknown, is refused.
  CHECK_FALSE(ParseRequest(std::string_view(frames).substr(0, first - 1), request));
  std::string unknown;
  AppendRequest(unknown, static_cast<RelayMethod>(200), 1, 0, "");
  CHECK_FALSE(ParseRequest(unknown, request));
}

TEST_CASE("relay: each host's joins, allgather and barrier go as one call each",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  // A window far longer than the test: each batch goes when its host's four ranks have called.
  std::unique_ptr<Relay> relays[2] = {StartRelay(job, "a", 4, seconds(30)),
                                      StartRelay(job, "b", 4, seconds(30))};
  std::vector<Assignment> assignments(8);
  std::vector<std::vector<std::string>> gathered(8);
  auto statuses = OnThreads(8, [&](int r) -> absl::Status {
    auto session = Join(Through(job, *relays[r / 4], r), seconds(10));
    if (!session.ok()) return session.status();
    assignments[static_cast<size_t>(r)] = session->assignment;
    auto all = session->store->Allgather("addr", session->assignment.rank, 8,
                                         absl::StrCat("10.0.0.", r, ":", 4000 + r), seconds(10));
    if (!all.ok()) return all.status();
    gathered[static_cast<size_t>(r)] = *all;
    return session->store->Barrier("start", 8, seconds(10));
  });
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    REQUIRE(statuses[r].ok());
    const Assignment& a = assignments[r];
    CHECK(a.rank == r);
    CHECK(a.size == 8);
    CHECK(a.local_rank == r % 4);
    CHECK(a.local_size == 4);
    CHECK(a.cross_rank == r / 4);
    CHECK(a.cross_size == 2);
    CHECK(a.job_id == "test-job");
    CHECK(a.HostOf(0) == "a");
    CHECK(a.HostOf(7) == "b");
    REQUIRE(gathered[r].size() == 8);
    for (int q = 0; q < 8; ++q) CHECK(gathered[r][q] == absl::StrCat("10.0.0.", q, ":", 4000 + q));
  }
  // All four of a host's ranks called within the window: a JoinBatch, an AllgatherBatch and a
  // BarrierBatch per host.
  CHECK(relays[0]->upstream_calls() == 3);
  CHECK(relays[1]->upstream_calls() == 3);
  CHECK(job.server->JoinedRanks().size() == 8);
}

TEST_CASE("relay: a late rank does not hold its host's batch, and is served alone",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relays[2] = {StartRelay(job, "a", 4, milliseconds(200)),
                                      StartRelay(job, "b", 4, milliseconds(200))};
  std::vector<double> join_ms(8);
  auto statuses = OnThreads(8, [&](int r) -> absl::Status {
    if (r == 3) std::this_thread::sleep_for(milliseconds(1500));
    const Clock::time_point start = Clock::now();
    auto session = Join(Through(job, *relays[r / 4], r), seconds(10));
    if (!session.ok()) return session.status();
    join_ms[r] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (r == 3) std::this_thread::sleep_for(milliseconds(300));
    return session->store->Barrier("start", 8, seconds(10));
  });
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    CHECK(statuses[r].ok());
  }
  // Host a's first three joined when the window closed, long before rank 3 came.
  for (int r = 0; r < 3; ++r) CHECK(join_ms[r] < 1200);
  // Host a: a batch of three joins and rank 3's own; the barrier's first three and rank 3's own.
  CHECK(relays[0]->upstream_calls() == 4);
  CHECK(relays[1]->upstream_calls() == 2);
}

TEST_CASE("relay: a batch whose wait times out fails each member naming what it waited for",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  const Clock::time_point start = Clock::now();
  auto statuses = OnThreads(4, [&](int r) -> absl::Status {
    auto session = Join(Through(job, *relay, r), seconds(10));
    if (!session.ok()) return session.status();
    // Host b never comes.
    return session->store->Barrier("start", 8, milliseconds(400));
  });
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < 4; ++r) {
    INFO(statuses[r]);
    CHECK(statuses[r].code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(Contains(statuses[r], "timed out after 400 ms in barrier 'start': 4 of 8 arrived"));
    CHECK(Contains(statuses[r], "waiting for ranks 4, 5, 6, 7"));
  }
  CHECK(waited < 3.0);
  CHECK(job.server->WaitingCalls() == 0);
}

TEST_CASE("relay: Set, Get, Add, Barrier and exit reports pass through", "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  auto store0 = ConnectStore(Through(job, *relay, 0));
  auto store1 = ConnectStore(Through(job, *relay, 1));
  REQUIRE(store0.ok());
  REQUIRE(store1.ok());
  // A Get waits in the server, not in the relay, while the other rank's Set passes it.
  ThreadFailures get_failures([&] { job.server->Shutdown(); });
  std::thread getter([&] {
    auto values = (*store1)->Get({"k1", "k2"}, seconds(10));
    if (!get_failures.ExpectOk(values.status(), "the Get through the relay")) return;
    get_failures.Expect((*values)[0] == "v1", "the first value");
    get_failures.Expect((*values)[1] == std::string("v\0two", 5), "the second value, whole");
  });
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(job.server->WaitingCalls() == 1);
  REQUIRE((*store0)->Set("k1", "v1").ok());
  REQUIRE((*store0)->Set("k2", std::string("v\0two", 5)).ok());
  getter.join();
  RequireNoFailures(get_failures);
  CHECK(*(*store0)->Add("n", 5) == 5);
  CHECK(*(*store1)->Add("n", -2) == 3);
  auto statuses = OnThreads(
      2, [&](int r) { return (r == 0 ? *store0 : *store1)->Barrier("b", 2, seconds(10)); });
  CHECK(statuses[0].ok());
  CHECK(statuses[1].ok());
  REQUIRE((*store1)->ReportPeerFailure(1, 0, "the connection to rank 0 broke").ok());
  auto failures = job.server->PeerFailures();
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].rank == 1);
  CHECK(failures[0].peer_rank == 0);
  CHECK(job.server->ValuesWithPrefix("k").size() == 2);
}

TEST_CASE("relay: a host's monitor reports go as one call, other Sets alone",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  // A report window of 1 s, not the default 100 ms, so that the four threads' reports of a period
  // meet in one window also under ThreadSanitizer on a loaded machine.
  const milliseconds report_window(1000);
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4, milliseconds(2), report_window);
  std::vector<std::shared_ptr<Store>> stores;
  for (int r = 0; r < 4; ++r) {
    auto store = ConnectStore(Through(job, *relay, r));
    REQUIRE(store.ok());
    stores.push_back(*std::move(store));
  }
  // Two periods of the four ranks' reports: two calls upstream, each answered to every rank.
  for (int period = 0; period < 2; ++period) {
    auto statuses = OnThreads(4, [&](int r) {
      return stores[r]->Set(absl::StrCat(env::kMonitorKeyPrefix, r), absl::StrCat(period, " ", r));
    });
    for (int r = 0; r < 4; ++r) CHECK(statuses[r].ok());
  }
  CHECK(relay->upstream_calls() == 2);
  auto reports = job.server->ValuesWithPrefix(env::kMonitorKeyPrefix);
  REQUIRE(reports.size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(reports[absl::StrCat(env::kMonitorKeyPrefix, r)] == absl::StrCat("1 ", r));
  }
  // A rank alone is not held past the report window, and other keys are not batched.
  const Clock::time_point start = Clock::now();
  REQUIRE(stores[0]->Set(absl::StrCat(env::kMonitorKeyPrefix, 0), "2 0").ok());
  const double alone_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(alone_ms >= 0.9 * report_window.count());
  CHECK(alone_ms < 2.0 * report_window.count() + 1000);
  REQUIRE(stores[1]->Set("k", "v").ok());
  CHECK(relay->upstream_calls() == 4);
  // A refused member's error reaches its rank only (a key over the server's 1,024 bytes).
  auto statuses = OnThreads(4, [&](int r) {
    const std::string key = r == 2 ? std::string(2000, 'x') : std::to_string(r);
    return stores[r]->Set(absl::StrCat(env::kMonitorKeyPrefix, key), "report");
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    CHECK(statuses[r].ok() == (r != 2));
  }
  CHECK(Contains(statuses[2], "over the limit of 1024 bytes"));
  CHECK(relay->upstream_calls() == 5);
}

TEST_CASE("relay: answers larger than the socket takes at once arrive whole, gathers as tables",
          "[rendezvous][relay]") {
  // A gather of four 700 KiB values (a 2.8 MB table of random bytes) is more than a Unix socket
  // holds, so the relay writes each answer in parts as its rank reads; a 1 MiB Get likewise.
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  std::vector<std::string> values;
  std::mt19937 random(3);
  for (int r = 0; r < 4; ++r) {
    std::string value(700 << 10, '\0');
    for (char& c : value) c = static_cast<char>(random());
    values.push_back(std::move(value));
  }
  std::vector<std::shared_ptr<Store>> stores(4);
  for (int r = 0; r < 4; ++r) {
    auto store = ConnectStore(Through(job, *relay, r));
    REQUIRE(store.ok());
    stores[r] = *store;
  }
  std::vector<std::vector<std::string>> gathered(4);
  auto statuses = OnThreads(4, [&](int r) -> absl::Status {
    auto all = stores[r]->AllgatherTable("big", r, 4, values[r], seconds(20));
    if (!all.ok()) return all.status();
    gathered[r] = all->ToStrings();
    return absl::OkStatus();
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << statuses[r]);
    CHECK(statuses[r].ok());
    CHECK(gathered[r] == values);
  }
  REQUIRE(stores[0]->Set("one", std::string(1 << 20, 'z')).ok());
  auto got = stores[1]->Get({"one"}, seconds(10));
  REQUIRE(got.ok());
  CHECK((*got)[0] == std::string(1 << 20, 'z'));
}

TEST_CASE("relay: a refused member's error reaches that rank, and the others go on",
          "[rendezvous][relay]") {
  ServerLimits limits;
  limits.max_value_bytes = 64;
  Job job = StartJob(TwoHosts(), limits);
  // A window of 1 s, so that the four joins meet in one batch also under ThreadSanitizer on a
  // loaded machine (rank 1's retry below, alone, waits it out).
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4, milliseconds(1000));

  // Joins: rank 2 claims a local_rank host a does not have; only it fails.
  std::vector<std::shared_ptr<Store>> stores(4);
  auto joins = OnThreads(4, [&](int r) -> absl::Status {
    ClientOptions client = Through(job, *relay, r);
    if (r == 2) client.local_rank = 9;
    auto session = Join(client, seconds(10));
    if (!session.ok()) return session.status();
    stores[r] = session->store;
    return absl::OkStatus();
  });
  CHECK(joins[0].ok());
  CHECK(joins[1].ok());
  CHECK(joins[3].ok());
  CHECK(joins[2].code() == absl::StatusCode::kNotFound);
  CHECK(Contains(joins[2], "no rank on host 'a' with local_rank 9"));
  CHECK(relay->upstream_calls() == 1);

  // An allgather of host a's four places where rank 1's value is over the limit: rank 1 hears at
  // once, the others' contributions are sent again alone and wait; rank 1's retry completes it.
  auto store = ConnectStore(Through(job, *relay, 2));
  REQUIRE(store.ok());
  stores[2] = *store;
  std::vector<std::vector<std::string>> gathered(4);
  const Clock::time_point start = Clock::now();
  auto gathers = OnThreads(4, [&](int r) -> absl::Status {
    const std::string value = r == 1 ? std::string(100, 'x') : absl::StrCat("v", r);
    auto all = stores[r]->Allgather("g", r, 4, value, seconds(10));
    if (r == 1) {
      if (all.ok()) return absl::InternalError("rank 1's oversized value was accepted");
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (ms > 2000) return absl::InternalError("rank 1 heard of its refusal late");
      if (!Contains(all.status(), "the value of key 'g/1' has 100 bytes, over the limit of 64")) {
        return all.status();
      }
      all = stores[r]->Allgather("g", r, 4, "v1", seconds(10));
    }
    if (!all.ok()) return all.status();
    gathered[r] = *all;
    return absl::OkStatus();
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << gathers[r]);
    CHECK(gathers[r].ok());
    CHECK(gathered[r] == std::vector<std::string>{"v0", "v1", "v2", "v3"});
  }
}

TEST_CASE("relay: a wrong token is refused by the relay", "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  ClientOptions client = Through(job, *relay, 0);
  client.token = "not-the-token";
  auto session = Join(client, seconds(5));
  REQUIRE_FALSE(session.ok());
  CHECK(session.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(Contains(session.status(), "TRAINRUN_JOB_TOKEN"));
  CHECK(job.server->JoinedRanks().empty());
  CHECK(relay->upstream_calls() == 0);
}

TEST_CASE("relay: a connection without the token cannot make the relay hold a large frame",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string& name = relay->socket();
  std::memcpy(address.sun_path + 1, name.data() + 1, name.size() - 1);  // "@...": abstract
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address),
                    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) == 0);
  // A frame that says 100 MiB follow, and the first KiB of them: the relay hangs up at once.
  std::string frame;
  internal::AppendRequest(frame, internal::RelayMethod::kSet, 1, 1000, std::string(1024, 'x'));
  const uint32_t claimed = 100u << 20;
  std::memcpy(frame.data(), &claimed, sizeof(claimed));
  REQUIRE(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(frame.size()));
  pollfd poll_fd{fd, POLLIN, 0};
  REQUIRE(::poll(&poll_fd, 1, 5000) == 1);
  char byte;
  CHECK(::read(fd, &byte, 1) == 0);
  ::close(fd);
  CHECK(relay->upstream_calls() == 0);
  // And it still serves its ranks.
  CHECK(Join(Through(job, *relay, 0), seconds(10)).ok());
}

TEST_CASE("relay: a connection that never says the token is closed at the admission deadline",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string& name = relay->socket();
  std::memcpy(address.sun_path + 1, name.data() + 1, name.size() - 1);  // "@...": abstract
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address),
                    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) == 0);
  const auto start = std::chrono::steady_clock::now();
  pollfd poll_fd{fd, POLLIN, 0};
  REQUIRE(::poll(&poll_fd, 1, 10000) == 1);  // silent: closed at Admission::kDefaultDeadline
  char byte;
  CHECK(::read(fd, &byte, 1) == 0);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= Admission::kDefaultDeadline - milliseconds(100));
  CHECK(waited < Admission::kDefaultDeadline + seconds(2));
  ::close(fd);
  // And it still serves its ranks.
  CHECK(Join(Through(job, *relay, 0), seconds(10)).ok());
}

TEST_CASE("relay: its connection stays the server's while its ranks take longer than the deadline",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  // The host's joins go as one batch once its four ranks have called, however slowly their
  // threads start (ThreadSanitizer): a window of 30 s, not 2 ms.
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 4, seconds(30));
  // The server says on stderr when it closes connections that proved nothing: capture it while
  // the relay's ranks "start" for longer than the admission deadline.
  char path[] = "/tmp/trainrun-relay-test-XXXXXX";
  const int capture = mkstemp(path);
  REQUIRE(capture >= 0);
  unlink(path);
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  dup2(capture, STDERR_FILENO);
  const bool connected = relay->WaitConnected(seconds(10));
  std::this_thread::sleep_for(Admission::kDefaultDeadline + milliseconds(600));  // sweeps: 100 ms
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string said(1 << 16, '\0');
  const ssize_t length = pread(capture, said.data(), said.size(), 0);
  close(capture);
  said.resize(length > 0 ? static_cast<size_t>(length) : 0);
  CHECK(connected);
  CHECK(said.find("did not prove") == std::string::npos);
  std::vector<absl::Status> statuses =
      OnThreads(4, [&](int r) { return Join(Through(job, *relay, r), seconds(10)).status(); });
  for (const absl::Status& status : statuses) CHECK(status.ok());
  CHECK(relay->upstream_calls() == 1);  // the host's JoinBatch (the Hello is not counted)
}

TEST_CASE("relay: when the relay goes away, its ranks' calls fail naming it",
          "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  std::unique_ptr<Relay> relay = StartRelay(job, "a", 1);
  const std::string socket = relay->socket();
  auto session = Join(Through(job, *relay, 0), seconds(10));
  REQUIRE(session.ok());
  // A call waiting in the server when the relay ends.
  absl::Status waited;
  std::thread waiter([&] { waited = session->store->Get({"never"}, seconds(30)).status(); });
  std::this_thread::sleep_for(milliseconds(200));
  const Clock::time_point start = Clock::now();
  relay.reset();
  waiter.join();
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5);
  INFO(waited);
  CHECK(waited.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(waited, absl::StrCat("the rendezvous relay of host 'a' at ", socket,
                                      " closed the connection during a Get call")));
  // And every later call: nothing listens any more.
  absl::Status later = session->store->Set("k", "v");
  INFO(later);
  CHECK(later.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(later, absl::StrCat("cannot reach the rendezvous relay of host 'a' at ", socket)));
  CHECK(Contains(later, "agent may have died"));
  // The server saw its waiting call cancelled.
  const Clock::time_point until = Clock::now() + seconds(5);
  while (job.server->WaitingCalls() != 0 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  CHECK(job.server->WaitingCalls() == 0);
}

TEST_CASE("relay: an unreachable server is reported by its address", "[rendezvous][relay]") {
  Job job = StartJob(TwoHosts());
  RelayOptions options;
  options.socket = absl::StrCat("@trainrun-relay-test-unreachable-", getpid());
  options.server_address = "127.0.0.1:1";  // nothing listens on port 1
  options.job_id = job.options.job_id;
  options.token = job.options.token;
  options.host = "a";
  options.local_ranks = 1;
  auto relay = Relay::Start(options);
  REQUIRE(relay.ok());
  ClientOptions client = Through(job, **relay, 0);
  client.address = "127.0.0.1:1";
  auto store = ConnectStore(client);
  REQUIRE(store.ok());
  absl::Status set = (*store)->Set("k", "v");
  INFO(set);
  CHECK(set.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(set, "cannot reach the rendezvous server at 127.0.0.1:1"));
}

}  // namespace
}  // namespace trainrun::rendezvous
