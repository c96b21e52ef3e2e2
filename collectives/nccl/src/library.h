// The NCCL and CUDA runtime entry points the NCCL communicator calls, resolved with dlsym from the
// libraries trainrun/collectives/gpu/loader.h opens (TRAINRUN_NCCL_LIBRARY, the nvidia-* wheels,
// the loader's path), so that nothing of NCCL or CUDA is linked: one build serves hosts with and
// without them, and nccl.h and cuda_runtime_api.h give the types only.
//
//   const NcclLibrary& nccl = Nccl();   // throws Error saying what did not load, and why
//   nccl.all_reduce(send, recv, count, ncclFloat32, ncclSum, comm, stream);
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace trainrun::collectives::nccl::internal {

struct NcclLibrary {
  decltype(&::ncclGetUniqueId) get_unique_id;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config;
  decltype(&::ncclCommFinalize) comm_finalize;
  decltype(&::ncclCommDestroy) comm_destroy;
  decltype(&::ncclCommAbort) comm_abort;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error;
  decltype(&::ncclAllReduce) all_reduce;
  decltype(&::ncclBroadcast) broadcast;
  decltype(&::ncclAllGather) all_gather;
  decltype(&::ncclReduceScatter) reduce_scatter;
  decltype(&::ncclGetErrorString) get_error_string;
  decltype(&::ncclGetLastError) get_last_error;
};

struct CudaLibrary {
  decltype(&::cudaGetDeviceCount) get_device_count;
  decltype(&::cudaGetDevice) get_device;
  decltype(&::cudaSetDevice) set_device;
  decltype(&::cudaStreamCreateWithFlags) stream_create_with_flags;
  decltype(&::cudaStreamDestroy) stream_destroy;
  decltype(&::cudaStreamQuery) stream_query;
  decltype(&::cudaGetErrorName) get_error_name;
  decltype(&::cudaGetErrorString) get_error_string;
};

// Nccl returns libnccl.so.2's entry points, opened once (OpenNccl). Throws Error with the loader's
// sentence when it does not open, or naming the first entry point it lacks.
const NcclLibrary& Nccl();
// Cuda returns the CUDA runtime's entry points (OpenCudaRuntime), as Nccl.
const CudaLibrary& Cuda();

}  // namespace trainrun::collectives::nccl::internal
