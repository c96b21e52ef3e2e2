// Per-dtype element access for tests and their references: element i of a buffer of DataType
// elements read as a double (Get) or written from one (Put), so that a test checks every type
// against a float64 reference with one pair of functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "trainrun/collectives/types.h"

namespace trainrun::collectives::testing {

// Get returns element i of `base` (elements of `type`) as a double.
inline double Get(DataType type, const char* base, size_t i) {
  const char* p = base + i * ElementSize(type);
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
      _Float16 v;
      std::memcpy(&v, p, 2);
      return static_cast<float>(v);
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
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

// Put writes `value` as element i of `base` in `type` (bfloat16 truncated, integers converted).
inline void Put(DataType type, char* base, size_t i, double value) {
  char* p = base + i * ElementSize(type);
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
      _Float16 v = static_cast<_Float16>(value);
      std::memcpy(p, &v, 2);
      break;
    }
    case DataType::kBFloat16: {
      float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t h = static_cast<uint16_t>(bits >> 16);
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
    case DataType::kBool:
    case DataType::kInt8:
      *p = static_cast<char>(static_cast<int64_t>(value));
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
