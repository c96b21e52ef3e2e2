// Get and Put (elements.h) for the NCCL backend's DataType, whose eight types are eight of the
// collectives' DataType: one encoding of each element type for every test and benchmark.
//
//   Put(nccl::DataType::kBfloat16, host.data(), i, 3.0);
#pragma once

#include "trainrun/collectives/nccl/types.h"
#include "trainrun/collectives/testing/elements.h"

namespace trainrun::collectives::testing {

// CollectivesType returns the collectives' DataType that NCCL's `type` is.
constexpr DataType CollectivesType(nccl::DataType type) {
  switch (type) {
    case nccl::DataType::kInt8:
      return DataType::kInt8;
    case nccl::DataType::kUint8:
      return DataType::kUInt8;
    case nccl::DataType::kInt32:
      return DataType::kInt32;
    case nccl::DataType::kInt64:
      return DataType::kInt64;
    case nccl::DataType::kFloat16:
      return DataType::kFloat16;
    case nccl::DataType::kBfloat16:
      return DataType::kBFloat16;
    case nccl::DataType::kFloat32:
      return DataType::kFloat32;
    case nccl::DataType::kFloat64:
      return DataType::kFloat64;
  }
  return DataType::kFloat32;
}

inline double Get(nccl::DataType type, const void* base, size_t i) {
  return Get(CollectivesType(type), base, i);
}
inline void Put(nccl::DataType type, void* base, size_t i, double value) {
  Put(CollectivesType(type), base, i, value);
}
inline bool IsFloatingPoint(nccl::DataType type) { return IsFloatingPoint(CollectivesType(type)); }

}  // namespace trainrun::collectives::testing
