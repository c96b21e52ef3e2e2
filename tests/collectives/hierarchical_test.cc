// Hierarchical allreduce (shared memory within a host, TCP across hosts): ranks as threads whose
// RankInfo places them on several "hosts" (the same-host check passes, as they share memory), and
// ranks as processes in two network namespaces, each namespace a host reachable only over its veth.
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "skip_test.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/testing/elements.h"
#include "trainrun/rendezvous/file_store.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Get;
using testing::IsFloatingPoint;
using testing::Put;

const std::vector<DataType> kTypes = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                      DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                      DataType::kUInt8,    DataType::kInt8};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct};

RankInfo Place(int rank, int hosts, int per_host) {
  RankInfo info;
  info.rank = rank;
  info.size = hosts * per_host;
  info.local_rank = rank % per_host;
  info.local_size = per_host;
  info.cross_rank = rank / per_host;
  info.cross_size = hosts;
  return info;
}

// Small integers every type holds exactly: 0..3, or 1..2 for products.
double Value(ReduceOp op, int rank, size_t i) {
  return op == ReduceOp::kProduct ? 1 + (rank + i) % 2 : static_cast<double>((rank * 7 + i) % 4);
}

double Expected(DataType type, ReduceOp op, int n, size_t i) {
  double acc = Value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = Value(op, r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAverage) acc += v;
    if (op == ReduceOp::kProduct) acc *= v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
  }
  if (op == ReduceOp::kAverage) acc = IsFloatingPoint(type) ? acc / n : std::trunc(acc / n);
  return acc;
}

// Runs every type and op at a few sizes on this rank; returns the first mismatch, or "".
std::string CheckEverything(Communicator& comm) {
  const int n = comm.size();
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{5000}, size_t{300001}}) {
        const size_t e = ElementSize(type);
        std::vector<char> buffer(count * e);
        for (size_t i = 0; i < count; ++i) Put(type, buffer, i, Value(op, comm.rank(), i));
        comm.Allreduce(buffer.data(), count, type, op);
        for (size_t i = 0; i < count; ++i) {
          const double want = Expected(type, op, n, i);
          const double got = Get(type, buffer, i);
          if (std::abs(got - want) > (IsFloatingPoint(type) ? 0.01 * std::abs(want) + 1e-9 : 0)) {
            return std::string(DataTypeName(type)) + " " + ReduceOpName(op) + " count " +
                   std::to_string(count) + " element " + std::to_string(i) + ": got " +
                   std::to_string(got) + ", expected " + std::to_string(want);
          }
        }
      }
    }
  }
  return "";
}

CommunicatorOptions Options() {
  CommunicatorOptions options;
  options.job_token = "t";
  options.job_id = "job-hier";
  options.timeout = std::chrono::seconds(30);
  options.transport = "auto";
  return options;
}

TEST_CASE("hierarchical allreduce on several hosts of threads: every type and op",
          "[hierarchical]") {
  // Chunks of 64 KiB: the larger counts below span many (the last one shorter), so the pipelined
  // path (each chunk's part crossing hosts on a helper thread while the next is reduced) runs, in
  // place, beside the one-chunk path of the smaller counts.
  ::setenv("TRAINRUN_HIERARCHICAL_CHUNK_BYTES", "65536", 1);
  struct Unset {
    ~Unset() { ::unsetenv("TRAINRUN_HIERARCHICAL_CHUNK_BYTES"); }
  } unset;
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    INFO(hosts << " hosts of " << per_host);
    const int n = hosts * per_host;
    auto store = std::make_shared<rendezvous::MemoryStore>();
    std::vector<std::string> failures(n), transports(n);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          Communicator comm(store, Place(rank, hosts, per_host), Options());
          transports[rank] = comm.transport();
          failures[rank] = CheckEverything(comm);
          // The other collectives run over the flat TCP mesh.
          std::vector<int32_t> all(n);
          int32_t mine = rank;
          comm.Allgather(&mine, all.data(), 1, DataType::kInt32);
          for (int r = 0; r < n; ++r) {
            if (all[r] != r) failures[rank] = "allgather";
          }
          comm.Barrier();
        } catch (const std::exception& e) {
          failures[rank] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(failures[r] == "");
      CHECK(transports[r] == "shm+tcp");
    }
  }
}

TEST_CASE("uneven hosts run flat over TCP", "[hierarchical]") {
  // 3 ranks: two on host 0, one on host 1.
  auto store = std::make_shared<rendezvous::MemoryStore>();
  std::vector<std::string> transports(3);
  std::vector<float> sums(3);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      RankInfo info{rank, 3, rank % 2, rank < 2 ? 2 : 1, rank / 2, rank == 0 ? 2 : 1};
      try {
        Communicator comm(store, info, Options());
        transports[rank] = comm.transport();
        float x = static_cast<float>(rank + 1);
        comm.Allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
        sums[rank] = x;
      } catch (const std::exception& e) {
        transports[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK(transports[r] == "tcp");
    CHECK(sums[r] == 6.0f);
  }
}

// Two network namespaces joined by one veth pair: two "hosts" that share memory but not a
// network (each sees only its own address and the other's over the veth).
class TwoHosts {
 public:
  TwoHosts() {
    const std::string tag = std::to_string(::getpid() % 100000);
    names_ = {"trcoll-a-" + tag, "trcoll-b-" + tag};
    subnet_ = "10.214." + std::to_string(::getpid() % 250) + ".";
    ok_ = Sh("ip netns add " + names_[0]) && Sh("ip netns add " + names_[1]) &&
          Sh("ip -n " + names_[0] + " link add eth0 type veth peer name eth0 netns " + names_[1]) &&
          Sh("ip -n " + names_[0] + " addr add " + address(0) + "/24 dev eth0") &&
          Sh("ip -n " + names_[1] + " addr add " + address(1) + "/24 dev eth0") &&
          Sh("ip -n " + names_[0] + " link set eth0 up") &&
          Sh("ip -n " + names_[1] + " link set eth0 up") &&
          Sh("ip -n " + names_[0] + " link set lo up") &&
          Sh("ip -n " + names_[1] + " link set lo up");
  }
  ~TwoHosts() {
    for (const auto& name : names_) Sh("ip netns del " + name + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  std::string address(int host) const { return subnet_ + std::to_string(host + 1); }
  // Enters host `host`'s namespace (in a forked child).
  bool Enter(int host) const {
    int fd = ::open(("/var/run/netns/" + names_[host]).c_str(), O_RDONLY | O_CLOEXEC);
    return fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
  }
  // Bytes host 0 has sent over its veth.
  long SentBytes() const {
    FILE* p = ::popen(
        ("ip netns exec " + names_[0] + " cat /sys/class/net/eth0/statistics/tx_bytes").c_str(),
        "r");
    long bytes = -1;
    if (p != nullptr) {
      if (std::fscanf(p, "%ld", &bytes) != 1) bytes = -1;
      ::pclose(p);
    }
    return bytes;
  }

 private:
  static bool Sh(const std::string& command) { return std::system(command.c_str()) == 0; }
  std::vector<std::string> names_;
  std::string subnet_;
  bool ok_ = false;
};

TEST_CASE("hierarchical allreduce across two network-namespace hosts of processes",
          "[hierarchical][netns][process]") {
  if (::geteuid() != 0) {
    trainrun::testing::SkipTest("needs root to make network namespaces");
  }
  TwoHosts hosts;
  REQUIRE(hosts.ok());
  char dir[] = "/tmp/trainrun-hier-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const int per_host = 2, n = 4;
  const size_t big = 4 << 20;  // floats: 16 MiB
  const long sent_before = hosts.SentBytes();
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      try {
        const int host = rank / per_host;
        if (!hosts.Enter(host)) ::_exit(30);
        CommunicatorOptions options = Options();
        options.listen_address = hosts.address(host);
        Communicator comm(std::make_shared<rendezvous::FileStore>(dir), Place(rank, 2, per_host),
                          options);
        if (std::string(comm.transport()) != "shm+tcp") ::_exit(31);
        comm.Barrier();
        std::vector<float> x(big, static_cast<float>(rank + 1));
        comm.Allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
        for (float v : x) {
          if (v != 10.0f) ::_exit(32);
        }
        comm.Barrier();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 33;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<int> status(n, -1);
  for (int left = n; left > 0 && Clock::now() < deadline;) {
    for (int r = 0; r < n; ++r) {
      int s = 0;
      if (status[r] == -1 && ::waitpid(children[r], &s, WNOHANG) == children[r]) {
        status[r] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < n; ++r) {
    if (status[r] == -1) {
      ::kill(children[r], SIGKILL);
      ::waitpid(children[r], nullptr, 0);
    }
    INFO("rank " << r);
    CHECK(status[r] == 0);
  }
  // One copy of the data leaves each host (plus setup and headers), where a flat ring over the
  // four ranks would send 1.5 copies over each host's link.
  const long sent = hosts.SentBytes() - sent_before;
  INFO("host 0 sent " << sent << " bytes for a " << big * 4 << "-byte allreduce");
  CHECK(sent < static_cast<long>(big * 4 * 1.2));
  CHECK(sent > static_cast<long>(big * 4 * 0.9));
  (void)std::system((std::string("rm -rf ") + dir).c_str());
}

}  // namespace
}  // namespace trainrun::collectives
