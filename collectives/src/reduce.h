// Element-wise reduction kernels, vectorized for the CPU found at run time (AVX-512, AVX2, or
// baseline x86-64), used by every algorithm that combines buffers.
//
//   Reduce(DataType::kFloat32, ReduceOp::kSum, out, in, tmp, n);  // out = in + tmp
#pragma once

#include <cstddef>

#include "trainrun/collectives/types.h"

namespace trainrun::collectives::internal {

// Reduce sets dst[i] = a[i] (op) b[i] for i < count. `dst` may be `a` or `b`; otherwise the three
// must not overlap. kAverage reduces as kSum here (see Divide).
void Reduce(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// Divide divides `count` elements of `data` by `divisor` in place (integers truncate).
void Divide(DataType type, void* data, size_t count, int divisor);

// ReduceIsa names the instruction set the kernels dispatch to ("avx512", "avx2", "sse2"; "neon" on
// aarch64).
const char* ReduceIsa();

}  // namespace trainrun::collectives::internal
