/* The collectives' C API, for languages other than C++: plain types, error codes, and the message
 * of the last error on this thread.
 *
 *   trainrun_comm* comm;
 *   if (trainrun_comm_init(&comm) != TRAINRUN_OK) {
 *     fprintf(stderr, "%s\n", trainrun_last_error());
 *     return 1;
 *   }
 *   trainrun_allreduce(comm, buf, buf, n, TRAINRUN_FLOAT32, TRAINRUN_AVERAGE);
 *   trainrun_comm_destroy(comm);
 *
 * Semantics are those of trainrun::collectives::Communicator (communicator.h); the communicator
 * is the world of a worker runtime (runtime.h), joined as a C++ or Python worker joins.
 *
 * In an elastic job (trainrun --min-np) a worker goes on when a rank is lost: the collective
 * that was running returns TRAINRUN_IO_ERROR or TRAINRUN_TIMEOUT; the worker goes back to its
 * last commit and calls trainrun_comm_rejoin, which joins the job's next generation (a new rank
 * and size, which the getters then return); rank 0's state is then broadcast to every rank.
 *
 *   while (train(comm) != TRAINRUN_OK) {  // a collective failed: a rank was lost
 *     restore_last_commit();
 *     trainrun_status s;
 *     do {
 *       s = trainrun_comm_rejoin(comm);     // again when a member is lost while it forms
 *     } while (s == TRAINRUN_IO_ERROR || s == TRAINRUN_TIMEOUT);
 *     if (s != TRAINRUN_OK) return 1;       // no generation has this worker
 *     sync_from_rank0(comm);
 *   }
 *
 * (examples/collectives/elastic_worker.c is that loop in full.) */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* trainrun_status: the result of every call. */
typedef enum trainrun_status {
  TRAINRUN_OK = 0,
  TRAINRUN_ERROR = 1,            /* any other failure */
  TRAINRUN_IO_ERROR = 2,         /* a peer's connection broke; the message names the rank */
  TRAINRUN_TIMEOUT = 3,          /* a peer or the rendezvous did not answer in time */
  TRAINRUN_INVALID_ARGUMENT = 4, /* bad argument (null pointer, bad root, unknown type) */
  TRAINRUN_INTERNAL = 5,         /* an invariant failed: a bug in trainrun */
} trainrun_status;

/* trainrun_dtype: element types, equal to trainrun::collectives::DataType. */
typedef enum trainrun_dtype {
  TRAINRUN_FLOAT32 = 0,
  TRAINRUN_FLOAT64 = 1,
  TRAINRUN_FLOAT16 = 2,
  TRAINRUN_BFLOAT16 = 3,
  TRAINRUN_INT32 = 4,
  TRAINRUN_INT64 = 5,
  TRAINRUN_UINT8 = 6,
  TRAINRUN_INT8 = 7,
  TRAINRUN_INT16 = 8,
  TRAINRUN_BOOL = 9,
} trainrun_dtype;

/* trainrun_op: reductions, equal to trainrun::collectives::ReduceOp. */
typedef enum trainrun_op {
  TRAINRUN_SUM = 0,
  TRAINRUN_AVERAGE = 1,
  TRAINRUN_MIN = 2,
  TRAINRUN_MAX = 3,
  TRAINRUN_PRODUCT = 4,
  TRAINRUN_ADASUM = 5, /* allreduce of floating-point types only (types.h, ReduceOp::kAdasum) */
} trainrun_op;

/* trainrun_comm: an opaque communicator. */
typedef struct trainrun_comm trainrun_comm;

/* trainrun_comm_init joins the job of the trainrun that started this process (the TRAINRUN_*
 * environment) and connects to every rank; on success *comm owns the communicator. */
trainrun_status trainrun_comm_init(trainrun_comm** comm);

/* trainrun_comm_destroy closes the communicator's connections and frees it; null is ignored. */
void trainrun_comm_destroy(trainrun_comm* comm);

/* The rank layout (DESIGN.md); -1 for a null communicator, or one whose rejoin failed. */
int trainrun_comm_rank(const trainrun_comm* comm);
int trainrun_comm_size(const trainrun_comm* comm);
int trainrun_comm_local_rank(const trainrun_comm* comm);
int trainrun_comm_local_size(const trainrun_comm* comm);
int trainrun_comm_cross_rank(const trainrun_comm* comm);
int trainrun_comm_cross_size(const trainrun_comm* comm);

/* Collectives; input == output means in place. Counts are elements, not bytes. */
trainrun_status trainrun_allreduce(trainrun_comm* comm, const void* input, void* output,
                                   size_t count, trainrun_dtype dtype, trainrun_op op);
trainrun_status trainrun_broadcast(trainrun_comm* comm, void* data, size_t count,
                                   trainrun_dtype dtype, int root);
trainrun_status trainrun_allgather(trainrun_comm* comm, const void* input, void* output,
                                   size_t count, trainrun_dtype dtype);
/* counts: comm size entries, counts[r] elements from rank r. */
trainrun_status trainrun_allgatherv(trainrun_comm* comm, const void* input, void* output,
                                    const size_t* counts, trainrun_dtype dtype);
/* input: size * count elements; output: count elements (this rank's block). */
trainrun_status trainrun_reduce_scatter(trainrun_comm* comm, const void* input, void* output,
                                        size_t count, trainrun_dtype dtype, trainrun_op op);
trainrun_status trainrun_barrier(trainrun_comm* comm);

/* Elastic jobs (trainrun --min-np N). trainrun_comm_elastic: 1 when this worker is one of an
 * elastic job, 0 when not, -1 for a null communicator. */
int trainrun_comm_elastic(const trainrun_comm* comm);
/* trainrun_comm_generation: the job's generation this worker belongs to (0 at the start, and
 * always 0 when not elastic); trainrun_comm_slot: the rank this worker started as (the slot
 * trainrun started it for when the job grew), which no membership change alters. -1 for null. */
int trainrun_comm_generation(const trainrun_comm* comm);
int trainrun_comm_slot(const trainrun_comm* comm);
/* trainrun_comm_latest_generation asks trainrun for the job's newest generation (0 when not
 * elastic): one newer than trainrun_comm_generation means the membership changed (a rank was lost
 * or the job grew), so every rank should rejoin at its next commit. *adds (may be null): the newest
 * generation has a rank this one lacks (a newcomer, which needs the state). */
trainrun_status trainrun_comm_latest_generation(trainrun_comm* comm, int* generation, int* adds);
/* trainrun_comm_rejoin leaves this generation and joins the job's next one, after a collective
 * failed (TRAINRUN_IO_ERROR, TRAINRUN_TIMEOUT) or a newer generation was seen; blocks until
 * connected. TRAINRUN_IO_ERROR or TRAINRUN_TIMEOUT: a member was lost while it formed (call it
 * again: trainrun publishes the one after it); TRAINRUN_ERROR: no generation has this worker (the
 * job is over for it: exit). In a job that is not elastic it keeps the rank and connections. */
trainrun_status trainrun_comm_rejoin(trainrun_comm* comm);

/* trainrun_last_error returns the message of the last failed call on this thread ("" if none);
 * valid until the next call on this thread. */
const char* trainrun_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif
