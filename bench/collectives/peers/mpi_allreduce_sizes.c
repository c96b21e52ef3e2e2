/* Open MPI's MPI_Allreduce (float32 sum) over a range of sizes, printed in nccl-tests' columns as
 * build/bin/allreduce_perf prints them, so the two line up row by row (bench/collectives/
 * small_messages.sh builds and runs it).
 *
 *   mpirun -np 2 mpi_allreduce_sizes MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP [MIN_MS]
 *
 * MIN_MS (allreduce_perf's -T): time each size over at least that many milliseconds, with more
 * iterations than ITERS where ITERS take less (every rank decides alike from the slowest window).
 * Time is the mean per operation on the slowest rank, in µs (as allreduce_perf); busbw =
 * algbw * 2(n-1)/n; #wrong counts elements of the last call that differ from the exact sum. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = argc > 1 ? strtoull(argv[1], 0, 10) : 8;
  size_t maxb = argc > 2 ? strtoull(argv[2], 0, 10) : (256u << 10);
  size_t factor = argc > 3 ? strtoull(argv[3], 0, 10) : 2;
  int iters = argc > 4 ? atoi(argv[4]) : 1000;
  int warmup = argc > 5 ? atoi(argv[5]) : 20;
  double min_ms = argc > 6 ? atof(argv[6]) : 0;
  if (minb < 4 || maxb < minb || factor < 2 || iters < 1 || warmup < 0) {
    if (!rank) fprintf(stderr, "usage: mpi_allreduce_sizes MIN MAX FACTOR ITERS WARMUP\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  float* in = malloc(maxb);
  float* out = malloc(maxb);
  for (size_t i = 0; i < maxb / 4; i++) in[i] = (float)(rank + 1 + (i % 7));
  if (!rank) {
    printf("# Open MPI MPI_Allreduce: %d ranks\n", n);
    printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "size", "count", "type", "redop", "time",
           "algbw", "busbw", "#wrong");
  }
  for (size_t b = minb; b <= maxb; b *= factor) {
    int count = (int)(b / 4);
    for (int i = 0; i < warmup; i++)
      MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = 0;
    for (long long k = iters;;) {
      MPI_Barrier(MPI_COMM_WORLD);
      double window = MPI_Wtime();
      for (long long i = 0; i < k; i++)
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      window = MPI_Wtime() - window;
      t = window / k;
      double longest;
      MPI_Allreduce(&window, &longest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (longest * 1e3 >= min_ms || k >= (1LL << 26)) break;
      double scale = 1.2 * min_ms / (longest * 1e3 > 1e-3 ? longest * 1e3 : 1e-3);
      k = (long long)(k * (scale > 64 ? 64 : scale < 2 ? 2 : scale));
    }
    long long wrong = 0;
    for (int i = 0; i < count; i++) {
      /* sum over ranks r of (r + 1 + i % 7) */
      float expect = (float)(n * (n + 1) / 2 + n * (i % 7));
      if (out[i] != expect) wrong++;
    }
    double slowest;
    long long total_wrong;
    MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (!rank) {
      double alg = b / slowest / 1e9;
      printf("%12zu %12d %8s %6s %10.1f %8.3f %8.3f %8lld\n", b, count, "float32", "sum",
             slowest * 1e6, alg, alg * 2.0 * (n - 1) / n, total_wrong);
      fflush(stdout);
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
