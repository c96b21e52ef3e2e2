"""DistributedOptimizer(op=Adasum): Horovod's _DistributedAdasumOptimizer over trainrun.

With Adasum the ranks combine their *updates*, not their gradients: as each parameter's gradient
is ready (a hook during backward), the wrapped optimizer steps on that parameter alone from a
copy of it, `start`; the difference `delta = p - start` (the step this rank alone would take) is
reduced with op=Adasum, in place, while backward goes on; step() waits for each and sets
`p = start + Adasum(deltas)`. So the optimizer's own logic (momentum, Adam's moments) runs on each
rank's local gradient, as in Horovod, and orthogonal updates add while parallel ones average.

Learning rate, as Horovod's guide and examples say: do not scale it by size() as with averaging
(Adasum of equal updates is that update, not their sum); start from the best single-rank rate.
Horovod's GPU build (NCCL) sums within a host before Adasum across hosts and so scales by
local_size(); trainrun's Adasum runs across every rank, CUDA tensors included (through host
memory), so that factor does not apply.
"""

from contextlib import contextmanager

import torch

import trainrun
from trainrun.common.ops import Adasum, synchronize
from trainrun.torch.ops import allreduce_async_


def checked_named_parameters(all_params, named_parameters):
    """named_parameters as a list, Horovod's generated names when None; refuses what is not
    (name, parameter) pairs and duplicate names (both optimizers, before the runtime is asked)."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}", p) for i, p in enumerate(all_params)]
    if any(not isinstance(n, tuple) or len(n) != 2 for n in named_parameters):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "as model.named_parameters() gives")
    names = [n for n, _ in named_parameters]
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters has duplicate names: {', '.join(dups)}")
    return named_parameters


def hook_after_accumulation(p, hook, accumulators):
    """Calls hook() each time backward has summed this pass's gradient into p.grad. On torch >=
    2.1 that is p's post-accumulate-grad hook; on older torch (Debian 12 has 1.13) a hook on the
    leaf's gradient accumulator node, kept alive in `accumulators` (reaching the node takes one
    differentiable op, so grad mode must be on)."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        p.register_post_accumulate_grad_hook(lambda _, hook=hook: hook())
        return
    with torch.enable_grad():
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
    accumulator.register_hook(hook)
    accumulators.append(accumulator)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class by make_adasum_optimizer(); see the module."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step):
        super(self.__class__, self).__init__(params)
        all_params = [p for group in self.param_groups for p in group["params"]]
        named_parameters = checked_named_parameters(all_params, named_parameters)
        named = {id(p) for _, p in named_parameters}
        unnamed = [p for p in all_params if id(p) not in named]
        if unnamed:
            raise ValueError(f"{len(unnamed)} parameter(s) of the optimizer are missing from "
                             "named_parameters; pass model.named_parameters() of the same model")
        self._compression = compression
        self._parameter_names = {p: n for n, p in sorted(named_parameters, key=lambda x: x[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False)
                                 for p in self._parameter_names}
        self._register_hooks()

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                p.grad = p.data.new(p.size()).zero_()
                self._requires_update.add(p)
                hook_after_accumulation(p, self._make_hook(p), self._grad_accs)

    def _allreduce_delta_async(self, p):
        """Steps the wrapped optimizer on p alone, turns p into that step's delta and starts its
        Adasum in place."""
        start = self._starting_models[p]
        stashed = []
        for group in self.param_groups:
            stashed.append(group["params"])
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            super(self.__class__, self).step()
            p.data.sub_(start)
        finally:
            for params, group in zip(stashed, self.param_groups):
                group["params"] = params
        compressed, ctx = self._compression.compress(p)
        handle = allreduce_async_(compressed.data, name=self._parameter_names.get(p), op=Adasum)
        return handle, ctx

    def _make_hook(self, p):
        def hook(*unused):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times before "
                        "step(); raise backward_passes_per_step to accumulate more")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_delta_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self):
        """Nothing to do: step() waits for the deltas (Horovod's Adasum optimizer alike)."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("skip_synchronize() does not apply to DistributedOptimizer with "
                             "op=Adasum: its step() is the reduction")
        yield  # pylint: disable=unreachable

    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()
        # Parameters that got no gradient, and those still short of backward_passes_per_step,
        # start here in the order of their names: every rank starts its collectives in one order.
        by_name = sorted(self._requires_update, key=lambda q: self._parameter_names[q])
        for p in by_name:
            if p not in self._handles:
                self._handles[p] = self._allreduce_delta_async(p)
        for p in by_name:
            handle, ctx = self._handles[p]
            if handle is None:  # step() before backward_passes_per_step passes
                handle, ctx = self._allreduce_delta_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, set_to_none=False):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step()")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def make_adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                          process_set):
    """DistributedOptimizer's op=Adasum case (size() > 1): see the module."""
    if process_set is not None and process_set is not trainrun.global_process_set:
        raise NotImplementedError("DistributedOptimizer: op=Adasum reduces over every rank; it "
                                  "takes no process_set (as Horovod's)")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedAdasumOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
