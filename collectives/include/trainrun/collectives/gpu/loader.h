// Finding and opening CUDA's and NCCL's shared libraries at run time (dlopen), so that one build
// serves hosts with and without GPUs: nothing of CUDA or NCCL is linked.
//
// A library is searched in this order, and the first that opens wins:
//   1. the file or folder its override variable names (TRAINRUN_NCCL_LIBRARY for NCCL,
//      TRAINRUN_CUDA_LIBRARY for the CUDA runtime);
//   2. a copy the process has already loaded (e.g. PyTorch's), so both use one runtime;
//   3. the `nvidia/<package>/lib` folders of the Python `nvidia-*` wheels, under the site folders
//      AddSiteFolders() was given (the Python package passes sys.path) and those of the python3
//      found on PATH;
//   4. the dynamic loader's own path (LD_LIBRARY_PATH, ld.so.cache).
// A library that does not open comes back with one sentence saying what was tried and why not.
//
//   LibraryLoad nccl = OpenNccl();
//   if (!nccl.handle) std::cerr << nccl.why_not << "\n";
//
// ProbeHost asks the driver and NCCL what they are, for `trainrun --dry-run`, without CUDA's
// runtime and without creating a context.
#pragma once

#include <string>
#include <vector>

namespace trainrun::collectives::gpu {

// LibraryLoad: one library opened (handle non-null, path where it was found) or not (why_not).
struct LibraryLoad {
  void* handle = nullptr;
  std::string path;
  std::string why_not;
};

// AddSiteFolders adds folders (Python's sys.path entries) under which nvidia-* wheels are looked
// for. Thread-safe; folders already known are ignored.
void AddSiteFolders(const std::vector<std::string>& folders);

// OpenNccl opens libnccl.so.2 (see the search order above). The result is kept: later calls return
// the same.
const LibraryLoad& OpenNccl();
// OpenCudaRuntime opens libcudart (.so.13, .so.12, .so), kept as OpenNccl's.
const LibraryLoad& OpenCudaRuntime();
// OpenCudaDriver opens libcuda.so.1 (the driver; only the loader's path and an already loaded
// copy), kept as OpenNccl's.
const LibraryLoad& OpenCudaDriver();

// GpuProbe: what a host has, for the dry run.
struct GpuProbe {
  int gpu_count = 0;           // visible devices (CUDA_VISIBLE_DEVICES applies)
  int driver_version = 0;      // CUDA version the driver supports, e.g. 13000; 0 when none
  std::string driver_why_not;  // set when the driver did not load or answer
  int nccl_version = 0;        // e.g. 22809; 0 when NCCL did not load
  std::string nccl_path;
  std::string nccl_why_not;
};

// ProbeHost fills a GpuProbe through libcuda.so.1 (cuInit, cuDeviceGetCount, cuDriverGetVersion)
// and libnccl.so.2 (ncclGetVersion).
GpuProbe ProbeHost();

// DescribeProbe: "2 GPUs, driver CUDA 13.0, NCCL 2.28.9 (/path/libnccl.so.2)", or what is missing.
std::string DescribeProbe(const GpuProbe& probe);

// VersionString turns CUDA's (13000 -> "13.0") or NCCL's (22809 -> "2.28.9") version number into
// text; `nccl` selects NCCL's encoding.
std::string VersionString(int version, bool nccl);

}  // namespace trainrun::collectives::gpu
