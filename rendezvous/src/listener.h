// Listener: the rendezvous server's own TCP listening socket, which hands each connection to gRPC
// (grpc::AddInsecureChannelFromFd) rather than letting gRPC accept.
//
// Why: gRPC's own listener stops accepting for good after one accept4() fails with EMFILE
// ("Failed accept4: Too many open files", grpc/grpc#16058, #20418, #31080), so a burst of idle
// connections under `ulimit -Sn 1024` wedged the job's rendezvous, and on a multi-host job that
// port faces the network. This loop instead rests a moment and goes on; it caps the connections
// open at once (refusing the excess at once rather than leaving them queued), and closes
// connections that sent nothing at all for kSilentTimeout.
//
//   auto listener = Listener::Bind("127.0.0.1", 0);       // before the server is built
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   (*listener)->Start(server.get());                      // serves until Stop()
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}

namespace trainrun::rendezvous::internal {

// RaiseFdLimit raises this process's soft RLIMIT_NOFILE to its hard limit, so a burst of
// connections meets the limit an administrator set rather than the 1024 of most shells. Returns
// the soft limit now in force.
size_t RaiseFdLimit();

class Listener {
 public:
  // At most this many connections are served at once; more are closed as they arrive.
  static constexpr size_t kDefaultMaxConnections = 4096;
  // A connection that has sent no byte for this long after it was accepted is closed.
  static constexpr std::chrono::seconds kSilentTimeout{10};
  // Connections that have spoken are checked for having been closed by gRPC this often (and
  // whenever the cap is reached), not at every sweep: with thousands of workers connected, a
  // check of each every 100 ms cost the server more CPU than serving them.
  static constexpr std::chrono::seconds kSpokenSweepPeriod{5};

  // Bind listens on host:port (port 0: the kernel chooses). Fails with UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& host, int port,
                                                        size_t max_connections);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // Start accepts connections on a thread of its own and gives each to `server`.
  void Start(grpc::Server* server);
  // Stop stops accepting and closes the listening socket; connections already given stay gRPC's.
  void Stop();

 private:
  // Connection is one socket given to gRPC, recognised by its inode so that a reused fd number
  // is not mistaken for it.
  struct Connection {
    int fd;
    ino_t inode;
    std::chrono::steady_clock::time_point accepted;
    bool spoke = false;  // has sent at least one byte
  };

  Listener(int fd, int port, size_t max_connections);
  void Run();
  // Forgets connections gRPC has closed and shuts down those silent for kSilentTimeout. Only the
  // connections that have not spoken yet are looked at, unless `all`.
  void Sweep(bool all);
  void Refused(const char* why);

  int fd_;
  int port_;
  size_t max_connections_;
  grpc::Server* server_ = nullptr;
  std::atomic<bool> stop_{false};
  int wake_;  // an eventfd that Stop() writes, to end the accepting thread's poll at once
  // The accepting thread's: connections that have not sent a byte yet (looked at every sweep),
  // and those that have (looked at only to forget the ones gRPC closed).
  std::vector<Connection> quiet_;
  std::vector<Connection> spoken_;
  size_t refused_ = 0;
  std::thread thread_;
};

}  // namespace trainrun::rendezvous::internal
