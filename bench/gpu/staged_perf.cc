// staged_perf: what the host-staged GPU path (gpu/device_collectives.h) adds to a host allreduce,
// over the tests' CPU fake of a GPU runtime (tests/gpu/fake_gpu_runtime.h: "device" memory is host
// memory, each stream a thread that runs its copies), in nccl-tests' columns. Per size it
// alternates a host allreduce of a host buffer and the staged allreduce of a "device" buffer
// (Start, Run, Wait on one thread), `-r` times each, and prints both medians and the extra.
//
//   build/bin/staged_perf --np 2 -b 1K -e 64M -f 4            # forks 2 ranks on this host
//   build/bin/staged_perf --np 2 -b 1M -e 64M --chunks 8 --chunk-bytes 512K
//
// Flags: -b/-e smallest/largest size in bytes (K, M, G), -f factor, -r rounds (alternations), -T
// milliseconds each round of a size runs for at least (at least 3 calls), --chunks and
// --chunk-bytes the pipeline's DeviceOptions::max_chunks and min_chunk_bytes, --staging 1 always
// through the staging buffer (DeviceOptions::copy_through_transport false), --inline-copies 1 the
// fake's copies on an idle stream run on the calling thread (FakeGpuRuntime::RunIdleCopiesHere:
// no thread switch per copy, as a GPU's idle copy engine starts one at once). float32 sum, in
// place. Time is the slowest rank's mean per call in µs; busbw = algbw·2(n-1)/n; "dma" is the
// CPU time per staged call, rank 0's, that the fake's stream threads spent copying (a GPU's copy
// engines would take no CPU for it).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fake_gpu_runtime.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/gpu/device_collectives.h"
#include "trainrun/rendezvous/file_store.h"

namespace {

using trainrun::collectives::Communicator;
using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;
namespace gpu = trainrun::collectives::gpu;
using Clock = std::chrono::steady_clock;

struct Flags {
  size_t min_bytes = 1 << 10;
  size_t max_bytes = 64 << 20;
  size_t factor = 4;
  int rounds = 5;
  double min_ms = 100;
  int np = 2;
  bool inline_copies = false;
  gpu::DeviceOptions options;
};

size_t ParseSize(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (*end == 'K' || *end == 'k') value *= 1 << 10;
  if (*end == 'M' || *end == 'm') value *= 1 << 20;
  if (*end == 'G' || *end == 'g') value *= 1 << 30;
  return static_cast<size_t>(value);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "-b") {
      flags.min_bytes = ParseSize(value);
    } else if (flag == "-e") {
      flags.max_bytes = ParseSize(value);
    } else if (flag == "-f") {
      flags.factor = std::max<size_t>(2, std::strtoul(value, nullptr, 10));
    } else if (flag == "-r") {
      flags.rounds = std::max(1, std::atoi(value));
    } else if (flag == "-T") {
      flags.min_ms = std::atof(value);
    } else if (flag == "--np") {
      flags.np = std::max(1, std::atoi(value));
    } else if (flag == "--chunks") {
      flags.options.max_chunks = std::max(1, std::atoi(value));
    } else if (flag == "--chunk-bytes") {
      flags.options.min_chunk_bytes = ParseSize(value);
    } else if (flag == "--inline-copies") {
      flags.inline_copies = std::atoi(value) != 0;
    } else if (flag == "--staging") {
      flags.options.copy_through_transport = std::atoi(value) == 0;
    } else {
      std::fprintf(stderr, "staged_perf: unknown flag %s (see the head of staged_perf.cc)\n",
                   flag.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "staged_perf: flag %s needs a value\n", argv[argc - 1]);
    std::exit(2);
  }
  return flags;
}

// Slowest: the largest of the ranks' `seconds`.
double Slowest(Communicator& comm, double seconds) {
  comm.Allreduce(&seconds, 1, DataType::kFloat64, ReduceOp::kMax);
  return seconds;
}

// Timed runs `call` at least 3 times and for at least `min_ms` (the calls agreed from a first
// timed one), the ranks starting together; returns the slowest rank's mean per call in seconds.
template <typename Call>
double Timed(Communicator& comm, double min_ms, Call call) {
  comm.Barrier();
  auto start = Clock::now();
  call();
  const double one = Slowest(comm, std::chrono::duration<double>(Clock::now() - start).count());
  const int calls = static_cast<int>(std::clamp(min_ms / 1e3 / std::max(one, 1e-7), 3.0, 5000.0));
  comm.Barrier();
  start = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  return Slowest(comm, std::chrono::duration<double>(Clock::now() - start).count()) / calls;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int RunRank(Communicator& comm, const Flags& flags) {
  gpu::testing::FakeGpuRuntime fake(1);
  fake.RunIdleCopiesHere(flags.inline_copies);
  gpu::DeviceCollectives staged(comm, fake, flags.options);
  const int n = comm.size();
  const bool printer = comm.rank() == 0;
  if (printer) {
    std::printf(
        "# staged_perf: %d ranks, float32 sum in place, max_chunks %d, min_chunk_bytes %zu, "
        "%d rounds, %s, %s\n",
        n, flags.options.max_chunks, flags.options.min_chunk_bytes, flags.rounds,
        flags.options.copy_through_transport ? "through the transport where it can"
                                             : "always through the staging buffer",
        flags.inline_copies ? "copies on an idle stream run by the caller"
                            : "copies run by the stream's thread");
    std::printf("#%11s %12s %6s %6s  %9s %7s %7s  %9s %7s %7s  %7s %7s\n", "", "", "", "", "host",
                "", "", "staged", "", "", "", "");
    std::printf("#%11s %12s %6s %6s  %9s %7s %7s  %9s %7s %7s  %7s %7s\n", "size", "count", "type",
                "redop", "time", "algbw", "busbw", "time", "algbw", "busbw", "extra", "dma");
    std::printf("#%11s %12s %6s %6s  %9s %7s %7s  %9s %7s %7s  %7s %7s\n", "(B)", "(elements)", "",
                "", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)", "(%)", "(us)");
  }
  for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= flags.factor) {
    const size_t count = bytes / 4;
    std::vector<float> host(count, 1.0f);
    auto* device = static_cast<float*>(fake.AllocDevice(count * 4, 0));
    std::fill(device, device + count, 1.0f);
    gpu::DeviceCall call;
    call.op = gpu::DeviceOp::kAllreduce;
    call.inputs = {device};
    call.input_counts = {count};
    call.outputs = {device};
    call.type = DataType::kFloat32;
    call.reduce = ReduceOp::kSum;
    call.has_stream = true;
    call.stream = nullptr;  // the legacy default stream, as a script's tensors
    auto host_call = [&] {
      comm.Allreduce(host.data(), count, DataType::kFloat32, ReduceOp::kSum);
    };
    auto staged_call = [&] {
      std::shared_ptr<gpu::DeviceWork> work = staged.Start(call);
      work->Run();
      work->Wait();
    };
    for (int w = 0; w < 3; ++w) {  // warm-up: pinned buffers, connections
      host_call();
      staged_call();
    }
    std::vector<double> host_times, staged_times;
    size_t staged_calls = 0;
    const double dma_before = fake.copy_cpu_seconds();
    auto counted_call = [&] {
      staged_call();
      ++staged_calls;
    };
    for (int r = 0; r < flags.rounds; ++r) {
      // Alternating, and which goes first alternates too.
      if (r % 2 == 0) {
        host_times.push_back(Timed(comm, flags.min_ms, host_call));
        staged_times.push_back(Timed(comm, flags.min_ms, counted_call));
      } else {
        staged_times.push_back(Timed(comm, flags.min_ms, counted_call));
        host_times.push_back(Timed(comm, flags.min_ms, host_call));
      }
    }
    fake.Synchronize(nullptr);
    const double dma = (fake.copy_cpu_seconds() - dma_before) / std::max<size_t>(staged_calls, 1);
    fake.FreeDevice(device);
    if (printer) {
      const double h = Median(host_times);
      const double s = Median(staged_times);
      const double bus = n > 1 ? 2.0 * (n - 1) / n : 0.0;
      std::printf(" %11zu %12zu %6s %6s  %9.1f %7.2f %7.2f  %9.1f %7.2f %7.2f  %+7.1f %7.1f\n",
                  bytes, count, "float", "sum", h * 1e6, bytes / h / 1e9, bytes / h / 1e9 * bus,
                  s * 1e6, bytes / s / 1e9, bytes / s / 1e9 * bus, (s / h - 1) * 100, dma * 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  char dir[] = "/tmp/trainrun-staged-perf-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    std::perror("staged_perf: mkdtemp");
    return 1;
  }
  auto run = [&](int rank) {
    try {
      Communicator comm(std::make_shared<trainrun::rendezvous::FileStore>(dir), rank, flags.np);
      return RunRank(comm, flags);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "staged_perf: rank %d: %s\n", rank, e.what());
      return 1;
    }
  };
  std::vector<pid_t> children;
  for (int rank = 1; rank < flags.np; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int code = run(rank);
      std::fflush(stdout);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int code = run(0);
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 1;
  }
  const std::string cleanup = std::string("rm -rf ") + dir;
  if (std::system(cleanup.c_str()) != 0) code = 1;
  return code;
}
