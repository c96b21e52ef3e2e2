"""Elastic recovery time: from the SIGKILL of one of 4 local ranks to the next training step the
survivors complete, over --runs runs of examples/elastic_train.py (median, min, max).

    /usr/bin/python3 bench/python/elastic_recovery.py [--runs 10] [--tcp]

Each run starts `trainrun -np 4 --min-np 2` on the digits MLP; the rank that started as 2 writes the
wall-clock time just before it kills itself (after step 30, mid-epoch) and the new rank 0 writes
the time when it completes its first step in the new generation. That span holds everything a
user waits for: the survivors' failed collective, trainrun's reaping of the rank and publishing
of the next generation, the survivors' joining it (a new data plane), restoring the last commit,
the reset callbacks, the sync of rank 0's state (parameters, optimizer, sampler), and one step.
Also printed: trainrun's own "recovered in" figure (loss seen to every survivor connected).

    /usr/bin/python3 bench/python/elastic_recovery.py --grow [--runs 5]

--grow times the other way: a job started by `trainrun --min-np 2 --max-np 4
--host-discovery-script 'cat FILE'` on localhost:2; at epoch 5 FILE gains 127.0.0.1:2, and the
span runs from that rewrite to the first step rank 0 completes at 4 ranks. It holds the discovery
poll (every second), the start of the two new ranks (a Python importing torch each), their joining
the rendezvous, the new generation, the running ranks' HostsUpdatedInterrupt at their next commit,
the sync of rank 0's state to the newcomers, and one step. trainrun's "recovered in" is from the
poll that saw the host to every member joined.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one_run(trainrun, python, tcp):
    with tempfile.NamedTemporaryFile("r", suffix=".times") as times:
        command = [trainrun, "-np", "4", "--min-np", "2", *(["--tcp"] if tcp else []), python,
                   os.path.join(ROOT, "examples/elastic_train.py"), "--epochs", "4",
                   "--kill-rank", "2", "--kill-at-step", "30", "--times", times.name]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"run failed ({done.returncode}):\n{done.stdout}")
        marks = dict(line.split() for line in times.read().splitlines())
        launcher = re.search(r"recovered in (\d+\.\d+) s", done.stdout)
        return float(marks["step"]) - float(marks["kill"]), float(launcher.group(1))


def one_grow(trainrun, python):
    import time
    with tempfile.TemporaryDirectory() as tmp:
        hosts, times = os.path.join(tmp, "hosts"), os.path.join(tmp, "times")
        with open(hosts, "w") as f:
            f.write("localhost:2\n")
        command = [trainrun, "--min-np", "2", "--max-np", "4", "--host-discovery-script",
                   f"cat {hosts}", python, os.path.join(ROOT, "examples/elastic_train.py"),
                   "--epochs", "10", "--times", times, "--step-sleep", "0.2",
                   "--sleep-from-epoch", "5", "--sleep-until-size", "4"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=ROOT)
        out, added = "", None
        for line in proc.stdout:
            out += line
            if added is None and "epoch   5" in line:
                with open(hosts + ".new", "w") as f:
                    f.write("localhost:2\n127.0.0.1:2\n")
                os.rename(hosts + ".new", hosts)
                added = time.time()
        if proc.wait() != 0 or added is None:
            sys.exit(f"run failed ({proc.returncode}):\n{out}")
        with open(times) as f:
            marks = dict(line.split() for line in f.read().splitlines())
        launcher = re.search(r"joined .* recovered in (\d+\.\d+) s", out)
        return float(marks["step"]) - added, float(launcher.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tcp", action="store_true", help="TCP between the ranks (trainrun --tcp)")
    parser.add_argument("--trainrun", default=os.path.join(ROOT, "build/bin/trainrun"))
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--grow", action="store_true",
                        help="time a host added to the discovery output instead of a SIGKILL")
    args = parser.parse_args()
    to_step, formed = [], []
    if args.grow:
        for run in range(args.runs):
            step, launcher = one_grow(args.trainrun, args.python)
            to_step.append(step)
            formed.append(launcher)
            print(f"run {run + 1}: host added to the first step at 4 ranks {step * 1000:.0f} ms "
                  f"(trainrun: recovered in {launcher * 1000:.0f} ms)", flush=True)
        print(f"discovery output gains a host to the first step at the new size, {args.runs} "
              f"runs: median {statistics.median(to_step) * 1000:.0f} ms, min "
              f"{min(to_step) * 1000:.0f} ms, max {max(to_step) * 1000:.0f} ms; trainrun's "
              f"'recovered in' median {statistics.median(formed) * 1000:.0f} ms")
        return
    for run in range(args.runs):
        step, launcher = one_run(args.trainrun, args.python, args.tcp)
        to_step.append(step)
        formed.append(launcher)
        print(f"run {run + 1}: SIGKILL to next step {step * 1000:.0f} ms (generation formed in "
              f"{launcher * 1000:.0f} ms)", flush=True)
    print(f"SIGKILL to the survivors' next step, {args.runs} runs, "
          f"{'tcp' if args.tcp else 'shm'}: median {statistics.median(to_step) * 1000:.0f} ms, "
          f"min {min(to_step) * 1000:.0f} ms, max {max(to_step) * 1000:.0f} ms; trainrun's "
          f"'recovered in' median {statistics.median(formed) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
