// rendezvous_bench: how long a job's start-up handshake takes through the rendezvous server.
//
// For each N, a fresh server and N simulated workers (threads, each with its own gRPC channel and
// connection): every worker joins, publishes its address, reads every other worker's, and passes
// one barrier. Time runs from releasing the workers (before they connect) until the last one is
// through the barrier. Horovod's Gloo rendezvous is reported at 15.8 s for 16 ranks.
//
//   build/bin/rendezvous_bench                  # N = 16, 256, 1024; 5 runs each
//   build/bin/rendezvous_bench --runs 10 64 512
//   build/bin/rendezvous_bench -v 1024          # and when each phase ended
//
// --spawn N PROGRAM [ARGS...] instead starts N real worker processes (all "on localhost") with the
// environment trainrun gives them, and times server start to last exit: the launcher-free floor of
// `trainrun -np N PROGRAM`, e.g. with build/bin/barrier_example.
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/server.h"

namespace {

namespace rdv = trainrun::rendezvous;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kTimeout{60};
// Workers per simulated host, so the plan has a realistic shape (local and cross ranks).
constexpr int kSlotsPerHost = 8;
constexpr int kPhases = 4;
constexpr const char* kPhaseNames[kPhases] = {"join", "publish", "read all", "barrier"};

std::vector<rdv::RankSlot> Plan(int n) {
  std::vector<rdv::RankSlot> ranks;
  const int hosts = (n + kSlotsPerHost - 1) / kSlotsPerHost;
  for (int r = 0; r < n; ++r) {
    const int host = r / kSlotsPerHost;
    const int local_size = std::min(kSlotsPerHost, n - host * kSlotsPerHost);
    ranks.push_back({absl::StrCat("node", host), r % kSlotsPerHost, local_size, host, hosts});
  }
  return ranks;
}

// Gate holds the workers until every thread exists, so thread creation is not timed.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    opened_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// RunOnce returns the seconds one N-worker handshake took, or a negative number on failure; with
// `verbose`, it also prints when the last worker finished each phase.
double RunOnce(int n, bool verbose) {
  rdv::ServerOptions options;
  options.job_id = "bench";
  options.token = "bench-token-0123456789abcdef";
  options.ranks = Plan(n);
  auto server = rdv::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", std::string(server.status().message()).c_str());
    return -1;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(absl::StrCat("addr/", r));

  Gate gate;
  std::atomic<int> failures{0};
  std::vector<std::array<Clock::time_point, kPhases>> phases(n);
  std::vector<std::thread> workers;
  workers.reserve(n);
  for (int r = 0; r < n; ++r) {
    workers.emplace_back([&, r] {
      rdv::ClientOptions client;
      client.address = (*server)->address();
      client.job_id = options.job_id;
      client.token = options.token;
      client.host = options.ranks[r].host;
      client.local_rank = options.ranks[r].local_rank;
      gate.Wait();
      auto session = rdv::Join(client, kTimeout);
      absl::Status status = session.status();
      phases[r][0] = Clock::now();
      if (status.ok()) {
        const int rank = session->assignment.rank;
        status = session->store->Set(keys[rank], absl::StrCat("127.0.0.1:", 20000 + rank));
      }
      phases[r][1] = Clock::now();
      if (status.ok()) status = session->store->Get(keys, kTimeout).status();
      phases[r][2] = Clock::now();
      if (status.ok()) status = session->store->Barrier("start", n, kTimeout);
      phases[r][3] = Clock::now();
      if (!status.ok()) {
        if (failures++ == 0) {
          std::fprintf(stderr, "rendezvous_bench: rank %d: %s\n", r,
                       std::string(status.message()).c_str());
        }
      }
    });
  }
  const Clock::time_point start = Clock::now();
  gate.Open();
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (verbose) {
    std::printf("  #");
    for (int p = 0; p < kPhases; ++p) {
      Clock::time_point last = start;
      for (const auto& worker : phases) last = std::max(last, worker[p]);
      std::printf(" %s done at %.1f ms;", kPhaseNames[p],
                  std::chrono::duration<double, std::milli>(last - start).count());
    }
    std::printf("\n");
  }
  return failures == 0 ? seconds : -1;
}

// SpawnOnce runs `n` worker processes of `argv` against a fresh server and returns the seconds from
// starting the server to the last worker's exit, or a negative number when one failed.
double SpawnOnce(int n, char** argv) {
  const Clock::time_point start = Clock::now();
  rdv::ServerOptions options;
  options.job_id = "bench";
  auto token = rdv::RandomToken();
  if (!token.ok()) return -1;
  options.token = *token;
  for (int r = 0; r < n; ++r) options.ranks.push_back({"localhost", r, n, 0, 1});
  auto server = rdv::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", std::string(server.status().message()).c_str());
    return -1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env = {
        absl::StrCat("TRAINRUN_RENDEZVOUS_ADDR=", (*server)->address()),
        "TRAINRUN_JOB_ID=bench",
        absl::StrCat("TRAINRUN_JOB_TOKEN=", options.token),
        "TRAINRUN_HOSTNAME=localhost",
        absl::StrCat("TRAINRUN_RANK=", r),
        absl::StrCat("TRAINRUN_SIZE=", n),
        absl::StrCat("TRAINRUN_LOCAL_RANK=", r),
        absl::StrCat("TRAINRUN_LOCAL_SIZE=", n),
        "TRAINRUN_TIMEOUT=60",
    };
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv, envp.data()) != 0) {
      std::fprintf(stderr, "rendezvous_bench: cannot start %s\n", argv[0]);
      return -1;
    }
    pids.push_back(pid);
  }
  bool failed = false;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return failed ? -1 : seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  bool verbose = false;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--spawn") == 0 && i + 2 < argc) {
      const int n = std::atoi(argv[i + 1]);
      std::vector<double> times;
      for (int run = 0; run < runs; ++run) {
        const double t = SpawnOnce(n, argv + i + 2);
        if (t < 0) return 1;
        times.push_back(t * 1e3);
      }
      std::sort(times.begin(), times.end());
      std::printf("# %d processes of %s: server start to last exit\n", n, argv[i + 2]);
      std::printf("# %6s %12s %12s %12s\n", "runs", "min(ms)", "median(ms)", "max(ms)");
      std::printf("  %6d %12.2f %12.2f %12.2f\n", runs, times.front(), times[times.size() / 2],
                  times.back());
      return 0;
    } else if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else {
      sizes.push_back(std::atoi(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {16, 256, 1024};
  if (runs < 1 || std::any_of(sizes.begin(), sizes.end(), [](int n) { return n < 1; })) {
    std::fprintf(stderr, "usage: rendezvous_bench [-v] [--runs R] [N ...]\n       rendezvous_bench [--runs R] --spawn N PROGRAM [ARGS...]\n");
    return 2;
  }

  std::printf("# join + publish address + read all %s + barrier, threads with own channels\n",
              "addresses");
  std::printf("# %8s %6s %12s %12s %12s\n", "workers", "runs", "min(ms)", "median(ms)",
              "max(ms)");
  for (int n : sizes) {
    std::vector<double> times;
    for (int run = 0; run < runs; ++run) {
      const double t = RunOnce(n, verbose);
      if (t < 0) return 1;
      times.push_back(t * 1e3);
    }
    std::sort(times.begin(), times.end());
    std::printf("  %8d %6d %12.2f %12.2f %12.2f\n", n, runs, times.front(),
                times[times.size() / 2], times.back());
    std::fflush(stdout);
  }
  return 0;
}
