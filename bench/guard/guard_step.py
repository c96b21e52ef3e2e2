"""The guard's step workload (guard.py): DistributedOptimizer steps of a small MLP, run by
`trainrun -np 2 [valgrind ...] python3 guard_step.py --steps N [--callgrind]`.

With --callgrind (the process runs under `valgrind --tool=callgrind --instr-atstart=no`), only the
N timed steps are instrumented: callgrind_control turns instrumentation on after three warm-up
steps and off after the last step, so torch's import and the set-up are not counted (under
instrumentation they take minutes). With --strace OUT, each rank attaches `strace -f -k` to
itself for the timed steps alone and writes OUT.<rank>. Every rank does the same steps on fixed
data.
"""

import argparse
import os
import signal
import subprocess
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


def instrument(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def attach_strace(out, calls):
    """Starts `strace -f -k` on this process (every thread), and returns once each thread is
    traced, so that only what follows is counted (strace -k on torch's import takes a minute)."""
    pid = os.getpid()
    tracer = subprocess.Popen(["strace", "-f", "-k", "-qq", "-o", out, "-e", "trace=" + calls,
                               "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        traced = True
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/status", encoding="utf-8") as f:
                    status = f.read()
            except FileNotFoundError:
                continue
            if "TracerPid:\t0\n" in status:
                traced = False
                break
        if traced:
            return tracer
        if tracer.poll() is not None:
            raise RuntimeError(f"strace exited with {tracer.returncode} before it attached")
        time.sleep(0.05)
    tracer.kill()
    raise RuntimeError("strace did not attach within 60 s")


def detach_strace(tracer):
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--strace", metavar="OUT",
                        help="count the timed steps' system calls: strace -k output to OUT")
    parser.add_argument("--strace-calls", default="futex,sched_yield,poll,ppoll")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()
    hvd.barrier()
    if args.callgrind:
        instrument(True)
    tracer = None
    if args.strace:
        tracer = attach_strace(f"{args.strace}.{hvd.rank()}", args.strace_calls)
        hvd.barrier()  # both ranks traced before the steps (counted alike in every run: it cancels)
    for _ in range(args.steps):
        step()
    if args.callgrind:
        instrument(False)
    if tracer is not None:
        detach_strace(tracer)
    hvd.barrier()


if __name__ == "__main__":
    main()
