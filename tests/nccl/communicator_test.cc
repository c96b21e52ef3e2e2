// The NCCL communicator on real GPUs: ranks as threads, one GPU each (size 1 where only one GPU
// exists), results compared with a reference computed in float64. Labelled `gpu`; gpu_main.cc skips
// the executable where CUDA sees no device.
#include "trainrun/collectives/nccl/communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "skip_test.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/check.h"
#include "trainrun/collectives/testing/nccl_elements.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::nccl {
namespace {

using std::chrono::milliseconds;

int VisibleGpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// Sizes to test: 1, and the visible GPUs up to 4 (ranks as threads, one GPU each).
std::vector<int> WorldSizes() {
  std::vector<int> sizes{1};
  const int gpus = std::min(VisibleGpus(), 4);
  for (int n = 2; n <= gpus; ++n) sizes.push_back(n);
  return sizes;
}

// --- host-side encoding of test values (the element helpers tests and benchmarks share) --------

using ::trainrun::collectives::testing::Get;
using ::trainrun::collectives::testing::IsFloatingPoint;
using ::trainrun::collectives::testing::Put;

std::vector<uint8_t> Encode(DataType type, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * ElementSize(type));
  for (size_t i = 0; i < values.size(); ++i) Put(type, bytes.data(), i, values[i]);
  return bytes;
}

std::vector<double> Decode(DataType type, const std::vector<uint8_t>& bytes) {
  std::vector<double> values(bytes.size() / ElementSize(type));
  for (size_t i = 0; i < values.size(); ++i) values[i] = Get(type, bytes.data(), i);
  return values;
}

double Tolerance(DataType type, double expected) {
  switch (type) {
    case DataType::kFloat16:
      return 2e-3 * std::max(1.0, std::fabs(expected));
    case DataType::kBfloat16:
      return 1e-2 * std::max(1.0, std::fabs(expected));
    case DataType::kFloat32:
      return 1e-5 * std::max(1.0, std::fabs(expected));
    case DataType::kFloat64:
      return 1e-12 * std::max(1.0, std::fabs(expected));
    default:
      return 0;
  }
}

// Input of rank `r` at element `i` for `op`, small enough that no type overflows for 4 ranks.
double Input(ReduceOp op, int r, size_t i) {
  if (op == ReduceOp::kProd) return r < 3 ? 1.0 + static_cast<double>((i + r) % 2) : 1.0;
  return static_cast<double>((i * 7 + r * 3) % 11);
}

double Reference(ReduceOp op, DataType type, int size, size_t i) {
  double result = Input(op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Input(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        result += v;
        break;
      case ReduceOp::kProd:
        result *= v;
        break;
      case ReduceOp::kMin:
        result = std::min(result, v);
        break;
      case ReduceOp::kMax:
        result = std::max(result, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    result /= size;
    if (!IsFloatingPoint(type)) result = std::trunc(result);
  }
  return result;
}

// DeviceBuffer: device memory on the calling thread's current device, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    TRAINRUN_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(bytes, 1)), "allocating ", bytes);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  void* get() const { return data_; }
  void Upload(const std::vector<uint8_t>& bytes) {
    TRAINRUN_CUDA_CHECK(cudaMemcpy(data_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
                        "uploading");
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> bytes(bytes_);
    TRAINRUN_CUDA_CHECK(cudaMemcpy(bytes.data(), data_, bytes_, cudaMemcpyDeviceToHost),
                        "downloading");
    return bytes;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// CallerStream: a stream the test owns, to check collectives on a caller-given stream.
class CallerStream {
 public:
  CallerStream() { TRAINRUN_CUDA_CHECK(cudaStreamCreate(&stream_), "creating a stream"); }
  CallerStream(const CallerStream&) = delete;
  CallerStream& operator=(const CallerStream&) = delete;
  ~CallerStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// RunRanks runs `body(comm)` for every rank of a fresh communicator of `size` ranks (threads, GPU
// = rank) and returns the failures the ranks describe (Catch assertions are not thread-safe, so
// ranks report in words and the test thread asserts).
std::vector<std::string> RunRanks(int size, const std::string& name,
                                  const std::function<std::string(Communicator&)>& body) {
  rendezvous::MemoryStore store;
  std::vector<std::future<std::string>> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.push_back(std::async(std::launch::async, [&, rank]() -> std::string {
      try {
        CommunicatorOptions options;
        options.name = name;
        options.timeout = milliseconds(60000);
        auto comm = Communicator::Create(store, rank, size, rank, options);
        return body(*comm);
      } catch (const std::exception& error) {
        return "rank " + std::to_string(rank) + " threw: " + error.what();
      }
    }));
  }
  std::vector<std::string> failures;
  for (auto& rank : ranks) {
    std::string failure = rank.get();
    if (!failure.empty()) failures.push_back(failure);
  }
  return failures;
}

std::string Compare(const std::string& what, DataType type, const std::vector<double>& got,
                    const std::function<double(size_t)>& expected) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = expected(i);
    if (std::fabs(got[i] - want) > Tolerance(type, want)) {
      return what + " " + DataTypeName(type) + ": element " + std::to_string(i) + " is " +
             std::to_string(got[i]) + ", expected " + std::to_string(want);
    }
  }
  return "";
}

constexpr size_t kCount = 1003;  // odd, so no collective gets an even split for free

TEST_CASE("allreduce: every type and op matches a float64 reference", "[nccl][gpu]") {
  for (int size : WorldSizes()) {
    auto failures = RunRanks(size, "allreduce-" + std::to_string(size), [&](Communicator& comm) {
      CallerStream caller;
      int step = 0;
      for (DataType type : kAllDataTypes) {
        for (ReduceOp op : kAllReduceOps) {
          std::vector<double> input(kCount);
          for (size_t i = 0; i < kCount; ++i) input[i] = Input(op, comm.rank(), i);
          DeviceBuffer buffer(kCount * ElementSize(type));
          buffer.Upload(Encode(type, input));
          // Alternate the communicator's own stream and a caller-given one.
          cudaStream_t stream = (step++ % 2 == 0) ? nullptr : caller.get();
          comm.Allreduce(buffer.get(), buffer.get(), kCount, type, op, stream);
          comm.Synchronize(stream);
          std::string failure = Compare(
              std::string("allreduce ") + ReduceOpName(op), type, Decode(type, buffer.Download()),
              [&](size_t i) { return Reference(op, type, comm.size(), i); });
          if (!failure.empty()) return failure;
        }
      }
      return std::string();
    });
    CAPTURE(size);
    CHECK(failures.empty());
    for (const auto& failure : failures) WARN(failure);
  }
}

TEST_CASE("broadcast, allgather and reduce-scatter move the right elements", "[nccl][gpu]") {
  for (int size : WorldSizes()) {
    auto failures = RunRanks(size, "moves-" + std::to_string(size), [&](Communicator& comm) {
      const int n = comm.size();
      const int rank = comm.rank();
      for (DataType type : {DataType::kFloat32, DataType::kInt8, DataType::kBfloat16}) {
        const size_t bytes = ElementSize(type);
        for (int root = 0; root < n; ++root) {
          std::vector<double> mine(kCount);
          for (size_t i = 0; i < kCount; ++i) mine[i] = static_cast<double>((i + rank) % 13);
          DeviceBuffer send(kCount * bytes), recv(kCount * bytes);
          send.Upload(Encode(type, mine));
          comm.Broadcast(send.get(), recv.get(), kCount, type, root);
          comm.Synchronize();
          std::string failure =
              Compare("broadcast from " + std::to_string(root), type, Decode(type, recv.Download()),
                      [&](size_t i) { return static_cast<double>((i + root) % 13); });
          if (!failure.empty()) return failure;
        }

        std::vector<double> block(kCount);
        for (size_t i = 0; i < kCount; ++i) block[i] = static_cast<double>((rank * 5 + i) % 17);
        DeviceBuffer send(kCount * bytes), gathered(kCount * n * bytes);
        send.Upload(Encode(type, block));
        comm.Allgather(send.get(), gathered.get(), kCount, type);
        comm.Synchronize();
        std::string failure =
            Compare("allgather", type, Decode(type, gathered.Download()), [&](size_t j) {
              const size_t from = j / kCount, i = j % kCount;
              return static_cast<double>((from * 5 + i) % 17);
            });
        if (!failure.empty()) return failure;

        std::vector<double> full(kCount * n);
        for (size_t j = 0; j < full.size(); ++j) full[j] = static_cast<double>((j + rank) % 5);
        DeviceBuffer whole(full.size() * bytes), part(kCount * bytes);
        whole.Upload(Encode(type, full));
        comm.ReduceScatter(whole.get(), part.get(), kCount, type, ReduceOp::kSum);
        comm.Synchronize();
        failure = Compare("reduce-scatter sum", type, Decode(type, part.Download()), [&](size_t i) {
          const size_t j = rank * kCount + i;
          double sum = 0;
          for (int r = 0; r < n; ++r) sum += static_cast<double>((j + r) % 5);
          return sum;
        });
        if (!failure.empty()) return failure;
      }
      return std::string();
    });
    CAPTURE(size);
    CHECK(failures.empty());
    for (const auto& failure : failures) WARN(failure);
  }
}

TEST_CASE("bad arguments throw and an aborted communicator refuses work", "[nccl][gpu]") {
  auto failures = RunRanks(1, "errors", [](Communicator& comm) -> std::string {
    DeviceBuffer buffer(64);
    try {
      comm.Broadcast(buffer.get(), buffer.get(), 4, DataType::kFloat32, /*root=*/1);
      return "broadcast from root 1 of 1 did not throw";
    } catch (const InvalidArgumentError&) {
    }
    comm.Abort();
    if (!comm.aborted()) return "Abort left the communicator live";
    try {
      comm.Allreduce(buffer.get(), buffer.get(), 4, DataType::kFloat32, ReduceOp::kSum);
      return "allreduce after Abort did not throw";
    } catch (const Error& error) {
      if (std::string(error.what()).find("aborted") == std::string::npos) {
        return std::string("unexpected message: ") + error.what();
      }
    }
    comm.Abort();  // twice is fine
    return "";
  });
  CHECK(failures.empty());
  for (const auto& failure : failures) WARN(failure);
}

TEST_CASE("a rank that never joins makes creation time out and abort", "[nccl][gpu]") {
  rendezvous::MemoryStore store;
  CommunicatorOptions options;
  options.name = "lonely";
  options.timeout = milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of 2 publishes the ID and starts joining; rank 1 never comes.
  CHECK_THROWS_AS(Communicator::Create(store, 0, 2, 0, options), TimeoutError);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed >= milliseconds(2000));
  CHECK(elapsed < milliseconds(30000));
}

TEST_CASE("a peer that stops taking part releases the other ranks by the deadline", "[nccl][gpu]") {
  if (VisibleGpus() < 2) {
    trainrun::testing::SkipTest("needs 2 GPUs; " + std::to_string(VisibleGpus()) + " visible");
  }
  rendezvous::MemoryStore store;
  std::promise<void> joined;
  std::shared_future<void> both_joined = joined.get_future().share();
  auto peer = std::async(std::launch::async, [&]() -> std::string {
    try {
      CommunicatorOptions options;
      options.name = "deserted";
      auto comm = Communicator::Create(store, 1, 2, 1, options);
      both_joined.wait();
      comm->Abort();  // rank 1 "fails": it never enqueues the allreduce rank 0 waits in
      return "";
    } catch (const std::exception& error) {
      return error.what();
    }
  });
  CommunicatorOptions options;
  options.name = "deserted";
  options.timeout = milliseconds(3000);
  auto comm = Communicator::Create(store, 0, 2, 0, options);
  joined.set_value();
  DeviceBuffer buffer(1 << 20);
  const auto start = std::chrono::steady_clock::now();
  bool released = false;
  try {
    comm->Allreduce(buffer.get(), buffer.get(), (1 << 20) / 4, DataType::kFloat32, ReduceOp::kSum);
    comm->Synchronize();
  } catch (const TimeoutError&) {
    released = true;
  } catch (const IoError&) {
    released = true;
  }
  CHECK(released);
  CHECK(comm->aborted());
  CHECK(std::chrono::steady_clock::now() - start < milliseconds(30000));
  CHECK(peer.get().empty());
}

}  // namespace
}  // namespace trainrun::collectives::nccl
