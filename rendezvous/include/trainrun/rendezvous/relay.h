// Relay: a host's side of the rendezvous, run by the host's trainrun agent for the ranks it starts.
// Its ranks call it on a Unix socket (TRAINRUN_RENDEZVOUS_RELAY) instead of each opening a gRPC
// connection to the launcher; it forwards their calls over one gRPC channel, and sends the
// start-up burst (every rank's Join, then its Allgather and Barrier calls) as one batched call per
// host (rendezvous.proto's JoinBatch, AllgatherBatch, BarrierBatch). A batch goes once every one
// of the host's `local_ranks` ranks has called, or `batch_window` after its first member, so ranks
// that call at different times are never held back longer than that. The ranks' monitor reports
// (Sets of "trainrun/monitor/<rank>", which every rank makes once a period, aligned to the host's
// clock) go the same way, as one SetBatch per host, within `report_window`.
//
//   RelayOptions options;
//   options.socket = "@trainrun-job-1-relay";  // '@': Linux's abstract namespace
//   options.server_address = env[TRAINRUN_RENDEZVOUS_ADDR];
//   options.job_id = ...; options.token = ...; options.host = "node7"; options.local_ranks = 8;
//   auto relay = trainrun::rendezvous::Relay::Start(options);
//   if (!relay.ok()) return relay.status();
//   env[TRAINRUN_RENDEZVOUS_RELAY] = (*relay)->socket();
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainrun::rendezvous {

struct RelayOptions {
  // Where to listen: "@name" in the abstract namespace (gone with the relay, no file to clean up),
  // or a filesystem path.
  std::string socket;
  std::string server_address;  // host:port of the launcher's rendezvous server
  std::string job_id;
  std::string token;  // the job's; the relay checks its ranks' and sends it upstream
  bool tls = true;    // TLS to the server (ClientOptions::tls)
  std::string host;   // the host's name as the job knows it, for error messages
  // How many ranks of this host will call; 0 when unknown (each batch then waits its window).
  int local_ranks = 0;
  std::chrono::milliseconds batch_window{2};
  // Reports come once a period (a second or more) at the same moment of the host's monotonic
  // clock; a rank's reporter thread waits, not its collectives.
  std::chrono::milliseconds report_window{100};
};

// Relay serves until destroyed; then its ranks' calls in flight and later fail, naming it.
class Relay {
 public:
  // Start listens on `options.socket` and serves on a thread of its own. Fails with
  // INVALID_ARGUMENT for missing options and UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<Relay>> Start(RelayOptions options);

  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // socket is what the ranks' TRAINRUN_RENDEZVOUS_RELAY says.
  const std::string& socket() const;

  // Upstream counts the calls the relay has sent to the server (batches count once); for tests
  // and the bench.
  int64_t upstream_calls() const;

  // WaitConnected waits until the relay's connection to the server is up and has proved the token
  // (TCP, TLS and HTTP/2 handshakes done, the relay's Hello answered), at most `timeout`; false if
  // it is not. The relay connects by itself as it starts; the bench waits for it to time the ranks'
  // start-up as an agent's ranks meet it, after their own start.
  bool WaitConnected(std::chrono::milliseconds timeout);

  class Impl;

 private:
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainrun::rendezvous
