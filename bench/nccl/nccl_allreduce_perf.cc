// nccl_allreduce_perf: allreduce bandwidth over trainrun's NCCL backend, in nccl-tests' form, so
// its figures line up with all_reduce_perf's and with ../shared/bench/peers.sh.
//
//   trainrun -np 8 build/bin/nccl_allreduce_perf -b 8 -e 128M -f 2
//   build/bin/nccl_allreduce_perf                  # outside trainrun: one rank, device 0
//
// Flags as nccl-tests': -b minbytes, -e maxbytes, -f stepfactor, -n iters, -w warmup iters,
// -c check (0/1), -d datatype (float, half, bfloat16, double, int8, uint8, int32, int64, or all),
// -o op (sum, prod, min, max, avg, or all). Sizes take K, M, G suffixes.
// Each row: out-of-place then in-place time (us, averaged over ranks), algbw = bytes / time,
// busbw = algbw * 2(n-1)/n, and #wrong (elements that differ from the float64 reference, summed
// over ranks; "N/A" with -c 0).
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/check.h"
#include "trainrun/collectives/nccl/communicator.h"
#include "trainrun/collectives/testing/nccl_elements.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::nccl {
namespace {

using ::trainrun::collectives::testing::Get;
using ::trainrun::collectives::testing::IsFloatingPoint;
using ::trainrun::collectives::testing::Put;

struct Options {
  size_t min_bytes = 8;
  size_t max_bytes = size_t{128} << 20;
  double step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::vector<DataType> types{DataType::kFloat32};
  std::vector<ReduceOp> ops{ReduceOp::kSum};
};

[[noreturn]] void Usage(const char* message) {
  std::fprintf(stderr,
               "nccl_allreduce_perf: %s\nusage: nccl_allreduce_perf [-b minbytes] [-e maxbytes] "
               "[-f stepfactor] [-n iters] [-w warmup] [-c 0|1] [-d type|all] [-o op|all]\n",
               message);
  std::exit(2);
}

size_t ParseBytes(const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  double scale = 1;
  switch (*end) {
    case 'K':
    case 'k':
      scale = 1 << 10;
      ++end;
      break;
    case 'M':
    case 'm':
      scale = 1 << 20;
      ++end;
      break;
    case 'G':
    case 'g':
      scale = 1 << 30;
      ++end;
      break;
    default:
      break;
  }
  if (end == text || *end != '\0' || value < 0) Usage("a size must look like 8, 64K, 128M or 1G");
  return static_cast<size_t>(value * scale);
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  int flag;
  while ((flag = getopt(argc, argv, "b:e:f:n:w:c:d:o:h")) != -1) {
    switch (flag) {
      case 'b':
        options.min_bytes = ParseBytes(optarg);
        break;
      case 'e':
        options.max_bytes = ParseBytes(optarg);
        break;
      case 'f':
        options.step_factor = std::atof(optarg);
        break;
      case 'n':
        options.iters = std::atoi(optarg);
        break;
      case 'w':
        options.warmup = std::atoi(optarg);
        break;
      case 'c':
        options.check = std::atoi(optarg) != 0;
        break;
      case 'd':
        if (std::string(optarg) == "all") {
          options.types.assign(std::begin(kAllDataTypes), std::end(kAllDataTypes));
        } else if (auto type = ParseDataType(optarg)) {
          options.types = {*type};
        } else {
          Usage("unknown -d datatype");
        }
        break;
      case 'o':
        if (std::string(optarg) == "all") {
          options.ops.assign(std::begin(kAllReduceOps), std::end(kAllReduceOps));
        } else if (auto op = ParseReduceOp(optarg)) {
          options.ops = {*op};
        } else {
          Usage("unknown -o op");
        }
        break;
      default:
        Usage("unknown flag");
    }
  }
  if (options.step_factor <= 1 || options.iters < 1 || options.warmup < 0 ||
      options.min_bytes > options.max_bytes) {
    Usage("need -f > 1, -n >= 1, -w >= 0 and -b <= -e");
  }
  return options;
}

// DeviceBuffer: device memory on the current device, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    TRAINRUN_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(bytes, 1)), "allocating ", bytes,
                        " bytes of GPU memory");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

// --- check data: small integers, exact in every type ------------------------------------------

double Input(ReduceOp op, int rank, size_t i) {
  if (op == ReduceOp::kProd) return rank < 3 ? 1.0 + static_cast<double>((i + rank) % 2) : 1.0;
  return static_cast<double>((i + 3 * rank) % 7);
}

double Expected(ReduceOp op, DataType type, int size, size_t i) {
  double result = Input(op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Input(op, r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) result += v;
    if (op == ReduceOp::kProd) result *= v;
    if (op == ReduceOp::kMin) result = std::min(result, v);
    if (op == ReduceOp::kMax) result = std::max(result, v);
  }
  if (op == ReduceOp::kAvg) {
    result /= size;
    if (!IsFloatingPoint(type)) result = std::trunc(result);
  }
  return result;
}

double Tolerance(DataType type, double expected) {
  const double scale = std::max(1.0, std::fabs(expected));
  if (type == DataType::kFloat16) return 1e-3 * scale;
  if (type == DataType::kBfloat16) return 1e-2 * scale;
  if (type == DataType::kFloat32) return 1e-6 * scale;
  return 1e-12 * scale;
}

void Upload(void* device, DataType type, ReduceOp op, int rank, size_t count) {
  const size_t width = ElementSize(type);
  std::vector<uint8_t> host(count * width);
  for (size_t i = 0; i < count; ++i) Put(type, host.data(), i, Input(op, rank, i));
  TRAINRUN_CUDA_CHECK(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice),
                      "uploading check data");
}

int64_t CountWrong(const void* device, DataType type, ReduceOp op, int size, size_t count) {
  const size_t width = ElementSize(type);
  std::vector<uint8_t> host(count * width);
  TRAINRUN_CUDA_CHECK(cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost),
                      "downloading the result");
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = Expected(op, type, size, i);
    // Written so that a NaN counts as wrong.
    if (!(std::fabs(Get(type, host.data(), i) - want) <= Tolerance(type, want))) ++wrong;
  }
  return wrong;
}

// --- measuring ---------------------------------------------------------------------------------

// Reduction of one double over the communicator, for averaging times and summing error counts.
double AllreduceScalar(Communicator& comm, const DeviceBuffer& scratch, double value, ReduceOp op) {
  TRAINRUN_CUDA_CHECK(cudaMemcpy(scratch.get(), &value, sizeof value, cudaMemcpyHostToDevice),
                      "uploading a scalar");
  comm.Allreduce(scratch.get(), scratch.get(), 1, DataType::kFloat64, op);
  comm.Synchronize();
  TRAINRUN_CUDA_CHECK(cudaMemcpy(&value, scratch.get(), sizeof value, cudaMemcpyDeviceToHost),
                      "downloading a scalar");
  return value;
}

struct Result {
  double time_us;
  int64_t wrong;  // -1: not checked
};

Result Measure(Communicator& comm, const Options& options, const DeviceBuffer& scratch,
               const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
  for (int i = 0; i < options.warmup; ++i) comm.Allreduce(send, recv, count, type, op);
  comm.Synchronize();
  AllreduceScalar(comm, scratch, 0, ReduceOp::kSum);  // line the ranks up before the clock starts
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.iters; ++i) comm.Allreduce(send, recv, count, type, op);
  comm.Synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Result result{AllreduceScalar(comm, scratch, seconds * 1e6 / options.iters, ReduceOp::kAvg), -1};
  if (options.check) {
    // Fresh inputs, one allreduce, compare with the float64 reference.
    Upload(const_cast<void*>(send), type, op, comm.rank(), count);
    if (send != recv) TRAINRUN_CUDA_CHECK(cudaMemset(recv, 0, count * ElementSize(type)), "clear");
    comm.Allreduce(send, recv, count, type, op);
    comm.Synchronize();
    const double wrong = static_cast<double>(CountWrong(recv, type, op, comm.size(), count));
    result.wrong = static_cast<int64_t>(AllreduceScalar(comm, scratch, wrong, ReduceOp::kSum));
  }
  return result;
}

std::unique_ptr<Communicator> Connect(rendezvous::MemoryStore& solo) {
  if (env::Lookup(env::kRendezvousAddr).has_value()) return Communicator::FromEnvironment();
  // Outside trainrun: a single rank, so the program runs on its own too.
  return Communicator::Create(solo, 0, 1, 0);
}

int Run(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  rendezvous::MemoryStore solo;
  std::unique_ptr<Communicator> comm = Connect(solo);
  const bool print = comm->rank() == 0;
  cudaDeviceProp properties{};
  TRAINRUN_CUDA_CHECK(cudaGetDeviceProperties(&properties, comm->device()), "reading the GPU");
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  if (print) {
    std::printf(
        "# nccl_allreduce_perf (trainrun NCCL backend): %d ranks, iters %d, warmup %d, "
        "check %d\n#\n",
        comm->size(), options.iters, options.warmup, options.check);
  }
  // Every rank names its GPU, in rank order, as nccl-tests does.
  for (int r = 0; r < comm->size(); ++r) {
    if (r == comm->rank()) {
      std::printf("#  Rank %2d Pid %6d on %10s device %2d [%s]\n", r, static_cast<int>(getpid()),
                  host, comm->device(), properties.name);
      std::fflush(stdout);
    }
    DeviceBuffer barrier(sizeof(double));
    AllreduceScalar(*comm, barrier, 0, ReduceOp::kSum);
  }
  if (print) {
    std::printf("#\n#%58s%s\n", "", "out-of-place                       in-place");
    std::printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                "#wrong");
    std::printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }

  DeviceBuffer scratch(sizeof(double));
  DeviceBuffer send(options.max_bytes), recv(options.max_bytes);
  TRAINRUN_CUDA_CHECK(cudaMemset(send.get(), 0, options.max_bytes), "clearing");
  const double bus_factor = comm->size() > 1 ? 2.0 * (comm->size() - 1) / comm->size() : 0.0;
  double busbw_sum = 0;
  int rows = 0;
  int64_t wrong_total = 0;
  for (DataType type : options.types) {
    for (ReduceOp op : options.ops) {
      const size_t width = ElementSize(type);
      for (double size = static_cast<double>(options.min_bytes);
           size <= static_cast<double>(options.max_bytes); size *= options.step_factor) {
        const size_t count = static_cast<size_t>(size) / width;
        const size_t bytes = count * width;
        if (count == 0) continue;
        const Result out =
            Measure(*comm, options, scratch, send.get(), recv.get(), count, type, op);
        const Result in = Measure(*comm, options, scratch, recv.get(), recv.get(), count, type, op);
        if (print) {
          auto columns = [&](const Result& r) {
            const double algbw = static_cast<double>(bytes) / (r.time_us * 1e3);  // GB/s
            char wrong[24];
            if (r.wrong < 0) {
              std::snprintf(wrong, sizeof wrong, "N/A");
            } else {
              std::snprintf(wrong, sizeof wrong, "%lld", static_cast<long long>(r.wrong));
            }
            std::printf(" %8.2f %7.2f %7.2f %6s", r.time_us, algbw, algbw * bus_factor, wrong);
            return algbw * bus_factor;
          };
          std::printf(" %11zu %13zu %9s %7s %7d", bytes, count, DataTypeName(type),
                      ReduceOpName(op), -1);
          busbw_sum += columns(out);
          busbw_sum += columns(in);
          std::printf("\n");
          std::fflush(stdout);
          rows += 2;
        }
        wrong_total += std::max<int64_t>(out.wrong, 0) + std::max<int64_t>(in.wrong, 0);
      }
    }
  }
  if (print) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong_total),
                wrong_total == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g\n#\n", rows ? busbw_sum / rows : 0.0);
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace
}  // namespace trainrun::collectives::nccl

int main(int argc, char** argv) {
  try {
    return trainrun::collectives::nccl::Run(argc, argv);
  } catch (const trainrun::Error& error) {
    std::fprintf(stderr, "nccl_allreduce_perf: %s\n", error.what());
    return 1;
  }
}
