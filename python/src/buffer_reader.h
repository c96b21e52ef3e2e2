// BufferReader: a torch tensor's or NumPy array's (address, count, element type, shape), read in
// C++ through the Python C API, for the calls that take many tensors at once (200 small
// allreduce_async_ calls in a row, a grouped allreduce of 200 tensors), where reading them in
// Python cost more than the fused allreduce itself (~2 µs a tensor: trainrun/_buffers.py's view()).
//
//   static BufferReader& reader = *new BufferReader;  // one per process, never destroyed
//                                                     // (it holds Python references)
//   BufferView view;
//   if (reader.Read(obj, /*writable=*/true, &view)) { ... view.data, view.count, view.type ... }
//
// It reads only the common case: a dense, contiguous CPU torch tensor, or a C-contiguous, native
// byte order NumPy array (writable if asked), of a type the collectives support. Anything else
// returns false, and the caller takes the Python path (trainrun/_buffers.py), which says what is
// wrong. Neither torch nor NumPy is imported here: an object is a tensor only if torch is already
// loaded, and an array only if NumPy is.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "trainrun/collectives/types.h"

namespace trainrun::python {

// BufferView is what Read found: `data` holds `count` elements of `type`, laid out as `shape`.
struct BufferView {
  void* data = nullptr;
  size_t count = 0;
  collectives::DataType type = collectives::DataType::kFloat32;
  std::vector<int64_t> shape;
};

class BufferReader {
 public:
  BufferReader() = default;
  BufferReader(const BufferReader&) = delete;
  BufferReader& operator=(const BufferReader&) = delete;

  // Read fills `view` from `obj` and returns true in the common case (see above); otherwise it
  // returns false with no Python error set. Needs the GIL.
  bool Read(PyObject* obj, bool writable, BufferView* view);

 private:
  bool ReadTensor(PyObject* tensor, BufferView* view);
  bool ReadArray(PyObject* array, bool writable, BufferView* view);
  // Finds torch.Tensor and its dtypes once torch is loaded (false until then).
  bool FindTorch();
  // Finds numpy.ndarray once NumPy is loaded (false until then).
  bool FindNumpy();

  PyObject* tensor_type_ = nullptr;   // torch.Tensor (a strong reference), once found
  PyObject* ndarray_type_ = nullptr;  // numpy.ndarray, once found
  // torch.dtype objects of the supported types, with their DataType (strong references).
  std::vector<std::pair<PyObject*, collectives::DataType>> torch_dtypes_;
  // Interned attribute names.
  PyObject* is_cpu_ = nullptr;
  PyObject* dtype_ = nullptr;
  PyObject* is_contiguous_ = nullptr;
  PyObject* data_ptr_ = nullptr;
  PyObject* shape_ = nullptr;
};

}  // namespace trainrun::python
