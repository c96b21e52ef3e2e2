#include "library.h"

#include <dlfcn.h>

#include <string>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/loader.h"

namespace trainrun::collectives::nccl::internal {
namespace {

// Table is a library's resolved entry points, or why there are none.
template <typename Api>
struct Table {
  Api api{};
  std::string why_not;
};

template <typename Fn>
void Resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (fn == nullptr && missing.empty()) missing = name;
}

template <typename Api, typename Fill>
Table<Api> Load(const gpu::LibraryLoad& library, const char* what, Fill fill) {
  Table<Api> table;
  if (library.handle == nullptr) {
    table.why_not = library.why_not;
    return table;
  }
  std::string missing;
  fill(library.handle, table.api, missing);
  if (!missing.empty()) {
    table.why_not = ::trainrun::internal::MakeMessage(library.path, " lacks ", missing,
                                                      "; it is not ", what, " trainrun can use");
  }
  return table;
}

}  // namespace

const NcclLibrary& Nccl() {
  static const Table<NcclLibrary> table =
      Load<NcclLibrary>(gpu::OpenNccl(), "an NCCL (2.14 or later)",
                        [](void* h, NcclLibrary& api, std::string& missing) {
                          Resolve(h, "ncclGetUniqueId", api.get_unique_id, missing);
                          Resolve(h, "ncclCommInitRankConfig", api.comm_init_rank_config, missing);
                          Resolve(h, "ncclCommFinalize", api.comm_finalize, missing);
                          Resolve(h, "ncclCommDestroy", api.comm_destroy, missing);
                          Resolve(h, "ncclCommAbort", api.comm_abort, missing);
                          Resolve(h, "ncclCommGetAsyncError", api.comm_get_async_error, missing);
                          Resolve(h, "ncclAllReduce", api.all_reduce, missing);
                          Resolve(h, "ncclBroadcast", api.broadcast, missing);
                          Resolve(h, "ncclAllGather", api.all_gather, missing);
                          Resolve(h, "ncclReduceScatter", api.reduce_scatter, missing);
                          Resolve(h, "ncclGetErrorString", api.get_error_string, missing);
                          Resolve(h, "ncclGetLastError", api.get_last_error, missing);
                        });
  if (!table.why_not.empty()) throw Error(table.why_not);
  return table.api;
}

const CudaLibrary& Cuda() {
  static const Table<CudaLibrary> table = Load<CudaLibrary>(
      gpu::OpenCudaRuntime(), "a CUDA runtime",
      [](void* h, CudaLibrary& api, std::string& missing) {
        Resolve(h, "cudaGetDeviceCount", api.get_device_count, missing);
        Resolve(h, "cudaGetDevice", api.get_device, missing);
        Resolve(h, "cudaSetDevice", api.set_device, missing);
        Resolve(h, "cudaStreamCreateWithFlags", api.stream_create_with_flags, missing);
        Resolve(h, "cudaStreamDestroy", api.stream_destroy, missing);
        Resolve(h, "cudaStreamQuery", api.stream_query, missing);
        Resolve(h, "cudaGetErrorName", api.get_error_name, missing);
        Resolve(h, "cudaGetErrorString", api.get_error_string, missing);
      });
  if (!table.why_not.empty()) throw Error(table.why_not);
  return table.api;
}

}  // namespace trainrun::collectives::nccl::internal
