// GpuUsage: the busy share of the GPU a rank works on, and the memory the rank holds there,
// through NVIDIA's management library (NVML, libnvidia-ml.so.1, part of the driver), for the
// rank's monitor reports (attribution.h). The rank's GPU is the one where NVML lists this process
// (the device it made its CUDA context on, whatever CUDA_VISIBLE_DEVICES and set_device chose),
// looked for at each reading until found. NVML is opened with dlopen on the first reading, only
// by a rank that reports; without it, or before the rank has touched a GPU, there is no reading.
//
//   GpuUsageReader reader;                       // env::kNvmlLibrary, or the loader's path
//   if (auto usage = reader.Read()) report.gpu_percent = usage->percent;
#pragma once

#include <cstdint>
#include <optional>

namespace trainrun::collectives::internal {

struct GpuUsage {
  uint32_t percent = 0;       // of NVML's last sample period the GPU was busy
  uint64_t memory_bytes = 0;  // this process holds on the device
};

class GpuUsageReader {
 public:
  GpuUsageReader();
  ~GpuUsageReader();
  GpuUsageReader(const GpuUsageReader&) = delete;
  GpuUsageReader& operator=(const GpuUsageReader&) = delete;

  // Read returns the rank's GPU use now; nullopt without NVML or a GPU this process is on.
  std::optional<GpuUsage> Read();

 private:
  bool Open();
  // Mine finds this process on `device`: its memory there, or nullopt.
  std::optional<uint64_t> Mine(void* device) const;

  bool tried_ = false;
  bool open_ = false;
  void* library_ = nullptr;
  void* device_ = nullptr;  // the nvmlDevice_t this process was last found on
  int (*count_)(unsigned int*) = nullptr;
  int (*by_index_)(unsigned int, void**) = nullptr;
  int (*processes_)(void*, unsigned int*, void*) = nullptr;  // _v3/_v2 (4 fields) or v1 (2)
  bool processes_v1_ = false;
  int (*utilization_)(void*, void*) = nullptr;
  int (*shutdown_)() = nullptr;
};

}  // namespace trainrun::collectives::internal
