"""trainrun: collectives for worker processes that `trainrun -np N python script.py` started.

    import trainrun
    trainrun.init()
    total = trainrun.allreduce(numpy.ones(4), op=trainrun.Sum)   # [size, size, size, size]
    trainrun.broadcast_(tensor, root_rank=0)                     # in place, from rank 0
    evens = trainrun.add_process_set([0, 2])                     # every rank calls it
    trainrun.shutdown()                                          # init() may follow

Every collective takes NumPy arrays and PyTorch CPU tensors of the types supported_dtypes()
lists; contiguous buffers are read and written where they are (no copy), and the GIL is released
while a collective waits on the network. Out-of-place calls (allreduce, broadcast, ...) return a
new array or tensor; the ones ending in `_` update their argument and return it. The `*_async`
forms return a handle for synchronize() and poll(); `grouped_*` run a list as one operation.

Every rank must call the same collectives in the same order. Before each one the ranks exchange a
small record of what they are about to do (collective, name, dtype, shape, op, root), so a rank
that disagrees makes every rank raise MismatchError (an InvalidArgumentError) for that call, and
the next call works; TRAINRUN_CHECK_SHAPES=0 skips the exchange when every microsecond counts.

Errors from the library come as trainrun.Error subclasses: InternalError (IoError, TimeoutError:
the job's communication failed) and InvalidArgumentError (MismatchError), carrying the library's
message. For PyTorch training, see trainrun.torch.

To start a job from Python rather than from the shell, trainrun.run(fn, np=4) runs fn on every
rank of a new job and returns the ranks' return values (see trainrun/_launch.py); TrainRunner(np)
.run(fn) is HorovodRunner's spelling.
"""

import array as _array
import pickle as _pickle
import sys as _sys

from trainrun import _core
from trainrun import _buffers
from trainrun._launch import JobError, RemoteTraceback, TrainRunner, run

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "allgather", "allgather_async",
    "reducescatter", "reducescatter_async", "alltoall", "alltoall_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "start_timeline", "stop_timeline", "synchronize", "poll", "broadcast_object",
    "allgather_object", "supported_dtypes", "gpu_info", "ProcessSet", "global_process_set",
    "add_process_set",
    "remove_process_set", "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Error",
    "InternalError", "IoError", "TimeoutError", "InvalidArgumentError", "MismatchError",
    "run", "TrainRunner", "JobError", "RemoteTraceback",
]

Error = _core.Error
InternalError = _core.InternalError
IoError = _core.IoError
TimeoutError = _core.TimeoutError  # pylint: disable=redefined-builtin
InvalidArgumentError = _core.InvalidArgumentError
MismatchError = _core.MismatchError

ReduceOp = _core.ReduceOp
Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

supported_dtypes = _buffers.supported_dtypes


def gpu_info():
    """What GPU support loaded in this process, and why not: a dict with `cuda` (CUDA's runtime
    loaded), `cuda_runtime`, `cuda_why_not`, `devices`, `nccl` (libnccl.so.2 loaded),
    `nccl_version`, `nccl_path`, `nccl_why_not`, and `path`/`path_why`: how the job's GPU
    collectives go ("nccl", "staged", or "undecided" before the first one)."""
    return _core.gpu_info()


# The Python nvidia-* wheels (nvidia/nccl/lib, ...) are looked for under every sys.path folder.
_core.add_gpu_search_dirs([p for p in _sys.path if isinstance(p, str) and p])

is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size

_INT64 = _core.dtypes()["int64"]
_BYTE = _core.dtypes()["uint8"]


# --- Process sets ------------------------------------------------------------------------------


class ProcessSet:
    """A subset of the job's ranks that runs collectives among themselves (Horovod's ProcessSet).

    Make it with add_process_set(ranks) on every rank; pass it as `process_set=` to a collective,
    which then runs only among its ranks, over the job's connections, numbered in ascending order.
    """

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def size(self):
        return size() if self.ranks is None else len(self.ranks)

    def rank(self):
        """This rank's index in the set (-1 when it is not a member)."""
        if self.ranks is None:
            return rank()
        return self.ranks.index(rank()) if rank() in self.ranks else -1

    def included(self):
        return self.ranks is None or rank() in self.ranks

    def __repr__(self):
        who = "all ranks" if self.ranks is None else f"ranks {self.ranks}"
        return f"ProcessSet(id={self.process_set_id}, {who})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0
_process_sets = {}  # id -> ProcessSet, besides the global one


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns it.

    Every rank of the job must call it, with the same ranks, in the same order as other ranks
    call add_process_set and remove_process_set.
    """
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None or not ps.ranks:
        raise InvalidArgumentError("add_process_set needs a non-empty list of ranks")
    if len(set(ps.ranks)) != len(ps.ranks) or not all(0 <= r < size() for r in ps.ranks):
        raise InvalidArgumentError(f"add_process_set: ranks {ps.ranks} must be distinct ranks "
                                   f"of this job (0..{size() - 1})")
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"{ps!r} is already registered")
    if any(other.ranks == ps.ranks for other in _process_sets.values()):
        raise InvalidArgumentError(f"a process set of ranks {ps.ranks} already exists")
    everyone = allgather_object(ps.ranks, name="add_process_set")
    if any(r != ps.ranks for r in everyone):
        differ = next(i for i, r in enumerate(everyone) if r != ps.ranks)
        raise InvalidArgumentError(f"add_process_set: rank {differ} asked for ranks "
                                   f"{everyone[differ]}, this rank for {ps.ranks}; every rank "
                                   "must add the same process sets in the same order")
    ps.process_set_id = _core.add_process_set(ps.ranks)
    _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters `process_set` (on every rank); returns True if it was registered."""
    pid = process_set.process_set_id
    if pid is None or pid not in _process_sets:
        return False
    _core.remove_process_set(pid)
    del _process_sets[pid]
    process_set.process_set_id = None
    return True


def _set_id(process_set, what):
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        raise InvalidArgumentError(f"{what}: process_set {process_set!r} is not registered; make "
                                   "it with add_process_set()")
    return process_set.process_set_id


def _set_size(set_id):
    return size() if set_id == 0 else _core.set_size(set_id)


def _set_rank(set_id):
    return rank() if set_id == 0 else _core.set_rank(set_id)


def init(comm=None, process_sets=None):
    """Joins the job (a no-op when already initialized; after shutdown() it takes part again).

    comm: as Horovod's, a list of ranks would make the job a subset; trainrun refuses it (make
    the subset with add_process_set instead). process_sets: ProcessSets to add once initialized.
    """
    if comm is not None:
        raise InvalidArgumentError("init(comm=...) is not supported: trainrun's job is every rank "
                                   "trainrun started; use add_process_set(ranks) for a subset")
    _core.init()
    for ps in process_sets or ():
        add_process_set(ps)


def shutdown():
    """Finishes pending operations and stops; process sets are forgotten; init() may follow."""
    _core.shutdown()
    for ps in _process_sets.values():
        ps.process_set_id = None
    _process_sets.clear()
    _ops.clear()
    _names_in_flight.clear()


# --- Handles -----------------------------------------------------------------------------------
#
# A handle stands for one Python-level operation: one or more operations of the core's thread
# plus a `finish` that makes the result (copying out, scaling, reshaping) once they are done.

_ops = {}  # the Python way's handles; the fast calls' live in _core (fast_calls.h)
# Names of async operations not yet synchronized: the name itself for the whole job (a str hashes
# once, and 200 allreduce_async_ calls in a row each add and remove one), (process set id, name)
# for a process set.
_names_in_flight = set()


class _Op:
    __slots__ = ("core", "finish", "keep", "name")

    def __init__(self, core, finish, keep, name):
        self.core = core
        self.finish = finish
        self.keep = keep  # buffers the core reads or writes: kept alive until done
        self.name = name


def _claim_name(set_id, name, what):
    if not name:
        return None
    key = name if set_id == 0 else (set_id, name)
    if key in _names_in_flight:
        raise InvalidArgumentError(f"{what}: an operation named {name!r} is already in flight; "
                                   "synchronize it first or use another name")
    _names_in_flight.add(key)
    return key


def _register(core, finish, keep, name_key=None):
    h = _core.new_handle()
    _ops[h] = _Op(list(core), finish, keep, name_key)
    return h


def _poll_py(handle):
    """poll() of a handle the Python way made (poll itself is _core.fast_poll)."""
    op = _ops.get(handle)
    if op is None:
        raise InvalidArgumentError(f"handle {handle!r} is not a pending operation")
    return all(_core.poll(h) for h in op.core)


def _synchronize_py(handle):
    """synchronize() of a handle the Python way made (synchronize itself is
    _core.fast_synchronize, which takes every handle and passes these on)."""
    op = _ops.pop(handle, None)
    if op is None:
        raise InvalidArgumentError(f"handle {handle!r} is not a pending operation (already "
                                   "synchronized, or never started)")
    if op.name is not None:
        _names_in_flight.discard(op.name)
    if len(op.core) == 1:  # the common case, without the loop's bookkeeping
        _core.wait(op.core[0])
        return op.finish()
    error = None
    for h in op.core:
        try:
            _core.wait(h)
        except Error as e:  # Wait for all, then raise the first.
            error = error or e
    if error is not None:
        raise error
    return op.finish()


def _what(fn, name):
    return f"{fn}({name})" if name else fn


def _shape(buf):
    return [int(d) for d in buf.shape]


def _check_op(op, what):
    if op is None:
        return Average
    if not isinstance(op, ReduceOp):
        if getattr(op, "__name__", "") == "Adasum" or str(op).endswith("Adasum"):
            raise InvalidArgumentError(
                f"{what}: op=Adasum is not supported by trainrun (it was not built with "
                "Adasum); use Average or Sum")
        raise InvalidArgumentError(
            f"{what}: op must be trainrun.Sum, Average, Min, Max or Product, got {op!r}")
    return op


def _scale_(t, factor):
    """Multiplies t by factor in place: integers through float64, float16 through float32."""
    if factor == 1.0:
        return
    if _buffers.is_torch(t):
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


# --- allreduce ---------------------------------------------------------------------------------


def _allreduce_async_py(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """allreduce_async_ the Python way: every call _core.fast_allreduce_async_ (which is
    trainrun.allreduce_async_, documented there) does not handle itself, and every error."""
    return _allreduce_start(tensor, op, name, process_set, prescale_factor, postscale_factor,
                            False)


def _allreduce_start(tensor, op, name, process_set, prescale_factor, postscale_factor, awaited):
    """allreduce_async_; `awaited`: the caller synchronizes next, so nothing is held back."""
    # The common case (a CPU tensor, an op, the whole job, no scaling) in as few steps as
    # possible: 200 small allreduces in a row spend more time here than in the fused allreduce.
    # Anything else, and every error, goes the general way below.
    if (process_set is None and type(op) is ReduceOp and prescale_factor == 1.0
            and postscale_factor == 1.0):
        code = _buffers.torch_cpu_code(tensor)
        key = name or None
        if code is not None and key not in _names_in_flight:
            if key is not None:
                _names_in_flight.add(key)
            ptr = tensor.data_ptr()
            try:
                h = _core.allreduce_async(ptr, ptr, tensor.numel(), code, op, 0, name or "",
                                          tensor.shape, awaited)
            except Exception:
                _names_in_flight.discard(key)
                raise
            handle = _core.new_handle()
            _ops[handle] = _Op([h], lambda: tensor, tensor, key)
            return handle
    what = _what("allreduce", name)
    op = _check_op(op, what)
    set_id = _set_id(process_set, what)
    buf = _buffers.view(tensor, what, writable=True)
    key = _claim_name(set_id, name, what)
    if prescale_factor != 1.0:
        _scale_(tensor, prescale_factor)
    try:
        # In place: the core may fuse it with the allreduces queued next to it (tensor fusion).
        h = _core.allreduce_async(buf.ptr, buf.ptr, buf.count, buf.dtype, op, set_id, name or "",
                                  buf.shape, awaited, buf.device, buf.stream)
    except Exception:
        _names_in_flight.discard(key)
        raise

    if postscale_factor == 1.0:
        def finish():
            return tensor
    else:
        def finish():
            _scale_(tensor, postscale_factor)
            return tensor

    handle = _core.new_handle()
    _ops[handle] = _Op([h], finish, tensor, key)
    return handle


def allreduce_async(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """As allreduce_async_, into a new array or tensor (the input is left as it is)."""
    buf = _buffers.view(tensor, _what("allreduce", name), writable=False)
    return allreduce_async_(_buffers.copy_of(buf), op, name, process_set, prescale_factor,
                            postscale_factor)


def allreduce_(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """Reduces `tensor` across ranks in place with `op` (default Average) and returns it."""
    return synchronize(_allreduce_start(tensor, op, name, process_set, prescale_factor,
                                        postscale_factor, True))


def allreduce(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """Returns a new array or tensor: `tensor` reduced across ranks with `op` (default Average)."""
    buf = _buffers.view(tensor, _what("allreduce", name), writable=False)
    return synchronize(_allreduce_start(_buffers.copy_of(buf), op, name, process_set,
                                        prescale_factor, postscale_factor, True))


def _group(kind, tensors, what):
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError(f"{what}: the list of tensors is empty")
    return tensors


def grouped_allreduce_async_(tensors, op=None, name=None, process_set=None, prescale_factor=1.0,
                             postscale_factor=1.0):
    """Starts one fused allreduce of every tensor in the list, in place; synchronize() returns
    the list. Tensors of one dtype make one collective, which reduces them where they are (over
    shared memory chunk by chunk, without first copying them into one buffer)."""
    if process_set is None and prescale_factor == 1.0 and postscale_factor == 1.0:
        # The common case, every tensor read in one pass in C++ (fast_calls.h); None: any
        # other case, and every error, goes the way below.
        h = _core.grouped_allreduce_fast(tensors, op, name)
        if h is not None:
            return h
    what = _what("grouped_allreduce", name)
    tensors = _group("allreduce", tensors, what)
    op = _check_op(op, what)
    set_id = _set_id(process_set, what)
    bufs = [_buffers.view(t, what, writable=True) for t in tensors]
    key = _claim_name(set_id, name, what)
    for t in tensors:
        _scale_(t, prescale_factor)
    core = []
    by_dtype = {}
    for i, b in enumerate(bufs):
        by_dtype.setdefault(b.dtype_name, []).append(i)
    try:
        for dtype_name, members in by_dtype.items():
            shape = [len(members)] + [bufs[i].count for i in members]
            first = bufs[members[0]]
            core.append(_core.grouped_allreduce_async(
                [bufs[i].ptr for i in members], [bufs[i].count for i in members],
                first.dtype, op, set_id, (name or "") + f"#{dtype_name}", shape, first.device,
                first.stream))
    except Exception:
        for h in core:  # what was queued runs; wait for it before raising
            try:
                _core.wait(h)
            except Error:
                pass
        _names_in_flight.discard(key)
        raise

    def finish():
        for t in tensors:
            _scale_(t, postscale_factor)
        return tensors

    return _register(core, finish, tensors, key)


# The per-tensor calls, in C++ for the common case (python/src/fast_calls.h); every other call goes
# to the Python implementations above.
_core.bind(_names_in_flight, _allreduce_async_py, _synchronize_py, _poll_py)
allreduce_async_ = _core.fast_allreduce_async_
synchronize = _core.fast_synchronize
poll = _core.fast_poll


def grouped_allreduce_async(tensors, op=None, name=None, process_set=None, prescale_factor=1.0,
                            postscale_factor=1.0):
    what = _what("grouped_allreduce", name)
    copies = [_buffers.copy_of(_buffers.view(t, what, writable=False)) for t in tensors]
    return grouped_allreduce_async_(copies, op, name, process_set, prescale_factor,
                                    postscale_factor)


def grouped_allreduce_(tensors, op=None, name=None, process_set=None, prescale_factor=1.0,
                       postscale_factor=1.0):
    return synchronize(grouped_allreduce_async_(tensors, op, name, process_set, prescale_factor,
                                                postscale_factor))


def grouped_allreduce(tensors, op=None, name=None, process_set=None, prescale_factor=1.0,
                      postscale_factor=1.0):
    return synchronize(grouped_allreduce_async(tensors, op, name, process_set, prescale_factor,
                                               postscale_factor))


# --- broadcast ---------------------------------------------------------------------------------


def _check_root(root_rank, set_id, what):
    """Returns the root's index in the process set; root_rank is a rank of the job, as Horovod's."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise InvalidArgumentError(f"{what}: root_rank must be an int, got {root_rank!r}")
    if set_id == 0:
        if not 0 <= root_rank < size():
            raise InvalidArgumentError(
                f"{what}: root_rank {root_rank} is not a rank of this job (0..{size() - 1})")
        return root_rank
    ranks = _process_sets[set_id].ranks
    if root_rank not in ranks:
        raise InvalidArgumentError(
            f"{what}: root_rank {root_rank} is not in the process set (ranks {ranks})")
    return ranks.index(root_rank)


def broadcast_async_(tensor, root_rank=0, name=None, process_set=None):
    """Starts overwriting `tensor` with root_rank's, in place; synchronize() returns it."""
    what = _what("broadcast", name)
    set_id = _set_id(process_set, what)
    buf = _buffers.view(tensor, what, writable=True)
    root = _check_root(root_rank, set_id, what)
    key = _claim_name(set_id, name, what)
    try:
        h = _core.broadcast_async(buf.ptr, buf.count, buf.dtype, root, set_id, name or "",
                                  _shape(buf), buf.device, buf.stream)
    except Exception:
        _names_in_flight.discard(key)
        raise
    return _register([h], lambda: tensor, tensor, key)


def broadcast_async(tensor, root_rank=0, name=None, process_set=None):
    buf = _buffers.view(tensor, _what("broadcast", name), writable=False)
    return broadcast_async_(_buffers.copy_of(buf), root_rank, name, process_set)


def broadcast_(tensor, root_rank=0, name=None, process_set=None):
    """Overwrites `tensor` on every rank with root_rank's, in place, and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank=0, name=None, process_set=None):
    """Returns a new array or tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# --- allgather ---------------------------------------------------------------------------------


def _exchange_firsts(firsts, set_id, name, what):
    """Allgathers each rank's list of first dimensions; returns them as a list per rank."""
    n = _set_size(set_id)
    mine = _array.array("q", firsts)
    everyone = _array.array("q", bytes(8 * len(firsts) * n))
    h = _core.allgatherv_async(mine.buffer_info()[0], everyone.buffer_info()[0],
                               [len(firsts)] * n, _INT64, set_id, (name or "") + " (sizes)",
                               [len(firsts)])
    _core.wait(h)
    k = len(firsts)
    return [list(everyone[r * k:(r + 1) * k]) for r in range(n)]


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Starts gathering every tensor of the list from every rank, concatenated along the first
    dimension in rank order (which may differ between ranks; the rest of the shape and the dtype
    must agree); synchronize() returns the list of results."""
    what = _what("allgather", name)
    tensors = _group("allgather", tensors, what)
    set_id = _set_id(process_set, what)
    tensors = [t.reshape(1) if len(getattr(t, "shape", (1,))) == 0 else t for t in tensors]
    bufs = [_buffers.view(t, what, writable=False) for t in tensors]
    firsts = _exchange_firsts([b.shape[0] for b in bufs], set_id, name, what)
    n = _set_size(set_id)
    core, outs = [], []
    for i, b in enumerate(bufs):
        rest = tuple(b.shape[1:])
        row = _product(rest)
        rows = [firsts[r][i] for r in range(n)]
        out = _buffers.empty_like(b, (sum(rows),) + rest)
        ob = _buffers.view(out, what, writable=True)
        core.append(_core.allgatherv_async(b.ptr, ob.ptr, [f * row for f in rows], b.dtype,
                                           set_id, name or "", _shape(b), b.device, b.stream))
        outs.append(out)
    key = _claim_name(set_id, name, what)
    return _register(core, lambda: outs, (tensors, outs), key)


def allgather_async(tensor, name=None, process_set=None):
    h = grouped_allgather_async([tensor], name, process_set)
    op = _ops[h]
    finish = op.finish
    op.finish = lambda: finish()[0]
    return h


def grouped_allgather(tensors, name=None, process_set=None):
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def allgather(tensor, name=None, process_set=None):
    """Returns every rank's `tensor` concatenated along the first dimension, in rank order.

    As in Horovod, the first dimension may differ between ranks; the rest of the shape and the
    dtype must agree. A 0-d input is treated as shape [1].
    """
    return synchronize(allgather_async(tensor, name, process_set))


def _product(dims):
    p = 1
    for d in dims:
        p *= d
    return p


# --- reducescatter -----------------------------------------------------------------------------


def _scatter_rows(rows, n):
    """Rows of each rank's part: as even as possible, the first ranks taking one more."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def grouped_reducescatter_async(tensors, op=None, name=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing each tensor across ranks with `op` (default Average) and keeping this
    rank's part of its first dimension (the first rows % size ranks get one row more);
    synchronize() returns the list of parts."""
    what = _what("reducescatter", name)
    tensors = _group("reducescatter", tensors, what)
    op = _check_op(op, what)
    set_id = _set_id(process_set, what)
    bufs = [_buffers.view(t, what, writable=False) for t in tensors]
    for b in bufs:
        if len(b.shape) == 0:
            raise InvalidArgumentError(f"{what}: a scalar cannot be scattered; pass a tensor with "
                                       "a first dimension")
    n, me = _set_size(set_id), _set_rank(set_id)
    key = _claim_name(set_id, name, what)
    core, results = [], []
    for b in bufs:
        work = _buffers.copy_of(b)
        _scale_(work, prescale_factor)
        wb = _buffers.view(work, what, writable=True)
        rest = tuple(b.shape[1:])
        row = _product(rest)
        parts = _scatter_rows(b.shape[0], n)
        begin = sum(parts[:me])
        if all(p == parts[0] for p in parts):
            out = _buffers.empty_like(b, (parts[me],) + rest)
            ob = _buffers.view(out, what, writable=True)
            core.append(_core.reducescatter_async(wb.ptr, ob.ptr, parts[me] * row, wb.dtype, op,
                                                  set_id, name or "", _shape(b), wb.device,
                                                  wb.stream))
            results.append((out, None, work))
        else:  # Uneven parts: reduce everything, keep ours.
            core.append(_core.allreduce_async(wb.ptr, wb.ptr, wb.count, wb.dtype, op, set_id,
                                              name or "", _shape(b), False, wb.device,
                                              wb.stream))
            results.append((work, (begin, parts[me]), work))

    def finish():
        outs = []
        for out, sl, _ in results:
            if sl is not None:
                out = _buffers.copy_of(_buffers.view(out[sl[0]:sl[0] + sl[1]], what, False))
            _scale_(out, postscale_factor)
            outs.append(out)
        return outs

    return _register(core, finish, (bufs, results), key)


def reducescatter_async(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    h = grouped_reducescatter_async([tensor], op, name, process_set, prescale_factor,
                                    postscale_factor)
    op_ = _ops[h]
    finish = op_.finish
    op_.finish = lambda: finish()[0]
    return h


def grouped_reducescatter(tensors, op=None, name=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    return synchronize(grouped_reducescatter_async(tensors, op, name, process_set,
                                                   prescale_factor, postscale_factor))


def reducescatter(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Returns this rank's part of `tensor` reduced across ranks (see grouped_reducescatter)."""
    return synchronize(reducescatter_async(tensor, op, name, process_set, prescale_factor,
                                           postscale_factor))


# --- alltoall ----------------------------------------------------------------------------------


def _splits_list(splits, rows, n, what):
    if splits is None:
        if rows % n:
            raise InvalidArgumentError(f"{what}: the first dimension ({rows}) is not divisible by "
                                       f"the number of ranks ({n}); pass splits")
        return [rows // n] * n
    if _buffers.is_torch(splits):
        import torch

        if splits.dtype not in (torch.int32, torch.int64):
            raise InvalidArgumentError(f"{what}: splits must hold 32- or 64-bit integers, got "
                                       f"{splits.dtype}")
        splits = splits.tolist()
    elif hasattr(splits, "dtype"):
        if splits.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{what}: splits must hold integers, got {splits.dtype}")
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits):
        raise InvalidArgumentError(f"{what}: splits must have one non-negative entry per rank "
                                   f"({n}), got {splits}")
    if sum(splits) > rows:
        raise InvalidArgumentError(f"{what}: splits add up to {sum(splits)}, more than the first "
                                   f"dimension ({rows})")
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts sending splits[r] rows of `tensor` (in order) to rank r and receiving each rank's
    rows for this one; synchronize() returns (received tensor, received splits). Without splits
    the first dimension is divided evenly."""
    what = _what("alltoall", name)
    set_id = _set_id(process_set, what)
    buf = _buffers.view(tensor, what, writable=False)
    if len(buf.shape) == 0:
        raise InvalidArgumentError(f"{what}: a scalar cannot be split; pass a tensor with a "
                                   "first dimension")
    n = _set_size(set_id)
    sends = _splits_list(splits, buf.shape[0], n, what)
    rest = tuple(buf.shape[1:])
    row = _product(rest)
    mine = _array.array("q", sends)
    theirs = _array.array("q", bytes(8 * n))
    h = _core.alltoallv_async(mine.buffer_info()[0], [1] * n, theirs.buffer_info()[0], [1] * n,
                              _INT64, set_id, (name or "") + " (splits)", [n])
    _core.wait(h)
    recvs = list(theirs)
    out = _buffers.empty_like(buf, (sum(recvs),) + rest)
    ob = _buffers.view(out, what, writable=True)
    key = _claim_name(set_id, name, what)
    h = _core.alltoallv_async(buf.ptr, [s * row for s in sends], ob.ptr, [r * row for r in recvs],
                              buf.dtype, set_id, name or "", _shape(buf), buf.device, buf.stream)

    def finish():
        if buf.is_torch:
            import torch

            return out, torch.tensor(recvs, dtype=torch.int32)
        import numpy

        return out, numpy.array(recvs, dtype=numpy.int32)

    return _register([h], finish, (tensor, out), key)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Returns (received tensor, received splits); see alltoall_async."""
    return synchronize(alltoall_async(tensor, splits, name, process_set))


# --- barrier -----------------------------------------------------------------------------------


def start_timeline(file_path):
    """Writes a Chrome trace of every later collective to file_path (every rank calls it; all
    write into the one file, one track per rank). TRAINRUN_TIMELINE starts one at init()."""
    _core.start_timeline(str(file_path))


def stop_timeline():
    """Stops the timeline."""
    _core.stop_timeline()


def join():
    """Says this rank has no more data (Horovod's join()): until every rank has joined, it takes
    part in the other ranks' allreduces with zeros (an average still divides by size()) and in
    their barriers; other collectives called meanwhile raise MismatchError on the ranks that called
    them. Returns the last rank to join, the same on every rank."""
    return _core.join()


def barrier(process_set=None):
    """Returns once every rank of the process set (default: the job) has called barrier()."""
    set_id = _set_id(process_set, "barrier")
    _core.wait(_core.barrier_async(set_id))


# --- Python objects ----------------------------------------------------------------------------


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's `obj` (any picklable object) on every rank."""
    what = _what("broadcast_object", name)
    set_id = _set_id(process_set, what)
    root = _check_root(root_rank, set_id, what)
    is_root = rank() == root_rank
    data = _pickle.dumps(obj) if is_root else b""
    length = _array.array("q", [len(data)])
    _core.wait(_core.broadcast_async(length.buffer_info()[0], 1, _INT64, root, set_id,
                                     (name or "") + " (length)", None))
    holder = _array.array("B", data if is_root else bytes(length[0]))
    if length[0]:
        _core.wait(_core.broadcast_async(holder.buffer_info()[0], length[0], _BYTE, root,
                                         set_id, name or "", None))
    return obj if is_root else _pickle.loads(holder.tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's `obj` (any picklable object), in rank order."""
    what = _what("allgather_object", name)
    set_id = _set_id(process_set, what)
    data = _pickle.dumps(obj)
    lengths = _exchange_firsts([len(data)], set_id, name, what)
    counts = [l[0] for l in lengths]
    mine = _array.array("B", data)
    everyone = _array.array("B", bytes(sum(counts)))
    if sum(counts):
        _core.wait(_core.allgatherv_async(mine.buffer_info()[0] if data else 0,
                                          everyone.buffer_info()[0], counts, _BYTE, set_id,
                                          name or "", None))
    raw = everyone.tobytes()
    out, offset = [], 0
    for c in counts:
        out.append(_pickle.loads(raw[offset:offset + c]))
        offset += c
    return out
