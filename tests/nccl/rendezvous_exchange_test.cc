// The NCCL unique-ID exchange through the real rendezvous server on 127.0.0.1: the timeout names
// the root that never published and, from the server, the rank that never joined. No GPU needed.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/unique_id_exchange.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::collectives::nccl {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct TwoRankJob {
  rendezvous::ServerOptions options;
  std::unique_ptr<rendezvous::Server> server;

  TwoRankJob() {
    options.job_id = "nccl-test";
    options.token = "nccl-test-token-0123456789";
    options.ranks = {{"localhost", 0, 2, 0, 1}, {"localhost", 1, 2, 0, 1}};
    auto started = rendezvous::Server::Start(options);
    REQUIRE(started.ok());
    server = *std::move(started);
  }

  rendezvous::WorkerSession Join(int local_rank) const {
    rendezvous::ClientOptions client;
    client.address = server->address();
    client.job_id = options.job_id;
    client.token = options.token;
    client.host = "localhost";
    client.local_rank = local_rank;
    auto session = rendezvous::Join(client, seconds(10));
    REQUIRE(session.ok());
    return *std::move(session);
  }
};

TEST_CASE("both ranks get rank 0's ID through the server", "[nccl][unique_id][rendezvous]") {
  TwoRankJob job;
  auto session0 = job.Join(0);
  auto session1 = job.Join(1);
  auto waiter = std::async(std::launch::async, [&] {
    return ExchangeUniqueId(
        *session1.store, "world", 1, 0, [] { return std::string("unused"); }, seconds(10));
  });
  const std::string blob(128, '\x7f');
  CHECK(ExchangeUniqueId(
            *session0.store, "world", 0, 0, [&] { return blob; }, seconds(10)) == blob);
  CHECK(waiter.get() == blob);
}

TEST_CASE("a root that never joined is named in the timeout", "[nccl][unique_id][rendezvous]") {
  TwoRankJob job;
  auto session1 = job.Join(1);
  const auto start = std::chrono::steady_clock::now();
  try {
    ExchangeUniqueId(
        *session1.store, "world", 1, 0, [] { return std::string("x"); }, milliseconds(500));
    FAIL("the exchange returned without rank 0");
  } catch (const TimeoutError& error) {
    const std::string message = error.what();
    CHECK_THAT(message, Catch::Contains("from rank 0, which never published it"));
    CHECK_THAT(message, Catch::Contains("rank 0 has not joined"));
  }
  CHECK(std::chrono::steady_clock::now() - start < seconds(10));
}

}  // namespace
}  // namespace trainrun::collectives::nccl
