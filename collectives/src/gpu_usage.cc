#include "gpu_usage.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::internal {
namespace {

// NVML's structs, as nvml.h declares them.
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlProcessV1 {  // nvmlProcessInfo_v1_t
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct NvmlProcess {  // nvmlProcessInfo_v2_t, and nvmlProcessInfo_t of _v3
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;  // memory NVML cannot tell (WDDM)

template <typename F>
F Symbol(void* library, const char* name) {
  return reinterpret_cast<F>(::dlsym(library, name));
}

}  // namespace

GpuUsageReader::GpuUsageReader() = default;

GpuUsageReader::~GpuUsageReader() {
  if (shutdown_ != nullptr) shutdown_();
  if (library_ != nullptr) ::dlclose(library_);
}

bool GpuUsageReader::Open() {
  const char* path = std::getenv(env::kNvmlLibrary);
  library_ = ::dlopen(path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1",
                      RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return false;
  auto init = Symbol<int (*)()>(library_, "nvmlInit_v2");
  count_ = Symbol<int (*)(unsigned int*)>(library_, "nvmlDeviceGetCount_v2");
  by_index_ = Symbol<int (*)(unsigned int, void**)>(library_, "nvmlDeviceGetHandleByIndex_v2");
  utilization_ = Symbol<int (*)(void*, void*)>(library_, "nvmlDeviceGetUtilizationRates");
  for (const char* name :
       {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"}) {
    if (processes_ == nullptr) {
      processes_ = Symbol<int (*)(void*, unsigned int*, void*)>(library_, name);
    }
  }
  if (processes_ == nullptr) {
    processes_ = Symbol<int (*)(void*, unsigned int*, void*)>(
        library_, "nvmlDeviceGetComputeRunningProcesses");
    processes_v1_ = true;
  }
  auto shutdown = Symbol<int (*)()>(library_, "nvmlShutdown");
  if (init == nullptr || count_ == nullptr || by_index_ == nullptr || utilization_ == nullptr ||
      processes_ == nullptr || shutdown == nullptr || init() != kNvmlSuccess) {
    return false;
  }
  shutdown_ = shutdown;
  return true;
}

std::optional<uint64_t> GpuUsageReader::Mine(void* device) const {
  const unsigned int me = static_cast<unsigned int>(::getpid());
  const size_t size = processes_v1_ ? sizeof(NvmlProcessV1) : sizeof(NvmlProcess);
  for (unsigned int room = 16; room <= 4096; room *= 4) {
    std::vector<unsigned char> table(room * size);
    unsigned int n = room;
    const int status = processes_(device, &n, table.data());
    if (status == kNvmlInsufficientSize) continue;
    if (status != kNvmlSuccess) return std::nullopt;
    for (unsigned int i = 0; i < n && i < room; ++i) {
      const unsigned char* entry = table.data() + i * size;
      const unsigned int pid = *reinterpret_cast<const unsigned int*>(entry);
      const unsigned long long used =
          processes_v1_ ? reinterpret_cast<const NvmlProcessV1*>(entry)->used_gpu_memory
                        : reinterpret_cast<const NvmlProcess*>(entry)->used_gpu_memory;
      if (pid == me) return used == kNvmlValueNotAvailable ? 0 : used;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<GpuUsage> GpuUsageReader::Read() {
  if (!tried_) {
    tried_ = true;
    open_ = Open();
  }
  if (!open_) return std::nullopt;
  std::optional<uint64_t> memory;
  if (device_ != nullptr) memory = Mine(device_);
  if (!memory.has_value()) {
    // Not found yet (no CUDA context), or moved: look on every device.
    device_ = nullptr;
    unsigned int count = 0;
    if (count_(&count) != kNvmlSuccess) return std::nullopt;
    for (unsigned int i = 0; i < count && !memory.has_value(); ++i) {
      void* device = nullptr;
      if (by_index_(i, &device) != kNvmlSuccess) continue;
      memory = Mine(device);
      if (memory.has_value()) device_ = device;
    }
  }
  if (device_ == nullptr) return std::nullopt;
  NvmlUtilization utilization{};
  if (utilization_(device_, &utilization) != kNvmlSuccess) return std::nullopt;
  return GpuUsage{utilization.gpu, *memory};
}

}  // namespace trainrun::collectives::internal
