#include "trainrun/collectives/nccl/check.h"

#include "library.h"

namespace trainrun::collectives::nccl::internal {

void ThrowNcclError(ncclResult_t result, const char* call, const char* file, int line,
                    const std::string& context) {
  // ncclGetLastError ignores its argument and may describe an earlier asynchronous failure, which
  // is still the most useful detail when a peer died.
  const char* last = Nccl().get_last_error(nullptr);
  std::string message = ::trainrun::internal::MakeMessage(
      context, ": NCCL failed: ", Nccl().get_error_string(result));
  if (last != nullptr && *last != '\0')
    message += ::trainrun::internal::MakeMessage(" (", last, ")");
  message += ::trainrun::internal::MakeMessage(" [", call, " at ", file, ":", line, "]");
  switch (result) {
    case ncclRemoteError:
    case ncclSystemError:
      throw IoError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      throw InvalidArgumentError(message);
    default:
      throw Error(message);
  }
}

void ThrowCudaError(cudaError_t error, const char* call, const char* file, int line,
                    const std::string& context) {
  std::string message = ::trainrun::internal::MakeMessage(
      context, ": CUDA failed: ", Cuda().get_error_name(error), ": ",
      Cuda().get_error_string(error), " [", call, " at ", file, ":", line, "]");
  if (error == cudaErrorInvalidValue || error == cudaErrorInvalidDevice) {
    throw InvalidArgumentError(message);
  }
  throw Error(message);
}

}  // namespace trainrun::collectives::nccl::internal
