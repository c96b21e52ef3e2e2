// Every collective carries what it is: a rank that disagrees (another collective, count, type, op,
// root, name or shape) makes every rank throw MismatchError for that call, and the communicator
// goes on working. Also: Alltoallv with uneven counts, Subset (process sets), int16 and bool.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "spawn.h"
#include "trainrun/collectives/comm_thread.h"
#include "trainrun/collectives/communicator.h"

namespace trainrun::collectives {
namespace {

using testing::Spawn;

// Catch2's assertions are not thread-safe and ranks run as threads: a rank notes what went wrong
// here, and each test checks the list once every rank has finished.
std::mutex problems_mutex;
std::vector<std::string> problems;

void Note(bool ok, const std::string& what) {
  if (ok) return;
  std::lock_guard<std::mutex> lock(problems_mutex);
  problems.push_back(what);
}

#define NOTE_CHECK(...) Note((__VA_ARGS__), #__VA_ARGS__)

#define NOTE_THROWS_AS(expr, type)               \
  do {                                           \
    bool threw_ = false;                         \
    try {                                        \
      expr;                                      \
    } catch (const type&) {                      \
      threw_ = true;                             \
    }                                            \
    Note(threw_, #expr " did not throw " #type); \
  } while (0)

// CheckNoProblems reports, from the test's thread, what the ranks noted.
void CheckNoProblems() {
  std::lock_guard<std::mutex> lock(problems_mutex);
  for (const std::string& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
  problems.clear();
}

// TmpPath returns a path under TMPDIR (or /tmp) for a test's file.
std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/" + name;
}

// ExpectMismatch runs `call` and requires a MismatchError whose message contains `words`.
template <typename F>
void ExpectMismatch(F&& call, const std::string& words) {
  try {
    call();
    Note(false, "no MismatchError (expected one saying: " + words + ")");
  } catch (const MismatchError& e) {
    Note(std::string(e.what()).find(words) != std::string::npos,
         "MismatchError without '" + words + "': " + e.what());
  }
}

void ExpectHealthy(Communicator& comm) {
  std::vector<float> x(5, 1.0f);
  comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
  NOTE_CHECK(x == std::vector<float>(5, static_cast<float>(comm.size())));
}

// Both transports: over TCP between two ranks the records travel in frames that carry a small
// allreduce's data too (TcpTransport::TryCheckedAllreduce); over shared memory, in the slots.
CommunicatorOptions Over(const char* transport) {
  CommunicatorOptions options;
  options.transport = transport;
  return options;
}

TEST_CASE("a mismatched collective raises on every rank and the next one works", "[api]") {
  for (const char* transport : {"auto", "tcp"})
    for (int size : {2, 3, 4}) {
      Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, size, Over(transport));
        std::vector<float> x(4, 1.0f);
        // Rank 0 allreduces while the others wait in a barrier.
        ExpectMismatch(
            [&] {
              if (rank == 0) {
                comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
              } else {
                comm.Barrier();
              }
            },
            "rank 0 called allreduce of float32 x 4 (op sum) but rank 1 called barrier");
        ExpectHealthy(comm);
        // Counts, types, ops, roots, names and shapes.
        ExpectMismatch(
            [&] {
              comm.Allreduce(x.data(), rank == 1 ? 3 : 4, DataType::kFloat32, ReduceOp::kSum);
            },
            "float32 x 3");
        ExpectMismatch(
            [&] {
              comm.Allreduce(x.data(), 1, rank == 1 ? DataType::kInt32 : DataType::kFloat32,
                             ReduceOp::kSum);
            },
            "int32");
        ExpectMismatch(
            [&] {
              comm.Allreduce(x.data(), 4, DataType::kFloat32,
                             rank == size - 1 ? ReduceOp::kMax : ReduceOp::kSum);
            },
            "(op max)");
        ExpectMismatch([&] { comm.Broadcast(x.data(), 4, DataType::kFloat32, rank == 0 ? 0 : 1); },
                       "from root 1");
        CallCheck named;
        named.name = rank == 0 ? "weights" : "bias";
        ExpectMismatch(
            [&] { comm.Allreduce(x.data(), 4, DataType::kFloat32, ReduceOp::kSum, named); },
            "'bias'");
        CallCheck shaped;
        shaped.has_shape = true;
        shaped.shape = rank == 0 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{4, 1};
        ExpectMismatch(
            [&] { comm.Allreduce(x.data(), 4, DataType::kFloat32, ReduceOp::kSum, shaped); },
            "[4, 1]");
        // A small allreduce carries its record in its data step over shared memory; a rank whose
        // call exchanges records on their own (a large allreduce, an allgather) still meets it
        // there, and every rank raises.
        std::vector<float> big(1 << 16, 1.0f);
        ExpectMismatch(
            [&] {
              comm.Allreduce(rank == 1 ? big.data() : x.data(), rank == 1 ? big.size() : x.size(),
                             DataType::kFloat32, ReduceOp::kSum);
            },
            "rank 1 called allreduce of float32 x 65536");
        std::vector<float> gathered(4 * size);
        ExpectMismatch(
            [&] {
              if (rank == 0) {
                comm.Allgather(x.data(), gathered.data(), 4, DataType::kFloat32);
              } else {
                comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
              }
            },
            "rank 0 called allgather of float32 x 4 but rank 1 called allreduce of float32 x 4");
        // A large allreduce carries its record in its first chunk's step over shared memory: two of
        // different counts, and one beside an allgather or a barrier, still raise on every rank.
        ExpectMismatch(
            [&] {
              comm.Allreduce(big.data(), rank == 1 ? big.size() - 16 : big.size(),
                             DataType::kFloat32, ReduceOp::kSum);
            },
            "float32 x 65520");
        ExpectMismatch(
            [&] {
              if (rank == 0) {
                comm.Allgather(x.data(), gathered.data(), 4, DataType::kFloat32);
              } else {
                comm.Allreduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
              }
            },
            "rank 0 called allgather of float32 x 4 but rank 1 called allreduce of float32 x "
            "65536");
        ExpectMismatch(
            [&] {
              if (rank == size - 1) {
                comm.Barrier();
              } else {
                comm.Allreduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
              }
            },
            "called barrier");
        // A set of every rank, in order, meets the world's collectives at the same place.
        std::vector<int> everyone(size);
        for (int r = 0; r < size; ++r) everyone[r] = r;
        auto all = comm.Subset(everyone, "all");
        ExpectMismatch(
            [&] {
              if (rank == 0) {
                all->Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
              } else {
                comm.Allreduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
              }
            },
            "x 65536");
        ExpectHealthy(comm);
        ExpectHealthy(*all);
        // The buffers were left as they were by every failed call (over TCP a small allreduce's
        // data travels with the records and is reduced aside until every record is known).
        NOTE_CHECK(std::all_of(big.begin(), big.end(), [](float v) { return v == 1.0f; }));
        NOTE_CHECK(x == std::vector<float>(4, 1.0f));
        comm.Allreduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kSum);
        NOTE_CHECK(big == std::vector<float>(big.size(), static_cast<float>(size)));
        comm.Barrier();
      });
      CheckNoProblems();
    }
}

TEST_CASE("alltoallv with uneven counts", "[api]") {
  for (int size : {1, 2, 3, 4}) {
    Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
      Communicator comm(store, rank, size);
      // Rank r sends p + r + 1 elements, each equal to 100 * r + p, to rank p.
      std::vector<size_t> sends(size), recvs(size);
      std::vector<int16_t> in;
      for (int p = 0; p < size; ++p) {
        sends[p] = p + rank + 1;
        recvs[p] = rank + p + 1;
        in.insert(in.end(), sends[p], static_cast<int16_t>(100 * rank + p));
      }
      std::vector<int16_t> out(in.size() + 0), expected;
      size_t total = 0;
      for (int p = 0; p < size; ++p) total += recvs[p];
      out.resize(total);
      for (int p = 0; p < size; ++p) {
        expected.insert(expected.end(), recvs[p], static_cast<int16_t>(100 * p + rank));
      }
      comm.Alltoallv(in.data(), sends, out.data(), recvs, DataType::kInt16);
      NOTE_CHECK(out == expected);
    });
    CheckNoProblems();
  }
}

TEST_CASE("subsets run among their ranks only, concurrently, over the same connections", "[api]") {
  for (int size : {2, 3, 4}) {
    Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
      Communicator comm(store, rank, size);
      std::vector<int> evens, odds;
      for (int r = 0; r < size; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
      auto mine = comm.Subset(rank % 2 == 0 ? evens : odds, rank % 2 == 0 ? "evens" : "odds");
      for (int i = 0; i < 3; ++i) {
        int64_t x = rank;
        mine->Allreduce(&x, 1, DataType::kInt64, ReduceOp::kSum);
        int64_t expected = 0;
        for (int r : rank % 2 == 0 ? evens : odds) expected += r;
        NOTE_CHECK(x == expected);
        mine->Barrier();
      }
      ExpectHealthy(comm);
      if (rank != 0) NOTE_THROWS_AS(comm.Subset({0}, "not mine"), InvalidArgumentError);
    });
    CheckNoProblems();
  }
}

TEST_CASE("bool reduces as or (sum, max) and and (product, min)", "[api]") {
  Spawn(3, [](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, 3);
    std::vector<uint8_t> any = {rank == 0, 0, 1};
    std::vector<uint8_t> all = any;
    comm.Allreduce(any.data(), 3, DataType::kBool, ReduceOp::kSum);
    comm.Allreduce(all.data(), 3, DataType::kBool, ReduceOp::kMin);
    NOTE_CHECK(any == std::vector<uint8_t>{1, 0, 1});
    NOTE_CHECK(all == std::vector<uint8_t>{0, 0, 1});
  });
  CheckNoProblems();
}

// ExpectRefused runs `call` on the rank that gets its arguments wrong: it must throw its own
// InvalidArgumentError (not a mismatch) containing `words`.
template <typename F>
void ExpectRefused(F&& call, const std::string& words) {
  try {
    call();
    Note(false, "no InvalidArgumentError (expected one saying: " + words + ")");
  } catch (const MismatchError& e) {
    Note(false, std::string("a MismatchError instead of the rank's own error: ") + e.what());
  } catch (const InvalidArgumentError& e) {
    Note(std::string(e.what()).find(words) != std::string::npos,
         "InvalidArgumentError without '" + words + "': " + e.what());
  }
}

TEST_CASE("an argument one rank refuses raises on every rank, and the next ones work", "[api]") {
  for (const char* transport : {"auto", "tcp"})
    for (int size : {2, 3}) {
      Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, size, Over(transport));
        const int bad = size - 1;
        const std::string told =
            "rank " + std::to_string(bad) + " called broadcast 'w' with arguments it refused";
        std::vector<float> x(4, 1.0f);
        CallCheck named;
        named.name = "w";
        if (rank == bad) {
          ExpectRefused([&] { comm.Broadcast(x.data(), 4, DataType::kFloat32, size, named); },
                        "broadcast root");
        } else {
          ExpectMismatch([&] { comm.Broadcast(x.data(), 4, DataType::kFloat32, 0, named); }, told);
        }
        for (int i = 0; i < 100; ++i) ExpectHealthy(comm);
        // Adasum of integers on one rank, refused in the fusable allreduce path.
        std::vector<int32_t> ints(4, 1);
        if (rank == bad) {
          ExpectRefused(
              [&] { comm.Allreduce(ints.data(), 4, DataType::kInt32, ReduceOp::kAdasum); },
              "Adasum reduces");
          std::exception_ptr error;
          Communicator::ReadyAllreduce ready{ints.data(), 4, &named};
          comm.AllreduceReady({ready}, DataType::kInt32, ReduceOp::kAdasum, &error);
          NOTE_CHECK(error != nullptr);
        } else {
          ExpectMismatch(
              [&] { comm.Allreduce(x.data(), 4, DataType::kFloat32, ReduceOp::kAdasum); },
              "with arguments it refused");
          ExpectMismatch(
              [&] { comm.Allreduce(x.data(), 4, DataType::kFloat32, ReduceOp::kAdasum, named); },
              "allreduce 'w' with arguments it refused");
        }
        ExpectHealthy(comm);
        // Counts for the wrong number of ranks on one rank.
        std::vector<size_t> counts(size, 1);
        std::vector<float> in(size, 1.0f), out(size, 0.0f);
        if (rank == bad) {
          std::vector<size_t> wrong(size + 1, 1);
          ExpectRefused(
              [&] { comm.Alltoallv(in.data(), wrong, out.data(), counts, DataType::kFloat32); },
              "alltoallv got");
        } else {
          ExpectMismatch(
              [&] { comm.Alltoallv(in.data(), counts, out.data(), counts, DataType::kFloat32); },
              "alltoall with arguments it refused");
        }
        // Every rank refusing alike: each throws its own error, none a mismatch.
        ExpectRefused([&] { comm.Broadcast(x.data(), 4, DataType::kFloat32, -1); },
                      "broadcast root -1");
        for (int i = 0; i < 100; ++i) ExpectHealthy(comm);
      });
      CheckNoProblems();
    }
}

TEST_CASE("join: a joined rank adds zeros to the others' allreduces until all have joined",
          "[api]") {
  for (const char* transport : {"auto", "tcp"})
    for (int size : {1, 2, 3, 4}) {
      for (int first = 0; first < size; ++first) {
        Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
          Communicator comm(store, rank, size, Over(transport));
          int last = -1;
          if (rank == first) {
            last = comm.Join();
          } else {
            std::vector<double> x(7, 3.0);
            comm.Allreduce(x.data(), x.size(), DataType::kFloat64, ReduceOp::kSum);
            NOTE_CHECK(x == std::vector<double>(7, 3.0 * (size - 1)));
            std::vector<int64_t> y(1, 6);
            comm.Allreduce(y.data(), 1, DataType::kInt64, ReduceOp::kAverage);
            NOTE_CHECK(y[0] == 6 * (size - 1) / size);  // the average still divides by size
            // A large one (over shared memory: the chunked path with the record in its first step).
            std::vector<float> w(1 << 16, 2.0f);
            comm.Allreduce(w.data(), w.size(), DataType::kFloat32, ReduceOp::kSum);
            NOTE_CHECK(w == std::vector<float>(1 << 16, 2.0f * (size - 1)));
            comm.Barrier();
            std::vector<float> z(2, 1.0f);
            const int root = (first + 1) % size;
            ExpectMismatch([&] { comm.Broadcast(z.data(), 2, DataType::kFloat32, root); },
                           "has joined");
            last = comm.Join();
          }
          // Every rank agrees on the last to join, which is not the one that joined first.
          int64_t mine = last;
          std::vector<int64_t> all(size);
          comm.Allgather(&mine, all.data(), 1, DataType::kInt64);
          NOTE_CHECK(all == std::vector<int64_t>(size, last));
          if (size > 1) NOTE_CHECK(last != first);
          ExpectHealthy(comm);
        });
        CheckNoProblems();
      }
    }
}

TEST_CASE("timeline: every rank's collectives land in one Chrome trace", "[api]") {
  const std::string path = TmpPath("trainrun_timeline_test.json");
  Spawn(3, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, 3);
    comm.Barrier();  // Rank 0 truncates in StartTimeline; others write only after a collective.
    comm.StartTimeline(path);
    std::vector<float> x(256, 1.0f);
    CallCheck named;
    named.name = "grads";
    comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, named);
    comm.Barrier();
    comm.StopTimeline();
  });
  CheckNoProblems();
  std::ifstream in(path);
  std::string line;
  int allreduces = 0;
  int phases = 0;
  std::set<std::string> tracks;
  std::getline(in, line);
  CHECK(line == "[");
  while (std::getline(in, line)) {
    if (line.find(R"("name":"allreduce grads")") != std::string::npos) {
      ++allreduces;
      CHECK(line.find(R"("bytes":1024)") != std::string::npos);
      CHECK(line.find(R"("dtype":"float32")") != std::string::npos);
    }
    if (line.find(R"("cat":"phase")") != std::string::npos) ++phases;
    if (line.find(R"("name":"process_name")") != std::string::npos) tracks.insert(line);
  }
  CHECK(allreduces == 3);
  CHECK(phases >= 6);
  CHECK(tracks.size() == 3);
  std::remove(path.c_str());
}

// Through the communication thread, named collectives match by name whatever order each rank
// submits them in (Horovod's semantics): 50 rounds of 50 named allreduces (fusable ones, and
// broadcasts among them), each rank in its own random order, every result checked.
TEST_CASE("named collectives in a different random order on every rank all complete", "[api]") {
  for (const char* transport : {"auto", "tcp"})
    for (int size : {3, 4}) {
      Spawn(size, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, size, Over(transport));
        CommThread thread(comm, 64 << 20);
        constexpr int kCount = 50;
        std::mt19937 random(static_cast<unsigned>(rank) * 7919u + 1u);
        for (int round = 0; round < 50; ++round) {
          std::vector<std::vector<float>> data(kCount);
          std::vector<CommThread::Handle> handles(kCount);
          std::vector<int> order(kCount);
          for (int i = 0; i < kCount; ++i) order[i] = i;
          std::shuffle(order.begin(), order.end(), random);
          for (int i : order) {
            data[i].assign(static_cast<size_t>(i % 5 + 1), static_cast<float>(rank + i));
            CallCheck check;
            check.name = "r" + std::to_string(round) + "." + std::to_string(i);
            if (i % 10 == 3) {  // a broadcast from rank i % size among the allreduces
              float* p = data[i].data();
              const size_t n = data[i].size();
              const int root = i % size;
              handles[i] = thread.Submit(
                  [p, n, root, check](Communicator& c) {
                    c.Broadcast(p, n, DataType::kFloat32, root, check);
                  },
                  &comm, check.name);
            } else {
              handles[i] = thread.SubmitAllreduce({&comm, data[i].data(), data[i].size(),
                                                   DataType::kFloat32, ReduceOp::kSum, check});
            }
          }
          for (int i = 0; i < kCount; ++i) {
            while (!thread.WaitFor(handles[i], std::chrono::milliseconds(100))) {
            }
            const float expected = i % 10 == 3
                                       ? static_cast<float>(i % size + i)
                                       : static_cast<float>(size * i + size * (size - 1) / 2);
            NOTE_CHECK(data[i] == std::vector<float>(data[i].size(), expected));
          }
        }
        // A second pending collective of one name is refused on this rank only; once run, the
        // name is free again.
        std::vector<float> x(3, 1.0f);
        CallCheck dup;
        dup.name = "dup";
        auto first = thread.SubmitAllreduce(
            {&comm, x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, dup});
        if (rank == 0) {
          std::vector<float> y(3, 1.0f);
          NOTE_THROWS_AS(thread.SubmitAllreduce(
                             {&comm, y.data(), y.size(), DataType::kFloat32, ReduceOp::kSum, dup}),
                         InvalidArgumentError);
        }
        while (!thread.WaitFor(first, std::chrono::milliseconds(100))) {
        }
        NOTE_CHECK(x == std::vector<float>(3, static_cast<float>(size)));
        auto again = thread.SubmitAllreduce(
            {&comm, x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, dup});
        while (!thread.WaitFor(again, std::chrono::milliseconds(100))) {
        }
        NOTE_CHECK(x == std::vector<float>(3, static_cast<float>(size * size)));
      });
      CheckNoProblems();
    }
}

}  // namespace
}  // namespace trainrun::collectives
