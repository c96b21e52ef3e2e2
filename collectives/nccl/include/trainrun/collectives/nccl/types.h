// The element types and reduction operations the NCCL backend offers, with nccl-tests' names.
//
//   comm.Allreduce(buf, buf, n, DataType::kFloat32, ReduceOp::kAvg);
//   std::optional<DataType> type = ParseDataType("bfloat16");
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace trainrun::collectives::nccl {

// DataType: an element type of a device buffer.
enum class DataType { kInt8, kUint8, kInt32, kInt64, kFloat16, kBfloat16, kFloat32, kFloat64 };

// ReduceOp: how allreduce and reduce-scatter combine the ranks' elements. kAvg is the sum divided
// by the communicator's size (NCCL's ncclAvg; integer types divide with truncation).
enum class ReduceOp { kSum, kProd, kMin, kMax, kAvg };

inline constexpr DataType kAllDataTypes[] = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,   DataType::kInt64,
    DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};

// ElementSize returns the size in bytes of one element of `type`.
constexpr size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

// DataTypeName returns nccl-tests' name for `type` (int8, uint8, int32, int64, half, bfloat16,
// float, double), as its `type` column prints it.
constexpr const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "half";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
  }
  return "?";
}

// ReduceOpName returns nccl-tests' name for `op`: sum, prod, min, max, avg.
constexpr const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

// ParseDataType accepts DataTypeName's names and the aliases float16, float32, float64; nullopt
// for anything else.
inline std::optional<DataType> ParseDataType(std::string_view name) {
  for (DataType type : kAllDataTypes) {
    if (name == DataTypeName(type)) return type;
  }
  if (name == "float16") return DataType::kFloat16;
  if (name == "float32") return DataType::kFloat32;
  if (name == "float64") return DataType::kFloat64;
  return std::nullopt;
}

// ParseReduceOp accepts ReduceOpName's names; nullopt for anything else.
inline std::optional<ReduceOp> ParseReduceOp(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (name == ReduceOpName(op)) return op;
  }
  return std::nullopt;
}

}  // namespace trainrun::collectives::nccl
