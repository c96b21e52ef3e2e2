"""horovod.torch's helpers for training state (Horovod's horovod/torch/functions.py):
broadcast_parameters and broadcast_optimizer_state make every rank's model and optimizer a copy
of one rank's; broadcast_object and allgather_object send any picklable object."""

import collections.abc

import torch

from trainrun.common import objects as _objects
from trainrun.common import ops as _base_ops
from trainrun.common.basics import rank, size
from trainrun.common.exceptions import InvalidArgumentError
from trainrun.common.objects import allgather_object
from trainrun.common.ops import synchronize
from trainrun.common.process_sets import global_process_set


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    return _objects.broadcast_object(obj, root_rank, name, process_set)


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
    handles = [_base_ops.broadcast_async_(t, root_rank, name=n) for n, t in tensors]
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
