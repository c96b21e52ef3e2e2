"""trainrun on a real GPU (label gpu; scripts/gpu-check.sh runs it): every collective and dtype on
CUDA tensors against a float64 reference, the stream order with a real kernel and no synchronize,
the path each job size takes, DistributedOptimizer and SyncBatchNorm on cuda:N, and CuPy and JAX
arrays through trainrun.allreduce. Every rank of a job runs this file; at 1 rank the GPU
collectives go over NCCL, at 2 ranks sharing one GPU through pinned host memory.
"""

import os

import numpy
import pytest
import torch

import trainrun
import trainrun.torch as hvd

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8]
OPS = [trainrun.Sum, trainrun.Average, trainrun.Min, trainrun.Max, trainrun.Product]


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    yield
    hvd.shutdown()


def device():
    return torch.device("cuda", torch.cuda.current_device())


def values(dtype, op, rank, n, offset=0):
    i = torch.arange(offset, offset + n, dtype=torch.int64)
    if op == trainrun.Product:
        v = torch.where((i + rank) % 3 == 0, 2, 1)
    else:
        v = (i * 7 + rank * 3) % 11 - (0 if dtype == torch.uint8 else 5)
    return v.to(dtype)


def reference(dtype, op, n, size):
    stack = torch.stack([values(dtype, op, r, n).double() for r in range(size)])
    if op == trainrun.Sum:
        return stack.sum(0)
    if op == trainrun.Average:
        total = stack.sum(0) / size
        return total if dtype.is_floating_point else torch.trunc(total)
    if op == trainrun.Min:
        return stack.min(0).values
    if op == trainrun.Max:
        return stack.max(0).values
    return stack.prod(0)


def close(got, want, dtype):
    tolerance = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=tolerance,
                               atol=tolerance)


def test_path_is_nccl_alone_and_staged_when_ranks_share_a_gpu():
    x = torch.ones(4, device=device())
    trainrun.allreduce_(x)
    info = trainrun.gpu_info()
    print(f"gpu_info: {info}")
    assert info["cuda"] and info["nccl"], info
    shared = hvd.local_size() > torch.cuda.device_count()
    assert info["path"] == ("staged" if shared else "nccl"), info
    if shared:
        assert "share cuda:" in info["path_why"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_op(dtype):
    size, rank = hvd.size(), hvd.rank()
    for op in OPS:
        for n in (1, 1000, 70001):
            x = values(dtype, op, rank, n).to(device())
            close(trainrun.allreduce(x, op=op), reference(dtype, op, n, size), dtype)
            h = trainrun.allreduce_async_(x, op=op)
            close(trainrun.synchronize(h), reference(dtype, op, n, size), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_prescale_postscale_grouped(dtype):
    size, rank = hvd.size(), hvd.rank()
    x = values(dtype, trainrun.Sum, rank, 100).to(device())
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    close(out, reference(dtype, trainrun.Sum, 100, size) * 1.5, dtype)
    xs = [values(dtype, trainrun.Sum, rank, 10 + k).to(device()) for k in range(3)]
    for k, out in enumerate(hvd.grouped_allreduce(xs, op=hvd.Sum)):
        close(out, reference(dtype, trainrun.Sum, 10 + k, size), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_allgather_alltoall_reducescatter(dtype):
    size, rank = hvd.size(), hvd.rank()
    x = values(dtype, trainrun.Max, rank, 333).to(device())
    close(hvd.broadcast(x, root_rank=size - 1), values(dtype, trainrun.Max, size - 1, 333), dtype)
    mine = values(dtype, trainrun.Max, rank, (rank + 1) * 3).reshape(rank + 1, 3).to(device())
    want = torch.cat([values(dtype, trainrun.Max, r, (r + 1) * 3).reshape(r + 1, 3)
                      for r in range(size)])
    close(hvd.allgather(mine), want, dtype)
    splits = torch.tensor([rank + d + 1 for d in range(size)])
    y = values(dtype, trainrun.Max, rank, int(splits.sum()) * 2).reshape(-1, 2).to(device())
    out, received = hvd.alltoall(y, splits=splits)
    parts = []
    for s in range(size):
        theirs = values(dtype, trainrun.Max, s, sum(s + d + 1 for d in range(size)) * 2)
        start = sum(s + d + 1 for d in range(rank))
        parts.append(theirs.reshape(-1, 2)[start:start + s + rank + 1])
    close(out, torch.cat(parts), dtype)
    rows = 4 * size
    z = values(dtype, trainrun.Sum, rank, rows * 5).reshape(rows, 5).to(device())
    want = reference(dtype, trainrun.Sum, rows * 5, size).reshape(rows, 5)[rank * 4:rank * 4 + 4]
    close(hvd.reducescatter(z, op=hvd.Sum), want, dtype)


def test_stream_order_with_a_real_kernel_and_no_synchronize():
    """A long kernel, then the write, on the current stream; the allreduce is called at once; a
    kernel after it reads the result. Nothing synchronizes the stream on the CPU."""
    size, rank = hvd.size(), hvd.rank()
    x = torch.zeros(1 << 20, device=device())
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the write
    x.fill_(rank + 1)
    trainrun.allreduce_(x, op=trainrun.Sum)
    y = x * 2  # a kernel reading the reduced buffer
    assert float(y[0].item()) == size * (size + 1)  # .item() copies on the stream, after y
    assert bool((y == size * (size + 1)).all().item())


def test_200_async_in_flight():
    size, rank = hvd.size(), hvd.rank()
    xs = [torch.full((k + 1,), float(rank + k), device=device()) for k in range(200)]
    handles = [hvd.allreduce_async_(x, op=hvd.Sum, name=f"f{k}") for k, x in enumerate(xs)]
    for k in reversed(range(200)):
        hvd.synchronize(handles[k])
    for k, x in enumerate(xs):
        assert bool((x == size * k + size * (size - 1) / 2).all().item())


def test_queued_allreduces_fuse():
    """64 small in-place allreduces queued at once run fused (over NCCL: gathered into a device
    fusion buffer, one NCCL allreduce per batch, the ranks agreeing on how many by a host
    exchange; host-staged: one copy down and back per batch); every element right."""
    size, rank = hvd.size(), hvd.rank()
    before = trainrun.gpu_info()["fused"]
    xs = [torch.full((k + 1,), float(rank + k), device=device()) for k in range(64)]
    handles = [hvd.allreduce_async_(x, op=hvd.Sum, name=f"fuse{k}") for k, x in enumerate(xs)]
    for h in handles:
        hvd.synchronize(h)
    for k, x in enumerate(xs):
        assert bool((x == size * k + size * (size - 1) / 2).all().item()), k
    assert trainrun.gpu_info()["fused"] > before


def test_chunked_allreduce_poll_and_join():
    """A 24 MiB allreduce (staged: 4 pipelined chunks) and a kernel after it; poll() turns True
    only with the result in place; then the last rank joins and the others reduce with its
    zeros."""
    size, rank = hvd.size(), hvd.rank()
    x = torch.full((6 << 20,), float(rank + 1), device=device())
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="chunked")
    while not hvd.poll(h):
        pass
    torch.cuda.current_stream().synchronize()
    assert bool((x == size * (size + 1) / 2).all().item())
    hvd.synchronize(h)
    if size > 1:
        if rank == size - 1:
            last = hvd.join()
        else:
            y = torch.full((1000,), float(rank + 1), device=device())
            hvd.allreduce_(y, op=hvd.Sum)
            assert bool((y == (size - 1) * size / 2).all().item())
            last = hvd.join()
        assert last == size - 2


def test_distributed_optimizer_broadcast_and_sync_batch_norm_on_cuda():
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), hvd.SyncBatchNorm(16),
                                torch.nn.Linear(16, 1)).to(device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(torch.randn(32, 8, device=device())).square().mean()
        loss.backward()
        optimizer.step()
    digest = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    everyone = hvd.allgather_object(digest.numpy().tobytes())
    assert all(d == everyone[0] for d in everyone)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    size, rank = hvd.size(), hvd.rank()
    with cupy.cuda.Device(torch.cuda.current_device()):
        a = cupy.full(1000, rank + 1, dtype=cupy.float32)
        out = trainrun.allreduce(a, op=trainrun.Sum)
        assert isinstance(out, cupy.ndarray)
        assert float(out[0]) == size * (size + 1) / 2
        trainrun.allreduce_(a, op=trainrun.Max)
        assert float(a[0]) == size
        # Scaled by trainrun, not by CuPy: over NCCL one PreMulSum allreduce, staged in host memory.
        for op, want in ((trainrun.Sum, size * 1.5), (trainrun.Average, 1.5)):
            b = cupy.full(1000, 1, dtype=cupy.float32)
            trainrun.allreduce_(b, op=op, prescale_factor=0.5, postscale_factor=3.0)
            assert float(b[0]) == want and float(b[-1]) == want


def test_jax_arrays():
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    size, rank = hvd.size(), hvd.rank()
    a = jax.device_put(numpy.full(1000, rank + 1, numpy.float32),
                       jax.devices("gpu")[hvd.local_rank() % len(jax.devices("gpu"))])
    out = trainrun.allreduce(a, op=trainrun.Sum)
    assert float(numpy.asarray(out)[0]) == size * (size + 1) / 2
