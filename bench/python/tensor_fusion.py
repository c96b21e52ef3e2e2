"""Many small tensors at once (Horovod's tensor fusion): 200 float32 tensors of 4-64 KiB allreduced
together, beside one allreduce of a single tensor of their total size, in one job.

    build/bin/trainrun -np 2 /usr/bin/python3 bench/python/tensor_fusion.py [--rounds 15]

Three ways, alternating round by round (fused, grouped, async, then async, grouped, fused, ...) so
that drift in machine load hits all alike:
  fused    one allreduce_ of a tensor holding as many elements as the 200 together (the bound);
  grouped  grouped_allreduce_ of the list (one fused collective; the copies in and out included);
  async    allreduce_async_ of each of the 200, then synchronize of every handle.
--shuffled adds a fourth way, "shuffled": as async, but every rank submits the 200 (named) in
an order of its own, drawn anew for every call (before the clock starts), so the ranks match them
by name (negotiation); beside async, the cost of an order that differs between ranks.
Rank 0 prints each one's median time per call over the rounds, and the ratio to fused (goal:
grouped and async at most 1.10); and each one's best call (the fastest of all its calls, on the
slowest rank), which on a machine loaded by other work tells what a quiet one would show better
than the median does. Tensors are torch tensors (--numpy: NumPy arrays); their sizes are
drawn once from a fixed seed, uniformly from 4 to 64 KiB in whole float32 elements. Every result
is checked. A benchmark, not a test: exit status 0 unless a result is wrong.

--phases also splits async's time (slowest rank, medians over its calls): the allreduce_async_
calls, the first synchronize (which waits for the fused allreduce), and the other synchronize
calls (each collects a result already there); beside fused, this says how much of async's excess is
per-call work on the Python thread and how much is in the collective and the hand-offs to and from
the communication thread.
"""

import argparse
import os
import random
import statistics
import sys
import time

try:
    import trainrun
except ImportError:
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=15)
parser.add_argument("--tensors", type=int, default=200)
parser.add_argument("--repeat", type=int, default=5, help="calls per way per round")
parser.add_argument("--numpy", action="store_true", help="NumPy arrays instead of torch tensors")
parser.add_argument("--phases", action="store_true", help="split async's time into its phases")
parser.add_argument("--shuffled", action="store_true",
                    help="add 'shuffled': async with every rank submitting the named tensors in "
                         "its own random order, new every call (matched by name)")
args = parser.parse_args()

trainrun.init()
rank, size = trainrun.rank(), trainrun.size()
rng = random.Random(20)
counts = [rng.randint(1024, 16384) for _ in range(args.tensors)]  # 4-64 KiB of float32
total = sum(counts)

if args.numpy:
    import numpy

    def make(n):
        return numpy.full(n, rank + 1, dtype=numpy.float32)

    def fill(t):
        t.fill(rank + 1)

    def ok(t):
        return bool((t == size * (size + 1) / 2).all())
else:
    import torch

    def make(n):
        return torch.full((n,), float(rank + 1), dtype=torch.float32)

    def fill(t):
        t.fill_(rank + 1)

    def ok(t):
        return bool((t == size * (size + 1) / 2).all())

flat = make(total)
tensors = [make(n) for n in counts]


def fused():
    trainrun.allreduce_(flat, op=trainrun.Sum, name="fused")
    return [flat]


def grouped():
    return trainrun.grouped_allreduce_(tensors, op=trainrun.Sum, name="grouped")


def asynchronous():
    handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"t{i}")
               for i, t in enumerate(tensors)]
    return [trainrun.synchronize(h) for h in handles]


phases = {"allreduce_async_": [], "first synchronize": [], "other synchronize": []}


def asynchronous_in_phases():
    start = time.perf_counter()
    handles = [trainrun.allreduce_async_(t, op=trainrun.Sum, name=f"t{i}")
               for i, t in enumerate(tensors)]
    queued = time.perf_counter()
    out = [trainrun.synchronize(handles[0])]
    first = time.perf_counter()
    out += [trainrun.synchronize(h) for h in handles[1:]]
    phases["allreduce_async_"].append(queued - start)
    phases["first synchronize"].append(first - queued)
    phases["other synchronize"].append(time.perf_counter() - first)
    return out


# Another order on every rank, new for every call: drawn before the clock (shuffling 200 in Python
# takes ~0.1 ms, which a training step's hooks do not spend: their order simply differs).
shuffler = random.Random(1000 + rank)
orders = []
for _ in range((args.rounds + 1) * args.repeat):
    orders.append(list(range(len(tensors))))
    shuffler.shuffle(orders[-1])


def shuffled():
    order = orders.pop()
    handles = {i: trainrun.allreduce_async_(tensors[i], op=trainrun.Sum, name=f"t{i}")
               for i in order}
    return [trainrun.synchronize(handles[i]) for i in order]


ways = {"fused": fused, "grouped": grouped,
        "async": asynchronous_in_phases if args.phases else asynchronous}
if args.shuffled:
    ways["shuffled"] = shuffled
wrong = 0


every = {name: [] for name in ways}  # every timed call, for the best


def timed(name):
    global wrong
    best = []
    for _ in range(args.repeat):
        fill(flat)
        for t in tensors:
            fill(t)
        trainrun.barrier()
        start = time.perf_counter()
        out = ways[name]()
        best.append(time.perf_counter() - start)
        every[name].append(best[-1])
        wrong += sum(0 if ok(t) else 1 for t in out)
    return statistics.median(best)


for name in ways:  # warm up
    timed(name)
    every[name].clear()
for p in phases.values():
    p.clear()
times = {name: [] for name in ways}
order = list(ways)
for r in range(args.rounds):
    for name in (order if r % 2 == 0 else order[::-1]):
        times[name].append(timed(name))

# The slowest rank's median decides, as the collective ends when it ends.
medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}


def scalar(value):
    return numpy.array([value], dtype=numpy.float64) if args.numpy else torch.tensor([float(value)])


slowest = {name: trainrun.allreduce(scalar(m), op=trainrun.Max, name=f"max {name}")
           for name, m in medians.items()}
bests = {name: trainrun.allreduce(scalar(min(every[name]) * 1e3), op=trainrun.Max,
                                  name=f"best {name}")
         for name in ways}
bad = trainrun.allreduce(scalar(wrong), op=trainrun.Sum, name="wrong")
split = {p: float(trainrun.allreduce(scalar(statistics.median(v) * 1e3), op=trainrun.Max,
                                    name=f"phase {p}")[0])
         for p, v in phases.items() if args.phases}
if rank == 0:
    ms = {name: float(v[0]) for name, v in slowest.items()}
    best_ms = {name: float(v[0]) for name, v in bests.items()}
    transport = trainrun._core.string_setting("TRAINRUN_TRANSPORT")
    print(f"# {args.tensors} float32 tensors of 4-64 KiB, {total * 4 / 2**20:.2f} MiB in all; "
          f"{size} ranks (TRAINRUN_TRANSPORT={transport}); "
          f"median of {args.rounds} alternating rounds x {args.repeat} calls (slowest rank)")
    print(f"# {'way':8s} {'time (ms)':>10s} {'busbw (GB/s)':>13s} {'/ fused':>8s} "
          f"{'best (ms)':>10s} {'/ fused':>8s}")
    for name in ways:
        busbw = total * 4 / (ms[name] / 1e3) / 1e9 * 2 * (size - 1) / size
        print(f"  {name:8s} {ms[name]:10.3f} {busbw:13.3f} {ms[name] / ms['fused']:8.2f} "
              f"{best_ms[name]:10.3f} {best_ms[name] / best_ms['fused']:8.2f}")
    for p, v in split.items():
        print(f"  async's {p:18s} {v:8.3f} ms  ({v / ms['fused']:.2f} of fused)")
    print(f"# wrong results: {int(bad[0])}")
trainrun.shutdown()
sys.exit(1 if int(bad[0]) else 0)
