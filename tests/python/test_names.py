"""Collectives matched by name in any order (Horovod's semantics), and errors that leave the job
usable, as every rank of a real job (CTest runs it at 3 and 4 ranks, over shared memory and TCP).

- named async collectives submitted in a different random order on every rank all complete with
  the right results, fused or not, mixed kinds included;
- a second pending collective with the same name raises ValueError on that rank only, and a
  DistributedOptimizer step afterwards is correct;
- a mismatch (shape, dtype, op, root) raises on every rank, and the next 100 collectives are right.
"""

import random

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
def test_50_named_allreduces_in_50_random_orders():
    count = 50
    for round_ in range(50):
        order = list(range(count))
        random.Random(1000 * round_ + RANK).shuffle(order)  # another order on every rank
        tensors = {i: torch.full((i % 7 + 1,), float(RANK + i)) for i in range(count)}
        handles = {i: hvd.allreduce_async_(tensors[i], name=f"round{round_}.t{i}", op=hvd.Sum)
                   for i in order}
        # Synchronized in yet another order.
        for i in sorted(order, key=lambda j: (j * 7 + RANK) % count):
            result = hvd.synchronize(handles[i])
            expected = sum(r + i for r in range(SIZE))
            assert torch.all(result == expected), (round_, i, result)
    healthy()


@multi
def test_mixed_kinds_in_random_orders():
    for round_ in range(10):
        ops = []
        for i in range(12):
            ops.append(("allreduce", i))
            ops.append(("broadcast", i))
            ops.append(("allgather", i))
        random.Random(77 * round_ + RANK).shuffle(ops)
        started = []
        for kind, i in ops:
            name = f"mixed{round_}.{kind}.{i}"
            if kind == "allreduce":
                h = hvd.allreduce_async(torch.full((3,), float(RANK)), name=name, op=hvd.Sum)
            elif kind == "broadcast":
                h = hvd.broadcast_async(torch.full((2, 2), float(RANK * 10 + i)),
                                        root_rank=i % SIZE, name=name)
            else:  # a first dimension that differs between ranks
                h = hvd.allgather_async(torch.full((RANK + 1, 2), float(RANK)), name=name)
            started.append((kind, i, h))
        for kind, i, h in started:
            out = hvd.synchronize(h)
            if kind == "allreduce":
                assert torch.all(out == sum(range(SIZE)))
            elif kind == "broadcast":
                assert torch.all(out == (i % SIZE) * 10 + i)
            else:
                expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(SIZE)])
                assert torch.equal(out, expected)
    healthy()


@multi
def test_barrier_overtakes_a_pending_named_allreduce():
    # Rank 0 has an allreduce pending when it enters the barrier; the others call the allreduce
    # only after the barrier (Horovod's duplicate-name tests do this).
    t = torch.ones(5)
    h = None
    if RANK == 0:
        h = hvd.allreduce_async(t, name="overtaken", op=hvd.Sum)
    hvd.barrier()
    if RANK != 0:
        h = hvd.allreduce_async(t, name="overtaken", op=hvd.Sum)
    assert torch.all(hvd.synchronize(h) == SIZE)
    healthy()


@multi
def test_duplicate_name_raises_on_that_rank_only_then_optimizer_step():
    t = torch.ones(4)
    h = None
    if RANK == 1:
        h = hvd.allreduce_async(t, name="dup", op=hvd.Sum)
        with pytest.raises(ValueError, match="'dup' is already in flight"):
            hvd.allreduce_async(t, name="dup", op=hvd.Sum)
    hvd.barrier()
    if RANK != 1:
        h = hvd.allreduce_async(t, name="dup", op=hvd.Sum)
    assert torch.all(hvd.synchronize(h) == SIZE)
    # Once it and a later collective (the barrier) have run, the name is free again, synchronized
    # or not.
    h1 = hvd.allreduce_async(t, name="again", op=hvd.Sum)
    hvd.barrier()
    h2 = hvd.allreduce_async(t, name="again", op=hvd.Sum)
    assert torch.all(hvd.synchronize(h1) == SIZE) and torch.all(hvd.synchronize(h2) == SIZE)

    # A correct DistributedOptimizer step: every rank's gradient averaged, parameters equal.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.full((1, 3), float(RANK + 1))
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    mean_x = sum(r + 1 for r in range(SIZE)) / SIZE
    assert torch.allclose(model.weight, before["weight"] - 0.5 * torch.full((2, 3), mean_x))
    assert torch.allclose(model.bias, before["bias"] - 0.5)
    gathered = hvd.allgather(model.weight.detach().reshape(1, -1))
    assert all(torch.equal(gathered[0], g) for g in gathered)


@multi
def test_mismatch_at_k_then_100_correct_collectives():
    k = 5
    for i in range(k):
        assert torch.all(hvd.allreduce(torch.ones(3), name=f"before{i}", op=hvd.Sum) == SIZE)
    with pytest.raises(trainrun.MismatchError, match="float32\\[3\\].*float32\\[4\\]"):
        hvd.allreduce(torch.ones(3 if RANK == 0 else 4), name="bad", op=hvd.Sum)
    with pytest.raises(trainrun.MismatchError, match="float32.*float64"):
        hvd.broadcast(torch.ones(2, dtype=torch.float32 if RANK == 0 else torch.float64), 0,
                      name="bad.dtype")
    with pytest.raises(trainrun.MismatchError, match="from root"):
        hvd.broadcast(torch.ones(2), RANK % 2, name="bad.root")
    for i in range(100):
        if i % 4 == 0:  # fused async ones, unnamed
            hs = [hvd.allreduce_async_(torch.full((i + 1,), float(j)), op=hvd.Sum)
                  for j in range(3)]
            for j, h in enumerate(hs):
                assert torch.all(hvd.synchronize(h) == j * SIZE), i
        elif i % 4 == 1:
            out = hvd.broadcast(torch.full((i,), float(RANK)), root_rank=i % SIZE, name=f"b{i}")
            assert torch.all(out == i % SIZE)
        elif i % 4 == 2:
            out = hvd.allgather(torch.full((1, i), float(RANK)), name=f"g{i}")
            assert out[:, 0].tolist() == [float(r) for r in range(SIZE)]
        else:
            out = hvd.allreduce(torch.full((i,), 1.0), name=f"after{i}", op=hvd.Sum)
            assert torch.all(out == SIZE), i
    healthy()


@multi
def test_named_collectives_in_other_orders_while_a_rank_has_joined():
    # Rank 0 is in join() throughout; the others submit 30 named allreduces (and a named
    # grouped allreduce) in their own random orders, which still match by name and complete, the
    # joined rank adding zeros.
    if SIZE < 3:
        pytest.skip("needs a joined rank and two others")
    for round_ in range(3):
        if RANK == 0:
            last = hvd.join()
        else:
            count = 30
            order = list(range(count))
            random.Random(31 * round_ + RANK).shuffle(order)
            handles = {}
            for i in order:
                handles[i] = hvd.allreduce_async(torch.full((i % 5 + 1,), float(RANK + i)),
                                                 name=f"joined{round_}.t{i}", op=hvd.Sum)
                if i == order[count // 2]:
                    handles["group"] = hvd.grouped_allreduce_async(
                        [torch.ones(2), torch.ones(3)], name=f"joined{round_}.group", op=hvd.Sum)
            for i in range(count):
                expected = sum(r + i for r in range(1, SIZE))
                assert hvd.synchronize(handles[i]).tolist() == [expected] * (i % 5 + 1), i
            group = hvd.synchronize(handles["group"])
            assert [t.tolist() for t in group] == [[SIZE - 1.0] * 2, [SIZE - 1.0] * 3]
            last = hvd.join()
        lasts = trainrun.allgather_object(last)
        assert len(set(lasts)) == 1 and lasts[0] != 0, lasts
    healthy()
