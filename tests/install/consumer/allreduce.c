/* A C worker outside trainrun's tree: the C API's allreduce, checked. Exit 0 when every element
 * is 1 + 2 + ... + size. */
#include <stdio.h>

#include "trainrun/collectives/c_api.h"

int main(void) {
  trainrun_comm* comm;
  if (trainrun_comm_init(&comm) != TRAINRUN_OK) {
    fprintf(stderr, "allreduce_c: %s\n", trainrun_last_error());
    return 1;
  }
  int rank = trainrun_comm_rank(comm), size = trainrun_comm_size(comm);
  double data[1024];
  for (int i = 0; i < 1024; ++i) data[i] = rank + 1;
  if (trainrun_allreduce(comm, data, data, 1024, TRAINRUN_FLOAT64, TRAINRUN_SUM) != TRAINRUN_OK) {
    fprintf(stderr, "allreduce_c: %s\n", trainrun_last_error());
    return 1;
  }
  double expected = size * (size + 1) / 2.0;
  for (int i = 0; i < 1024; ++i) {
    if (data[i] != expected) {
      fprintf(stderr, "rank %d: got %g, expected %g\n", rank, data[i], expected);
      return 1;
    }
  }
  printf("rank %d of %d: C allreduce sum %g ok\n", rank, size, expected);
  trainrun_comm_destroy(comm);
  return 0;
}
