#include "hierarchical.h"

#include "algorithms.h"

namespace trainrun::collectives::internal {

HierarchicalTransport::HierarchicalTransport(std::unique_ptr<TcpTransport> flat,
                                             std::unique_ptr<ShmTransport> local,
                                             std::unique_ptr<TcpTransport> cross,
                                             const RankInfo& info, size_t segment_bytes,
                                             size_t small_allreduce_bytes)
    : flat_(std::move(flat)),
      local_(std::move(local)),
      cross_(std::move(cross)),
      info_(info),
      segment_bytes_(segment_bytes),
      small_bytes_(small_allreduce_bytes) {}

int HierarchicalTransport::failed_peer() const {
  if (flat_->failed_peer() >= 0) return flat_->failed_peer();
  if (local_->failed_peer() >= 0) return info_.rank - info_.local_rank + local_->failed_peer();
  if (cross_->failed_peer() >= 0)
    return cross_->failed_peer() * info_.local_size + info_.local_rank;
  return -1;
}

void HierarchicalTransport::Abort(int peer, const std::string& message) {
  // Tell the host's ranks and the other hosts' alike; each transport takes the blamed global rank
  // only where it is one of its own.
  const int host_base = info_.rank - info_.local_rank;
  const int local_peer =
      peer >= host_base && peer < host_base + info_.local_size ? peer - host_base : -1;
  const int cross_peer =
      peer >= 0 && peer % info_.local_size == info_.local_rank ? peer / info_.local_size : -1;
  local_->Abort(local_peer, message);
  cross_->Abort(cross_peer, message);
  flat_->Abort(peer, message);
}

bool HierarchicalTransport::TryAllreduce(const void* input, void* output, size_t count,
                                         DataType type, ReduceOp op) {
  if (count == 0) return true;
  const ReduceOp across_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  local_->AllreduceAcrossGroups(
      input, output, count, type, op, info_.size, [&](char* data, size_t part) {
        AlgorithmContext ctx{*cross_, segment_bytes_, small_bytes_, scratch_};
        Allreduce(ctx, data, data, part, type, across_op);
      });
  return true;
}

}  // namespace trainrun::collectives::internal
