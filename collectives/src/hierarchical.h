// HierarchicalTransport: a job on several hosts with the same number of ranks on each. Allreduce
// runs in three steps per chunk, so that each host sends one copy of the data across, not one per
// rank: the ranks of a host reduce over shared memory, each owning one part of the chunk; each part
// is then allreduced over TCP among the ranks with the same local_rank on the other hosts; the
// host's ranks copy the finished parts from one another. Every other operation runs over a flat TCP
// mesh.
//
//   auto t = HierarchicalTransport(std::move(flat), std::move(local), std::move(cross), info, ...);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shm_transport.h"
#include "tcp_transport.h"
#include "trainrun/collectives/communicator.h"

namespace trainrun::collectives::internal {

class HierarchicalTransport : public Transport {
 public:
  // `flat` connects all ranks; `local` the ranks of this host (local_rank order); `cross` the ranks
  // with this rank's local_rank, one per host (cross_rank order). `segment_bytes` and
  // `small_allreduce_bytes` tune the allreduce across hosts (algorithms.h).
  HierarchicalTransport(std::unique_ptr<TcpTransport> flat, std::unique_ptr<ShmTransport> local,
                        std::unique_ptr<TcpTransport> cross, const RankInfo& info,
                        size_t segment_bytes, size_t small_allreduce_bytes);

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  Request Send(int peer, const void* data, size_t bytes) override {
    return flat_->Send(peer, data, bytes);
  }
  Request Recv(int peer, void* data, size_t bytes) override {
    return flat_->Recv(peer, data, bytes);
  }
  void Wait(Request request) override { flat_->Wait(request); }
  void WaitAll() override { flat_->WaitAll(); }
  // failed_peer names, as a global rank, the peer of whichever of the three transports failed.
  int failed_peer() const override;
  void Abort(int peer, const std::string& message) override;
  bool TryAllreduce(const void* input, void* output, size_t count, DataType type,
                    ReduceOp op) override;
  void Finished() override { local_->Finished(); }
  const char* name() const override { return "shm+tcp"; }

 private:
  std::unique_ptr<TcpTransport> flat_;
  std::unique_ptr<ShmTransport> local_;
  std::unique_ptr<TcpTransport> cross_;
  RankInfo info_;
  size_t segment_bytes_;
  size_t small_bytes_;
  std::vector<char> scratch_;
};

}  // namespace trainrun::collectives::internal
