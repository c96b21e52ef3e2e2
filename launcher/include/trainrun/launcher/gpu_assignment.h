// GPU assignment: which GPU each local rank sees, through CUDA_VISIBLE_DEVICES, one per rank.
//
// A pure decision (AssignGpu) plus a CUDA-free count of the host's GPUs (CountHostGpus), so the
// launcher needs no CUDA to link. The launcher calls them once per rank while building its env:
//
//   GpuAssignmentRequest request{local_rank, local_size, UserVisibleDevices(), CountHostGpus(),
//                                env::kAssignGpus.Get() != 0};
//   absl::StatusOr<std::optional<std::string>> value = AssignGpu(request);
//   if (!value.ok()) return value.status();
//   if (*value) worker_env[env::kCudaVisibleDevices] = **value;
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace trainrun::launcher {

struct GpuAssignmentRequest {
  // The rank's index on its host, and the number of ranks on that host.
  int local_rank = 0;
  int local_size = 1;
  // CUDA_VISIBLE_DEVICES as the user set it for the job (nullopt: unset). Entries are indices or
  // UUIDs (GPU-..., MIG-...), comma-separated; they are passed through as written.
  std::optional<std::string> user_visible_devices;
  // GPUs on the host, from CountHostGpus().
  int host_gpu_count = 0;
  // The TRAINRUN_ASSIGN_GPUS switch (env::kAssignGpus).
  bool enabled = true;
};

// AssignGpu returns the CUDA_VISIBLE_DEVICES value to set for the rank, or nullopt to leave the
// variable as it is. When `enabled`:
//  - the user set CUDA_VISIBLE_DEVICES to a list: the rank gets entry local_rank modulo the list's
//    length (ranks share entries when the list is shorter than local_size);
//  - the user set it empty (no GPUs wanted), or left it unset on a host without GPUs: nullopt;
//  - unset on a host with GPUs: the index local_rank modulo host_gpu_count.
// Returns INVALID_ARGUMENT when local_rank is outside [0, local_size) or host_gpu_count < 0.
absl::StatusOr<std::optional<std::string>> AssignGpu(const GpuAssignmentRequest& request);

// CountHostGpus counts NVIDIA GPUs without CUDA: device nodes `dev_dir`/nvidia<N>, or, when there
// are none, the entries of `proc_gpus_dir` (one per GPU the driver knows). 0 when neither exists.
int CountHostGpus(const std::string& dev_dir = "/dev",
                  const std::string& proc_gpus_dir = "/proc/driver/nvidia/gpus");

}  // namespace trainrun::launcher
