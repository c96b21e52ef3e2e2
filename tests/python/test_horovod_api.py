"""Horovod's API beyond allreduce/broadcast/allgather (issue 18), as every rank of a real job:
mismatched collectives raise on every rank and the job goes on; gradients flow through the
collectives; init() after shutdown(); process sets; alltoall, reducescatter, grouped ops."""

import os

import numpy as np
import pytest
import torch

import trainrun
import trainrun.torch as hvd

trainrun.init()
RANK, SIZE = trainrun.rank(), trainrun.size()
multi = pytest.mark.skipif(SIZE == 1, reason="needs two ranks")


def healthy():
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [SIZE] * 2


@multi
def test_allreduce_against_barrier_raises_on_every_rank():
    with pytest.raises(trainrun.MismatchError, match="allreduce of float32.* called barrier"):
        if RANK == 0:
            trainrun.allreduce(np.ones(4, dtype=np.float32))
        else:
            trainrun.barrier()
    healthy()


@multi
def test_names_roots_and_ops_must_agree():
    with pytest.raises(trainrun.MismatchError, match="'a'.*'b'"):
        trainrun.allreduce(np.ones(2), name="a" if RANK == 0 else "b")
    with pytest.raises(trainrun.MismatchError, match="from root 0.*from root 1"):
        trainrun.broadcast(np.ones(2), root_rank=0 if RANK == 0 else 1)
    with pytest.raises(trainrun.MismatchError, match=r"\(op sum\).*\(op max\)"):
        trainrun.allreduce(np.ones(2), op=trainrun.Sum if RANK == 0 else trainrun.Max)
    # Same element count, different shape.
    with pytest.raises(trainrun.MismatchError):
        trainrun.allreduce(np.ones((2, 6) if RANK == 0 else (3, 4)))
    healthy()


def test_init_after_shutdown():
    trainrun.shutdown()
    assert not trainrun.is_initialized()
    trainrun.init()
    assert (trainrun.rank(), trainrun.size()) == (RANK, SIZE)
    healthy()


def test_gradients_through_collectives():
    x = torch.full((3,), float(RANK + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    assert y.grad_fn is not None
    y.backward(torch.ones(3))
    assert x.grad.tolist() == [SIZE] * 3
    x = torch.ones(RANK + 1, 2, requires_grad=True)
    g = hvd.allgather(x)
    assert g.shape == (SIZE * (SIZE + 1) // 2, 2)
    (g * 2).sum().backward()
    assert x.grad.tolist() == [[2.0, 2.0]] * (RANK + 1)
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, root_rank=0).sum().backward()
    assert x.grad.tolist() == [1.0 if RANK == 0 else 0.0] * 3


def test_int16_and_bool():
    assert trainrun.allreduce(torch.ones(3, dtype=torch.int16), op=trainrun.Sum).tolist() == \
        [SIZE] * 3
    flags = trainrun.allgather(torch.tensor([RANK % 2 == 0]))
    assert flags.tolist() == [r % 2 == 0 for r in range(SIZE)]


def test_alltoall_uneven_splits_returns_received_splits():
    # Rank r sends p + 1 rows to rank p, each holding r.
    splits = torch.tensor([p + 1 for p in range(SIZE)], dtype=torch.int32)
    x = torch.full((int(splits.sum()), 2), float(RANK))
    out, received = hvd.alltoall(x, splits)
    assert received.tolist() == [RANK + 1] * SIZE
    assert out[:, 0].tolist() == [float(r) for r in range(SIZE) for _ in range(RANK + 1)]


def test_reducescatter_even_and_uneven():
    x = torch.arange(4 * SIZE, dtype=torch.float32)
    assert hvd.reducescatter(x, op=hvd.Sum).tolist() == \
        (x[4 * RANK:4 * RANK + 4] * SIZE).tolist()
    rows = SIZE + 1  # the first rank gets two rows
    part = hvd.reducescatter(torch.ones(rows, 3), op=hvd.Average)
    assert part.shape[0] == (2 if RANK == 0 else 1)


def test_grouped_and_async():
    out = hvd.grouped_allreduce([torch.ones(2), torch.ones(3, dtype=torch.float64)], op=hvd.Sum)
    assert [o.tolist() for o in out] == [[SIZE] * 2, [SIZE] * 3]
    h = hvd.allgather_async(torch.tensor([RANK]))
    assert hvd.synchronize(h).tolist() == list(range(SIZE))
    with pytest.raises(ValueError, match="already in flight"):
        h = hvd.allreduce_async(torch.ones(1), name="twice")
        hvd.allreduce_async(torch.ones(1), name="twice")
    hvd.synchronize(h)


def test_process_sets():
    evens = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 0])
    if RANK % 2 == 0:
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens)
        assert total.item() == evens.size()
        b = hvd.broadcast(torch.tensor([RANK]), root_rank=0, process_set=evens)
        assert b.item() == 0
        hvd.barrier(process_set=evens)
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.allreduce(torch.ones(1), process_set=evens)
    hvd.barrier()
    assert hvd.remove_process_set(evens)


def test_compression_halves_the_wire_type():
    t = torch.ones(4)
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16 and c.element_size() * 2 == t.element_size()
    assert hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float32
    assert hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.fp16).tolist() == [SIZE] * 4


def test_sync_batch_norm_matches_batch_norm_over_all_ranks():
    torch.manual_seed(0)
    everyone = torch.randn(SIZE, 3, 4)
    sync = hvd.SyncBatchNorm(4)
    plain = torch.nn.BatchNorm1d(4)
    mine = everyone[RANK].clone().requires_grad_()
    out = sync(mine)
    ref_in = everyone.reshape(SIZE * 3, 4).clone().requires_grad_()
    ref = plain(ref_in)
    assert torch.allclose(out, ref[3 * RANK:3 * RANK + 3], atol=1e-5)
    assert torch.allclose(sync.running_var, plain.running_var, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    assert torch.allclose(mine.grad, ref_in.grad[3 * RANK:3 * RANK + 3], atol=1e-5)


def test_refusals_are_clear():
    # Adasum is for floating-point tensors (test_adasum.py checks what it does).
    with pytest.raises(ValueError, match="Adasum reduces .* not int32"):
        hvd.allreduce(torch.ones(1, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="comm="):
        hvd.init(comm=[0])
    assert not (hvd.mpi_built() or hvd.gloo_built())
    # CUDA's runtime is opened at run time, so its support is always built in.
    assert hvd.cuda_built()


def test_nccl_built_is_the_version_of_the_nccl_that_loads():
    # Horovod's nccl_built() is NCCL's version as an int (its alltoall tests compare it with
    # 2700), 0 without NCCL; trainrun's is that of the libnccl.so.2 it would open, as gpu_info().
    version = hvd.nccl_built()
    assert type(version) is int  # pylint: disable=unidiomatic-typecheck
    info = trainrun.gpu_info()
    if not info["nccl"]:
        assert version == 0
        return
    major, minor, patch = (int(p) for p in info["nccl_version"].split("."))
    assert version == (major * 10000 if version >= 20900 else major * 1000) + minor * 100 + patch
    assert version >= 2700


def test_nccl_built_is_0_where_no_nccl_loads(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, TRAINRUN_NCCL_LIBRARY=str(tmp_path / "libnccl.so.2"))
    out = subprocess.run([sys.executable, "-c", "import trainrun, trainrun.torch as hvd; "
                          "print(hvd.nccl_built(), trainrun.gpu_info()['nccl_why_not'])"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("0 NCCL (libnccl.so.2) did not load from TRAINRUN_NCCL_LIBRARY="), out


@multi
def test_join_adds_zeros_and_returns_the_last_rank():
    if RANK == 0:
        last = hvd.join()
    else:
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [SIZE - 1] * 3
        with pytest.raises(RuntimeError, match="has joined"):
            hvd.allgather(torch.ones(1))
        last = hvd.join()
    assert last != 0
    assert hvd.allgather_object(last) == [last] * SIZE
