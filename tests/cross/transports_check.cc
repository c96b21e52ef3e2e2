// transports_check: the collectives' transports and reductions on their own, with no gRPC, for the
// aarch64 cross-compile (scripts/cross-aarch64.sh builds it with g++-aarch64-linux-gnu and runs it
// under qemu-aarch64). Ranks are threads of this process (and, once, two processes over shared
// memory): over shared memory (ShmTransport: every
// rank maps one segment, the allreduce slots and the point-to-point rings) and over TCP on
// loopback (TcpTransport, addresses exchanged through a MemoryStore, the HMAC handshake), with 2
// and 4 ranks; each checks allreduce results (float32, float16, bfloat16 sum, int32 max, float64
// average) at sizes on both sides of the small and chunked paths, and a ring exchange larger than
// a ring buffer. Rank threads report failures to the main thread; the exit status is 0 only when
// every check passed, and each failure is one line naming the transport, ranks, check and element.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "algorithms.h"
#include "reduce.h"
#include "shm_transport.h"
#include "tcp_transport.h"
#include "trainrun/collectives/testing/elements.h"
#include "trainrun/rendezvous/memory_store.h"

namespace tc = trainrun::collectives;
namespace ti = trainrun::collectives::internal;

namespace {

std::mutex failures_mutex;
std::vector<std::string> failures;

void Fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(failures_mutex);
  failures.push_back(what);
}

// float16's element type and bfloat16's conversions: the helpers tests and benchmarks share
// (inputs and expected values are small integers: exact).
using tc::testing::Half;
float FromBf16(uint16_t b) { return tc::testing::Bfloat16Value(b); }
uint16_t ToBf16(float f) { return tc::testing::Bfloat16Bits(f); }

// Value is rank r's element i: small integers, so every sum is exact in every type.
int Value(int rank, size_t i) { return static_cast<int>((i * 7 + rank * 3) % 13) - 4; }

// CheckAllreduces runs the allreduces on `allreduce` (the transport's own path, or the algorithms
// over Send/Recv) and compares each element with the expected result.
void CheckAllreduces(
    const std::string& who, int rank, int size,
    const std::function<void(const void*, void*, size_t, tc::DataType, tc::ReduceOp)>& allreduce) {
  for (size_t count : {size_t{1}, size_t{1000}, size_t{9000}, size_t{700000}}) {
    const std::string at = who + ", " + std::to_string(count) + " elements: ";
    {  // float32 sum
      std::vector<float> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Value(rank, i));
      allreduce(in.data(), out.data(), count, tc::DataType::kFloat32, tc::ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int want = 0;
        for (int r = 0; r < size; ++r) want += Value(r, i);
        if (out[i] != static_cast<float>(want)) {
          Fail(at + "float32 sum element " + std::to_string(i) + " is " + std::to_string(out[i]) +
               ", expected " + std::to_string(want));
          break;
        }
      }
    }
    {  // float16 sum
      std::vector<Half> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<Half>(Value(rank, i));
      allreduce(in.data(), out.data(), count, tc::DataType::kFloat16, tc::ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int want = 0;
        for (int r = 0; r < size; ++r) want += Value(r, i);
        if (static_cast<float>(out[i]) != static_cast<float>(want)) {
          Fail(at + "float16 sum element " + std::to_string(i) + " is " +
               std::to_string(static_cast<float>(out[i])) + ", expected " + std::to_string(want));
          break;
        }
      }
    }
    {  // bfloat16 sum
      std::vector<uint16_t> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = ToBf16(static_cast<float>(Value(rank, i)));
      allreduce(in.data(), out.data(), count, tc::DataType::kBFloat16, tc::ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int want = 0;
        for (int r = 0; r < size; ++r) want += Value(r, i);
        if (FromBf16(out[i]) != static_cast<float>(want)) {
          Fail(at + "bfloat16 sum element " + std::to_string(i) + " is " +
               std::to_string(FromBf16(out[i])) + ", expected " + std::to_string(want));
          break;
        }
      }
    }
    {  // int32 max
      std::vector<int32_t> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = Value(rank, i);
      allreduce(in.data(), out.data(), count, tc::DataType::kInt32, tc::ReduceOp::kMax);
      for (size_t i = 0; i < count; ++i) {
        int want = Value(0, i);
        for (int r = 1; r < size; ++r) want = std::max(want, Value(r, i));
        if (out[i] != want) {
          Fail(at + "int32 max element " + std::to_string(i) + " is " + std::to_string(out[i]) +
               ", expected " + std::to_string(want));
          break;
        }
      }
    }
    {  // float64 average, in place
      std::vector<double> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = Value(rank, i);
      allreduce(data.data(), data.data(), count, tc::DataType::kFloat64, tc::ReduceOp::kAverage);
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += Value(r, i);
        want /= size;
        if (std::fabs(data[i] - want) > 1e-12) {
          Fail(at + "float64 average element " + std::to_string(i) + " is " +
               std::to_string(data[i]) + ", expected " + std::to_string(want));
          break;
        }
      }
    }
  }
}

// CheckRing sends a message larger than a shared-memory ring buffer to the right neighbour and
// receives one from the left, byte for byte.
void CheckRing(const std::string& who, ti::Transport& transport) {
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t bytes = (1 << 20) + 12345;
  std::vector<unsigned char> out(bytes), in(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 31 + rank);
  const int left = (rank + size - 1) % size;
  ti::Request r = transport.Recv(left, in.data(), bytes);
  transport.Send((rank + 1) % size, out.data(), bytes);
  transport.Wait(r);
  transport.WaitAll();
  transport.Finished();
  for (size_t i = 0; i < bytes; ++i) {
    if (in[i] != static_cast<unsigned char>(i * 31 + left)) {
      Fail(who + ": ring byte " + std::to_string(i) + " from rank " + std::to_string(left) +
           " is " + std::to_string(in[i]));
      return;
    }
  }
}

// RunRanks runs `body(rank)` on `size` threads and records what any of them threw.
void RunRanks(const std::string& who, int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        Fail(who + " rank " + std::to_string(rank) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
}

void CheckShm(int size) {
  const std::string who = "shm, " + std::to_string(size) + " ranks";
  ti::ShmOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  const size_t bytes = ti::ShmTransport::SegmentBytes(size, options);
  // Rank 0 creates the segment; the others map it through /proc as ranks of other processes do.
  std::vector<ti::ShmSegment> segments;
  segments.push_back(ti::ShmSegment::Create(bytes));
  for (int rank = 1; rank < size; ++rank) {
    segments.push_back(ti::ShmSegment::Open(getpid(), segments[0].fd(), bytes));
  }
  segments[0].CloseFd();
  std::vector<std::unique_ptr<ti::ShmTransport>> transports(size);
  for (int rank = 0; rank < size; ++rank) {
    transports[rank] =
        std::make_unique<ti::ShmTransport>(std::move(segments[rank]), rank, size, options);
  }
  for (auto& t : transports) t->WatchPeers();
  RunRanks(who, size, [&](int rank) {
    ti::ShmTransport& transport = *transports[rank];
    CheckAllreduces(
        who, rank, size,
        [&](const void* in, void* out, size_t count, tc::DataType type, tc::ReduceOp op) {
          if (!transport.TryAllreduce(in, out, count, type, op)) {
            throw std::runtime_error("TryAllreduce declined " + std::to_string(count) +
                                     " elements");
          }
          transport.Finished();
        });
    CheckRing(who, transport);
  });
}

// CheckShmProcesses runs two ranks as processes, as jobs do: the child maps the parent's segment
// through /proc, each watches the other's pidfd, and a pipe stands in for the store's barrier
// between construction and the first operation. The child prints its failures and exits 1.
void CheckShmProcesses() {
  const std::string who = "shm, 2 processes";
  ti::ShmOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  const size_t bytes = ti::ShmTransport::SegmentBytes(2, options);
  ti::ShmSegment segment = ti::ShmSegment::Create(bytes);
  const pid_t parent = getpid();
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) {
    Fail(who + ": pipe failed");
    return;
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    Fail(who + ": fork failed");
    return;
  }
  const int rank = child == 0 ? 1 : 0;
  char byte = 0;
  try {
    ti::ShmSegment mine =
        rank == 0 ? std::move(segment) : ti::ShmSegment::Open(parent, segment.fd(), bytes);
    if (rank == 1) segment = ti::ShmSegment();
    ti::ShmTransport transport(std::move(mine), rank, 2, options);
    // Barrier: the child says it is constructed, the parent answers.
    if (rank == 1) {
      if (write(to_parent[1], &byte, 1) != 1 || read(to_child[0], &byte, 1) != 1) {
        throw std::runtime_error("the barrier pipe broke");
      }
    } else {
      if (read(to_parent[0], &byte, 1) != 1 || write(to_child[1], &byte, 1) != 1) {
        throw std::runtime_error("the barrier pipe broke (the child ended?)");
      }
    }
    transport.WatchPeers();
    CheckAllreduces(
        who, rank, 2,
        [&](const void* in, void* out, size_t count, tc::DataType type, tc::ReduceOp op) {
          if (!transport.TryAllreduce(in, out, count, type, op)) {
            throw std::runtime_error("TryAllreduce declined " + std::to_string(count) +
                                     " elements");
          }
          transport.Finished();
        });
    CheckRing(who, transport);
  } catch (const std::exception& e) {
    Fail(who + " rank " + std::to_string(rank) + " threw: " + e.what());
  }
  if (child == 0) {
    for (const auto& f : failures) std::fprintf(stderr, "transports_check: %s\n", f.c_str());
    std::fflush(nullptr);
    _exit(failures.empty() ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Fail(who + ": rank 1 (the child process) failed, status " + std::to_string(status));
  }
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

void CheckTcp(int size) {
  const std::string who = "tcp, " + std::to_string(size) + " ranks";
  trainrun::rendezvous::MemoryStore store;
  RunRanks(who, size, [&](int rank) {
    ti::TcpOptions options;
    options.name = "cross" + std::to_string(size);
    options.listen_host = "127.0.0.1";
    options.token = "cross-aarch64-token";
    options.job_id = "cross-aarch64";
    options.timeout = std::chrono::milliseconds(60000);
    ti::TcpTransport transport(store, rank, size, options);
    std::vector<char> scratch;
    ti::AlgorithmContext ctx{transport, 1 << 20, 64 << 10, scratch};
    CheckAllreduces(who, rank, size,
                    [&](const void* in, void* out, size_t count, tc::DataType type,
                        tc::ReduceOp op) { ti::Allreduce(ctx, in, out, count, type, op); });
    CheckRing(who, transport);
  });
}

}  // namespace

int main() {
  std::printf("transports_check: reductions dispatch to %s\n", ti::ReduceIsa());
  for (int size : {2, 4}) {
    const size_t before = failures.size();
    CheckShm(size);
    std::printf("shm, %d ranks: %s\n", size, failures.size() == before ? "ok" : "FAILED");
  }
  {
    const size_t before = failures.size();
    CheckShmProcesses();
    std::printf("shm, 2 processes: %s\n", failures.size() == before ? "ok" : "FAILED");
  }
  for (int size : {2, 4}) {
    const size_t before = failures.size();
    CheckTcp(size);
    std::printf("tcp, %d ranks: %s\n", size, failures.size() == before ? "ok" : "FAILED");
  }
  for (const auto& f : failures) std::fprintf(stderr, "transports_check: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}
