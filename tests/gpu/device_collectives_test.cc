// DeviceCollectives over the CPU fake of a GPU runtime, on both paths (host-staged, and NCCL over
// the fake NCCL of fake_nccl.h): every collective and type on "device" buffers at 1, 2 and 3 ranks
// against a float64 reference, the stream-order protocol with delayed "kernels" and no
// synchronize, 200 collectives in flight collected in any order, pinned and fusion buffers reused,
// tensor fusion where the ranks' queues differ (in length, or in a later call's count), prescale
// and postscale, and ranks whose calls differ failing loudly. Ranks are threads over the in-memory
// store; each runs its collectives' Run on a thread of its own, as the Python bindings'
// communication thread does.
#include "trainrun/collectives/gpu/device_collectives.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "fake_gpu_runtime.h"
#include "fake_nccl.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/testing/elements.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::gpu {
namespace {

using testing::FakeGpuRuntime;
using testing::FakeNccl;
using ::trainrun::collectives::testing::Get;
using ::trainrun::collectives::testing::Put;

const std::vector<DataType> kTypes = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                      DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                      DataType::kUInt8,    DataType::kInt8,    DataType::kInt16,
                                      DataType::kBool};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct};

using ::trainrun::collectives::testing::IsFloatingPoint;

// Value: element i of rank r's input, small enough that any reduction of 3 ranks is exact.
double Value(DataType type, ReduceOp op, int rank, size_t i) {
  if (type == DataType::kBool) return static_cast<double>((i + static_cast<size_t>(rank)) % 3 == 0);
  if (op == ReduceOp::kProduct) return static_cast<double>((i + rank) % 3 == 0 ? 2 : 1);
  const int64_t v = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3) % 11);
  return type == DataType::kUInt8 ? static_cast<double>(v) : static_cast<double>(v - 5);
}

double Reduce(DataType type, ReduceOp op, int size, size_t i) {
  double acc = Value(type, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Value(type, op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kAdasum:  // not element-wise, and not among kOps
        break;
    }
  }
  if (type == DataType::kBool) return acc != 0 ? 1 : 0;
  if (op == ReduceOp::kAverage) return IsFloatingPoint(type) ? acc / size : std::trunc(acc / size);
  return acc;
}

double Tolerance(DataType type) {
  return type == DataType::kFloat16 ? 1e-2 : type == DataType::kBFloat16 ? 3e-2 : 1e-6;
}

// A rank: its host communicator and its GPU collectives over the shared fake.
struct Rank {
  Rank(std::shared_ptr<rendezvous::Store> store, int rank, int size, GpuRuntime& runtime,
       DeviceOptions options = {})
      : comm(std::move(store), rank, size, Options()), gpu(comm, runtime, options) {}
  static CommunicatorOptions Options() {
    CommunicatorOptions options;
    options.job_token = "gpu-test";
    options.job_id = "gpu-test";
    options.listen_address = "127.0.0.1";
    return options;
  }
  Communicator comm;
  DeviceCollectives gpu;
};

// RanksWith runs `fn` on `size` rank threads, rank r's GPU collectives with options_of(r), and
// rethrows the first failure.
void RanksWith(int size, GpuRuntime& runtime, const std::function<DeviceOptions(int)>& options_of,
               const std::function<void(Rank&)>& fn) {
  auto store = std::make_shared<rendezvous::MemoryStore>();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Rank rank(store, r, size, runtime, options_of(r));
        fn(rank);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Ranks runs `fn` on `size` rank threads, every rank with `options`.
void Ranks(int size, GpuRuntime& runtime, const std::function<void(Rank&)>& fn,
           DeviceOptions options = {}) {
  RanksWith(
      size, runtime, [&](int) { return options; }, fn);
}

// Execute runs one collective through its three steps, Run on a thread of its own.
void Execute(DeviceCollectives& gpu, DeviceCall call) {
  std::shared_ptr<DeviceWork> work = gpu.Start(std::move(call));
  std::exception_ptr error;
  std::thread thread([&] {
    try {
      work->Run();
    } catch (...) {
      error = std::current_exception();
    }
  });
  thread.join();
  if (error) std::rethrow_exception(error);
  work->Wait();
}

// DeviceBuffer: `count` elements on `rank`'s fake device, freed at the end of the scope.
struct DeviceBuffer {
  DeviceBuffer(GpuRuntime& runtime, size_t count, DataType type, int device)
      : runtime(runtime), bytes(count * ElementSize(type)) {
    data = static_cast<char*>(runtime.AllocDevice(bytes, device));
    std::memset(data, 0x7f, bytes);
  }
  ~DeviceBuffer() { runtime.FreeDevice(data); }
  GpuRuntime& runtime;
  size_t bytes;
  char* data;
};

// CheckAll runs every collective and type on `size` ranks, host-staged, or over the fake NCCL
// (`nccl`) with fusion on (every allreduce exchanges first, NcclAgree).
void CheckAll(int size, bool nccl = false) {
  FakeGpuRuntime fake(size);
  FakeNccl fake_nccl(fake);
  DeviceOptions options;
  if (nccl) {
    options.nccl_api_for_tests = fake_nccl.api();
    options.fusion_bytes = size_t{64} << 20;
  }
  const auto check = [&](Rank& rank) {
    const int me = rank.comm.rank();
    const int n = rank.comm.size();
    for (DataType type : kTypes) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}}) {
        // allreduce: every op, in place and out of place.
        for (ReduceOp op : kOps) {
          if (type == DataType::kBool && op == ReduceOp::kAverage) continue;
          for (bool in_place : {true, false}) {
            DeviceBuffer in(fake, count, type, me);
            DeviceBuffer out(fake, count, type, me);
            for (size_t i = 0; i < count; ++i) Put(type, in.data, i, Value(type, op, me, i));
            DeviceCall call;
            call.op = DeviceOp::kAllreduce;
            call.inputs = {in.data};
            call.input_counts = {count};
            call.outputs = {in_place ? in.data : out.data};
            call.type = type;
            call.reduce = op;
            Execute(rank.gpu, call);
            const char* result = in_place ? in.data : out.data;
            for (size_t i = 0; i < count; ++i) {
              const double want = Reduce(type, op, n, i);
              const double got = Get(type, result, i);
              if (std::abs(got - want) > Tolerance(type) * std::max(1.0, std::abs(want))) {
                FAIL("allreduce " << DataTypeName(type) << " " << ReduceOpName(op) << " count "
                                  << count << " rank " << me << "/" << n << " element " << i << ": "
                                  << got << " != " << want);
              }
            }
          }
        }
        // grouped allreduce of three buffers (sum).
        {
          std::vector<std::unique_ptr<DeviceBuffer>> parts;
          DeviceCall call;
          call.op = DeviceOp::kGroupedAllreduce;
          call.type = type;
          call.reduce = ReduceOp::kSum;
          for (size_t k = 0; k < 3; ++k) {
            parts.push_back(std::make_unique<DeviceBuffer>(fake, count + k, type, me));
            for (size_t i = 0; i < count + k; ++i) {
              Put(type, parts.back()->data, i, Value(type, ReduceOp::kSum, me, i + k));
            }
            call.inputs.push_back(parts.back()->data);
            call.input_counts.push_back(count + k);
          }
          Execute(rank.gpu, call);
          for (size_t k = 0; k < 3; ++k) {
            for (size_t i = 0; i < count + k; ++i) {
              REQUIRE(Get(type, parts[k]->data, i) ==
                      Approx(Reduce(type, ReduceOp::kSum, n, i + k)).margin(Tolerance(type) * 16));
            }
          }
        }
        // broadcast from the last rank.
        {
          DeviceBuffer data(fake, count, type, me);
          for (size_t i = 0; i < count; ++i)
            Put(type, data.data, i, Value(type, ReduceOp::kMax, me, i));
          DeviceCall call;
          call.op = DeviceOp::kBroadcast;
          call.inputs = {data.data};
          call.input_counts = {count};
          call.type = type;
          call.root = n - 1;
          Execute(rank.gpu, call);
          for (size_t i = 0; i < count; ++i) {
            REQUIRE(Get(type, data.data, i) == Value(type, ReduceOp::kMax, n - 1, i));
          }
        }
        // allgatherv: rank r gives count + r elements.
        {
          std::vector<size_t> counts;
          size_t total = 0;
          for (int r = 0; r < n; ++r) {
            counts.push_back(count + r);
            total += count + r;
          }
          DeviceBuffer in(fake, counts[me], type, me);
          DeviceBuffer out(fake, total, type, me);
          for (size_t i = 0; i < counts[me]; ++i)
            Put(type, in.data, i, Value(type, ReduceOp::kMax, me, i));
          DeviceCall call;
          call.op = DeviceOp::kAllgatherv;
          call.inputs = {in.data};
          call.input_counts = {counts[me]};
          call.outputs = {out.data};
          call.output_count = total;
          call.counts = counts;
          call.type = type;
          Execute(rank.gpu, call);
          size_t offset = 0;
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < counts[r]; ++i) {
              REQUIRE(Get(type, out.data, offset + i) == Value(type, ReduceOp::kMax, r, i));
            }
            offset += counts[r];
          }
        }
        // reducescatter (sum): each rank keeps block rank of count elements.
        if (type != DataType::kBool) {
          DeviceBuffer in(fake, count * n, type, me);
          DeviceBuffer out(fake, count, type, me);
          for (size_t i = 0; i < count * n; ++i)
            Put(type, in.data, i, Value(type, ReduceOp::kSum, me, i));
          DeviceCall call;
          call.op = DeviceOp::kReduceScatter;
          call.inputs = {in.data};
          call.input_counts = {count * n};
          call.outputs = {out.data};
          call.output_count = count;
          call.type = type;
          call.reduce = ReduceOp::kSum;
          Execute(rank.gpu, call);
          for (size_t i = 0; i < count; ++i) {
            REQUIRE(Get(type, out.data, i) ==
                    Approx(Reduce(type, ReduceOp::kSum, n, me * count + i))
                        .margin(Tolerance(type) * 16));
          }
        }
        // alltoallv: rank s sends s + d + 1 elements to rank d.
        {
          std::vector<size_t> sends, recvs;
          for (int d = 0; d < n; ++d)
            sends.push_back(static_cast<size_t>(me + d + 1) * (count % 7 + 1));
          for (int s = 0; s < n; ++s)
            recvs.push_back(static_cast<size_t>(s + me + 1) * (count % 7 + 1));
          size_t sent = 0, received = 0;
          for (size_t c : sends) sent += c;
          for (size_t c : recvs) received += c;
          DeviceBuffer in(fake, sent, type, me);
          DeviceBuffer out(fake, received, type, me);
          for (size_t i = 0; i < sent; ++i)
            Put(type, in.data, i, Value(type, ReduceOp::kMax, me, i));
          DeviceCall call;
          call.op = DeviceOp::kAlltoallv;
          call.inputs = {in.data};
          call.input_counts = {sent};
          call.outputs = {out.data};
          call.output_count = received;
          call.send_counts = sends;
          call.counts = recvs;
          call.type = type;
          Execute(rank.gpu, call);
          size_t offset = 0;
          for (int s = 0; s < n; ++s) {
            size_t from = 0;  // where rank s's block for me starts in its input
            for (int d = 0; d < me; ++d) from += static_cast<size_t>(s + d + 1) * (count % 7 + 1);
            for (size_t i = 0; i < recvs[s]; ++i) {
              REQUIRE(Get(type, out.data, offset + i) == Value(type, ReduceOp::kMax, s, from + i));
            }
            offset += recvs[s];
          }
        }
      }
    }
    if (nccl) {
      REQUIRE(rank.gpu.path() == Path::kNccl);
      return;
    }
    REQUIRE(rank.gpu.path() == Path::kStaged);
    // The rank that lacks NCCL names its reason, the others name that rank.
    REQUIRE_THAT(rank.gpu.why(),
                 Catch::Contains(me == 0 ? "the GPU runtime is the tests' CPU fake"
                                         : "rank 0 of the communicator has no NCCL"));
  };
  Ranks(size, fake, check, options);
  REQUIRE(fake_nccl.failures().empty());
  REQUIRE((fake_nccl.allreduces() > 0) == nccl);
}

TEST_CASE("staged: every collective and type on device buffers at 1 rank", "[gpu_fake]") {
  CheckAll(1);
}
TEST_CASE("staged: every collective and type on device buffers at 2 ranks", "[gpu_fake]") {
  CheckAll(2);
}
TEST_CASE("staged: every collective and type on device buffers at 3 ranks", "[gpu_fake]") {
  CheckAll(3);
}
TEST_CASE("nccl (fake): every collective and type on device buffers at 1 rank", "[gpu_fake]") {
  CheckAll(1, /*nccl=*/true);
}
TEST_CASE("nccl (fake): every collective and type on device buffers at 2 ranks", "[gpu_fake]") {
  CheckAll(2, /*nccl=*/true);
}
TEST_CASE("nccl (fake): every collective and type on device buffers at 3 ranks", "[gpu_fake]") {
  CheckAll(3, /*nccl=*/true);
}

// A float32 allreduce (sum) of `count` elements, in place, ordered on `stream`.
DeviceCall SumOn(void* data, size_t count, Stream stream) {
  DeviceCall call;
  call.op = DeviceOp::kAllreduce;
  call.inputs = {data};
  call.input_counts = {count};
  call.outputs = {data};
  call.type = DataType::kFloat32;
  call.reduce = ReduceOp::kSum;
  call.has_stream = true;
  call.stream = stream;
  return call;
}

TEST_CASE(
    "staged: stream order without synchronize: a delayed kernel writes, the allreduce "
    "reads after it, a later kernel reads the result",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    const size_t count = 4096;
    Stream stream = fake.NewStream(me);
    auto* data = static_cast<float*>(fake.AllocDevice(count * 4, me));
    std::fill(data, data + count, -1.0f);
    // The "kernel" writes the values 200 ms after it is launched; nothing waits for it on the CPU.
    fake.Launch(stream, [=] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((me + 1) * i);
    });
    const auto before = std::chrono::steady_clock::now();
    std::shared_ptr<DeviceWork> work = rank.gpu.Start(SumOn(data, count, stream));
    REQUIRE(std::chrono::steady_clock::now() - before < std::chrono::milliseconds(150));
    std::thread comm_thread([&] { work->Run(); });
    comm_thread.join();
    work->Wait();
    // A later "kernel" on the same stream reads the buffer into host memory.
    std::vector<float> seen(count);
    fake.Launch(stream, [&] { std::memcpy(seen.data(), data, count * 4); });
    fake.Synchronize(stream);  // the test observing its kernel, not the code under test
    for (size_t i = 0; i < count; ++i) REQUIRE(seen[i] == static_cast<float>(3 * i));
    fake.FreeDevice(data);
    fake.DeleteStream(stream);
  });
}

TEST_CASE("staged: the caller's stream waits for the copy back, not the CPU", "[gpu_fake]") {
  // Wait() orders the stream after the results: a kernel launched right after reads them even
  // though the copy back is slowed down (the fake's copies run on the staging stream's thread).
  FakeGpuRuntime fake(1);
  Ranks(1, fake, [&](Rank& rank) {
    const size_t count = 1 << 20;
    Stream stream = fake.NewStream(0);
    auto* data = static_cast<float*>(fake.AllocDevice(count * 4, 0));
    std::fill(data, data + count, 2.0f);
    auto work = rank.gpu.Start(SumOn(data, count, stream));
    work->Run();
    work->Wait();
    float first = 0;
    fake.Launch(stream, [&] { first = data[count - 1]; });
    fake.Synchronize(stream);
    REQUIRE(first == 2.0f);
    fake.FreeDevice(data);
    fake.DeleteStream(stream);
  });
}

TEST_CASE("staged: 200 collectives in flight, collected in any order", "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    constexpr int kInFlight = 200;
    Stream stream = fake.NewStream(me);
    std::vector<float*> buffers;
    std::vector<std::shared_ptr<DeviceWork>> works;
    // The communication thread runs what is queued, in order, while the caller goes on.
    std::mutex mutex;
    std::condition_variable queued;
    std::deque<std::shared_ptr<DeviceWork>> queue;
    std::atomic<int> ran{0};
    std::exception_ptr error;
    std::thread comm_thread([&] {
      for (int k = 0; k < kInFlight; ++k) {
        std::shared_ptr<DeviceWork> work;
        {
          std::unique_lock<std::mutex> lock(mutex);
          queued.wait(lock, [&] { return !queue.empty(); });
          work = queue.front();
          queue.pop_front();
        }
        try {
          work->Run();
        } catch (...) {
          error = std::current_exception();
        }
        ++ran;
      }
    });
    for (int k = 0; k < kInFlight; ++k) {
      const size_t count = 1 + static_cast<size_t>(k) * 37;
      auto* data = static_cast<float*>(fake.AllocDevice(count * 4, me));
      fake.Launch(stream, [=] {
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(k + me * 1000 + i % 5);
      });
      buffers.push_back(data);
      works.push_back(rank.gpu.Start(SumOn(data, count, stream)));
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(works.back());
      queued.notify_one();
    }
    std::vector<int> order(kInFlight);
    for (int k = 0; k < kInFlight; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), std::mt19937(me + 7));
    // Wait may only follow Run: collect each once the thread is past it, in the shuffled order.
    comm_thread.join();
    if (error) std::rethrow_exception(error);
    for (int k : order) works[k]->Wait();
    std::vector<float> seen;
    for (int k : order) {
      const size_t count = 1 + static_cast<size_t>(k) * 37;
      seen.assign(count, 0);
      float* data = buffers[k];
      fake.Launch(stream, [&, data, count] { std::memcpy(seen.data(), data, count * 4); });
      fake.Synchronize(stream);
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(seen[i] == static_cast<float>(2 * k + 1000 + 2 * (i % 5)));
      }
    }
    for (float* data : buffers) fake.FreeDevice(data);
    fake.DeleteStream(stream);
  });
}

TEST_CASE("staged: pinned buffers are reused (allocations flat after warm-up)", "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    std::vector<size_t> counts = {256, 1 << 18, 1 << 20, 3000000};
    std::vector<float*> buffers;
    for (size_t count : counts)
      buffers.push_back(static_cast<float*>(fake.AllocDevice(count * 4, me)));
    auto step = [&] {
      std::vector<std::shared_ptr<DeviceWork>> works;
      for (size_t k = 0; k < counts.size(); ++k) {
        std::fill(buffers[k], buffers[k] + counts[k], 1.0f);
        DeviceCall call = SumOn(buffers[k], counts[k], nullptr);
        call.has_stream = false;
        works.push_back(rank.gpu.Start(call));
      }
      for (auto& work : works) work->Run();
      for (auto& work : works) work->Wait();
    };
    for (int i = 0; i < 3; ++i) step();
    rank.comm.Barrier();  // the fake's count is both ranks'
    const size_t warm = fake.pinned_allocations();
    REQUIRE(warm > 0);
    for (int i = 0; i < 50; ++i) step();
    rank.comm.Barrier();
    REQUIRE(fake.pinned_allocations() == warm);
    REQUIRE(buffers[3][0] == 2.0f);
    for (float* data : buffers) fake.FreeDevice(data);
  });
}

TEST_CASE("a host buffer, or buffers on two devices, are refused in one sentence", "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  Ranks(1, fake, [&](Rank& rank) {
    std::vector<float> host(4);
    DeviceCall call = SumOn(host.data(), 4, nullptr);
    call.has_stream = false;
    call.check.name = "grad.w";
    REQUIRE_THROWS_WITH(rank.gpu.Start(call), Catch::Contains("grad.w is host memory"));
    auto* a = static_cast<float*>(fake.AllocDevice(16, 0));
    auto* b = static_cast<float*>(fake.AllocDevice(16, 1));
    call.inputs = {a};
    call.outputs = {b};
    REQUIRE_THROWS_WITH(rank.gpu.Start(call), Catch::Contains("are on cuda:0 and cuda:1"));
    fake.FreeDevice(a);
    fake.FreeDevice(b);
  });
}

TEST_CASE("TRAINRUN_GPU_PATH=nccl where NCCL cannot serve fails on every rank, saying why",
          "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  DeviceOptions options;
  options.path = "nccl";
  std::atomic<int> refused{0};
  Ranks(
      2, fake,
      [&](Rank& rank) {
        auto* data = static_cast<float*>(fake.AllocDevice(16, rank.comm.rank()));
        DeviceCall call = SumOn(data, 4, nullptr);
        call.has_stream = false;
        auto work = rank.gpu.Start(call);
        try {
          work->Run();
        } catch (const InvalidArgumentError& e) {
          if (std::string(e.what()).find("NCCL cannot serve") != std::string::npos) ++refused;
        }
        fake.FreeDevice(data);
      },
      options);
  REQUIRE(refused == 2);
}

}  // namespace
}  // namespace trainrun::collectives::gpu

namespace trainrun::collectives::gpu {
namespace {

TEST_CASE("staged: a large allreduce goes in overlapping chunks, every element right",
          "[gpu_fake]") {
  for (int size : {2, 3}) {
    FakeGpuRuntime fake(size);
    Ranks(size, fake, [&](Rank& rank) {
      const int me = rank.comm.rank();
      for (DataType type : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          const size_t count = (size_t{3} << 20) / ElementSize(type) + 3;  // > 2 MiB, uneven
          DeviceBuffer data(fake, count, type, me);
          for (size_t i = 0; i < count; ++i) Put(type, data.data, i, Value(type, op, me, i));
          DeviceCall call;
          call.op = DeviceOp::kAllreduce;
          call.inputs = {data.data};
          call.input_counts = {count};
          call.outputs = {data.data};
          call.type = type;
          call.reduce = op;
          Execute(rank.gpu, call);
          for (size_t i = 0; i < count; ++i) {
            const double want = Reduce(type, op, size, i);
            if (std::abs(Get(type, data.data, i) - want) > Tolerance(type) * std::abs(want)) {
              FAIL(DataTypeName(type) << " " << ReduceOpName(op) << " element " << i << ": "
                                      << Get(type, data.data, i) << " != " << want);
            }
          }
        }
      }
    });
  }
}

TEST_CASE("staged: Adasum goes in one piece (a chunk would have dot products of its own)",
          "[gpu_fake]") {
  // Rank 0's ones and rank 1's ones then minus ones are orthogonal as wholes (Adasum: their sum,
  // exactly) but parallel in the first chunks a pipelined copy would cut (there: their average).
  // Each rank counts its wrong elements per type; the main thread asserts (Catch's INFO and
  // CHECK are not thread-safe).
  FakeGpuRuntime fake(2);
  const std::array<DataType, 2> types{DataType::kFloat32, DataType::kFloat16};
  std::array<std::array<size_t, 2>, 2> wrongs{};
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    for (size_t t = 0; t < types.size(); ++t) {
      const DataType type = types[t];
      const size_t count = (size_t{3} << 20) / ElementSize(type) + 3;  // > 2 MiB, odd
      const size_t half = count / 2;
      auto value = [&](int r, size_t i) {
        if (r == 0 || i < half) return 1.0;
        return i < 2 * half ? -1.0 : 0.0;
      };
      DeviceBuffer data(fake, count, type, me);
      for (size_t i = 0; i < count; ++i) Put(type, data.data, i, value(me, i));
      DeviceCall call;
      call.op = DeviceOp::kAllreduce;
      call.inputs = {data.data};
      call.input_counts = {count};
      call.outputs = {data.data};
      call.type = type;
      call.reduce = ReduceOp::kAdasum;
      Execute(rank.gpu, call);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        wrong += Get(type, data.data, i) != value(0, i) + value(1, i);
      }
      wrongs[me][t] = wrong;
    }
  });
  for (size_t r = 0; r < 2; ++r) {
    for (size_t t = 0; t < types.size(); ++t) {
      INFO("rank " << r << ", " << DataTypeName(types[t]));
      CHECK(wrongs[r][t] == 0);
    }
  }
}

// Ones: a float32 in-place sum of `count` elements holding `value`, on `me`'s fake device, ready
// now (no stream).
struct Ones {
  Ones(FakeGpuRuntime& fake, size_t count, int me, float value) : buffer(fake, count, kF32, me) {
    std::fill(data(), data() + count, value);
  }
  float* data() { return reinterpret_cast<float*>(buffer.data); }
  DeviceCall Call() {
    DeviceCall call = SumOn(buffer.data, buffer.bytes / 4, nullptr);
    call.has_stream = false;
    return call;
  }
  static constexpr DataType kF32 = DataType::kFloat32;
  DeviceBuffer buffer;
};

TEST_CASE(
    "staged through the staging buffer (TCP's way): the allreduce is cut into chunks of at "
    "least min_chunk_bytes, at most max_chunks, one copy down and one back each",
    "[gpu_fake]") {
  struct Case {
    size_t bytes;
    int max_chunks;
    size_t min_chunk_bytes;
    size_t chunks;
  };
  const std::vector<Case> cases = {
      {size_t{1} << 20, 4, size_t{1} << 20, 1},         // one chunk's worth
      {(size_t{3} << 20) + 12, 4, size_t{1} << 20, 3},  // three whole MiB, uneven
      {size_t{16} << 20, 4, size_t{1} << 20, 4},        // capped at max_chunks
      {size_t{8} << 20, 1, size_t{1} << 20, 1},         // no pipeline
      {size_t{8} << 20, 8, size_t{2} << 20, 4},         // 8 MiB in chunks of at least 2 MiB
  };
  for (const Case& c : cases) {
    FakeGpuRuntime fake(2);
    DeviceOptions options;
    options.max_chunks = c.max_chunks;
    options.min_chunk_bytes = c.min_chunk_bytes;
    options.copy_through_transport = false;  // over shared memory it would skip the pipeline
    Ranks(
        2, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          Ones ones(fake, c.bytes / 4, me, static_cast<float>(me + 1));
          Execute(rank.gpu, ones.Call());
          for (size_t i = 0; i < c.bytes / 4; i += 4099) REQUIRE(ones.data()[i] == 3.0f);
          REQUIRE(ones.data()[c.bytes / 4 - 1] == 3.0f);
        },
        options);
    INFO(c.bytes << " bytes, max_chunks " << c.max_chunks << ", min_chunk_bytes "
                 << c.min_chunk_bytes);
    REQUIRE(fake.host_device_copies() == 2 * 2 * c.chunks);  // 2 ranks, down and back
  }
}

TEST_CASE(
    "staged: chunks keep stream order: a delayed kernel writes 4 MiB, the allreduce "
    "follows it, a kernel after it reads every chunk reduced (1 and 2 copy engines, "
    "through the transport and through the staging buffer)",
    "[gpu_fake]") {
  for (int engines : {1, 2}) {
    for (bool through : {true, false}) {
      FakeGpuRuntime fake(2, engines);
      DeviceOptions options;
      options.copy_through_transport = through;
      INFO(engines << " copy engines, through the transport: " << through);
      Ranks(
          2, fake,
          [&](Rank& rank) {
            const int me = rank.comm.rank();
            const size_t count = size_t{1} << 20;
            Stream stream = fake.NewStream(me);
            auto* data = static_cast<float*>(fake.AllocDevice(count * 4, me));
            std::fill(data, data + count, -1.0f);
            fake.Launch(stream, [=] {
              std::this_thread::sleep_for(std::chrono::milliseconds(150));
              for (size_t i = 0; i < count; ++i)
                data[i] = static_cast<float>((me + 1) * (i % 1000));
            });
            // Two allreduces in a row on the stream, no synchronize: the second reads the first's
            // result.
            std::shared_ptr<DeviceWork> first = rank.gpu.Start(SumOn(data, count, stream));
            std::shared_ptr<DeviceWork> second = rank.gpu.Start(SumOn(data, count, stream));
            std::thread comm_thread([&] {
              first->Run();
              second->Run();
            });
            comm_thread.join();
            first->Wait();
            second->Wait();
            std::vector<float> seen(count);
            fake.Launch(stream, [&] { std::memcpy(seen.data(), data, count * 4); });
            fake.Synchronize(stream);
            for (size_t i = 0; i < count; ++i)
              REQUIRE(seen[i] == static_cast<float>(6 * (i % 1000)));
            fake.FreeDevice(data);
            fake.DeleteStream(stream);
          },
          options);
    }
  }
}

TEST_CASE(
    "staged through the staging buffer: a collective is done (poll) only once its copy back "
    "has landed (1 and 2 copy engines)",
    "[gpu_fake]") {
  // Through the transport the copies back land before Run returns (the next test): the slots they
  // read are the transport's. Through the staging buffer they may land later.
  DeviceOptions options;
  options.copy_through_transport = false;
  for (int engines : {1, 2}) {
    FakeGpuRuntime fake(2, engines);
    Ranks(
        2, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          Ones ones(fake, size_t{3} << 18, me, 1.0f);  // 3 MiB: chunked
          std::shared_ptr<DeviceWork> work = rank.gpu.Start(ones.Call());
          REQUIRE_FALSE(work->Done());  // not run yet
          fake.HoldCopiesToDevice(true);
          work->Run();  // the host allreduce is over; the copies back wait
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          REQUIRE_FALSE(work->Done());
          REQUIRE(ones.data()[0] == 1.0f);
          rank.comm.Barrier();  // both ranks have seen it not done before either releases
          fake.HoldCopiesToDevice(false);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!work->Done() && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          REQUIRE(work->Done());
          REQUIRE(ones.data()[(size_t{3} << 18) - 1] == 2.0f);
          work->Wait();
        },
        options);
  }
}

TEST_CASE(
    "staged over shared memory: the allreduce goes from the device straight into the "
    "transport's memory and back (no pinned buffer, one copy in and n out per chunk of the "
    "transport), done when Run returns",
    "[gpu_fake]") {
  for (int size : {2, 3}) {
    FakeGpuRuntime fake(size);
    // The transport's chunk (TRAINRUN_SHM_CHUNK_BYTES) in whole cache lines per rank (16 floats).
    const auto lines = static_cast<size_t>(16 * size);
    const size_t chunk = static_cast<size_t>(env::kShmChunkBytes.Get()) / 4 / lines * lines;
    const size_t count = 3 * chunk + 3;  // 4 chunks, the last of 3 elements: one rank's part
    std::atomic<size_t> copies{0};
    Ranks(size, fake, [&](Rank& rank) {
      const int me = rank.comm.rank();
      Ones ones(fake, count, me, static_cast<float>(me + 1));
      std::shared_ptr<DeviceWork> work = rank.gpu.Start(ones.Call());
      work->Run();
      REQUIRE(work->Done());
      const float sum = static_cast<float>(size * (size + 1) / 2);
      for (size_t i = 0; i < count; i += 997) REQUIRE(ones.data()[i] == sum);
      REQUIRE(ones.data()[count - 1] == sum);
      work->Wait();
      REQUIRE(rank.gpu.pinned().allocations() == 0);
      rank.comm.Barrier();
      if (me == 0) copies = fake.host_device_copies();
      rank.comm.Barrier();  // read before any rank copies again
      // The transport's segment is page-locked once per rank, not once per call.
      Execute(rank.gpu, ones.Call());
      rank.comm.Barrier();
      REQUIRE(fake.host_registrations() == static_cast<size_t>(size));
      rank.comm.Barrier();
    });
    INFO(size << " ranks");
    REQUIRE(fake.pinned_allocations() == 0);
    REQUIRE(fake.host_registrations() == 0);  // each rank's segment once, undone at its end
    // Per rank and chunk one copy in (the whole chunk) and one out per rank's part that is not
    // empty: the last chunk, of 3 elements, has one part only.
    REQUIRE(copies == static_cast<size_t>(size) * (3 * (1 + size) + (1 + 1)));
  }
}

TEST_CASE(
    "staged with the fake's copies run by the caller on an idle stream (staged_perf "
    "--inline-copies): every element right, through the transport and the staging buffer",
    "[gpu_fake]") {
  for (bool through : {true, false}) {
    FakeGpuRuntime fake(2);
    fake.RunIdleCopiesHere(true);
    DeviceOptions options;
    options.copy_through_transport = through;
    INFO("through the transport: " << through);
    Ranks(
        2, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          for (size_t count : {size_t{10}, size_t{5000}, (size_t{5} << 18) + 7}) {
            Ones ones(fake, count, me, static_cast<float>(me + 1));
            Execute(rank.gpu, ones.Call());
            for (size_t i = 0; i < count; i += 101) REQUIRE(ones.data()[i] == 3.0f);
            REQUIRE(ones.data()[count - 1] == 3.0f);
          }
        },
        options);
    REQUIRE(fake.copy_cpu_seconds() > 0);
  }
}

TEST_CASE(
    "staged over shared memory: a rank with a device buffer and one with a host buffer take "
    "part in one allreduce, and a mismatch raises on both",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  const size_t count = (size_t{5} << 18) + 17;
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    Ones first(fake, 10, me, 1.0f);
    Execute(rank.gpu, first.Call());  // every rank takes part in the choice of the path
    std::vector<float> host(count, 2.0f);
    if (me == 0) {
      Ones ones(fake, count, me, 1.0f);
      DeviceCall call = ones.Call();
      call.reduce = ReduceOp::kAverage;
      Execute(rank.gpu, call);
      REQUIRE(ones.data()[0] == 1.5f);
      REQUIRE(ones.data()[count - 1] == 1.5f);
      // The other rank calls with a count small enough for the one-step path.
      Ones other(fake, count - 1, me, 1.0f);
      REQUIRE_THROWS_AS(Execute(rank.gpu, other.Call()), MismatchError);
    } else {
      rank.comm.Allreduce(host.data(), count, DataType::kFloat32, ReduceOp::kAverage);
      REQUIRE(host[0] == 1.5f);
      REQUIRE(host[count - 1] == 1.5f);
      REQUIRE_THROWS_AS(rank.comm.Allreduce(host.data(), 100, DataType::kFloat32, ReduceOp::kSum),
                        MismatchError);
    }
    // Still usable after the mismatch.
    std::vector<float> one(count, static_cast<float>(me));
    rank.comm.Allreduce(one.data(), count, DataType::kFloat32, ReduceOp::kSum);
    REQUIRE(one[count / 2] == 1.0f);
  });
}

// RunAll runs `works` as the communication thread would: RunFused from the first not yet run
// until every one has; returns how many ran in each call.
std::vector<size_t> RunAll(const std::vector<std::shared_ptr<DeviceWork>>& works) {
  std::vector<size_t> groups;
  for (size_t first = 0; first < works.size();) {
    std::vector<DeviceWork*> rest;
    for (size_t i = first; i < works.size(); ++i) rest.push_back(works[i].get());
    std::exception_ptr error;
    const size_t k = DeviceWork::RunFused(rest, &error);
    if (error) std::rethrow_exception(error);
    groups.push_back(k);
    first += k;
  }
  return groups;
}

// DelayedSums starts `tensors` in-place float32 sum allreduces on `rank`, tensor k of 1 + k * step
// elements, element i being k + rank + i % 3, named prefix + k. A kernel on `stream` writes each
// before its allreduce starts, the last one late: whatever gathers them must wait for it.
struct DelayedSums {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<std::shared_ptr<DeviceWork>> works;
  size_t step;

  DelayedSums(FakeGpuRuntime& fake, Rank& rank, Stream stream, size_t tensors, size_t step_,
              const std::string& prefix)
      : step(step_) {
    const int me = rank.comm.rank();
    for (size_t k = 0; k < tensors; ++k) {
      const size_t count = 1 + k * step;
      buffers.push_back(std::make_unique<DeviceBuffer>(fake, count, DataType::kFloat32, me));
      auto* data = reinterpret_cast<float*>(buffers.back()->data);
      fake.Launch(stream, [=] {
        if (k == tensors - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(k + me + i % 3);
      });
      DeviceCall call = SumOn(data, count, stream);
      call.check.name = prefix + std::to_string(k);
      works.push_back(rank.gpu.Start(call));
    }
  }

  // Wrong waits for every allreduce, reads each tensor by a kernel on `stream` after it, and
  // counts the elements that are not the sum over `size` ranks.
  size_t Wrong(FakeGpuRuntime& fake, Stream stream, int size) const {
    for (auto& work : works) work->Wait();
    const double ranks_sum = size * (size - 1) / 2.0;
    size_t wrong = 0;
    for (size_t k = 0; k < buffers.size(); ++k) {
      std::vector<float> seen(1 + k * step);
      const char* data = buffers[k]->data;
      fake.Launch(stream, [&] { std::memcpy(seen.data(), data, seen.size() * 4); });
      fake.Synchronize(stream);
      for (size_t i = 0; i < seen.size(); ++i) {
        wrong += seen[i] != static_cast<float>(size * static_cast<double>(k + i % 3) + ranks_sum);
      }
    }
    return wrong;
  }
};

TEST_CASE("staged: small allreduces queued together are fused: one copy down, one back",
          "[gpu_fake]") {
  for (int size : {1, 2, 3}) {
    FakeGpuRuntime fake(size, /*copy_engines=*/size == 2 ? 2 : 1);
    Ranks(size, fake, [&](Rank& rank) {
      const int me = rank.comm.rank();
      Stream stream = fake.NewStream(me);
      constexpr size_t kTensors = 40;
      const DelayedSums sums(fake, rank, stream, kTensors, 13, "fused.");
      rank.comm.Barrier();
      const size_t before = fake.host_device_copies();
      rank.comm.Barrier();
      const std::vector<size_t> groups = RunAll(sums.works);
      rank.comm.Barrier();
      // Every rank had all 40 ready: one fused collective (2 ranks' copies, one down, one back).
      REQUIRE(groups == std::vector<size_t>{kTensors});
      REQUIRE(fake.host_device_copies() - before == 2 * static_cast<size_t>(size));
      REQUIRE(rank.gpu.fused() == kTensors);
      REQUIRE(sums.Wrong(fake, stream, size) == 0);
      fake.DeleteStream(stream);
    });
  }
}

TEST_CASE("staged: fusion stops where the ranks' queues differ, the rest runs after",
          "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  Ranks(2, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    // Rank 0 offers 6 at once, rank 1 offers 3 and then the other 3: the first fused collective
    // takes 3 on both; then rank 0 offers its last 3 again.
    std::vector<std::unique_ptr<Ones>> ones;
    std::vector<std::shared_ptr<DeviceWork>> works;
    for (int k = 0; k < 6; ++k) {
      ones.push_back(std::make_unique<Ones>(fake, 100 + k, me, static_cast<float>(k + 1)));
      works.push_back(rank.gpu.Start(ones.back()->Call()));
    }
    std::vector<size_t> groups;
    if (me == 0) {
      groups = RunAll(works);
    } else {
      groups = RunAll({works.begin(), works.begin() + 3});
      for (size_t k : RunAll({works.begin() + 3, works.end()})) groups.push_back(k);
    }
    REQUIRE(groups == std::vector<size_t>{3, 3});
    for (auto& work : works) work->Wait();
    for (int k = 0; k < 6; ++k) {
      REQUIRE(ones[k]->data()[0] == 2.0f * static_cast<float>(k + 1));
      REQUIRE(ones[k]->data()[99 + k] == 2.0f * static_cast<float>(k + 1));
    }
  });
}

TEST_CASE(
    "staged: join(): a rank that joined takes part with zeros in GPU allreduces, chunked "
    "and fused, from the first (the path's choice) on",
    "[gpu_fake]") {
  FakeGpuRuntime fake(3);
  std::array<int, 3> last{};
  Ranks(3, fake, [&](Rank& rank) {
    const int me = rank.comm.rank();
    if (me == 2) {
      last[me] = rank.comm.Join();
      return;
    }
    Ones big(fake, size_t{5} << 18, me, static_cast<float>(me + 1));  // 5 MiB: 4 chunks
    Execute(rank.gpu, big.Call());
    REQUIRE(rank.gpu.path() == Path::kStaged);
    REQUIRE_THAT(rank.gpu.why(), Catch::Contains("rank 2 had called join()"));
    REQUIRE(big.data()[0] == 3.0f);
    REQUIRE(big.data()[(size_t{5} << 18) - 1] == 3.0f);
    std::vector<std::unique_ptr<Ones>> small;
    std::vector<std::shared_ptr<DeviceWork>> works;
    for (int k = 0; k < 5; ++k) {
      small.push_back(std::make_unique<Ones>(fake, 10 + k, me, static_cast<float>(me + k)));
      works.push_back(rank.gpu.Start(small.back()->Call()));
    }
    RunAll(works);
    for (auto& work : works) work->Wait();
    for (int k = 0; k < 5; ++k) REQUIRE(small[k]->data()[9 + k] == static_cast<float>(1 + 2 * k));
    last[me] = rank.comm.Join();
  });
  REQUIRE(last == std::array<int, 3>{1, 1, 1});
}

// --- The NCCL path, over the fake NCCL (fake_nccl.h)
// ----------------------------------------------

// NcclOptions: over `nccl`, fusion on (every NCCL allreduce agrees first, NcclAgree).
DeviceOptions NcclOptions(const FakeNccl& nccl, size_t fusion_bytes = size_t{1} << 20) {
  DeviceOptions options;
  options.nccl_api_for_tests = nccl.api();
  options.fusion_bytes = fusion_bytes;
  return options;
}

// Agreed: the groups RunFused makes when rank r offers its queue of n in slices of slices[r]
// (as a communication thread that found that many queued each time): each runs the fewest any
// rank still has in its slice.
std::vector<size_t> Agreed(const std::vector<size_t>& slices, size_t n) {
  std::vector<size_t> groups;
  for (size_t done = 0; done < n;) {
    size_t k = n - done;
    for (size_t slice : slices) k = std::min(k, std::min(n, (done / slice + 1) * slice) - done);
    groups.push_back(k);
    done += k;
  }
  return groups;
}

TEST_CASE(
    "nccl (fake): in-place allreduces queued together fuse into one NCCL allreduce of a device "
    "fusion buffer, as many as every rank has queued (1, 2 and 3 ranks, queues that differ per "
    "rank), after a delayed kernel, every element right",
    "[gpu_fake]") {
  for (int size : {1, 2, 3}) {
    FakeGpuRuntime fake(size);
    FakeNccl nccl(fake);
    constexpr size_t kTensors = 12;
    const std::vector<size_t> slices = std::vector<size_t>{kTensors, 5, 3};
    std::vector<std::vector<size_t>> groups(size);
    std::vector<size_t> wrong(size, 0);
    std::vector<size_t> fused(size, 0);
    std::vector<Path> paths(size);
    Ranks(
        size, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          Stream stream = fake.NewStream(me);
          const DelayedSums sums(fake, rank, stream, kTensors, 7, "nccl.");
          for (size_t first = 0; first < kTensors; first += slices[me]) {
            const size_t last = std::min(kTensors, first + slices[me]);
            for (size_t k : RunAll({sums.works.begin() + first, sums.works.begin() + last})) {
              groups[me].push_back(k);
            }
          }
          wrong[me] = sums.Wrong(fake, stream, size);
          fused[me] = rank.gpu.fused();
          paths[me] = rank.gpu.path();
          fake.DeleteStream(stream);
        },
        NcclOptions(nccl));
    INFO(size << " ranks");
    const std::vector<size_t> want = Agreed({slices.begin(), slices.begin() + size}, kTensors);
    for (int r = 0; r < size; ++r) {
      INFO("rank " << r);
      CHECK(paths[r] == Path::kNccl);
      CHECK(groups[r] == want);
      CHECK(wrong[r] == 0);
      size_t in_batches = 0;
      for (size_t k : want) in_batches += k > 1 ? k : 0;
      CHECK(fused[r] == in_batches);
    }
    // One NCCL allreduce per group, of the group's elements together.
    std::vector<size_t> counts;
    for (size_t k = 0, done = 0; k < want.size(); done += want[k++]) {
      size_t count = 0;
      for (size_t t = done; t < done + want[k]; ++t) count += 1 + t * 7;
      counts.push_back(count);
    }
    CHECK(nccl.allreduce_counts() == counts);
    CHECK(nccl.failures().empty());
  }
  // The groups of 3 ranks (slices 12, 5 and 3), worked out by hand.
  REQUIRE(Agreed({12, 5, 3}, 12) == std::vector<size_t>{3, 2, 1, 3, 1, 2});
}

TEST_CASE(
    "nccl (fake): fused allreduces of every type NCCL has and every op match a float64 "
    "reference (2 and 3 ranks, queues that differ per rank)",
    "[gpu_fake]") {
  const std::vector<DataType> nccl_types = {
      DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
      DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
      DataType::kUInt8,    DataType::kInt8,    DataType::kBool};
  for (int size : {2, 3}) {
    FakeGpuRuntime fake(size);
    FakeNccl nccl(fake);
    constexpr size_t kTensors = 5;
    std::vector<std::string> first_wrong(size);
    std::vector<size_t> fused(size, 0);
    Ranks(
        size, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          const size_t slice = me == 0 ? kTensors : static_cast<size_t>(me + 1);  // 5, 2, 3
          for (DataType type : nccl_types) {
            for (ReduceOp op : kOps) {
              if (op == ReduceOp::kAverage && !IsFloatingPoint(type)) continue;  // staged
              std::vector<std::unique_ptr<DeviceBuffer>> buffers;
              std::vector<std::shared_ptr<DeviceWork>> works;
              for (size_t k = 0; k < kTensors; ++k) {
                const size_t count = 1 + k * 333;
                buffers.push_back(std::make_unique<DeviceBuffer>(fake, count, type, me));
                for (size_t i = 0; i < count; ++i) {
                  Put(type, buffers.back()->data, i, Value(type, op, me, i + k));
                }
                DeviceCall call;
                call.op = DeviceOp::kAllreduce;
                call.inputs = {buffers.back()->data};
                call.input_counts = {count};
                call.outputs = {buffers.back()->data};
                call.type = type;
                call.reduce = op;
                works.push_back(rank.gpu.Start(call));
              }
              for (size_t first = 0; first < kTensors; first += slice) {
                RunAll({works.begin() + first, works.begin() + std::min(kTensors, first + slice)});
              }
              for (auto& work : works) work->Wait();
              for (size_t k = 0; k < kTensors && first_wrong[me].empty(); ++k) {
                for (size_t i = 0; i < 1 + k * 333; ++i) {
                  const double want = Reduce(type, op, size, i + k);
                  const double got = Get(type, buffers[k]->data, i);
                  if (std::abs(got - want) > Tolerance(type) * std::max(1.0, std::abs(want))) {
                    first_wrong[me] = std::string(DataTypeName(type)) + " " + ReduceOpName(op) +
                                      " tensor " + std::to_string(k) + " element " +
                                      std::to_string(i) + ": " + std::to_string(got) +
                                      " != " + std::to_string(want);
                    break;
                  }
                }
              }
            }
          }
          fused[me] = rank.gpu.fused();
        },
        NcclOptions(nccl));
    INFO(size << " ranks");
    for (int r = 0; r < size; ++r) CHECK(first_wrong[r] == "");
    // Slices 5, 2 (, 3): batches of 2, 2, 1 at 2 ranks and 2, 1, 1, 1 at 3 ranks, per type and op.
    const size_t cases = 4 * 5 + 5 * 4;
    for (int r = 0; r < size; ++r) CHECK(fused[r] == cases * (size == 2 ? 4 : 2));
    CHECK(nccl.failures().empty());
  }
}

TEST_CASE(
    "nccl (fake): fused allreduces keep stream order without synchronize: a delayed kernel "
    "writes, the fused allreduce reads after it, a kernel after it reads every result",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  FakeNccl nccl(fake);
  std::array<size_t, 2> wrong{};
  std::array<bool, 2> prompt{};
  Ranks(
      2, fake,
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        const size_t count = 4096;
        Stream stream = fake.NewStream(me);
        DeviceBuffer a(fake, count, DataType::kFloat32, me);
        DeviceBuffer b(fake, count, DataType::kFloat32, me);
        auto* x = reinterpret_cast<float*>(a.data);
        auto* y = reinterpret_cast<float*>(b.data);
        std::fill(x, x + count, -1.0f);
        std::fill(y, y + count, -1.0f);
        fake.Launch(stream, [=] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          for (size_t i = 0; i < count; ++i) {
            x[i] = static_cast<float>((me + 1) * i);
            y[i] = static_cast<float>(me + 1);
          }
        });
        const auto before = std::chrono::steady_clock::now();
        std::vector<std::shared_ptr<DeviceWork>> works = {rank.gpu.Start(SumOn(x, count, stream)),
                                                          rank.gpu.Start(SumOn(y, count, stream))};
        std::vector<size_t> groups;
        std::thread comm_thread([&] { groups = RunAll(works); });
        comm_thread.join();
        // Start and Run enqueue: the kernel's 200 ms are the stream's, not the CPU's.
        prompt[me] = std::chrono::steady_clock::now() - before < std::chrono::milliseconds(150) &&
                     groups == std::vector<size_t>{2};
        for (auto& work : works) work->Wait();
        std::vector<float> seen(2 * count);
        fake.Launch(stream, [&] {
          std::memcpy(seen.data(), x, count * 4);
          std::memcpy(seen.data() + count, y, count * 4);
        });
        fake.Synchronize(stream);  // the test observing its kernel, not the code under test
        for (size_t i = 0; i < count; ++i) {
          wrong[me] += seen[i] != static_cast<float>(3 * i);
          wrong[me] += seen[count + i] != 3.0f;
        }
        fake.DeleteStream(stream);
      },
      NcclOptions(nccl));
  // Neither Start nor Run waited for the kernel on the CPU (the fused batch waits on the stream).
  CHECK(prompt == std::array<bool, 2>{true, true});
  CHECK(wrong == std::array<size_t, 2>{0, 0});
  CHECK(nccl.allreduce_counts() == std::vector<size_t>{2 * 4096});
  CHECK(nccl.failures().empty());
}

TEST_CASE(
    "nccl (fake): the device fusion buffer is reused (device allocations flat after warm-up, "
    "groups of varying sizes under the cap)",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  FakeNccl nccl(fake);
  std::array<size_t, 2> wrong{};
  size_t warm = 0;
  size_t later = 0;
  Ranks(
      2, fake,
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        std::vector<std::unique_ptr<Ones>> ones;
        for (size_t k = 0; k < 6; ++k) {
          ones.push_back(std::make_unique<Ones>(fake, (size_t{1} << 14) * (k + 1), me, 1.0f));
        }
        auto step = [&](size_t n) {
          std::vector<std::shared_ptr<DeviceWork>> works;
          for (size_t k = 0; k < n; ++k) {
            std::fill(ones[k]->data(), ones[k]->data() + (size_t{1} << 14) * (k + 1), 1.0f);
            works.push_back(rank.gpu.Start(ones[k]->Call()));
          }
          RunAll(works);
          for (auto& work : works) work->Wait();
          for (size_t k = 0; k < n; ++k) wrong[me] += ones[k]->data()[(size_t{1} << 14) * k] != 2;
        };
        for (size_t n : {2, 6, 3}) step(n);
        rank.comm.Barrier();  // the fake's count is both ranks'
        if (me == 0) warm = fake.device_allocations();
        rank.comm.Barrier();
        for (int i = 0; i < 30; ++i) step(2 + i % 5);
        rank.comm.Barrier();
        if (me == 0) later = fake.device_allocations();
      },
      NcclOptions(nccl, size_t{4} << 20));  // 2.6 MiB at most together
  CHECK(wrong == std::array<size_t, 2>{0, 0});
  CHECK(later == warm);
  CHECK(nccl.allreduces() == 3 + 30);
  CHECK(nccl.failures().empty());
}

TEST_CASE(
    "nccl (fake): what does not fuse: another op or type ends the batch, types and ops NCCL "
    "lacks go staged (int16, Adasum), an out-of-place allreduce runs alone, every result right",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  FakeNccl nccl(fake);
  std::array<std::vector<size_t>, 2> groups;
  std::array<size_t, 2> wrong{};
  Ranks(
      2, fake,
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        struct Entry {
          DataType type;
          ReduceOp op;
          bool in_place;
        };
        // a, b fuse; c (max) runs alone; d, e (int16) go staged, one by one (a queue of mixed
        // kinds is staged-fused only whole); f (Adasum) staged; g out of place over NCCL.
        const std::vector<Entry> entries = {
            {DataType::kFloat32, ReduceOp::kSum, true},
            {DataType::kFloat32, ReduceOp::kSum, true},
            {DataType::kFloat32, ReduceOp::kMax, true},
            {DataType::kInt16, ReduceOp::kSum, true},
            {DataType::kInt16, ReduceOp::kSum, true},
            {DataType::kFloat32, ReduceOp::kAdasum, true},
            {DataType::kFloat32, ReduceOp::kSum, false},
        };
        const size_t count = 100;
        std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
        std::vector<std::shared_ptr<DeviceWork>> works;
        for (const Entry& e : entries) {
          ins.push_back(std::make_unique<DeviceBuffer>(fake, count, e.type, me));
          outs.push_back(std::make_unique<DeviceBuffer>(fake, count, e.type, me));
          for (size_t i = 0; i < count; ++i) {
            // Adasum of equal vectors is their value: each rank the same.
            Put(e.type, ins.back()->data, i, e.op == ReduceOp::kAdasum ? 1.0 + i % 4 : me + i % 5);
          }
          DeviceCall call;
          call.op = DeviceOp::kAllreduce;
          call.inputs = {ins.back()->data};
          call.input_counts = {count};
          call.outputs = {e.in_place ? ins.back()->data : outs.back()->data};
          call.type = e.type;
          call.reduce = e.op;
          works.push_back(rank.gpu.Start(call));
        }
        groups[me] = RunAll(works);
        for (auto& work : works) work->Wait();
        for (size_t k = 0; k < entries.size(); ++k) {
          const Entry& e = entries[k];
          const char* result = e.in_place ? ins[k]->data : outs[k]->data;
          for (size_t i = 0; i < count; ++i) {
            const double want = e.op == ReduceOp::kAdasum ? 1.0 + i % 4
                                : e.op == ReduceOp::kMax  ? 1.0 + i % 5
                                                          : 1.0 + 2 * (i % 5);
            wrong[me] += Get(e.type, result, i) != want;
          }
        }
      },
      NcclOptions(nccl));
  CHECK(groups[0] == std::vector<size_t>{2, 1, 1, 1, 1, 1});
  CHECK(groups[1] == groups[0]);
  CHECK(wrong == std::array<size_t, 2>{0, 0});
  // NCCL ran a and b together, c, and g; the int16 and Adasum ones went through the host.
  CHECK(nccl.allreduce_counts() == std::vector<size_t>{200, 100, 100});
  CHECK(nccl.failures().empty());
}

TEST_CASE(
    "nccl (fake): fusion runs only where every rank fuses: with one rank's fusion off, no rank "
    "exchanges and every allreduce goes alone",
    "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  FakeNccl nccl(fake);
  std::array<std::vector<size_t>, 2> groups;
  std::array<size_t, 2> wrong{};
  RanksWith(
      2, fake, [&](int r) { return NcclOptions(nccl, r == 0 ? 0 : size_t{1} << 20); },
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        std::vector<std::unique_ptr<Ones>> ones;
        std::vector<std::shared_ptr<DeviceWork>> works;
        for (int k = 0; k < 4; ++k) {
          ones.push_back(std::make_unique<Ones>(fake, 10 + k, me, static_cast<float>(k)));
          works.push_back(rank.gpu.Start(ones.back()->Call()));
        }
        groups[me] = RunAll(works);
        for (auto& work : works) work->Wait();
        for (int k = 0; k < 4; ++k) wrong[me] += ones[k]->data()[9 + k] != 2.0f * k;
      });
  CHECK(groups[0] == std::vector<size_t>{1, 1, 1, 1});
  CHECK(groups[1] == groups[0]);
  CHECK(wrong == std::array<size_t, 2>{0, 0});
  CHECK(nccl.allreduce_counts() == std::vector<size_t>{10, 11, 12, 13});
  CHECK(nccl.failures().empty());
}

TEST_CASE(
    "nccl (fake): ranks whose NCCL calls differ fail loudly on every rank, not hang: with fusion "
    "off the fake NCCL says what each posted, with fusion on the exchange refuses it first",
    "[gpu_fake]") {
  for (bool fusion : {false, true}) {
    FakeGpuRuntime fake(2);
    FakeNccl nccl(fake);
    std::array<std::string, 2> errors;
    INFO("fusion " << fusion);
    Ranks(
        2, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          Ones first(fake, 10, me, 1.0f);
          Execute(rank.gpu, first.Call());  // both take part in the choice of the path
          // As if rank 1 had fused one more allreduce than rank 0.
          Ones ones(fake, me == 0 ? 30 : 40, me, 1.0f);
          try {
            Execute(rank.gpu, ones.Call());
          } catch (const std::exception& e) {
            errors[me] = e.what();
          }
        },
        NcclOptions(nccl, fusion ? size_t{1} << 20 : 0));
    for (const std::string& error : errors) {
      if (fusion) {
        CHECK_THAT(error, Catch::Contains("mismatched GPU allreduces") &&
                              (Catch::Contains("reduces 30 float32") ||
                               Catch::Contains("reduces 40 float32")));
      } else {
        CHECK_THAT(error, Catch::Contains("fake NCCL") &&
                              Catch::Contains("rank 0 posted [allreduce of 30 float32") &&
                              Catch::Contains("rank 1 posted [allreduce of 40 float32"));
      }
    }
    CHECK(nccl.failures().size() == (fusion ? 0u : 2u));
  }
}

// Offered: what RunFused made of one rank's queue: the size of each group it ran, and what each
// work failed with ("" where it did not; "MismatchError: " before a MismatchError's sentence).
struct Offered {
  std::vector<size_t> groups;
  std::vector<std::string> errors;
};

// OfferInSlices runs `works` as a communication thread that found `slices[0]` of them queued,
// then `slices[1]`, and so on: RunFused from the first not yet run until its slice has run,
// going on past a failure as the communication thread does.
Offered OfferInSlices(const std::vector<std::shared_ptr<DeviceWork>>& works,
                      const std::vector<size_t>& slices) {
  Offered offered;
  offered.errors.resize(works.size());
  size_t end = 0;
  for (size_t slice : slices) {
    const size_t begin = end;
    end = std::min(works.size(), begin + slice);
    for (size_t first = begin; first < end;) {
      std::vector<DeviceWork*> rest;
      for (size_t i = first; i < end; ++i) rest.push_back(works[i].get());
      std::exception_ptr error;
      const size_t k = DeviceWork::RunFused(rest, &error);
      std::string what;
      try {
        if (error) std::rethrow_exception(error);
      } catch (const MismatchError& e) {
        what = std::string("MismatchError: ") + e.what();
      } catch (const std::exception& e) {
        what = e.what();
      }
      for (size_t i = first; i < first + k; ++i) offered.errors[i] = what;
      offered.groups.push_back(k);
      first += k;
    }
  }
  return offered;
}

// QueuedOnes: in-place allreduces started on a rank's device collectives (not run yet), with the
// buffers they reduce.
struct QueuedOnes {
  std::vector<std::unique_ptr<Ones>> ones;
  std::vector<std::shared_ptr<DeviceWork>> works;
};

// QueueOnes starts one allreduce of counts[k] floats, each value(k), for every k.
QueuedOnes QueueOnes(FakeGpuRuntime& fake, Rank& rank, const std::vector<size_t>& counts,
                     const std::function<float(size_t)>& value) {
  QueuedOnes queued;
  for (size_t k = 0; k < counts.size(); ++k) {
    queued.ones.push_back(std::make_unique<Ones>(fake, counts[k], rank.comm.rank(), value(k)));
    queued.works.push_back(rank.gpu.Start(queued.ones.back()->Call()));
  }
  return queued;
}

TEST_CASE(
    "nccl (fake): fusion agrees on every call it fuses, not only the first: ranks whose queues "
    "differ in a later call fuse the prefix alike, the differing call fails on every rank naming "
    "its count, no mismatched NCCL call is posted, and the communicator goes on (as many queued, "
    "fewer on one rank, 3 ranks)",
    "[gpu_fake]") {
  struct Case {
    const char* what;
    // Per rank: the element counts of its four allreduces, and the slices it offers them in.
    std::vector<std::vector<size_t>> counts;
    std::vector<std::vector<size_t>> slices;
    size_t differs;  // the allreduce whose count differs
    std::vector<size_t> groups;
    std::vector<size_t> nccl_counts;  // what NCCL ran, the 5 + 6 + 7 after included
  };
  const std::vector<size_t> same = {10, 20, 30, 40};
  const std::vector<size_t> third_differs = {10, 20, 35, 40};
  const std::vector<size_t> last_differs = {10, 20, 30, 45};
  // 10 and 20 fuse; then what is left runs one at a time up to the differing one, refused; the
  // rest as agreed.
  const std::vector<Case> cases = {
      {"2 ranks, each offers its four at once",
       {same, third_differs},
       {{4}, {4}},
       2,
       {2, 1, 1},
       {30, 40, 18}},
      {"2 ranks, the differing one offers 3 then 1",
       {same, third_differs},
       {{4}, {3, 1}},
       2,
       {2, 1, 1},
       {30, 40, 18}},
      // The second batch, [30, 40] on ranks 0 and 1 and [30, 45] on rank 2, starts alike.
      {"3 ranks, the last one's last differs, rank 1 offers 2 then 2",
       {same, same, last_differs},
       {{4}, {2, 2}, {4}},
       3,
       {2, 1, 1},
       {30, 30, 18}},
  };
  for (const Case& c : cases) {
    const int size = static_cast<int>(c.counts.size());
    FakeGpuRuntime fake(size);
    FakeNccl nccl(fake);
    std::vector<Offered> offered(size);
    std::vector<std::vector<float>> seen(size);  // element 0 of each tensor after it ran
    std::vector<size_t> wrong(size, 0);
    std::vector<std::vector<size_t>> after(size);  // the groups of a queue of 3 alike, after
    std::vector<std::string> unexpected(size);
    Ranks(
        size, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          try {
            QueuedOnes queued = QueueOnes(fake, rank, c.counts[me],
                                          [](size_t k) { return static_cast<float>(k + 1); });
            offered[me] = OfferInSlices(queued.works, c.slices[me]);
            for (size_t k = 0; k < 4; ++k) {
              if (offered[me].errors[k].empty()) queued.works[k]->Wait();
              const float* data = queued.ones[k]->data();
              seen[me].push_back(data[0]);
              for (size_t i = 1; i < c.counts[me][k]; ++i) wrong[me] += data[i] != data[0];
            }
            // The same communicator, on: three alike, fused, every element right.
            QueuedOnes more = QueueOnes(fake, rank, {5, 6, 7}, [](size_t) { return 1.0f; });
            after[me] = RunAll(more.works);
            for (auto& work : more.works) work->Wait();
            for (size_t k = 0; k < 3; ++k) {
              for (size_t i = 0; i < 5 + k; ++i) {
                wrong[me] += more.ones[k]->data()[i] != static_cast<float>(size);
              }
            }
          } catch (const std::exception& e) {
            unexpected[me] = e.what();
          }
        },
        NcclOptions(nccl));
    INFO(c.what);
    const auto n = static_cast<float>(size);
    for (int r = 0; r < size; ++r) {
      INFO("rank " << r);
      CHECK(unexpected[r] == "");
      CHECK(offered[r].groups == c.groups);
      CHECK(offered[r].errors.size() == 4);
      if (offered[r].errors.size() != 4) continue;
      std::vector<float> want;
      for (size_t k = 0; k < 4; ++k) {
        if (k != c.differs) {
          CHECK(offered[r].errors[k] == "");
          want.push_back(n * static_cast<float>(k + 1));
          continue;
        }
        CHECK_THAT(offered[r].errors[k],
                   Catch::StartsWith("MismatchError: mismatched GPU allreduces") &&
                       Catch::Contains("rank " + std::to_string(r) + " reduces " +
                                       std::to_string(c.counts[r][k]) + " float32"));
        want.push_back(static_cast<float>(k + 1));  // refused, it did nothing: this rank's value
      }
      CHECK(seen[r] == want);
      CHECK(wrong[r] == 0);
      CHECK(after[r] == std::vector<size_t>{3});
    }
    // NCCL saw only calls every rank posted alike.
    CHECK(nccl.failures().empty());
    CHECK(nccl.allreduce_counts() == c.nccl_counts);
  }
}

TEST_CASE(
    "nccl (fake): ranks that offer queues of different lengths, alike as far as each goes, fuse "
    "all the fewest offered in one NCCL allreduce and the rest after, every element right (2 "
    "and 3 ranks)",
    "[gpu_fake]") {
  const std::vector<size_t> counts = {10, 20, 30, 40, 50};
  const std::vector<std::vector<size_t>> slices = {{5}, {3, 2}, {2, 3}};
  for (int size : {2, 3}) {
    FakeGpuRuntime fake(size);
    FakeNccl nccl(fake);
    std::vector<Offered> offered(size);
    std::vector<size_t> wrong(size, 0);
    std::vector<std::string> unexpected(size);
    Ranks(
        size, fake,
        [&](Rank& rank) {
          const int me = rank.comm.rank();
          try {
            QueuedOnes queued = QueueOnes(
                fake, rank, counts, [me](size_t k) { return static_cast<float>(k + 1 + me); });
            offered[me] = OfferInSlices(queued.works, slices[me]);
            for (auto& work : queued.works) work->Wait();
            const double ranks_sum = size * (size - 1) / 2.0;
            for (size_t k = 0; k < counts.size(); ++k) {
              const auto want = static_cast<float>(size * static_cast<double>(k + 1) + ranks_sum);
              for (size_t i = 0; i < counts[k]; ++i) {
                wrong[me] += queued.ones[k]->data()[i] != want;
              }
            }
          } catch (const std::exception& e) {
            unexpected[me] = e.what();
          }
        },
        NcclOptions(nccl));
    INFO(size << " ranks");
    // 2 ranks (slices 5; 3, 2): 3 then 2. 3 ranks (5; 3, 2; 2, 3): 2, then 1 (rank 1's slice
    // ends), then 2.
    const std::vector<size_t> want =
        size == 2 ? std::vector<size_t>{3, 2} : std::vector<size_t>{2, 1, 2};
    for (int r = 0; r < size; ++r) {
      INFO("rank " << r);
      CHECK(unexpected[r] == "");
      CHECK(offered[r].groups == want);
      CHECK(offered[r].errors == std::vector<std::string>(counts.size()));
      CHECK(wrong[r] == 0);
    }
    std::vector<size_t> nccl_counts;
    for (size_t g = 0, done = 0; g < want.size(); done += want[g++]) {
      size_t count = 0;
      for (size_t t = done; t < done + want[g]; ++t) count += counts[t];
      nccl_counts.push_back(count);
    }
    CHECK(nccl.allreduce_counts() == nccl_counts);
    CHECK(nccl.failures().empty());
  }
}

TEST_CASE(
    "nccl (fake): a rank that joined after the path was chosen makes the others' fused-path "
    "exchange fail on every rank saying it joined (no NCCL hang), and join() still ends",
    "[gpu_fake]") {
  FakeGpuRuntime fake(3);
  FakeNccl nccl(fake);
  std::array<std::string, 3> errors;
  std::array<int, 3> last{};
  Ranks(
      3, fake,
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        Ones first(fake, 10, me, 1.0f);
        Execute(rank.gpu, first.Call());  // NCCL is chosen: nobody has joined yet
        if (me != 2) {
          Ones ones(fake, 10, me, 1.0f);
          try {
            Execute(rank.gpu, ones.Call());
          } catch (const MismatchError& e) {
            errors[me] = e.what();
          }
        }
        last[me] = rank.comm.Join();
      },
      NcclOptions(nccl));
  for (int r = 0; r < 2; ++r) CHECK_THAT(errors[r], Catch::Contains("rank 2 has joined"));
  CHECK(last == std::array<int, 3>{1, 1, 1});
  CHECK(nccl.allreduce_counts() == std::vector<size_t>{10});
  CHECK(nccl.failures().empty());
}

TEST_CASE("nccl (fake): a rank whose peer never makes the call fails within the fake's timeout",
          "[gpu_fake]") {
  FakeGpuRuntime fake(2);
  FakeNccl nccl(fake, std::chrono::milliseconds(300));
  std::string error;
  Ranks(
      2, fake,
      [&](Rank& rank) {
        const int me = rank.comm.rank();
        Ones first(fake, 10, me, 1.0f);
        Execute(rank.gpu, first.Call());
        if (me == 0) {
          Ones alone(fake, 10, me, 1.0f);
          try {
            Execute(rank.gpu, alone.Call());
          } catch (const InvalidArgumentError& e) {
            error = e.what();
          }
        }
        rank.comm.Barrier();  // rank 1's communicator outlives rank 0's wait
      },
      NcclOptions(nccl, 0));
  CHECK_THAT(error, Catch::Contains("met nothing from rank(s) 1 within 300 ms"));
  CHECK(nccl.failures().size() == 1);
}

// ScaledWant: element i (Value's numbering) of an allreduce with `op` (sum, average or max) of
// every rank's Value times `pre`, the result times `post`, as the core scales arrays that cannot
// scale themselves: floats in their own precision, integers through float64 and truncated (an
// integer average truncates too).
double ScaledWant(DataType type, ReduceOp op, int size, size_t i, double pre, double post) {
  const bool real = IsFloatingPoint(type);
  auto cut = [&](double v) { return real ? v : std::trunc(v); };
  double acc = cut(Value(type, op, 0, i) * pre);
  for (int r = 1; r < size; ++r) {
    const double v = cut(Value(type, op, r, i) * pre);
    acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
  }
  if (op == ReduceOp::kAverage) acc = cut(acc / size);
  return cut(acc * post);
}

// FirstScaledWrong: "" when each of the `count` elements at `data` (Value's from `offset` on) is
// ScaledWant's, else the first that is not, described.
std::string FirstScaledWrong(DataType type, ReduceOp op, int size, const char* data, size_t count,
                             size_t offset, double pre, double post) {
  for (size_t i = 0; i < count; ++i) {
    const double want = ScaledWant(type, op, size, offset + i, pre, post);
    const double got = Get(type, data, i);
    if (std::abs(got - want) > Tolerance(type) * 4 * std::max(1.0, std::abs(want))) {
      return std::string(DataTypeName(type)) + " " + ReduceOpName(op) + " count " +
             std::to_string(count) + " element " + std::to_string(i) + ": " + std::to_string(got) +
             " != " + std::to_string(want);
    }
  }
  return "";
}

TEST_CASE(
    "prescale and postscale of arrays that cannot scale themselves: over NCCL a float sum or "
    "average is one PreMulSum allreduce, every other type and op (and the staged path) scales "
    "in host memory, every element against a float64 reference (2 and 3 ranks)",
    "[gpu_fake]") {
  const double pre = 0.5;
  const double post = 3.0;
  for (bool over_nccl : {true, false}) {
    for (int size : {2, 3}) {
      FakeGpuRuntime fake(size);
      FakeNccl nccl(fake);
      DeviceOptions options = NcclOptions(nccl);
      if (!over_nccl) options = {};
      std::vector<std::string> first_wrong(size);
      size_t float_sums = 0;  // calls NCCL can take as PreMulSum
      Ranks(
          size, fake,
          [&](Rank& rank) {
            const int me = rank.comm.rank();
            for (DataType type : kTypes) {
              if (type == DataType::kBool) continue;  // scaling a bool is not a thing
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
                if (me == 0 && IsFloatingPoint(type) && op != ReduceOp::kMax) ++float_sums;
                for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}}) {
                  DeviceBuffer data(fake, count, type, me);
                  for (size_t i = 0; i < count; ++i)
                    Put(type, data.data, i, Value(type, op, me, i));
                  DeviceCall call;
                  call.op = DeviceOp::kAllreduce;
                  call.inputs = {data.data};
                  call.input_counts = {count};
                  call.outputs = {data.data};
                  call.type = type;
                  call.reduce = op;
                  call.prescale = pre;
                  call.postscale = post;
                  Execute(rank.gpu, call);
                  const std::string wrong =
                      FirstScaledWrong(type, op, size, data.data, count, 0, pre, post);
                  if (first_wrong[me].empty()) first_wrong[me] = wrong;
                }
              }
            }
          },
          options);
      INFO((over_nccl ? "NCCL" : "staged") << ", " << size << " ranks");
      for (int r = 0; r < size; ++r) CHECK(first_wrong[r] == "");
      CHECK(nccl.failures().empty());
      // Over NCCL: the float sums and averages (3 counts each) as PreMulSum, the rest staged;
      // every op destroyed once its allreduce has returned.
      CHECK(nccl.pre_mul_sums() == (over_nccl ? 3 * float_sums : 0));
      CHECK(nccl.live_ops() == 0);
    }
  }
}

TEST_CASE(
    "grouped allreduces' prescale and postscale: over NCCL a float sum or average is one "
    "PreMulSum op for the whole group, every other type and op (and the staged path) scales in "
    "host memory, every element against a float64 reference (2 and 3 ranks)",
    "[gpu_fake]") {
  const double pre = 0.5;
  const double post = 3.0;
  const std::vector<size_t> parts = {1, 1000, 70001};  // the group's buffers
  const std::vector<DataType> types = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                       DataType::kFloat64, DataType::kInt32,   DataType::kUInt8};
  for (bool over_nccl : {true, false}) {
    for (int size : {2, 3}) {
      FakeGpuRuntime fake(size);
      FakeNccl nccl(fake);
      DeviceOptions options = NcclOptions(nccl);
      if (!over_nccl) options = {};
      std::vector<std::string> first_wrong(size);
      size_t float_sums = 0;  // groups NCCL can take with a PreMulSum op
      Ranks(
          size, fake,
          [&](Rank& rank) {
            const int me = rank.comm.rank();
            for (DataType type : types) {
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
                if (me == 0 && IsFloatingPoint(type) && op != ReduceOp::kMax) ++float_sums;
                std::vector<std::unique_ptr<DeviceBuffer>> buffers;
                DeviceCall call;
                call.op = DeviceOp::kGroupedAllreduce;
                call.type = type;
                call.reduce = op;
                call.prescale = pre;
                call.postscale = post;
                size_t offset = 0;  // each buffer goes on with Value's elements
                for (size_t count : parts) {
                  buffers.push_back(std::make_unique<DeviceBuffer>(fake, count, type, me));
                  for (size_t i = 0; i < count; ++i)
                    Put(type, buffers.back()->data, i, Value(type, op, me, offset + i));
                  call.inputs.push_back(buffers.back()->data);
                  call.input_counts.push_back(count);
                  offset += count;
                }
                Execute(rank.gpu, call);
                offset = 0;
                for (size_t k = 0; k < parts.size(); ++k) {
                  const std::string wrong = FirstScaledWrong(type, op, size, buffers[k]->data,
                                                             parts[k], offset, pre, post);
                  if (first_wrong[me].empty() && !wrong.empty()) {
                    first_wrong[me] = "buffer " + std::to_string(k) + ": " + wrong;
                  }
                  offset += parts[k];
                }
              }
            }
          },
          options);
      INFO((over_nccl ? "NCCL" : "staged") << ", " << size << " ranks");
      for (int r = 0; r < size; ++r) CHECK(first_wrong[r] == "");
      CHECK(nccl.failures().empty());
      // Over NCCL: each float sum or average is one group of PreMulSum allreduces sharing one op
      // per rank, destroyed after the group; the rest staged.
      CHECK(nccl.pre_mul_sums() == (over_nccl ? parts.size() * float_sums : 0));
      CHECK(nccl.pre_mul_sum_ops() == (over_nccl ? size * float_sums : 0));
      CHECK(nccl.live_ops() == 0);
    }
  }
}

}  // namespace
}  // namespace trainrun::collectives::gpu
