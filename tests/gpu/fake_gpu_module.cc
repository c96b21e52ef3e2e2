// _fake_gpu: the tests' CPU fake of a GPU runtime (fake_gpu_runtime.h) for Python, so the Python
// dispatch of GPU buffers runs without a GPU. install() hands trainrun._core the fake as its GPU
// runtime; arrays of "device" memory (fake_cuda.py) expose __cuda_array_interface__ over it; and
// "kernels" write or read such memory on a fake stream, after a delay, in stream order.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "fake_gpu_runtime.h"

namespace py = pybind11;
using trainrun::collectives::gpu::Stream;
using trainrun::collectives::gpu::testing::FakeGpuRuntime;

namespace {

// The fake lives as long as the process: trainrun._core holds a plain pointer to it.
FakeGpuRuntime* fake = nullptr;

FakeGpuRuntime& Fake() {
  if (fake == nullptr) throw std::runtime_error("_fake_gpu.install() was not called");
  return *fake;
}

Stream ToStream(uintptr_t stream) { return reinterpret_cast<Stream>(stream); }

}  // namespace

PYBIND11_MODULE(_fake_gpu, m) {
  m.doc() = "Tests only: a CPU fake of a GPU runtime for trainrun.";
  m.def(
      "install",
      [](int devices) {
        if (fake == nullptr) fake = new FakeGpuRuntime(devices);  // NOLINT: lives to exit
        return py::capsule(static_cast<trainrun::collectives::gpu::GpuRuntime*>(fake),
                           "trainrun.gpu.GpuRuntime");
      },
      py::arg("devices") = 1);
  m.def(
      "alloc",
      [](size_t bytes, int device) {
        return reinterpret_cast<uintptr_t>(Fake().AllocDevice(bytes, device));
      },
      py::arg("bytes"), py::arg("device"));
  m.def("free", [](uintptr_t p) { Fake().FreeDevice(reinterpret_cast<void*>(p)); });
  m.def("device_of", [](uintptr_t p) { return Fake().DeviceOf(reinterpret_cast<void*>(p)); });
  m.def(
      "new_stream",
      [](int device) { return reinterpret_cast<uintptr_t>(Fake().NewStream(device)); },
      py::arg("device") = 0);
  // write_later: a "kernel" on `stream` that sleeps `delay_ms`, then copies `data` to `address`.
  m.def(
      "write_later",
      [](uintptr_t stream, uintptr_t address, py::bytes data, double delay_ms) {
        std::string bytes = data;
        Fake().Launch(ToStream(stream), [address, bytes, delay_ms] {
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
          std::memcpy(reinterpret_cast<void*>(address), bytes.data(), bytes.size());
        });
      },
      py::arg("stream"), py::arg("address"), py::arg("data"), py::arg("delay_ms") = 0);
  // copy_later: a "kernel" that copies `bytes` bytes from `source` to `destination`.
  m.def(
      "copy_later",
      [](uintptr_t stream, uintptr_t destination, uintptr_t source, size_t bytes, double delay_ms) {
        Fake().Launch(ToStream(stream), [=] {
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
          std::memcpy(reinterpret_cast<void*>(destination), reinterpret_cast<void*>(source), bytes);
        });
      },
      py::arg("stream"), py::arg("destination"), py::arg("source"), py::arg("bytes"),
      py::arg("delay_ms") = 0);
  m.def(
      "synchronize",
      [](uintptr_t stream) {
        py::gil_scoped_release release;
        Fake().Synchronize(ToStream(stream));
      },
      py::arg("stream"));
  m.def("pinned_allocations", [] { return Fake().pinned_allocations(); });
  m.def("copies", [] { return Fake().copies(); });
  m.def("host_device_copies", [] { return Fake().host_device_copies(); });
  // hold_copies_to_device(True): copies into device memory (the copies back) wait until False.
  m.def(
      "hold_copies_to_device", [](bool hold) { Fake().HoldCopiesToDevice(hold); }, py::arg("hold"));
}
