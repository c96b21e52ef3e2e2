"""Training step time: trainrun.torch.DistributedOptimizer beside PyTorch DDP (gloo), one run.

    build/bin/trainrun -np 2 /usr/bin/python3 bench/python/step_time.py [--model mlp|digits|resnet18]
    build/bin/trainrun -np 2 /usr/bin/python3 bench/python/step_time.py --model resnet18 --fp16

All contenders take the same model, data and SGD settings in the same processes; short rounds
alternate (ours then DDP, DDP then ours, ...) so drift in machine load hits all alike, and the
verdict is the median of per-round ratios. Each step is zero_grad, forward, backward (gradient
allreduce overlapped with it), step. --fp16 adds a contender, DistributedOptimizer with
compression=Compression.fp16; "no-comm" is the bound: the same step without any communication,
each rank on its own data, with the cores shared as in the others. Prints the slowest rank's median step time in milliseconds, the
job's images (samples) per second and the ratios; exit status 0 either way (a benchmark, not a
test).

resnet18 is torchvision's ResNet-18 (Debian's python3-torchvision) on synthetic 64x64 images with
random labels, as Horovod's pytorch_synthetic_benchmark.py: random data, a fixed batch per rank,
images/s. The scaling efficiency is each contender's images/s over N x one rank's: "one-rank" is
rank 0 alone running the no-comm step while the others sleep in a barrier, timed in the same
rounds (this machine's load drifts too much for a separate -np 1 run to be a fair base). With more
ranks than cores it is bounded by cores/N.

torch's intra-op threads are set to --threads per rank (default 1: ranks share this machine's
cores, and more threads than cores per rank only contend).

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
    if kind == "resnet18":
        import torchvision  # pylint: disable=import-outside-toplevel

        return torchvision.models.resnet18(num_classes=1000)
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


def time_steps(model, optimizer, batches, steps, cpu=None):
    """Returns each step's wall time; appends each step's CPU time (all of this process's threads:
    the communication's included) to `cpu`, when given."""
    times = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - cpu_start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "digits", "resnet18"], default="mlp")
    parser.add_argument("--batch", type=int, default=None,
                        help="per rank (default 64; 32 for resnet18, as Horovod's benchmark)")
    parser.add_argument("--image-size", type=int, default=64, help="resnet18's input, square")
    parser.add_argument("--rounds", type=int, default=None,
                        help="default 20; 8 for resnet18")
    parser.add_argument("--steps", type=int, default=None,
                        help="per round and contender (default 5; 2 for resnet18)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--fp16", action="store_true",
                        help="also DistributedOptimizer with compression=Compression.fp16")
    args = parser.parse_args()
    heavy = args.model == "resnet18"
    args.batch = args.batch or (32 if heavy else 64)
    args.rounds = args.rounds or (8 if heavy else 20)
    args.steps = args.steps or (2 if heavy else 5)
    torch.set_num_threads(args.threads)

    hvd.init()
    init_torch_distributed()
    g = torch.Generator().manual_seed(hvd.rank())
    if heavy:  # synthetic images, one fixed batch (Horovod's synthetic benchmark)
        batches = [(torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g),
                    torch.randint(0, 1000, (args.batch,), generator=g))]
    else:
        inputs = 64 if args.model == "digits" else 256
        batches = [(torch.randn(args.batch, inputs, generator=g),
                    torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(8)]

    contenders = {}  # name: (model, optimizer)
    ours_model = make_model(args.model)
    contenders["trainrun"] = (ours_model, hvd.DistributedOptimizer(
        torch.optim.SGD(ours_model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=ours_model.named_parameters()))
    if args.fp16:
        fp16_model = make_model(args.model)
        contenders["trainrun-fp16"] = (fp16_model, hvd.DistributedOptimizer(
            torch.optim.SGD(fp16_model.parameters(), lr=0.01, momentum=0.9),
            named_parameters=fp16_model.named_parameters(), compression=hvd.Compression.fp16))
    ddp_model = DistributedDataParallel(make_model(args.model))
    contenders["ddp"] = (ddp_model, torch.optim.SGD(ddp_model.parameters(), lr=0.01,
                                                    momentum=0.9))
    # The bound: the same step with no communication at all, under the same sharing of the cores.
    local_model = make_model(args.model)
    contenders["no-comm"] = (local_model, torch.optim.SGD(local_model.parameters(), lr=0.01,
                                                          momentum=0.9))

    params = sum(p.numel() for p in ours_model.parameters())
    results = {name: [] for name in contenders}
    cpu = {name: [] for name in contenders}  # CPU time per step, this rank's threads together
    # Per round: each contender / DDP, a paired comparison that load drift cannot bias.
    ratios = {name: [] for name in contenders if name != "ddp"}
    for model, opt in contenders.values():  # warm-up: buffers, buckets, connections
        time_steps(model, opt, batches, 2 if heavy else 5)
    # One rank alone (rank 0, the no-comm step, the others asleep in a barrier): the figure the
    # scaling efficiency divides by, taken in the same rounds so that machine load hits it alike.
    solo = []
    names = list(contenders) + ["one-rank"]
    for r in range(args.rounds):
        # Alternate who goes first, so none always runs right after another.
        order = names if r % 2 == 0 else names[::-1]
        this_round = {}
        for name in order:
            if name == "one-rank":
                if hvd.rank() == 0:
                    solo += time_steps(*contenders["no-comm"], batches, args.steps)
                hvd.barrier()
                continue
            this_round[name] = time_steps(*contenders[name], batches, args.steps, cpu[name])
            results[name] += this_round[name]
        for name in ratios:
            ratios[name].append(statistics.median(this_round[name]) /
                                statistics.median(this_round["ddp"]))

    # Every rank's median, then the slowest rank's (a step is as slow as its slowest rank).
    medians = {k: max(hvd.allgather_object(statistics.median(v))) for k, v in results.items()}
    # CPU per step moves far less than wall time with other work on the machine (no-comm: 59-64 ms
    # of CPU where its wall time ranged 60-260 ms): the mean of the ranks' medians.
    cpu_ms = {k: 1e3 * statistics.mean(hvd.allgather_object(statistics.median(v)))
              for k, v in cpu.items()}
    ratio = {k: statistics.median(hvd.allgather_object(statistics.median(v)))
             for k, v in ratios.items()}
    if hvd.rank() == 0:
        print(f"# model {args.model}: {params} parameters ({params * 4 / 2**20:.2f} MiB of "
              f"float32 gradients), batch {args.batch} per rank, {hvd.size()} ranks, "
              f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s) per rank, "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"# {args.rounds} alternating rounds of {args.steps} steps; median step time of "
              "the slowest rank; images/s of the whole job; cpu_ms: CPU time per step of a rank's "
              "threads together (median, mean over ranks)")
        print(f"{'contender':>14} {'step_ms':>9} {'images/s':>9} {'/ddp':>6} {'cpu_ms':>7}")
        for name, seconds in medians.items():
            label = "ddp-gloo" if name == "ddp" else name
            per_round = f"{ratio[name]:6.3f}" if name in ratio else f"{1:6.3f}"
            print(f"{label:>14} {seconds * 1e3:9.3f} "
                  f"{args.batch * hvd.size() / seconds:9.1f} {per_round} {cpu_ms[name]:7.2f}")
        for name, value in ratio.items():
            print(f"# {name} / ddp: {value:.3f} median of per-round step-time ratios "
                  f"({'not slower' if value <= 1.0005 else 'SLOWER'}; speed-up {1 / value:.3f}x)")
        one = args.batch / statistics.median(solo)
        print(f"{'one-rank':>14} {statistics.median(solo) * 1e3:9.3f} {one:9.1f}      -")
        for name, seconds in medians.items():
            if name != "no-comm":
                print(f"# scaling efficiency of {name} against one rank alone: "
                      f"{args.batch * hvd.size() / seconds:.1f} / ({hvd.size()} x {one:.1f}) = "
                      f"{args.batch / seconds / one:.2f}")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
