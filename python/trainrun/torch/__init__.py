"""trainrun.torch: horovod.torch's API over trainrun, so a Horovod script ports by its import.

    import trainrun.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    sampler = hvd.DistributedSampler(train_set)          # this rank's shard
    ...
    loss_avg = hvd.allreduce(loss.detach(), name="loss")  # averaged across ranks
"""

import collections.abc

import torch
import torch.utils.data

import trainrun as _trainrun
from trainrun import (Average, Error, InternalError, InvalidArgumentError, IoError, Max,
                      MismatchError, Min, Product, ProcessSet, ReduceOp, Sum, TimeoutError,
                      add_process_set, allgather_object, barrier, cross_rank, cross_size,
                      global_process_set, init, is_initialized, local_rank, local_size, poll, rank,
                      remove_process_set, shutdown, size, synchronize)
from trainrun.torch.compression import Compression
from trainrun.torch.optimizer import DistributedOptimizer
from trainrun.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "synchronize",
    "poll", "broadcast_object", "allgather_object", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "DistributedSampler", "SyncBatchNorm",
    "shard_indices", "Compression", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "start_timeline", "stop_timeline", "nccl_built", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "ReduceOp", "Sum", "Average", "Adasum", "Min", "Max",
    "Product", "Error", "InternalError", "HorovodInternalError", "IoError", "TimeoutError",
    "InvalidArgumentError", "MismatchError",
]

# HorovodInternalError: what Horovod raises when the job's communication fails (elastic training
# catches it); trainrun's InternalError (IoError, TimeoutError) is that.
HorovodInternalError = InternalError


class Adasum:
    """Horovod's Adasum op, named so `op=hvd.Adasum` is recognised: trainrun refuses it with a
    clear error (it is not built with Adasum)."""

    def __init__(self):
        raise InvalidArgumentError("Adasum is an op, not a class to instantiate")


# --- What this build has (CUDA and NCCL are opened at run time: trainrun.gpu_info() says what loaded)


def nccl_built():
    """True: NCCL is opened at run time where it is installed (trainrun.gpu_info() says whether
    it loaded here, and why not); without it CUDA tensors go through pinned host memory."""
    return True


def mpi_built():
    """False: trainrun needs no MPI."""
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    """False: trainrun has its own TCP and shared-memory collectives, not Gloo."""
    return False


def gloo_enabled():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """True: CUDA tensors are reduced (CUDA's runtime is opened at run time; gpu_info())."""
    return True


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome trace of every later collective to file_path (all ranks into one file, one
    track per rank); call it on every rank. mark_cycles is accepted as Horovod's: trainrun has no
    background cycles to mark (a collective runs when it is called)."""
    _trainrun._core.start_timeline(str(file_path))  # pylint: disable=protected-access


def stop_timeline():
    """Stops the timeline started by start_timeline (or TRAINRUN_TIMELINE)."""
    _trainrun._core.stop_timeline()  # pylint: disable=protected-access


def _resolve_op(average, op, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("pass either average= (deprecated, as in Horovod) or op=, not both")
        return Average if average else Sum
    return default if op is None else op


def _check_op(op):
    if op is Adasum:
        raise InvalidArgumentError("op=Adasum is not supported: trainrun is not built with "
                                   "Adasum; use op=Average or op=Sum")
    return op


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# --- allreduce ---------------------------------------------------------------------------------


class _Allreduce(torch.autograd.Function):
    """The gradient of an allreduce is the same allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, op, prescale_factor, postscale_factor, process_set, name):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _trainrun.allreduce(tensor.detach(), op, name, process_set, prescale_factor,
                                   postscale_factor)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return (_trainrun.allreduce(grad.contiguous(), op, None, ps, pre, post), None, None, None,
                None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns `tensor` reduced across ranks (default: averaged), as a new tensor; differentiable.

    compression: Compression.fp16 or .bf16 sends floating-point tensors at half the bytes.
    """
    op = _check_op(_resolve_op(average, op))
    compressed, cctx = compression.compress(tensor)
    if _needs_grad(compressed):
        out = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, process_set,
                               name)
    else:
        out = _trainrun.allreduce(compressed.detach(), op, name, process_set, prescale_factor,
                                  postscale_factor)
    return compression.decompress(out, cctx)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce into a new tensor; synchronize(handle) returns it."""
    return _trainrun.allreduce_async(tensor.detach(), _check_op(_resolve_op(average, op)), name,
                                     process_set, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` across ranks in place (default: averaged) and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    return _trainrun.allreduce_async_(tensor.data, _check_op(_resolve_op(average, op)), name,
                                      process_set, prescale_factor, postscale_factor)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Allreduces a sparse tensor (as Horovod: by allgathering its indices and values); returns,
    as Horovod's does, a function that gives the reduced sparse tensor."""
    t = tensor.coalesce()
    indices = _trainrun.allgather(t.indices().t().contiguous(), None, process_set)
    values = _trainrun.allgather(t.values().contiguous(), None, process_set)
    if op == Average:
        values = values / (process_set or global_process_set).size()
    elif op != Sum:
        raise InvalidArgumentError("sparse_allreduce_async: op must be Average or Sum")
    result = torch.sparse_coo_tensor(indices.t(), values, t.size())
    return lambda: result


class _GroupedAllreduce(torch.autograd.Function):

    @staticmethod
    def forward(ctx, op, prescale_factor, postscale_factor, process_set, name, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(_trainrun.grouped_allreduce([t.detach() for t in tensors], op, name,
                                                 process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        reduced = _trainrun.grouped_allreduce([g.contiguous() for g in grads], op, None, ps, pre,
                                              post)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns the list of tensors reduced across ranks, as one fused operation; differentiable."""
    op = _check_op(_resolve_op(average, op))
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _needs_grad(*compressed):
        outs = _GroupedAllreduce.apply(op, prescale_factor, postscale_factor, process_set, name,
                                       *compressed)
    else:
        outs = _trainrun.grouped_allreduce([t.detach() for t in compressed], op, name,
                                           process_set, prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    return _trainrun.grouped_allreduce_async([t.detach() for t in tensors],
                                             _check_op(_resolve_op(average, op)), name,
                                             process_set, prescale_factor, postscale_factor)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    return _trainrun.grouped_allreduce_async_([t.data for t in tensors],
                                              _check_op(_resolve_op(average, op)), name,
                                              process_set, prescale_factor, postscale_factor)


# --- allgather ---------------------------------------------------------------------------------


def _my_offsets(dims, process_set):
    """This rank's first row in a gather of each tensor whose first dimensions are `dims`."""
    ps = process_set or global_process_set
    everyone = _trainrun.allgather(torch.tensor([dims], dtype=torch.int64), None, ps)
    me = ps.rank()
    return [int(everyone[:me, i].sum()) for i in range(len(dims))]


class _GroupedAllgather(torch.autograd.Function):
    """Gradient: the average of every rank's gradient of the gathered tensor, this rank's rows."""

    @staticmethod
    def forward(ctx, process_set, name, *tensors):
        ctx.process_set = process_set
        ctx.dims = [t.shape[0] if t.dim() else 1 for t in tensors]
        return tuple(_trainrun.grouped_allgather([t.detach() for t in tensors], name,
                                                 process_set))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        reduced = _trainrun.grouped_allreduce([g.contiguous() for g in grads], Average, None, ps)
        offsets = _my_offsets(ctx.dims, ps)
        return (None, None, *[g.narrow(0, o, d) for g, o, d in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns each tensor gathered from every rank along the first dimension; differentiable."""
    if _needs_grad(*tensors):
        return list(_GroupedAllgather.apply(process_set, name, *tensors))
    return _trainrun.grouped_allgather([t.detach() for t in tensors], name, process_set)


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along the first dimension; differentiable."""
    return grouped_allgather([tensor], name, process_set)[0]


def allgather_async(tensor, name=None, process_set=global_process_set):
    return _trainrun.allgather_async(tensor.detach(), name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _trainrun.grouped_allgather_async([t.detach() for t in tensors], name, process_set)


# --- broadcast ---------------------------------------------------------------------------------


class _Broadcast(torch.autograd.Function):
    """Gradient: the average of every rank's gradient, on the root; zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, name):
        ctx.args = (root_rank, process_set)
        return _trainrun.broadcast(tensor.detach(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        root_rank, ps = ctx.args
        reduced = _trainrun.allreduce(grad.contiguous(), Average, None, ps)
        if rank() != root_rank:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` as a new tensor; differentiable."""
    if _needs_grad(tensor):
        return _Broadcast.apply(tensor, root_rank, process_set, name)
    return _trainrun.broadcast(tensor.detach(), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    _trainrun.broadcast_(tensor.data, root_rank, name, process_set)
    return tensor


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return _trainrun.broadcast_async(tensor.detach(), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _trainrun.broadcast_async_(tensor.data, root_rank, name, process_set)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    return _trainrun.broadcast_object(obj, root_rank, name, process_set)


# --- alltoall ----------------------------------------------------------------------------------


class _Alltoall(torch.autograd.Function):
    """Gradient: the gradient sent back where each row came from."""

    @staticmethod
    def forward(ctx, tensor, splits, process_set, name):
        out, received = _trainrun.alltoall(tensor.detach(), splits, name, process_set)
        ctx.args = (received, process_set)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        received, ps = ctx.args
        back, _ = _trainrun.alltoall(grad.contiguous(), received, None, ps)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows of `tensor` to rank r (even parts without splits) and returns the rows
    received, or (rows, received splits) when splits were given; differentiable."""
    if _needs_grad(tensor):
        out, received = _Alltoall.apply(tensor, splits, process_set, name)
    else:
        out, received = _trainrun.alltoall(tensor.detach(), splits, name, process_set)
    return out if splits is None else (out, received)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    return _trainrun.alltoall_async(tensor.detach(), splits, name, process_set)


# --- reducescatter -----------------------------------------------------------------------------


class _GroupedReducescatter(torch.autograd.Function):
    """Gradient: every rank's part of the gradient gathered (times the set's size for Sum)."""

    @staticmethod
    def forward(ctx, op, prescale_factor, postscale_factor, process_set, name, *tensors):
        ctx.args = (op, prescale_factor * postscale_factor, process_set)
        return tuple(_trainrun.grouped_reducescatter([t.detach() for t in tensors], op, name,
                                                     process_set, prescale_factor,
                                                     postscale_factor))

    @staticmethod
    def backward(ctx, *grads):
        op, scale, ps = ctx.args
        factor = scale * ((ps or global_process_set).size() if op == Sum else 1)
        grads = [g.contiguous() * factor for g in grads]
        return (None, None, None, None, None, *_trainrun.grouped_allgather(grads, None, ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Returns this rank's part of each tensor reduced across ranks; differentiable."""
    op = _check_op(op)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _needs_grad(*compressed):
        outs = _GroupedReducescatter.apply(op, prescale_factor, postscale_factor, process_set,
                                           name, *compressed)
    else:
        outs = _trainrun.grouped_reducescatter([t.detach() for t in compressed], op, name,
                                               process_set, prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                                 postscale_factor)[0]


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    return _trainrun.reducescatter_async(tensor.detach(), _check_op(op), name, process_set,
                                         prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _trainrun.grouped_reducescatter_async([t.detach() for t in tensors], _check_op(op),
                                                 name, process_set, prescale_factor,
                                                 postscale_factor)


def join(device=-1):
    """Says this rank has no more data; see trainrun.join. Returns the last rank to join.

    device: accepted as Horovod's (a GPU to use for the zeros); trainrun joins on the CPU.
    """
    return _trainrun.join()


def broadcast_parameters(params, root_rank=0):
    """Overwrites every tensor of `params` with root_rank's, in place.

    params: a model's state_dict(), named_parameters(), or any iterable of (name, tensor). The
    ranks first check they hold the same names, shapes and dtypes (raising InvalidArgumentError
    naming the first difference); the broadcasts then run back to back on the core's thread.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable):
        items = list(params)
        if any(not isinstance(i, tuple) or len(i) != 2 for i in items):
            raise ValueError("broadcast_parameters takes a state_dict or (name, tensor) pairs")
    else:
        raise ValueError(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    tensors = []
    for name, p in items:
        if p is None:
            continue
        if isinstance(p, torch.nn.Parameter) or p.requires_grad:
            p = p.data
        tensors.append((name, p))
    layout = [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors]
    _check_same("broadcast_parameters", layout)
    handles = [_trainrun.broadcast_async_(t, root_rank, name=n) for n, t in tensors]
    for h in handles:
        synchronize(h)


def _check_same(what, layout):
    if size() == 1:
        return
    layouts = allgather_object(layout)
    for r, other in enumerate(layouts):
        if other != layouts[0]:
            diff = next((f"{a} vs {b}" for a, b in zip(layouts[0], other) if a != b),
                        f"{len(layouts[0])} vs {len(other)} tensors")
            raise InvalidArgumentError(f"{what}: rank {r} holds different tensors from rank 0 "
                                       f"({diff}); every rank must build the same model")


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every rank's optimizer state (hyperparameters and per-parameter state such as
    momentum buffers) a copy of root_rank's.

    As Horovod does, an optimizer that has not stepped yet first takes a dummy step with zero
    gradients (its parameters are restored afterwards), so its state exists on every rank; the
    parameters that require gradients are left with zero gradients. root_rank's whole state_dict is
    then sent (pickled) and loaded.
    """
    if len(optimizer.state) == 0:
        _dummy_step(optimizer)
    if size() == 1:
        return
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank,
                             name="optimizer state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def _dummy_step(optimizer):
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    saved = [p.data.clone() for p in params]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    # The wrapped class's step: a DistributedOptimizer must not allreduce for a dummy step.
    base = type(optimizer)
    if hasattr(optimizer, "skip_synchronize"):
        base = type(optimizer).__mro__[1]
    with torch.no_grad():
        base.step(optimizer)
        for p, data in zip(params, saved):
            p.data.copy_(data)


def shard_indices(n, rank_=None, size_=None, shuffle=False, seed=0, epoch=0, drop_last=False):
    """The indices of a data set of `n` items that this rank should use: every size()-th index
    starting at rank() (after a shuffle that is the same on every rank, given seed and epoch).

    Without drop_last, the list is padded (repeating from the start) so every rank gets
    ceil(n / size) items, as torch's DistributedSampler does, and every rank runs the same number
    of steps.
    """
    rank_ = rank() if rank_ is None else rank_
    size_ = size() if size_ is None else size_
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if drop_last:
        order = order[:n - n % size_]
    else:
        per_rank = -(-n // size_)
        pad = per_rank * size_ - n
        order += (order * (pad // max(n, 1) + 1))[:pad]
    return order[rank_::size_]


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """torch's DistributedSampler with num_replicas and rank taken from trainrun.

    Call set_epoch(epoch) before each epoch so the shuffle differs between epochs.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        super().__init__(dataset, num_replicas=size() if num_replicas is None else num_replicas,
                         rank=_trainrun.rank() if rank is None else rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)


# horovod.torch.elastic as hvd.elastic (imported last: it uses this module).
from trainrun.torch import elastic  # noqa: E402  pylint: disable=wrong-import-position
