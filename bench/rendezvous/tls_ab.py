"""What TLS costs a job's start, for two builds: alternating rounds (A then B, then B then A, ...)
of each build with TLS and with --no-tls, printing medians, the TLS / plain ratio of each build,
and the load average seen before each round.

  /usr/bin/python3 bench/rendezvous/tls_ab.py BUILD_A BUILD_B [--rounds 7] [--sizes 1024,8192]

BUILD_A, BUILD_B: directories holding trainrun and rendezvous_bench (a build's bin/). Each round
runs, for each build and each of TLS and --no-tls:
  - `trainrun -q --oversubscribe -np 8 /bin/true`, --np-runs times (the round keeps their median):
    a job's start and end on one machine, its ranks on the rendezvous' Unix socket;
  - `rendezvous_bench --runs 1 --processes 16 --relay N` for each N of --sizes: a multi-host
    start through one relay per simulated host of 8 workers (relays connected before the clock);
  - `rendezvous_bench --runs 1 --processes 16 N` for each N of --direct: every worker dials the
    server's TCP port itself (its own handshake inside the clock).
The bench's figures are its time in ms and the server's CPU in ms. Run it as
  setsid bash -c 'echo -20 > /proc/$$/autogroup && exec nice -n -20 "$@"' x /usr/bin/python3 ...
on a shared machine (root), so that other sessions' work hardly competes.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def np8(build, tls, runs):
    argv = [os.path.join(build, "trainrun"), "-q", "--oversubscribe", "-np", "8"]
    if not tls:
        argv.append("--no-tls")
    argv.append("/bin/true")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - t0) * 1000)
        if result.returncode != 0:
            sys.exit(f"tls_ab: {' '.join(argv)} exited {result.returncode}: "
                     f"{result.stderr.decode(errors='replace')}")
    return statistics.median(times), None


def bench(build, tls, size, relay):
    argv = [os.path.join(build, "rendezvous_bench"), "--runs", "1", "--processes", "16"]
    if relay:
        argv.append("--relay")
    if not tls:
        argv.append("--no-tls")
    argv.append(str(size))
    result = subprocess.run(argv, capture_output=True, text=True)
    last = result.stdout.strip().splitlines()[-1].split() if result.stdout.strip() else []
    if result.returncode != 0 or len(last) < 6 or last[0] != str(size):
        sys.exit(f"tls_ab: {' '.join(argv)} exited {result.returncode}:\n{result.stdout}"
                 f"{result.stderr}")
    return float(last[3]), float(last[5])  # median ms, server cpu ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--np-runs", type=int, default=5)
    parser.add_argument("--sizes", default="1024,8192", help="worker counts through relays")
    parser.add_argument("--direct", default="1024", help="worker counts dialing the server")
    args = parser.parse_args()
    cases = [("np8 /bin/true", lambda b, t: np8(b, t, args.np_runs))]
    for n in filter(None, args.sizes.split(",")):
        cases.append((f"bench --relay {n}", lambda b, t, n=int(n): bench(b, t, n, True)))
    for n in filter(None, args.direct.split(",")):
        cases.append((f"bench {n}", lambda b, t, n=int(n): bench(b, t, n, False)))
    builds = {"A": args.a, "B": args.b}
    results = {}  # (case, build, tls) -> [(ms, cpu)]
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = "AB" if r % 2 == 0 else "BA"
        line = []
        for name, run in cases:
            for which in order:
                for tls in ((True, False) if r % 2 == 0 else (False, True)):
                    ms, cpu = run(builds[which], tls)
                    results.setdefault((name, which, tls), []).append((ms, cpu))
                    line.append(f"{name} {which} {'tls' if tls else 'plain'} {ms:.0f}")
        print(f"# round {r + 1} ({order}), load {loads[-1]:.1f}: " + "; ".join(line), flush=True)
    print(f"# A = {args.a}, B = {args.b}; {args.rounds} rounds, load {min(loads):.1f}-"
          f"{max(loads):.1f} (median {statistics.median(loads):.1f}); medians in ms")
    print("| case | A: TLS | A: --no-tls | A: TLS / plain | B: TLS | B: --no-tls | B: TLS / plain |"
          " server CPU A: TLS / plain | server CPU B: TLS / plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, _ in cases:
        cells = [name]
        cpus = []
        for which in "AB":
            tls = statistics.median(ms for ms, _ in results[(name, which, True)])
            plain = statistics.median(ms for ms, _ in results[(name, which, False)])
            cells += [f"{tls:.0f}", f"{plain:.0f}", f"{tls / plain:.2f}"]
            if results[(name, which, True)][0][1] is None:
                cpus.append("—")
            else:
                cpus.append(
                    f"{statistics.median(c for _, c in results[(name, which, True)]):.0f} / "
                    f"{statistics.median(c for _, c in results[(name, which, False)]):.0f}")
        print("| " + " | ".join(cells + cpus) + " |")


if __name__ == "__main__":
    main()
