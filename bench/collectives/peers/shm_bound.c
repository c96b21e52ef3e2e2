/* The bound for a 2-rank allreduce over shared memory with copy-in: two bare processes, no library,
   doing per operation the least such an allreduce must do. Each copies its input into its slot of a
   shared mapping, publishes a sequence number, waits for the peer's, then sums the peer's slot and
   its own input into its output. Each size is timed twice, waiting by a pure spin and by a spin
   that calls sched_yield after 2000 polls (which progresses when the two share a core), and the
   lower time is the bound. Slots alternate by parity, so the next operation may
   start as soon as the peer's sequence number says it has read this one (no second flag).

     shm_bound MIN MAX FACTOR ITERS WARMUP MIN_MS

   prints nccl-tests' columns (size count type redop time algbw busbw #wrong) for float32 sum at
   2 ranks, time being the mean per operation in µs on the slower of the two processes, each size
   timed over at least ITERS operations and MIN_MS milliseconds (the same rule as allreduce_perf's
   -n and -T, and bench/collectives/peers/mpi_allreduce_sizes.c), or 10 x MIN_MS where ITERS take
   longer (a pure spin beside a busy process). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
  _Alignas(64) _Atomic uint64_t seq[2][8]; /* seq[r][0], a cache line each */
  _Alignas(64) _Atomic uint64_t go[8];     /* size index both processes are at */
  _Alignas(64) double elapsed[2];          /* seconds of the timed loop, per process */
  _Alignas(64) long done_iters[2];
  _Alignas(64) long wrong[2];
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int yield_after = 2000; /* polls before each sched_yield; 0: a pure spin */

static void wait_for(_Atomic uint64_t* seq, uint64_t at_least) {
  unsigned spins = 0;
  while (atomic_load_explicit(seq, memory_order_acquire) < at_least) {
    if (yield_after > 0 && ++spins > (unsigned)yield_after) sched_yield();
  }
}

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: shm_bound MIN MAX FACTOR ITERS WARMUP MIN_MS\n");
    return 2;
  }
  const size_t min = strtoul(argv[1], 0, 10), max = strtoul(argv[2], 0, 10);
  const size_t factor = strtoul(argv[3], 0, 10);
  const long iters = atol(argv[4]), warmup = atol(argv[5]);
  const double min_s = atof(argv[6]) / 1e3;
  if (min < 4 || max < min || factor < 2 || iters < 1) {
    fprintf(stderr, "shm_bound: bad arguments\n");
    return 2;
  }
  struct shared* sh =
      mmap(0, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float* slots = mmap(0, 4 * max, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED || slots == MAP_FAILED) {
    perror("shm_bound: mmap");
    return 1;
  }
  memset(sh, 0, sizeof *sh);
  const int me = fork() == 0 ? 1 : 0;
  const int peer = 1 - me;
  const size_t n_max = max / 4;
  float* in = malloc(max);
  float* out = malloc(max);
  for (size_t i = 0; i < n_max; i++) in[i] = (float)(me + 1);
  uint64_t seq = 0;
  if (me == 0)
    printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "size", "count", "type", "redop", "time",
           "algbw", "busbw", "#wrong");
  for (size_t size = min; size <= max; size *= factor) {
    double best = 0;
    long best_wrong = 0;
    for (int variant = 0; variant < 2; variant++) {
      yield_after = variant == 0 ? 0 : 2000;
      const size_t n = size / 4;
      long done = 0, wrong = 0;
      double start = 0, elapsed = 0;
      /* Rank 0 decides when the timed loop ends (both did at least ITERS and MIN_MS passed on it)
         and says so through `go`, which the peer reads after each operation. */
      for (long k = 0;; k++) {
        if (k == warmup) start = now();
        ++seq;
        float* mine = slots + (size_t)(me * 2 + (seq & 1)) * n_max;
        const float* theirs = slots + (size_t)(peer * 2 + (seq & 1)) * n_max;
        memcpy(mine, in, size);
        atomic_store_explicit(&sh->seq[me][0], seq, memory_order_release);
        wait_for(&sh->seq[peer][0], seq);
        for (size_t i = 0; i < n; i++) out[i] = in[i] + theirs[i];
        if (out[0] != 3.0f || out[n - 1] != 3.0f) wrong++;
        if (k >= warmup) {
          done++;
          const double so_far = now() - start;
          if (me == 0 && ((done >= iters && so_far >= min_s) || so_far >= 10 * min_s) &&
              atomic_load(&sh->go[0]) == 0) {
            /* stop after the operation numbered seq + 1, which both will run */
            atomic_store(&sh->go[0], seq + 1);
          }
        }
        const uint64_t last = atomic_load(&sh->go[0]);
        if (last != 0 && seq >= last) break;
      }
      elapsed = now() - start;
      sh->elapsed[me] = elapsed;
      sh->done_iters[me] = done;
      sh->wrong[me] = wrong;
      /* both past this size before rank 0 reads and resets */
      yield_after = 2000;
      ++seq;
      atomic_store_explicit(&sh->seq[me][0], seq, memory_order_release);
      wait_for(&sh->seq[peer][0], seq);
      if (me == 0) {
        double t0 = sh->elapsed[0] / sh->done_iters[0], t1 = sh->elapsed[1] / sh->done_iters[1];
        double t = (t0 > t1 ? t0 : t1) * 1e6;
        if (variant == 0 || t < best) best = t;
        best_wrong += sh->wrong[0] + sh->wrong[1];
        atomic_store(&sh->go[0], 0);
      }
      ++seq;
      atomic_store_explicit(&sh->seq[me][0], seq, memory_order_release);
      wait_for(&sh->seq[peer][0], seq);
    }
    if (me == 0) {
      double algbw = size / best / 1e3;
      printf("%12zu %12zu %8s %6s %10.1f %8.3f %8.3f %8ld\n", size, size / 4, "float32", "sum",
             best, algbw, algbw, best_wrong);
      fflush(stdout);
    }
  }
  if (me == 1) _exit(0);
  int status = 0;
  wait(&status);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
