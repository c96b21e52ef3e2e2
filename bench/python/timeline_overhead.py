"""Cost of the timeline: the same allreduces with the timeline off and on, in one job.

    build/bin/trainrun -np 2 /usr/bin/python3 bench/python/timeline_overhead.py [--trace FILE]

Short rounds alternate (off, on, on, off, ...) so drift in machine load hits both alike; for each
message size rank 0 prints the median time per allreduce off and on, and the median of per-round
ratios on/off. Every collective with the timeline on writes three trace events (the operation and
its two phases) in one write(2). A benchmark, not a test: exit status 0 either way.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

try:
    import trainrun
except ImportError:
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--trace", default=os.path.join(tempfile.gettempdir(),
                                                    "trainrun_timeline_overhead.json"))
parser.add_argument("--rounds", type=int, default=10)
args = parser.parse_args()

trainrun.init()


def per_op(x, iterations):
    trainrun.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        trainrun.allreduce_(x, op=trainrun.Sum)
    return (time.perf_counter() - start) / iterations * 1e6


for count, iterations in ((1024, 500), (1 << 18, 50)):
    x = torch.ones(count)
    per_op(x, 10)  # warm up
    off, on, ratios = [], [], []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {}
        for traced in order:
            if traced:
                trainrun.start_timeline(args.trace)
            times[traced] = per_op(x, iterations)
            if traced:
                trainrun.stop_timeline()
        off.append(times[False])
        on.append(times[True])
        ratios.append(times[True] / times[False])
    if trainrun.rank() == 0:
        print(f"{count * 4:>8} bytes: off {statistics.median(off):8.1f} us/op, "
              f"on {statistics.median(on):8.1f} us/op, on/off {statistics.median(ratios):.3f} "
              f"(median of {args.rounds} alternating rounds)", flush=True)
trainrun.shutdown()
