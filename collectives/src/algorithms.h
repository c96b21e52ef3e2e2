// The collective algorithms, written against the Transport seam only (no TCP here), so the same
// code runs over any transport.
#pragma once

#include <cstddef>
#include <vector>

#include "trainrun/collectives/types.h"
#include "transport.h"

namespace trainrun::collectives::internal {

// AlgorithmContext is what every algorithm needs: the transport, its tunables, and scratch memory
// kept between calls (so a call does not fault in fresh pages).
struct AlgorithmContext {
  Transport& transport;
  size_t segment_bytes;          // ring pipelining unit
  size_t small_allreduce_bytes;  // at most this: recursive doubling; above: ring
  std::vector<char>& scratch;
};

void Allreduce(AlgorithmContext& ctx, const void* input, void* output, size_t count, DataType type,
               ReduceOp op);
void Broadcast(AlgorithmContext& ctx, void* data, size_t bytes, int root);
// counts are in elements of `type`.
void Allgatherv(AlgorithmContext& ctx, const void* input, void* output,
                const std::vector<size_t>& counts, DataType type);
void ReduceScatter(AlgorithmContext& ctx, const void* input, void* output, size_t count,
                   DataType type, ReduceOp op);
// counts are in elements of `type`; blocks are in rank order in both buffers.
void Alltoallv(AlgorithmContext& ctx, const void* input, const std::vector<size_t>& send_counts,
               void* output, const std::vector<size_t>& recv_counts, DataType type);
void Barrier(AlgorithmContext& ctx);

// The two allreduce algorithms, exposed for tests that must exercise both at every size.
void AllreduceRecursiveDoubling(AlgorithmContext& ctx, const void* input, void* output,
                                size_t count, DataType type, ReduceOp op);
void AllreduceRing(AlgorithmContext& ctx, const void* input, void* output, size_t count,
                   DataType type, ReduceOp op);

}  // namespace trainrun::collectives::internal
