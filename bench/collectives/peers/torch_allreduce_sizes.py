"""torch.distributed (gloo) allreduce, float32 sum, over a range of sizes, printed in nccl-tests'
columns as build/bin/allreduce_perf prints them (bench/collectives/cross_host.sh runs it, one
process per rank, with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in the environment).

    python3 torch_allreduce_sizes.py MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP [MIN_MS]

As bench/collectives/peers/mpi_allreduce_sizes.c: MIN_MS times each size over at least that many
milliseconds (more iterations than ITERS where those take less; every rank decides alike from the
slowest window); time is the mean per operation on the slowest rank, in us; busbw = algbw * 2(n-1)/n;
#wrong counts elements of the last call that differ from the exact sum.
"""
import sys
import time

import torch
import torch.distributed as dist


def main():
    minb, maxb, factor, iters, warmup = (int(a) for a in sys.argv[1:6])
    min_ms = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    pattern = (torch.arange(maxb // 4) % 7).float()
    source = pattern + float(rank + 1)
    buf = torch.empty_like(source)
    expect = pattern * n + float(n * (n + 1) // 2)
    if rank == 0:
        print(f"# torch.distributed {torch.__version__} (gloo) all_reduce: {n} ranks")
        print("# %10s %12s %8s %6s %10s %8s %8s %8s" %
              ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"))
    b = minb
    while b <= maxb:
        count = b // 4
        t = buf[:count]
        for _ in range(warmup):
            t.copy_(source[:count])
            dist.all_reduce(t)
        k = iters
        while True:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)  # in place: the values grow, the time does not depend on them
            window = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(window, op=dist.ReduceOp.MAX)
            longest = window.item()
            if longest * 1e3 >= min_ms or k >= (1 << 26):
                break
            k = int(k * min(64.0, max(2.0, 1.2 * min_ms / max(longest * 1e3, 1e-3))))
        per_op = longest / k
        t.copy_(source[:count])
        dist.all_reduce(t)
        wrong = torch.tensor([int((t != expect[:count]).sum())], dtype=torch.int64)
        dist.all_reduce(wrong)
        if rank == 0:
            alg = b / per_op / 1e9
            print("%12d %12d %8s %6s %10.1f %8.3f %8.3f %8d" %
                  (b, count, "float32", "sum", per_op * 1e6, alg, alg * 2 * (n - 1) / n,
                   wrong.item()), flush=True)
        b *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
