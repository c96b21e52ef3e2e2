"""Arguments that one rank gets wrong (Horovod's errors that leave the job usable): that rank
raises its own ValueError saying what was wrong, every rank that made the call raises
MismatchError naming that rank, and the next 100 collectives are right. CTest runs it at 2 and 3
ranks, over shared memory and over TCP."""

import numpy as np
import pytest
import torch

import trainrun
import trainrun.torch as hvd

trainrun.init()
RANK, SIZE = trainrun.rank(), trainrun.size()
BAD = SIZE - 1  # the rank that gets its arguments wrong
pytestmark = pytest.mark.skipif(SIZE == 1, reason="needs two ranks")


def refused_here_or_there(call, mine):
    """Runs call(); on BAD it must raise ValueError matching `mine`, elsewhere MismatchError
    saying that BAD refused its call."""
    if RANK == BAD:
        with pytest.raises(ValueError, match=mine) as info:
            call()
        assert not isinstance(info.value, trainrun.MismatchError), info.value
    else:
        with pytest.raises(trainrun.MismatchError,
                           match=f"rank {BAD} called .*with arguments it refused"):
            call()


def hundred_correct_collectives():
    for i in range(100):
        kind = i % 5
        if kind == 0:
            out = hvd.allreduce(torch.full((3,), float(RANK + i)), op=hvd.Sum)
            assert out.tolist() == [sum(r + i for r in range(SIZE))] * 3, (i, out)
        elif kind == 1:
            root = i % SIZE
            out = hvd.broadcast(torch.full((2,), float(RANK)), root_rank=root, name=f"b{i}")
            assert out.tolist() == [float(root)] * 2, (i, out)
        elif kind == 2:
            out = hvd.allgather(torch.full((RANK + 1,), float(RANK)))
            assert out.tolist() == [float(r) for r in range(SIZE) for _ in range(r + 1)], (i, out)
        elif kind == 3:
            out = hvd.alltoall(torch.arange(SIZE, dtype=torch.float32) + 10 * RANK)
            assert out.tolist() == [float(RANK + 10 * r) for r in range(SIZE)], (i, out)
        else:
            out = trainrun.allreduce(np.full(5, RANK + i, dtype=np.int64), op=trainrun.Max,
                                     name=f"max{i}")
            assert out.tolist() == [SIZE - 1 + i] * 5, (i, out)


def test_wrong_root_on_one_rank():
    root = SIZE if RANK == BAD else 0
    refused_here_or_there(lambda: hvd.broadcast(torch.ones(4), root_rank=root, name="root"),
                          f"root.*{SIZE}")
    hundred_correct_collectives()


def test_wrong_root_unnamed_in_place():
    root = -1 if RANK == BAD else 0
    refused_here_or_there(lambda: hvd.broadcast_(torch.ones(4), root_rank=root), "root")
    hundred_correct_collectives()


def test_wrong_splits_on_one_rank():
    splits = [3] * SIZE if RANK == BAD else [1] * SIZE  # more rows than the tensor has
    refused_here_or_there(
        lambda: hvd.alltoall(torch.ones(SIZE), torch.tensor(splits, dtype=torch.int32), "a2a"),
        "splits add up to")
    hundred_correct_collectives()


def test_splits_of_floats_on_one_rank():
    dtype = torch.float32 if RANK == BAD else torch.int32
    refused_here_or_there(
        lambda: hvd.alltoall(torch.ones(SIZE), torch.ones(SIZE, dtype=dtype)),
        "splits must hold")
    hundred_correct_collectives()


def test_element_type_only_one_rank_gives():
    dtype = torch.complex64 if RANK == BAD else torch.float32
    refused_here_or_there(lambda: hvd.allreduce(torch.ones(4, dtype=dtype), name="dtype"),
                          "element type")
    hundred_correct_collectives()


def test_adasum_of_integers_on_one_rank():
    # Refused inside the collectives library (not in Python), in the fused allreduce path.
    dtype = torch.int32 if RANK == BAD else torch.float32
    refused_here_or_there(lambda: hvd.allreduce(torch.ones(4, dtype=dtype), op=hvd.Adasum),
                          "Adasum reduces")
    hundred_correct_collectives()


def test_bad_op_on_one_rank_of_an_async_named_allreduce():
    op = "sum" if RANK == BAD else hvd.Sum
    refused_here_or_there(
        lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="op", op=op)), "op must")
    hundred_correct_collectives()


def test_scalar_reducescatter_on_one_rank():
    tensor = torch.tensor(1.0) if RANK == BAD else torch.ones(SIZE)
    refused_here_or_there(lambda: hvd.reducescatter(tensor, op=hvd.Sum, name="rs"), "scalar")
    hundred_correct_collectives()


def test_refused_named_call_among_others_in_another_order():
    # BAD refuses 'second' before submitting 'first'; the others submit 'first' then 'second'.
    # The refusal is matched by name: 'first' runs, and 'second' raises everywhere.
    if RANK == BAD:
        with pytest.raises(ValueError, match="root"):
            hvd.broadcast(torch.ones(2), root_rank=SIZE + 5, name="second")
        first = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="first")
    else:
        h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="first")
        with pytest.raises(trainrun.MismatchError, match=f"rank {BAD} called broadcast 'second'"):
            hvd.broadcast(torch.ones(2), root_rank=0, name="second")
        first = hvd.synchronize(h)
    assert first.tolist() == [float(SIZE)] * 2
    hundred_correct_collectives()


def test_every_rank_refusing_alike_raises_its_own_error_everywhere():
    with pytest.raises(ValueError, match="splits add up to") as info:
        hvd.alltoall(torch.ones(1), torch.ones(SIZE, dtype=torch.int32))
    assert not isinstance(info.value, trainrun.MismatchError)
    hundred_correct_collectives()
