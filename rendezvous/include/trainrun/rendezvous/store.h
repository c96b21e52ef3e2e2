// Store: the key-value seam between workers, as gloo's rendezvous/store.h.
//
// Workers publish small blobs (data-plane addresses, NCCL unique IDs) and wait for each other's.
// The launcher's gRPC server backs the real store (GrpcStore); MemoryStore serves tests that run
// ranks as threads in one process.
//
//   store.Set("addr/3", "10.0.0.2:41234");
//   auto addrs = store.Get({"addr/0", "addr/1"}, std::chrono::seconds(60));
//   if (!addrs.ok()) return addrs.status();
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainrun::rendezvous {

class Store {
 public:
  virtual ~Store() = default;

  // Set stores `value` under `key`, replacing any earlier value, and releases every Get waiting
  // for it.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // Get waits until every key in `keys` exists, then returns their values in the same order.
  // Fails with DEADLINE_EXCEEDED, naming what was still missing, once `timeout` has passed.
  virtual absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                       std::chrono::milliseconds timeout) = 0;

  // Add atomically adds `delta` to the integer counter `key` (0 when absent) and returns the sum.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Barrier returns once `count` callers have entered the barrier called `name`, or fails with
  // DEADLINE_EXCEEDED after `timeout`. A name is used for one barrier only.
  virtual absl::Status Barrier(const std::string& name, int count,
                               std::chrono::milliseconds timeout) = 0;

  // ReportPeerFailure records that `rank` failed because of `peer_rank` (e.g. its connection to
  // that peer broke), so the launcher blames the peer, not this rank. Stores that have no launcher
  // behind them ignore it.
  virtual absl::Status ReportPeerFailure(int rank, int peer_rank, const std::string& message) {
    return absl::OkStatus();
  }
};

}  // namespace trainrun::rendezvous
