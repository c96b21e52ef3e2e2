// Listener: the rendezvous server's own TCP listening socket, which hands each connection to gRPC
// (grpc::AddInsecureChannelFromFd, or an external connection acceptor with the job's TLS
// credentials) rather than letting gRPC accept.
//
// Why: gRPC's own listener stops accepting for good after one accept4() fails with EMFILE
// ("Failed accept4: Too many open files", grpc/grpc#16058, #20418, #31080), so a burst of idle
// connections under `ulimit -Sn 1024` wedged the job's rendezvous, and on a multi-host job that
// port faces the network. This loop instead rests a moment and goes on; it caps the connections
// open at once (refusing the excess at once rather than leaving them queued).
//
// Before authentication it applies the job's Admission (admission.h): a connection must prove the
// token (the server calls Proven() at its first authenticated call) within the deadline from its
// accept, and unproven connections are capped per peer address and in all, the oldest closed
// first. With TLS or without, the proof is a call that carries the token (a host's relay makes
// one, Hello, as soon as it connects); with TLS (tls.h) gRPC refuses a stranger's calls as their
// headers arrive, before reading their messages, and the deadline and caps bound what such
// connections hold meanwhile.
//
//   auto listener = Listener::Bind("127.0.0.1", 0);       // before the server is built
//   auto tls = builder.experimental().AddExternalConnectionAcceptor(FROM_FD, creds);  // or null
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   (*listener)->Start(server.get(), std::move(tls));      // serves until Stop()
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/rendezvous/admission.h"

namespace grpc {
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace trainrun::rendezvous::internal {

// RaiseFdLimit raises this process's soft RLIMIT_NOFILE to its hard limit, so a burst of
// connections meets the limit an administrator set rather than the 1024 of most shells. Returns
// the soft limit now in force.
size_t RaiseFdLimit();

class Listener {
 public:
  // At most this many connections are served at once; more are closed as they arrive.
  static constexpr size_t kDefaultMaxConnections = 4096;
  // Proven connections are checked for having been closed by gRPC this often (and whenever the
  // cap is reached), not at every sweep: with thousands of workers connected, a check of each
  // every 100 ms cost the server more CPU than serving them.
  static constexpr std::chrono::seconds kSpokenSweepPeriod{5};

  // AdmissionFor is the admission of a job of `ranks` ranks: every rank of one host may connect
  // at once, and the unproven connections in all stay within half the descriptors this process
  // may hold (so a flood is evicted rather than left to exhaust them).
  static Admission::Limits AdmissionFor(size_t ranks);

  // gRPC ends a TLS handshake that has not finished by then (set on the server by its builder's
  // GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS); shorter than the admission's deadline, so a connection
  // that never finishes one is gRPC's to close.
  static constexpr std::chrono::milliseconds kTlsHandshakeTimeout{4000};

  // Bind listens on host:port (port 0: the kernel chooses). Fails with UNAVAILABLE.
  // `admission` caps the connections that have not proved the token yet.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& host, int port,
                                                        size_t max_connections,
                                                        Admission::Limits admission = {});
  // BindUnix listens on a Unix socket at `path` (which must not exist; its directory is the
  // caller's to keep private). Fails with UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<Listener>> BindUnix(const std::string& path,
                                                            size_t max_connections,
                                                            Admission::Limits admission = {});
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // Start accepts connections on a thread of its own and gives each to `server`: through `tls`
  // (an external connection acceptor with the job's TLS credentials) when given, else as a
  // plain-text channel.
  void Start(grpc::Server* server,
             std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tls = nullptr);
  // What StartOnDemand's `make` returns: the server to give connections to, and the acceptor
  // with the job's TLS credentials (null for plain text).
  struct Target {
    grpc::Server* server = nullptr;
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tls;
  };
  // StartOnDemand is Start with a server made on the accepting thread by `make`: at once when
  // `eager`, else when the first connection arrives (which waits in the meantime), so that a
  // listener nobody dials never pays for it (TLS: OpenSSL's context). `tls` says whether `make`
  // will give an acceptor. Should `make` fail, its error is said once and connections are closed.
  void StartOnDemand(std::function<absl::StatusOr<Target>()> make, bool tls, bool eager);
  // Proven notes that the connection gRPC names `peer` (ServerContext::peer()) has proved the
  // job's token. Thread-safe and cheap after the first call of each connection.
  void Proven(const std::string& peer);
  // Stop stops accepting and closes the listening socket; connections already given stay gRPC's.
  void Stop();

 private:
  // Connection is one socket given to gRPC, recognised by its inode so that a reused fd number
  // is not mistaken for it.
  struct Connection {
    int fd;
    ino_t inode;
    std::chrono::steady_clock::time_point accepted;
    uint64_t id = 0;   // its Admission id while unproven
    std::string peer;  // as gRPC will name it
  };

  Listener(int fd, int port, size_t max_connections, Admission::Limits admission);
  // PeerName is what gRPC's ServerContext::peer() will say for `fd`.
  std::string PeerName(int fd) const;
  // TakeProven moves the connections proven since the last call out of the unproven.
  void TakeProven();
  // CloseUnproven shuts down the unproven connection `id` (gRPC then closes its fd).
  void CloseUnproven(uint64_t id);
  void Run();
  // Forgets connections gRPC has closed and shuts down the unproven ones past their deadline. Only
  // the unproven connections are looked at, unless `all`.
  void Sweep(bool all);
  void Refused(const char* why);

  int fd_;
  int port_;
  size_t max_connections_;
  grpc::Server* server_ = nullptr;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tls_;
  bool tls_mode_ = false;  // connections go to tls_ (named by address), or are plain text
  std::function<absl::StatusOr<Target>()> make_;  // StartOnDemand's, until it has run
  bool eager_ = false;
  // MakeServer runs make_ (once) on the accepting thread; false when there is no server.
  bool MakeServer();
  Admission admission_;
  // The accepting thread's: the unproven connections by Admission id, and their ids by peer name.
  std::unordered_map<uint64_t, Connection> unproven_;
  std::unordered_map<std::string, uint64_t> unproven_by_peer_;
  uint64_t next_id_ = 1;
  // Peers proven since the accepting thread last looked, and every peer proven so far (so that
  // only a connection's first call takes the queue), under proven_mutex_.
  std::mutex proven_mutex_;
  std::vector<std::string> newly_proven_;
  std::unordered_set<std::string> proven_peers_;
  std::atomic<bool> stop_{false};
  int wake_;  // an eventfd that Stop() writes, to end the accepting thread's poll at once
  // The accepting thread's: connections that have proved the token (looked at only to forget the
  // ones gRPC closed).
  std::vector<Connection> proven_;
  size_t refused_ = 0;
  std::thread thread_;
};

}  // namespace trainrun::rendezvous::internal
