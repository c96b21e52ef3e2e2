// The rendezvous server against real clients over 127.0.0.1: ranks as threads, one real worker
// process, raw sockets for garbage.
#include "trainrun/rendezvous/server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc_store.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rank_threads.h"
#include "skip_test.h"
#include "test_job.h"
#include "tls.h"
#include "trainrun/rendezvous/admission.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/generation.h"
#include "wire.h"

extern char** environ;

namespace trainrun::rendezvous {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using testing::Job;
using testing::StartJob;
using ::trainrun::testing::RequireNoFailures;
using ::trainrun::testing::RunRanks;
using ::trainrun::testing::ThreadFailures;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// `-H a:2,b:1`: a gets ranks 0 and 1, b gets rank 2; local_rank 0 lives on both hosts.
std::vector<RankSlot> TwoHostPlan() {
  return {{"a", 0, 2, 0, 2}, {"a", 1, 2, 0, 1}, {"b", 0, 1, 1, 2}};
}

// A channel of its own to `job`'s server, as a worker makes it (TLS with the job's certificate).
std::shared_ptr<grpc::Channel> JobChannel(const Job& job) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      internal::NewChannel(job.server->address(), job.options.token, job.options.tls);
  REQUIRE(channel.ok());
  return *channel;
}

// n ranks on one host.
std::vector<RankSlot> OneHostPlan(int n) {
  std::vector<RankSlot> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back({"localhost", r, n, 0, 1});
  return ranks;
}

TEST_CASE("Server binds port 0 on loopback and reports it", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(1));
  CHECK(job.server->port() > 0);
  CHECK(job.server->address() == absl::StrCat("127.0.0.1:", job.server->port()));

  ServerOptions same = job.options;
  same.port = job.server->port();
  auto second = Server::Start(same);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(second.status(), "--rendezvous-port"));

  ServerOptions no_token = job.options;
  no_token.token.clear();
  CHECK(Server::Start(no_token).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("RandomToken gives a fresh 64-hex-digit secret each time", "[rendezvous]") {
  auto a = RandomToken();
  auto b = RandomToken();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->size() == 64);
  CHECK(a->find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(*a != *b);
}

TEST_CASE("Server and client work over IPv6 loopback", "[rendezvous]") {
  ServerOptions options;
  options.bind_address = "::1";
  options.job_id = "v6";
  options.token = "token";
  options.ranks = OneHostPlan(1);
  auto server = Server::Start(options);
  if (!server.ok()) {
    trainrun::testing::SkipTest(absl::StrCat("no IPv6 loopback here: ", server.status().message()));
  }
  CHECK((*server)->address() == absl::StrCat("[::1]:", (*server)->port()));
  ClientOptions client;
  client.address = (*server)->address();
  client.token = "token";
  client.host = "localhost";
  auto session = Join(client, seconds(10));
  REQUIRE(session.ok());
  CHECK(session->assignment.job_id == "v6");
}

TEST_CASE("Join gives each rank its place in the slot plan", "[rendezvous]") {
  Job job = StartJob(TwoHostPlan());
  std::vector<Assignment> got(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] { got[r] = job.JoinAs(r).assignment; });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    const RankSlot& slot = job.options.ranks[r];
    CHECK(got[r].rank == r);
    CHECK(got[r].size == 3);
    CHECK(got[r].local_rank == slot.local_rank);
    CHECK(got[r].local_size == slot.local_size);
    CHECK(got[r].cross_rank == slot.cross_rank);
    CHECK(got[r].cross_size == slot.cross_size);
    CHECK(got[r].HostOf(0) == "a");
    CHECK(got[r].HostOf(1) == "a");
    CHECK(got[r].HostOf(2) == "b");
    CHECK(got[r].HostOf(3).empty());
    CHECK(got[r].host_names == std::vector<std::string>{"a", "b"});
    CHECK(got[r].job_id == "test-job");
  }
  CHECK(job.server->JoinedRanks() == std::vector<int>{0, 1, 2});
}

TEST_CASE("Join sends the host names encoded once, or one by one to an older worker",
          "[rendezvous]") {
  Job job = StartJob(TwoHostPlan());
  auto stub = proto::Rendezvous::NewStub(JobChannel(job));
  for (int r = 0; r < 2; ++r) {
    grpc::ClientContext context;
    context.AddMetadata("trainrun-job-token", job.options.token);
    context.set_deadline(std::chrono::system_clock::now() + seconds(10));
    proto::JoinRequest request;
    request.set_host(job.options.ranks[r].host);
    request.set_local_rank(job.options.ranks[r].local_rank);
    request.set_host_table(r == 1);  // rank 0 is a worker of a release before the table
    proto::JoinResponse response;
    REQUIRE(stub->Join(&context, request, &response).ok());
    CHECK(response.host_run_hosts_size() == 2);
    if (r == 0) {
      CHECK(response.host_table().empty());
      CHECK(std::vector<std::string>(response.host_names().begin(), response.host_names().end()) ==
            std::vector<std::string>{"a", "b"});
    } else {
      CHECK(response.host_names_size() == 0);
      auto names = internal::DecodeTable(response.host_table());
      REQUIRE(names.ok());
      CHECK(*names == std::vector<std::string>{"a", "b"});
    }
  }
}

TEST_CASE("Join refuses unknown ranks, second joins and a wrong claimed rank", "[rendezvous]") {
  Job job = StartJob(TwoHostPlan());
  ClientOptions nowhere = job.ClientFor(0);
  nowhere.host = "c";
  auto status = Join(nowhere, seconds(5)).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(status, "host 'c'"));

  ClientOptions liar = job.ClientFor(1);
  liar.expected_rank = 2;
  CHECK(Join(liar, seconds(5)).status().code() == absl::StatusCode::kInvalidArgument);

  job.JoinAs(1);
  status = Join(job.ClientFor(1), seconds(5)).status();
  CHECK(status.code() == absl::StatusCode::kAlreadyExists);
  CHECK(Contains(status, "rank 1 already joined"));
  CHECK(job.server->JoinedRanks() == std::vector<int>{1});
}

// HostsOf lists every rank's host, as the join answer's runs give them.
std::vector<std::string> HostsOf(const Assignment& a) {
  std::vector<std::string> hosts;
  for (int r = 0; r < a.size; ++r) hosts.push_back(a.HostOf(r));
  return hosts;
}

TEST_CASE("AddRanks: ranks added while the job runs join by their number on their host",
          "[rendezvous][elastic]") {
  Job job = StartJob(TwoHostPlan());
  // A join before the job grows: the host names the server encoded for it must not stay.
  WorkerSession first = job.JoinAs(0);
  CHECK(first.assignment.host_names == std::vector<std::string>{"a", "b"});
  CHECK(job.server->AddRanks({{"c", 0, 1, 0, 1}, {"c", 1, 1, 0, 1}}) == 3);
  ClientOptions added = job.ClientFor(0);
  added.host = "c";
  added.local_rank = 0;  // its place in a later generation: not how it is found
  added.expected_rank = 4;
  auto session = Join(added, seconds(10));
  REQUIRE(session.ok());
  CHECK(session->assignment.rank == 4);
  CHECK(session->assignment.size == 5);
  CHECK(HostsOf(session->assignment) == std::vector<std::string>{"a", "a", "b", "c", "c"});
  CHECK(job.server->JoinedRanks() == std::vector<int>{0, 4});
  // On another host, the number does not let it in; nor does a number without a host's slot.
  ClientOptions elsewhere = added;
  elsewhere.host = "b";
  elsewhere.expected_rank = 3;
  CHECK(Join(elsewhere, seconds(5)).status().code() == absl::StatusCode::kInvalidArgument);
  ClientOptions unnumbered = added;
  unnumbered.expected_rank = -1;
  CHECK(Join(unnumbered, seconds(5)).status().code() == absl::StatusCode::kNotFound);
  job.server->NoteRankExit(3, "exited with code 1");
  CHECK(job.server->Ranks()[3].exited == "exited with code 1");
  // A rank of the start that joins late is told the start's job, not the grown one.
  WorkerSession late = job.JoinAs(2);
  CHECK(late.assignment.size == 3);
  CHECK(HostsOf(late.assignment) == std::vector<std::string>{"a", "a", "b"});
}

TEST_CASE("A wrong or missing token is refused and changes nothing", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(2));
  for (std::string token : {std::string("wrong"), std::string(), job.options.token + "x",
                            job.options.token.substr(0, 5)}) {
    ClientOptions bad = job.ClientFor(0);
    bad.token = token;
    CHECK(Join(bad, seconds(5)).status().code() == absl::StatusCode::kUnauthenticated);
    auto store = ConnectStore(bad);
    REQUIRE(store.ok());
    CHECK((*store)->Set("k", "v").code() == absl::StatusCode::kUnauthenticated);
    CHECK((*store)->Add("n", 5).status().code() == absl::StatusCode::kUnauthenticated);
    CHECK((*store)->Barrier("b", 1, seconds(1)).code() == absl::StatusCode::kUnauthenticated);
    CHECK((*store)->Get({"k"}, milliseconds(10)).status().code() ==
          absl::StatusCode::kUnauthenticated);
    CHECK((*store)->ReportPeerFailure(0, 1, "x").code() == absl::StatusCode::kUnauthenticated);
  }
  CHECK(job.server->JoinedRanks().empty());
  CHECK(job.server->PeerFailures().empty());
  WorkerSession good = job.JoinAs(0);
  CHECK(good.store->Get({"k"}, milliseconds(50)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  auto n = good.store->Add("n", 0);
  REQUIRE(n.ok());
  CHECK(*n == 0);
  // A barrier of one passes at once: the refused calls did not enter it.
  CHECK(good.store->Barrier("b", 2, milliseconds(50)).code() ==
        absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("A client that finishes the TLS handshake without the token is refused and cut off",
          "[rendezvous]") {
  Job job = StartJob(OneHostPlan(1));
  // The server asks no certificate of a client, so anyone can finish a handshake; this stranger
  // even trusts the job's certificate, but it has no token to send.
  absl::StatusOr<internal::JobCertificate> cert = internal::MakeJobCertificate(job.options.token);
  REQUIRE(cert.ok());
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = cert->cert_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(internal::kTlsServerName);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(job.server->address(), grpc::SslCredentials(tls), args);
  auto stub = proto::Rendezvous::NewStub(channel);
  const Clock::time_point dialed = Clock::now();
  for (const char* token : {"", "wrong"}) {
    grpc::ClientContext context;
    if (*token != '\0') context.AddMetadata(internal::kTokenMetadata, token);
    context.set_deadline(std::chrono::system_clock::now() + seconds(5));
    proto::HelloResponse answer;
    CHECK(stub->Hello(&context, proto::HelloRequest(), &answer).error_code() ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
  REQUIRE(channel->GetState(false) == GRPC_CHANNEL_READY);  // the handshake itself passed
  {
    // A message larger than the server takes at all: it is refused for the token, as its headers
    // arrive, not for its size, which the server would learn only by reading it.
    proto::SetRequest large;
    large.set_key("k");
    large.set_value(std::string(60 << 20, 'x'));
    grpc::ClientContext context;
    context.AddMetadata(internal::kTokenMetadata, "wrong");
    context.set_deadline(std::chrono::system_clock::now() + seconds(5));
    proto::SetResponse answer;
    grpc::Status status = stub->Set(&context, large, &answer);
    CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(status.error_message().find("token") != std::string::npos);
  }
  // Nothing proved the token on this connection: the server closes it at the admission deadline
  // from its accept (the listener looks every 100 ms).
  const Clock::time_point bar = dialed + Admission::kDefaultDeadline + seconds(1);
  while (channel->GetState(false) == GRPC_CHANNEL_READY && Clock::now() < bar) {
    channel->WaitForStateChange(GRPC_CHANNEL_READY,
                                std::chrono::system_clock::now() + milliseconds(100));
  }
  CHECK(channel->GetState(false) != GRPC_CHANNEL_READY);
  // The job goes on.
  WorkerSession good = job.JoinAs(0);
  CHECK(good.store->Set("k", "v").ok());
}

TEST_CASE("Put, get, add and barrier across ranks", "[rendezvous]") {
  constexpr int kRanks = 8;
  Job job = StartJob(OneHostPlan(kRanks));
  std::vector<std::vector<std::string>> seen(kRanks);
  std::vector<int64_t> counts(kRanks);
  ThreadFailures failures([&] { job.server->Shutdown(); });
  RunRanks(kRanks, failures, [&](int r) {
    const std::string rank = absl::StrCat("rank ", r);
    absl::StatusOr<WorkerSession> s = job.TryJoinAs(r);
    if (!failures.ExpectOk(s.status(), rank + " joins")) return;
    if (!failures.ExpectOk(
            s->store->Set(absl::StrCat("addr/", r), absl::StrCat("10.0.0.", r, ":1234")),
            rank + "'s Set")) {
      return;
    }
    std::vector<std::string> keys;
    for (int p = 0; p < kRanks; ++p) keys.push_back(absl::StrCat("addr/", p));
    auto values = s->store->Get(keys, seconds(10));
    if (!failures.ExpectOk(values.status(), rank + "'s Get")) return;
    seen[r] = *values;
    if (!failures.ExpectOk(s->store->Add("arrived", 1).status(), rank + "'s Add") ||
        !failures.ExpectOk(s->store->Barrier("after-add", kRanks, seconds(10)),
                           rank + "'s barrier")) {
      return;
    }
    auto total = s->store->Add("arrived", 0);
    if (!failures.ExpectOk(total.status(), rank + "'s second Add")) return;
    counts[r] = *total;
  });
  RequireNoFailures(failures);
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(seen[r].size() == kRanks);
    for (int p = 0; p < kRanks; ++p) CHECK(seen[r][p] == absl::StrCat("10.0.0.", p, ":1234"));
    CHECK(counts[r] == kRanks);
  }
}

TEST_CASE("A waiting get is released exactly when its last key lands", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(2));
  WorkerSession waiter = job.JoinAs(0);
  WorkerSession setter = job.JoinAs(1);
  std::atomic<bool> released{false};
  Clock::time_point released_at;
  ThreadFailures failures([&] { job.server->Shutdown(); });
  std::thread t([&] {
    auto values = waiter.store->Get({"x", "y", "x"}, seconds(20));
    released_at = Clock::now();
    released = true;
    if (!failures.ExpectOk(values.status(), "the waiting Get")) return;
    failures.Expect(*values == std::vector<std::string>{"1", "2", "1"}, "its values in order");
  });
  std::this_thread::sleep_for(milliseconds(200));
  REQUIRE(setter.store->Set("x", "1").ok());
  std::this_thread::sleep_for(milliseconds(300));
  CHECK_FALSE(released.load());
  const Clock::time_point set_at = Clock::now();
  REQUIRE(setter.store->Set("y", "2").ok());
  t.join();
  RequireNoFailures(failures);
  CHECK(released.load());
  CHECK(released_at >= set_at);
  CHECK(released_at - set_at < milliseconds(200));
}

TEST_CASE("ShareFromRoot through the server", "[rendezvous]") {
  constexpr int kRanks = 4;
  Job job = StartJob(OneHostPlan(kRanks));
  std::vector<std::string> got(kRanks);
  ThreadFailures failures([&] { job.server->Shutdown(); });
  RunRanks(kRanks, failures, [&](int r) {
    absl::StatusOr<WorkerSession> s = job.TryJoinAs(r);
    if (!failures.ExpectOk(s.status(), absl::StrCat("rank ", r, " joins"))) return;
    auto blob = ShareFromRoot(
        *s->store, "nccl/world/0", r, 0, [] { return std::string(128, '\x7f'); }, seconds(10));
    if (!failures.ExpectOk(blob.status(), absl::StrCat("rank ", r, "'s ShareFromRoot"))) return;
    got[r] = *blob;
  });
  RequireNoFailures(failures);
  for (const auto& blob : got) CHECK(blob == std::string(128, '\x7f'));
}

TEST_CASE("A timed-out wait names the ranks that never arrived", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(4));
  WorkerSession r0 = job.JoinAs(0);
  WorkerSession r1 = job.JoinAs(1);
  job.server->NoteRankExit(3, "exited with code 1");

  ThreadFailures failures;
  std::thread other([&] {
    failures.Expect(!r1.store->Barrier("start", 4, milliseconds(400)).ok(),
                    "the other rank's barrier fails too");
  });
  const auto start = Clock::now();
  absl::Status barrier = r0.store->Barrier("start", 4, milliseconds(400));
  const auto elapsed = Clock::now() - start;
  other.join();
  RequireNoFailures(failures);
  CHECK(barrier.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(elapsed >= milliseconds(400));
  CHECK(elapsed < milliseconds(1500));
  INFO(barrier.message());
  CHECK(Contains(barrier, "timed out after 400 ms in barrier 'start': 2 of 4 arrived"));
  CHECK(Contains(barrier, "waiting for ranks 2, 3"));
  CHECK(Contains(barrier, "ranks 2, 3 have not joined"));
  CHECK(Contains(barrier, "rank 3 exited with code 1"));

  auto get = r0.store->Get({"addr/0", "addr/3"}, milliseconds(100));
  REQUIRE(get.status().code() == absl::StatusCode::kDeadlineExceeded);
  INFO(get.status().message());
  CHECK(Contains(get.status(), "waiting for keys 'addr/0', 'addr/3'"));
  CHECK(Contains(get.status(), "rank 3 exited with code 1"));
  CHECK(job.server->WaitingCalls() == 0);
}

TEST_CASE("Keys and values past the limits are refused naming the limit", "[rendezvous]") {
  ServerLimits limits;
  limits.max_value_bytes = 1000;
  limits.max_keys_per_get = 10;
  Job job = StartJob(OneHostPlan(1), limits);
  WorkerSession s = job.JoinAs(0);
  absl::Status status = s.store->Set(std::string(1025, 'k'), "v");
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "limit of 1024 bytes"));
  status = s.store->Set("k", std::string(1001, 'v'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "limit of 1000 bytes"));
  status = s.store->Get(std::vector<std::string>(11, "k"), seconds(1)).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(status, "limit of 10 keys"));
  CHECK(s.store->Set("", "v").code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.store->Set("k", std::string(1000, 'v')).ok());
}

TEST_CASE("Peer-failure reports reach the launcher", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(3));
  WorkerSession s = job.JoinAs(2);
  REQUIRE(s.store->ReportPeerFailure(2, 0, "connection to rank 0 was reset").ok());
  CHECK(s.store->ReportPeerFailure(7, 0, "x").code() == absl::StatusCode::kInvalidArgument);
  auto failures = job.server->PeerFailures();
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].rank == 2);
  CHECK(failures[0].peer_rank == 0);
  CHECK(failures[0].message == "connection to rank 0 was reset");
}

// WaitUntil polls `condition` for up to 10 s.
template <typename Condition>
bool WaitUntil(Condition condition) {
  const auto until = Clock::now() + seconds(10);
  while (!condition()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// ThreadCount is the number of threads in this process.
int ThreadCount() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

// Callback-API calls, so a test can hold a thousand waits without a thousand threads.
struct PendingGets {
  std::mutex mutex;
  std::condition_variable done;
  int finished = 0;
  std::vector<grpc::StatusCode> codes;
  std::deque<grpc::ClientContext> contexts;
  std::deque<proto::GetRequest> requests;
  std::deque<proto::GetResponse> responses;

  void Start(proto::Rendezvous::Stub& stub, const Job& job, const std::string& key) {
    grpc::ClientContext& context = contexts.emplace_back();
    context.AddMetadata("trainrun-job-token", job.options.token);
    context.set_deadline(std::chrono::system_clock::now() + seconds(60));
    proto::GetRequest& request = requests.emplace_back();
    request.add_keys(key);
    request.set_timeout_ms(50000);
    request.set_rank(-1);
    proto::GetResponse& response = responses.emplace_back();
    stub.async()->Get(&context, &request, &response, [this](grpc::Status status) {
      std::lock_guard<std::mutex> lock(mutex);
      codes.push_back(status.error_code());
      ++finished;
      done.notify_all();
    });
  }
  bool WaitFor(int n, seconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    return done.wait_for(lock, timeout, [&] { return finished >= n; });
  }
};

TEST_CASE("1000 concurrent waiting calls all complete", "[rendezvous]") {
  constexpr int kWaiters = 1000;
  Job job = StartJob(OneHostPlan(1));
  std::vector<std::unique_ptr<proto::Rendezvous::Stub>> stubs;
  for (int c = 0; c < 4; ++c) {
    stubs.push_back(proto::Rendezvous::NewStub(JobChannel(job)));  // a connection each
  }
  const int threads_before = ThreadCount();
  PendingGets gets;
  for (int i = 0; i < kWaiters; ++i) gets.Start(*stubs[i % stubs.size()], job, "go");
  std::this_thread::sleep_for(milliseconds(300));
  {
    std::lock_guard<std::mutex> lock(gets.mutex);
    CHECK(gets.finished == 0);
  }
  // The server holds a reactor per waiting call, not a thread.
  CHECK(ThreadCount() < threads_before + 32);
  REQUIRE(job.JoinAs(0).store->Set("go", "now").ok());
  REQUIRE(gets.WaitFor(kWaiters, seconds(30)));
  for (grpc::StatusCode code : gets.codes) CHECK(code == grpc::StatusCode::OK);
  for (const auto& response : gets.responses) {
    REQUIRE(response.value_ends_size() == 1);
    CHECK(response.values() == "now");
  }
}

TEST_CASE("Waiting calls past the limit are refused, not queued", "[rendezvous]") {
  ServerLimits limits;
  limits.max_waiters = 5;
  Job job = StartJob(OneHostPlan(1), limits);
  auto stub = proto::Rendezvous::NewStub(JobChannel(job));
  PendingGets gets;
  for (int i = 0; i < 5; ++i) gets.Start(*stub, job, "k");
  WorkerSession s = job.JoinAs(0);
  REQUIRE(WaitUntil([&] { return job.server->WaitingCalls() == 5; }));
  absl::Status refused = s.store->Get({"k"}, seconds(1)).status();
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(refused, "over 5 calls are waiting"));
  REQUIRE(s.store->Set("k", "v").ok());
  REQUIRE(gets.WaitFor(5, seconds(10)));
  for (grpc::StatusCode code : gets.codes) CHECK(code == grpc::StatusCode::OK);
}

TEST_CASE("Cancelled waits leave the others undisturbed", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(1));
  auto stub = proto::Rendezvous::NewStub(JobChannel(job));
  PendingGets cancelled, kept;
  for (int i = 0; i < 200; ++i) cancelled.Start(*stub, job, i % 2 ? "k" : "other");
  for (int i = 0; i < 50; ++i) kept.Start(*stub, job, "k");
  std::this_thread::sleep_for(milliseconds(200));
  REQUIRE(WaitUntil([&] { return job.server->WaitingCalls() == 250; }));
  for (auto& context : cancelled.contexts) context.TryCancel();
  REQUIRE(cancelled.WaitFor(200, seconds(10)));
  for (grpc::StatusCode code : cancelled.codes) CHECK(code == grpc::StatusCode::CANCELLED);
  // The server let go of every cancelled call.
  REQUIRE(WaitUntil([&] { return job.server->WaitingCalls() == 50; }));
  WorkerSession s = job.JoinAs(0);
  REQUIRE(s.store->Set("k", "v").ok());
  REQUIRE(s.store->Set("other", "v").ok());
  REQUIRE(kept.WaitFor(50, seconds(10)));
  for (grpc::StatusCode code : kept.codes) CHECK(code == grpc::StatusCode::OK);
  CHECK(job.server->WaitingCalls() == 0);
}

TEST_CASE("A worker killed mid-wait does not disturb the others", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(2));
  const std::string port = std::to_string(job.server->port());
  std::vector<std::string> env = {
      "TRAINRUN_RENDEZVOUS_ADDR=" + job.server->address(),
      "TRAINRUN_JOB_ID=" + job.options.job_id,
      "TRAINRUN_JOB_TOKEN=" + job.options.token,
      "TRAINRUN_HOSTNAME=localhost",
      "TRAINRUN_LOCAL_RANK=1",
      "TRAINRUN_RANK=1",
      "TRAINRUN_TIMEOUT=60",
  };
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char program[] = TRAINRUN_BARRIER_EXAMPLE;
  char* argv[] = {program, nullptr};
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, program, nullptr, nullptr, argv, envp.data()) == 0);
  // Rank 1 joins and then waits in its barrier (which needs rank 0).
  const auto until = Clock::now() + seconds(20);
  while (job.server->JoinedRanks().empty() && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  REQUIRE(job.server->JoinedRanks() == std::vector<int>{1});
  std::this_thread::sleep_for(milliseconds(200));
  int wstatus = 0;
  REQUIRE(waitpid(pid, &wstatus, WNOHANG) == 0);  // still waiting
  WorkerSession r0 = job.JoinAs(0);
  ThreadFailures failures([&] { job.server->Shutdown(); });
  std::thread waiter([&] {
    auto values = r0.store->Get({"after"}, seconds(20));
    if (!failures.ExpectOk(values.status(), "rank 0's Get")) return;
    failures.Expect((*values)[0] == "kill", "rank 0 gets the value set after the kill");
  });
  REQUIRE(WaitUntil([&] { return job.server->WaitingCalls() == 2; }));
  REQUIRE(kill(pid, SIGKILL) == 0);
  REQUIRE(waitpid(pid, &wstatus, 0) == pid);
  CHECK(WIFSIGNALED(wstatus));
  // The dead worker's barrier call is dropped; rank 0's Get still waits.
  CHECK(WaitUntil([&] { return job.server->WaitingCalls() == 1; }));
  std::this_thread::sleep_for(milliseconds(200));
  REQUIRE(r0.store->Set("after", "kill").ok());
  waiter.join();
  RequireNoFailures(failures);
  // The killed rank had entered the barrier, so rank 0 completes it.
  CHECK(r0.store->Barrier("barrier_example", 2, seconds(5)).ok());
}

TEST_CASE("Garbage on the port does not hurt the server", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(1));
  std::mt19937 random(42);
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(job.server->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    std::string junk = attempt == 0 ? "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
                       : attempt == 1
                           ? "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + std::string(100, '\xff')
                           : std::string(1 + random() % 65536, '\0');
    if (attempt > 1) {
      for (char& c : junk) c = static_cast<char>(random());
    }
    (void)send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buffer[4096];
    while (recv(fd, buffer, sizeof(buffer), 0) > 0) {
    }
    close(fd);
  }
  WorkerSession s = job.JoinAs(0);
  REQUIRE(s.store->Set("still", "alive").ok());
  auto values = s.store->Get({"still"}, seconds(5));
  REQUIRE(values.ok());
  CHECK((*values)[0] == "alive");
}

TEST_CASE("Shutdown releases waiting calls with UNAVAILABLE", "[rendezvous]") {
  Job job = StartJob(OneHostPlan(1));
  WorkerSession s = job.JoinAs(0);
  ThreadFailures failures;
  std::thread waiter([&] {
    auto values = s.store->Get({"never"}, seconds(30));
    failures.Expect(
        values.status().code() == absl::StatusCode::kUnavailable,
        absl::StrCat("the waiting Get ends UNAVAILABLE, not ", values.status().ToString()));
  });
  std::this_thread::sleep_for(milliseconds(200));
  const auto start = Clock::now();
  job.server->Shutdown();
  waiter.join();
  RequireNoFailures(failures);
  CHECK(Clock::now() - start < seconds(5));
}

TEST_CASE("JoinFromEnvironment reads the worker's environment", "[rendezvous]") {
  Job job = StartJob(TwoHostPlan());
  unsetenv("TRAINRUN_RENDEZVOUS_ADDR");
  auto missing = JoinFromEnvironment(seconds(1));
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(missing.status(), "TRAINRUN_RENDEZVOUS_ADDR"));
  setenv("TRAINRUN_RENDEZVOUS_ADDR", job.server->address().c_str(), 1);
  setenv("TRAINRUN_JOB_ID", "test-job", 1);
  setenv("TRAINRUN_JOB_TOKEN", job.options.token.c_str(), 1);
  setenv("TRAINRUN_HOSTNAME", "b", 1);
  setenv("TRAINRUN_LOCAL_RANK", "0", 1);
  setenv("TRAINRUN_RANK", "2", 1);
  auto session = JoinFromEnvironment(seconds(10));
  for (const char* name : {"TRAINRUN_RENDEZVOUS_ADDR", "TRAINRUN_JOB_ID", "TRAINRUN_JOB_TOKEN",
                           "TRAINRUN_HOSTNAME", "TRAINRUN_LOCAL_RANK", "TRAINRUN_RANK"}) {
    unsetenv(name);
  }
  REQUIRE(session.ok());
  CHECK(session->assignment.rank == 2);
  CHECK(session->assignment.cross_rank == 1);
}

TEST_CASE("An unreachable server is reported by address within the deadline", "[rendezvous]") {
  int port = 0;
  {
    Job job = StartJob(OneHostPlan(1));
    port = job.server->port();
  }
  ClientOptions client;
  client.address = absl::StrCat("127.0.0.1:", port);
  client.token = "t";
  client.host = "localhost";
  const auto start = Clock::now();
  auto session = Join(client, milliseconds(500));
  CHECK(Clock::now() - start < seconds(3));
  REQUIRE_FALSE(session.ok());
  CHECK(Contains(session.status(), client.address));
}

TEST_CASE("a worker waiting for the next generation gets it when the launcher publishes it",
          "[rendezvous][elastic]") {
  Job job = StartJob(TwoHostPlan());
  WorkerSession worker = job.JoinAs(2);
  auto latest = LatestGeneration(*worker.store);
  REQUIRE(latest.ok());
  CHECK(*latest == 0);
  absl::StatusOr<Generation> got;
  std::thread waiter([&] { got = WaitForGeneration(*worker.store, 1, seconds(10)); });
  std::this_thread::sleep_for(milliseconds(50));
  Generation next;
  next.number = 1;
  next.members = {{0, "a"}, {2, "b"}};  // rank 1 of host a was lost
  REQUIRE(job.server->Set(GenerationKey(1), next.Encode()).ok());
  job.server->SetCounter(kLatestGenerationKey, 1);
  waiter.join();
  REQUIRE(got.ok());
  CHECK(got->number == 1);
  std::optional<RankPlace> place = got->PlaceOf(2);
  REQUIRE(place.has_value());
  CHECK(place->rank == 1);
  CHECK(place->size == 2);
  CHECK(place->local_rank == 0);
  CHECK(place->local_size == 1);
  CHECK(place->cross_rank == 1);
  CHECK(place->cross_size == 2);
  CHECK_FALSE(got->PlaceOf(1).has_value());
  // A worker that comes late, after generation 2 too, goes to the newest at once.
  next.number = 2;
  next.members = {{2, "b"}};
  REQUIRE(job.server->Set(GenerationKey(2), next.Encode()).ok());
  job.server->SetCounter(kLatestGenerationKey, 2);
  auto newest = WaitForGeneration(*worker.store, 1, milliseconds(1));
  REQUIRE(newest.ok());
  CHECK(newest->number == 2);
  CHECK(newest->PlaceOf(2)->rank == 0);
}

TEST_CASE("a generation's text is checked", "[rendezvous][elastic]") {
  CHECK(Generation::Decode(1, "0 a\n3 b\n").ok());
  CHECK_FALSE(Generation::Decode(1, "").ok());
  CHECK_FALSE(Generation::Decode(1, "0 a\n0 b\n").ok());
  auto bad = Generation::Decode(4, "x a\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.status(), "generation 4 has a malformed member line 'x a'"));
  // Local places follow the members' hosts in rank order.
  auto mixed = Generation::Decode(1, "0 a\n1 b\n4 a\n");
  REQUIRE(mixed.ok());
  CHECK(mixed->PlaceOf(4)->rank == 2);
  CHECK(mixed->PlaceOf(4)->local_rank == 1);
  CHECK(mixed->PlaceOf(4)->local_size == 2);
  CHECK(mixed->PlaceOf(4)->cross_size == 1);
  CHECK(mixed->PlaceOf(1)->cross_rank == 1);
}

}  // namespace
}  // namespace trainrun::rendezvous
