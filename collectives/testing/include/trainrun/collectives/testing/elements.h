// Per-dtype element access for tests and benchmarks: element i of a buffer of DataType elements
// read as a double (Get) or written from one (Put), so that a test or a benchmark's check compares
// every type with a float64 reference through one pair of functions. Not installed: the target
// trainrun::collectives_testing (collectives/CMakeLists.txt) gives tests and bench/ this directory.
//
//   std::vector<char> buffer(count * ElementSize(type));
//   for (size_t i = 0; i < count; ++i) Put(type, buffer, i, Input(rank, i));
//   comm.Allreduce(buffer.data(), count, type, ReduceOp::kSum);
//   if (Get(type, buffer, i) != want) ...
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "trainrun/collectives/types.h"

namespace trainrun::collectives::testing {

// Half: float16's element type, as in src/reduce.cc: GCC 12 has no _Float16 in C++ on Arm.
#if defined(__aarch64__) || defined(__arm__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

// Bfloat16Bits returns `value` as bfloat16, rounded to nearest even as the library rounds. Half
// and these conversions are written apart from src/reduce.cc on purpose: a check's reference
// must not share the code it checks.
inline uint16_t Bfloat16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Bfloat16Value returns the float that bfloat16 `bits` stands for (exact).
inline float Bfloat16Value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// IsFloatingPoint: float32, float64, float16, bfloat16 (an average divides exactly; the others
// truncate, and bool's is its or).
inline bool IsFloatingPoint(DataType type) {
  switch (type) {
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return true;
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kBool:
      return false;
  }
  return false;
}

// Get returns element i of `base` (elements of `type`) as a double.
inline double Get(DataType type, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * ElementSize(type);
  switch (type) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DataType::kFloat16: {
      Half v;
      std::memcpy(&v, p, 2);
      return static_cast<float>(v);
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Bfloat16Value(h);
    }
    case DataType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case DataType::kInt16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case DataType::kUInt8:
    case DataType::kBool:
      return static_cast<uint8_t>(*p);
    case DataType::kInt8:
      return static_cast<int8_t>(*p);
  }
  return 0;
}

// Put writes `value` as element i of `base` in `type`: floating types rounded to nearest even,
// integers converted (wrapping modulo their width), bool as 1 for any non-zero value.
inline void Put(DataType type, void* base, size_t i, double value) {
  char* p = static_cast<char*>(base) + i * ElementSize(type);
  switch (type) {
    case DataType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(p, &v, 4);
      break;
    }
    case DataType::kFloat64:
      std::memcpy(p, &value, 8);
      break;
    case DataType::kFloat16: {
      Half v = static_cast<Half>(value);
      std::memcpy(p, &v, 2);
      break;
    }
    case DataType::kBFloat16: {
      uint16_t h = Bfloat16Bits(static_cast<float>(value));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::kInt32: {
      int32_t v = static_cast<int32_t>(value);
      std::memcpy(p, &v, 4);
      break;
    }
    case DataType::kInt64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(p, &v, 8);
      break;
    }
    case DataType::kInt16: {
      int16_t v = static_cast<int16_t>(value);
      std::memcpy(p, &v, 2);
      break;
    }
    case DataType::kUInt8:
    case DataType::kInt8:
      *p = static_cast<char>(static_cast<int64_t>(value));
      break;
    case DataType::kBool:
      *p = value != 0 ? 1 : 0;
      break;
  }
}

inline double Get(DataType type, const std::vector<char>& buffer, size_t i) {
  return Get(type, buffer.data(), i);
}
inline void Put(DataType type, std::vector<char>& buffer, size_t i, double value) {
  Put(type, buffer.data(), i, value);
}

}  // namespace trainrun::collectives::testing
