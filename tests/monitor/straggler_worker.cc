// A worker for tests/monitor: allreduces 1,024 float32 in a loop for SECONDS seconds, checking
// each result; rank SLOW_RANK (-1: none) sleeps SLEEP_MS before each allreduce, as a rank that
// computes too long. Every rank writes its pid to DIR/rank<R>.pid (so a test can SIGSTOP it) and
// prints "rank R: step N" every 50 steps.
//
//   straggler_worker SECONDS SLOW_RANK SLEEP_MS DIR
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/errors.h"

using trainrun::collectives::Communicator;
using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s SECONDS SLOW_RANK SLEEP_MS DIR\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const int slow_rank = std::atoi(argv[2]);
  const int sleep_ms = std::atoi(argv[3]);
  try {
    std::unique_ptr<Communicator> comm = Communicator::FromEnvironment();
    const int rank = comm->rank();
    const int size = comm->size();
    std::ofstream(std::string(argv[4]) + "/rank" + std::to_string(rank) + ".pid") << ::getpid();
    std::vector<float> data(1024);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    // Every rank takes the same decision to stop: rank 0's clock, through the allreduce itself.
    for (int step = 0;; ++step) {
      if (rank == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1);
      data[0] = rank == 0 && std::chrono::steady_clock::now() >= end ? 1.0f : 0.0f;
      comm->Allreduce(data.data(), data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      const float expected = static_cast<float>(size * (size + 1) / 2);
      if (data[1] != expected || data[data.size() - 1] != expected) {
        std::fprintf(stderr, "rank %d: step %d: got %g, expected %g\n", rank, step, data[1],
                     expected);
        return 1;
      }
      if (step % 50 == 0) std::printf("rank %d: step %d\n", rank, step), std::fflush(stdout);
      if (data[0] != 0) break;
    }
    std::printf("rank %d: done\n", rank);
  } catch (const trainrun::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
