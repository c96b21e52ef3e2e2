"""Training step time: trainrun.torch.DistributedOptimizer beside PyTorch DDP (gloo), one run.

    build/bin/trainrun -np 2 /usr/bin/python3 bench/python/step_time.py [--model mlp|digits]

Both take the same model, data and SGD settings in the same processes; short rounds alternate
(ours then DDP, DDP then ours, ...) so drift in machine load hits both alike, and the verdict is
the median of per-round ratios. Each step is zero_grad, forward,
backward (gradient allreduce overlapped with it), step. Prints per-rank-0 medians in
milliseconds and the ratio; exit status 0 either way (a benchmark, not a test).

DDP meets through torchrun's variables that trainrun sets (MASTER_ADDR, MASTER_PORT); without
them (e.g. under tests/python/run_ranks.py) rank 0 picks a free loopback port and shares it.
"""

import argparse
import os
import socket
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
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def make_model(kind):
    torch.manual_seed(0)
    if kind == "digits":  # examples/train.py's model
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 10))
    layers, width = [], 512  # about 0.66 M parameters: a few fusion buckets
    for i in range(3):
        layers += [torch.nn.Linear(256 if i == 0 else width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def init_torch_distributed():
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        port = None
        if hvd.rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(hvd.broadcast_object(port, root_rank=0))
    dist.init_process_group("gloo", init_method="env://", rank=hvd.rank(),
                            world_size=hvd.size())


def time_steps(model, optimizer, batches, steps):
    times = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "digits"], default="mlp")
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="per round and contender")
    args = parser.parse_args()

    hvd.init()
    init_torch_distributed()
    inputs = 64 if args.model == "digits" else 256
    g = torch.Generator().manual_seed(hvd.rank())
    batches = [(torch.randn(args.batch, inputs, generator=g),
                torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(8)]

    ours_model = make_model(args.model)
    ours = hvd.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01,
                                                    momentum=0.9),
                                    named_parameters=ours_model.named_parameters())
    ddp_model = DistributedDataParallel(make_model(args.model))
    ddp = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

    params = sum(p.numel() for p in ours_model.parameters())
    results = {"trainrun": [], "ddp": []}
    ratios = []  # per round: ours / DDP, a paired comparison that load drift cannot bias
    time_steps(ours_model, ours, batches, 5)  # warm-up: buffers, buckets, connections
    time_steps(ddp_model, ddp, batches, 5)
    for r in range(args.rounds):
        # Alternate who goes first, so neither always runs right after the other.
        order = ["trainrun", "ddp"] if r % 2 == 0 else ["ddp", "trainrun"]
        this_round = {}
        for name in order:
            model, opt = (ours_model, ours) if name == "trainrun" else (ddp_model, ddp)
            this_round[name] = time_steps(model, opt, batches, args.steps)
            results[name] += this_round[name]
        ratios.append(statistics.median(this_round["trainrun"]) /
                      statistics.median(this_round["ddp"]))

    # Every rank's median, then the slowest rank's (a step is as slow as its slowest rank).
    medians = {k: max(hvd.allgather_object(statistics.median(v))) for k, v in results.items()}
    ratio = statistics.median(hvd.allgather_object(statistics.median(ratios)))
    if hvd.rank() == 0:
        ours_ms, ddp_ms = medians["trainrun"] * 1e3, medians["ddp"] * 1e3
        print(f"# model {args.model}: {params} parameters ({params * 4 / 2**20:.2f} MiB of "
              f"float32 gradients), batch {args.batch} per rank, {hvd.size()} ranks, "
              f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
        print(f"# {args.rounds} alternating rounds of {args.steps} steps; median step time of "
              "the slowest rank")
        print(f"{'contender':>10} {'step_ms':>9}")
        print(f"{'trainrun':>10} {ours_ms:9.3f}")
        print(f"{'ddp-gloo':>10} {ddp_ms:9.3f}")
        print(f"# trainrun / ddp: {ours_ms / ddp_ms:.3f} overall, {ratio:.3f} median of "
              f"per-round ratios ({'not slower' if ratio <= 1.0 else 'SLOWER'})")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
