"""trainrun: collectives for worker processes that `trainrun -np N python script.py` started.

    import trainrun
    trainrun.init()
    total = trainrun.allreduce(numpy.ones(4), op=trainrun.Sum)   # [size, size, size, size]
    trainrun.broadcast_(tensor, root_rank=0)                     # in place, from rank 0
    trainrun.shutdown()

Every collective takes NumPy arrays and PyTorch CPU tensors of the types supported_dtypes()
lists; contiguous buffers are read and written where they are (no copy), and the GIL is released
while a collective waits on the network. Out-of-place calls (allreduce, broadcast) return a new
array or tensor; the ones ending in `_` update their argument and return it.

Every rank must call the same collectives in the same order with the same shapes and dtypes. Before
each call the ranks compare a few numbers describing it (kind, dtype, shape), so a mismatch raises
InvalidArgumentError naming the ranks that differ, rather than corrupting data or hanging; set
TRAINRUN_CHECK_SHAPES=0 to skip that exchange when every microsecond counts.

Errors from the library come as trainrun.Error subclasses (IoError, TimeoutError,
InvalidArgumentError) carrying the library's message. For PyTorch training, see trainrun.torch.

To start a job from Python rather than from the shell, trainrun.run(fn, np=4) runs fn on every
rank of a new job and returns the ranks' return values (see trainrun/_launch.py); TrainRunner(np)
.run(fn) is HorovodRunner's spelling.
"""

import array as _array
import os as _os
import pickle as _pickle

from trainrun import _core
from trainrun import _buffers
from trainrun._launch import JobError, RemoteTraceback, TrainRunner, run

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async_", "broadcast", "broadcast_",
    "broadcast_async_", "allgather", "barrier", "synchronize", "poll", "broadcast_object",
    "allgather_object", "supported_dtypes", "ReduceOp", "Sum", "Average", "Min", "Max", "Product",
    "Error", "IoError", "TimeoutError", "InvalidArgumentError", "run", "TrainRunner", "JobError",
    "RemoteTraceback",
]

Error = _core.Error
IoError = _core.IoError
TimeoutError = _core.TimeoutError  # pylint: disable=redefined-builtin
InvalidArgumentError = _core.InvalidArgumentError

ReduceOp = _core.ReduceOp
Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

supported_dtypes = _buffers.supported_dtypes

init = _core.init
shutdown = _core.shutdown
is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size
barrier = _core.barrier


def _check_enabled():
    # TRAINRUN_CHECK_SHAPES (rendezvous/include/trainrun/rendezvous/environment.h).
    return _os.environ.get("TRAINRUN_CHECK_SHAPES", "1") not in ("0", "false", "no", "off")


# --- Agreement on what is being reduced --------------------------------------------------------
#
# Before a checked collective every rank contributes one fixed-size record, allgathered; each rank
# then sees everyone's record and raises the same error when they differ, so no rank goes on to a
# transfer whose sizes disagree (which would hang or corrupt). The record is an int64 array built
# with the standard `array` module so that this needs no NumPy.

_KIND_ALLREDUCE, _KIND_BROADCAST, _KIND_ALLGATHER = 1, 2, 3
_KIND_NAMES = {1: "allreduce", 2: "broadcast", 3: "allgather"}
_MAX_DIMS = 8
_RECORD = 4 + _MAX_DIMS  # kind, dtype, op or root, ndim, dims...
_INT64 = _core.dtypes()["int64"]
# Pickled objects travel as bytes.
_BYTE = _core.dtypes().get("uint8", _core.dtypes().get("int8"))


def _record(kind, buf, arg):
    dims = list(buf.shape[:_MAX_DIMS])
    if len(buf.shape) > _MAX_DIMS:  # Fold the tail, so any difference there still shows.
        tail = 1
        for d in buf.shape[_MAX_DIMS - 1:]:
            tail *= d
        dims[_MAX_DIMS - 1] = tail
    dims += [0] * (_MAX_DIMS - len(dims))
    return [kind, buf.dtype, int(arg), len(buf.shape)] + dims


def _describe(rec):
    """E.g. "allreduce of float32[4, 3]"."""
    dtype = {code: name for name, code in _core.dtypes().items()}.get(rec[1], f"dtype#{rec[1]}")
    dims = rec[4:4 + min(rec[3], _MAX_DIMS)]
    return f"{_KIND_NAMES.get(rec[0], 'collective')} of {dtype}{dims}"


def _exchange_records(rec):
    """Allgathers one record per rank; returns the list of every rank's record."""
    mine = _array.array("q", rec)
    everyone = _array.array("q", bytes(8 * _RECORD * size()))
    _core.allgather(mine.buffer_info()[0], everyone.buffer_info()[0], _RECORD, _INT64)
    return [list(everyone[r * _RECORD:(r + 1) * _RECORD]) for r in range(size())]


def _agree(kind, buf, arg, what, ignore_first_dim=False):
    """Raises InvalidArgumentError on every rank when the ranks' records for this call differ.

    Returns every rank's record (allgather uses the first dimensions).
    """
    rec = _record(kind, buf, arg)
    records = _exchange_records(rec)

    def key(r):
        return r[:4] + r[5:] if ignore_first_dim else r

    reference = key(records[0])
    differing = [i for i, r in enumerate(records) if key(r) != reference]
    if differing:
        parts = [f"rank {i} has {_describe(records[i])}" for i in [0] + differing[:3]]
        if kind == _KIND_BROADCAST and any(r[2] != records[0][2] for r in records):
            parts.append("(root_rank differs)")
        if kind == _KIND_ALLREDUCE and any(r[2] != records[0][2] for r in records):
            parts.append("(op differs)")
        rule = ("the same dtype and the same shape after the first dimension"
                if ignore_first_dim else "the same operation, dtype and shape")
        raise InvalidArgumentError(
            f"{what}: ranks disagree: {', '.join(parts)}; every rank must pass {rule}")
    return records


# --- Collectives -------------------------------------------------------------------------------


def _op(op):
    if op is None:
        return Average
    if not isinstance(op, ReduceOp):
        raise InvalidArgumentError(
            f"allreduce: op must be trainrun.Sum, Average, Min, Max or Product, got {op!r}")
    return op


def allreduce_(tensor, op=None, name=None):
    """Reduces `tensor` across ranks in place with `op` (default Average) and returns it.

    `name` is accepted for Horovod compatibility and only used in error messages.
    """
    what = f"allreduce_({name})" if name else "allreduce_"
    op = _op(op)
    buf = _buffers.view(tensor, what, writable=True)
    if _check_enabled():
        _agree(_KIND_ALLREDUCE, buf, int(op), what)
    _core.allreduce(buf.ptr, buf.count, buf.dtype, op)
    return tensor


def allreduce(tensor, op=None, name=None):
    """Returns a new array or tensor: `tensor` reduced across ranks with `op` (default Average)."""
    what = f"allreduce({name})" if name else "allreduce"
    buf = _buffers.view(tensor, what, writable=False)
    out = _buffers.copy_of(buf)
    return allreduce_(out, op=op, name=name)


def allreduce_async_(tensor, op=None, name=None):
    """Starts an in-place allreduce and returns a handle for synchronize() or poll().

    The tensor must stay alive and untouched until synchronize(handle) returns it. Unchecked: every
    rank must start the same sequence of async allreduces.
    """
    what = f"allreduce_async_({name})" if name else "allreduce_async_"
    op = _op(op)
    buf = _buffers.view(tensor, what, writable=True)
    handle = _core.allreduce_async(buf.ptr, buf.count, buf.dtype, op)
    _pending[handle] = tensor
    return handle


def broadcast_(tensor, root_rank=0, name=None):
    """Overwrites `tensor` on every rank with root_rank's, in place, and returns it."""
    what = f"broadcast_({name})" if name else "broadcast_"
    buf = _buffers.view(tensor, what, writable=True)
    _check_root(root_rank, what)
    if _check_enabled():
        _agree(_KIND_BROADCAST, buf, root_rank, what)
    _core.broadcast(buf.ptr, buf.count, buf.dtype, root_rank)
    return tensor


def broadcast(tensor, root_rank=0, name=None):
    """Returns a new array or tensor holding root_rank's `tensor`."""
    what = f"broadcast({name})" if name else "broadcast"
    buf = _buffers.view(tensor, what, writable=False)
    return broadcast_(_buffers.copy_of(buf), root_rank, name)


def broadcast_async_(tensor, root_rank=0, name=None):
    """Starts an in-place broadcast and returns a handle for synchronize(); unchecked."""
    what = f"broadcast_async_({name})" if name else "broadcast_async_"
    buf = _buffers.view(tensor, what, writable=True)
    _check_root(root_rank, what)
    handle = _core.broadcast_async(buf.ptr, buf.count, buf.dtype, root_rank)
    _pending[handle] = tensor
    return handle


def _check_root(root_rank, what):
    if not isinstance(root_rank, int) or not 0 <= root_rank < size():
        raise InvalidArgumentError(
            f"{what}: root_rank {root_rank!r} is not a rank of this job (0..{size() - 1})")


def allgather(tensor, name=None):
    """Returns every rank's `tensor` concatenated along the first dimension, in rank order.

    As in Horovod, the first dimension may differ between ranks; the rest of the shape and the
    dtype must agree. A 0-d input is treated as shape [1].
    """
    what = f"allgather({name})" if name else "allgather"
    buf = _buffers.view(tensor, what, writable=False)
    if len(buf.shape) == 0:
        tensor = tensor.reshape(1)
        buf = _buffers.view(tensor, what, writable=False)
    records = _agree(_KIND_ALLGATHER, buf, 0, what, ignore_first_dim=True)
    firsts = [r[4] for r in records]
    row = buf.count // buf.shape[0] if buf.shape[0] else _product(buf.shape[1:])
    rest = tuple(buf.shape[1:])
    if all(f == firsts[0] for f in firsts):
        out = _buffers.empty_like(buf, (firsts[0] * size(),) + rest)
        out_buf = _buffers.view(out, what, writable=True)
        _core.allgather(buf.ptr, out_buf.ptr, buf.count, buf.dtype)
        return out
    # Ragged: pad every rank's part to the longest, gather, then keep each rank's real rows.
    longest = max(firsts)
    padded = _buffers.empty_like(buf, (longest,) + rest)
    padded[:firsts[rank()]] = tensor
    padded_buf = _buffers.view(padded, what, writable=False)
    gathered = _buffers.empty_like(buf, (longest * size(),) + rest)
    gathered_buf = _buffers.view(gathered, what, writable=True)
    _core.allgather(padded_buf.ptr, gathered_buf.ptr, longest * row, buf.dtype)
    parts = [gathered[r * longest:r * longest + firsts[r]] for r in range(size())]
    if buf.is_torch:
        import torch

        return torch.cat(parts)
    import numpy

    return numpy.concatenate(parts)


def _product(dims):
    p = 1
    for d in dims:
        p *= d
    return p


# Tensors of async operations still in flight, kept alive until synchronize() hands them back.
_pending = {}


def poll(handle):
    """True when the async operation `handle` has finished (synchronize() then returns at once)."""
    return _core.poll(handle)


def synchronize(handle):
    """Waits for the async operation `handle` (GIL released) and returns its tensor.

    Raises the operation's error, if it failed.
    """
    try:
        _core.wait(handle)
    finally:
        tensor = _pending.pop(handle, None)
    return tensor


# --- Python objects ----------------------------------------------------------------------------


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` (any picklable object) on every rank."""
    what = f"broadcast_object({name})" if name else "broadcast_object"
    _check_root(root_rank, what)
    data = _pickle.dumps(obj) if rank() == root_rank else b""
    length = _array.array("q", [len(data)])
    _core.broadcast(length.buffer_info()[0], 1, _INT64, root_rank)
    payload = bytearray(data) if rank() == root_rank else bytearray(length[0])
    if length[0]:
        holder = _array.array("B", bytes(payload))
        _core.broadcast(holder.buffer_info()[0], length[0], _BYTE, root_rank)
        payload = holder.tobytes()
    return obj if rank() == root_rank else _pickle.loads(bytes(payload))


def allgather_object(obj, name=None):
    """Returns the list of every rank's `obj` (any picklable object), in rank order."""
    data = _pickle.dumps(obj)
    lengths = _array.array("q", bytes(8 * size()))
    mine = _array.array("q", [len(data)])
    _core.allgather(mine.buffer_info()[0], lengths.buffer_info()[0], 1, _INT64)
    longest = max(lengths)
    padded = _array.array("B", data + bytes(longest - len(data)))
    everyone = _array.array("B", bytes(longest * size()))
    if longest:
        _core.allgather(padded.buffer_info()[0], everyone.buffer_info()[0], longest, _BYTE)
    raw = everyone.tobytes()
    return [_pickle.loads(raw[r * longest:r * longest + lengths[r]]) for r in range(size())]
