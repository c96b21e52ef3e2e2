// FakeGpuRuntime: a GpuRuntime over host memory, for tests only (no shipped binary contains it).
//
// "Device" memory is host memory the fake hands out and remembers, so DeviceOf tells it from other
// host memory. Every stream is a thread that runs what is enqueued on it in order: copies, event
// records, waits on events, and "kernels" (any function, e.g. one that sleeps, then writes), so the
// stream-order protocol of device_collectives.h runs with real concurrency. As on a GPU, an event
// recorded on an idle stream is reached at once and a wait on a reached event costs nothing (no
// hop through a thread); WaitHost polls as CUDA's does. Stream handles 0, 1 and 2 (the legacy and
// per-thread default streams) are one default stream.
//
//   FakeGpuRuntime fake(/*devices=*/2);
//   void* buffer = fake.AllocDevice(bytes, 0);
//   fake.Launch(stream, [=] { Sleep(50ms); std::memset(buffer, 1, bytes); });
//   fake.Synchronize(stream);
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainrun/collectives/gpu/runtime.h"

namespace trainrun::collectives::gpu::testing {

class FakeGpuRuntime final : public GpuRuntime {
 public:
  // `copy_engines`: what CopyEngines says. 1 by default: the fake's copies are memcpy on a CPU,
  // so copies on two streams at once compete for the cores the ranks reduce on (docs/
  // performance.md measured it); 2 models a GPU's separate engines to and from the host.
  explicit FakeGpuRuntime(int devices = 1, int copy_engines = 1);
  ~FakeGpuRuntime() override;

  std::string Describe() const override { return "the tests' CPU fake of a GPU runtime"; }
  bool RealDevices() const override { return false; }
  int DeviceCount() override { return devices_; }
  int CurrentDevice() override;
  void SetDevice(int device) override;
  int DeviceOf(const void* pointer) override;
  int CopyEngines(int) override { return copy_engines_; }
  Stream NewStream(int device) override;
  void DeleteStream(Stream stream) noexcept override;
  Event NewEvent(int device) override;
  void DeleteEvent(Event event) noexcept override;
  void Record(Event event, Stream stream) override;
  void WaitEvent(Stream stream, Event event) override;
  bool Done(Event event) override;
  void Copy(void* destination, const void* source, size_t bytes, Stream stream) override;
  void* AllocPinned(size_t bytes) override;
  void FreePinned(void* pointer) noexcept override;
  // RegisterHost counts (host_registrations) and says yes; host memory is what the fake copies.
  bool RegisterHost(void* memory, size_t bytes) override;
  void UnregisterHost(void* memory) noexcept override;
  void* AllocDevice(size_t bytes, int device) override;
  void FreeDevice(void* pointer) noexcept override;

  // Launch enqueues `kernel` on `stream`.
  void Launch(Stream stream, std::function<void()> kernel);
  // FailStream marks `stream` as failed, as a GPU's stream after a faulting kernel: copies and
  // kernels that run on it from now on do nothing; event records still complete (the fake NCCL's
  // failed call, so that a failing test ends instead of writing into buffers it freed).
  void FailStream(Stream stream);
  // Synchronize waits until everything enqueued on `stream` so far has run.
  void Synchronize(Stream stream);
  // pinned_allocations: AllocPinned calls so far; copies: Copy calls so far; host_device_copies:
  // those between host and device memory (what crosses PCIe on a GPU host).
  size_t pinned_allocations() const { return pinned_allocations_.load(); }
  size_t copies() const { return copies_.load(); }
  // device_allocations: AllocDevice calls so far.
  size_t device_allocations() const { return device_allocations_.load(); }
  size_t host_device_copies() const { return host_device_copies_.load(); }
  // copy_cpu_seconds: CPU time the stream threads spent in the copies' memcpy so far, the CPU a
  // GPU's copy engines would not take (the fake's "DMA" runs on the cores the ranks reduce on).
  // host_registrations: RegisterHost calls not undone by UnregisterHost.
  size_t host_registrations() const { return host_registrations_.load(); }
  double copy_cpu_seconds() const { return copy_cpu_nanoseconds_.load() * 1e-9; }
  // RunIdleCopiesHere(true) runs a copy enqueued on an idle stream at once on the calling thread
  // (as a GPU's idle copy engine starts it at once), instead of handing it to the stream's thread
  // and waking that: a benchmark's second model of the copies (staged_perf --inline-copies), with
  // no thread switch per copy but the memcpy on the caller's CPU. Copies into device memory are
  // always handed over while HoldCopiesToDevice holds them.
  void RunIdleCopiesHere(bool here) { copies_here_ = here; }
  // HoldCopiesToDevice(true) makes every copy into device memory wait, on its stream, until
  // HoldCopiesToDevice(false): a copy back that has not landed yet, for as long as a test likes.
  void HoldCopiesToDevice(bool hold);

 private:
  struct FakeStream;
  struct FakeEvent {
    std::mutex mutex;
    std::condition_variable reached;
    uint64_t recorded = 0;
    uint64_t completed = 0;
  };
  FakeStream& Resolve(Stream stream);

  int devices_;
  int copy_engines_;
  std::unique_ptr<FakeStream> default_stream_;
  std::mutex mutex_;
  std::map<const char*, std::pair<size_t, int>> device_memory_;  // start -> (bytes, device)
  std::atomic<size_t> pinned_allocations_{0};
  std::atomic<size_t> copies_{0};
  std::atomic<size_t> device_allocations_{0};
  std::atomic<size_t> host_device_copies_{0};
  std::atomic<uint64_t> copy_cpu_nanoseconds_{0};
  std::atomic<size_t> host_registrations_{0};
  std::mutex hold_mutex_;
  std::condition_variable released_;
  bool hold_ = false;
  std::atomic<bool> copies_here_{false};
};

}  // namespace trainrun::collectives::gpu::testing
