"""Runs a command as N ranks on this host without the trainrun launcher, for the Python tests.

    /usr/bin/python3 tests/python/run_ranks.py -np 3 [--timeout 120] -- python3 -m pytest ...

The ranks meet through a temporary TRAINRUN_FILE_STORE directory (environment.h) instead of the
launcher's rendezvous server. Like trainrun: each rank's output lines are tagged with its rank,
the first rank that fails ends the others (SIGTERM, then SIGKILL), and the exit status is that
rank's. Used by CTest when build/bin/trainrun is not built, and handy while developing.
"""

import argparse
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-np", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")

    with tempfile.TemporaryDirectory(prefix="trainrun-store-") as store:
        procs = []
        for rank in range(args.np):
            env = dict(os.environ, TRAINRUN_FILE_STORE=store, TRAINRUN_RANK=str(rank),
                       TRAINRUN_SIZE=str(args.np), TRAINRUN_LOCAL_RANK=str(rank),
                       TRAINRUN_LOCAL_SIZE=str(args.np), TRAINRUN_JOB_TOKEN="run-ranks")
            env.setdefault("OMP_NUM_THREADS", "1")
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        return supervise(procs, args.timeout)


def supervise(procs, timeout):
    selector = selectors.DefaultSelector()
    for rank, p in enumerate(procs):
        os.set_blocking(p.stdout.fileno(), False)
        selector.register(p.stdout, selectors.EVENT_READ, rank)
    partial = {rank: b"" for rank in range(len(procs))}
    deadline = time.monotonic() + timeout
    status = None
    open_streams = len(procs)
    while open_streams:
        if time.monotonic() > deadline:
            print(f"run_ranks: timed out after {timeout:.0f} s; killing every rank", flush=True)
            status = status or 124
            break
        for key, _ in selector.select(timeout=0.2):
            rank = key.data
            chunk = key.fileobj.read()
            if not chunk:
                selector.unregister(key.fileobj)
                open_streams -= 1
                chunk = b"\n" if partial[rank] else b""
            lines = (partial[rank] + chunk).split(b"\n")
            partial[rank] = lines.pop()
            for line in lines:
                sys.stdout.write(f"[{rank}] {line.decode(errors='replace')}\n")
            sys.stdout.flush()
        for rank, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0) and status is None:
                status = code if code > 0 else 128 - code
                print(f"run_ranks: rank {rank} exited with {code}; ending the others", flush=True)
                terminate(procs)
    terminate(procs)
    for rank, p in enumerate(procs):
        code = p.wait()
        if code != 0 and status is None:
            status = code if code > 0 else 128 - code
    return status or 0


def terminate(procs, grace=5.0):
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(p.poll() is None for p in alive) and time.monotonic() < end:
        time.sleep(0.05)
    for p in alive:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
