// The rendezvous server that `trainrun` runs for a job: workers join, publish and wait for keys,
// and meet at barriers. It runs on gRPC's callback API, so a waiting Get or Barrier holds only its
// reactor until the keys arrive or its deadline passes; no thread is parked per waiting rank.
// Inside (src/): the ranks (membership.h), the store and its waiting calls (rendezvous_state.h,
// no gRPC) and the gRPC adapter (service.h). It keeps state and answers calls; what a rank's
// end means for the job is the launcher's supervisor's to decide.
//
//   ServerOptions options;
//   options.job_id = "job-1";
//   options.token = *RandomToken();
//   options.ranks = {{"localhost", 0, 2, 0, 1}, {"localhost", 1, 2, 0, 1}};
//   auto server = trainrun::rendezvous::Server::Start(options);
//   if (!server.ok()) return server.status();
//   env[TRAINRUN_RENDEZVOUS_ADDR] = (*server)->address();
//   ...
//   (*server)->NoteRankExit(3, "exited with code 1");
//   for (const PeerFailure& f : (*server)->PeerFailures()) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainrun::rendezvous {

// RankSlot is one rank's place, as the slot plan gives it; the rank is its index in
// ServerOptions::ranks. A worker joins by (host, local_rank).
struct RankSlot {
  std::string host;  // as the user wrote it; the worker's TRAINRUN_HOSTNAME
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
};

// ServerLimits bound what one call may store or ask for, so a buggy or hostile worker cannot
// exhaust the launcher's memory. Calls past a limit fail with INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED for the totals) naming it.
struct ServerLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_keys_per_get = 1 << 16;
  size_t max_stored_bytes = size_t{512} << 20;   // all keys and values together
  size_t max_response_bytes = size_t{64} << 20;  // the values one Get returns
  size_t max_waiters = 1 << 18;                  // Gets and Barriers waiting at once
  int64_t max_timeout_ms = int64_t{7} * 24 * 3600 * 1000;
  // Connections open at once beyond one per rank (each worker keeps one for the job's life); more
  // are closed as they arrive (a burst must not wedge the server).
  size_t max_connections = 4096;
};

// PeerFailure is a rank's report that it failed because of another rank.
struct PeerFailure {
  int rank = 0;
  int peer_rank = 0;
  int exit_code = 1;
  std::string message;
};

// ServerOptions configures one job's server.
struct ServerOptions {
  // Address to listen on: "127.0.0.1" when every rank is local, a host's address or "0.0.0.0"
  // otherwise. Port 0 lets the kernel choose (the default); a fixed port is --rendezvous-port.
  std::string bind_address = "127.0.0.1";
  int port = 0;
  // Host the workers dial (TRAINRUN_RENDEZVOUS_ADDR); empty means bind_address, which then must
  // not be a wildcard address.
  std::string advertise_host;
  std::string job_id;
  std::string token;  // the job's secret; must not be empty
  // TLS with the job's certificate, made from the token (rendezvous/src/tls.h), required of every
  // client: the token never crosses the network. False (--no-tls) serves plain text, to debug.
  bool tls = true;
  // Also listen on a Unix socket in a private directory of its own (mode 0700, under $TMPDIR or
  // /tmp) for the ranks on this machine (TRAINRUN_RENDEZVOUS_SOCKET): plain text, since nothing on
  // it crosses a network and only this user (who can read the ranks' environment anyway) can reach
  // it, so those ranks pay no TLS handshake. Removed at shutdown. No socket where none can be made.
  bool local_socket = false;
  // With local_socket: build the TCP port's server (with TLS: OpenSSL's context, milliseconds)
  // only when a connection arrives there, for a job whose ranks all dial the local socket.
  bool network_on_demand = false;
  std::vector<RankSlot> ranks;
  ServerLimits limits;
  // Called, on a gRPC thread and without the server's lock, for each "failed because of peer P"
  // report as it arrives (the launcher posts it to its supervisor). May be empty.
  std::function<void(const PeerFailure&)> on_peer_failure;
  // Called, on a gRPC thread and without the server's lock, for each rank as it joins, before its
  // Join is answered (the launcher's supervisor sees from this and the ranks' exits when a rank
  // ended without joining while others wait for it). May be empty.
  std::function<void(int rank)> on_join;
};

// RankState is what the server knows about one rank.
struct RankState {
  bool joined = false;
  int64_t pid = 0;                    // the worker's pid as it reported it, when joined
  std::optional<std::string> exited;  // e.g. "exited with code 1", once the launcher noted it
};

// RandomToken returns a fresh job secret: 32 bytes from getrandom(2), as 64 hex digits. Fails with
// UNAVAILABLE when the kernel gives no randomness.
absl::StatusOr<std::string> RandomToken();

// Server is one job's rendezvous server. Thread-safe. Destroying it shuts it down: waiting calls
// fail with UNAVAILABLE.
class Server {
 public:
  // Start raises the process's soft RLIMIT_NOFILE to its hard limit, then listens and serves. Fails
  // with INVALID_ARGUMENT for bad options (empty token, no ranks, wildcard address without
  // advertise_host) and UNAVAILABLE when it cannot listen (port in use).
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);

  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // address is host:port for the workers' TRAINRUN_RENDEZVOUS_ADDR.
  std::string address() const;
  // port is the port actually bound (the kernel's choice when ServerOptions::port was 0).
  int port() const;
  // Ready waits until the server serves (Start returns once it listens: the TCP port's gRPC
  // server, and with TLS OpenSSL's context, are built meanwhile, while the caller starts its ranks,
  // whose connections wait in the backlog) and says whether it does. INTERNAL when it could not
  // start. With network_on_demand and the local socket, at once.
  absl::Status Ready();
  // socket_path is the Unix socket of ServerOptions::local_socket (TRAINRUN_RENDEZVOUS_SOCKET for
  // the ranks on this machine), or "" when there is none.
  std::string socket_path() const;

  // NoteRankExit records how rank `rank` ended, completing "rank 3 ...": "exited with code 1",
  // "was killed by SIGKILL". Timeout errors of waiting ranks then say it.
  void NoteRankExit(int rank, const std::string& how);

  // AddRanks appends ranks to the job (an elastic job that grows onto a new host) and returns the
  // first one's number; the others follow in order. Such a rank joins by its number (its
  // JoinRequest's rank, which must be given) on its host, whatever its local_rank says.
  int AddRanks(const std::vector<RankSlot>& slots);

  // Ranks returns what the server knows about every rank, indexed by rank.
  std::vector<RankState> Ranks() const;
  // JoinedRanks lists the ranks that have joined, ascending.
  std::vector<int> JoinedRanks() const;
  // PeerFailures lists the "failed because of peer P" reports, in arrival order.
  std::vector<PeerFailure> PeerFailures() const;
  // ValuesWithPrefix returns the stored keys that start with `prefix`, with their values (the
  // launcher reads the ranks' stall reports, env::kStallKeyPrefix, this way).
  std::map<std::string, std::string> ValuesWithPrefix(const std::string& prefix) const;

  // Set stores `value` under `key` as a worker's Set would, releasing the Gets waiting for it
  // (the launcher publishes an elastic job's generations this way, generation.h). Fails with
  // RESOURCE_EXHAUSTED past the storage limit.
  absl::Status Set(const std::string& key, const std::string& value);
  // SetCounter sets the counter `key` (Store::Add's) to `value`.
  void SetCounter(const std::string& key, int64_t value);

  // WaitingCalls is the number of Get and Barrier calls waiting now.
  size_t WaitingCalls() const;

  // Shutdown fails every waiting call with UNAVAILABLE and stops serving. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainrun::rendezvous
