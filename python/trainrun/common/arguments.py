"""The collectives' argument checks (ops, splits, the rows a reducescatter gives each rank, who
scales an allreduce), and what a rank does with the arguments it refuses: it tells the other ranks
of the process set (_refuse, Communicator::Refuse), so that the ranks that made the call raise
MismatchError too instead of waiting for this one, and then raises its own error."""

from trainrun import _buffers
from trainrun import _core
from trainrun.common.exceptions import Error, InvalidArgumentError, MismatchError
from trainrun.common.process_sets import _set_id

ReduceOp = _core.ReduceOp
Average = ReduceOp.Average


def _check_op(op, what):
    if op is None:
        return Average
    if not isinstance(op, ReduceOp):
        raise InvalidArgumentError(
            f"{what}: op must be trainrun.Sum, Average, Min, Max, Product or Adasum, got {op!r}")
    return op


def _scaling(core_scales, prescale_factor, postscale_factor):
    """(the core's prescale, the core's postscale, Python's prescale, Python's postscale) of an
    allreduce: GPU arrays other than torch tensors (CuPy's, JAX's, any __cuda_array_interface__
    object; `core_scales`) are scaled by the core in stream order, over NCCL within the allreduce
    (one PreMulSum op), else in pinned host memory, so they need no arithmetic of their own;
    anything else is scaled in Python (_buffers.scale_)."""
    if core_scales:
        return float(prescale_factor), float(postscale_factor), 1.0, 1.0
    return 1.0, 1.0, prescale_factor, postscale_factor


def _refuse(error, set_id, collective, name, match=None):
    """Tells the other ranks of process set `set_id` that this rank refused its `collective`
    named `name` for its arguments (`error`, which the caller raises next), so that the ranks that
    made the call raise MismatchError too instead of waiting for this one, and the next collective
    is correct (Communicator::Refuse). A mismatch was told already."""
    if isinstance(error, MismatchError):
        return
    try:
        _core.wait(_core.refuse_async(set_id, collective, name or "", match))
    except InvalidArgumentError:
        pass  # some ranks made the call: they raise, and this rank raises its own error


def _view_refused(tensor, what, writable, process_set, collective, name, match=None):
    """_buffers.view, its refusal told to the other ranks (_refuse) when the process set is
    valid (a bad one stays this rank's own error)."""
    try:
        return _buffers.view(tensor, what, writable=writable)
    except InvalidArgumentError as e:
        error = e
    try:
        set_id = _set_id(process_set, what)
    except Error:
        raise error from None
    _refuse(error, set_id, collective, name, match)
    raise error


def _grouped_first_name(tensors, name, what):
    """The name of a grouped allreduce's first collective (that of its first tensor's element
    type, `name#float32`), or `name` when even the first tensor is refused."""
    if not name:
        return name
    try:
        return f"{name}#{_buffers.view(tensors[0], what, writable=False).dtype_name}"
    except Error:
        return name


def _scatter_rows(rows, n):
    """Rows of each rank's part: as even as possible, the first ranks taking one more."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def _scatter_kind(tensor, n, what):
    """The collective a reducescatter of `tensor` starts with: a reducescatter when its rows
    divide evenly among n ranks, else an allreduce (see below)."""
    try:
        shape = _buffers.view(tensor, what, writable=False).shape
    except Error:
        return "reducescatter"
    parts = _scatter_rows(shape[0], n) if len(shape) else [0]
    return "reducescatter" if all(p == parts[0] for p in parts) else "allreduce"


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
