// GpuRuntime: the one seam between trainrun and a GPU runtime. Every CUDA call that moving GPU
// buffers needs (copies, events, stream waits, pinned memory, which device a pointer is on) goes
// through it, so the stream-order protocol and the staging bookkeeping of device_collectives.h run
// unchanged over CUDA (CudaRuntime(), libcudart opened with dlopen) and over the CPU fake that the
// tests bring (tests/collectives/fake_gpu_runtime.h), which no shipped binary contains.
//
// Streams and events are opaque handles. A stream handle is CUDA's cudaStream_t value, which is
// also what the CUDA Array Interface and PyTorch's `cuda_stream` give: 0 the legacy default stream,
// 1 cudaStreamLegacy, 2 cudaStreamPerThread.
//
//   GpuRuntime& cuda = *CudaRuntime().runtime;
//   Event ready = cuda.NewEvent(device);
//   cuda.Record(ready, tensor_stream);      // the tensor's producers are before this point
//   cuda.WaitEvent(own_stream, ready);      // own_stream's later work runs after them
//   cuda.Copy(pinned, device_ptr, bytes, own_stream);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace trainrun::collectives::gpu {

using Stream = void*;
using Event = void*;

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  // Describe names the runtime and its version ("CUDA runtime 13.0 (path), driver 13.0").
  virtual std::string Describe() const = 0;
  // RealDevices: the buffers are CUDA memory, so NCCL may move them (false for the tests' fake).
  virtual bool RealDevices() const = 0;
  // DeviceCount: devices this process sees.
  virtual int DeviceCount() = 0;
  // CurrentDevice / SetDevice: the calling thread's current device.
  virtual int CurrentDevice() = 0;
  virtual void SetDevice(int device) = 0;
  // DeviceOf returns the device `pointer` is on, or -1 for host memory (pageable or pinned).
  virtual int DeviceOf(const void* pointer) = 0;
  // CopyEngines: how many copies `device` runs at once (CUDA's asyncEngineCount; 2 or more: one
  // to the host and one from it together). With one, copies on two streams take turns anyway.
  virtual int CopyEngines(int device) = 0;

  // NewStream makes a stream on `device` that does not synchronize with the legacy stream.
  virtual Stream NewStream(int device) = 0;
  virtual void DeleteStream(Stream stream) noexcept = 0;
  // NewEvent makes an event on `device` (no timing).
  virtual Event NewEvent(int device) = 0;
  virtual void DeleteEvent(Event event) noexcept = 0;

  // Record marks the point of `stream` that `event` stands for from now on.
  virtual void Record(Event event, Stream stream) = 0;
  // WaitEvent makes `stream`'s later work wait until `event`'s last recorded point is reached.
  virtual void WaitEvent(Stream stream, Event event) = 0;
  // Done: `event`'s last recorded point has been reached (true for an event never recorded).
  virtual bool Done(Event event) = 0;
  // WaitHost blocks the calling thread until `event`'s last recorded point is reached (true) or
  // `deadline` passes (false). For local work only (the staging copies): a wait that a peer's
  // failure could stall polls Done between checks of its own. This one polls Done, yielding for
  // the first 500 us (a copy of a few MiB) and then sleeping in steps growing to 100 us; a
  // runtime that can block until the event (the tests' fake) says so by overriding it.
  virtual bool WaitHost(Event event, std::chrono::steady_clock::time_point deadline);

  // Copy enqueues a copy of `bytes` bytes on `stream`; either side may be host or device memory.
  virtual void Copy(void* destination, const void* source, size_t bytes, Stream stream) = 0;

  // AllocPinned / FreePinned: page-locked host memory, which copies reach without staging.
  virtual void* AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* pointer) noexcept = 0;
  // RegisterHost page-locks host memory allocated elsewhere (cudaHostRegister; here: the
  // shared-memory transport's segment) so that copies reach it by DMA; false where the runtime
  // cannot (copies still work, staged by the runtime). UnregisterHost undoes it, before the memory
  // is unmapped.
  virtual bool RegisterHost(void* /*memory*/, size_t /*bytes*/) { return false; }
  virtual void UnregisterHost(void* /*memory*/) noexcept {}
  // AllocDevice / FreeDevice: memory on `device`.
  virtual void* AllocDevice(size_t bytes, int device) = 0;
  virtual void FreeDevice(void* pointer) noexcept = 0;
};

// RuntimeLoad: the process's CUDA runtime, or why there is none.
struct RuntimeLoad {
  std::shared_ptr<GpuRuntime> runtime;
  std::string why_not;
};

// CudaRuntime opens CUDA's runtime once (loader.h's OpenCudaRuntime) and returns it; throws
// nothing. A runtime that loads on a host without a usable GPU still loads: DeviceCount() says 0.
const RuntimeLoad& CudaRuntime();

}  // namespace trainrun::collectives::gpu
