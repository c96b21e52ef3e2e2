// Every collective, type and op against a float64 (or exact integer) reference, with ranks as
// threads over the in-memory store. Inputs are fresh random numbers each run (the seed is printed
// on failure).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rank_threads.h"
#include "spawn.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/testing/elements.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives {
namespace {

using testing::Spawn;
using ::trainrun::testing::RequireNoFailures;
using ::trainrun::testing::ThreadFailures;

const std::vector<DataType> kTypes = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                      DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                      DataType::kUInt8,    DataType::kInt8};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct};

using testing::IsFloatingPoint;

using testing::Get;
using testing::Put;

// Random inputs whose exact reduction stays in range (no integer overflow except where wrapping is
// part of the contract: int8/uint8 products, checked modulo 2^8).
std::vector<char> MakeInput(DataType type, ReduceOp op, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> buffer(count * ElementSize(type));
  for (size_t i = 0; i < count; ++i) {
    double v;
    if (IsFloatingPoint(type)) {
      std::uniform_real_distribution<double> d(op == ReduceOp::kProduct ? 0.5 : -1.0,
                                               op == ReduceOp::kProduct ? 1.5 : 1.0);
      v = d(rng);
    } else if (op == ReduceOp::kProduct) {
      v = static_cast<double>(std::uniform_int_distribution<int>(-3, 3)(rng));
      if (type == DataType::kUInt8) v = std::abs(v);
    } else {
      int low = type == DataType::kUInt8 ? 0 : (type == DataType::kInt8 ? -15 : -1000);
      int high = type == DataType::kUInt8 ? 30 : (type == DataType::kInt8 ? 15 : 1000);
      v = static_cast<double>(std::uniform_int_distribution<int>(low, high)(rng));
    }
    Put(type, buffer, i, v);
  }
  return buffer;
}

// Reference of element i over every rank's input; `tolerance` is set to what rounding may cost.
double Reference(DataType type, ReduceOp op, const std::vector<std::vector<char>>& inputs, size_t i,
                 double* tolerance) {
  const int n = static_cast<int>(inputs.size());
  double acc = Get(type, inputs[0], i);
  double magnitude = std::abs(acc);
  for (int r = 1; r < n; ++r) {
    double v = Get(type, inputs[r], i);
    magnitude += std::abs(v);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        acc += v;
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kAdasum:  // not element-wise: adasum_test.cc
        break;
    }
  }
  if (op == ReduceOp::kAverage) {
    acc = IsFloatingPoint(type) ? acc / n : std::trunc(acc / n);
    magnitude /= n;
  }
  if (op == ReduceOp::kProduct) magnitude = std::abs(acc);
  double epsilon = 0;
  switch (type) {
    case DataType::kFloat64:
      epsilon = 1e-14;
      break;
    case DataType::kFloat32:
      epsilon = 1.2e-7;
      break;
    case DataType::kFloat16:
      epsilon = 9.8e-4;
      break;
    case DataType::kBFloat16:
      epsilon = 7.9e-3;
      break;
    default:
      break;
  }
  *tolerance = (op == ReduceOp::kMin || op == ReduceOp::kMax) ? 0 : epsilon * (n + 1) * magnitude;
  if (!IsFloatingPoint(type)) {  // exact, modulo the type's width
    std::vector<char> wrapped(ElementSize(type));
    Put(type, wrapped, 0, acc);
    acc = Get(type, wrapped, 0);
  }
  return acc;
}

uint64_t FreshSeed() {
  static uint64_t seed = std::random_device{}();
  return seed++;
}

// Sets an environment tunable for the communicators built while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    std::optional<std::string> old = env::Lookup(name);
    if (old) old_ = *old;
    had_ = old.has_value();
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? (void)::setenv(name_, old_.c_str(), 1) : (void)::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

struct Case {
  DataType type;
  ReduceOp op;
  size_t count;
  bool in_place;
};

// Runs every case as allreduce on n ranks and checks every rank's result, and that all ranks agree
// bit for bit.
void CheckAllreduce(int n, const std::vector<Case>& cases) {
  const uint64_t seed = FreshSeed();
  INFO("ranks " << n << ", seed " << seed);
  std::vector<std::vector<std::vector<char>>> inputs(cases.size(),
                                                     std::vector<std::vector<char>>(n));
  std::vector<std::vector<std::vector<char>>> outputs = inputs;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int r = 0; r < n; ++r) {
      inputs[c][r] =
          MakeInput(cases[c].type, cases[c].op, cases[c].count, seed * 1000003 + c * 64 + r);
    }
  }
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n);
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      std::vector<char>& out = outputs[c][rank];
      if (k.in_place) {
        out = inputs[c][rank];
        comm.Allreduce(out.data(), k.count, k.type, k.op);
      } else {
        out.assign(inputs[c][rank].size(), 0);
        comm.Allreduce(inputs[c][rank].data(), out.data(), k.count, k.type, k.op);
      }
    }
  });
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    INFO("type " << DataTypeName(k.type) << ", op " << ReduceOpName(k.op) << ", count " << k.count
                 << (k.in_place ? ", in place" : ""));
    size_t bad = 0;
    std::string first_bad;
    for (size_t i = 0; i < k.count; ++i) {
      double tolerance = 0;
      double expect = Reference(k.type, k.op, inputs[c], i, &tolerance);
      for (int r = 0; r < n; ++r) {
        double got = Get(k.type, outputs[c][r], i);
        if (std::abs(got - expect) > tolerance && bad++ == 0) {
          first_bad = "element " + std::to_string(i) + " rank " + std::to_string(r) + ": got " +
                      std::to_string(got) + ", expected " + std::to_string(expect);
        }
      }
    }
    INFO(first_bad);
    CHECK(bad == 0);
    for (int r = 1; r < n; ++r) CHECK(outputs[c][r] == outputs[c][0]);
  }
}

std::vector<Case> SmallCases() {
  std::vector<Case> cases;
  bool in_place = false;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : {0, 1, 7, 1023}) {
        cases.push_back({type, op, count, in_place});
        in_place = !in_place;
      }
    }
  }
  return cases;
}

TEST_CASE("allreduce by recursive doubling: every type and op, 1 to 8 ranks", "[allreduce]") {
  for (int n = 1; n <= 8; ++n) CheckAllreduce(n, SmallCases());
}

TEST_CASE("allreduce by ring: every type and op, 1 to 8 ranks", "[allreduce]") {
  ScopedEnv small("TRAINRUN_SMALL_ALLREDUCE_BYTES", "0");
  ScopedEnv segment("TRAINRUN_RING_SEGMENT_BYTES", "4096");  // several segments per block
  for (int n = 1; n <= 8; ++n) CheckAllreduce(n, SmallCases());
}

TEST_CASE("allreduce in several chunks: every type and op, 1 to 8 ranks", "[allreduce]") {
  // Over shared memory: the two-phase path, chunk after chunk, with parts of uneven length.
  ScopedEnv small("TRAINRUN_SHM_SMALL_BYTES", "0");
  ScopedEnv chunk("TRAINRUN_SHM_CHUNK_BYTES", "4096");
  std::vector<Case> cases;
  bool in_place = false;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      cases.push_back({type, op, 5001, in_place});
      in_place = !in_place;
    }
  }
  for (int n = 1; n <= 8; ++n) CheckAllreduce(n, cases);
}

TEST_CASE("allreduce of 1M+3 elements", "[allreduce]") {
  const size_t big = (1 << 20) + 3;
  CheckAllreduce(2, {{DataType::kFloat32, ReduceOp::kSum, big, true},
                     {DataType::kBFloat16, ReduceOp::kAverage, big, false}});
  CheckAllreduce(3, {{DataType::kFloat16, ReduceOp::kSum, big, false},
                     {DataType::kInt32, ReduceOp::kMax, big, true}});
  CheckAllreduce(8, {{DataType::kFloat64, ReduceOp::kAverage, big, false}});
}

TEST_CASE(
    "grouped allreduce: many buffers in place as one allreduce, across chunk boundaries, "
    "overlapping buffers through a copy",
    "[allreduce]") {
  // Small chunks, so that pieces straddle chunks and ranks' parts (over shared memory).
  ScopedEnv chunk("TRAINRUN_SHM_CHUNK_BYTES", "4096");
  for (int n : {1, 2, 3, 5}) {
    for (size_t pieces : {size_t{1}, size_t{7}, size_t{60}}) {
      // Ranks report wrong values and go on with the collectives, so that no peer waits for a rank
      // that stopped; the main thread asserts (rank_threads.h).
      ThreadFailures failures;
      Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, n);
        auto expect = [&](bool ok, const char* what) {
          return failures.Expect(
              ok, absl::StrCat("n ", n, ", ", pieces, " pieces, rank ", rank, ": ", what));
        };
        std::mt19937 sizes(static_cast<unsigned>(pieces));
        std::vector<std::vector<double>> data;
        for (size_t i = 0; i < pieces; ++i) {
          const size_t count = sizes() % 900 + (i % 5 == 3 ? 0 : 1);  // an empty one now and then
          std::vector<double> x(count);
          for (size_t k = 0; k < count; ++k) x[k] = rank + static_cast<double>(i + k % 11);
          data.push_back(std::move(x));
        }
        std::vector<Communicator::Buffer> buffers;
        for (auto& x : data) buffers.push_back({x.data(), x.size()});
        comm.GroupedAllreduce(buffers, DataType::kFloat64, ReduceOp::kSum);
        bool summed = true;
        for (size_t i = 0; i < pieces; ++i) {
          for (size_t k = 0; k < data[i].size(); ++k) {
            summed &= data[i][k] == n * (n - 1) / 2.0 + n * static_cast<double>(i + k % 11);
          }
        }
        expect(summed, "every piece is the sum");
        // Average (divided piece by piece) and max, which this rank's part reduces straight
        // from the pieces.
        for (size_t i = 0; i < pieces; ++i) {
          for (size_t k = 0; k < data[i].size(); ++k) data[i][k] = rank * 3.0 + (k % 7);
        }
        comm.GroupedAllreduce(buffers, DataType::kFloat64, ReduceOp::kAverage);
        bool averaged = true;
        for (size_t i = 0; i < pieces; ++i) {
          for (size_t k = 0; k < data[i].size(); ++k) {
            averaged &=
                data[i][k] == (3.0 * n * (n - 1) / 2.0 + n * static_cast<double>(k % 7)) / n;
          }
        }
        expect(averaged, "every piece is the average");
        for (size_t i = 0; i < pieces; ++i) {
          for (size_t k = 0; k < data[i].size(); ++k) data[i][k] = (rank * 7 + k) % 13;
        }
        comm.GroupedAllreduce(buffers, DataType::kFloat64, ReduceOp::kMax);
        bool maxed = true;
        for (size_t i = 0; i < pieces; ++i) {
          for (size_t k = 0; k < data[i].size(); ++k) {
            double most = 0;
            for (int r = 0; r < n; ++r) most = std::max<double>(most, (r * 7 + k) % 13);
            maxed &= data[i][k] == most;
          }
        }
        expect(maxed, "every piece is the max");
        // Two views of one buffer overlap: reduced as their concatenation (each view's own sum).
        std::vector<float> shared(3000, static_cast<float>(rank + 1));
        comm.GroupedAllreduce({{shared.data(), 2000}, {shared.data() + 1000, 2000}},
                              DataType::kFloat32, ReduceOp::kAverage);
        expect(shared[0] == (n + 1) / 2.0f, "the overlapping views' first element");
        expect(shared[2999] == (n + 1) / 2.0f, "the overlapping views' last element");
        // A rank that groups differently from the others' total is a mismatch, as allreduce's.
        std::vector<int32_t> a(10, 1), b(rank == 0 ? 5 : 10, 1);
        if (n > 1) {
          bool mismatch = false;
          try {
            comm.GroupedAllreduce({{a.data(), a.size()}, {b.data(), b.size()}}, DataType::kInt32,
                                  ReduceOp::kSum);
          } catch (const MismatchError&) {
            mismatch = true;
          }
          expect(mismatch, "grouping unlike the others' total is a MismatchError");
        }
        comm.GroupedAllreduce({{a.data(), a.size()}}, DataType::kInt32, ReduceOp::kSum);
        expect(a[9] == n, "the allreduce after the mismatch");
      });
      RequireNoFailures(failures);
    }
  }
}

TEST_CASE("broadcast from every root", "[broadcast]") {
  for (int n : {1, 2, 3, 5, 8}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1023}, size_t{300001}}) {
      const uint64_t seed = FreshSeed();
      INFO("ranks " << n << ", bytes " << bytes << ", seed " << seed);
      std::vector<std::vector<std::vector<char>>> got(n, std::vector<std::vector<char>>(n));
      std::vector<std::vector<char>> sent(n);
      for (int root = 0; root < n; ++root) {
        sent[root] = MakeInput(DataType::kUInt8, ReduceOp::kSum, bytes, seed + root);
      }
      Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, n);
        for (int root = 0; root < n; ++root) {
          got[root][rank] = rank == root ? sent[root] : std::vector<char>(bytes, 0);
          comm.Broadcast(got[root][rank].data(), bytes, DataType::kUInt8, root);
        }
      });
      for (int root = 0; root < n; ++root) {
        for (int r = 0; r < n; ++r) CHECK(got[root][r] == sent[root]);
      }
    }
  }
}

TEST_CASE("allgather and allgatherv", "[allgather]") {
  for (int n = 1; n <= 6; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{100003}}) {
      const uint64_t seed = FreshSeed();
      INFO("ranks " << n << ", count " << count << ", seed " << seed);
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = r % 2 == 0 ? count : count / 3;  // some zero
      std::vector<std::vector<char>> inputs(n), equal(n), varied(n);
      for (int r = 0; r < n; ++r)
        inputs[r] = MakeInput(DataType::kInt32, ReduceOp::kSum, count, seed + r);
      Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, n);
        equal[rank].assign(n * count * 4, 0);
        comm.Allgather(inputs[rank].data(), equal[rank].data(), count, DataType::kInt32);
        size_t total = 0, offset = 0;
        for (int r = 0; r < n; ++r) {
          if (r < rank) offset += counts[r];
          total += counts[r];
        }
        varied[rank].assign(total * 4, 0);
        // In place: the input already sits at this rank's block of the output.
        if (counts[rank] > 0)  // an empty input's data() may be null, which memcpy may not take
          std::memcpy(varied[rank].data() + offset * 4, inputs[rank].data(), counts[rank] * 4);
        comm.Allgatherv(varied[rank].data() + offset * 4, varied[rank].data(), counts,
                        DataType::kInt32);
      });
      std::vector<char> expect_equal, expect_varied;
      for (int r = 0; r < n; ++r) {
        expect_equal.insert(expect_equal.end(), inputs[r].begin(), inputs[r].end());
        expect_varied.insert(expect_varied.end(), inputs[r].begin(),
                             inputs[r].begin() + counts[r] * 4);
      }
      for (int r = 0; r < n; ++r) {
        CHECK(equal[r] == expect_equal);
        CHECK(varied[r] == expect_varied);
      }
    }
  }
}

TEST_CASE("reduce-scatter: every type and op", "[reduce_scatter]") {
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}}) {
      const uint64_t seed = FreshSeed();
      INFO("ranks " << n << ", count " << count << ", seed " << seed);
      std::vector<Case> cases;
      for (DataType type : kTypes) {
        for (ReduceOp op : kOps) cases.push_back({type, op, count, false});
      }
      std::vector<std::vector<std::vector<char>>> inputs(cases.size(),
                                                         std::vector<std::vector<char>>(n));
      auto outputs = inputs;
      for (size_t c = 0; c < cases.size(); ++c) {
        for (int r = 0; r < n; ++r) {
          inputs[c][r] = MakeInput(cases[c].type, cases[c].op, count * n, seed * 7919 + c * 64 + r);
        }
      }
      Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
        Communicator comm(store, rank, n);
        for (size_t c = 0; c < cases.size(); ++c) {
          outputs[c][rank].assign(count * ElementSize(cases[c].type), 0);
          comm.ReduceScatter(inputs[c][rank].data(), outputs[c][rank].data(), count, cases[c].type,
                             cases[c].op);
        }
      });
      for (size_t c = 0; c < cases.size(); ++c) {
        INFO("type " << DataTypeName(cases[c].type) << ", op " << ReduceOpName(cases[c].op));
        size_t bad = 0;
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            double tolerance = 0;
            double expect =
                Reference(cases[c].type, cases[c].op, inputs[c], r * count + i, &tolerance);
            if (std::abs(Get(cases[c].type, outputs[c][r], i) - expect) > tolerance) ++bad;
          }
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("barrier waits for the last rank", "[barrier]") {
  for (int n : {1, 2, 3, 6}) {
    std::vector<std::chrono::steady_clock::time_point> entered(n), left(n);
    Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
      Communicator comm(store, rank, n);
      comm.Barrier();
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * rank));
      entered[rank] = std::chrono::steady_clock::now();
      comm.Barrier();
      left[rank] = std::chrono::steady_clock::now();
    });
    auto last = *std::max_element(entered.begin(), entered.end());
    for (int r = 0; r < n; ++r) CHECK(left[r] >= last);
  }
}

TEST_CASE("bad arguments raise InvalidArgumentError and leave the communicator usable", "[api]") {
  // Catch2's assertions are not thread-safe: ranks record what happened, the test thread checks.
  std::vector<int> refused(2, 0);
  std::vector<float> result(2, 0);
  Spawn(2, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, 2);
    float x = 1;
    auto refuses = [&](auto&& call) {
      try {
        call();
      } catch (const InvalidArgumentError&) {
        ++refused[rank];
      }
    };
    refuses([&] { comm.Broadcast(&x, 1, DataType::kFloat32, 2); });
    refuses([&] { comm.Allreduce(nullptr, 1, DataType::kFloat32, ReduceOp::kSum); });
    refuses([&] { comm.Allgatherv(&x, &x, {1}, DataType::kFloat32); });
    comm.Allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
    result[rank] = x;
  });
  CHECK(refused == std::vector<int>{3, 3});
  CHECK(result == std::vector<float>{2, 2});
  CHECK_THROWS_AS(Communicator(std::make_shared<rendezvous::MemoryStore>(), 3, 2),
                  InvalidArgumentError);
}

}  // namespace
}  // namespace trainrun::collectives
