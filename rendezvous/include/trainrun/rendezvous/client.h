// The worker's side of the rendezvous: join the job, then talk to the other ranks through a Store
// backed by the launcher's server.
//
//   auto session = trainrun::rendezvous::JoinFromEnvironment(std::chrono::seconds(60));
//   if (!session.ok()) return session.status();
//   const Assignment& me = session->assignment;
//   session->store->Set(absl::StrCat("addr/", me.rank), my_address);
//   auto id = ShareFromRoot(*session->store, "nccl/world", me.rank, /*root=*/0,
//                           [] { return MakeNcclUniqueId(); }, std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/rendezvous/rank_place.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous {

// Assignment is what joining tells a worker: its place, every rank's host, and the job's id.
struct Assignment : RankPlace {
  // HostOf returns rank `rank`'s host name as the user wrote it ("" outside 0 .. size-1).
  const std::string& HostOf(int rank) const;

  // The hosts as the server sends them: ranks [host_run_ends[k-1], host_run_ends[k]) (from 0 for
  // k = 0) run on host_names[host_run_hosts[k]]. Runs rather than a name per rank, so a worker of
  // an 8192-rank job does not build 8192 strings.
  std::vector<std::string> host_names;
  std::vector<int> host_run_hosts;
  std::vector<int> host_run_ends;
  std::string job_id;
};

// WorkerSession is what joining gives a worker: its assignment and a Store shared with the job.
struct WorkerSession {
  Assignment assignment;
  std::shared_ptr<Store> store;
};

// ClientOptions says how to reach a job's rendezvous server and who this worker is.
struct ClientOptions {
  std::string address;  // host:port (TRAINRUN_RENDEZVOUS_ADDR)
  // The host's relay (TRAINRUN_RENDEZVOUS_RELAY, relay.h): "@name" or a path. When set, every call
  // goes to it on a Unix socket instead of to `address` on a gRPC channel of this worker's own.
  std::string relay;
  std::string job_id;  // TRAINRUN_JOB_ID
  std::string token;   // TRAINRUN_JOB_TOKEN
  // TLS with the job's certificate made from the token; false when TRAINRUN_RENDEZVOUS_TLS=off
  // (--no-tls). Must match the server's.
  bool tls = true;
  // The server's Unix socket on this machine (TRAINRUN_RENDEZVOUS_SOCKET): when set and present,
  // calls go there in plain text instead of to `address` (no TLS handshake; it crosses no network).
  std::string socket;
  std::string host;        // TRAINRUN_HOSTNAME
  int local_rank = 0;      // TRAINRUN_LOCAL_RANK
  int expected_rank = -1;  // TRAINRUN_RANK when known; the server checks it matches
  // Deadline of calls that do not wait for other ranks (Set, Add, ReportExit).
  std::chrono::milliseconds call_timeout = std::chrono::seconds(30);
};

// Join connects to the server in `options`, joins, and returns the assignment and a Store backed by
// the server. Fails with the server's status (UNAUTHENTICATED for a wrong token, NOT_FOUND for a
// (host, local_rank) the job does not have, ALREADY_EXISTS for a second join of one rank), or
// DEADLINE_EXCEEDED / UNAVAILABLE when the server cannot be reached within `timeout`.
absl::StatusOr<WorkerSession> Join(const ClientOptions& options, std::chrono::milliseconds timeout);

// ConnectStore returns a Store backed by the server in `options` without joining (for tools and
// tests; a worker joins). Waits it enters are attributed to `options.expected_rank` (-1: none).
// Connecting is lazy: an unreachable server shows up as UNAVAILABLE on the first call.
absl::StatusOr<std::shared_ptr<Store>> ConnectStore(const ClientOptions& options);

// ClientOptionsFromEnvironment reads TRAINRUN_RENDEZVOUS_ADDR, TRAINRUN_JOB_ID, TRAINRUN_JOB_TOKEN,
// TRAINRUN_HOSTNAME, TRAINRUN_LOCAL_RANK and (optionally) TRAINRUN_RANK and
// TRAINRUN_RENDEZVOUS_RELAY. Fails with
// FAILED_PRECONDITION naming the first variable that is missing or malformed (a worker not started
// by trainrun).
absl::StatusOr<ClientOptions> ClientOptionsFromEnvironment();

// JoinFromEnvironment is Join(ClientOptionsFromEnvironment(), timeout).
absl::StatusOr<WorkerSession> JoinFromEnvironment(std::chrono::milliseconds timeout);

// ShareFromRoot publishes a blob from one rank to the others of a communicator: the rank equal to
// `root` calls `make` and stores its result under "share/<name>"; every other rank waits (up to
// `timeout`) for it. Every rank returns the blob. `name` must be unique per communicator and use
// (e.g. "nccl/world/0"). This is the path NCCL unique ids take.
absl::StatusOr<std::string> ShareFromRoot(Store& store, const std::string& name, int rank, int root,
                                          const std::function<std::string()>& make,
                                          std::chrono::milliseconds timeout);

}  // namespace trainrun::rendezvous
