#!/usr/bin/env python3
"""Per-call overhead of trainrun.run: an empty fn at np=4, next to `trainrun -np 4 python -c pass`.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/run_overhead.py [ROUNDS]

Rounds alternate the two (after one warm-up of each), so a shared machine's slow phases fall on
both alike; prints each one's median and the difference, which is what trainrun.run adds to a
bare launch of the same interpreter: cloudpickle on every rank, the connection back to the caller,
the payload and the results.
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
import trainrun  # noqa: E402  pylint: disable=wrong-import-position
from trainrun._launch import _find_trainrun  # noqa: E402  pylint: disable=wrong-import-position


def empty():
    pass


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    launcher = _find_trainrun(None)  # trainrun.run's own lookup: $TRAINRUN_BIN, this build, PATH
    bare = [launcher, "-np", "4", sys.executable, "-c", "pass"]
    trainrun.run(empty, np=4, trainrun=launcher)
    subprocess.run(bare, check=True)
    run_times, bare_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        trainrun.run(empty, np=4, trainrun=launcher)
        run_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(bare, check=True)
        bare_times.append(time.perf_counter() - start)
    a, b = statistics.median(run_times) * 1e3, statistics.median(bare_times) * 1e3
    print(f"trainrun.run(empty fn, np=4):            median {a:7.1f} ms  (n={rounds})")
    print(f"trainrun -np 4 {sys.executable} -c pass: median {b:7.1f} ms")
    print(f"trainrun.run's overhead per call:        {a - b:7.1f} ms")


if __name__ == "__main__":
    main()
