// A stand-in for NVIDIA's management library (libnvidia-ml.so.1) with the calls a rank's GPU
// reading makes (collectives/src/gpu_usage.h), for tests/monitor's "gpu" case on machines without
// a GPU: four devices, device i busy 40 + 10·i percent; the calling process is on device
// LOCAL_RANK % 4 (as a script that called torch.cuda.set_device(local_rank)), holding
// (i + 1) × 256 MiB there. Loaded by TRAINRUN_NVML_LIBRARY.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
struct Process {  // nvmlProcessInfo_t of _v3
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr int kSuccess = 0;
constexpr int kInsufficientSize = 7;
constexpr int kNotFound = 6;  // NVML_ERROR_NOT_FOUND
constexpr int kUninitialized = 1;
constexpr unsigned kDevices = 4;
bool initialized = false;
uintptr_t devices[kDevices] = {1, 2, 3, 4};  // handles: device i is &devices[i]

unsigned IndexOf(void* device) {
  return static_cast<unsigned>(static_cast<uintptr_t*>(device) - devices);
}

unsigned MyDevice() {
  const char* local_rank = std::getenv("LOCAL_RANK");
  return local_rank == nullptr ? 0 : static_cast<unsigned>(std::atoi(local_rank)) % kDevices;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  initialized = true;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  initialized = false;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                                         void** device) {
  if (!initialized) return kUninitialized;
  if (index >= kDevices) return kNotFound;
  *device = &devices[index];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized) return kUninitialized;
  *count = kDevices;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(
    void* device, unsigned int* count, Process* out) {
  if (!initialized) return kUninitialized;
  // Another process on every device, and this one on its own.
  const bool mine = IndexOf(device) == MyDevice();
  const unsigned n = mine ? 2 : 1;
  if (*count < n) {
    *count = n;
    return kInsufficientSize;
  }
  *count = n;
  out[0] = Process{1, 100ull << 20, 0, 0};
  if (mine)
    out[1] = Process{static_cast<unsigned>(::getpid()), (IndexOf(device) + 1ull) << 28, 0, 0};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUtilizationRates(void* device,
                                                                         Utilization* out) {
  if (!initialized) return kUninitialized;
  out->gpu = 40 + 10 * IndexOf(device);
  out->memory = 5;
  return kSuccess;
}

}  // extern "C"
