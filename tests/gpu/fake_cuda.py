"""Tests only: arrays of the CPU fake's "device" memory, exposing __cuda_array_interface__ (v3),
so trainrun's dispatch of GPU arrays runs without a GPU (_fake_gpu, fake_gpu_module.cc).

    import fake_cuda
    fake_cuda.install()                      # trainrun's GPU runtime becomes the fake
    stream = fake_cuda.new_stream()
    x = fake_cuda.from_host(numpy.ones(4, numpy.float32), stream=stream, delay_ms=100)
    trainrun.allreduce_(x, op=trainrun.Sum)  # after the delayed "kernel" that wrote x
    x.to_host()                              # a "kernel" on the stream reads it back
"""

import ctypes

import numpy

import _fake_gpu

import trainrun


def install(devices=1):
    trainrun._core._use_gpu_runtime_for_tests(_fake_gpu.install(devices))  # pylint: disable=protected-access


def new_stream(device=0):
    return _fake_gpu.new_stream(device)


LEGACY_STREAM = 1  # the CUDA Array Interface's number for the legacy default stream


class FakeCudaArray:
    """`shape` elements of `dtype` in the fake's memory of `device`, ordered on `stream`."""

    def __init__(self, shape, dtype, device=0, stream=LEGACY_STREAM):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = numpy.dtype(dtype)
        self.device = device
        self.stream = stream
        self.size = int(numpy.prod(self.shape, dtype=numpy.int64)) if self.shape else 1
        self.nbytes = self.size * self.dtype.itemsize
        self.ptr = _fake_gpu.alloc(max(self.nbytes, 1), device)

    def __del__(self):
        if getattr(self, "ptr", None):
            _fake_gpu.free(self.ptr)
            self.ptr = 0

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": self.stream}

    def copy(self):
        """A copy on the same device and stream, made by a "kernel" in stream order."""
        out = FakeCudaArray(self.shape, self.dtype, self.device, self.stream)
        _fake_gpu.copy_later(self.stream, out.ptr, self.ptr, self.nbytes)
        return out

    def to_host(self):
        """A NumPy copy made by a "kernel" on the stream, after everything before it there (as
        tensor.cpu() on the current stream)."""
        host = numpy.empty(self.shape, self.dtype)
        _fake_gpu.copy_later(self.stream, host.ctypes.data, self.ptr, self.nbytes)
        _fake_gpu.synchronize(self.stream)
        return host

    def __imul__(self, factor):
        """In place, on the stream's turn (for prescale and postscale)."""
        _fake_gpu.synchronize(self.stream)
        view = numpy.ctypeslib.as_array((ctypes.c_char * self.nbytes).from_address(self.ptr))
        values = view.view(self.dtype)
        wide = numpy.float32 if self.dtype.kind == "f" else numpy.float64
        values[...] = (values.astype(wide) * factor).astype(self.dtype)
        return self


def empty(shape, dtype):
    """What trainrun calls (via the array type's module) for a result's buffer."""
    return FakeCudaArray(shape, dtype)


def from_host(array, device=0, stream=LEGACY_STREAM, delay_ms=0):
    """A fake device array holding `array`, written by a "kernel" on `stream` after `delay_ms`."""
    array = numpy.ascontiguousarray(array)
    out = FakeCudaArray(array.shape, array.dtype, device, stream)
    _fake_gpu.write_later(stream, out.ptr, array.tobytes(), delay_ms)
    return out
