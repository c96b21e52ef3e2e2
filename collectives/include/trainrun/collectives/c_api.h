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
 * Semantics are those of trainrun::collectives::Communicator (communicator.h). */
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
} trainrun_op;

/* trainrun_comm: an opaque communicator. */
typedef struct trainrun_comm trainrun_comm;

/* trainrun_comm_init joins the job of the trainrun that started this process (the TRAINRUN_*
 * environment) and connects to every rank; on success *comm owns the communicator. */
trainrun_status trainrun_comm_init(trainrun_comm** comm);

/* trainrun_comm_destroy closes the communicator's connections and frees it; null is ignored. */
void trainrun_comm_destroy(trainrun_comm* comm);

/* The rank layout (DESIGN.md); -1 for a null communicator. */
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

/* trainrun_last_error returns the message of the last failed call on this thread ("" if none);
 * valid until the next call on this thread. */
const char* trainrun_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif
