#!/usr/bin/env python3
"""Start-to-exit time of launches, measured side by side: A B A B ... for ROUNDS rounds.

    bench/launcher/launch_time.py                  # trainrun vs mpirun, /bin/true and a barrier
    bench/launcher/launch_time.py --rounds 20 --np 8

Each case is one command line; every round runs every case once, in order, so the machine's
noise falls on all of them alike. Prints each case's median, and the ratio of medians of trainrun
to its peer, plus the median of the per-round ratios (robust to slow phases of a shared machine).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = os.path.join(os.path.dirname(ROOT), "shared", "bench", "peers.sh")


def cases(np, build):
    trainrun = os.path.join(build, "bin", "trainrun")
    barrier = os.path.join(build, "bin", "barrier_example")
    return [
        ("trainrun /bin/true", [trainrun, "-np", str(np), "/bin/true"]),
        ("mpirun /bin/true",
         ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", "/bin/true"]),
        ("trainrun barrier", [trainrun, "-np", str(np), barrier]),
        ("mpirun barrier (peers.sh)", [PEERS, "launch", "mpirun", str(np)]),
    ]


def run_once(argv):
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()

    table = cases(args.np, args.build)
    for _, argv in table:  # warm the page cache; not timed
        run_once(argv)
    times = {name: [] for name, _ in table}
    for _ in range(args.rounds):
        for name, argv in table:
            times[name].append(run_once(argv))

    print(f"# np={args.np}, {args.rounds} alternating rounds, wall seconds")
    print(f"# {'case':<28} {'median':>9} {'min':>9} {'max':>9}")
    for name, values in times.items():
        print(f"  {name:<28} {statistics.median(values)*1e3:8.1f}ms {min(values)*1e3:8.1f}ms "
              f"{max(values)*1e3:8.1f}ms")
    names = list(times)
    for ours, peer in ((names[0], names[1]), (names[2], names[3])):
        ratio = statistics.median(times[ours]) / statistics.median(times[peer])
        per_round = statistics.median(a / b for a, b in zip(times[ours], times[peer]))
        print(f"  {ours} / {peer}: {ratio:.3f} (median of per-round ratios {per_round:.3f})")


if __name__ == "__main__":
    main()
