"""Allreduce of GPU buffers: trainrun beside torch.distributed, per size, as JSON lines.

    build/bin/trainrun -np 1 python3 bench/python/gpu_allreduce.py --impl trainrun
    build/bin/trainrun -np 1 python3 bench/python/gpu_allreduce.py --impl torch --backend nccl
    build/bin/trainrun -np 2 python3 bench/python/gpu_allreduce.py --impl torch --backend gloo
    # without a GPU: the host-staged path over the tests' CPU fake, beside host arrays
    PYTHONPATH=build/python:build/tests/gpu:tests/gpu \\
      build/bin/trainrun -np 2 python3 bench/python/gpu_allreduce.py --device fake

Each size (float32, in place, sum) runs `--rounds` rounds of calls, the ranks starting each round
together; a round's time is the slowest rank's, from its first call to the end of its last
(torch.cuda.synchronize() after the last, on a GPU); rank 0 prints the median per call (us) and
the bus bandwidth 2 (n - 1) / n * bytes / time (GB/s, as nccl-tests), one JSON line per size.
"""

import argparse
import json
import os
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

import numpy


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("trainrun", "torch"), default="trainrun")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help="torch.distributed's backend (--impl torch)")
    parser.add_argument("--device", choices=("cuda", "fake", "cpu"), default="cuda",
                        help="cuda: torch CUDA tensors; fake: the tests' fake GPU arrays; cpu: "
                             "NumPy arrays")
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--step", type=int, default=4, help="size factor between sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.2,
                        help="seconds of calls a round aims for (at least 3 calls)")
    return parser.parse_args()


class Contender:
    """One implementation's allreduce on one kind of buffer."""

    def __init__(self, args):
        self.args = args
        self.torch = None
        if args.device == "cuda" or args.impl == "torch":
            import torch

            self.torch = torch
        if args.impl == "torch":
            import torch.distributed as dist

            self.dist = dist
            dist.init_process_group(args.backend)
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        else:
            if args.device == "fake":
                import fake_cuda

                fake_cuda.install()
            trainrun.init()
            self.rank, self.size = trainrun.rank(), trainrun.size()
        if args.device == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            self.torch.cuda.set_device(local % self.torch.cuda.device_count())

    def buffer(self, count):
        if self.args.device == "cuda":
            return self.torch.ones(count, dtype=self.torch.float32, device="cuda")
        if self.args.device == "fake":
            import fake_cuda

            return fake_cuda.from_host(numpy.ones(count, numpy.float32))
        if self.args.impl == "torch":
            return self.torch.ones(count, dtype=self.torch.float32)
        return numpy.ones(count, numpy.float32)

    def allreduce(self, x):
        if self.args.impl == "torch":
            self.dist.all_reduce(x)
        else:
            trainrun.allreduce_(x, op=trainrun.Sum)

    def finish(self):
        if self.args.device == "cuda":
            self.torch.cuda.synchronize()

    def barrier(self):
        if self.args.impl == "torch":
            self.dist.barrier()
        else:
            trainrun.barrier()

    def slowest(self, seconds):
        if self.args.impl == "torch":
            t = self.torch.tensor([seconds], dtype=self.torch.float64)
            if self.args.backend == "nccl":
                t = t.cuda()
            self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
            return float(t.item())
        return float(trainrun.allreduce(numpy.array([seconds]), op=trainrun.Max)[0])


def main():
    args = parse_args()
    c = Contender(args)
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        x = c.buffer(count)
        for _ in range(3):
            c.allreduce(x)
        c.finish()
        # Calls per round from a timed one, agreed by the ranks (the slowest's).
        c.barrier()
        start = time.perf_counter()
        c.allreduce(x)
        c.finish()
        one = c.slowest(time.perf_counter() - start)
        calls = int(max(3, min(1000, args.budget / max(one, 1e-6))))
        times = []
        for _ in range(args.rounds):
            c.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                c.allreduce(x)
            c.finish()
            times.append(c.slowest(time.perf_counter() - start) / calls)
        per_call = statistics.median(times)
        busbw = 2 * (c.size - 1) / c.size * nbytes / per_call / 1e9 if c.size > 1 else 0.0
        if c.rank == 0:
            name = args.impl if args.impl == "trainrun" else f"torch-{args.backend}"
            print(json.dumps({"impl": name, "device": args.device, "ranks": c.size,
                              "bytes": nbytes, "us": round(per_call * 1e6, 2),
                              "busbw_gbs": round(busbw, 3)}), flush=True)
        nbytes *= args.step
    if args.impl == "torch":
        c.dist.destroy_process_group()
    else:
        trainrun.shutdown()


if __name__ == "__main__":
    main()
