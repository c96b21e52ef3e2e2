"""The throughput cost of state.commit() every N steps, for trainrun.torch.elastic.TorchState.

    build/bin/trainrun -np 4 /usr/bin/python3 bench/python/commit_cost.py [--model digits|mlp]

Trains with a TorchState (model, optimizer, ElasticSampler, counters) and calls commit() every N
steps, for N in --every (0: never). Short rounds alternate the Ns so drift in machine load hits all
alike; rank 0 prints each N's median step time, its cost over never committing, and what one
commit takes (in-memory copies of the parameters, optimizer state and sampler, plus
check_host_updates: one launcher call on rank 0 and a broadcast). Exit status 0 either way.
"""

import argparse
import os
import statistics
import sys
import time

try:
    import trainrun.torch as hvd
except ImportError:
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun.torch as hvd

import torch
import torch.nn.functional as F


def make_model(kind):
    torch.manual_seed(0)
    if kind == "digits":  # examples/train.py's model: 17k parameters
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 10)), 64
    # about 4.2M parameters (16 MiB)
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10)), 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["digits", "mlp"], default="digits")
    parser.add_argument("--every", default="0,1,10,100", help="commit every N steps; 0: never")
    parser.add_argument("--steps", type=int, default=100, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    model, width = make_model(args.model)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters())
    data = torch.randn(4096, width)
    labels = torch.randint(0, 10, (4096,))
    sampler = hvd.elastic.ElasticSampler(range(len(data)), shuffle=True)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0,
                                   step=0)
    everies = [int(n) for n in args.every.split(",")]
    step_times = {n: [] for n in everies}
    commit_times = []

    def round_of(every):
        batch_idx = 0
        start = time.perf_counter()
        for _ in range(args.steps):
            if (batch_idx + 1) * 32 > len(state.sampler):
                state.sampler.set_epoch(state.sampler.epoch + 1)
                batch_idx = 0
            batch = torch.tensor(state.sampler.get_indices(batch_idx, 32))
            optimizer.zero_grad()
            F.cross_entropy(model(data[batch]), labels[batch]).backward()
            optimizer.step()
            state.sampler.record_batch(batch_idx, 32)
            batch_idx += 1
            state.step += 1
            if every and state.step % every == 0:
                t = time.perf_counter()
                state.commit()
                commit_times.append(time.perf_counter() - t)
        return (time.perf_counter() - start) / args.steps

    @hvd.elastic.run
    def bench(state):
        round_of(everies[0])  # warm-up
        for r in range(args.rounds):
            order = everies if r % 2 == 0 else everies[::-1]
            for every in order:
                step_times[every].append(round_of(every))

    bench(state)
    if hvd.rank() == 0:
        base = statistics.median(step_times[0]) if 0 in step_times else None
        params = sum(p.numel() for p in model.parameters())
        print(f"{args.model}: {params} parameters, {hvd.size()} ranks; one commit: median "
              f"{statistics.median(commit_times) * 1e3:.2f} ms")
        for every in everies:
            t = statistics.median(step_times[every])
            cost = f", {100 * (t / base - 1):+.1f}% vs never" if base and every else ""
            print(f"commit every {every or 'never'}: {t * 1e3:.3f} ms/step{cost}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
