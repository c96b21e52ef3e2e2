// Adasum (ReduceOp::kAdasum) against a float64 reference written here from the paper's definition:
// whole vectors combined pairwise, tensor by tensor, in the library's tree (pairs 2i, 2i+1 for
// i < n - p folded first, p the largest power of two <= n; then pairs, pairs of pairs, ...).
// Ranks as threads over the in-memory store; inputs are fresh random numbers each run (the seed
// is printed on failure). Tagged [allreduce] too, so the file runs over TCP and shared memory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "spawn.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/testing/elements.h"

namespace trainrun::collectives {
namespace {

using testing::Get;
using testing::Put;
using testing::Spawn;

const std::vector<DataType> kTypes = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                      DataType::kBFloat16};

// A vector in float64 with, per element, a bound on the magnitudes that went into it (for the
// tolerance of the rounding the library does in the element type).
struct Ref {
  std::vector<double> value;
  std::vector<double> magnitude;
};

// Combine is the Adasum of a and b, tensor by tensor (`bounds`: tensor i is [bounds[i],
// bounds[i + 1])): a * (1 - a.b / 2|a|^2) + b * (1 - a.b / 2|b|^2), a coefficient 1 when its
// vector's squared norm is below sqrt(DBL_MIN).
Ref Combine(const Ref& a, const Ref& b, const std::vector<size_t>& bounds) {
  Ref out{a.value, a.magnitude};
  for (size_t t = 0; t + 1 < bounds.size(); ++t) {
    double dot = 0, aa = 0, bb = 0;
    for (size_t i = bounds[t]; i < bounds[t + 1]; ++i) {
      dot += a.value[i] * b.value[i];
      aa += a.value[i] * a.value[i];
      bb += b.value[i] * b.value[i];
    }
    const double ca = aa >= std::sqrt(DBL_MIN) ? 1 - dot / (2 * aa) : 1;
    const double cb = bb >= std::sqrt(DBL_MIN) ? 1 - dot / (2 * bb) : 1;
    for (size_t i = bounds[t]; i < bounds[t + 1]; ++i) {
      out.value[i] = ca * a.value[i] + cb * b.value[i];
      out.magnitude[i] = std::abs(ca) * a.magnitude[i] + std::abs(cb) * b.magnitude[i];
    }
  }
  return out;
}

Ref Reference(const std::vector<std::vector<double>>& inputs, const std::vector<size_t>& bounds) {
  const int n = static_cast<int>(inputs.size());
  int p = 1;
  while (p * 2 <= n) p *= 2;
  auto leaf = [&](int r) {
    Ref x{inputs[r], inputs[r]};
    for (double& m : x.magnitude) m = std::abs(m);
    return x;
  };
  std::vector<Ref> level;
  for (int r = 0; r < n; ++r) {
    if (r < 2 * (n - p)) {
      level.push_back(Combine(leaf(r), leaf(r + 1), bounds));
      ++r;
    } else {
      level.push_back(leaf(r));
    }
  }
  while (level.size() > 1) {
    std::vector<Ref> next;
    for (size_t i = 0; i < level.size(); i += 2)
      next.push_back(Combine(level[i], level[i + 1], bounds));
    level = std::move(next);
  }
  return level[0];
}

double Epsilon(DataType type) {
  switch (type) {
    case DataType::kFloat64:
      return 1.2e-16;
    case DataType::kFloat32:
      return 6e-8;
    case DataType::kFloat16:
      return 4.9e-4;
    default:  // bfloat16
      return 3.9e-3;
  }
}

uint64_t FreshSeed() {
  static uint64_t seed = std::random_device{}();
  return seed++;
}

// Inputs that make Adasum do something: each rank's vector is a shared direction plus its own,
// at its own scale, so that dot products are neither zero nor the norms.
std::vector<std::vector<double>> MakeInputs(int n, size_t count, DataType type, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> shared(count);
  for (double& x : shared) x = normal(rng);
  std::vector<std::vector<double>> inputs(n, std::vector<double>(count));
  std::vector<char> element(8);
  for (int r = 0; r < n; ++r) {
    const double scale = 0.5 + r * 0.37;
    const double mix = (r % 3) * 0.4;
    for (size_t i = 0; i < count; ++i) {
      Put(type, element.data(), 0, scale * (mix * shared[i] + normal(rng)));
      inputs[r][i] = Get(type, element.data(), 0);  // exactly as the element type holds it
    }
  }
  return inputs;
}

enum class Call { kAllreduce, kOutOfPlace, kGrouped, kFused };

const char* CallName(Call call) {
  switch (call) {
    case Call::kAllreduce:
      return "allreduce in place";
    case Call::kOutOfPlace:
      return "allreduce out of place";
    case Call::kGrouped:
      return "grouped allreduce";
    case Call::kFused:
      return "fused allreduces";
  }
  return "?";
}

// CheckAdasum reduces tensors of `counts` elements on n ranks as `call` says (one tensor for a
// plain allreduce: counts must then have one entry) and checks every rank's result against the
// reference, within what rounding in `type` may cost, and that the ranks agree bit for bit.
void CheckAdasum(int n, DataType type, const std::vector<size_t>& counts, Call call) {
  const uint64_t seed = FreshSeed();
  std::vector<size_t> bounds{0};
  for (size_t c : counts) bounds.push_back(bounds.back() + c);
  const size_t total = bounds.back();
  INFO("ranks " << n << ", " << DataTypeName(type) << ", " << CallName(call) << ", "
                << counts.size() << " tensors, " << total << " elements, seed " << seed);
  const auto inputs = MakeInputs(n, total, type, seed);
  const size_t e = ElementSize(type);
  std::vector<std::vector<char>> outputs(n, std::vector<char>(std::max<size_t>(1, total * e)));
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n);
    std::vector<char> in(std::max<size_t>(1, total * e));
    for (size_t i = 0; i < total; ++i) Put(type, in.data(), i, inputs[rank][i]);
    std::vector<char>& out = outputs[rank];
    switch (call) {
      case Call::kAllreduce:
        out = in;
        comm.Allreduce(out.data(), total, type, ReduceOp::kAdasum);
        break;
      case Call::kOutOfPlace:
        comm.Allreduce(in.data(), out.data(), total, type, ReduceOp::kAdasum);
        break;
      case Call::kGrouped: {
        out = in;
        std::vector<Communicator::Buffer> buffers;
        for (size_t t = 0; t < counts.size(); ++t) {
          buffers.push_back({out.data() + bounds[t] * e, counts[t]});
        }
        comm.GroupedAllreduce(buffers, type, ReduceOp::kAdasum);
        break;
      }
      case Call::kFused: {
        // As the Python binding's thread: every tensor queued, reduced k at a time.
        out = in;
        std::vector<CallCheck> checks(counts.size());
        std::vector<Communicator::ReadyAllreduce> ready;
        for (size_t t = 0; t < counts.size(); ++t) {
          checks[t].name = "tensor." + std::to_string(t);
          ready.push_back({out.data() + bounds[t] * e, counts[t], &checks[t]});
        }
        while (!ready.empty()) {
          std::exception_ptr error;
          const size_t k = comm.AllreduceReady(ready, type, ReduceOp::kAdasum, &error);
          if (error) std::rethrow_exception(error);
          ready.erase(ready.begin(), ready.begin() + static_cast<std::ptrdiff_t>(k));
        }
        break;
      }
    }
  });
  const Ref expect = Reference(inputs, bounds);
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  size_t bad = 0;
  std::string first_bad;
  size_t tensor = 0;
  for (size_t i = 0; i < total; ++i) {
    while (i >= bounds[tensor + 1]) ++tensor;
    // Each level rounds its result to the element type, and its coefficients come from dot
    // products of rounded vectors, summed in float64 in another order than here (an error of up
    // to the tensor's length in float64 epsilons, relative).
    const double summing = static_cast<double>(counts[tensor]) * Epsilon(DataType::kFloat64);
    const double tolerance = 8 * (levels + 1) * (Epsilon(type) + summing) * expect.magnitude[i];
    for (int r = 0; r < n; ++r) {
      const double got = Get(type, outputs[r].data(), i);
      if (!(std::abs(got - expect.value[i]) <= tolerance) && bad++ == 0) {
        first_bad = "element " + std::to_string(i) + " rank " + std::to_string(r) + ": got " +
                    std::to_string(got) + ", expected " + std::to_string(expect.value[i]) +
                    " within " + std::to_string(tolerance);
      }
    }
  }
  INFO(first_bad);
  CHECK(bad == 0);
  for (int r = 1; r < n; ++r) CHECK(outputs[r] == outputs[0]);
}

TEST_CASE("adasum: one tensor, every float type, 1 to 5 ranks", "[adasum][allreduce]") {
  for (int n = 1; n <= 5; ++n) {
    for (DataType type : kTypes) {
      for (size_t count : {0, 1, 2, 3, 7, 1000, 65537}) {
        CheckAdasum(n, type, {count}, count % 2 == 0 ? Call::kAllreduce : Call::kOutOfPlace);
      }
    }
  }
}

TEST_CASE("adasum: several tensors, each with its own dot products", "[adasum][allreduce]") {
  const std::vector<size_t> counts = {5, 0, 1000, 3, 77, 1, 4096, 2};
  for (int n = 1; n <= 5; ++n) {
    for (DataType type : kTypes) {
      CheckAdasum(n, type, counts, Call::kGrouped);
      CheckAdasum(n, type, counts, Call::kFused);
    }
  }
}

TEST_CASE("adasum: 1M+3 elements", "[adasum][allreduce]") {
  const size_t big = (1 << 20) + 3;
  CheckAdasum(2, DataType::kFloat32, {big}, Call::kAllreduce);
  CheckAdasum(3, DataType::kFloat16, {big}, Call::kOutOfPlace);
  CheckAdasum(4, DataType::kFloat64, {big / 3, big - big / 3}, Call::kGrouped);
  CheckAdasum(5, DataType::kBFloat16, {big}, Call::kAllreduce);
}

// The paper's two landmarks, exactly: orthogonal vectors add up, and equal vectors stay as they
// are (coefficients 1 and 1/2, exact in binary).
TEST_CASE("adasum: orthogonal vectors add up, equal ones stay", "[adasum][allreduce]") {
  for (int n = 2; n <= 5; ++n) {
    const size_t count = 1003;
    std::vector<std::vector<float>> orthogonal(n), equal(n);
    Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
      Communicator comm(store, rank, n);
      std::vector<float>& o = orthogonal[rank];
      std::vector<float>& q = equal[rank];
      o.assign(count, 0.0f);
      q.resize(count);
      for (size_t i = 0; i < count; ++i) {
        if (static_cast<int>(i % n) == rank) o[i] = static_cast<float>(1 + i % 9);
        q[i] = static_cast<float>(i % 13) - 6.0f;
      }
      comm.Allreduce(o.data(), count, DataType::kFloat32, ReduceOp::kAdasum);
      comm.Allreduce(q.data(), count, DataType::kFloat32, ReduceOp::kAdasum);
    });
    for (int r = 0; r < n; ++r) {
      INFO("ranks " << n << ", rank " << r);
      size_t wrong_sum = 0, wrong_equal = 0;
      for (size_t i = 0; i < count; ++i) {
        wrong_sum += orthogonal[r][i] != static_cast<float>(1 + i % 9);
        wrong_equal += equal[r][i] != static_cast<float>(i % 13) - 6.0f;
      }
      CHECK(wrong_sum == 0);
      CHECK(wrong_equal == 0);
    }
  }
}

TEST_CASE("adasum: a rank of zeros leaves the others' Adasum", "[adasum][allreduce]") {
  // A zero vector's coefficient is 1 and its dot products are 0: it adds nothing.
  const int n = 2;
  std::vector<std::vector<double>> data(n);
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n);
    data[rank].assign(100, rank == 0 ? 0.0 : 1.5);
    comm.Allreduce(data[rank].data(), 100, DataType::kFloat64, ReduceOp::kAdasum);
  });
  for (int r = 0; r < n; ++r) CHECK(data[r] == std::vector<double>(100, 1.5));
}

TEST_CASE("adasum: while a rank has joined, Adasum is a mismatch and the job goes on",
          "[adasum][allreduce]") {
  // join() takes part in sum and average only (as Horovod): Adasum then raises MismatchError on
  // the ranks that called it, and the joined rank goes on waiting for them.
  const int n = 3;
  std::vector<int> mismatched(n, 0), last(n, -1);
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n);
    if (rank < 2) {
      std::vector<double> x(16, 1.0 + rank);
      try {
        comm.Allreduce(x.data(), x.size(), DataType::kFloat64, ReduceOp::kAdasum);
      } catch (const MismatchError& e) {
        mismatched[rank] = std::string(e.what()).find("has joined") != std::string::npos;
      }
      comm.Allreduce(x.data(), x.size(), DataType::kFloat64, ReduceOp::kSum);
      mismatched[rank] &= x[0] == 3.0;  // the joined rank's zeros in the sum
    }
    last[rank] = comm.Join();
  });
  CHECK(mismatched == std::vector<int>{1, 1, 0});
  CHECK(last == std::vector<int>(n, last[0]));
}

TEST_CASE("adasum: integer types and reduce-scatter are refused, and the next call works",
          "[adasum][allreduce]") {
  const int n = 3;
  Spawn(n, [&](int rank, std::shared_ptr<rendezvous::Store> store) {
    Communicator comm(store, rank, n);
    std::vector<int32_t> ints(8, 1);
    CHECK_THROWS_WITH(comm.Allreduce(ints.data(), ints.size(), DataType::kInt32, ReduceOp::kAdasum),
                      Catch::Contains("Adasum reduces float16, bfloat16, float32 or float64") &&
                          Catch::Contains("int32"));
    std::vector<float> in(3 * 4, 1.0f), out(4);
    CHECK_THROWS_WITH(
        comm.ReduceScatter(in.data(), out.data(), 4, DataType::kFloat32, ReduceOp::kAdasum),
        Catch::Contains("allreduce op only"));
    CHECK_THROWS_WITH(comm.Allreduce(in.data(), 4, DataType::kFloat32, static_cast<ReduceOp>(6)),
                      Catch::Contains("unknown reduce op 6"));
    std::vector<float> same(4, 2.0f);
    comm.Allreduce(same.data(), same.size(), DataType::kFloat32, ReduceOp::kAdasum);
    CHECK(same == std::vector<float>(4, 2.0f));
  });
}

}  // namespace
}  // namespace trainrun::collectives
