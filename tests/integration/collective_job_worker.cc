// A worker for tests/integration: joins its job through trainrun's rendezvous, runs STEPS
// allreduces of 1M+3 float32 and checks every result, then prints "rank R: ok".
//
//   collective_job_worker STEPS [FAIL_RANK FAIL_STEP kill|close|stop|skip|exit0|exit3]
//
// With a failure given, rank FAIL_RANK at step FAIL_STEP SIGKILLs itself ("kill"), closes its
// connections and then idles until it is stopped ("close": a rank that broke off without
// failing), SIGSTOPs itself ("stop": a stalled rank), stays alive and connected but never calls
// the collective ("skip": a rank stuck outside the collectives), or exits with code 0 or 3.
// FAIL_STEP -1 is before joining the job. Any other rank whose collective raises prints the error
// and exits 1.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/errors.h"

using trainrun::collectives::Communicator;
using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    std::fprintf(stderr, "usage: %s STEPS [FAIL_RANK FAIL_STEP kill|close|skip]\n", argv[0]);
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const int fail_rank = argc == 5 ? std::atoi(argv[2]) : -1;
  const int fail_step = argc == 5 ? std::atoi(argv[3]) : -1;
  const std::string how = argc == 5 ? argv[4] : "";
  // Fail does what FAIL_STEP asks; "close" is done by the caller, which holds the communicator.
  auto fail = [&how] {
    if (how == "kill") raise(SIGKILL);
    if (how == "stop") raise(SIGSTOP);
    if (how == "exit0") std::exit(0);
    if (how == "exit3") std::exit(3);
  };
  if (fail_step < 0 && fail_rank >= 0) {
    const char* rank = std::getenv("TRAINRUN_RANK");
    if (rank != nullptr && std::atoi(rank) == fail_rank) fail();
  }
  try {
    std::unique_ptr<Communicator> comm = Communicator::FromEnvironment();
    const int rank = comm->rank();
    const int size = comm->size();
    std::vector<float> data(size_t{1} << 20 | 3);
    for (int step = 0; step < steps; ++step) {
      if (rank == fail_rank && step == fail_step) {
        fail();
        if (how == "skip") {
          for (;;) pause();
        }
        if (how == "close") {
          comm.reset();  // closes every connection; the peers see it at once
          for (;;) pause();
        }
      }
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1 + i % 7);
      comm->Allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < data.size(); ++i) {
        const float expect =
            static_cast<float>(size * (size + 1) / 2 + size * static_cast<int>(i % 7));
        if (data[i] != expect) {
          std::fprintf(stderr, "rank %d step %d: element %zu is %g, expected %g\n", rank, step, i,
                       data[i], expect);
          return 3;
        }
      }
    }
    std::printf("rank %d: ok\n", rank);
    return 0;
  } catch (const trainrun::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
