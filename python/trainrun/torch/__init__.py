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

from trainrun import (Average, Error, InvalidArgumentError, IoError, Max, Min, Product, ReduceOp,
                      Sum, TimeoutError, allgather, allgather_object, allreduce_async_, barrier,
                      broadcast_async_, broadcast_object, cross_rank, cross_size, init,
                      is_initialized, local_rank, local_size, poll, rank, shutdown, size,
                      synchronize)
import trainrun as _trainrun
from trainrun.torch.optimizer import DistributedOptimizer

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async_", "broadcast", "broadcast_",
    "broadcast_async_", "allgather", "barrier", "synchronize", "poll", "broadcast_object",
    "allgather_object", "broadcast_parameters", "broadcast_optimizer_state",
    "DistributedOptimizer", "DistributedSampler", "shard_indices", "Compression", "nccl_built",
    "mpi_built", "gloo_built", "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Error",
    "IoError", "TimeoutError", "InvalidArgumentError",
]


class Compression:
    """Horovod's gradient compression choices, so `compression=hvd.Compression.none` ports.

    trainrun sends gradients uncompressed; DistributedOptimizer refuses Compression.fp16.
    """

    none = None
    fp16 = "fp16"


def nccl_built():
    """False: trainrun.torch reduces CPU tensors (Horovod scripts ask before using GPUs)."""
    return False


def mpi_built():
    """False: trainrun needs no MPI."""
    return False


def gloo_built():
    """False: trainrun has its own TCP collectives."""
    return False


def _resolve_op(average, op):
    if average is not None:
        if op is not None:
            raise ValueError("pass either average= (deprecated, as in Horovod) or op=, not both")
        return Average if average else Sum
    return op


def allreduce(tensor, average=None, name=None, op=None):
    """Returns `tensor` reduced across ranks (default: averaged), as a new tensor."""
    return _trainrun.allreduce(tensor, op=_resolve_op(average, op), name=name)


def allreduce_(tensor, average=None, name=None, op=None):
    """Reduces `tensor` across ranks in place (default: averaged) and returns it."""
    return _trainrun.allreduce_(tensor, op=_resolve_op(average, op), name=name)


def broadcast(tensor, root_rank, name=None):
    """Returns root_rank's `tensor` as a new tensor."""
    return _trainrun.broadcast(tensor, root_rank, name=name)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    return _trainrun.broadcast_(tensor, root_rank, name=name)


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
    handles = [broadcast_async_(t, root_rank, name=n) for n, t in tensors]
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

    Unlike Horovod, ranks whose optimizer has not stepped yet need no dummy step: root_rank's whole
    state_dict is sent (pickled) and loaded, so the other ranks' state need not match its layout.
    """
    if size() == 1:
        return
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank,
                             name="optimizer state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


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
