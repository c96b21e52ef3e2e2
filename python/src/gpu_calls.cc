#include "gpu_calls.h"

#include <dlfcn.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/collectives/gpu/runtime.h"

namespace py = pybind11;

namespace trainrun::python {
namespace {

// DLPack's structures (dlpack.h, v0.8 and v1.0), as a capsule holds them.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLManagedTensorVersioned {
  uint32_t major;
  uint32_t minor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};

// DLPackTypeName: trainrun's name of a DLPack element type, or "" when it has none.
std::string DLPackTypeName(DLDataType type) {
  if (type.lanes != 1) return "";
  switch (type.code) {
    case 0:  // kDLInt
      return type.bits == 8    ? "int8"
             : type.bits == 16 ? "int16"
             : type.bits == 32 ? "int32"
             : type.bits == 64 ? "int64"
                               : "";
    case 1:  // kDLUInt
      return type.bits == 8 ? "uint8" : "";
    case 2:  // kDLFloat
      return type.bits == 16   ? "float16"
             : type.bits == 32 ? "float32"
             : type.bits == 64 ? "float64"
                               : "";
    case 4:  // kDLBfloat
      return type.bits == 16 ? "bfloat16" : "";
    case 6:  // kDLBool
      return type.bits == 8 ? "bool" : "";
    default:
      return "";
  }
}

// DLPackView reads a "dltensor" (or "dltensor_versioned") capsule without consuming it: the
// address of its first element, its device type and index (kDLCUDA is 2), element type name,
// shape, and whether it is C-contiguous.
py::tuple DLPackView(py::capsule capsule) {
  const char* name = capsule.name();
  const DLTensor* tensor = nullptr;
  if (name != nullptr && std::string(name) == "dltensor") {
    tensor = &static_cast<DLManagedTensor*>(capsule.get_pointer())->dl_tensor;
  } else if (name != nullptr && std::string(name) == "dltensor_versioned") {
    tensor = &static_cast<DLManagedTensorVersioned*>(capsule.get_pointer())->dl_tensor;
  } else {
    throw InvalidArgumentError(
        "not a DLPack capsule (its name is neither dltensor nor "
        "dltensor_versioned; was it consumed already?)");
  }
  std::vector<int64_t> shape(tensor->shape, tensor->shape + tensor->ndim);
  bool contiguous = true;
  if (tensor->strides != nullptr) {
    int64_t expected = 1;
    for (int i = tensor->ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && tensor->strides[i] != expected) contiguous = false;
      expected *= shape[i];
    }
  }
  const auto address =
      reinterpret_cast<uintptr_t>(tensor->data) + static_cast<uintptr_t>(tensor->byte_offset);
  return py::make_tuple(address, tensor->device.device_type, tensor->device.device_id,
                        DLPackTypeName(tensor->dtype), shape, contiguous);
}

// NcclVersion is ncclGetVersion's answer (e.g. 22809) from the libnccl.so.2 the NCCL path would use
// (gpu::OpenNccl), or 0 when none opens or it does not answer.
int NcclVersion() {
  const collectives::gpu::LibraryLoad& nccl = collectives::gpu::OpenNccl();
  int version = 0;
  if (nccl.handle != nullptr) {
    using VersionFn = int (*)(int*);
    auto fn = reinterpret_cast<VersionFn>(::dlsym(nccl.handle, "ncclGetVersion"));
    if (fn == nullptr || fn(&version) != 0) version = 0;
  }
  return version;
}

py::dict GpuInfo(collectives::Runtime& runtime) {
  namespace gpu = collectives::gpu;
  py::dict info;
  const gpu::RuntimeLoad& cuda = gpu::CudaRuntime();
  info["cuda"] = cuda.runtime != nullptr;
  info["cuda_runtime"] = cuda.runtime ? py::object(py::str(cuda.runtime->Describe())) : py::none();
  info["cuda_why_not"] = cuda.why_not;
  info["devices"] = cuda.runtime ? cuda.runtime->DeviceCount() : 0;
  std::string nccl_why;
  const gpu::LibraryLoad& nccl = gpu::OpenNccl();
  info["nccl"] = nccl.handle != nullptr;
  info["nccl_path"] = nccl.path;
  info["nccl_why_not"] = nccl.why_not;
  const int version = NcclVersion();
  info["nccl_version"] =
      version > 0 ? py::object(py::str(gpu::VersionString(version, true))) : py::none();
  std::string why;
  if (runtime.initialized()) {
    const gpu::Path path = runtime.GpuPath(0, &why);
    info["path"] = gpu::PathName(path);
    info["path_why"] = why;
    info["fused"] = runtime.GpuFused(0);
  } else {
    info["path"] = "undecided";
    info["path_why"] = "";
    info["fused"] = 0;
  }
  return info;
}

}  // namespace

void AddGpuCalls(py::module_& m, std::function<collectives::Runtime&()> runtime) {
  m.def(
      "gpu_info", [runtime] { return GpuInfo(runtime()); },
      "What GPU support loaded (CUDA's runtime, NCCL), why not, and the world's GPU path.");
  m.def("nccl_version", &NcclVersion,
        "ncclGetVersion of the libnccl.so.2 GPU collectives would load (e.g. 22809), 0 if none.");
  m.def(
      "add_gpu_search_dirs",
      [](std::vector<std::string> folders) { collectives::gpu::AddSiteFolders(folders); },
      py::arg("folders"),
      "Site folders under which the nvidia-* wheels' libraries are looked for.");
  m.def(
      "gpu_path",
      [runtime](int set) {
        std::string why;
        const collectives::gpu::Path path = runtime().GpuPath(set, &why);
        return py::make_tuple(collectives::gpu::PathName(path), why);
      },
      py::arg("set") = 0, "The path process set `set`'s GPU collectives take, and why.");
  m.def(
      "gpu_device_of",
      [runtime](uintptr_t address) {
        const int device = runtime().Gpu().DeviceOf(reinterpret_cast<const void*>(address));
        if (device < 0) {
          throw InvalidArgumentError(
              "an array exposing __cuda_array_interface__ points to host memory, not to a GPU");
        }
        return device;
      },
      py::arg("address"), "The CUDA device `address` is on.");
  m.def("dlpack_view", &DLPackView, py::arg("capsule"),
        "(address, device type, device index, dtype name, shape, contiguous) of a DLPack capsule.");
  m.def(
      "_use_gpu_runtime_for_tests",
      [runtime](py::capsule capsule) {
        if (capsule.name() == nullptr || std::string(capsule.name()) != "trainrun.gpu.GpuRuntime") {
          throw InvalidArgumentError("not a trainrun.gpu.GpuRuntime capsule");
        }
        auto* fake = static_cast<collectives::gpu::GpuRuntime*>(capsule.get_pointer());
        // The capsule's module owns the runtime for the life of the process.
        runtime().UseGpuRuntime(std::shared_ptr<collectives::gpu::GpuRuntime>(
            fake, [](collectives::gpu::GpuRuntime*) {}));
      },
      py::arg("capsule"),
      "Tests only: GPU collectives use this GpuRuntime (a capsule from the tests' fake module).");
}

}  // namespace trainrun::python
