"""Views of NumPy arrays and PyTorch tensors as (pointer, count, dtype) for the C++ core.

The core (trainrun._core) takes raw addresses, so the bindings never copy a contiguous buffer
and never import torch in C++. This module is the one place that knows how to get those addresses
and what makes an input unacceptable (wrong dtype, not contiguous, not on the CPU, read-only).
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
    """A contiguous CPU buffer: its address, element count, dtype code and shape.

    `owner` is the array or tensor the address points into; holding it keeps the memory alive.
    """

    __slots__ = ("owner", "ptr", "count", "dtype", "dtype_name", "shape", "is_torch")

    def __init__(self, owner, ptr, count, dtype_name, shape, is_torch):
        self.owner = owner
        self.ptr = ptr
        self.count = count
        self.dtype_name = dtype_name
        self.dtype = _SUPPORTED[dtype_name]
        self.shape = tuple(shape)
        self.is_torch = is_torch


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
        raise InvalidArgumentError(
            f"{what}: tensor is on {t.device}; the Python bindings reduce CPU tensors only, "
            "so move it with .cpu() first")
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
    """A new, contiguous array or tensor of buf's kind and dtype with the given shape."""
    if buf.is_torch:
        import torch

        return torch.empty(shape, dtype=buf.owner.dtype)
    return _numpy().empty(shape, dtype=buf.owner.dtype)


def copy_of(buf):
    """A contiguous copy of buf's array or tensor, as the result of an out-of-place collective."""
    if buf.is_torch:
        return buf.owner.detach().clone(memory_format=_torch_contiguous())
    return _numpy().array(buf.owner, order="C", copy=True)


def _torch_contiguous():
    import torch

    return torch.contiguous_format
