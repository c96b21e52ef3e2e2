"""The guard's step workload (guard.py): DistributedOptimizer steps of a small MLP, run by
`trainrun -np 2 [valgrind ...] python3 guard_step.py --steps N [--callgrind]`.

With --callgrind (the process runs under `valgrind --tool=callgrind --instr-atstart=no`), only the
N timed steps are instrumented: callgrind_control turns instrumentation on after three warm-up
steps and off after the last step, so torch's import and the set-up are not counted (under
instrumentation they take minutes). Every rank does the same steps on fixed data.
"""

import argparse
import os
import subprocess
import sys

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--callgrind", action="store_true")
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
    for _ in range(args.steps):
        step()
    if args.callgrind:
        instrument(False)
    hvd.barrier()


if __name__ == "__main__":
    main()
