#include "fake_gpu_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::gpu::testing {
namespace {
thread_local int current_device = 0;

uint64_t ThreadCpuNanoseconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}
}  // namespace

struct FakeGpuRuntime::FakeStream {
  FakeStream() : thread([this] { Loop(); }) {}
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    queued.notify_all();
    thread.join();
  }
  void Enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      tasks.push_back(std::move(task));
    }
    queued.notify_all();
  }
  // RunIfIdle runs `task` at once, on the caller's thread, when nothing is queued or running here
  // (as a GPU reaches an event on an idle stream at once); false when it must be enqueued.
  template <typename Task>
  bool RunIfIdle(Task task) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!tasks.empty() || running) return false;
    task();
    return true;
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      queued.wait(lock, [&] { return stopping || !tasks.empty(); });
      if (tasks.empty()) return;
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      running = true;
      lock.unlock();
      task();
      lock.lock();
      running = false;
    }
  }

  std::mutex mutex;
  std::condition_variable queued;
  std::deque<std::function<void()>> tasks;
  bool running = false;
  bool stopping = false;
  std::atomic<bool> failed{false};  // FailStream
  std::thread thread;
};

FakeGpuRuntime::FakeGpuRuntime(int devices, int copy_engines)
    : devices_(devices),
      copy_engines_(copy_engines),
      default_stream_(std::make_unique<FakeStream>()) {}

FakeGpuRuntime::~FakeGpuRuntime() {
  default_stream_.reset();
  for (auto& [start, place] : device_memory_) std::free(const_cast<char*>(start));
}

int FakeGpuRuntime::CurrentDevice() { return current_device; }

void FakeGpuRuntime::SetDevice(int device) {
  if (device < 0 || device >= devices_) {
    throw InvalidArgumentError(internal::MakeMessage("fake: no device ", device));
  }
  current_device = device;
}

int FakeGpuRuntime::DeviceOf(const void* pointer) {
  const char* p = static_cast<const char*>(pointer);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = device_memory_.upper_bound(p);
  if (it == device_memory_.begin()) return -1;
  --it;
  if (p < it->first + std::max<size_t>(it->second.first, 1)) return it->second.second;
  return -1;
}

FakeGpuRuntime::FakeStream& FakeGpuRuntime::Resolve(Stream stream) {
  const auto value = reinterpret_cast<uintptr_t>(stream);
  if (value <= 2) return *default_stream_;
  return *static_cast<FakeStream*>(stream);
}

Stream FakeGpuRuntime::NewStream(int) { return new FakeStream(); }  // NOLINT: handle ownership

void FakeGpuRuntime::DeleteStream(Stream stream) noexcept {
  if (reinterpret_cast<uintptr_t>(stream) > 2) delete static_cast<FakeStream*>(stream);
}

Event FakeGpuRuntime::NewEvent(int) { return new FakeEvent(); }  // NOLINT: handle ownership

void FakeGpuRuntime::DeleteEvent(Event event) noexcept { delete static_cast<FakeEvent*>(event); }

void FakeGpuRuntime::Record(Event event, Stream stream) {
  auto* e = static_cast<FakeEvent*>(event);
  uint64_t mark;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    mark = ++e->recorded;
  }
  auto reach = [e, mark] {
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      e->completed = std::max(e->completed, mark);
    }
    e->reached.notify_all();
  };
  // An idle stream reaches the point at once: no hop through its thread.
  if (!Resolve(stream).RunIfIdle(reach)) Resolve(stream).Enqueue(reach);
}

void FakeGpuRuntime::WaitEvent(Stream stream, Event event) {
  auto* e = static_cast<FakeEvent*>(event);
  uint64_t mark;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    mark = e->recorded;  // CUDA's rule: the record current at the call
  }
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    if (e->completed >= mark) return;  // reached already: nothing to wait for
  }
  Resolve(stream).Enqueue([e, mark] {
    std::unique_lock<std::mutex> lock(e->mutex);
    e->reached.wait(lock, [&] { return e->completed >= mark; });
  });
}

bool FakeGpuRuntime::Done(Event event) {
  auto* e = static_cast<FakeEvent*>(event);
  std::lock_guard<std::mutex> lock(e->mutex);
  return e->completed >= e->recorded;
}

void FakeGpuRuntime::HoldCopiesToDevice(bool hold) {
  {
    std::lock_guard<std::mutex> lock(hold_mutex_);
    hold_ = hold;
  }
  released_.notify_all();
}

void FakeGpuRuntime::Copy(void* destination, const void* source, size_t bytes, Stream stream) {
  ++copies_;
  const bool to_device = DeviceOf(destination) >= 0;
  if (to_device != (DeviceOf(source) >= 0)) ++host_device_copies_;
  if (copies_here_) {
    bool held = false;
    if (to_device) {
      std::lock_guard<std::mutex> lock(hold_mutex_);
      held = hold_;
    }
    auto copy = [&] {
      const uint64_t before = ThreadCpuNanoseconds();
      std::memcpy(destination, source, bytes);
      copy_cpu_nanoseconds_ += ThreadCpuNanoseconds() - before;
    };
    if (!held && !Resolve(stream).failed && Resolve(stream).RunIfIdle(copy)) return;
  }
  FakeStream* on = &Resolve(stream);
  on->Enqueue([=] {
    if (on->failed) return;
    if (to_device) {
      std::unique_lock<std::mutex> lock(hold_mutex_);
      released_.wait(lock, [&] { return !hold_; });
    }
    const uint64_t before = ThreadCpuNanoseconds();
    std::memcpy(destination, source, bytes);
    copy_cpu_nanoseconds_ += ThreadCpuNanoseconds() - before;
  });
}

void* FakeGpuRuntime::AllocPinned(size_t bytes) {
  ++pinned_allocations_;
  void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  if (p == nullptr) throw Error("fake: out of host memory");
  return p;
}

void FakeGpuRuntime::FreePinned(void* pointer) noexcept { std::free(pointer); }

bool FakeGpuRuntime::RegisterHost(void* memory, size_t bytes) {
  if (memory == nullptr || bytes == 0) throw InvalidArgumentError("fake: RegisterHost of nothing");
  ++host_registrations_;
  return true;
}

void FakeGpuRuntime::UnregisterHost(void*) noexcept { --host_registrations_; }

void* FakeGpuRuntime::AllocDevice(size_t bytes, int device) {
  ++device_allocations_;
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (p == nullptr) throw Error("fake: out of device memory");
  std::lock_guard<std::mutex> lock(mutex_);
  device_memory_[static_cast<const char*>(p)] = {bytes, device};
  return p;
}

void FakeGpuRuntime::FreeDevice(void* pointer) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    device_memory_.erase(static_cast<const char*>(pointer));
  }
  std::free(pointer);
}

void FakeGpuRuntime::Launch(Stream stream, std::function<void()> kernel) {
  FakeStream* on = &Resolve(stream);
  on->Enqueue([on, kernel = std::move(kernel)] {
    if (!on->failed) kernel();
  });
}

void FakeGpuRuntime::FailStream(Stream stream) { Resolve(stream).failed = true; }

void FakeGpuRuntime::Synchronize(Stream stream) {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Resolve(stream).Enqueue([&] {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return done; });
}

}  // namespace trainrun::collectives::gpu::testing
