// Adasum allreduce (ReduceOp::kAdasum) over the Transport seam: the recursive vector-halving,
// distance-doubling combination of Maleki et al., "Scaling Distributed Training with Adaptive
// Summation" (MLSys 2021), as Horovod's adasum.h runs it over MPI, here over any transport.
//
//   AdasumAllreduce(ctx, data, {count_a, count_b}, DataType::kFloat32);  // two tensors, fused
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms.h"
#include "trainrun/collectives/types.h"

namespace trainrun::collectives::internal {

// AdasumAllreduce replaces `data` on every rank, in place, by the Adasum of the ranks' vectors.
// `tensor_counts` cuts `data` into tensors laid one after another (their sum is the element
// count); each tensor is combined with its own dot product and norms, as if reduced alone. Two
// vectors combine as a * (1 - a.b / 2|a|^2) + b * (1 - a.b / 2|b|^2) (a coefficient is 1 when
// its vector's squared norm is below sqrt(DBL_MIN)), pairs of ranks first, then pairs of pairs:
// with p the largest power of two <= n, ranks 2i and 2i+1 for i < n - p combine first, so that p
// ranks run log2(p) levels. At the level of distance d, each rank keeps half of its current range
// and combines it with its partner's copy of that half; the dot products and norms of the whole
// vectors are the sums, over the 2d ranks that hold their parts, of each rank's partial sums. A
// mirrored allgather then hands every rank the whole result, bit-identical on all (each element
// is computed by one rank). Dot products and norms are summed in double; the combination runs in
// double for float32 and float64, in float32 for float16 and bfloat16. `type` must be one of those
// four (the communicator checks).
void AdasumAllreduce(AlgorithmContext& ctx, void* data, const std::vector<size_t>& tensor_counts,
                     DataType type);

// AdasumSupports says whether AdasumAllreduce reduces elements of `type`.
bool AdasumSupports(DataType type);

}  // namespace trainrun::collectives::internal
