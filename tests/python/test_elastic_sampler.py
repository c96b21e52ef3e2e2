"""ElasticSampler's whole public surface (horovod.torch.elastic's), and DistributedOptimizer's
duplicate-name check before the runtime is touched. Runs as every rank of a job (any size)."""

import os
import random
import subprocess
import sys

import torch

import trainrun
import trainrun.torch as hvd


def _sampler(n=23, **kwargs):
    if not trainrun.is_initialized():
        trainrun.init()
    return hvd.elastic.ElasticSampler(list(range(n)), **kwargs)


def _expected_shard(order, size, rank):
    total = -(-len(order) // size) * size
    padded = order[:]
    while padded and len(padded) < total:
        padded += padded[:total - len(padded)]
    return padded[rank:total:size]


def test_processed_num_counts_every_rank_batch():
    sampler = _sampler(seed=5)
    size = trainrun.size()
    assert sampler.processed_num == 0
    sampler.record_batch(0, 2)
    sampler.record_batch(1, 2)
    assert sampler.processed_num == 2 * 2 * size
    # The epoch's order without what was processed, re-sharded (Horovod's remaining_indices).
    order = list(range(23))
    random.Random(5).shuffle(order)
    sampler.reset()
    assert sampler.remaining_indices == order[4 * size:]
    assert list(sampler) == _expected_shard(order[4 * size:], size, trainrun.rank())
    assert len(sampler) == len(list(sampler))
    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and sampler.epoch == 1


def test_state_dict_round_trip_and_horovods_dicts():
    sampler = _sampler(shuffle=False)
    sampler.record_batch(0, 3)
    state = sampler.state_dict()
    assert state["epoch"] == 0 and state["processed_num"] == 3 * trainrun.size()
    other = _sampler(shuffle=False)
    other.load_state_dict(state)
    assert other.processed_num == sampler.processed_num
    assert list(other) == _expected_shard(list(range(23))[3 * trainrun.size():], trainrun.size(),
                                          trainrun.rank())
    # Horovod's own dict has no processed_indices; its earlier one has no processed_num.
    other.load_state_dict({"epoch": 2, "processed_num": 1})
    assert other.epoch == 2 and other.remaining_indices == list(range(1, 23))
    other.load_state_dict({"epoch": 3, "processed_indices": {0, 5}})
    assert other.processed_num == 0 and 0 not in other.remaining_indices
    assert 5 not in other.remaining_indices and len(other.remaining_indices) == 21


def test_get_indices_and_record_indices():
    sampler = _sampler(n=40, shuffle=True, seed=1)
    first = sampler.get_indices(0, 4)
    assert first == list(sampler)[:4]
    assert sampler.get_indices(100, 4) == []
    sampler.record_indices(first)
    assert sampler.processed_indices == set(first)
    sampler.reset()
    assert not set(first) & set(sampler.remaining_indices)
    assert len(sampler.remaining_indices) == 40 - len(first)


def test_elastic_sampler_in_torch_state_sync():
    sampler = _sampler(shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.record_batch(0, 2)
    state.commit()
    sampler.record_batch(1, 2)
    state.restore()
    assert sampler.processed_num == 2 * trainrun.size()
    state.sync()
    assert sampler.processed_num == 2 * trainrun.size()


def test_duplicate_names_raise_before_init():
    # A fresh interpreter, not part of any job: Horovod raises ValueError without hvd.init().
    code = """
import itertools, torch, trainrun, trainrun.torch as hvd
net1, net2 = torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1)
opt = torch.optim.SGD(itertools.chain(net1.parameters(), net2.parameters()), lr=0.1)
named = itertools.chain(net1.named_parameters(), net2.named_parameters())
try:
    hvd.DistributedOptimizer(opt, named_parameters=named)
except ValueError as error:
    assert "duplicate" in str(error) and "weight" in str(error), error
    assert not trainrun.is_initialized()
    print("raised before init")
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINRUN_", "HOROVOD_", "OMPI_", "PMI_"))}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "raised before init" in done.stdout, done.stdout


def test_duplicate_names_raise_in_a_job():
    if not trainrun.is_initialized():
        trainrun.init()
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    named = [("w", model.weight), ("w", model.bias)]
    try:
        hvd.DistributedOptimizer(opt, named_parameters=named)
    except ValueError as error:
        assert "duplicate names: w" in str(error)
    else:
        raise AssertionError("duplicate names were accepted")
