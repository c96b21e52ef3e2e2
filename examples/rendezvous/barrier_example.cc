// barrier_example: the smallest trainrun worker. It joins the job's rendezvous, passes one barrier
// with every other rank, and exits; `-v` prints one line per rank.
//
//   build/bin/trainrun -np 8 build/bin/barrier_example -v
#include <chrono>
#include <cstdio>
#include <cstring>

#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"

int main(int argc, char** argv) {
  namespace rdv = trainrun::rendezvous;
  const bool verbose = argc > 1 && std::strcmp(argv[1], "-v") == 0;
  const std::chrono::milliseconds timeout =
      std::chrono::seconds(trainrun::env::kTimeoutSeconds.Get());

  absl::StatusOr<rdv::WorkerSession> session = rdv::JoinFromEnvironment(timeout);
  if (!session.ok()) {
    std::fprintf(stderr, "barrier_example: %s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  const rdv::Assignment& me = session->assignment;
  absl::Status passed = session->store->Barrier("barrier_example", me.size, timeout);
  if (!passed.ok()) {
    std::fprintf(stderr, "barrier_example: rank %d: %s\n", me.rank,
                 std::string(passed.message()).c_str());
    return 1;
  }
  if (verbose) {
    std::printf("rank %d of %d (local %d of %d, host %s) passed the barrier\n", me.rank, me.size,
                me.local_rank, me.local_size, me.HostOf(me.rank).c_str());
  }
  return 0;
}
