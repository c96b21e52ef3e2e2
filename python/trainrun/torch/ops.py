"""horovod.torch's collectives (Horovod's horovod/torch/mpi_ops.py) over trainrun's: the
differentiable allreduce, allgather, broadcast, alltoall and reducescatter (each an autograd
Function whose backward is the matching collective of the gradient), their async, in-place and
grouped forms with Horovod's arguments (average=, compression=, a process_set that defaults to the
global one), join and the timeline."""

import torch

from trainrun import _core
from trainrun.common import ops as _base_ops
from trainrun.common.basics import rank
from trainrun.common.exceptions import InvalidArgumentError
from trainrun.common.ops import Adasum, Average, Sum, synchronize
from trainrun.common.process_sets import global_process_set
from trainrun.torch.compression import Compression


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome trace of every later collective to file_path (all ranks into one file, one
    track per rank); call it on every rank. mark_cycles is accepted as Horovod's: trainrun has no
    background cycles to mark (a collective runs when it is called)."""
    _core.start_timeline(str(file_path))


def stop_timeline():
    """Stops the timeline started by start_timeline (or TRAINRUN_TIMELINE)."""
    _core.stop_timeline()


def _resolve_op(average, op, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("pass either average= (deprecated, as in Horovod) or op=, not both")
        return Average if average else Sum
    return default if op is None else op


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# --- allreduce ---------------------------------------------------------------------------------


class _Allreduce(torch.autograd.Function):
    """The gradient of an allreduce is the same allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, op, prescale_factor, postscale_factor, process_set, name):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _base_ops.allreduce(tensor.detach(), op, name, process_set, prescale_factor,
                                   postscale_factor)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return (_base_ops.allreduce(grad.contiguous(), op, None, ps, pre, post), None, None, None,
                None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns `tensor` reduced across ranks (default: averaged), as a new tensor; differentiable.

    compression: Compression.fp16 or .bf16 sends floating-point tensors at half the bytes.
    """
    op = _resolve_op(average, op)
    compressed, cctx = compression.compress(tensor)
    if _needs_grad(compressed):
        out = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, process_set,
                               name)
    else:
        out = _base_ops.allreduce(compressed.detach(), op, name, process_set, prescale_factor,
                                  postscale_factor)
    return compression.decompress(out, cctx)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce into a new tensor; synchronize(handle) returns it."""
    return _base_ops.allreduce_async(tensor.detach(), _resolve_op(average, op), name,
                                     process_set, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` across ranks in place (default: averaged) and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    return _base_ops.allreduce_async_(tensor.data, _resolve_op(average, op), name,
                                      process_set, prescale_factor, postscale_factor)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Allreduces a sparse tensor (as Horovod: by allgathering its indices and values); returns,
    as Horovod's does, a function that gives the reduced sparse tensor."""
    t = tensor.coalesce()
    indices = _base_ops.allgather(t.indices().t().contiguous(), None, process_set)
    values = _base_ops.allgather(t.values().contiguous(), None, process_set)
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
        return tuple(_base_ops.grouped_allreduce([t.detach() for t in tensors], op, name,
                                                 process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        reduced = _base_ops.grouped_allreduce([g.contiguous() for g in grads], op, None, ps, pre,
                                              post)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns the list of tensors reduced across ranks, as one fused operation; differentiable."""
    op = _resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _needs_grad(*compressed):
        outs = _GroupedAllreduce.apply(op, prescale_factor, postscale_factor, process_set, name,
                                       *compressed)
    else:
        outs = _base_ops.grouped_allreduce([t.detach() for t in compressed], op, name,
                                           process_set, prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    return _base_ops.grouped_allreduce_async([t.detach() for t in tensors],
                                             _resolve_op(average, op), name,
                                             process_set, prescale_factor, postscale_factor)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    return _base_ops.grouped_allreduce_async_([t.data for t in tensors],
                                              _resolve_op(average, op), name,
                                              process_set, prescale_factor, postscale_factor)


# --- allgather ---------------------------------------------------------------------------------


def _my_offsets(dims, process_set):
    """This rank's first row in a gather of each tensor whose first dimensions are `dims`."""
    ps = process_set or global_process_set
    everyone = _base_ops.allgather(torch.tensor([dims], dtype=torch.int64), None, ps)
    me = ps.rank()
    return [int(everyone[:me, i].sum()) for i in range(len(dims))]


class _GroupedAllgather(torch.autograd.Function):
    """Gradient: the average of every rank's gradient of the gathered tensor, this rank's rows."""

    @staticmethod
    def forward(ctx, process_set, name, *tensors):
        ctx.process_set = process_set
        ctx.dims = [t.shape[0] if t.dim() else 1 for t in tensors]
        return tuple(_base_ops.grouped_allgather([t.detach() for t in tensors], name,
                                                 process_set))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        reduced = _base_ops.grouped_allreduce([g.contiguous() for g in grads], Average, None, ps)
        offsets = _my_offsets(ctx.dims, ps)
        return (None, None, *[g.narrow(0, o, d) for g, o, d in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns each tensor gathered from every rank along the first dimension; differentiable."""
    if _needs_grad(*tensors):
        return list(_GroupedAllgather.apply(process_set, name, *tensors))
    return _base_ops.grouped_allgather([t.detach() for t in tensors], name, process_set)


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along the first dimension; differentiable."""
    return grouped_allgather([tensor], name, process_set)[0]


def allgather_async(tensor, name=None, process_set=global_process_set):
    return _base_ops.allgather_async(tensor.detach(), name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _base_ops.grouped_allgather_async([t.detach() for t in tensors], name, process_set)


# --- broadcast ---------------------------------------------------------------------------------


class _Broadcast(torch.autograd.Function):
    """Gradient: the average of every rank's gradient, on the root; zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, name):
        ctx.args = (root_rank, process_set)
        return _base_ops.broadcast(tensor.detach(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        root_rank, ps = ctx.args
        reduced = _base_ops.allreduce(grad.contiguous(), Average, None, ps)
        if rank() != root_rank:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` as a new tensor; differentiable."""
    if _needs_grad(tensor):
        return _Broadcast.apply(tensor, root_rank, process_set, name)
    return _base_ops.broadcast(tensor.detach(), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    _base_ops.broadcast_(tensor.data, root_rank, name, process_set)
    return tensor


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return _base_ops.broadcast_async(tensor.detach(), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _base_ops.broadcast_async_(tensor.data, root_rank, name, process_set)


# --- alltoall ----------------------------------------------------------------------------------


class _Alltoall(torch.autograd.Function):
    """Gradient: the gradient sent back where each row came from."""

    @staticmethod
    def forward(ctx, tensor, splits, process_set, name):
        out, received = _base_ops.alltoall(tensor.detach(), splits, name, process_set)
        ctx.args = (received, process_set)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        received, ps = ctx.args
        back, _ = _base_ops.alltoall(grad.contiguous(), received, None, ps)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows of `tensor` to rank r (even parts without splits) and returns the rows
    received, or (rows, received splits) when splits were given; differentiable."""
    if _needs_grad(tensor):
        out, received = _Alltoall.apply(tensor, splits, process_set, name)
    else:
        out, received = _base_ops.alltoall(tensor.detach(), splits, name, process_set)
    return out if splits is None else (out, received)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    return _base_ops.alltoall_async(tensor.detach(), splits, name, process_set)


# --- reducescatter -----------------------------------------------------------------------------


class _GroupedReducescatter(torch.autograd.Function):
    """Gradient: every rank's part of the gradient gathered (times the set's size for Sum)."""

    @staticmethod
    def forward(ctx, op, prescale_factor, postscale_factor, process_set, name, *tensors):
        ctx.args = (op, prescale_factor * postscale_factor, process_set)
        return tuple(_base_ops.grouped_reducescatter([t.detach() for t in tensors], op, name,
                                                     process_set, prescale_factor,
                                                     postscale_factor))

    @staticmethod
    def backward(ctx, *grads):
        op, scale, ps = ctx.args
        factor = scale * ((ps or global_process_set).size() if op == Sum else 1)
        grads = [g.contiguous() * factor for g in grads]
        return (None, None, None, None, None, *_base_ops.grouped_allgather(grads, None, ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Returns this rank's part of each tensor reduced across ranks; differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _needs_grad(*compressed):
        outs = _GroupedReducescatter.apply(op, prescale_factor, postscale_factor, process_set,
                                           name, *compressed)
    else:
        outs = _base_ops.grouped_reducescatter([t.detach() for t in compressed], op, name,
                                               process_set, prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                                 postscale_factor)[0]


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    return _base_ops.reducescatter_async(tensor.detach(), op, name, process_set,
                                         prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _base_ops.grouped_reducescatter_async([t.detach() for t in tensors], op,
                                                 name, process_set, prescale_factor,
                                                 postscale_factor)


def join(device=-1):
    """Says this rank has no more data; see trainrun.join. Returns the last rank to join.

    device: accepted as Horovod's (a GPU to use for the zeros); trainrun joins on the CPU.
    """
    return _base_ops.join()
