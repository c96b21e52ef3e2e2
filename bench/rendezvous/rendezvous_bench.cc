// rendezvous_bench: how long a job's start-up handshake takes through the rendezvous server.
//
// For each N, a fresh server and N simulated workers, each with its own gRPC channel and
// connection: every worker joins, exchanges addresses with all the others, and passes one barrier.
// The exchange is what a communicator's bootstrap does (TcpTransport): one Store::AllgatherTable
// call per worker, whose answer, every address in rank order, the server builds once for all of
// them.
// `--per-key` instead publishes with Set and reads the N addresses with a Get of N keys, the
// protocol before Allgather (N² values through the server). Time runs from releasing the workers
// (created, not yet connected) until the last one is through the barrier. Horovod's Gloo rendezvous
// is reported at 15.8 s for 16 ranks.
//
// Workers are threads of this process by default; `--processes P` spreads them over P worker
// processes instead (the server stays in this one, as in trainrun), so the workers do not share
// one process's gRPC poller.
//
//   build/bin/rendezvous_bench                  # N = 16, 256, 1024; 5 runs each
//   build/bin/rendezvous_bench --runs 10 64 512
//   build/bin/rendezvous_bench -v 1024          # and when the last worker ended each phase
//   build/bin/rendezvous_bench --processes 16 1024
//   build/bin/rendezvous_bench --processes 16 --per-key 1024
//
// `--relay` gives each simulated host (kSlotsPerHost workers) a relay (rendezvous/relay.h), as a
// host's agent runs: its workers call it on a Unix socket, and it sends their calls over one gRPC
// channel, the start-up's Join, Allgather and Barrier batched into one call per host. Relays run
// in the process of their host's workers, started before the clock (an agent starts its relay
// before its ranks), and connect to the server as they start, as an agent's does while its ranks
// start: the workers are released once their relays are connected and have proved the token (the
// server's CPU column counts those connections and their TLS handshakes; the time does not).
//
//   build/bin/rendezvous_bench --runs 1 --processes 16 --relay -v 8192
//
// `--local-socket` has the workers dial the server's Unix socket in plain text, as trainrun's ranks
// on its own machine do (TRAINRUN_RENDEZVOUS_SOCKET); without it they dial its TCP port, as remote
// ranks do.
// `--no-tls` runs server, relays and workers in plain text (trainrun --no-tls), to measure what TLS
// costs; workers in other processes hear it through TRAINRUN_RENDEZVOUS_TLS=off.
//
// --spawn N PROGRAM [ARGS...] instead starts N real worker processes (all "on localhost") with the
// environment trainrun gives them, and times server start to last exit: the launcher-free floor of
// `trainrun -np N PROGRAM`, e.g. with build/bin/barrier_example.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/relay.h"
#include "trainrun/rendezvous/server.h"

namespace {
// False with --no-tls (or TRAINRUN_RENDEZVOUS_TLS=off inherited from the bench's parent).
bool Tls() { return trainrun::env::Lookup(trainrun::env::kRendezvousTls).value_or("") != "off"; }
// --local-socket: the server also serves its Unix socket, which the workers dial (as trainrun's
// ranks on its own machine do) through TRAINRUN_RENDEZVOUS_SOCKET, set for each run.
bool local_socket = false;
}  // namespace

extern char** environ;

namespace {

namespace rdv = trainrun::rendezvous;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kTimeout{60};
// Workers per simulated host, so the plan has a realistic shape (local and cross ranks).
constexpr int kSlotsPerHost = 8;
constexpr int kPhases = 3;
constexpr const char* kPhaseNames[kPhases] = {"join", "exchange", "barrier"};
using Phases = std::array<Clock::time_point, kPhases>;

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

// Gate holds the workers until every thread exists, so thread creation is not timed. A
// reader-writer lock, held for writing until Open: its release lets every waiting worker through
// at once, where a condition variable's would have each reacquire one mutex in turn (a convoy of
// hundreds of threads, timed, that no real rank goes through).
class Gate {
 public:
  Gate() { lock_.lock(); }
  void Open() { lock_.unlock(); }
  void Wait() { std::shared_lock<std::shared_mutex> pass(lock_); }

 private:
  std::shared_mutex lock_;
};

// Exchange publishes rank `rank`'s address and returns once it has read all `n`: one
// AllgatherTable (what a communicator's bootstrap calls, collectives/src/store_calls.cc), or
// (`per_key`) a Set and a Get of n keys.
absl::Status Exchange(rdv::Store& store, int rank, int n, bool per_key,
                      const std::vector<std::string>& keys) {
  const std::string address = absl::StrCat("127.0.0.1:", 20000 + rank);
  if (per_key) {
    if (absl::Status status = store.Set(keys[rank], address); !status.ok()) return status;
    absl::StatusOr<std::vector<std::string>> all = store.Get(keys, kTimeout);
    if (!all.ok()) return all.status();
    if (static_cast<int>(all->size()) != n || (*all)[rank] != address) {
      return absl::InternalError(absl::StrCat("rank ", rank, " read back the wrong addresses"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<rdv::GatherTable> all = store.AllgatherTable("addr", rank, n, address, kTimeout);
  if (!all.ok()) return all.status();
  if (static_cast<int>(all->size()) != n || (*all)[rank] != address) {
    return absl::InternalError(absl::StrCat("rank ", rank, " read back the wrong addresses"));
  }
  return absl::OkStatus();
}

// RunWorkers runs workers [first, first + count) of an n-worker job as threads, released by
// `release` (called once every thread exists), and calls `finished` with how many failed once
// they have all ended, before its relays stop (their teardown is not the handshake's). Returns how
// many failed; fills `phases`.
int RunWorkers(const std::string& address, const std::string& token, int n, int first, int count,
               bool per_key, bool relay, const std::function<void()>& release,
               const std::function<void(int)>& finished, std::vector<Phases>& phases) {
  const std::vector<rdv::RankSlot> plan = Plan(n);
  // With `relay`, one relay per host these workers are on, serving those of its workers here.
  std::map<std::string, std::unique_ptr<rdv::Relay>> relays;
  if (relay) {
    std::map<std::string, int> workers_on;
    for (int r = first; r < first + count; ++r) ++workers_on[plan[r].host];
    for (const auto& [host, workers] : workers_on) {
      rdv::RelayOptions options;
      options.socket = absl::StrCat("@trainrun-bench-", getpid(), "-", host);
      options.server_address = address;
      options.job_id = "bench";
      options.token = token;
      options.tls = Tls();
      options.host = host;
      options.local_ranks = workers;
      auto started = rdv::Relay::Start(options);
      if (!started.ok()) {
        std::fprintf(stderr, "rendezvous_bench: %s\n",
                     std::string(started.status().message()).c_str());
        return count;
      }
      relays[host] = *std::move(started);
    }
    // An agent's relay connects while the agent starts its ranks (processes, an interpreter),
    // which takes longer than one connection's handshakes; so the workers are released once
    // every relay here is connected, and the clock times what the ranks themselves meet.
    for (auto& [host, r] : relays) {
      if (!r->WaitConnected(kTimeout)) {
        std::fprintf(stderr, "rendezvous_bench: %s's relay did not connect to the server\n",
                     host.c_str());
        return count;
      }
    }
  }
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(absl::StrCat("addr/", r));
  Gate gate;
  std::atomic<int> failures{0};
  phases.assign(count, Phases{});
  std::vector<std::thread> workers;
  workers.reserve(count);
  for (int i = 0; i < count; ++i) {
    workers.emplace_back([&, i] {
      const int r = first + i;
      rdv::ClientOptions client;
      client.address = address;
      client.job_id = "bench";
      client.token = token;
      client.tls = Tls();
      client.socket = trainrun::env::Lookup(trainrun::env::kRendezvousSocket).value_or("");
      client.host = plan[r].host;
      client.local_rank = plan[r].local_rank;
      if (relay) client.relay = relays.at(client.host)->socket();
      gate.Wait();
      auto session = rdv::Join(client, kTimeout);
      absl::Status status = session.status();
      phases[i][0] = Clock::now();
      if (status.ok()) {
        status = Exchange(*session->store, session->assignment.rank, n, per_key, keys);
      }
      phases[i][1] = Clock::now();
      if (status.ok()) status = session->store->Barrier("start", n, kTimeout);
      phases[i][2] = Clock::now();
      if (!status.ok() && failures++ == 0) {
        std::fprintf(stderr, "rendezvous_bench: rank %d: %s\n", r,
                     std::string(status.message()).c_str());
      }
    });
  }
  release();
  gate.Open();
  for (auto& w : workers) w.join();
  finished(failures);
  return failures;
}

// WorkerGroup is a worker process of --processes: it reads the server's address and the job's
// token from its environment, writes 'r' on stdout once its threads exist, waits for a byte on
// stdin, runs, and writes a Record: 'd' (all passed) or 'f', and when its last worker ended each
// phase (one write of fewer than PIPE_BUF bytes, so the groups' records do not interleave).
struct Record {
  char result;
  int64_t phase_ends_ns[kPhases];  // steady_clock, which all processes share
  double timed_cpu_ms;             // this process's CPU from the release to its record
};

double CpuMs(int who);

// LastOfEach returns, for each phase, the time the last worker ended it.
Phases LastOfEach(const std::vector<Phases>& phases, Clock::time_point start) {
  Phases last;
  last.fill(start);
  for (const Phases& worker : phases) {
    for (int p = 0; p < kPhases; ++p) last[p] = std::max(last[p], worker[p]);
  }
  return last;
}

int WorkerGroup(int n, int first, int count, bool per_key, bool relay) {
  std::optional<std::string> address_value = trainrun::env::Lookup(trainrun::env::kRendezvousAddr);
  std::optional<std::string> token_value = trainrun::env::Lookup(trainrun::env::kJobToken);
  if (!address_value || !token_value) return 2;
  const char* address = address_value->c_str();
  const char* token = token_value->c_str();
  std::vector<Phases> phases;
  double released_cpu_ms = 0;
  bool written = false;
  const int failures = RunWorkers(
      address, token, n, first, count, per_key, relay,
      [&] {
        char byte = 'r';
        if (write(1, &byte, 1) != 1 || read(0, &byte, 1) != 1) std::_Exit(3);
        released_cpu_ms = CpuMs(RUSAGE_SELF);
      },
      [&](int failed) {
        Record record{failed == 0 ? 'd' : 'f', {}, CpuMs(RUSAGE_SELF) - released_cpu_ms};
        const Phases last = LastOfEach(phases, Clock::time_point());
        for (int p = 0; p < kPhases; ++p) {
          record.phase_ends_ns[p] =
              std::chrono::duration_cast<std::chrono::nanoseconds>(last[p].time_since_epoch())
                  .count();
        }
        written = write(1, &record, sizeof(record)) == sizeof(record);
      },
      phases);
  return written && failures == 0 ? 0 : 1;
}

// ReadBytes reads `count` bytes from `fd`; false on EOF or error.
bool ReadBytes(int fd, std::string& out, size_t count) {
  while (out.size() < count) {
    char buffer[256];
    const ssize_t got = read(fd, buffer, std::min(sizeof(buffer), count - out.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out.append(buffer, static_cast<size_t>(got));
  }
  return true;
}

// RunProcesses times one handshake of n workers spread over `processes` worker processes, and
// says in `last` when the last worker ended each phase, in `timed_cpu_ms` the workers' CPU from
// their release and in `server_cpu_ms` this process's (the server's) over the same time.
double RunProcesses(const rdv::Server& server, const std::string& token, int n, int processes,
                    bool per_key, bool relay, Clock::time_point& start, Phases& last,
                    double& timed_cpu_ms, double& server_cpu_ms) {
  int go[2], status[2];
  if (pipe2(go, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) return -1;
  std::vector<pid_t> pids;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back(absl::StrCat("TRAINRUN_RENDEZVOUS_ADDR=", server.address()));
  env.push_back(absl::StrCat("TRAINRUN_JOB_TOKEN=", token));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (int p = 0; p < processes; ++p) {
    const int first = n * p / processes;
    const int count = n * (p + 1) / processes - first;
    std::vector<std::string> args = {"/proc/self/exe",          "--worker-group",
                                     std::to_string(n),         std::to_string(first),
                                     std::to_string(count),     per_key ? "per-key" : "allgather",
                                     relay ? "relay" : "direct"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, go[0], 0);
    posix_spawn_file_actions_adddup2(&actions, status[1], 1);
    pid_t pid = 0;
    const int error =
        posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (error == 0) pids.push_back(pid);
  }
  close(go[0]);
  close(status[1]);
  std::string ready, done;
  double seconds = -1;
  if (static_cast<int>(pids.size()) == processes && ReadBytes(status[0], ready, processes)) {
    start = Clock::now();
    const double server_cpu_at_start = CpuMs(RUSAGE_SELF);
    const std::string release(processes, 'g');
    bool passed =
        write(go[1], release.data(), release.size()) == static_cast<ssize_t>(release.size()) &&
        ReadBytes(status[0], done, processes * sizeof(Record));
    const Clock::time_point end = Clock::now();
    server_cpu_ms = CpuMs(RUSAGE_SELF) - server_cpu_at_start;
    last.fill(start);
    for (int p = 0; passed && p < processes; ++p) {
      Record record;
      std::memcpy(&record, done.data() + p * sizeof(Record), sizeof(Record));
      passed = record.result == 'd';
      timed_cpu_ms += record.timed_cpu_ms;
      for (int phase = 0; phase < kPhases; ++phase) {
        last[phase] = std::max(
            last[phase], Clock::time_point(std::chrono::nanoseconds(record.phase_ends_ns[phase])));
      }
    }
    if (passed) seconds = std::chrono::duration<double>(end - start).count();
  }
  close(go[1]);
  close(status[0]);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  return seconds;
}

// RunOnce returns the seconds one N-worker handshake took, or a negative number on failure. With
// `processes` > 0 the workers run in that many processes; else, as threads here. `verbose` prints
// when the last worker finished each phase.
double RunOnce(int n, int processes, bool per_key, bool relay, bool verbose) {
  rdv::ServerOptions options;
  options.job_id = "bench";
  options.token = "bench-token-0123456789abcdef";
  options.tls = Tls();
  options.ranks = Plan(n);
  options.local_socket = local_socket;
  options.network_on_demand = local_socket && !relay;
  auto server = rdv::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", std::string(server.status().message()).c_str());
    return -1;
  }
  if (local_socket) setenv(trainrun::env::kRendezvousSocket, (*server)->socket_path().c_str(), 1);
  Clock::time_point start;
  Phases last;
  double seconds = -1;
  double timed_cpu_ms = 0;
  double server_cpu_ms = 0;
  if (processes > 0) {
    seconds = RunProcesses(**server, options.token, n, processes, per_key, relay, start, last,
                           timed_cpu_ms, server_cpu_ms);
  } else {
    std::vector<Phases> phases;
    Clock::time_point end;
    const int failures =
        RunWorkers((*server)->address(), options.token, n, 0, n, per_key, relay,
                   [&] { start = Clock::now(); }, [&](int) { end = Clock::now(); }, phases);
    seconds = std::chrono::duration<double>(end - start).count();
    if (failures > 0) seconds = -1;
    last = LastOfEach(phases, start);
  }
  if (verbose && seconds >= 0) {
    std::printf("  #");
    for (int p = 0; p < kPhases; ++p) {
      std::printf(" %s done at %.1f ms;", kPhaseNames[p],
                  std::chrono::duration<double, std::milli>(last[p] - start).count());
    }
    // The workers' CPU between their release and their last worker's end, without starting
    // the processes and threads (what "workers cpu" below also counts), and the server's over the
    // same time (without its share of the relays' connections, which "server cpu" counts).
    if (processes > 0) {
      std::printf(" workers' cpu from release %.0f ms; server's %.0f ms;", timed_cpu_ms,
                  server_cpu_ms);
    }
    std::printf("\n");
  }
  return seconds;
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
  options.tls = Tls();
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
        absl::StrCat("TRAINRUN_RENDEZVOUS_TLS=", Tls() ? "on" : "off"),
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

// CpuMs returns the user + system CPU milliseconds of this process (`who` RUSAGE_SELF: the server
// and its threads, with the workers in other processes) or of its reaped children
// (RUSAGE_CHILDREN: the worker processes).
double CpuMs(int who) {
  struct rusage usage {};
  getrusage(who, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void PrintRow(const char* what, std::vector<double> times_ms, const std::vector<double>& server_cpu,
              const std::vector<double>& workers_cpu) {
  std::sort(times_ms.begin(), times_ms.end());
  std::printf("  %10s %6zu %12.2f %12.2f %12.2f", what, times_ms.size(), times_ms.front(),
              times_ms[times_ms.size() / 2], times_ms.back());
  if (!server_cpu.empty()) {
    std::printf(" %14.0f %14.0f", Median(server_cpu), Median(workers_cpu));
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--worker-group") == 0) {
    return WorkerGroup(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                       std::strcmp(argv[5], "per-key") == 0, std::strcmp(argv[6], "relay") == 0);
  }
  int runs = 5;
  int processes = 0;
  bool per_key = false;
  bool relay = false;
  bool verbose = false;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--per-key") == 0) {
      per_key = true;
    } else if (std::strcmp(argv[i], "--relay") == 0) {
      relay = true;
    } else if (std::strcmp(argv[i], "--local-socket") == 0) {
      local_socket = true;
    } else if (std::strcmp(argv[i], "--no-tls") == 0) {
      setenv(trainrun::env::kRendezvousTls, "off", 1);
    } else if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--processes") == 0 && i + 1 < argc) {
      processes = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--spawn") == 0 && i + 2 < argc) {
      const int n = std::atoi(argv[i + 1]);
      std::vector<double> times;
      for (int run = 0; run < std::max(runs, 1); ++run) {
        const double t = SpawnOnce(n, argv + i + 2);
        if (t < 0) return 1;
        times.push_back(t * 1e3);
      }
      std::printf("# %d processes of %s: server start to last exit\n", n, argv[i + 2]);
      std::printf("# %10s %6s %12s %12s %12s\n", "workers", "runs", "min(ms)", "median(ms)",
                  "max(ms)");
      PrintRow(std::to_string(n).c_str(), times, {}, {});
      return 0;
    } else {
      sizes.push_back(std::atoi(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {16, 256, 1024};
  if (runs < 1 || processes < 0 ||
      std::any_of(sizes.begin(), sizes.end(), [](int n) { return n < 1; })) {
    std::fprintf(stderr,
                 "usage: rendezvous_bench [-v] [--runs R] [--processes P] [--per-key] [--relay] "
                 "[--local-socket] [--no-tls] "
                 "[N ...]\n"
                 "       rendezvous_bench [--runs R] --spawn N PROGRAM [ARGS...]\n");
    return 2;
  }

  std::printf("# join + exchange all addresses (%s) + barrier; workers as %s%s\n",
              per_key ? "Set, then Get of N keys" : "one Allgather",
              processes > 0 ? absl::StrCat("threads in ", processes, " processes").c_str()
                            : "threads of this process",
              relay ? absl::StrCat(", through a relay per host of ", kSlotsPerHost).c_str() : "");
  if (processes > 0) {
    std::printf(
        "# server cpu: CPU ms of this process (the rendezvous server) per run; workers cpu:\n"
        "# of the worker processes (medians); the server's alone bounds the time on a\n"
        "# machine where the workers run elsewhere\n");
  }
  std::printf("# %10s %6s %12s %12s %12s%s\n", "workers", "runs", "min(ms)", "median(ms)",
              "max(ms)", processes > 0 ? "  server cpu(ms) workers cpu(ms)" : "");
  for (int n : sizes) {
    std::vector<double> times, server_cpu, workers_cpu;
    for (int run = 0; run < runs; ++run) {
      const double self = CpuMs(RUSAGE_SELF), children = CpuMs(RUSAGE_CHILDREN);
      const double t = RunOnce(n, std::min(processes, n), per_key, relay, verbose);
      if (t < 0) return 1;
      times.push_back(t * 1e3);
      if (processes > 0) {
        server_cpu.push_back(CpuMs(RUSAGE_SELF) - self);
        workers_cpu.push_back(CpuMs(RUSAGE_CHILDREN) - children);
      }
    }
    PrintRow(std::to_string(n).c_str(), times, server_cpu, workers_cpu);
  }
  return 0;
}
