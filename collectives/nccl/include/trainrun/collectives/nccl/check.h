// TRAINRUN_NCCL_CHECK and TRAINRUN_CUDA_CHECK: turn an ncclResult_t or cudaError_t into a trainrun
// exception that carries NCCL's or CUDA's own words and the caller's context.
//
//   TRAINRUN_CUDA_CHECK(cudaMalloc(&p, bytes), "allocating ", bytes, " bytes on rank ", rank);
//   TRAINRUN_NCCL_CHECK(ncclGetUniqueId(&id), "creating the unique ID of communicator 'world'");
//
// A peer's failure (ncclRemoteError, ncclSystemError) becomes IoError, a bad argument
// (ncclInvalidArgument, ncclInvalidUsage, cudaErrorInvalidValue) InvalidArgumentError, anything
// else Error. ncclInProgress counts as a failure here: code that drives a non-blocking
// communicator handles it before checking.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::nccl::internal {

// ThrowNcclError throws the exception for `result`, whose message reads
// "<context>: NCCL failed: <ncclGetErrorString> (<ncclGetLastError>) [<call> at <file>:<line>]".
[[noreturn]] void ThrowNcclError(ncclResult_t result, const char* call, const char* file, int line,
                                 const std::string& context);

// ThrowCudaError is ThrowNcclError's counterpart for CUDA runtime errors (cudaGetErrorString).
[[noreturn]] void ThrowCudaError(cudaError_t error, const char* call, const char* file, int line,
                                 const std::string& context);

}  // namespace trainrun::collectives::nccl::internal

// TRAINRUN_NCCL_CHECK evaluates `call` once and throws unless it returned ncclSuccess. The context
// (one or more streamable values) says what was being done and on which rank.
#define TRAINRUN_NCCL_CHECK(call, ...)                         \
  do {                                                         \
    const ncclResult_t trainrun_nccl_result = (call);          \
    if (trainrun_nccl_result != ncclSuccess) {                 \
      ::trainrun::collectives::nccl::internal::ThrowNcclError( \
          trainrun_nccl_result, #call, __FILE__, __LINE__,     \
          ::trainrun::internal::MakeMessage(__VA_ARGS__));     \
    }                                                          \
  } while (0)

// TRAINRUN_CUDA_CHECK evaluates `call` once and throws unless it returned cudaSuccess.
#define TRAINRUN_CUDA_CHECK(call, ...)                         \
  do {                                                         \
    const cudaError_t trainrun_cuda_error = (call);            \
    if (trainrun_cuda_error != cudaSuccess) {                  \
      ::trainrun::collectives::nccl::internal::ThrowCudaError( \
          trainrun_cuda_error, #call, __FILE__, __LINE__,      \
          ::trainrun::internal::MakeMessage(__VA_ARGS__));     \
    }                                                          \
  } while (0)
