"""DistributedOptimizer: horovod.torch's optimizer wrapper, over trainrun's collectives.

Gradients are averaged across ranks while backward is still running. Parameters are grouped, in
the reverse of their registration order (about the order backward produces their gradients), into
buckets of about TRAINRUN_BUCKET_BYTES bytes (1 MiB: small enough that the first buckets start while
backward still has work to do, large enough that per-message latency does not dominate). A hook on each parameter's gradient accumulator
marks it ready; when every parameter of a bucket is ready, the bucket is handed to the core's
communication thread, which allreduces it with the GIL released while autograd goes on computing
the next layers' gradients. step() (or synchronize()) waits for the last buckets.

Buckets are launched strictly in bucket order, so every rank issues the same sequence of
collectives whatever order its hooks happen to fire in. After the first launch a parameter's .grad
is a view into its bucket, so later backward passes accumulate straight into the buffer that is
reduced, and reduced values need no copy back.
"""

import warnings
from contextlib import contextmanager

import torch

import trainrun
from trainrun import _buffers
from trainrun import _core
from trainrun.torch.adasum_optimizer import (checked_named_parameters, hook_after_accumulation,
                                             make_adasum_optimizer)
from trainrun.torch.compression import Compression


def _bucket_bytes():
    # TRAINRUN_BUCKET_BYTES, read (default, old name, parser) as the library declares it.
    return _core.int_setting("TRAINRUN_BUCKET_BYTES")


class _Bucket:
    """Parameters of one dtype whose gradients are reduced together in one flat buffer."""

    def __init__(self, index, params):
        self.index = index
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                device=params[0].device)
        self.views = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.dtype_code = _buffers.view(self.flat, "DistributedOptimizer", True).dtype
        self.waiting = len(params)  # parameters not yet ready in this step
        self.handle = None
        self.wire = None  # what the allreduce in flight reduces: flat, or its compressed copy
        self.wire_buffer = None  # the compressed copy's buffer, made at the first launch
        self.sparse = []  # (parameter, view) whose gradient came sparse

    def gather_grads(self):
        """Makes every parameter's .grad a view into the flat buffer, copying where it is not.

        A sparse gradient is reduced as dense and handed back sparse (restore_sparse)."""
        self.sparse = []
        for p, v in zip(self.params, self.views):
            g = p.grad
            if g is None:
                v.zero_()
            elif g.is_sparse:
                v.copy_(g.to_dense())
                self.sparse.append((p, v))
            elif g.data_ptr() != v.data_ptr():
                v.copy_(g)
            p.grad = v

    def restore_sparse(self):
        for p, v in self.sparse:
            p.grad = v.to_sparse()
        self.sparse = []


def _make_buckets(params, bucket_bytes):
    """Groups params, last first, into buckets of one dtype and device closed once they hold
    bucket_bytes (as DDP does: a bias is not left alone in a bucket because the next weight is
    large)."""
    buckets, current, current_bytes = [], [], 0
    for p in reversed(params):
        if current and (p.dtype != current[0].dtype or p.device != current[0].device):
            buckets.append(_Bucket(len(buckets), current))
            current, current_bytes = [], 0
        current.append(p)
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= bucket_bytes:
            buckets.append(_Bucket(len(buckets), current))
            current, current_bytes = [], 0
    if current:
        buckets.append(_Bucket(len(buckets), current))
    return buckets


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class by DistributedOptimizer(); see there."""

    def __init__(self, params, named_parameters, op, backward_passes_per_step, bucket_bytes,
                 wire_dtype, predivide, process_set):
        super(self.__class__, self).__init__(params)
        # The names first, before anything asks the runtime (Horovod checks them without init()).
        all_params = [p for group in self.param_groups for p in group["params"]]
        named_parameters = checked_named_parameters(all_params, named_parameters)
        self._names = {p: n for n, p in named_parameters}
        self._parameter_names = self._names  # Horovod's attribute name, which scripts read
        unnamed = [p for p in all_params if p not in self._names]
        if unnamed:
            raise ValueError(f"{len(unnamed)} parameter(s) of the optimizer are missing from "
                             "named_parameters; pass model.named_parameters() of the same model")

        self._wire_dtype = wire_dtype  # e.g. torch.float16: buckets travel compressed
        self._process_set = process_set or trainrun.global_process_set
        self._set_id = self._process_set.process_set_id or 0
        # Reduces only when this rank and others are in the set; else steps on its own gradients.
        self._solo = not self._process_set.included() or self._process_set.size() == 1
        self._op, self._prescale, self._postscale = op, 1.0, 1.0
        if predivide != 1.0:  # Horovod's split of the averaging around the sum
            self._op = trainrun.Sum
            self._prescale = 1.0 / predivide
            self._postscale = predivide / self._process_set.size()
        self._backward_passes_per_step = backward_passes_per_step

        elsewhere = next((p for p in all_params if p.device.type not in ("cpu", "cuda")), None)
        if elsewhere is not None:
            raise trainrun.InvalidArgumentError(
                f"DistributedOptimizer: parameter {self._names[elsewhere]} is on "
                f"{elsewhere.device}; trainrun.torch reduces CPU and CUDA gradients, so move the "
                "model to one of them")
        seen = set()
        params = []
        for p in all_params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        self._buckets = _make_buckets(params, bucket_bytes)
        self._bucket_of = {}
        for b in self._buckets:
            for p in b.params:
                self._bucket_of[p] = b
        self._delay = {p: backward_passes_per_step for p in params}
        self._next_launch = 0
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accumulators = []
        self._check_layout()
        if not self._solo:
            self._register_hooks()

    def _check_layout(self):
        """Raises on every rank when the ranks' parameter lists differ (names, shapes, dtypes)."""
        # A rank that joined a running elastic job (generation > 0 at once) checks nothing: the
        # others are training, not building their optimizer, and the state's sync gives it rank
        # 0's parameters.
        if self._solo or _core.generation() > 0:
            return
        layout = [(self._names[p], tuple(p.shape), str(p.dtype))
                  for b in self._buckets for p in b.params]
        layouts = trainrun.allgather_object(layout, process_set=self._process_set)
        for r, other in enumerate(layouts):
            if other != layouts[0]:
                diff = next((f"{a} vs {b}" for a, b in zip(layouts[0], other) if a != b),
                            f"{len(layouts[0])} vs {len(other)} parameters")
                raise trainrun.InvalidArgumentError(
                    f"DistributedOptimizer: rank {r}'s parameters differ from rank 0's ({diff}); "
                    "every rank must build the same model")

    def _register_hooks(self):
        for b in self._buckets:
            for p in b.params:
                hook_after_accumulation(p, self._make_hook(p), self._grad_accumulators)

    def _make_hook(self, p):
        def hook(*unused):
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "step() or synchronize(); raise backward_passes_per_step to accumulate more")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                bucket = self._bucket_of[p]
                bucket.waiting -= 1
                if bucket.waiting == 0:
                    self._launch_ready()

        return hook

    def _launch(self, bucket):
        bucket.gather_grads()
        wire = bucket.flat
        if self._prescale != 1.0:
            wire.mul_(self._prescale)
        if self._wire_dtype is not None and bucket.flat.dtype.is_floating_point:
            # Compressed: what goes on the wire. The buffer is kept for the next steps: a fresh
            # tensor.to(float16) each step cost 30x the copy_ into a kept one (torch 1.13, CPU).
            if bucket.wire_buffer is None:
                bucket.wire_buffer = torch.empty_like(bucket.flat, dtype=self._wire_dtype)
            wire = bucket.wire_buffer
            wire.copy_(bucket.flat)
        bucket.wire = wire
        buf = _buffers.view(wire, "DistributedOptimizer", True)
        ptr = wire.data_ptr()
        bucket.handle = _core.allreduce_async(ptr, ptr, wire.numel(), buf.dtype, self._op,
                                              self._set_id,
                                              f"DistributedOptimizer bucket {bucket.index}",
                                              [wire.numel()], True, buf.device, buf.stream)

    def _finish(self, bucket):
        if bucket.wire is not bucket.flat:
            bucket.flat.copy_(bucket.wire)  # decompress
        bucket.wire = None
        if self._postscale != 1.0:
            bucket.flat.mul_(self._postscale)
        bucket.restore_sparse()

    def _launch_ready(self):
        while (self._next_launch < len(self._buckets)
               and self._buckets[self._next_launch].waiting == 0):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def synchronize(self):
        """Waits until every gradient is averaged across ranks (launching any bucket not yet
        launched, with zeros for parameters that got no gradient)."""
        if self._solo:
            if self._process_set.included():
                # As Horovod at size 1: a parameter that got no gradient gets zeros, as it would
                # after an allreduce.
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.requires_grad and p.grad is None:
                            p.grad = torch.zeros_like(p)
            self._synchronized = True
            return
        while self._next_launch < len(self._buckets):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1
        error = None
        for b in self._buckets:
            if b.handle is not None:
                try:
                    _core.wait(b.handle)
                    self._finish(b)
                except trainrun.Error as e:  # Wait for all, then report the first failure.
                    error = error or e
                b.handle = None
            b.waiting = len(b.params)
        for p in self._delay:
            self._delay[p] = self._backward_passes_per_step
        self._next_launch = 0
        if error is not None:
            raise error
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Within it, step() does not synchronize (call synchronize() yourself first), e.g. to
        clip the averaged gradients between synchronize() and step()."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced again. "
                              "Wrap step() in optimizer.skip_synchronize() when you call "
                              "synchronize() yourself")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=False):
        if self._solo:
            return super(self.__class__, self).zero_grad(set_to_none=set_to_none)
        if any(b.handle is not None for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        # Gradients are views into the buckets: zero them in place rather than dropping them, so
        # the next backward accumulates straight into the reduced buffers.
        # (So with set_to_none=True they stay zeroed views, not None.)
        for b in self._buckets:
            b.flat.zero_()
            for p, v in zip(b.params, b.views):
                if p.grad is not None and (p.grad.is_sparse or p.grad.data_ptr() != v.data_ptr()):
                    p.grad = None  # not yet a bucket view (no backward since the wrap)
        return None


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         bucket_bytes=None):
    """Wraps `optimizer` so that step() applies gradients averaged (op) across all ranks.

    As horovod.torch.DistributedOptimizer: returns an instance of a subclass of optimizer's class,
    built on optimizer.param_groups (so pass a freshly made optimizer), whose step() first calls
    synchronize(). Gradient allreduces start during backward (see the module comment).

    named_parameters: model.named_parameters(), used to name parameters in error messages and to
      check every rank built the same model. op: trainrun.Average (default), trainrun.Sum, or
      trainrun.Adasum: Horovod's Adasum optimizer (adasum_optimizer.py), which reduces each
      parameter's update rather than its gradient; do not scale the learning rate by size().
    compression: Compression.none, .fp16 or .bf16; the last two send each bucket as 2-byte floats
      (half float32's bytes) and restore the gradient's dtype after.
    backward_passes_per_step: backward passes that accumulate locally before one allreduce.
    gradient_predivide_factor: with op=Average, gradients are divided by it before the sum and
      the sum by size/factor after (Horovod's split of the averaging, e.g. against fp16 overflow).
    num_groups, groups: Horovod's fusion hints; trainrun fuses gradients into buckets of
      bucket_bytes (default TRAINRUN_BUCKET_BYTES, 1 MiB) in backward order, which the hints do
      not change; they are accepted so scripts port.
    sparse_as_dense: sparse gradients are always reduced as dense in trainrun and handed back
      sparse (so torch.optim.SparseAdam works), whether True or False.
    process_set: the ranks whose gradients are averaged together; a rank outside it steps on its
      own gradients.
    """
    if compression is None or compression == "none":
        compression = Compression.none
    wire_dtype = None
    if compression is Compression.fp16:
        wire_dtype = torch.float16
    elif compression is Compression.bf16:
        wire_dtype = torch.bfloat16
    elif compression is not Compression.none:
        raise trainrun.InvalidArgumentError(
            f"DistributedOptimizer: compression must be Compression.none, .fp16 or .bf16, got "
            f"{compression!r}")
    if op is None:
        op = trainrun.Average
    if op not in (trainrun.Average, trainrun.Sum, trainrun.Adasum):
        raise trainrun.InvalidArgumentError(
            f"DistributedOptimizer: op must be trainrun.Average, Sum or Adasum, got {op!r}")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise trainrun.InvalidArgumentError(
            f"DistributedOptimizer: backward_passes_per_step must be a positive integer, "
            f"got {backward_passes_per_step!r}")
    if process_set is not None and process_set.process_set_id is None:
        raise trainrun.InvalidArgumentError(
            f"DistributedOptimizer: {process_set!r} is not registered; make it with "
            "add_process_set()")
    if gradient_predivide_factor != 1.0 and op != trainrun.Average:
        raise trainrun.InvalidArgumentError(
            "DistributedOptimizer: gradient_predivide_factor needs op=Average")
    if op == trainrun.Adasum and trainrun.size() > 1:  # at one rank, as any op: Horovod's rule
        return make_adasum_optimizer(optimizer, named_parameters, compression,
                                     backward_passes_per_step, process_set)
    if bucket_bytes is None:
        bucket_bytes = _bucket_bytes()
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, op, backward_passes_per_step,
               bucket_bytes, wire_dtype, gradient_predivide_factor, process_set)
