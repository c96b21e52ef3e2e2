"""op=Adasum as every rank of a real job: allreduce against a float64 reference written here from
the paper's definition (the library's tree: pairs 2i, 2i+1 for i < n - p folded first, p the
largest power of two <= n, then pairs of pairs), Horovod's own checks of test_adasum_pytorch.py
on CPU tensors (which Horovod's file skips without MPI), the refusals, and
DistributedOptimizer(op=Adasum) against a reference of Horovod's delta-based update."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainrun
import trainrun.torch as hvd

trainrun.init()
RANK, SIZE = trainrun.rank(), trainrun.size()
TINY = math.sqrt(np.finfo(np.float64).tiny)
POWER_OF_TWO = SIZE & (SIZE - 1) == 0


def combine(a, b, bounds):
    """The Adasum of a and b, tensor by tensor (tensor i is bounds[i]:bounds[i + 1])."""
    out = a.copy()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        x, y = a[lo:hi], b[lo:hi]
        dot, xx, yy = x @ y, x @ x, y @ y
        ca = 1 - dot / (2 * xx) if xx >= TINY else 1.0
        cb = 1 - dot / (2 * yy) if yy >= TINY else 1.0
        out[lo:hi] = ca * x + cb * y
    return out


def reference(vectors, bounds=None):
    vectors = [np.asarray(v, dtype=np.float64) for v in vectors]
    bounds = [0, len(vectors[0])] if bounds is None else bounds
    n = len(vectors)
    p = 1 << (n.bit_length() - 1)
    level = [combine(vectors[2 * i], vectors[2 * i + 1], bounds) for i in range(n - p)]
    level += vectors[2 * (n - p):]
    while len(level) > 1:
        level = [combine(level[i], level[i + 1], bounds) for i in range(0, len(level), 2)]
    return level[0]


def inputs(count, seed):
    """Every rank's input (each rank makes all of them): a shared direction plus its own."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=count)
    return [(0.5 + r * 0.37) * ((r % 3) * 0.4 * shared + rng.normal(size=count))
            for r in range(SIZE)]


TOLERANCE = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 2e-2}


def close(got, want, rtol):
    got = np.asarray(got, dtype=np.float64)
    return np.allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))


def healthy():
    assert trainrun.allreduce(np.ones(2), op=trainrun.Sum).tolist() == [SIZE] * 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("count", [1, 7, 1000, 4099])
def test_numpy_allreduce_matches_reference(dtype, count):
    every = [v.astype(dtype) for v in inputs(count, seed=count)]
    got = trainrun.allreduce(every[RANK], op=trainrun.Adasum)
    assert got.dtype == dtype
    assert close(got, reference(every), TOLERANCE[dtype])
    # Every rank has the same bits.
    gathered = trainrun.allgather_object(got.tobytes())
    assert all(g == gathered[0] for g in gathered)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_allreduce_in_place_and_async(dtype):
    every = [torch.tensor(v).to(dtype) for v in inputs(513, seed=5)]
    want = reference([t.double().numpy() for t in every])
    rtol = 2e-5 if dtype == torch.float32 else 3e-2
    mine = every[RANK].clone()
    hvd.allreduce_(mine, op=hvd.Adasum)
    assert close(mine.double().numpy(), want, rtol)
    out = hvd.synchronize(hvd.allreduce_async(every[RANK], op=hvd.Adasum, name="adasum.async"))
    assert torch.equal(out, mine)
    assert hvd.allreduce(every[RANK], op=hvd.Adasum).dtype == dtype


def test_fused_and_grouped_tensors_keep_their_own_dot_products():
    counts = [5, 300, 1, 77]
    every = [inputs(c, seed=100 + c) for c in counts]
    wants = [reference(e) for e in every]
    # Queued one after another: the core fuses them into one collective.
    mine = [torch.tensor(e[RANK], dtype=torch.float32) for e in every]
    handles = [hvd.allreduce_async_(t, op=hvd.Adasum, name=f"fused.{i}")
               for i, t in enumerate(mine)]
    for h, want in zip(handles, wants):
        assert close(hvd.synchronize(h).numpy(), want, 2e-5)
    grouped = hvd.grouped_allreduce([torch.tensor(e[RANK]) for e in every], op=hvd.Adasum)
    for g, want in zip(grouped, wants):
        assert close(g.numpy(), want, 1e-12)
    # One Adasum of the concatenation is not the same thing (one dot product for all).
    if SIZE > 1:
        whole = trainrun.allreduce(np.concatenate([e[RANK] for e in every]), op=trainrun.Adasum)
        assert not close(whole, np.concatenate(wants), 1e-6)


def test_process_set_runs_its_own_tree():
    # Horovod refuses Adasum on a process set; trainrun runs it over the set's ranks, numbered
    # within the set.
    evens = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 0])
    every = inputs(301, seed=9)
    if RANK % 2 == 0:
        got = hvd.allreduce(torch.tensor(every[RANK]), op=hvd.Adasum, process_set=evens)
        assert close(got.numpy(), reference(every[0::2]), 1e-12)
    hvd.barrier()
    assert hvd.remove_process_set(evens)
    healthy()


# Horovod's test_adasum_pytorch.py checks, on CPU tensors (Horovod's file runs them only with MPI
# and, for the first two, a GPU). Its "expected" is the sum over size, which Adasum gives for
# parallel vectors only when the ranks pair up evenly (a power of two); orthogonal ones add.
def _horovod_close(data_type, true_vec, comp_vec):
    norm_diff = np.linalg.norm(true_vec - comp_vec)
    return norm_diff / np.linalg.norm(true_vec) / 100.0 < np.finfo(data_type).eps


@pytest.mark.parametrize("data_type", [np.float32, np.float16])
def test_horovod_orthogonal(data_type):
    np.random.seed(2)
    for n in [SIZE * 20 - 17, SIZE * 2 + 1, SIZE + 2, 2**15]:
        q, _ = np.linalg.qr(np.random.normal(0, 1, (n, SIZE)))
        q = q.astype(data_type)
        got = hvd.allreduce(torch.from_numpy(q[:, RANK].copy()), op=hvd.Adasum)
        assert _horovod_close(data_type, np.sum(q.astype(np.float64), axis=1), got.numpy())


@pytest.mark.skipif(not POWER_OF_TWO, reason="parallel vectors average only at a power of two")
@pytest.mark.parametrize("data_type", [np.float32, np.float16])
def test_horovod_parallel_and_stability(data_type):
    np.random.seed(2)
    for n in [SIZE * 20 - 13, SIZE * 2 + 1, SIZE + 2, 2**15]:
        a = np.random.normal(0, 1, (n, 1))
        r = np.random.normal(0, 1, (SIZE, 1))
        q = np.dot(a, r.T).astype(data_type)
        got = hvd.allreduce(torch.from_numpy(q[:, RANK].copy()), op=hvd.Adasum)
        assert _horovod_close(data_type, np.sum(q.astype(np.float64), axis=1) / SIZE, got.numpy())
    # test_stability: values at the type's smallest normal.
    a = np.random.normal(0, np.finfo(data_type).tiny, (1024, 1))
    r = np.random.normal(0, 1, (SIZE, 1))
    q = np.dot(a, r.T).astype(data_type).astype(np.float64)
    tensor = torch.from_numpy(q[:, RANK].astype(data_type))
    hvd.allreduce_(tensor, op=hvd.Adasum)
    assert _horovod_close(data_type, np.sum(q, axis=1) / SIZE, tensor.numpy())
    # test_stability_2: ranks' scales from tiny to sqrt(max).
    lo = float(np.finfo(data_type).tiny)
    hi = math.sqrt(float(np.finfo(data_type).max))
    a = np.random.normal(0, 1, (1024, 1))
    r = np.array([hi**((i + 1) / SIZE) * lo**((SIZE - i - 1) / SIZE) for i in range(SIZE)])
    np.random.shuffle(r)
    q = np.dot(a, r.reshape(SIZE, 1).T).astype(data_type).astype(np.float64)
    tensor = torch.from_numpy(q[:, RANK].astype(data_type))
    hvd.allreduce_(tensor, op=hvd.Adasum)
    assert _horovod_close(data_type, np.sum(q, axis=1) / SIZE, tensor.numpy())


def test_refusals_name_the_culprit_and_the_job_goes_on():
    with pytest.raises(trainrun.InvalidArgumentError, match="Adasum reduces .* not int32"):
        trainrun.allreduce(np.ones(3, dtype=np.int32), op=trainrun.Adasum)
    healthy()
    if SIZE > 1:
        with pytest.raises(trainrun.InvalidArgumentError, match="allreduce op only"):
            hvd.reducescatter(torch.ones(SIZE * 2), op=hvd.Adasum)
        healthy()
    assert hvd.Adasum is trainrun.Adasum
    from trainrun.torch.mpi_ops import Adasum, synchronize  # Horovod's module name
    assert Adasum is hvd.Adasum and synchronize is hvd.synchronize


# --- DistributedOptimizer(op=Adasum) ------------------------------------------------------------

BATCH = 24


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def shard(x, y, rank):
    n = BATCH // SIZE
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def reference_training(steps, lr):
    """Horovod's Adasum optimizer simulated in one process: each rank's own SGD (momentum kept per
    rank) steps from the shared parameters on its shard; the shared parameters then move by the
    Adasum of the ranks' steps, parameter by parameter."""
    shared = make_model()
    ranks = [make_model() for _ in range(SIZE)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in ranks]
    for step in range(steps):
        x, y = batch(step)
        deltas = []
        for r, (m, opt) in enumerate(zip(ranks, optimizers)):
            with torch.no_grad():
                for p, s in zip(m.parameters(), shared.parameters()):
                    p.copy_(s)
            xs, ys = shard(x, y, r)
            opt.zero_grad()
            F.cross_entropy(m(xs), ys).backward()
            opt.step()
            deltas.append([(p - s).detach().double().numpy().ravel()
                           for p, s in zip(m.parameters(), shared.parameters())])
        with torch.no_grad():
            for i, s in enumerate(shared.parameters()):
                step_i = reference([d[i] for d in deltas])
                s.add_(torch.from_numpy(step_i).view_as(s).to(s.dtype))
    return shared


def test_distributed_optimizer_adasum_matches_reference_and_trains():
    steps, lr = 4, 0.2
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    losses = []
    for step in range(steps):
        x, y = shard(*batch(step), RANK)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    want = reference_training(steps, lr)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name
    hashes = trainrun.allgather_object([p.detach().numpy().tobytes() for p in model.parameters()])
    assert all(h == hashes[0] for h in hashes)
    # It trains: more steps over the same batches bring the loss down.
    for step in range(60):
        x, y = shard(*batch(step % steps), RANK)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    x, y = shard(*batch(0), RANK)
    final = hvd.allreduce(F.cross_entropy(model(x), y).detach(), name="final").item()
    print(f"loss {losses[0]:.3f} at the first step, {final:.3f} after {steps + 60}")
    assert final < losses[0] * 0.8


def test_distributed_optimizer_adasum_rules():
    model = make_model()
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 named_parameters=[("w", p) for p in model.parameters()])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                   named_parameters=model.named_parameters())
    if SIZE > 1:
        with pytest.raises(AssertionError, match="skip_synchronize"):
            with opt.skip_synchronize():
                pass
        F.cross_entropy(model(batch(0)[0]), batch(0)[1]).backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
    opt.step()  # also starts the parameters that got no gradient, in name order on every rank
    opt.zero_grad()
