// allreduce_perf, broadcast_perf, allgather_perf, reduce_scatter_perf: nccl-tests' programs over
// trainrun's collectives, printing the same columns so figures compare directly with
// ../shared/bench/peers.sh.
//
//   trainrun -np 2 build/bin/allreduce_perf -b 4K -e 256M -f 4
//   build/bin/allreduce_perf --np 2 -b 4K -e 256M -f 4     # standalone: forks 2 ranks on this host
//
// Flags as nccl-tests: -b/-e smallest/largest size in bytes (K, M, G suffixes), -f factor between
// sizes, -n timed iterations, -w warm-up iterations, -c 1 to count wrong elements, -d type
// (float, double, half, bfloat16, int32, int64, uint8, int8, int16, bool), -o op (sum, prod, min,
// max, avg; and adasum, whose inputs are orthogonal, rank r's nonzero only where i % n == r, so
// that the Adasum is exactly the sum and -c checks it exactly); beyond nccl-tests, -T MS: time each
// size over at least MS milliseconds (more iterations than -n where -n takes less), so that a
// window spans many scheduler time slices on a busy machine. Time is the mean per operation on the
// slowest rank, in µs; algbw = size / time; busbw as nccl-tests: allreduce algbw·2(n-1)/n,
// allgather and reduce_scatter algbw·(n-1)/n, broadcast algbw.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/testing/elements.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/file_store.h"

namespace {

using trainrun::collectives::Communicator;
using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;
using trainrun::collectives::testing::Get;
using trainrun::collectives::testing::IsFloatingPoint;
using trainrun::collectives::testing::Put;

enum class Collective { kAllreduce, kBroadcast, kAllgather, kReduceScatter };

struct Flags {
  size_t min_bytes = 8;
  size_t max_bytes = 32 << 20;
  size_t factor = 2;
  int iters = 20;
  int warmup = 5;
  double min_ms = 0;  // -T
  bool check = true;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int np = 0;  // standalone: fork this many ranks
};

size_t ParseSize(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  switch (*end) {
    case 'K':
    case 'k':
      value *= 1 << 10;
      break;
    case 'M':
    case 'm':
      value *= 1 << 20;
      break;
    case 'G':
    case 'g':
      value *= 1 << 30;
      break;
    default:
      break;
  }
  return static_cast<size_t>(value);
}

// ParseType accepts every type's DataTypeName (float32, float64, float16, bfloat16, int32, int64,
// uint8, int8, int16, bool) and nccl-tests' names float, double, half, int.
DataType ParseType(const std::string& name) {
  if (name == "float") return DataType::kFloat32;
  if (name == "double") return DataType::kFloat64;
  if (name == "half") return DataType::kFloat16;
  if (name == "int") return DataType::kInt32;
  std::string names;
  for (int i = 0; i < trainrun::collectives::kDataTypeCount; ++i) {
    const auto type = static_cast<DataType>(i);
    if (name == trainrun::collectives::DataTypeName(type)) return type;
    names += std::string(i == 0 ? "" : ", ") + trainrun::collectives::DataTypeName(type);
  }
  std::fprintf(stderr, "unknown type '%s' (-d takes %s, float, double, half or int)\n",
               name.c_str(), names.c_str());
  std::exit(2);
}

ReduceOp ParseOp(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "prod") return ReduceOp::kProduct;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  if (name == "avg") return ReduceOp::kAverage;
  if (name == "adasum") return ReduceOp::kAdasum;
  std::fprintf(stderr, "unknown op '%s'\n", name.c_str());
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    if (flag == "-b")
      flags.min_bytes = ParseSize(value);
    else if (flag == "-e")
      flags.max_bytes = ParseSize(value);
    else if (flag == "-f")
      flags.factor = std::max<size_t>(2, std::atoi(value));
    else if (flag == "-n")
      flags.iters = std::atoi(value);
    else if (flag == "-w")
      flags.warmup = std::atoi(value);
    else if (flag == "-T")
      flags.min_ms = std::atof(value);
    else if (flag == "-c")
      flags.check = std::atoi(value) != 0;
    else if (flag == "-d")
      flags.type = ParseType(value);
    else if (flag == "-o")
      flags.op = ParseOp(value);
    else if (flag == "--np")
      flags.np = std::atoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s (see the head of collective_perf.cc)\n", flag.c_str());
      std::exit(2);
    }
  }
  return flags;
}

// Small integers are exact in every type, so sums and checks are exact too.
double InputValue(int rank, size_t i) { return static_cast<double>((rank + 1 + i) % 5); }

// AdasumInput is rank `rank`'s element i of n for -o adasum: InputValue where i % n == rank, else
// zero. The vectors are orthogonal, so every dot product is exactly zero, every coefficient 1,
// and the Adasum of element i is exactly InputValue(i % n, i).
double AdasumInput(int n, int rank, size_t i) {
  return static_cast<int>(i % n) == rank ? InputValue(rank, i) : 0.0;
}

double Expected(ReduceOp op, DataType type, int n, size_t i) {
  double acc = InputValue(0, i);
  for (int r = 1; r < n; ++r) {
    double v = InputValue(r, i);
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
      case ReduceOp::kAdasum:  // Measure's inputs make it the sum of one nonzero value
        return InputValue(static_cast<int>(i % n), i);
    }
  }
  // bool's average is its or, which the sum (of values 0 or more) is as Put writes it.
  if (op == ReduceOp::kAverage && type != DataType::kBool) {
    acc = IsFloatingPoint(type) ? acc / n : std::trunc(acc / n);
  }
  return acc;
}

// AsStored returns `value` as an element of `type` holds it (integers wrapped, bool 0 or 1).
double AsStored(DataType type, double value) {
  char element[8];
  Put(type, element, 0, value);
  return Get(type, element, 0);
}

struct Run {
  Collective collective;
  const char* name;
};

// One size: returns the wrong-element count on this rank and the mean time per operation.
void Measure(Communicator& comm, const Flags& flags, Collective collective, size_t bytes) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t e = trainrun::collectives::ElementSize(flags.type);
  // nccl-tests' size: the full buffer (allgather: the output, reduce_scatter: the input).
  size_t count = bytes / e;
  size_t in_count = count, out_count = count;
  if (collective == Collective::kAllgather) {
    count = bytes / e / n;
    in_count = count;
    out_count = count * n;
  } else if (collective == Collective::kReduceScatter) {
    count = bytes / e / n;
    in_count = count * n;
    out_count = count;
  }
  std::vector<char> in(std::max<size_t>(1, in_count * e)), out(std::max<size_t>(1, out_count * e));
  const bool adasum = flags.op == ReduceOp::kAdasum;
  for (size_t i = 0; i < in_count; ++i) {
    Put(flags.type, in, i, adasum ? AdasumInput(n, rank, i) : InputValue(rank, i));
  }
  auto once = [&] {
    switch (collective) {
      case Collective::kAllreduce:
        comm.Allreduce(in.data(), out.data(), count, flags.type, flags.op);
        break;
      case Collective::kBroadcast:
        comm.Broadcast(rank == 0 ? in.data() : out.data(), count, flags.type, 0);
        break;
      case Collective::kAllgather:
        comm.Allgather(in.data(), out.data(), count, flags.type);
        break;
      case Collective::kReduceScatter:
        comm.ReduceScatter(in.data(), out.data(), count, flags.type, flags.op);
        break;
    }
  };
  for (int i = 0; i < flags.warmup; ++i) once();
  // -n iterations; with -T, again with more until the slowest rank's window is long enough (every
  // rank decides alike, from that slowest window).
  double seconds = 0;
  for (int64_t iters = std::max(1, flags.iters);;) {
    comm.Barrier();
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) once();
    double window = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    seconds = window / static_cast<double>(iters);
    double longest = 0;
    comm.Allreduce(&window, &longest, 1, DataType::kFloat64, ReduceOp::kMax);
    if (longest * 1e3 >= flags.min_ms || iters >= (int64_t{1} << 26)) break;
    const double scale = 1.2 * flags.min_ms / std::max(longest * 1e3, 1e-3);
    iters = static_cast<int64_t>(static_cast<double>(iters) * std::min(64.0, std::max(2.0, scale)));
  }

  int64_t wrong = 0;
  if (flags.check) {
    std::fill(out.begin(), out.end(), 0);
    once();
    for (size_t i = 0; i < out_count; ++i) {
      double expect = 0;
      switch (collective) {
        case Collective::kAllreduce:
          expect = Expected(flags.op, flags.type, n, i);
          break;
        case Collective::kBroadcast:
          expect = InputValue(0, i);
          break;
        case Collective::kAllgather:
          expect = InputValue(static_cast<int>(i / count), i % count);
          break;
        case Collective::kReduceScatter:
          expect = Expected(flags.op, flags.type, n, rank * count + i);
          break;
      }
      const void* result =
          collective == Collective::kBroadcast && rank == 0 ? in.data() : out.data();
      if (Get(flags.type, result, i) != AsStored(flags.type, expect)) ++wrong;
    }
  }
  double stats[2] = {seconds, static_cast<double>(wrong)};
  double slowest[2];
  comm.Allreduce(stats, slowest, 1, DataType::kFloat64, ReduceOp::kMax);
  int64_t total_wrong = 0;
  comm.Allreduce(&wrong, &total_wrong, 1, DataType::kInt64, ReduceOp::kSum);
  if (rank != 0) return;
  double algbw = static_cast<double>(bytes) / slowest[0] / 1e9;
  double factor = 1;
  if (collective == Collective::kAllreduce) factor = 2.0 * (n - 1) / n;
  if (collective == Collective::kAllgather || collective == Collective::kReduceScatter) {
    factor = static_cast<double>(n - 1) / n;
  }
  std::printf("%12zu %12zu %8s %6s %10.1f %8.3f %8.3f %8lld\n", bytes, count,
              trainrun::collectives::DataTypeName(flags.type),
              collective == Collective::kAllreduce || collective == Collective::kReduceScatter
                  ? trainrun::collectives::ReduceOpName(flags.op)
                  : "none",
              slowest[0] * 1e6, algbw, algbw * factor, static_cast<long long>(total_wrong));
  std::fflush(stdout);
}

int RunRank(Communicator& comm, const Flags& flags, Collective collective) {
  if (comm.rank() == 0) {
    std::printf("# trainrun collectives over %s: %d ranks\n", comm.transport(), comm.size());
    std::printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "");
  }
  const size_t e = trainrun::collectives::ElementSize(flags.type);
  for (size_t bytes = std::max(flags.min_bytes, e); bytes <= flags.max_bytes;
       bytes *= flags.factor) {
    Measure(comm, flags, collective, bytes);
  }
  return 0;
}

int Main(int argc, char** argv, Collective collective) {
  Flags flags = ParseFlags(argc, argv);
  try {
    if (trainrun::env::Lookup(trainrun::env::kRendezvousAddr).has_value()) {
      auto comm = Communicator::FromEnvironment();
      return RunRank(*comm, flags, collective);
    }
    const int np = std::max(1, flags.np);
    char dir[] = "/tmp/trainrun-perf-XXXXXX";
    if (::mkdtemp(dir) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    std::vector<pid_t> children;
    for (int rank = 1; rank < np; ++rank) {
      pid_t pid = ::fork();
      if (pid == 0) {
        int code = 1;
        try {
          Communicator comm(std::make_shared<trainrun::rendezvous::FileStore>(dir), rank, np);
          code = RunRank(comm, flags, collective);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        }
        std::fflush(stdout);
        ::_exit(code);
      }
      children.push_back(pid);
    }
    int code = 0;
    {
      Communicator comm(std::make_shared<trainrun::rendezvous::FileStore>(dir), 0, np);
      code = RunRank(comm, flags, collective);
    }
    for (pid_t pid : children) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 1;
    }
    std::string cleanup = std::string("rm -rf ") + dir;
    if (std::system(cleanup.c_str()) != 0) code = 1;
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return Main(argc, argv, static_cast<Collective>(TRAINRUN_PERF_COLLECTIVE));
}
