// A burst of idle connections on the rendezvous port (which faces the network on a multi-host
// job): the server raises its soft descriptor limit, and keeps accepting, or starts again, once
// the burst is over, even when the burst reached its hard limit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "trainrun/rendezvous/client.h"

namespace trainrun::rendezvous {
namespace {

// BurstServer runs burst_server SOFT HARD and reads the port it listens on.
class BurstServer {
 public:
  BurstServer(int soft, int hard) {
    int in[2], out[2];
    REQUIRE(pipe(in) == 0);
    REQUIRE(pipe(out) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      execl(TRAINRUN_BURST_SERVER, TRAINRUN_BURST_SERVER, std::to_string(soft).c_str(),
            std::to_string(hard).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    FILE* from = fdopen(out[0], "r");
    unsigned long soft_now = 0;
    REQUIRE(std::fscanf(from, "port %d soft %lu", &port_, &soft_now) == 2);
    std::fclose(from);
    soft_limit_ = soft_now;
  }
  ~BurstServer() {
    close(stdin_);
    int status;
    for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  int port() const { return port_; }
  unsigned long soft_limit() const { return soft_limit_; }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
  unsigned long soft_limit_ = 0;
};

// Idle opens `n` connections that send nothing.
std::vector<int> Idle(int port, int n) {
  std::vector<int> fds;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    fds.push_back(fd);
  }
  return fds;
}

absl::Status TryJoin(int port) {
  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.job_id = "burst-job";
  options.token = "burst-token";
  options.host = "localhost";
  options.local_rank = 0;
  return Join(options, std::chrono::seconds(5)).status();
}

TEST_CASE("1100 idle connections under `ulimit -Sn 1024`: workers still join", "[rendezvous]") {
  BurstServer server(1024, 8192);
  CHECK(server.soft_limit() == 8192);  // raised to the hard limit at start
  std::vector<int> burst = Idle(server.port(), 1100);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  absl::Status joined = TryJoin(server.port());
  CHECK(joined.ok());
  INFO(joined.ToString());
  for (int fd : burst) close(fd);
}

TEST_CASE("a burst past the hard descriptor limit: the server accepts again once it is over",
          "[rendezvous]") {
  BurstServer server(256, 256);
  std::vector<int> burst = Idle(server.port(), 400);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int fd : burst) close(fd);
  absl::Status joined = TryJoin(server.port());
  INFO(joined.ToString());
  CHECK(joined.ok());
}

}  // namespace
}  // namespace trainrun::rendezvous
