"""trainrun.torch: DistributedOptimizer against single-process training, and its helpers."""

import hashlib

import pytest
import torch
import torch.nn.functional as F

import trainrun
import trainrun.torch as hvd

STEPS = 8
BATCH = 24  # divisible by 1, 2, 3 and 4, so every rank's shard has the same weight


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 3))


def full_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 10, generator=g)
    y = torch.randint(0, 3, (BATCH,), generator=g)
    return x, y


def my_shard(x, y, rank=None, size=None):
    rank = hvd.rank() if rank is None else rank
    size = hvd.size() if size is None else size
    n = len(x) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_single_process(kind):
    model = make_model()
    opt = make_optimizer(kind, model.parameters())
    for step in range(STEPS):
        x, y = full_batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def parameter_hash(model):
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def assert_same_everywhere(model):
    hashes = hvd.allgather_object(parameter_hash(model))
    assert all(h == hashes[0] for h in hashes), f"parameters differ across ranks: {hashes}"


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("bucket_bytes", [64, 1 << 20], ids=["many-buckets", "one-bucket"])
def test_distributed_optimizer_matches_full_batch(kind, bucket_bytes):
    model = make_model(seed=hvd.rank())  # differs per rank until the broadcast
    opt = hvd.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   bucket_bytes=bucket_bytes)
    assert isinstance(opt, type(make_optimizer(kind, model.parameters())))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(STEPS):
        x, y = my_shard(*full_batch(step))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert_same_everywhere(model)
    reference = train_single_process(kind)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"parameter {name}")


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compressed_gradients_are_the_average_every_step(compression):
    """Each step's gradients travel as 2-byte floats through a buffer kept across steps: every
    step (not only the first) must hand back this step's average, to the wire type's precision."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), bucket_bytes=256,
                                   compression=getattr(hvd.Compression, compression))
    tolerance = {"fp16": 2e-3, "bf16": 1e-2}[compression]
    for step in range(3):
        twin = make_model()  # the same parameters, without the optimizer's hooks
        twin.load_state_dict(model.state_dict())
        reference = [torch.zeros_like(p) for p in twin.parameters()]
        for r in range(hvd.size()):  # each rank's gradient, as that rank computes it
            twin.zero_grad()
            F.cross_entropy(twin(my_shard(*full_batch(step), r)[0]),
                            my_shard(*full_batch(step), r)[1]).backward()
            for acc, p in zip(reference, twin.parameters()):
                acc += p.grad / hvd.size()
        opt.zero_grad()
        x, y = my_shard(*full_batch(step))
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        for (name, p), want in zip(model.named_parameters(), reference):
            torch.testing.assert_close(p.grad, want, rtol=tolerance, atol=tolerance,
                                       msg=f"step {step}, gradient of {name}")
        with opt.skip_synchronize():
            opt.step()
    assert_same_everywhere(model)


def test_backward_passes_per_step_accumulates():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2, bucket_bytes=256)
    for step in range(3):
        x, y = my_shard(*full_batch(step))
        opt.zero_grad()
        for half in range(2):  # two half-batches, each weighted 1/2: same as the whole shard
            xs, ys = my_shard(x, y, half, 2)
            (F.cross_entropy(model(xs), ys) / 2).backward()
        opt.step()
    assert_same_everywhere(model)
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x, y = full_batch(step)
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_too_many_backward_passes_raise():
    if hvd.size() == 1:
        pytest.skip("hooks are only installed with two or more ranks")
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = my_shard(*full_batch(0))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        F.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.synchronize()  # the first pass's allreduces, so every rank stays in step
    with opt.skip_synchronize():
        opt.step()


def test_unused_parameters_get_zero_gradients():
    model = make_model()
    unused = torch.nn.Linear(3, 3)
    params = list(model.named_parameters()) + [("unused." + n, p)
                                               for n, p in unused.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1),
                                   named_parameters=params)
    x, y = my_shard(*full_batch(0))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert_same_everywhere(model)
    assert torch.count_nonzero(unused.weight.grad) == 0


def test_different_models_raise():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    width = 4 if hvd.rank() == 0 else 5
    model = torch.nn.Linear(3, width)
    with pytest.raises(trainrun.InvalidArgumentError, match="same model"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())


def test_broadcast_optimizer_state():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1), momentum=0.9)
    if hvd.rank() == 0:  # only rank 0 has momentum buffers
        F.cross_entropy(model(full_batch(0)[0]), full_batch(0)[1]).backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    buffers = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    states = hvd.allgather_object([b.numpy().tobytes() for b in buffers])
    assert all(s == states[0] for s in states)


def test_allreduce_metric_and_sampler():
    loss = torch.tensor(float(hvd.rank()))
    assert hvd.allreduce(loss, name="loss").item() == pytest.approx((hvd.size() - 1) / 2)
    assert hvd.allreduce(loss, average=False).item() == sum(range(hvd.size()))
    shards = hvd.allgather_object(hvd.shard_indices(10, shuffle=True, seed=3))
    assert all(len(s) == len(shards[0]) for s in shards)
    assert set().union(*map(set, shards)) == set(range(10))
    sampler = hvd.DistributedSampler(list(range(10)), shuffle=False)
    assert list(sampler) == hvd.shard_indices(10)


def test_horovod_style_arguments():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.none, op=hvd.Sum)
    assert isinstance(opt, torch.optim.SGD)
    # op=Adasum is Horovod's Adasum optimizer (test_adasum.py checks what it does).
    adasum = hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1),
                                      op=hvd.Adasum)
    assert isinstance(adasum, torch.optim.SGD)
    with pytest.raises(trainrun.InvalidArgumentError, match="op must be"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Max)
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("w", p) for p in model.parameters()])
