// CudaRuntime: GpuRuntime over CUDA's runtime library, opened with dlopen (loader.h). Only the
// handful of entry points below are used; their signatures are CUDA's (cuda_runtime_api.h), with
// handles as void* and enums as int, so the build needs no CUDA header.
#include <dlfcn.h>

#include <array>
#include <mutex>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/collectives/gpu/runtime.h"

namespace trainrun::collectives::gpu {
namespace {

constexpr int kSuccess = 0;
constexpr int kNotReady = 600;              // cudaErrorNotReady
constexpr unsigned kStreamNonBlocking = 1;  // cudaStreamNonBlocking
constexpr unsigned kEventDisableTiming = 2;
constexpr int kMemcpyDefault = 4;              // cudaMemcpyDefault: direction from the pointers
constexpr unsigned kHostRegisterPortable = 1;  // cudaHostRegisterPortable: for every device
constexpr int kMemoryTypeDevice = 2;
constexpr int kMemoryTypeManaged = 3;
constexpr int kDevAttrAsyncEngineCount = 40;  // cudaDevAttrAsyncEngineCount

// The head of cudaPointerAttributes (CUDA >= 11); room is left for fields later versions add.
struct PointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  char reserved[256];
};

struct CudaApi {
  int (*get_device_count)(int*);
  int (*device_get_attribute)(int*, int, int);
  int (*get_device)(int*);
  int (*set_device)(int);
  int (*pointer_attributes)(PointerAttributes*, const void*);
  int (*stream_create)(void**, unsigned);
  int (*stream_destroy)(void*);
  int (*event_create)(void**, unsigned);
  int (*event_destroy)(void*);
  int (*event_record)(void*, void*);
  int (*stream_wait_event)(void*, void*, unsigned);
  int (*event_query)(void*);
  int (*memcpy_async)(void*, const void*, size_t, int, void*);
  int (*host_alloc)(void**, size_t, unsigned);
  int (*host_register)(void*, size_t, unsigned);
  int (*host_unregister)(void*);
  int (*free_host)(void*);
  int (*malloc)(void**, size_t);
  int (*free)(void*);
  const char* (*error_string)(int);
  int (*get_last_error)();
  int (*runtime_version)(int*);
  int (*driver_version)(int*);
};

class Cuda final : public GpuRuntime {
 public:
  Cuda(CudaApi api, std::string path) : api_(api), path_(std::move(path)) {}

  std::string Describe() const override {
    int runtime = 0;
    int driver = 0;
    api_.runtime_version(&runtime);
    api_.driver_version(&driver);
    return internal::MakeMessage("CUDA runtime ", VersionString(runtime, false), " (", path_,
                                 "), driver CUDA ", VersionString(driver, false));
  }
  bool RealDevices() const override { return true; }
  int DeviceCount() override {
    int count = 0;
    if (api_.get_device_count(&count) != kSuccess) {
      api_.get_last_error();
      return 0;
    }
    return count;
  }
  int CurrentDevice() override {
    int device = 0;
    Check(api_.get_device(&device), "cudaGetDevice");
    return device;
  }
  void SetDevice(int device) override {
    Check(api_.set_device(device), "cudaSetDevice(", device, ")");
  }
  int DeviceOf(const void* pointer) override {
    PointerAttributes attributes{};
    if (api_.pointer_attributes(&attributes, pointer) != kSuccess) {
      api_.get_last_error();  // a pointer CUDA does not know: host memory
      return -1;
    }
    if (attributes.type == kMemoryTypeDevice || attributes.type == kMemoryTypeManaged) {
      return attributes.device;
    }
    return -1;
  }
  int CopyEngines(int device) override {
    int engines = 1;
    if (api_.device_get_attribute(&engines, kDevAttrAsyncEngineCount, device) != kSuccess) {
      api_.get_last_error();
      return 1;
    }
    return engines;
  }
  Stream NewStream(int device) override {
    Guard guard(*this, device);
    void* stream = nullptr;
    Check(api_.stream_create(&stream, kStreamNonBlocking), "cudaStreamCreateWithFlags on device ",
          device);
    return stream;
  }
  void DeleteStream(Stream stream) noexcept override { api_.stream_destroy(stream); }
  Event NewEvent(int device) override {
    Guard guard(*this, device);
    void* event = nullptr;
    Check(api_.event_create(&event, kEventDisableTiming), "cudaEventCreateWithFlags on device ",
          device);
    return event;
  }
  void DeleteEvent(Event event) noexcept override { api_.event_destroy(event); }
  void Record(Event event, Stream stream) override {
    Check(api_.event_record(event, stream), "cudaEventRecord");
  }
  void WaitEvent(Stream stream, Event event) override {
    Check(api_.stream_wait_event(stream, event, 0), "cudaStreamWaitEvent");
  }
  bool Done(Event event) override {
    const int status = api_.event_query(event);
    if (status == kSuccess) return true;
    if (status == kNotReady) return false;
    Check(status, "cudaEventQuery");
    return false;
  }
  void Copy(void* destination, const void* source, size_t bytes, Stream stream) override {
    Check(api_.memcpy_async(destination, source, bytes, kMemcpyDefault, stream),
          "cudaMemcpyAsync of ", bytes, " bytes");
  }
  void* AllocPinned(size_t bytes) override {
    void* pointer = nullptr;
    Check(api_.host_alloc(&pointer, bytes, 0), "cudaHostAlloc of ", bytes, " bytes");
    return pointer;
  }
  void FreePinned(void* pointer) noexcept override { api_.free_host(pointer); }
  bool RegisterHost(void* memory, size_t bytes) override {
    if (api_.host_register(memory, bytes, kHostRegisterPortable) == kSuccess) return true;
    api_.get_last_error();  // copies to unregistered memory still work
    return false;
  }
  void UnregisterHost(void* memory) noexcept override {
    if (api_.host_unregister(memory) != kSuccess) api_.get_last_error();
  }
  void* AllocDevice(size_t bytes, int device) override {
    Guard guard(*this, device);
    void* pointer = nullptr;
    Check(api_.malloc(&pointer, bytes), "cudaMalloc of ", bytes, " bytes on device ", device);
    return pointer;
  }
  void FreeDevice(void* pointer) noexcept override { api_.free(pointer); }

 private:
  // Guard makes `device` current for one call and restores the previous one.
  class Guard {
   public:
    Guard(Cuda& cuda, int device) : cuda_(cuda) {
      previous_ = cuda.CurrentDevice();
      if (previous_ != device) cuda.SetDevice(device);
    }
    ~Guard() {
      if (cuda_.api_.set_device != nullptr) cuda_.api_.set_device(previous_);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    Cuda& cuda_;
    int previous_ = 0;
  };

  template <typename... Args>
  void Check(int status, Args&&... what) {
    if (status == kSuccess) return;
    api_.get_last_error();
    const std::string message =
        internal::MakeMessage(std::forward<Args>(what)..., " failed: ", api_.error_string(status),
                              " (CUDA error ", status, ")");
    if (status == 1) throw InvalidArgumentError(message);  // cudaErrorInvalidValue
    throw Error(message);
  }

  CudaApi api_;
  std::string path_;
};

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (fn == nullptr && missing.empty()) missing = name;
  return fn != nullptr;
}

RuntimeLoad LoadCuda() {
  RuntimeLoad load;
  const LibraryLoad& library = OpenCudaRuntime();
  if (library.handle == nullptr) {
    load.why_not = library.why_not;
    return load;
  }
  CudaApi api{};
  std::string missing;
  void* h = library.handle;
  Resolve(h, "cudaGetDeviceCount", api.get_device_count, missing);
  Resolve(h, "cudaDeviceGetAttribute", api.device_get_attribute, missing);
  Resolve(h, "cudaGetDevice", api.get_device, missing);
  Resolve(h, "cudaSetDevice", api.set_device, missing);
  Resolve(h, "cudaPointerGetAttributes", api.pointer_attributes, missing);
  Resolve(h, "cudaStreamCreateWithFlags", api.stream_create, missing);
  Resolve(h, "cudaStreamDestroy", api.stream_destroy, missing);
  Resolve(h, "cudaEventCreateWithFlags", api.event_create, missing);
  Resolve(h, "cudaEventDestroy", api.event_destroy, missing);
  Resolve(h, "cudaEventRecord", api.event_record, missing);
  Resolve(h, "cudaStreamWaitEvent", api.stream_wait_event, missing);
  Resolve(h, "cudaEventQuery", api.event_query, missing);
  Resolve(h, "cudaMemcpyAsync", api.memcpy_async, missing);
  Resolve(h, "cudaHostAlloc", api.host_alloc, missing);
  Resolve(h, "cudaFreeHost", api.free_host, missing);
  Resolve(h, "cudaHostRegister", api.host_register, missing);
  Resolve(h, "cudaHostUnregister", api.host_unregister, missing);
  Resolve(h, "cudaMalloc", api.malloc, missing);
  Resolve(h, "cudaFree", api.free, missing);
  Resolve(h, "cudaGetErrorString", api.error_string, missing);
  Resolve(h, "cudaGetLastError", api.get_last_error, missing);
  Resolve(h, "cudaRuntimeGetVersion", api.runtime_version, missing);
  Resolve(h, "cudaDriverGetVersion", api.driver_version, missing);
  if (!missing.empty()) {
    load.why_not = internal::MakeMessage(library.path, " lacks ", missing,
                                         "; it is not a CUDA runtime trainrun can use");
    return load;
  }
  load.runtime = std::make_shared<Cuda>(api, library.path);
  return load;
}

}  // namespace

const RuntimeLoad& CudaRuntime() {
  static const RuntimeLoad load = LoadCuda();
  return load;
}

}  // namespace trainrun::collectives::gpu
