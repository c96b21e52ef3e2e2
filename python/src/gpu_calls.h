// The bindings GPU buffers need besides the collectives' `device` and `stream` arguments:
// gpu_info() (what loaded, and why not), the folders of the Python nvidia-* wheels for the loader,
// the path a process set's GPU collectives take, reading a DLPack capsule, and, for the tests
// only, making a GpuRuntime from a capsule (the CPU fake, which this module does not contain) the
// runtime's.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>

#include "trainrun/collectives/runtime.h"

namespace trainrun::python {

void AddGpuCalls(pybind11::module_& m, std::function<collectives::Runtime&()> runtime);

}  // namespace trainrun::python
