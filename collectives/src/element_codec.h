// The 16-bit floating-point element types as the reduction kernels (reduce.cc) and Adasum's
// (adasum.cc) load and store them: float16 as the compiler's own half type, bfloat16 as the upper
// half of a float32, rounded back to nearest even. Header-only and always inlined, so that each
// kernel's per-instruction-set copy (target attributes) vectorizes them in place.
#pragma once

#include <cstdint>
#include <cstring>

#define TRAINRUN_INLINE __attribute__((always_inline)) inline

namespace trainrun::collectives::internal {

// float16's element type: _Float16 on x86; Arm's __fp16 on Arm, where GCC 12 has no _Float16 in
// C++ (both IEEE binary16; the loops only convert to and from float, which both do the same way).
#if defined(__aarch64__) || defined(__arm__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

// bfloat16 is the upper half of a float32.
TRAINRUN_INLINE float BFloat16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

TRAINRUN_INLINE uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  // Round to nearest even; keep NaN a (quiet) NaN rather than letting rounding carry it to inf.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? ((bits >> 16) | 0x40u) : rounded);
}

}  // namespace trainrun::collectives::internal
