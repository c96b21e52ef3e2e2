// Failure behaviour: strangers on the data port, a peer that goes away, a peer that stalls, and a
// real process killed with SIGKILL mid-allreduce.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "handshake.h"
#include "socket.h"
#include "spawn.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/rendezvous/file_store.h"
#include "trainrun/rendezvous/generation.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// ReapWithin waits for every child until `deadline`, then SIGKILLs and reaps the ones still
// running. It returns each child's wait status (-1 for one it had to kill) and sets `*left` to how
// many it had to kill.
std::vector<int> ReapWithin(const std::vector<pid_t>& children, Clock::time_point deadline,
                            int* left) {
  const int n = static_cast<int>(children.size());
  std::vector<int> status(n, -1);
  *left = n;
  while (*left > 0 && Clock::now() < deadline) {
    for (int r = 0; r < n; ++r) {
      int s = 0;
      if (status[r] == -1 && ::waitpid(children[r], &s, WNOHANG) == children[r]) {
        status[r] = s;
        --*left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < n; ++r) {
    if (status[r] == -1) {
      ::kill(children[r], SIGKILL);
      ::waitpid(children[r], nullptr, 0);
    }
  }
  return status;
}
using testing::Spawn;

CommunicatorOptions WithToken(const std::string& token) {
  CommunicatorOptions options;
  options.job_token = token;
  options.job_id = "job-1";
  options.timeout = std::chrono::seconds(20);
  return options;
}

TEST_CASE("strangers on the data port are dropped and the collective still succeeds", "[hostile]") {
  auto store = std::make_shared<rendezvous::MemoryStore>();
  const int n = 3;
  std::vector<std::exception_ptr> errors(n);
  std::vector<float> sums(n, 0);
  auto rank_main = [&](int rank) {
    try {
      Communicator comm(store, rank, n, WithToken("secret"));
      float x = static_cast<float>(rank + 1);
      comm.Allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
      sums[rank] = x;
    } catch (...) {
      errors[rank] = std::current_exception();
    }
  };
  // Rank 0 listens first; the strangers reach its port before ranks 1 and 2 exist.
  std::thread rank0(rank_main, 0);
  auto address = store->Get({"collectives/world/addr/0"}, std::chrono::seconds(10));
  REQUIRE(address.ok());
  auto target = internal::SocketAddress::Parse((*address)[0]);
  auto deadline = Clock::now() + std::chrono::seconds(5);

  // Garbage instead of a handshake.
  internal::Fd garbage = internal::Connect(target, 0, deadline);
  const std::string junk(200, '\x7f');
  internal::WriteFull(garbage.get(), junk.data(), junk.size(), deadline);
  // A well-formed handshake with the wrong token: refused, and the stranger can tell.
  internal::Fd impostor = internal::Connect(target, 0, deadline);
  internal::HandshakeParams wrong{"not-the-secret", "job-1", "world", n, 2};
  CHECK_THROWS_AS(internal::HandshakeConnect(impostor.get(), wrong, 1, 0, 0, deadline), IoError);
  // The right token for another job: refused as well.
  internal::Fd other_job = internal::Connect(target, 0, deadline);
  internal::HandshakeParams other{"secret", "job-2", "world", n, 2};
  CHECK_THROWS_AS(internal::HandshakeConnect(other_job.get(), other, 1, 0, 0, deadline), IoError);
  // One that connects and says nothing must not hold up the others.
  internal::Fd silent = internal::Connect(target, 0, deadline);

  auto start = Clock::now();
  std::thread rank1(rank_main, 1), rank2(rank_main, 2);
  rank0.join();
  rank1.join();
  rank2.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  CHECK(sums == std::vector<float>{6, 6, 6});
  CHECK(Clock::now() - start < std::chrono::seconds(5));
}

// FirstNamed is the rank a rank's error message blames: the first "rank N" after its own
// "rank R: " ("rank 1: rank 2 moved no data ...", "rank 1: no progress from rank 2 ...", "rank 1:
// rank 2 failed, as rank 0 reports ..."); -1 when there is none.
int FirstNamed(const std::string& message, int rank) {
  const std::string own = "rank " + std::to_string(rank) + ": ";
  if (message.rfind(own, 0) != 0) return -1;
  const size_t at = message.find("rank ", own.size());
  if (at == std::string::npos) return -1;
  return std::atoi(message.c_str() + at + 5);
}

// Runs `n` ranks as threads; each returns the message of the error it got, or "" for none.
std::vector<std::string> RunFailing(int n, const std::function<void(int, Communicator&)>& body,
                                    CommunicatorOptions options) {
  std::vector<std::string> messages(n);
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n, options);
    try {
      body(rank, comm);
    } catch (const Error& e) {
      messages[rank] = e.what();
    }
  });
  return messages;
}

TEST_CASE("a peer leaving mid-allreduce makes the others raise naming it", "[failure]") {
  const int n = 4, victim = 2;
  std::vector<float> data(1 << 20, 1.0f);
  auto start = Clock::now();
  auto messages = RunFailing(
      n,
      [&](int rank, Communicator& comm) {
        std::vector<float> mine = data;
        for (int i = 0; i < 1000; ++i) {
          if (rank == victim && i == 3) throw Error("victim leaves");  // closes its connections
          comm.Allreduce(mine.data(), mine.size(), DataType::kFloat32, ReduceOp::kSum);
        }
      },
      WithToken("t"));
  CHECK(Clock::now() - start < std::chrono::seconds(10));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    if (r == victim) continue;
    CHECK(messages[r].find("rank 2") != std::string::npos);
  }
}

TEST_CASE("a stalled peer makes the others time out naming it", "[failure]") {
  const int n = 3, staller = 2;
  CommunicatorOptions options = WithToken("t");
  options.timeout = std::chrono::milliseconds(1000);
  std::vector<Clock::duration> took(n);
  // One int per rank, each written by its own thread (vector<bool>'s bits share a word: a race).
  std::vector<int> timed_out(n, 0);
  auto messages = RunFailing(
      n,
      [&](int rank, Communicator& comm) {
        std::vector<float> x(1 << 18, 1.0f);
        if (rank == staller) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        auto start = Clock::now();
        try {
          comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
        } catch (const TimeoutError&) {
          timed_out[rank] = 1;
          took[rank] = Clock::now() - start;
          throw;
        } catch (const IoError&) {
          took[rank] = Clock::now() - start;
          throw;
        }
      },
      options);
  CHECK((timed_out[0] != 0 || timed_out[1] != 0));
  // Over TCP the call records travel by recursive doubling with ranks 0 and 1 folded into one:
  // rank 1 waits on the staller, rank 0 on rank 1. Whoever times out first asks the others whom
  // they wait on, so both name the staller, the one rank in no collective, whether in their own
  // timeout or in the other's abort (over shared memory, a rank blamed passes the blame on).
  INFO("rank 0: " << messages[0] << "\nrank 1: " << messages[1]);
  for (int r = 0; r < n; ++r) {
    if (r == staller) continue;
    CHECK(FirstNamed(messages[r], r) == staller);
    CHECK(took[r] < std::chrono::milliseconds(2400));
  }
}

TEST_CASE("a timeout names the stalled rank, not a peer that waits on it in the collective",
          "[failure]") {
  // 4 ranks over TCP: rank 0 never calls the allreduce (stopped, or stuck outside the
  // collectives); rank 1 calls it late. The records' recursive doubling pairs 0-1 and 2-3, then
  // 0-2 and 1-3, so rank 3 waits on rank 1 from its first step on, before rank 1 even starts
  // waiting on rank 0, and times out first. Rank 1 is alive and waits inside the collective: every
  // rank must still name rank 0, a small allreduce (records and data in the same frames) and a
  // large one (records first, then the ring) alike.
  const size_t count = GENERATE(size_t{4}, size_t{1} << 18);
  const int n = 4, staller = 0, late = 1;
  CommunicatorOptions options = WithToken("t");
  options.transport = "tcp";
  options.timeout = std::chrono::milliseconds(1000);
  std::vector<Clock::duration> took(n);
  auto messages = RunFailing(
      n,
      [&](int rank, Communicator& comm) {
        std::vector<float> x(count, 1.0f);
        if (rank == staller) {
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
          return;
        }
        if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(400));
        auto start = Clock::now();
        try {
          comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
        } catch (const Error&) {
          took[rank] = Clock::now() - start;
          throw;
        }
      },
      options);
  for (int r = 0; r < n; ++r) {
    if (r == staller) continue;
    INFO("count " << count << ", rank " << r << ": " << messages[r]);
    CHECK(FirstNamed(messages[r], r) == staller);
    CHECK(took[r] < std::chrono::milliseconds(2500));
  }
  // Rank 3 worked it out itself, or learnt it from a rank that did (an abort naming rank 0).
  CHECK((messages[3].find("waited on rank 1, which waits in the collective for rank 0") !=
             std::string::npos ||
         messages[3].find("rank 0 failed, as rank ") != std::string::npos));
}

// A start-up that cannot finish (a peer never comes, or stops half-way) ends as soon as
// CommunicatorOptions::interrupt says so, wherever it waits: in the store (the address gather, the
// same-host check), connecting (a listener that never answers the handshake) or accepting (a peer
// that published its address and never connects).
TEST_CASE("a communicator's start-up gives up when its interrupt says so", "[failure][elastic]") {
  const std::string stuck = GENERATE("absent tcp", "absent shm", "silent listener", "no connect");
  const int n = 3;
  // The fake rank: absent, or one that published the address of a socket nobody serves.
  const int fake = stuck == "silent listener" ? 0 : 2;
  auto store = std::make_shared<rendezvous::MemoryStore>();
  internal::SocketAddress bound;
  internal::Fd listener = internal::Listen("127.0.0.1", 0, &bound);
  if (stuck == "silent listener" || stuck == "no connect") {
    REQUIRE(store->Set("collectives/world/addr/" + std::to_string(fake), bound.ToString()).ok());
  }
  std::atomic<bool> lost{false};
  CommunicatorOptions options = WithToken("t");
  options.transport = stuck == "absent shm" ? "shm" : "tcp";
  options.interrupt = [&lost] { return lost.load(); };
  std::vector<std::string> messages(n);
  std::vector<Clock::duration> took(n);
  std::vector<std::thread> ranks;
  const auto start = Clock::now();
  for (int rank = 0; rank < n; ++rank) {
    if (rank == fake) continue;
    ranks.emplace_back([&, rank] {
      try {
        Communicator comm(store, rank, n, options);
        messages[rank] = "started";
      } catch (const IoError& e) {
        messages[rank] = e.what();
      } catch (const Error& e) {
        messages[rank] = std::string("not an IoError: ") + e.what();
      }
      took[rank] = Clock::now() - start;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  lost = true;
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < n; ++rank) {
    if (rank == fake) continue;
    INFO(stuck << ", rank " << rank << ": " << messages[rank]);
    CHECK(messages[rank].find("interrupted") != std::string::npos);
    // The timeout is 20 s: the interrupt is asked every 100 ms.
    CHECK(took[rank] < std::chrono::seconds(3));
  }
}

TEST_CASE("a rank killed with SIGKILL mid-allreduce: the others raise promptly naming it",
          "[failure][process]") {
  const int n = 3, victim = 1;
  char dir[] = "/tmp/trainrun-collectives-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 3;
      try {
        auto store = std::make_shared<rendezvous::FileStore>(dir);
        Communicator comm(store, rank, n, WithToken("t"));
        std::vector<float> x(1 << 20, 1.0f);
        for (int i = 0; i < 100000; ++i) {
          if (rank == victim && i == 5) ::raise(SIGKILL);
          comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
        }
      } catch (const IoError& e) {
        std::ofstream(std::string(dir) + "/error." + std::to_string(rank)) << e.what();
        code = 0;
      } catch (...) {
        code = 4;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  // Every child must end on its own within the bound; any straggler is killed and fails the test.
  auto deadline = Clock::now() + std::chrono::seconds(20);
  int left = 0;
  const std::vector<int> status = ReapWithin(children, deadline, &left);
  REQUIRE(left == 0);
  CHECK(WIFSIGNALED(status[victim]));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    CHECK(WIFEXITED(status[r]));
    CHECK(WEXITSTATUS(status[r]) == 0);
    std::ifstream in(std::string(dir) + "/error." + std::to_string(r));
    std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO("rank " << r << ": " << message);
    CHECK(message.find("rank 1") != std::string::npos);
  }
  CHECK(std::system((std::string("rm -rf ") + dir).c_str()) == 0);
}

// Elastic training's data-plane contract: a rank killed mid-allreduce makes every survivor raise
// (never hang), over TCP and over shared memory, and the survivors then connect again as the next
// generation (generation.h: new ranks and size, a communicator of their own) and go on.
TEST_CASE("survivors of a SIGKILL mid-allreduce raise, then go on as the next generation",
          "[failure][process][elastic]") {
  const std::string transport = GENERATE("tcp", "shm");
  const int n = 4, victim = 2;
  char dir[] = "/tmp/trainrun-elastic-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 3;
      try {
        auto store = std::make_shared<rendezvous::FileStore>(dir);
        CommunicatorOptions options = WithToken("t");
        options.transport = transport;
        std::vector<float> x(1 << 18, 1.0f);
        try {
          Communicator comm(store, rank, n, options);
          for (int i = 0; i < 100000; ++i) {
            if (rank == victim && i == 5) ::raise(SIGKILL);
            comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
          }
        } catch (const IoError&) {
          code = 5;  // raised as it should; now the next generation
        }
        if (code == 5) {
          // The launcher's part, played by rank 0: publish generation 1 of the survivors.
          if (rank == 0) {
            rendezvous::Generation next;
            next.number = 1;
            for (int slot = 0; slot < n; ++slot) {
              if (slot != victim) next.members.push_back({slot, "localhost"});
            }
            (void)store->Set(rendezvous::GenerationKey(1), next.Encode());
            (void)store->Add(rendezvous::kLatestGenerationKey, 1);
          }
          auto generation = rendezvous::WaitForGeneration(*store, 1, std::chrono::seconds(20));
          if (!generation.ok()) ::_exit(6);
          std::optional<RankInfo> place = generation->PlaceOf(rank);
          if (!place) ::_exit(7);
          options.name = "world.g1";
          Communicator comm(store, *place, options);
          float one = 1.0f;
          comm.Allreduce(&one, 1, DataType::kFloat32, ReduceOp::kSum);
          code = (one == static_cast<float>(n - 1) && comm.size() == n - 1 &&
                  std::string(comm.transport()) == transport)
                     ? 0
                     : 8;
        }
      } catch (...) {
        code = 4;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  int left = 0;
  const std::vector<int> status = ReapWithin(children, deadline, &left);
  REQUIRE(left == 0);
  CHECK(WIFSIGNALED(status[victim]));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    INFO("rank " << r << " over " << transport);
    CHECK(WIFEXITED(status[r]));
    CHECK(WEXITSTATUS(status[r]) == 0);
  }
  CHECK(std::system((std::string("rm -rf ") + dir).c_str()) == 0);
}

}  // namespace
}  // namespace trainrun::collectives
