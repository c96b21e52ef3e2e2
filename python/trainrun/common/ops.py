"""The collectives on arrays and tensors (Horovod's mpi_ops): allreduce, broadcast, allgather,
reducescatter and alltoall, each plain, in place (ending in `_`), async (`*_async`, returning a
handle for synchronize() and poll()) and grouped (a list as one operation); barrier, join and the
timeline. Inputs are viewed where they are (_buffers.py) and queued on the core's thread.

The common allreduce (a CPU tensor, a ReduceOp, the whole job, no scaling) goes through C++
(python/src/fast_calls.h): allreduce_async_, synchronize and poll are the core's fast calls, which
hand every other case, and every error, to the Python implementations here.
"""

import array as _array

from trainrun import _buffers
from trainrun import _core
from trainrun.common.arguments import (_check_op, _grouped_first_name, _refuse, _scaling,
                                       _scatter_kind, _scatter_rows, _splits_list, _view_refused)
from trainrun.common.exceptions import Error, InvalidArgumentError
from trainrun.common.exchange import INT64, exchange_firsts
from trainrun.common.handles import (_Op, _claim_name, _names_in_flight, _ops, _part,
                                     _poll_py, _register, _synchronize_py)
from trainrun.common.process_sets import _check_root, _set_id, _set_rank, _set_size

ReduceOp = _core.ReduceOp
Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product
Adasum = ReduceOp.Adasum


def _what(fn, name):
    return f"{fn}({name})" if name else fn


def _shape(buf):
    return [int(d) for d in buf.shape]


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
    set_id = _set_id(process_set, what)
    try:
        op = _check_op(op, what)
        buf = _buffers.view(tensor, what, writable=True)
    except InvalidArgumentError as e:
        _refuse(e, set_id, "allreduce", name)
        raise
    key = _claim_name(set_id, name, what)
    pre, post, prescale_factor, postscale_factor = _scaling(buf.is_gpu_array, prescale_factor,
                                                            postscale_factor)
    if prescale_factor != 1.0:
        _buffers.scale_(tensor, prescale_factor)
    try:
        # In place: the core may fuse it with the allreduces queued next to it (tensor fusion).
        h = _core.allreduce_async(buf.ptr, buf.ptr, buf.count, buf.dtype, op, set_id, name or "",
                                  buf.shape, awaited, buf.device, buf.stream, pre, post)
    except Exception:
        _names_in_flight.discard(key)
        raise

    if postscale_factor == 1.0:
        def finish():
            return tensor
    else:
        def finish():
            _buffers.scale_(tensor, postscale_factor)
            return tensor

    handle = _core.new_handle()
    _ops[handle] = _Op([h], finish, tensor, key)
    return handle


def allreduce_async(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """As allreduce_async_, into a new array or tensor (the input is left as it is)."""
    buf = _view_refused(tensor, _what("allreduce", name), False, process_set, "allreduce", name)
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
    buf = _view_refused(tensor, _what("allreduce", name), False, process_set, "allreduce", name)
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
    set_id = _set_id(process_set, what)
    try:
        op = _check_op(op, what)
        bufs = [_buffers.view(t, what, writable=True) for t in tensors]
    except InvalidArgumentError as e:
        _refuse(e, set_id, "allreduce", _grouped_first_name(tensors, name, what), name or None)
        raise
    key = _claim_name(set_id, name, what)
    # By the core where every buffer is a GPU array it scales (the group: one PreMulSum op).
    pre, post, prescale_factor, postscale_factor = _scaling(
        all(b.is_gpu_array for b in bufs), prescale_factor, postscale_factor)
    for t in tensors:
        _buffers.scale_(t, prescale_factor)
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
                first.dtype, op, set_id, f"{name}#{dtype_name}" if name else "", shape,
                first.device, first.stream, (name or "") if not core else None, pre, post))
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
            _buffers.scale_(t, postscale_factor)
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
    tensors = _group("allreduce", tensors, what)
    first = _grouped_first_name(tensors, name, what)  # once, not once per tensor
    copies = [_buffers.copy_of(_view_refused(t, what, False, process_set, "allreduce", first,
                                             name or None)) for t in tensors]
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


def broadcast_async_(tensor, root_rank=0, name=None, process_set=None):
    """Starts overwriting `tensor` with root_rank's, in place; synchronize() returns it."""
    what = _what("broadcast", name)
    set_id = _set_id(process_set, what)
    try:
        buf = _buffers.view(tensor, what, writable=True)
        root = _check_root(root_rank, set_id, what)
    except InvalidArgumentError as e:
        _refuse(e, set_id, "broadcast", name)
        raise
    key = _claim_name(set_id, name, what)
    try:
        h = _core.broadcast_async(buf.ptr, buf.count, buf.dtype, root, set_id, name or "",
                                  _shape(buf), buf.device, buf.stream)
    except Exception:
        _names_in_flight.discard(key)
        raise
    return _register([h], lambda: tensor, tensor, key)


def broadcast_async(tensor, root_rank=0, name=None, process_set=None):
    buf = _view_refused(tensor, _what("broadcast", name), False, process_set, "broadcast", name)
    return broadcast_async_(_buffers.copy_of(buf), root_rank, name, process_set)


def broadcast_(tensor, root_rank=0, name=None, process_set=None):
    """Overwrites `tensor` on every rank with root_rank's, in place, and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank=0, name=None, process_set=None):
    """Returns a new array or tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# --- allgather ---------------------------------------------------------------------------------


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Starts gathering each tensor from every rank, concatenated along the first dimension in
    rank order (which may differ between ranks; the rest of the shape and the dtype must agree);
    synchronize() returns the list. Host tensors make one queued operation, matched by name."""
    what = _what("allgather", name)
    tensors = _group("allgather", tensors, what)
    set_id = _set_id(process_set, what)
    tensors = [t.reshape(1) if len(getattr(t, "shape", (1,))) == 0 else t for t in tensors]
    try:
        bufs = [_buffers.view(t, what, writable=False) for t in tensors]
    except InvalidArgumentError as e:
        _refuse(e, set_id, "allgather", name)
        raise
    if all(b.device < 0 for b in bufs):
        h, gathered = _core.grouped_allgather_async(
            [b.ptr for b in bufs], [b.shape[0] for b in bufs],
            [_product(b.shape[1:]) for b in bufs], [b.dtype for b in bufs], set_id, name or "",
            [_shape(b) for b in bufs])

        def finish():
            outs = [_buffers.empty_like(b, (sum(gathered.rows(i)),) + tuple(b.shape[1:]))
                    for i, b in enumerate(bufs)]
            for i, out in enumerate(outs):
                gathered.copy_to(i, _buffers.view(out, what, writable=True).ptr)
            return outs

        return _register([h], finish, (tensors, bufs, gathered))
    # Device buffers: the first dimensions first, then one gather per tensor into its result.
    firsts = exchange_firsts([b.shape[0] for b in bufs], set_id, name)
    n = _set_size(set_id)
    core, outs = [], []
    for i, b in enumerate(bufs):
        rows = [firsts[r][i] for r in range(n)]
        outs.append(_buffers.empty_like(b, (sum(rows),) + tuple(b.shape[1:])))
        core.append(_core.allgatherv_async(
            b.ptr, _buffers.view(outs[-1], what, writable=True).ptr,
            [f * _product(b.shape[1:]) for f in rows], b.dtype, set_id,
            _part(name, i, len(bufs)), _shape(b), b.device, b.stream))
    return _register(core, lambda: outs, (tensors, outs))


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


def grouped_reducescatter_async(tensors, op=None, name=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing each tensor across ranks with `op` (default Average) and keeping this
    rank's part of its first dimension (the first rows % size ranks get one row more);
    synchronize() returns the list of parts."""
    what = _what("reducescatter", name)
    tensors = _group("reducescatter", tensors, what)
    set_id = _set_id(process_set, what)
    try:
        op = _check_op(op, what)
        bufs = [_buffers.view(t, what, writable=False) for t in tensors]
        for b in bufs:
            if len(b.shape) == 0:
                raise InvalidArgumentError(f"{what}: a scalar cannot be scattered; pass a tensor "
                                           "with a first dimension")
    except InvalidArgumentError as e:
        _refuse(e, set_id, _scatter_kind(tensors[0], _set_size(set_id), what),
                _part(name, 0, len(tensors)))
        raise
    n, me = _set_size(set_id), _set_rank(set_id)
    key = _claim_name(set_id, name, what)
    core, results = [], []
    for i, b in enumerate(bufs):
        part = _part(name, i, len(bufs))
        work = _buffers.copy_of(b)
        _buffers.scale_(work, prescale_factor)
        wb = _buffers.view(work, what, writable=True)
        rest = tuple(b.shape[1:])
        row = _product(rest)
        parts = _scatter_rows(b.shape[0], n)
        begin = sum(parts[:me])
        if all(p == parts[0] for p in parts):
            out = _buffers.empty_like(b, (parts[me],) + rest)
            ob = _buffers.view(out, what, writable=True)
            core.append(_core.reducescatter_async(wb.ptr, ob.ptr, parts[me] * row, wb.dtype, op,
                                                  set_id, part, _shape(b), wb.device,
                                                  wb.stream))
            results.append((out, None, work))
        else:  # Uneven parts: reduce everything, keep ours.
            core.append(_core.allreduce_async(wb.ptr, wb.ptr, wb.count, wb.dtype, op, set_id,
                                              part, _shape(b), False, wb.device, wb.stream))
            results.append((work, (begin, parts[me]), work))

    def finish():
        outs = []
        for out, sl, _ in results:
            if sl is not None:
                out = _buffers.copy_of(_buffers.view(out[sl[0]:sl[0] + sl[1]], what, False))
            _buffers.scale_(out, postscale_factor)
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


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts sending splits[r] rows of `tensor` (in order) to rank r and receiving each rank's
    rows for this one; synchronize() returns (received tensor, received splits). Without splits
    the first dimension is divided evenly."""
    what = _what("alltoall", name)
    set_id = _set_id(process_set, what)
    n = _set_size(set_id)
    try:
        buf = _buffers.view(tensor, what, writable=False)
        if len(buf.shape) == 0:
            raise InvalidArgumentError(f"{what}: a scalar cannot be split; pass a tensor with a "
                                       "first dimension")
        sends = _splits_list(splits, buf.shape[0], n, what)
    except InvalidArgumentError as e:
        # The call's first collective is the exchange of the splits.
        _refuse(e, set_id, "alltoall", f"{name} (splits)" if name else "")
        raise
    rest = tuple(buf.shape[1:])
    row = _product(rest)
    mine = _array.array("q", sends)
    theirs = _array.array("q", bytes(8 * n))
    h = _core.alltoallv_async(mine.buffer_info()[0], [1] * n, theirs.buffer_info()[0], [1] * n,
                              INT64, set_id, f"{name} (splits)" if name else "", [n])
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

