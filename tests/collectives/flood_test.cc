// A flood on a rank's data port during setup: idle strangers and garbage cost no thread each,
// fill the job's output with a few lines at most, and do not keep the real peers out.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "acceptor.h"
#include "socket.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives {
namespace {

using Clock = std::chrono::steady_clock;

int ThreadCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) n += entry->d_name[0] != '.';
  closedir(dir);
  return n;
}

// CaptureStderr sends fd 2 to a file while alive; Text() reads what was written.
class CaptureStderr {
 public:
  CaptureStderr() {
    std::fflush(stderr);
    saved_ = dup(2);
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
  }
  ~CaptureStderr() { Restore(); }
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  std::string Text() const {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string path_ = "/tmp/trainrun_flood_test_stderr." + std::to_string(getpid());
  int saved_ = -1;
};

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST_CASE("a flood of strangers on the data port costs no thread each and few log lines",
          "[hostile]") {
  auto store = std::make_shared<rendezvous::MemoryStore>();
  CommunicatorOptions options;
  options.job_token = "secret";
  options.job_id = "job-1";
  options.timeout = std::chrono::seconds(20);
  options.transport = "tcp";  // the data port under test
  const int n = 2;
  std::vector<std::exception_ptr> errors(n);
  std::vector<float> sums(n, 0);
  auto rank_main = [&](int rank) {
    try {
      Communicator comm(store, rank, n, options);
      float x = static_cast<float>(rank + 1);
      comm.Allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
      sums[rank] = x;
    } catch (...) {
      errors[rank] = std::current_exception();
    }
  };
  CaptureStderr captured;
  const int threads_before = ThreadCount();
  std::thread rank0(rank_main, 0);
  auto address = store->Get({"collectives/world/addr/0"}, std::chrono::seconds(10));
  REQUIRE(address.ok());
  auto target = internal::SocketAddress::Parse((*address)[0]);
  auto deadline = Clock::now() + std::chrono::seconds(10);

  // 600 strangers: two thirds say nothing, a third send garbage.
  std::vector<internal::Fd> strangers;
  const std::string junk(100, '\x7f');
  for (int i = 0; i < 600; ++i) {
    strangers.push_back(internal::Connect(target, 0, deadline));
    if (i % 3 == 0) internal::WriteFull(strangers.back().get(), junk.data(), junk.size(), deadline);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all accepted by now
  const int threads_during = ThreadCount();

  std::thread rank1(rank_main, 1);
  rank0.join();
  rank1.join();
  strangers.clear();
  captured.Restore();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  CHECK(sums == std::vector<float>{3, 3});
  // Rank 0's thread and its acceptor; the 600 connections add none.
  CHECK(threads_during - threads_before <= 4);
  const std::string log = captured.Text();
  INFO(log);
  CHECK(Count(log, "\n") <= 5);
  CHECK(Count(log, "dropped a data connection from") <= 3);
}

// ConnectFrom opens a blocking TCP connection to `target` from the local address `source`.
internal::Fd ConnectFrom(const char* source, const internal::SocketAddress& target) {
  internal::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0);
  REQUIRE(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target.storage), target.length) ==
          0);
  return fd;
}

// Closed: the acceptor dropped this idle connection (its end reads EOF).
bool Closed(int fd) {
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

TEST_CASE("a flood from one address pushes out its own connections, not another address's",
          "[hostile]") {
  internal::SocketAddress bound;
  internal::Fd listener = internal::Listen("127.0.0.1", 0, &bound);
  internal::HandshakeParams params{"secret", "job-1", "world", 2, 1};
  CaptureStderr captured;
  internal::Acceptor acceptor(std::move(listener), params, 0,
                              Clock::now() + std::chrono::seconds(20),
                              [](internal::PeerIdentity, internal::Fd) { return true; });
  // A connection from another host (127.0.0.2), still to say its hello: the oldest waiting.
  internal::Fd other = ConnectFrom("127.0.0.2", bound);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // More idle ones from 127.0.0.1 than the acceptor holds waiting in all.
  const size_t flood = internal::Acceptor::kMaxPending + 44;
  std::vector<internal::Fd> strangers;
  for (size_t i = 0; i < flood; ++i) strangers.push_back(ConnectFrom("127.0.0.1", bound));
  size_t closed = 0;
  for (int wait = 0; wait < 100; ++wait) {  // until the acceptor has taken them all, at most 5 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    closed = 0;
    for (const internal::Fd& fd : strangers) closed += Closed(fd.get()) ? 1 : 0;
    if (closed >= flood - internal::Acceptor::kMaxPendingPerAddress) break;
  }
  // The flood's own oldest went, down to its address's cap; the other host's one is still waiting.
  CHECK(closed == flood - internal::Acceptor::kMaxPendingPerAddress);
  CHECK_FALSE(Closed(other.get()));
  strangers.clear();
  captured.Restore();
  const std::string log = captured.Text();
  INFO(log);
  CHECK(Count(log, "\n") <= 3);
}

}  // namespace
}  // namespace trainrun::collectives
