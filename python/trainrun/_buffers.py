"""Views of arrays and tensors as (pointer, count, dtype, device, stream) for the C++ core.

The core (trainrun._core) takes raw addresses, so the bindings never copy a contiguous buffer
and never import torch in C++. This module is the one place that knows how to get those addresses
and what makes an input unacceptable (wrong dtype, not contiguous, read-only, on a device trainrun
cannot reach). It takes NumPy arrays, PyTorch tensors on the CPU or a CUDA GPU, and any GPU array
exposing the CUDA Array Interface (`__cuda_array_interface__`, version 2 or 3 with its `stream`)
or DLPack (`__dlpack__`/`__dlpack_device__`): CuPy, Numba and JAX arrays. For a GPU buffer the
stream is where its producers were ordered: the collective starts after them, and that stream's
later work comes after the collective (the core's GPU runtime, collectives/gpu/).
"""

import sys

from trainrun import _core

InvalidArgumentError = _core.InvalidArgumentError

# Names the core uses for its element types; a NumPy dtype's .name and str(torch.dtype) minus the
# "torch." prefix both map onto them.
_SUPPORTED = dict(_core.dtypes())


def supported_dtypes():
    """The element type names every collective accepts, e.g. ['float32', 'int64', ...]."""
    return sorted(_SUPPORTED)


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


is_torch = _is_torch_tensor


def torch_cpu_code(obj):
    """The dtype code of `obj` when it is a contiguous, dense CPU torch tensor of a supported
    dtype seen before (the common case, decided in a few attribute reads), else None: then view()
    decides, and says what is wrong."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    name = _torch_names.get(obj.dtype)
    if name is None or not obj.is_cpu or obj.is_sparse or not obj.is_contiguous():
        return None
    return _SUPPORTED[name]


def _numpy():
    import numpy

    return numpy


class Buffer:
    """A contiguous buffer: its address, element count, dtype code and shape, and where it is.

    `owner` is the array or tensor the address points into; holding it keeps the memory alive
    (with `keep`, e.g. a DLPack capsule). `device` is -1 for host memory, else the CUDA device's
    index, and `stream` the cudaStream_t value its work is ordered on (0: the legacy default
    stream). `is_torch`: owner is a torch.Tensor; `is_gpu_array`: a CUDA Array Interface or DLPack
    object (not torch).
    """

    __slots__ = ("owner", "ptr", "count", "dtype", "dtype_name", "shape", "is_torch", "device",
                 "stream", "is_gpu_array", "keep")

    def __init__(self, owner, ptr, count, dtype_name, shape, is_torch, device=-1, stream=0,
                 is_gpu_array=False, keep=None):
        self.owner = owner
        self.ptr = ptr
        self.count = count
        self.dtype_name = dtype_name
        self.dtype = _SUPPORTED[dtype_name]
        self.shape = tuple(shape)
        self.is_torch = is_torch
        self.device = device
        self.stream = stream
        self.is_gpu_array = is_gpu_array
        self.keep = keep


def _check_dtype(name, what):
    if name not in _SUPPORTED:
        raise InvalidArgumentError(
            f"{what}: element type {name} is not supported; use one of "
            f"{', '.join(supported_dtypes())}")


def view(obj, what, writable):
    """Returns a Buffer over `obj` (a torch.Tensor, a NumPy array, or anything NumPy can view).

    Raises InvalidArgumentError, naming the operation `what`, when obj is not contiguous, not on
    the CPU, of an unsupported type, or read-only while `writable` is asked for.
    """
    if _is_torch_tensor(obj):
        return _view_torch(obj, what)
    np = _numpy()
    if not isinstance(obj, np.ndarray) and hasattr(obj, "__cuda_array_interface__"):
        return _view_cuda_array(obj, what, writable)
    if not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack_device__"):
        device_type, _ = obj.__dlpack_device__()
        if device_type == _DL_CUDA:
            return _view_dlpack(obj, what)
    if not isinstance(obj, np.ndarray):
        if writable:
            raise InvalidArgumentError(
                f"{what}: in-place operations need a numpy.ndarray or torch.Tensor, "
                f"got {type(obj).__name__}")
        try:
            obj = np.asarray(obj)
        except Exception as e:  # NumPy says why; keep its reason.
            raise InvalidArgumentError(
                f"{what}: cannot read a {type(obj).__name__} as an array: {e}") from None
    return _view_numpy(obj, what, writable)


_torch_names = {}  # torch.dtype -> its name, for the supported ones seen so far


def _view_torch(t, what):
    # Every collective of every tensor comes here (200 small allreduce_async_ calls in a row are
    # common): the cheapest checks first, the dtype's name remembered.
    if not t.is_cpu:
        return _view_torch_cuda(t, what)
    if t.is_sparse:
        raise InvalidArgumentError(f"{what}: sparse tensors are not supported; pass a dense one")
    name = _torch_names.get(t.dtype)
    if name is None:
        name = str(t.dtype).replace("torch.", "")
        _check_dtype(name, what)
        _torch_names[t.dtype] = name
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{what}: tensor of shape {tuple(t.shape)} is not contiguous; "
            "pass tensor.contiguous() instead")
    return Buffer(t, t.data_ptr(), t.numel(), name, t.shape, True)


def _view_torch_cuda(t, what):
    if not t.is_cuda:
        raise InvalidArgumentError(
            f"{what}: tensor is on {t.device}; trainrun reduces CPU and CUDA tensors, so move it "
            "with .cpu() or .cuda() first")
    if t.is_sparse:
        raise InvalidArgumentError(f"{what}: sparse tensors are not supported; pass a dense one")
    name = _torch_names.get(t.dtype)
    if name is None:
        name = str(t.dtype).replace("torch.", "")
        _check_dtype(name, what)
        _torch_names[t.dtype] = name
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{what}: tensor of shape {tuple(t.shape)} is not contiguous; "
            "pass tensor.contiguous() instead")
    import torch

    stream = torch.cuda.current_stream(t.device).cuda_stream
    return Buffer(t, t.data_ptr(), t.numel(), name, t.shape, True, t.device.index, stream)


_DL_CUDA = 2  # DLPack's kDLCUDA
# CUDA Array Interface type strings of the supported types (no standard one for bfloat16).
_CAI_TYPES = {"f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16",
              "i4": "int32", "i8": "int64", "u1": "uint8", "b1": "bool"}


def _view_cuda_array(obj, what, writable):
    """A CUDA Array Interface object (version 2 or 3; v3's `stream` orders the collective)."""
    cai = obj.__cuda_array_interface__
    kind = type(obj).__name__
    typestr = cai.get("typestr", "")
    if typestr[:1] == ">":
        raise InvalidArgumentError(f"{what}: big-endian arrays are not supported")
    name = _CAI_TYPES.get(typestr[1:])
    if name is None:
        raise InvalidArgumentError(
            f"{what}: a {kind} of element type {typestr!r} is not supported; use one of "
            f"{', '.join(sorted(set(_CAI_TYPES.values())))}")
    _check_dtype(name, what)
    shape = tuple(int(d) for d in cai["shape"])
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None:
        itemsize = int(typestr[2:])
        expected = itemsize
        for d, st in zip(reversed(shape), reversed(strides)):
            if d != 1 and st != expected:
                raise InvalidArgumentError(
                    f"{what}: {kind} of shape {shape} is not C-contiguous; pass a contiguous "
                    "copy instead")
            expected *= d
    if cai.get("mask") is not None:
        raise InvalidArgumentError(f"{what}: masked {kind} arrays are not supported")
    ptr, read_only = cai["data"]
    if writable and read_only:
        raise InvalidArgumentError(f"{what}: the {kind} is read-only, so it cannot be updated in "
                                   "place")
    stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    # No stream: the producer says the data is ready; the legacy default stream orders the rest.
    stream = 0 if stream is None else int(stream)
    device = _core.gpu_device_of(ptr) if count else 0
    return Buffer(obj, ptr, count, name, shape, False, device, stream, True)


def _view_dlpack(obj, what):
    """A DLPack object on a CUDA device, asked for its data ordered on the legacy default stream
    (stream 1 in DLPack's terms), where the collective then starts."""
    kind = type(obj).__name__
    try:
        capsule = obj.__dlpack__(stream=1)
    except TypeError:
        capsule = obj.__dlpack__()
    ptr, device_type, device, name, shape, contiguous = _core.dlpack_view(capsule)
    if device_type != _DL_CUDA:
        raise InvalidArgumentError(f"{what}: a {kind} on DLPack device type {device_type} is "
                                   "neither on the CPU nor on a CUDA GPU")
    if not name:
        raise InvalidArgumentError(f"{what}: a {kind} of an element type trainrun does not "
                                   f"support; use one of {', '.join(supported_dtypes())}")
    if not contiguous:
        raise InvalidArgumentError(f"{what}: {kind} of shape {tuple(shape)} is not C-contiguous")
    count = 1
    for d in shape:
        count *= d
    return Buffer(obj, ptr, count, name, shape, False, device, 0, True, keep=capsule)


def _view_numpy(a, what, writable):
    name = a.dtype.name
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        raise InvalidArgumentError(f"{what}: big-endian arrays are not supported")
    _check_dtype(name, what)
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{what}: array of shape {a.shape} is not C-contiguous; "
            "pass numpy.ascontiguousarray(array) instead")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{what}: array is read-only, so it cannot be updated in place")
    return Buffer(a, a.__array_interface__["data"][0], a.size, name, a.shape, False)


def empty_like(buf, shape):
    """A new, contiguous array or tensor of buf's kind, dtype and device with the given shape."""
    if buf.is_torch:
        import torch

        return torch.empty(shape, dtype=buf.owner.dtype, device=buf.owner.device)
    if buf.is_gpu_array:
        return _gpu_array_module(buf).empty(shape, dtype=buf.owner.dtype)
    return _numpy().empty(shape, dtype=buf.owner.dtype)


def copy_of(buf):
    """A contiguous copy of buf's array or tensor, as the result of an out-of-place collective."""
    if buf.is_torch:
        return buf.owner.detach().clone(memory_format=_torch_contiguous())
    if buf.is_gpu_array:
        copy = getattr(buf.owner, "copy", None)
        if copy is None:
            raise InvalidArgumentError(f"a {type(buf.owner).__name__} has no copy(); use the "
                                       "in-place collective (allreduce_ ...) on it")
        return copy()
    return _numpy().array(buf.owner, order="C", copy=True)


def _gpu_array_module(buf):
    """The module that makes arrays of buf's kind on its device: CuPy's, JAX's (jax.numpy),
    Numba's (numba.cuda), or the one the array's type comes from when it has empty()."""
    module_name = type(buf.owner).__module__.split(".")[0]
    if module_name in ("jax", "jaxlib"):
        import jax.numpy

        return jax.numpy
    if module_name == "numba":
        import numba.cuda

        class _Numba:
            @staticmethod
            def empty(shape, dtype):
                return numba.cuda.device_array(shape, dtype=dtype)

        return _Numba
    module = sys.modules.get(type(buf.owner).__module__) or sys.modules.get(module_name)
    if module is None or not hasattr(module, "empty"):
        raise InvalidArgumentError(f"trainrun cannot make a new {type(buf.owner).__name__} for "
                                   "the result; use a torch tensor or a CuPy array")
    return module


def _torch_contiguous():
    import torch

    return torch.contiguous_format


def scale_(t, factor):
    """Multiplies t by factor in place: integers through float64, float16 through float32."""
    if factor == 1.0:
        return
    if _is_torch_tensor(t):
        import torch

        if t.dtype in (torch.float32, torch.float64):
            t.mul_(factor)
        elif t.dtype in (torch.float16, torch.bfloat16):
            t.copy_((t.float() * factor).to(t.dtype))
        else:
            t.copy_((t.double() * factor).to(t.dtype))
        return
    if not hasattr(t, "__array_interface__") and (hasattr(t, "__cuda_array_interface__")
                                                   or hasattr(t, "__dlpack_device__")):
        # A GPU array scales itself (CuPy's, on its current stream: the one its interface names).
        scaled = t
        try:
            scaled *= factor
        except TypeError:
            scaled = None
        if scaled is not t:
            raise InvalidArgumentError(
                f"prescale_factor and postscale_factor need a {type(t).__name__} that can be "
                "scaled in place (t *= factor); scale it yourself, or use a torch tensor")
        return
    import numpy

    if t.dtype.kind == "f" and t.dtype.itemsize >= 4:
        t *= t.dtype.type(factor)
    else:
        wide = numpy.float32 if t.dtype.kind == "f" else numpy.float64
        t[...] = (t.astype(wide) * factor).astype(t.dtype)
