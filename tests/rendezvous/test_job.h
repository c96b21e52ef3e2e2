// A rendezvous server on loopback for the tests, and how its ranks join it.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::rendezvous::testing {

struct Job {
  ServerOptions options;
  std::unique_ptr<Server> server;

  ClientOptions ClientFor(int rank) const {
    ClientOptions client;
    client.address = server->address();
    client.job_id = options.job_id;
    client.token = options.token;
    client.host = options.ranks[rank].host;
    client.local_rank = options.ranks[rank].local_rank;
    client.call_timeout = std::chrono::seconds(10);
    return client;
  }
  // JoinAs joins as `rank` on the test's thread (it asserts); TryJoinAs on any thread.
  WorkerSession JoinAs(int rank) const {
    auto session = TryJoinAs(rank);
    REQUIRE(session.ok());
    return *std::move(session);
  }
  absl::StatusOr<WorkerSession> TryJoinAs(int rank) const {
    return Join(ClientFor(rank), std::chrono::seconds(10));
  }
};

// StartJob starts a server for `ranks` (job "test-job") with `limits`.
inline Job StartJob(std::vector<RankSlot> ranks, ServerLimits limits = {}) {
  Job job;
  job.options.job_id = "test-job";
  job.options.token = "s3cret-token-0123456789";
  job.options.ranks = std::move(ranks);
  job.options.limits = limits;
  auto server = Server::Start(job.options);
  REQUIRE(server.ok());
  job.server = *std::move(server);
  return job;
}

}  // namespace trainrun::rendezvous::testing
