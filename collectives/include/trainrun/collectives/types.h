// The element types and reduction operations the collectives understand.
//
//   size_t bytes = count * trainrun::collectives::ElementSize(DataType::kBFloat16);
#pragma once

#include <cstddef>

namespace trainrun::collectives {

// DataType names the element type of a buffer. Values are stable (the C API and the Python
// bindings use the same numbers).
enum class DataType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,   // IEEE binary16; reduced in float32, rounded back to nearest even
  kBFloat16 = 3,  // bfloat16; reduced in float32, rounded back to nearest even
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kInt16 = 8,
  kBool = 9,  // one byte, 0 or 1; sum and max are logical or, product and min logical and
};

// kDataTypeCount: DataType's values are 0 .. kDataTypeCount - 1.
inline constexpr int kDataTypeCount = 10;

// ReduceOp names the reduction of Allreduce and ReduceScatter. Values are stable.
enum class ReduceOp : int {
  kSum = 0,
  kAverage = 1,  // sum divided by the communicator's size (integers: truncating division)
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", 2021): the
  // ranks' vectors are combined pairwise as a * (1 - a.b / 2|a|^2) + b * (1 - a.b / 2|b|^2),
  // in a binary tree over the ranks (adasum.h); orthogonal vectors add, parallel ones average.
  // Allreduce only, floating-point types only; a grouped or fused allreduce combines each buffer
  // with its own dot products.
  kAdasum = 5,
};

// kReduceOpCount: ReduceOp's values are 0 .. kReduceOpCount - 1.
inline constexpr int kReduceOpCount = 6;

// ElementSize returns the size in bytes of one element of `type`.
size_t ElementSize(DataType type);

// DataTypeName returns a short name ("float32", "bfloat16", ...) for messages and benchmarks.
const char* DataTypeName(DataType type);

// ReduceOpName returns a short name ("sum", "avg", ...) for messages and benchmarks.
const char* ReduceOpName(ReduceOp op);

// BufferCopies is an allreduce's buffer that the CPU reaches by copies only (a GPU buffer, through
// its copy engines): Communicator::TryAllreduceCopies moves it piece by piece straight between it
// and the transport's own memory. Counts are elements from the buffer's start.
class BufferCopies {
 public:
  // In enqueues a copy of elements [begin, begin + count) of the input into host memory `to`.
  virtual void In(void* to, size_t begin, size_t count) = 0;
  // Out enqueues a copy of `count` elements at host memory `from` into elements [begin, begin +
  // count) of the output. `from` stays unchanged until the next Wait returns.
  virtual void Out(const void* from, size_t begin, size_t count) = 0;
  // Wait blocks until every copy enqueued so far has completed, in the order enqueued; throws
  // (TimeoutError) when they do not within the caller's own bound.
  virtual void Wait() = 0;
  // UseHostMemory tells, before the first copy, the host memory every copy goes to or from (the
  // transport's segment), so that a GPU runtime can page-lock it once (cudaHostRegister) and copy
  // it by DMA. The memory stays mapped while the communicator lives.
  virtual void UseHostMemory(void* /*memory*/, size_t /*bytes*/) {}

 protected:
  ~BufferCopies() = default;
};

}  // namespace trainrun::collectives
