/* elastic_worker_c: elastic data-parallel training in C through the C API (c_api.h), as
 * elastic_worker.cc does it in C++: the job goes on with the ranks that remain when one is lost.
 *
 *   build/bin/trainrun -np 4 --min-np 2 build/bin/elastic_worker_c --kill-rank 2 --kill-at-step 30
 *
 * The model is a linear regression (DIM weights) fitted by SGD on a fixed synthetic data set
 * whose samples each rank draws by its rank and the job's size, so the shards change with the
 * membership. The state (the weights and the step) is committed every --batches-per-commit steps.
 * When a rank dies, the survivors' allreduce returns TRAINRUN_IO_ERROR: each goes back to its last
 * commit, joins the job's next generation (trainrun_comm_rejoin: new rank and size), and takes
 * rank 0's state by a broadcast; training resumes at the last commit. A rank started while the
 * job runs (the job grew) joins the newest generation and gets the state the same way.
 *
 * --kill-rank R --kill-at-step S: the rank that started as R SIGKILLs itself after step S.
 * Every rank checks that it resumed at the last commit (exit 3 otherwise); at the end the ranks
 * check that their weights are bit-identical (exit 2 otherwise), and rank 0 prints the loss
 * (exit 1 above --max-loss). */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainrun/collectives/c_api.h"

#define DIM 64
#define SAMPLES 4096
#define BATCH 16 /* per rank */

typedef struct options {
  int steps;
  int batches_per_commit;
  int kill_rank;
  int kill_at_step;
  double lr;
  double max_loss;
  double step_sleep; /* seconds each step sleeps (tests: the job lasts while ranks change) */
} options;

/* state: what training must not lose, the step and the weights, with their last commit. */
typedef struct state {
  int step;
  double weights[DIM];
  int committed_step;
  double committed_weights[DIM];
} state;

static void commit(state* s) {
  s->committed_step = s->step;
  memcpy(s->committed_weights, s->weights, sizeof s->weights);
}

static void restore(state* s) {
  s->step = s->committed_step;
  memcpy(s->weights, s->committed_weights, sizeof s->weights);
}

/* sync makes every rank's state rank 0's (a rank that joined has none of its own). */
static trainrun_status sync_state(trainrun_comm* comm, state* s) {
  double step = s->step;
  trainrun_status status = trainrun_broadcast(comm, &step, 1, TRAINRUN_FLOAT64, 0);
  if (status == TRAINRUN_OK)
    status = trainrun_broadcast(comm, s->weights, DIM, TRAINRUN_FLOAT64, 0);
  if (status != TRAINRUN_OK) return status;
  s->step = (int)step;
  commit(s);
  return TRAINRUN_OK;
}

/* sample fills x with sample i's features and returns its target: y = <w*, x>, w*_d = 1/(d+1). */
static double sample(int i, double* x) {
  uint64_t v = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
  double y = 0;
  for (int d = 0; d < DIM; ++d) {
    v ^= v << 13;
    v ^= v >> 7;
    v ^= v << 17;
    x[d] = (double)(v % 2001) / 1000.0 - 1.0;
    y += x[d] / (d + 1);
  }
  return y;
}

/* gradient: this rank's gradient of the mean squared error at s->step, from the samples of the
 * global batch of that step that fall to rank `rank` of `size`. */
static void gradient(const state* s, int rank, int size, double* grad) {
  double x[DIM];
  memset(grad, 0, DIM * sizeof(double));
  for (int j = 0; j < BATCH; ++j) {
    const int i = ((s->step * size + rank) * BATCH + j) % SAMPLES;
    const double y = sample(i, x);
    double error = -y;
    for (int d = 0; d < DIM; ++d) error += s->weights[d] * x[d];
    for (int d = 0; d < DIM; ++d) grad[d] += 2.0 * error * x[d] / BATCH;
  }
}

static double loss(const double* weights) {
  double x[DIM];
  double total = 0;
  for (int i = 0; i < SAMPLES; ++i) {
    double error = -sample(i, x);
    for (int d = 0; d < DIM; ++d) error += weights[d] * x[d];
    total += error * error;
  }
  return total / SAMPLES;
}

/* hosts_updated sets *updated when the job has a newer generation (it grew, or lost a rank this
 * rank has not yet noticed); rank 0's view decides, so every rank sees it, or none. */
static trainrun_status hosts_updated(trainrun_comm* comm, int* updated) {
  int latest = 0;
  if (trainrun_comm_rank(comm) == 0) {
    trainrun_status status = trainrun_comm_latest_generation(comm, &latest, NULL);
    if (status != TRAINRUN_OK) return status;
  }
  double value = latest;
  trainrun_status status =
      trainrun_allreduce(comm, &value, &value, 1, TRAINRUN_FLOAT64, TRAINRUN_MAX);
  *updated = status == TRAINRUN_OK && (int)value > trainrun_comm_generation(comm);
  return status;
}

/* train runs steps from s->step to the end. *done: it finished (else the job's membership changed
 * at a commit, and the caller joins the next generation). Returns what a failed call returned. */
static trainrun_status train(trainrun_comm* comm, state* s, const options* o, int slot, int* done) {
  double grad[DIM];
  *done = 0;
  while (s->step < o->steps) {
    gradient(s, trainrun_comm_rank(comm), trainrun_comm_size(comm), grad);
    trainrun_status status =
        trainrun_allreduce(comm, grad, grad, DIM, TRAINRUN_FLOAT64, TRAINRUN_AVERAGE);
    if (status != TRAINRUN_OK) return status;
    for (int d = 0; d < DIM; ++d) s->weights[d] -= o->lr * grad[d];
    ++s->step;
    if (o->step_sleep > 0) {
      struct timespec pause = {(time_t)o->step_sleep,
                               (long)((o->step_sleep - (time_t)o->step_sleep) * 1e9)};
      nanosleep(&pause, NULL);
    }
    if (slot == o->kill_rank && s->step == o->kill_at_step) {
      fflush(stdout);
      kill(getpid(), SIGKILL);
    }
    if (s->step % o->batches_per_commit == 0) {
      commit(s);
      if (trainrun_comm_elastic(comm) == 1) {
        int updated = 0;
        status = hosts_updated(comm, &updated);
        if (status != TRAINRUN_OK) return status;
        if (updated) return TRAINRUN_OK;
      }
    }
  }
  *done = 1;
  return TRAINRUN_OK;
}

/* lost_peer: the status of a collective that failed because a member of the job was lost. */
static int lost_peer(trainrun_status status) {
  return status == TRAINRUN_IO_ERROR || status == TRAINRUN_TIMEOUT;
}

static int parse_options(int argc, char** argv, options* o) {
  o->steps = 400;
  o->batches_per_commit = 4;
  o->kill_rank = -1;
  o->kill_at_step = -1;
  o->lr = 0.05;
  o->max_loss = 1e-3;
  o->step_sleep = 0.0;
  if ((argc - 1) % 2 != 0) {
    fprintf(stderr, "elastic_worker_c: flag %s has no value\n", argv[argc - 1]);
    return 0;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* flag = argv[i];
    const char* value = argv[i + 1];
    if (strcmp(flag, "--steps") == 0) {
      o->steps = atoi(value);
    } else if (strcmp(flag, "--batches-per-commit") == 0) {
      o->batches_per_commit = atoi(value);
    } else if (strcmp(flag, "--kill-rank") == 0) {
      o->kill_rank = atoi(value);
    } else if (strcmp(flag, "--kill-at-step") == 0) {
      o->kill_at_step = atoi(value);
    } else if (strcmp(flag, "--lr") == 0) {
      o->lr = atof(value);
    } else if (strcmp(flag, "--max-loss") == 0) {
      o->max_loss = atof(value);
    } else if (strcmp(flag, "--step-sleep") == 0) {
      o->step_sleep = atof(value);
    } else {
      fprintf(stderr, "elastic_worker_c: unknown flag %s\n", flag);
      return 0;
    }
  }
  if (o->batches_per_commit < 1) {
    fprintf(stderr, "elastic_worker_c: --batches-per-commit must be at least 1\n");
    return 0;
  }
  return 1;
}

/* fail prints the last error and returns 1. */
static int fail(const char* what) {
  fprintf(stderr, "elastic_worker_c: %s: %s\n", what, trainrun_last_error());
  return 1;
}

static int run(trainrun_comm* comm, const options* o) {
  const int slot =
      trainrun_comm_slot(comm); /* its rank at the start: the same in every generation */
  static state s;               /* zero: step 0, weights 0, committed alike */
  int resumed = 0;
  for (;;) {
    const int own_commit = s.committed_step;
    trainrun_status status = sync_state(comm, &s);
    int done = 0;
    if (status == TRAINRUN_OK && resumed) {
      /* Rank 0's last commit is every survivor's: never further back than this rank's own. */
      if (s.step != own_commit) {
        fprintf(stderr, "rank %d: resumed at step %d, but the last commit was step %d\n",
                trainrun_comm_rank(comm), s.step, own_commit);
        return 3;
      }
      printf("rank %d (started as %d): resumed at step %d on %d ranks (generation %d)\n",
             trainrun_comm_rank(comm), slot, s.step, trainrun_comm_size(comm),
             trainrun_comm_generation(comm));
      fflush(stdout);
    }
    if (status == TRAINRUN_OK) status = train(comm, &s, o, slot, &done);
    if (status == TRAINRUN_OK && done) break;
    if (status != TRAINRUN_OK) {
      if (!lost_peer(status)) return fail("a collective failed");
      restore(&s); /* What happened since the last commit may differ across ranks. */
    }
    /* The next generation; a member lost while it forms breaks that one too, and trainrun then
     * publishes the one after it. No generation at all: the job is over for this rank. */
    do {
      status = trainrun_comm_rejoin(comm);
    } while (lost_peer(status));
    if (status != TRAINRUN_OK) return fail("rejoining the job");
    resumed = 1;
  }

  double lowest[DIM], highest[DIM];
  memcpy(lowest, s.weights, sizeof lowest);
  memcpy(highest, s.weights, sizeof highest);
  if (trainrun_allreduce(comm, lowest, lowest, DIM, TRAINRUN_FLOAT64, TRAINRUN_MIN) !=
          TRAINRUN_OK ||
      trainrun_allreduce(comm, highest, highest, DIM, TRAINRUN_FLOAT64, TRAINRUN_MAX) !=
          TRAINRUN_OK) {
    return fail("the final check");
  }
  const int identical =
      memcmp(lowest, highest, sizeof lowest) == 0 && memcmp(lowest, s.weights, sizeof lowest) == 0;
  const double final_loss = loss(s.weights);
  if (trainrun_comm_rank(comm) == 0) {
    printf("final loss %.3g on %d rank(s) after %d steps (generation %d); weights %s\n", final_loss,
           trainrun_comm_size(comm), s.step, trainrun_comm_generation(comm),
           identical ? "bit-identical on every rank" : "DIFFER across ranks");
  }
  if (!identical) return 2;
  if (!(final_loss <= o->max_loss)) {
    fprintf(stderr, "loss %.3g is above --max-loss %g\n", final_loss, o->max_loss);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  options o;
  if (!parse_options(argc, argv, &o)) return 64;
  trainrun_comm* comm;
  if (trainrun_comm_init(&comm) != TRAINRUN_OK) return fail("joining the job");
  const int code = run(comm, &o);
  trainrun_comm_destroy(comm);
  return code;
}
