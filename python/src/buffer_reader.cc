#include "buffer_reader.h"

#include <cstring>

namespace trainrun::python {

using collectives::DataType;

namespace {

// TakeBool returns whether `value` (a new reference, maybe null) is True, and releases it.
bool TakeTrue(PyObject* value) {
  if (value == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool yes = value == Py_True;
  Py_DECREF(value);
  return yes;
}

// TakeInt64 stores `value` (a new reference to an int, maybe null) in `out`, and releases it.
bool TakeInt64(PyObject* value, int64_t* out) {
  if (value == nullptr) {
    PyErr_Clear();
    return false;
  }
  const long long v = PyLong_AsLongLong(value);
  Py_DECREF(value);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = v;
  return true;
}

// ReadShape fills `shape` from a tuple of ints (torch.Size is one).
bool ReadShape(PyObject* tuple, std::vector<int64_t>* shape) {
  if (tuple == nullptr || !PyTuple_Check(tuple)) {
    Py_XDECREF(tuple);
    PyErr_Clear();
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  shape->resize(static_cast<size_t>(n));
  bool ok = true;
  for (Py_ssize_t i = 0; i < n && ok; ++i) {
    const long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    ok = !(d == -1 && PyErr_Occurred());
    (*shape)[static_cast<size_t>(i)] = d;
  }
  Py_DECREF(tuple);
  if (!ok) PyErr_Clear();
  return ok;
}

// ArrayType maps a buffer-protocol format ("f", "<d", "?", ...) of `itemsize` bytes to the
// element type NumPy's dtype of that name has, when it is one the collectives support in native
// byte order.
bool ArrayType(const char* format, Py_ssize_t itemsize, DataType* type) {
  if (format == nullptr) return false;
  if (*format == '<' || *format == '=' || *format == '@') ++format;  // little-endian here
  if (format[0] == '\0' || format[1] != '\0') return false;
  switch (format[0]) {
    case 'f':
      *type = DataType::kFloat32;
      return itemsize == 4;
    case 'd':
      *type = DataType::kFloat64;
      return itemsize == 8;
    case 'e':
      *type = DataType::kFloat16;
      return itemsize == 2;
    case 'b':
      *type = DataType::kInt8;
      return itemsize == 1;
    case 'B':
      *type = DataType::kUInt8;
      return itemsize == 1;
    case '?':
      *type = DataType::kBool;
      return itemsize == 1;
    case 'h':
      *type = DataType::kInt16;
      return itemsize == 2;
    case 'i':
    case 'l':
    case 'q':
      *type = itemsize == 4 ? DataType::kInt32 : DataType::kInt64;
      return itemsize == 4 || itemsize == 8;
    default:
      return false;
  }
}

// LoadedModuleAttr returns module `module`'s attribute `name` (a new reference) if the module is
// already imported, else null; never imports and leaves no error set.
// Until torch is imported every Read looks for it: a dictionary lookup by a name made once.
PyObject* LoadedModuleAttr(const char* module, const char* name) {
  static PyObject* torch_name = PyUnicode_InternFromString("torch");
  static PyObject* numpy_name = PyUnicode_InternFromString("numpy");
  PyObject* module_name = std::strcmp(module, "torch") == 0   ? torch_name
                          : std::strcmp(module, "numpy") == 0 ? numpy_name
                                                              : nullptr;
  if (module_name == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* m = PyImport_GetModule(module_name);
  if (m == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* attr = PyObject_GetAttrString(m, name);
  Py_DECREF(m);
  if (attr == nullptr) PyErr_Clear();
  return attr;
}

}  // namespace

bool BufferReader::Read(PyObject* obj, bool writable, BufferView* view) {
  if (tensor_type_ != nullptr || FindTorch()) {
    if (PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(tensor_type_))) {
      return ReadTensor(obj, view);
    }
  }
  if (ndarray_type_ != nullptr || FindNumpy()) {
    if (PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(ndarray_type_))) {
      return ReadArray(obj, writable, view);
    }
  }
  return false;
}

bool BufferReader::ReadTensor(PyObject* t, BufferView* view) {
  // As few attribute reads as will do (each costs ~50 ns, and 200 tensors in a row are common):
  // a sparse or MKL-DNN tensor fails data_ptr() (no storage), and numel is the shape's product.
  // Any read that fails sends the tensor the Python way, which says what is wrong.
  if (!TakeTrue(PyObject_GetAttr(t, is_cpu_))) return false;
  PyObject* dtype = PyObject_GetAttr(t, dtype_);
  if (dtype == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool known = false;
  for (const auto& [object, type] : torch_dtypes_) {
    if (object == dtype) {
      view->type = type;
      known = true;
      break;
    }
  }
  Py_DECREF(dtype);
  if (!known) return false;
  if (!TakeTrue(PyObject_CallMethodNoArgs(t, is_contiguous_))) return false;
  int64_t address = 0;
  if (!TakeInt64(PyObject_CallMethodNoArgs(t, data_ptr_), &address)) return false;
  if (!ReadShape(PyObject_GetAttr(t, shape_), &view->shape)) return false;
  size_t count = 1;
  for (int64_t d : view->shape) {
    if (d < 0) return false;
    count *= static_cast<size_t>(d);
  }
  view->data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  view->count = count;
  return true;
}

bool BufferReader::ReadArray(PyObject* array, bool writable, BufferView* view) {
  Py_buffer buffer;
  const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(array, &buffer, flags) != 0) {
    PyErr_Clear();
    return false;
  }
  const bool ok = buffer.itemsize > 0 && ArrayType(buffer.format, buffer.itemsize, &view->type);
  if (ok) {
    view->data = buffer.buf;
    view->count = static_cast<size_t>(buffer.len / buffer.itemsize);
    view->shape.assign(buffer.shape, buffer.shape + buffer.ndim);
  }
  PyBuffer_Release(&buffer);
  return ok;
}

bool BufferReader::FindTorch() {
  PyObject* tensor = LoadedModuleAttr("torch", "Tensor");
  if (tensor != nullptr && !PyType_Check(tensor)) Py_CLEAR(tensor);
  if (tensor == nullptr) return false;
  is_cpu_ = PyUnicode_InternFromString("is_cpu");
  dtype_ = PyUnicode_InternFromString("dtype");
  is_contiguous_ = PyUnicode_InternFromString("is_contiguous");
  data_ptr_ = PyUnicode_InternFromString("data_ptr");
  shape_ = PyUnicode_InternFromString("shape");
  for (int code = 0; code < collectives::kDataTypeCount; ++code) {
    const auto type = static_cast<DataType>(code);
    PyObject* dtype = LoadedModuleAttr("torch", collectives::DataTypeName(type));
    if (dtype != nullptr) torch_dtypes_.emplace_back(dtype, type);
  }
  tensor_type_ = tensor;
  return true;
}

bool BufferReader::FindNumpy() {
  ndarray_type_ = LoadedModuleAttr("numpy", "ndarray");
  if (ndarray_type_ != nullptr && !PyType_Check(ndarray_type_)) {
    Py_DECREF(ndarray_type_);
    ndarray_type_ = nullptr;
  }
  return ndarray_type_ != nullptr;
}

}  // namespace trainrun::python
