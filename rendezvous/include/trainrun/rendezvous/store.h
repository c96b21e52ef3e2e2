// Store: the key-value seam between workers, as gloo's rendezvous/store.h.
//
// Workers publish small blobs (data-plane addresses, NCCL unique IDs) and wait for each other's.
// The launcher's gRPC server backs the real store (GrpcStore); MemoryStore serves tests that run
// ranks as threads in one process.
//
//   store.Set("addr/3", "10.0.0.2:41234");
//   auto addrs = store.Get({"addr/0", "addr/1"}, std::chrono::seconds(60));
//   if (!addrs.ok()) return addrs.status();
//   // Every rank's address, one call per rank (what a communicator's bootstrap does):
//   auto all = store.AllgatherTable("addr", rank, size, my_address, std::chrono::seconds(60));
//   if (!all.ok()) return all.status();
//   std::string_view rank0 = (*all)[0];
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainrun::rendezvous {

// GatherTable is an Allgather's answer: every contributor's value, in rank order, in one buffer.
// Every rank of a job reads the whole table (8192 values at 8192 ranks), so it is built as two
// allocations, not one string per value; a value is a view that lives as long as the table.
// Move-only.
class GatherTable {
 public:
  GatherTable() = default;
  // The values are `bytes` cut at `ends`: value i is bytes[ends[i-1], ends[i]) (from 0 for the
  // first). `ends` must not decrease, and `bytes` must hold at least its last entry's bytes.
  GatherTable(std::unique_ptr<char[]> bytes, std::vector<uint32_t> ends)
      : bytes_(std::move(bytes)), ends_(std::move(ends)) {}
  // FromValues packs `values` (the default AllgatherTable's, and tests').
  static GatherTable FromValues(const std::vector<std::string>& values);

  size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::string_view operator[](size_t i) const {
    const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
    return std::string_view(bytes_.get() + begin, ends_[i] - begin);
  }
  // ToStrings copies the values out, as Allgather returns them.
  std::vector<std::string> ToStrings() const;

 private:
  std::unique_ptr<char[]> bytes_;
  std::vector<uint32_t> ends_;
};

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

  // Allgather stores `value` under "<name>/<rank>" and waits until "<name>/0" .. "<name>/<count-1>"
  // all exist, then returns their values in rank order: Set followed by a Get of `count` keys,
  // which is what this default does. The launcher's server overrides it with one call per rank
  // whose answer it builds once for every rank (rendezvous.proto), so an N-rank job's address
  // exchange costs N calls rather than N Gets of N keys. `count` callers, each with its own `rank`
  // in [0, count), use one name once (a communicator's name and generation make it unique). Fails
  // with INVALID_ARGUMENT for a rank outside [0, count) and DEADLINE_EXCEEDED as Get does.
  virtual absl::StatusOr<std::vector<std::string>> Allgather(const std::string& name, int rank,
                                                             int count, const std::string& value,
                                                             std::chrono::milliseconds timeout);

  // AllgatherTable is Allgather answering with a GatherTable, which costs a rank that reads every
  // value two allocations rather than `count` strings: what a communicator's bootstrap calls. The
  // launcher's stores (GrpcStore, RelayStore) decode the server's table straight into it; this
  // default packs Allgather's answer, so a store that overrides only Allgather keeps its answer.
  virtual absl::StatusOr<GatherTable> AllgatherTable(const std::string& name, int rank, int count,
                                                     const std::string& value,
                                                     std::chrono::milliseconds timeout);

  // ReportPeerFailure records that `rank` failed because of `peer_rank` (e.g. its connection to
  // that peer broke), so the launcher blames the peer, not this rank. Stores that have no launcher
  // behind them ignore it.
  virtual absl::Status ReportPeerFailure(int rank, int peer_rank, const std::string& message) {
    return absl::OkStatus();
  }
};

}  // namespace trainrun::rendezvous
