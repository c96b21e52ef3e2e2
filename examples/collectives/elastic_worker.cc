// elastic_worker: elastic data-parallel training in C++, the way examples/elastic_train.py does it
// in Python: the job goes on with the ranks that remain when one is lost.
//
//   build/bin/trainrun -np 4 --min-np 2 build/bin/elastic_worker --kill-rank 2 --kill-at-step 30
//
// The model is a linear regression (DIM weights) fitted by SGD on a fixed synthetic data set
// whose samples each rank draws by its rank and the job's size, so the shards change with the
// membership. The state (the weights and the step) is committed every --batches-per-commit steps.
// When a rank dies, the survivors' allreduce throws IoError: each goes back to its last commit,
// joins the job's next generation through the Runtime (new rank and size), and takes rank 0's
// state by a broadcast; training resumes at the last commit. A rank started while the job runs
// (the job grew) joins the newest generation and gets the state the same way.
//
// --kill-rank R --kill-at-step S: the rank that started as R SIGKILLs itself after step S.
// Every rank checks that it resumed at the last commit (exit 3 otherwise); at the end the ranks
// check that their weights are bit-identical (exit 2 otherwise), and rank 0 prints the loss
// (exit 1 above --max-loss).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/runtime.h"

namespace {

using trainrun::collectives::CallCheck;
using trainrun::collectives::Communicator;
using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;
using trainrun::collectives::Runtime;

constexpr int kDim = 64;
constexpr int kSamples = 4096;
constexpr int kBatch = 16;  // per rank

struct Options {
  int steps = 400;
  int batches_per_commit = 4;
  int kill_rank = -1;
  int kill_at_step = -1;
  double lr = 0.05;
  double max_loss = 1e-3;
  double step_sleep = 0.0;  // seconds each step sleeps (tests: the job lasts while ranks change)
};

// Named is the agreement check of a collective named `name` (communicator.h).
CallCheck Named(const char* name) {
  CallCheck check;
  check.name = name;
  return check;
}

// Sample fills x with sample i's features and returns its target: y = <w*, x>, w*_d = 1/(d+1).
double Sample(int i, std::vector<double>* x) {
  uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
  double y = 0;
  for (int d = 0; d < kDim; ++d) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    (*x)[d] = static_cast<double>(state % 2001) / 1000.0 - 1.0;
    y += (*x)[d] / (d + 1);
  }
  return y;
}

// State is what training must not lose: the step and the weights, with their last commit.
struct State {
  int step = 0;
  std::vector<double> weights = std::vector<double>(kDim, 0.0);
  int committed_step = 0;
  std::vector<double> committed_weights = std::vector<double>(kDim, 0.0);

  void Commit() {
    committed_step = step;
    committed_weights = weights;
  }
  void Restore() {
    step = committed_step;
    weights = committed_weights;
  }
  // Sync makes every rank's state rank 0's (a rank that joined has none of its own).
  void Sync(Communicator& world) {
    double step_value = step;
    world.Broadcast(&step_value, 1, DataType::kFloat64, 0, Named("state.step"));
    world.Broadcast(weights.data(), weights.size(), DataType::kFloat64, 0, Named("state.weights"));
    step = static_cast<int>(step_value);
    Commit();
  }
};

// Gradient is this rank's gradient of the mean squared error at `step`: the samples of the global
// batch of that step that fall to rank `rank` of `size`.
std::vector<double> Gradient(const State& state, int rank, int size) {
  std::vector<double> grad(kDim, 0.0);
  std::vector<double> x(kDim);
  for (int j = 0; j < kBatch; ++j) {
    const int i = ((state.step * size + rank) * kBatch + j) % kSamples;
    const double y = Sample(i, &x);
    double error = -y;
    for (int d = 0; d < kDim; ++d) error += state.weights[d] * x[d];
    for (int d = 0; d < kDim; ++d) grad[d] += 2.0 * error * x[d] / kBatch;
  }
  return grad;
}

double Loss(const std::vector<double>& weights) {
  std::vector<double> x(kDim);
  double total = 0;
  for (int i = 0; i < kSamples; ++i) {
    double error = -Sample(i, &x);
    for (int d = 0; d < kDim; ++d) error += weights[d] * x[d];
    total += error * error;
  }
  return total / kSamples;
}

// HostsUpdated: the job has a newer generation (it grew, or lost a rank this rank has not yet
// noticed); rank 0's view decides, so every rank sees it, or none.
bool HostsUpdated(Runtime& runtime) {
  double latest = runtime.world().rank() == 0 ? runtime.LatestGeneration() : 0;
  runtime.world().Allreduce(&latest, 1, DataType::kFloat64, ReduceOp::kMax,
                            Named("elastic.check_host_updates"));
  return static_cast<int>(latest) > runtime.generation();
}

// Train runs steps from state.step to the end; returns false when the job's membership changed at
// a commit (the caller joins the next generation), throws what a collective throws.
bool Train(Runtime& runtime, State& state, const Options& options, int slot) {
  Communicator& world = runtime.world();
  while (state.step < options.steps) {
    std::vector<double> grad = Gradient(state, world.rank(), world.size());
    world.Allreduce(grad.data(), grad.size(), DataType::kFloat64, ReduceOp::kAverage,
                    Named("grad.weights"));
    for (int d = 0; d < kDim; ++d) state.weights[d] -= options.lr * grad[d];
    ++state.step;
    if (options.step_sleep > 0) usleep(static_cast<useconds_t>(options.step_sleep * 1e6));
    if (slot == options.kill_rank && state.step == options.kill_at_step) {
      std::fflush(stdout);
      kill(getpid(), SIGKILL);
    }
    if (state.step % options.batches_per_commit == 0) {
      state.Commit();
      if (runtime.elastic() && HostsUpdated(runtime)) return false;
    }
  }
  return true;
}

// Rejoin joins the job's next generation; a member lost while it forms breaks that one too, and
// the launcher then publishes the one after it. No generation at all (the job is over for this
// rank) throws Error, which ends the program.
void Rejoin(Runtime& runtime) {
  while (true) {
    try {
      runtime.Shutdown();
      runtime.Init();
      return;
    } catch (const trainrun::IoError&) {
    } catch (const trainrun::TimeoutError&) {
    }
  }
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--steps") {
      options.steps = std::atoi(value);
    } else if (flag == "--batches-per-commit") {
      options.batches_per_commit = std::atoi(value);
    } else if (flag == "--kill-rank") {
      options.kill_rank = std::atoi(value);
    } else if (flag == "--kill-at-step") {
      options.kill_at_step = std::atoi(value);
    } else if (flag == "--lr") {
      options.lr = std::atof(value);
    } else if (flag == "--max-loss") {
      options.max_loss = std::atof(value);
    } else if (flag == "--step-sleep") {
      options.step_sleep = std::atof(value);
    } else {
      std::fprintf(stderr, "elastic_worker: unknown flag %s\n", flag.c_str());
      std::exit(64);
    }
  }
  if ((argc - 1) % 2 != 0) {
    std::fprintf(stderr, "elastic_worker: flag %s has no value\n", argv[argc - 1]);
    std::exit(64);
  }
  return options;
}

int Run(const Options& options) {
  Runtime runtime;
  runtime.Init();
  const int slot = runtime.slot();  // its rank at the start: the same in every generation
  State state;
  bool resumed = false;
  while (true) {
    try {
      const int own_commit = state.committed_step;
      state.Sync(runtime.world());
      if (resumed) {
        // Rank 0's last commit is every survivor's: never further back than this rank's own.
        if (state.step != own_commit) {
          std::fprintf(stderr, "rank %d: resumed at step %d, but the last commit was step %d\n",
                       runtime.world().rank(), state.step, own_commit);
          return 3;
        }
        std::printf("rank %d (started as %d): resumed at step %d on %d ranks (generation %d)\n",
                    runtime.world().rank(), slot, state.step, runtime.world().size(),
                    runtime.generation());
        std::fflush(stdout);
      }
      if (Train(runtime, state, options, slot)) break;
    } catch (const trainrun::IoError&) {
      state.Restore();  // What happened since the last commit may differ across ranks.
    } catch (const trainrun::TimeoutError&) {
      state.Restore();
    }
    Rejoin(runtime);
    resumed = true;
  }

  Communicator& world = runtime.world();
  std::vector<double> lowest = state.weights;
  std::vector<double> highest = state.weights;
  world.Allreduce(lowest.data(), kDim, DataType::kFloat64, ReduceOp::kMin, Named("final.min"));
  world.Allreduce(highest.data(), kDim, DataType::kFloat64, ReduceOp::kMax, Named("final.max"));
  const bool identical =
      std::memcmp(lowest.data(), highest.data(), kDim * sizeof(double)) == 0 &&
      std::memcmp(lowest.data(), state.weights.data(), kDim * sizeof(double)) == 0;
  const double loss = Loss(state.weights);
  if (world.rank() == 0) {
    std::printf("final loss %.3g on %d rank(s) after %d steps (generation %d); weights %s\n", loss,
                world.size(), state.step, runtime.generation(),
                identical ? "bit-identical on every rank" : "DIFFER across ranks");
  }
  runtime.Shutdown();
  if (!identical) return 2;
  if (!(loss <= options.max_loss)) {
    std::fprintf(stderr, "loss %.3g is above --max-loss %g\n", loss, options.max_loss);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  try {
    return Run(options);
  } catch (const trainrun::Error& e) {
    std::fprintf(stderr, "elastic_worker: %s\n", e.what());
    return 1;
  }
}
