"""trainrun's collectives on GPU arrays, run here over the tests' CPU fake of a GPU runtime: every
collective and dtype against a float64 reference, stream order without synchronize, many
collectives in flight collected in any order, pinned buffers reused, and the sentences for what
is missing. Every rank of a job runs this file (`trainrun -np N python -m pytest test_gpu_fake.py`).
"""

import os
import random
import time

import numpy
import pytest

import fake_cuda
import _fake_gpu
import trainrun

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8", "int16", "bool"]
OPS = [trainrun.Sum, trainrun.Average, trainrun.Min, trainrun.Max, trainrun.Product]


@pytest.fixture(scope="module", autouse=True)
def job():
    fake_cuda.install()
    trainrun.init()
    yield
    trainrun.shutdown()


def values(dtype, op, rank, n, offset=0):
    """Rank `rank`'s input: small integers, so every reduction of a few ranks is exact."""
    i = numpy.arange(offset, offset + n)
    if dtype == "bool":
        return ((i + rank) % 3 == 0)
    if op == trainrun.Product:
        v = numpy.where((i + rank) % 3 == 0, 2, 1)
    else:
        v = (i * 7 + rank * 3) % 11 - (0 if dtype == "uint8" else 5)
    return v.astype(dtype)


def reference(dtype, op, n, size, offset=0):
    stack = numpy.stack([values(dtype, op, r, n, offset).astype(numpy.float64)
                         for r in range(size)])
    if dtype == "bool":
        return (stack.max(0) if op in (trainrun.Sum, trainrun.Max) else stack.min(0)) != 0
    if op == trainrun.Sum:
        return stack.sum(0)
    if op == trainrun.Average:
        total = stack.sum(0) / size
        return total if dtype.startswith("float") else numpy.trunc(total)
    if op == trainrun.Min:
        return stack.min(0)
    if op == trainrun.Max:
        return stack.max(0)
    return stack.prod(0)


def close(got, want, dtype):
    tolerance = 1e-2 if dtype == "float16" else 1e-6
    numpy.testing.assert_allclose(numpy.asarray(got, numpy.float64),
                                  numpy.asarray(want, numpy.float64), rtol=tolerance,
                                  atol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_op_in_place_out_of_place_async(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    for op in OPS:
        if dtype == "bool" and op == trainrun.Average:
            continue
        for n in (1, 1000, 70001):
            x = fake_cuda.from_host(values(dtype, op, rank, n))
            out = trainrun.allreduce(x, op=op, name=f"a.{dtype}.{op}.{n}")
            assert isinstance(out, fake_cuda.FakeCudaArray)
            close(out.to_host(), reference(dtype, op, n, size), dtype)
            close(x.to_host(), values(dtype, op, rank, n), dtype)  # the input is untouched
            trainrun.allreduce_(x, op=op)
            close(x.to_host(), reference(dtype, op, n, size), dtype)
            y = fake_cuda.from_host(values(dtype, op, rank, n))
            h = trainrun.allreduce_async_(y, op=op, name=f"async.{dtype}")
            assert trainrun.synchronize(h) is y
            close(y.to_host(), reference(dtype, op, n, size), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_prescale_postscale(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    for op in (trainrun.Sum, trainrun.Average):
        x = fake_cuda.from_host(values(dtype, op, rank, 64))
        out = trainrun.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=3.0)
        close(out.to_host(), reference(dtype, op, 64, size) * 1.5, dtype)


class BareArray:
    """A GPU array with the CUDA Array Interface and nothing else: no arithmetic to scale itself
    with (as JAX's arrays, or a library's own buffers)."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def __cuda_array_interface__(self):
        return self.inner.__cuda_array_interface__


def scaled_reference(dtype, op, n, size, pre, post, offset=0):
    """The allreduce (Sum, Average or Max) of every rank's values times `pre`, times `post` after,
    as the core scales: integers through float64 and truncated (an integer average truncates)."""
    cut = (lambda v: v) if dtype.startswith("float") else numpy.trunc
    stack = numpy.stack([cut(values(dtype, op, r, n, offset).astype(numpy.float64) * pre)
                         for r in range(size)])
    want = stack.max(0) if op == trainrun.Max else stack.sum(0)
    if op == trainrun.Average:
        want = cut(want / size)
    return cut(want * post)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8"])
def test_prescale_postscale_of_an_array_that_cannot_scale_itself(dtype):
    """The core scales it (staged here: in pinned host memory, integers through float64 and
    truncated, as trainrun scales host arrays)."""
    size, rank = trainrun.size(), trainrun.rank()
    for op in (trainrun.Sum, trainrun.Average, trainrun.Max):
        x = fake_cuda.from_host(values(dtype, op, rank, 1000))
        bare = BareArray(x)
        with pytest.raises(TypeError):
            bare *= 2.0
        h = trainrun.allreduce_async_(bare, op=op, prescale_factor=0.5, postscale_factor=3.0,
                                      name=f"bare.{dtype}.{op}")
        assert trainrun.synchronize(h) is bare
        close(x.to_host(), scaled_reference(dtype, op, 1000, size, 0.5, 3.0), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8"])
def test_grouped_prescale_postscale_of_arrays_that_cannot_scale_themselves(dtype):
    """The core scales a grouped allreduce of them too, every buffer of the group (staged here),
    alone or grouped with arrays of another dtype (one core call per dtype, each scaled)."""
    size, rank = trainrun.size(), trainrun.rank()
    parts = [(1, 0), (1000, 1), (70001, 1001)]  # (count, offset into values)
    for op in (trainrun.Sum, trainrun.Average, trainrun.Max):
        xs = [fake_cuda.from_host(values(dtype, op, rank, n, offset)) for n, offset in parts]
        other = fake_cuda.from_host(values("float64", op, rank, 10))
        bares = [BareArray(x) for x in xs + [other]]
        h = trainrun.grouped_allreduce_async_(bares, op=op, prescale_factor=0.5,
                                              postscale_factor=3.0, name=f"gbare.{dtype}.{op}")
        assert all(a is b for a, b in zip(trainrun.synchronize(h), bares, strict=True))
        for x, (n, offset) in zip(xs, parts):
            close(x.to_host(), scaled_reference(dtype, op, n, size, 0.5, 3.0, offset), dtype)
        close(other.to_host(), scaled_reference("float64", op, 10, size, 0.5, 3.0), "float64")
        xs = [fake_cuda.from_host(values(dtype, op, rank, n, offset)) for n, offset in parts]
        trainrun.grouped_allreduce_([BareArray(x) for x in xs], op=op, postscale_factor=2.0)
        for x, (n, offset) in zip(xs, parts):
            close(x.to_host(), scaled_reference(dtype, op, n, size, 1.0, 2.0, offset), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_allreduce(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    xs = [fake_cuda.from_host(values(dtype, trainrun.Sum, rank, 10 + k, k)) for k in range(3)]
    outs = trainrun.grouped_allreduce(xs, op=trainrun.Sum)
    for k, out in enumerate(outs):
        close(out.to_host(), reference(dtype, trainrun.Sum, 10 + k, size, k), dtype)
    trainrun.grouped_allreduce_(xs, op=trainrun.Max)
    for k, x in enumerate(xs):
        close(x.to_host(), reference(dtype, trainrun.Sum, 10 + k, size, k) * 0 +
              numpy.maximum.reduce([values(dtype, trainrun.Sum, r, 10 + k, k).astype(float)
                                    for r in range(size)]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    root = size - 1
    x = fake_cuda.from_host(values(dtype, trainrun.Max, rank, 333))
    out = trainrun.broadcast(x, root_rank=root)
    close(out.to_host(), values(dtype, trainrun.Max, root, 333), dtype)
    trainrun.broadcast_(x, root_rank=0)
    close(x.to_host(), values(dtype, trainrun.Max, 0, 333), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_uneven_first_dimension(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    mine = values(dtype, trainrun.Max, rank, (rank + 1) * 3).reshape(rank + 1, 3)
    out = trainrun.allgather(fake_cuda.from_host(mine))
    want = numpy.concatenate([values(dtype, trainrun.Max, r, (r + 1) * 3).reshape(r + 1, 3)
                              for r in range(size)])
    assert out.shape == want.shape
    close(out.to_host(), want, dtype)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bool"])
def test_reducescatter(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    rows = 4 * size
    x = fake_cuda.from_host(values(dtype, trainrun.Sum, rank, rows * 5).reshape(rows, 5))
    out = trainrun.reducescatter(x, op=trainrun.Sum)
    want = reference(dtype, trainrun.Sum, rows * 5, size).reshape(rows, 5)[rank * 4:(rank + 1) * 4]
    close(out.to_host(), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall_with_splits(dtype):
    size, rank = trainrun.size(), trainrun.rank()
    splits = [rank + d + 1 for d in range(size)]
    x = fake_cuda.from_host(values(dtype, trainrun.Max, rank, sum(splits) * 2).reshape(-1, 2))
    out, received = trainrun.alltoall(x, splits=splits)
    parts = []
    for s in range(size):
        theirs = values(dtype, trainrun.Max, s, sum(s + d + 1 for d in range(size)) * 2)
        theirs = theirs.reshape(-1, 2)
        start = sum(s + d + 1 for d in range(rank))
        parts.append(theirs[start:start + s + rank + 1])
    close(out.to_host(), numpy.concatenate(parts), dtype)
    assert list(received) == [s + rank + 1 for s in range(size)]


def test_process_set():
    size, rank = trainrun.size(), trainrun.rank()
    if size < 2:
        pytest.skip("a process set of fewer ranks than the job needs 2 ranks")
    members = list(range(size - 1)) if size > 2 else [0, 1]
    ps = trainrun.add_process_set(members)
    try:
        if rank in members:
            x = fake_cuda.from_host(numpy.full(8, rank + 1, numpy.float32))
            trainrun.allreduce_(x, op=trainrun.Sum, process_set=ps)
            close(x.to_host(), numpy.full(8, sum(r + 1 for r in members)), "float32")
    finally:
        trainrun.remove_process_set(ps)


def test_stream_order_without_synchronize():
    """A "kernel" writes the array 300 ms after it is launched; the allreduce starts after it on
    the GPU, not the CPU (the call returns at once), and a later "kernel" on the stream reads the
    reduced values, with no synchronize of the stream anywhere but the reading test's."""
    size, rank = trainrun.size(), trainrun.rank()
    stream = fake_cuda.new_stream()
    x = fake_cuda.FakeCudaArray((4096,), numpy.float32, stream=stream)
    _fake_gpu.write_later(stream, x.ptr, numpy.full(4096, rank + 1, numpy.float32).tobytes(), 300)
    started = time.monotonic()
    h = trainrun.allreduce_async_(x, op=trainrun.Sum)
    assert time.monotonic() - started < 0.2
    trainrun.synchronize(h)
    numpy.testing.assert_array_equal(x.to_host(), numpy.full(4096, size * (size + 1) / 2))


def test_200_in_flight_collected_in_any_order():
    size, rank = trainrun.size(), trainrun.rank()
    stream = fake_cuda.new_stream()
    arrays = [fake_cuda.from_host(numpy.arange(k % 17 + 1, dtype=numpy.float32) + rank + k,
                                  stream=stream) for k in range(200)]
    handles = [trainrun.allreduce_async_(a, op=trainrun.Sum, name=f"inflight.{k}")
               for k, a in enumerate(arrays)]
    order = list(range(200))
    random.Random(rank).shuffle(order)
    for k in order:
        trainrun.synchronize(handles[k])
    for k, a in enumerate(arrays):
        base = numpy.arange(k % 17 + 1, dtype=numpy.float64)
        want = size * (base + k) + size * (size - 1) / 2
        numpy.testing.assert_array_equal(a.to_host(), want)


def test_pinned_buffers_reused():
    arrays = [fake_cuda.from_host(numpy.ones(n, numpy.float32)) for n in (100, 300000, 2000000)]

    def step():
        handles = [trainrun.allreduce_async_(a, op=trainrun.Sum) for a in arrays]
        for h in handles:
            trainrun.synchronize(h)

    for _ in range(3):
        step()
    warm = _fake_gpu.pinned_allocations()
    for _ in range(30):
        step()
    assert _fake_gpu.pinned_allocations() == warm


def test_poll_is_true_only_once_the_copy_back_has_landed():
    """The copy back into the array is held (after the host allreduce through the staging buffer;
    over shared memory, between the transport's chunks): poll() stays False (a handle is done when
    its results are on the GPU), then turns True once it lands."""
    size = trainrun.size()
    x = fake_cuda.from_host(numpy.ones(3 << 18, numpy.float32))  # 3 MiB: chunked
    _fake_gpu.hold_copies_to_device(True)
    try:
        h = trainrun.allreduce_async_(x, op=trainrun.Sum, name="poll.held")
        time.sleep(0.5)
        assert not trainrun.poll(h)
    finally:
        _fake_gpu.hold_copies_to_device(False)
    deadline = time.monotonic() + 30
    while not trainrun.poll(h) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert trainrun.poll(h)
    assert trainrun.synchronize(h) is x
    numpy.testing.assert_array_equal(x.to_host()[[0, -1]], [size, size])


def test_small_gpu_arrays_are_fused():
    """64 small in-place allreduces queued together cross between host and "device" memory far
    fewer than twice each (fused: gathered on the device, one copy down, one back)."""
    size, rank = trainrun.size(), trainrun.rank()
    stream = fake_cuda.new_stream()
    arrays = [fake_cuda.from_host(numpy.full(10 + k, rank + k, numpy.float32), stream=stream)
              for k in range(64)]
    arrays[0].to_host()  # the writes are done: only the collectives' copies are counted below
    trainrun.barrier()
    before = _fake_gpu.host_device_copies()
    fused_before = trainrun.gpu_info()["fused"]
    handles = [trainrun.allreduce_async_(a, op=trainrun.Sum, name=f"fuse.{k}")
               for k, a in enumerate(arrays)]
    for h in handles:
        trainrun.synchronize(h)
    crossings = _fake_gpu.host_device_copies() - before
    for k, a in enumerate(arrays):
        numpy.testing.assert_array_equal(a.to_host(), numpy.full(10 + k, size * k +
                                                                 size * (size - 1) / 2))
    assert crossings <= 64, crossings  # unfused: 128
    assert trainrun.gpu_info()["fused"] > fused_before


def test_join_with_gpu_arrays():
    """The last rank joins at once; the others reduce GPU arrays (one chunked, several fused) with
    its zeros, then join too."""
    size, rank = trainrun.size(), trainrun.rank()
    if size < 2:
        pytest.skip("join needs 2 ranks")
    if rank == size - 1:
        last = trainrun.join()
    else:
        others = size - 1
        big = fake_cuda.from_host(numpy.full(5 << 18, rank + 1, numpy.float32))
        trainrun.allreduce_(big, op=trainrun.Sum, name="join.big")
        small = [fake_cuda.from_host(numpy.full(7, rank + k, numpy.float32)) for k in range(5)]
        handles = [trainrun.allreduce_async_(a, op=trainrun.Sum) for a in small]
        for h in handles:
            trainrun.synchronize(h)
        numpy.testing.assert_array_equal(big.to_host()[[0, -1]], [others * (others + 1) / 2] * 2)
        for k, a in enumerate(small):
            numpy.testing.assert_array_equal(a.to_host(), numpy.full(
                7, others * k + others * (others - 1) / 2))
        last = trainrun.join()
    assert last == size - 2


def test_gpu_info_says_the_path():
    info = trainrun.gpu_info()
    assert info["path"] == "staged"
    assert "fake" in info["path_why"] or "has no NCCL" in info["path_why"]


def test_host_memory_behind_the_interface_is_one_sentence():
    class Liar:
        def __init__(self):
            self.a = numpy.ones(4, numpy.float32)

        @property
        def __cuda_array_interface__(self):
            return {"shape": (4,), "typestr": "<f4", "data": (self.a.ctypes.data, False),
                    "version": 3, "stream": 1}

    with pytest.raises(trainrun.InvalidArgumentError, match="points to host memory, not to a GPU"):
        trainrun.allreduce(Liar())


def test_missing_libraries_are_one_sentence_each(tmp_path):
    """A process whose TRAINRUN_NCCL_LIBRARY and TRAINRUN_CUDA_LIBRARY point nowhere: gpu_info()
    says so, and a GPU array without the fake is refused naming the missing CUDA runtime."""
    import subprocess
    import sys

    code = ("import trainrun, fake_cuda, _fake_gpu\n"
            "info = trainrun.gpu_info()\n"
            "print('NCCL:', info['nccl_why_not'])\n"
            "print('CUDA:', info['cuda_why_not'])\n"
            "trainrun.init()\n"
            "class A:\n"
            "    __cuda_array_interface__ = {'shape': (4,), 'typestr': '<f4', 'data': (4096, False),"
            " 'version': 3, 'stream': 1}\n"
            "try:\n"
            "    trainrun.allreduce(A())\n"
            "except trainrun.InvalidArgumentError as e:\n"
            "    print('ERROR:', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINRUN_", "HOROVOD_"))}
    env.update(TRAINRUN_NCCL_LIBRARY=str(tmp_path / "libnccl.so.2"),
               TRAINRUN_CUDA_LIBRARY=str(tmp_path / "cuda"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[0].startswith(f"NCCL: NCCL (libnccl.so.2) did not load from "
                             f"TRAINRUN_NCCL_LIBRARY={tmp_path}/libnccl.so.2: "), out
    assert out[1].startswith("CUDA: CUDA's runtime (libcudart.so.13 or .12) did not load from "
                             "TRAINRUN_CUDA_LIBRARY="), out
    assert out[2].startswith("ERROR: a GPU buffer was given, but CUDA's runtime "), out
    assert len(out) == 3


def test_a_cuda_tensor_where_torch_has_no_cuda_is_one_sentence():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    with pytest.raises((AssertionError, RuntimeError), match="CUDA") as caught:
        trainrun.allreduce(torch.ones(4, device="cuda"))
    assert "\n" not in str(caught.value).strip()
