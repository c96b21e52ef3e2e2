"""trainrun's collectives on NumPy arrays and torch tensors, against NumPy references."""

import os

import numpy as np
import pytest
import torch

import trainrun
from trainrun import _core

OPS = [trainrun.Sum, trainrun.Average, trainrun.Min, trainrun.Max, trainrun.Product]
NUMPY_DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8"]
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
                "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16}
COUNT = 1031  # not a multiple of any size, so ring chunks are uneven


def contribution(rank, dtype, op, count=COUNT):
    """Rank `rank`'s input, as float64, chosen so sums and products are exact in every dtype."""
    rng = np.random.default_rng(1000 * rank + int(op) * 17 + len(dtype))
    signed = dtype != "uint8"
    floating = dtype.startswith(("float", "bfloat"))
    if op == trainrun.Product:
        choices = [1, 2, -1] if signed else [1, 2]
        values = rng.choice(choices, size=count).astype(np.float64)
        return values / 2 if floating else values
    values = rng.integers(-20 if signed else 0, 21 if signed else 41, size=count)
    return values / 4 if floating else values.astype(np.float64)


def reference(dtype, op, size, count=COUNT):
    parts = np.stack([contribution(r, dtype, op, count) for r in range(size)])
    if op == trainrun.Sum:
        return parts.sum(axis=0)
    if op == trainrun.Average:
        mean = parts.sum(axis=0) / size
        return mean if dtype.startswith(("float", "bfloat")) else np.trunc(mean)
    if op == trainrun.Min:
        return parts.min(axis=0)
    if op == trainrun.Max:
        return parts.max(axis=0)
    return parts.prod(axis=0)


def tolerance(dtype):
    return {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6}.get(dtype, 1e-12)


def test_rank_layout():
    assert 0 <= trainrun.rank() < trainrun.size()
    assert 0 <= trainrun.local_rank() < trainrun.local_size()
    assert 0 <= trainrun.cross_rank() < trainrun.cross_size()
    ranks = trainrun.allgather(np.array([trainrun.rank()], dtype=np.int64))
    assert ranks.tolist() == list(range(trainrun.size()))


def test_supported_dtypes():
    assert set(trainrun.supported_dtypes()) == set(TORCH_DTYPES) | {"bool"}


def test_bool_reduces_as_or_and_and():
    mine = torch.tensor([trainrun.rank() == 0, True, False])
    assert trainrun.allreduce(mine, op=trainrun.Sum).tolist() == [True, True, False]
    assert trainrun.allreduce(mine, op=trainrun.Min).tolist() == [trainrun.size() == 1, True,
                                                                 False]
    assert trainrun.broadcast(mine, root_rank=0).tolist() == [True, True, False]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_allreduce(dtype, op):
    mine = contribution(trainrun.rank(), dtype, op).astype(dtype)
    before = mine.copy()
    out = trainrun.allreduce(mine, op=op)
    assert out.dtype == np.dtype(dtype) and out.shape == mine.shape
    np.testing.assert_array_equal(mine, before)  # out of place leaves the input alone
    expected = reference(dtype, op, trainrun.size())
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tolerance(dtype))

    result = trainrun.allreduce_(mine, op=op)
    assert result is mine
    np.testing.assert_array_equal(mine, out)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_torch_allreduce_in_place(dtype, op):
    values = contribution(trainrun.rank(), dtype, op)
    t = torch.tensor(values, dtype=torch.float64).to(TORCH_DTYPES[dtype]).reshape(1031, 1)
    address = t.data_ptr()
    result = trainrun.allreduce_(t, op=op)
    assert result is t and t.data_ptr() == address  # in place, no copy
    expected = reference(dtype, op, trainrun.size()).reshape(1031, 1)
    np.testing.assert_allclose(t.double().numpy(), expected, rtol=tolerance(dtype))


def test_default_op_is_average():
    out = trainrun.allreduce(np.full(5, float(trainrun.rank()), dtype=np.float64))
    np.testing.assert_allclose(out, np.full(5, (trainrun.size() - 1) / 2))


@pytest.mark.parametrize("count", [0, 1, 7, 300001])
def test_allreduce_sizes(count):
    x = np.arange(count, dtype=np.float32) + trainrun.rank()
    out = trainrun.allreduce(x, op=trainrun.Sum)
    size = trainrun.size()
    np.testing.assert_allclose(out, np.arange(count) * size + size * (size - 1) / 2, rtol=1e-6)


def test_allreduce_keeps_multidimensional_shape():
    x = torch.ones(2, 3, 4)
    out = trainrun.allreduce(x, op=trainrun.Sum)
    assert out.shape == (2, 3, 4) and torch.all(out == trainrun.size())


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast(root):
    root = root % trainrun.size()
    x = np.full((3, 5), trainrun.rank(), dtype=np.int64)
    out = trainrun.broadcast(x, root_rank=root)
    assert (out == root).all() and (x == trainrun.rank()).all()
    t = torch.full((17,), float(trainrun.rank()), dtype=torch.bfloat16)
    trainrun.broadcast_(t, root_rank=root)
    assert torch.all(t == root)


def test_allgather_equal_and_ragged():
    r, n = trainrun.rank(), trainrun.size()
    out = trainrun.allgather(np.full((2, 3), r, dtype=np.float32))
    assert out.shape == (2 * n, 3)
    np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(n), 2))
    ragged = trainrun.allgather(torch.full((r + 1, 2), r, dtype=torch.int32))
    expected = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)])
    assert torch.equal(ragged, expected)


def test_async_allreduce_and_objects():
    tensors = [torch.full((100 * (i + 1),), float(trainrun.rank() + i)) for i in range(4)]
    handles = [trainrun.allreduce_async_(t, op=trainrun.Sum) for t in tensors]
    for i, (h, t) in enumerate(zip(handles, tensors)):
        assert trainrun.synchronize(h) is t
        n = trainrun.size()
        assert torch.all(t == n * i + n * (n - 1) / 2)
    assert trainrun.broadcast_object({"rank": trainrun.rank()}, root_rank=0) == {"rank": 0}
    assert trainrun.allgather_object(trainrun.rank()) == list(range(trainrun.size()))
    trainrun.barrier()


def _timeline_allreduces(run):
    """Runs `run()` under a timeline and returns this rank's allreduce events (name, bytes)."""
    import json
    import tempfile

    path = trainrun.broadcast_object(tempfile.mktemp(prefix="trainrun-fusion-", suffix=".json")
                                     if trainrun.rank() == 0 else None)
    trainrun.start_timeline(path)
    try:
        run()
    finally:
        trainrun.stop_timeline()
    trainrun.barrier()
    text = open(path).read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    trainrun.barrier()
    if trainrun.rank() == 0:
        os.unlink(path)
    return [(e["name"], e["args"]["bytes"]) for e in events
            if e.get("ph") == "X" and e.get("cat") != "phase" and e["pid"] == trainrun.rank()
            and e["name"].startswith("allreduce")]


def test_async_allreduces_run_fused():
    # Horovod's tensor fusion: allreduce_async_ calls queued one after another run as one
    # allreduce, each tensor still getting its own result; a change of dtype or op, or a tensor
    # queued twice, starts a new group.
    n = trainrun.size()
    count = 60
    tensors = [torch.full((100 + 37 * i,), float(trainrun.rank() + i)) for i in range(count)]
    doubles = [torch.full((5,), float(trainrun.rank()), dtype=torch.float64) for _ in range(3)]
    twice = torch.ones(7)

    def run():
        handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"fused.{i}")
                   for i, t in enumerate(tensors)]
        handles += [trainrun.allreduce_async_(d, op=trainrun.Sum, name=f"double.{i}")
                    for i, d in enumerate(doubles)]
        handles.append(trainrun.allreduce_async_(twice, op=trainrun.Sum, name="twice.a"))
        handles.append(trainrun.allreduce_async_(twice, op=trainrun.Sum, name="twice.b"))
        handles.append(trainrun.allreduce_async_(torch.full((3,), 2.0), op=trainrun.Max,
                                                 name="max"))
        results = [trainrun.synchronize(h) for h in handles]
        for i, t in enumerate(tensors):
            assert results[i] is t
            assert torch.all(t == n * i + n * (n - 1) / 2), f"tensor {i}: {t[:3]}"
        for d in doubles:
            assert torch.all(d == n * (n - 1) / 2)
        assert torch.all(twice == n * n)  # reduced twice, as two calls would
        assert torch.all(results[-1] == 2.0)

    events = _timeline_allreduces(run)
    names = [name for name, _ in events]
    if n == 1:
        return
    # Fewer collectives than calls: the 60 float32 tensors went in a few groups (as many as the
    # ranks had queued when their thread looked), whose events carry the first tensor's name
    # and the whole group's bytes.
    fused = [(name, b) for name, b in events if name.startswith("allreduce fused.")]
    assert len(fused) <= count // 2, names
    assert sum(b for _, b in fused) == sum(4 * t.numel() for t in tensors)
    assert "allreduce twice.a" in names and "allreduce twice.b" in names, names
    assert "allreduce max" in names, names


def test_fusion_off_runs_every_allreduce_alone():
    old = os.environ.get("TRAINRUN_FUSION_BYTES")
    os.environ["TRAINRUN_FUSION_BYTES"] = "0"
    trainrun.shutdown()
    trainrun.init()
    try:
        tensors = [torch.full((10,), 1.0) for _ in range(8)]

        def run():
            handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"alone.{i}")
                       for i, t in enumerate(tensors)]
            for h in handles:
                assert torch.all(trainrun.synchronize(h) == trainrun.size())

        events = _timeline_allreduces(run)
        if trainrun.size() > 1:
            assert [name for name, _ in events] == [f"allreduce alone.{i}" for i in range(8)]
    finally:
        if old is None:
            del os.environ["TRAINRUN_FUSION_BYTES"]
        else:
            os.environ["TRAINRUN_FUSION_BYTES"] = old
        trainrun.shutdown()
        trainrun.init()


def test_many_handles_collected_in_any_order():
    # More handles in flight than the communication thread keeps in its ring of outcomes (4096,
    # comm_thread.h): the oldest move aside and are still found. Synchronized last first, then
    # first to last; poll answers for both kinds; a handle synchronized twice is refused.
    n = trainrun.size()
    count = 5000
    tensors = [torch.full((1 + i % 3,), float(i)) for i in range(count)]
    handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"many.{i}")
               for i, t in enumerate(tensors)]
    assert trainrun.synchronize(handles[-1]) is tensors[-1]
    assert trainrun.poll(handles[0]) in (True, False)
    assert trainrun.poll(handles[-2]) in (True, False)
    for i, h in enumerate(handles[:-1]):
        assert trainrun.synchronize(h) is tensors[i]
    for i, t in enumerate(tensors):
        assert torch.all(t == n * i), f"tensor {i}: {t}"
    for h in (handles[0], handles[count // 2], handles[-1]):
        with pytest.raises(trainrun.InvalidArgumentError, match="not a pending operation"):
            trainrun.synchronize(h)


def test_mismatch_within_fused_allreduces_names_the_culprit():
    # Ranks that disagree on one of many queued allreduces: that one raises MismatchError naming
    # the ranks and the shapes, as it would alone; the others are reduced; the job goes on.
    if trainrun.size() == 1:
        pytest.skip("needs two ranks")
    n = trainrun.size()
    tensors = [torch.ones(50) for _ in range(12)]
    tensors[7] = torch.ones(50 + (1 if trainrun.rank() == 1 else 0))
    handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"g.{i}")
               for i, t in enumerate(tensors)]
    for i, h in enumerate(handles):
        if i == 7:
            with pytest.raises(trainrun.MismatchError,
                               match=r"rank 0 called allreduce 'g\.7' of float32\[50\] \(op sum\) "
                                     r"but rank 1 called allreduce 'g\.7' of float32\[51\]"):
                trainrun.synchronize(h)
        else:
            assert torch.all(trainrun.synchronize(h) == n), i
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [n] * 2


def test_grouped_allreduce_reads_torch_and_numpy_in_one_pass():
    # The list is read in C++ (fast_calls.h): torch tensors and NumPy arrays, mixed, of several
    # dtypes (one collective each), shapes kept, in place; a tuple too; a generator goes the
    # Python way, with the same results.
    n, r = trainrun.size(), trainrun.rank()
    tensors = [torch.full((3, 4), float(r)), np.full(5, r, dtype=np.float32),
               torch.full((7,), float(r), dtype=torch.float64), np.full((2, 2), r, dtype=np.int64),
               torch.full((2,), float(r), dtype=torch.bfloat16), np.full(3, r % 2 == 0),
               torch.empty(0)]
    addresses = [t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data for t in tensors]
    out = trainrun.grouped_allreduce_(tensors, op=trainrun.Sum, name="mixed")
    assert isinstance(out, list) and all(a is b for a, b in zip(out, tensors))
    total = n * (n - 1) / 2
    assert torch.all(tensors[0] == total) and tensors[0].shape == (3, 4)
    np.testing.assert_array_equal(tensors[1], np.full(5, total, dtype=np.float32))
    assert torch.all(tensors[2] == total) and tensors[2].dtype == torch.float64
    np.testing.assert_array_equal(tensors[3], np.full((2, 2), total, dtype=np.int64))
    assert torch.all(tensors[4] == total)
    np.testing.assert_array_equal(tensors[5], np.full(3, True))  # logical or
    assert [t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data
            for t in tensors] == addresses  # in place
    averaged = trainrun.grouped_allreduce_((torch.full((4,), float(r)), torch.ones(2)))
    assert torch.all(averaged[0] == (n - 1) / 2) and torch.all(averaged[1] == 1)
    generated = trainrun.grouped_allreduce_((torch.full((3,), 1.0) for _ in range(2)),
                                            op=trainrun.Sum)
    assert len(generated) == 2 and all(torch.all(t == n) for t in generated)


def test_fast_calls_share_names_handles_and_errors_with_the_python_way():
    # allreduce_async_, synchronize and poll are C functions for the common case; everything else
    # goes the Python way. Names in flight, handles and errors are the same either way.
    import inspect

    assert list(inspect.signature(trainrun.allreduce_async_).parameters) == [
        "tensor", "op", "name", "process_set", "prescale_factor", "postscale_factor"]
    assert trainrun.synchronize.__name__ == "synchronize"
    n = trainrun.size()
    t = torch.ones(6)
    h = trainrun.allreduce_async_(t, op=trainrun.Sum, name="shared.name")
    with pytest.raises(trainrun.InvalidArgumentError, match="'shared.name' is already in flight"):
        trainrun.allreduce_async_(torch.ones(6), trainrun.Sum, "shared.name", None, 2.0)  # Python
    with pytest.raises(trainrun.InvalidArgumentError, match="'shared.name' is already in flight"):
        trainrun.allreduce_async_(torch.ones(6), op=trainrun.Sum, name="shared.name")
    with pytest.raises(trainrun.InvalidArgumentError, match="'shared.name' is already in flight"):
        trainrun.grouped_allreduce_async_([torch.ones(2)], op=trainrun.Sum, name="shared.name")
    assert trainrun.poll(h) in (True, False)
    assert trainrun.synchronize(h) is t and torch.all(t == n)
    with pytest.raises(trainrun.InvalidArgumentError, match="not a pending operation"):
        trainrun.synchronize(h)
    with pytest.raises(trainrun.InvalidArgumentError, match="not a pending operation"):
        trainrun.poll(h)
    # The name is free again; scaling, numpy and a process set go the Python way.
    a = np.full(4, 2.0, dtype=np.float32)
    handles = [trainrun.allreduce_async_(torch.ones(3), op=trainrun.Sum, name="shared.name",
                                         prescale_factor=2.0, postscale_factor=0.5),
               trainrun.allreduce_async_(a, trainrun.Max),
               trainrun.allreduce_async_(torch.ones(2), op=trainrun.Sum,
                                         process_set=trainrun.global_process_set),
               trainrun.grouped_allreduce_async_([torch.ones(2)], op=trainrun.Sum,
                                                 prescale_factor=3.0)]
    assert all(isinstance(h, int) for h in handles) and len(set(handles)) == len(handles)
    while not all(trainrun.poll(h) for h in handles):
        pass
    results = [trainrun.synchronize(h) for h in handles]
    assert torch.all(results[0] == n) and results[1] is a and (a == 2.0).all()
    assert torch.all(results[2] == n) and torch.all(results[3][0] == 3 * n)
    # Errors are the Python way's: the culprit named, Python's own TypeError for a wrong call.
    with pytest.raises(trainrun.InvalidArgumentError, match="not contiguous"):
        trainrun.allreduce_async_(torch.ones(4, 6).t())
    with pytest.raises(trainrun.InvalidArgumentError, match="read-only"):
        ro = np.ones(3)
        ro.flags.writeable = False
        trainrun.allreduce_async_(ro)
    with pytest.raises(trainrun.InvalidArgumentError, match="op must be"):
        trainrun.allreduce_async_(torch.ones(2), op="sum")
    with pytest.raises(TypeError):
        trainrun.allreduce_async_(torch.ones(2), colour="red")
    with pytest.raises(trainrun.InvalidArgumentError, match="the list of tensors is empty"):
        trainrun.grouped_allreduce_([])
    with pytest.raises(trainrun.InvalidArgumentError, match="not contiguous"):
        trainrun.grouped_allreduce_([torch.ones(2), torch.ones(4, 6).t()])
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [n] * 2


def test_the_core_refuses_scaling_factors_for_host_buffers():
    """prescale and postscale are for GPU buffers: for host memory (which trainrun's Python
    scales itself) the core refuses them in one sentence, before anything is queued."""
    from trainrun import _buffers

    a, b = np.ones(4, np.float32), np.ones(3, np.float32)
    code = _buffers.view(a, "test", writable=True).dtype
    grouped = ("^a grouped allreduce of host buffers got prescale or postscale factors; they are "
               "for GPU buffers, and the caller scales a host buffer itself$")
    for factors in ({"prescale": 2.0}, {"postscale": 0.5}):
        with pytest.raises(trainrun.InvalidArgumentError, match=grouped):
            _core.grouped_allreduce_async([a.ctypes.data, b.ctypes.data], [4, 3], code,
                                          trainrun.Sum, **factors)
    with pytest.raises(trainrun.InvalidArgumentError, match="^an allreduce of a host buffer got "
                       "prescale or postscale factors; they are for GPU buffers"):
        _core.allreduce_async(a.ctypes.data, a.ctypes.data, 4, code, trainrun.Sum, prescale=2.0)
    assert (a == 1).all() and (b == 1).all()
    # Nothing was queued: the next collective meets the other ranks' next one.
    assert (trainrun.grouped_allreduce([a, b], op=trainrun.Sum)[1] == trainrun.size()).all()


def test_grouped_allreduce_mismatch_names_the_culprit():
    if trainrun.size() == 1:
        pytest.skip("needs two ranks")
    tensors = [torch.ones(4), torch.ones(5 + (1 if trainrun.rank() == 1 else 0))]
    with pytest.raises(trainrun.MismatchError,
                       match=r"rank 0 called allreduce 'uneven#float32' of float32\[2, 4, 5\] "
                             r"\(op sum\) but rank 1 called allreduce 'uneven#float32' of "
                             r"float32\[2, 4, 6\]"):
        trainrun.grouped_allreduce_(tensors, op=trainrun.Sum, name="uneven")
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [trainrun.size()] * 2


# --- Bad input: a clear exception on every rank, and the job goes on ------------------------------


def test_unsupported_dtype_raises():
    with pytest.raises(trainrun.InvalidArgumentError, match="element type complex64"):
        trainrun.allreduce(np.ones(3, dtype=np.complex64))
    with pytest.raises(trainrun.InvalidArgumentError, match="element type complex128"):
        trainrun.broadcast(torch.ones(3, dtype=torch.complex128))


def test_non_contiguous_raises():
    with pytest.raises(trainrun.InvalidArgumentError, match="not contiguous"):
        trainrun.allreduce_(torch.ones(4, 6).t())
    with pytest.raises(trainrun.InvalidArgumentError, match="not C-contiguous"):
        trainrun.allreduce(np.ones((4, 6))[:, ::2])


def test_bad_op_and_root_raise():
    with pytest.raises(trainrun.InvalidArgumentError, match="op must be"):
        trainrun.allreduce(np.ones(3), op="sum")
    with pytest.raises(trainrun.InvalidArgumentError, match="root_rank"):
        trainrun.broadcast(np.ones(3), root_rank=trainrun.size())


def test_mismatched_shapes_across_ranks_raise():
    x = np.ones(3 + trainrun.rank(), dtype=np.float32)
    if trainrun.size() == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(trainrun.MismatchError, match=r"rank 0 called allreduce of float32\[3\].*"
                       r"rank 1 called allreduce of float32\[4\]"):
        trainrun.allreduce(x)
    dtype = np.float32 if trainrun.rank() == 0 else np.float64
    with pytest.raises(trainrun.MismatchError, match="float32.*float64"):
        trainrun.allreduce_(np.ones(4, dtype=dtype))
    with pytest.raises(trainrun.MismatchError, match=r"allgather of float64\[\*, 1\]"):
        trainrun.allgather(np.ones((2, 1 + trainrun.rank())))
    with pytest.raises(trainrun.InvalidArgumentError, match="allreduce of .* broadcast of"):
        if trainrun.rank() == 0:
            trainrun.allreduce(np.ones(2))
        else:
            trainrun.broadcast(np.ones(2))
    # The communicator is still healthy afterwards.
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [trainrun.size()] * 2


def test_read_only_and_foreign_objects():
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(trainrun.InvalidArgumentError, match="read-only"):
        trainrun.allreduce_(ro)
    with pytest.raises(trainrun.InvalidArgumentError, match="in-place"):
        trainrun.allreduce_([1.0, 2.0])
    # Out of place takes anything NumPy can read.
    np.testing.assert_allclose(trainrun.allreduce([1.0, 2.0], op=trainrun.Sum),
                               [trainrun.size(), 2 * trainrun.size()])


def test_errors_are_trainrun_errors():
    assert issubclass(trainrun.InvalidArgumentError, trainrun.Error)
    assert issubclass(trainrun.InvalidArgumentError, ValueError)
    assert issubclass(trainrun.IoError, trainrun.Error)
    assert issubclass(trainrun.TimeoutError, trainrun.Error)
    with pytest.raises(trainrun.InvalidArgumentError, match="not a pending operation"):
        trainrun.synchronize(10 ** 9)


def test_forked_child_is_refused():
    pid = os.fork()
    if pid == 0:  # e.g. a DataLoader worker: must not touch the parent's connections
        try:
            trainrun.allreduce(np.ones(2))
            os._exit(1)
        except trainrun.Error as e:
            os._exit(0 if "forked" in str(e) else 2)
        except BaseException:  # pylint: disable=broad-except
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [trainrun.size()] * 2


def test_fusion_threshold_and_bucket_size_are_two_settings():
    saved = {n: os.environ.get(n) for n in
             ("TRAINRUN_FUSION_BYTES", "TRAINRUN_FUSION_THRESHOLD_BYTES", "TRAINRUN_BUCKET_BYTES")}
    try:
        for name in saved:
            os.environ.pop(name, None)
        assert _core.int_setting("TRAINRUN_FUSION_THRESHOLD_BYTES") == 64 << 20
        assert _core.int_setting("TRAINRUN_BUCKET_BYTES") == 1 << 20
        os.environ["TRAINRUN_BUCKET_BYTES"] = "12345"
        assert _core.int_setting("TRAINRUN_BUCKET_BYTES") == 12345
        assert _core.int_setting("TRAINRUN_FUSION_THRESHOLD_BYTES") == 64 << 20
        # The old name sets whichever of the two is unset.
        os.environ["TRAINRUN_FUSION_BYTES"] = "777"
        assert _core.int_setting("TRAINRUN_FUSION_THRESHOLD_BYTES") == 777
        assert _core.int_setting("TRAINRUN_BUCKET_BYTES") == 12345
        os.environ["TRAINRUN_BUCKET_BYTES"] = "1MB"
        with pytest.raises(trainrun.InvalidArgumentError) as error:
            _core.int_setting("TRAINRUN_BUCKET_BYTES")
        assert str(error.value) == ("TRAINRUN_BUCKET_BYTES is '1MB'; set it to an integer of 0 "
                                    "or more (or unset it)")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_text_settings_read_as_declared():
    saved = os.environ.get("TRAINRUN_TRANSPORT")
    try:
        os.environ.pop("TRAINRUN_TRANSPORT", None)
        assert _core.string_setting("TRAINRUN_TRANSPORT") == "auto"
        os.environ["TRAINRUN_TRANSPORT"] = "shm"
        assert _core.string_setting("TRAINRUN_TRANSPORT") == "shm"
        os.environ["TRAINRUN_TRANSPORT"] = "udp"
        with pytest.raises(trainrun.InvalidArgumentError) as error:
            _core.string_setting("TRAINRUN_TRANSPORT")
        assert str(error.value) == ("TRAINRUN_TRANSPORT is 'udp'; set it to auto, tcp or shm (or "
                                    "unset it)")
        with pytest.raises(trainrun.InvalidArgumentError) as error:
            _core.string_setting("TRAINRUN_TIMEOUT")
        assert str(error.value) == "TRAINRUN_TIMEOUT is not a text setting"
    finally:
        if saved is None:
            os.environ.pop("TRAINRUN_TRANSPORT", None)
        else:
            os.environ["TRAINRUN_TRANSPORT"] = saved
