// The kernels are plain loops that the compiler vectorizes; each instruction set gets its own copy
// of every loop by inlining them into functions compiled with a target attribute, and Reduce picks
// the widest copy this CPU supports once, at first use. float16 and bfloat16 are widened to
// float32, combined, and rounded back to nearest even, so they lose no more than one rounding per
// step.
#include "reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "element_codec.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
namespace {

struct SumOp {
  template <typename T>
  TRAINRUN_INLINE static T Apply(T a, T b) {
    return a + b;
  }
};
struct ProductOp {
  template <typename T>
  TRAINRUN_INLINE static T Apply(T a, T b) {
    return a * b;
  }
};
struct MinOp {
  template <typename T>
  TRAINRUN_INLINE static T Apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  TRAINRUN_INLINE static T Apply(T a, T b) {
    return a < b ? b : a;
  }
};

// Integer sum and product wrap around (two's complement) instead of overflowing, via unsigned math.
template <typename T>
struct Wide {
  using Type = T;
};
template <>
struct Wide<int8_t> {
  using Type = uint8_t;
};
template <>
struct Wide<int32_t> {
  using Type = uint32_t;
};
template <>
struct Wide<int64_t> {
  using Type = uint64_t;
};

template <typename Op, typename T>
TRAINRUN_INLINE T ApplyInt(T a, T b) {
  if constexpr (std::is_same_v<Op, SumOp> || std::is_same_v<Op, ProductOp>) {
    using U = typename Wide<T>::Type;
    return static_cast<T>(Op::Apply(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return Op::Apply(a, b);
  }
}

// dst = a op b, all distinct.
template <typename Op, typename T>
TRAINRUN_INLINE void Loop3(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                           size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = ApplyInt<Op>(a[i], b[i]);
}
// dst = dst op b.
template <typename Op, typename T>
TRAINRUN_INLINE void Loop2(T* __restrict dst, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = ApplyInt<Op>(dst[i], b[i]);
}

template <typename Op>
TRAINRUN_INLINE void LoopHalf3(Half* __restrict dst, const Half* __restrict a,
                               const Half* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = static_cast<Half>(Op::Apply(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
template <typename Op>
TRAINRUN_INLINE void LoopBf3(uint16_t* __restrict dst, const uint16_t* __restrict a,
                             const uint16_t* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = FloatToBFloat16(Op::Apply(BFloat16ToFloat(a[i]), BFloat16ToFloat(b[i])));
  }
}
template <typename Op>
TRAINRUN_INLINE void LoopHalf2(Half* __restrict dst, const Half* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = static_cast<Half>(Op::Apply(static_cast<float>(dst[i]), static_cast<float>(b[i])));
  }
}
template <typename Op>
TRAINRUN_INLINE void LoopBf2(uint16_t* __restrict dst, const uint16_t* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = FloatToBFloat16(Op::Apply(BFloat16ToFloat(dst[i]), BFloat16ToFloat(b[i])));
  }
}

// Calls the loop for `type` with `Op`; b2 == nullptr selects the two-operand form (dst op= a).
template <typename Op>
TRAINRUN_INLINE void ForType(DataType type, void* dst, const void* a, const void* b, size_t n) {
#define TRAINRUN_CASE(T, LOOP3, LOOP2)                                                  \
  if (b == nullptr) {                                                                   \
    LOOP2(static_cast<T*>(dst), static_cast<const T*>(a), n);                           \
  } else {                                                                              \
    LOOP3(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n); \
  }                                                                                     \
  return;
  switch (type) {
    case DataType::kFloat32:
      TRAINRUN_CASE(float, (Loop3<Op, float>), (Loop2<Op, float>))
    case DataType::kFloat64:
      TRAINRUN_CASE(double, (Loop3<Op, double>), (Loop2<Op, double>))
    case DataType::kInt32:
      TRAINRUN_CASE(int32_t, (Loop3<Op, int32_t>), (Loop2<Op, int32_t>))
    case DataType::kInt64:
      TRAINRUN_CASE(int64_t, (Loop3<Op, int64_t>), (Loop2<Op, int64_t>))
    case DataType::kUInt8:
      TRAINRUN_CASE(uint8_t, (Loop3<Op, uint8_t>), (Loop2<Op, uint8_t>))
    case DataType::kInt8:
      TRAINRUN_CASE(int8_t, (Loop3<Op, int8_t>), (Loop2<Op, int8_t>))
    case DataType::kInt16:
      TRAINRUN_CASE(int16_t, (Loop3<Op, int16_t>), (Loop2<Op, int16_t>))
    case DataType::kBool:  // ForOp maps bool's ops onto max and min; see there.
      TRAINRUN_CASE(uint8_t, (Loop3<Op, uint8_t>), (Loop2<Op, uint8_t>))
    case DataType::kFloat16:
      TRAINRUN_CASE(Half, LoopHalf3<Op>, LoopHalf2<Op>)
    case DataType::kBFloat16:
      TRAINRUN_CASE(uint16_t, LoopBf3<Op>, LoopBf2<Op>)
  }
#undef TRAINRUN_CASE
}

TRAINRUN_INLINE void ForOp(DataType type, ReduceOp op, void* dst, const void* a, const void* b,
                           size_t n) {
  if (type == DataType::kBool) {  // or (sum, max) and and (product, min) on bytes of 0 or 1
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
    return any ? ForType<MaxOp>(type, dst, a, b, n) : ForType<MinOp>(type, dst, a, b, n);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return ForType<SumOp>(type, dst, a, b, n);
    case ReduceOp::kProduct:
      return ForType<ProductOp>(type, dst, a, b, n);
    case ReduceOp::kMin:
      return ForType<MinOp>(type, dst, a, b, n);
    case ReduceOp::kMax:
      return ForType<MaxOp>(type, dst, a, b, n);
    case ReduceOp::kAdasum:  // not element-wise: adasum.cc, never here
      return;
  }
}

template <typename T>
TRAINRUN_INLINE void DivideInts(T* data, size_t n, int divisor) {
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(static_cast<int64_t>(data[i]) / divisor);
}

TRAINRUN_INLINE void DivideFor(DataType type, void* data, size_t count, int divisor) {
  switch (type) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= static_cast<float>(divisor);
      return;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
    case DataType::kFloat16: {
      auto* p = static_cast<Half*>(data);
      for (size_t i = 0; i < count; ++i) {
        p[i] = static_cast<Half>(static_cast<float>(p[i]) / static_cast<float>(divisor));
      }
      return;
    }
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) {
        p[i] = FloatToBFloat16(BFloat16ToFloat(p[i]) / static_cast<float>(divisor));
      }
      return;
    }
    case DataType::kInt32:
      return DivideInts(static_cast<int32_t*>(data), count, divisor);
    case DataType::kInt64:
      return DivideInts(static_cast<int64_t*>(data), count, divisor);
    case DataType::kUInt8:
      return DivideInts(static_cast<uint8_t*>(data), count, divisor);
    case DataType::kInt8:
      return DivideInts(static_cast<int8_t*>(data), count, divisor);
    case DataType::kInt16:
      return DivideInts(static_cast<int16_t*>(data), count, divisor);
    case DataType::kBool:
      return;  // the average of booleans is their or
  }
}

// Divide's loops, compiled per instruction set as the kernels are: without F16C a float16 element
// is converted by a library call each way, which made averaging float16 7x slower than float32.
using Divider = void (*)(DataType, void*, size_t, int);

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) void DivideAvx512(
    DataType type, void* data, size_t count, int divisor) {
  DivideFor(type, data, count, divisor);
}
__attribute__((target("avx2,fma,f16c"))) void DivideAvx2(DataType type, void* data, size_t count,
                                                         int divisor) {
  DivideFor(type, data, count, divisor);
}
#endif
void DivideBaseline(DataType type, void* data, size_t count, int divisor) {
  DivideFor(type, data, count, divisor);
}

using Kernel = void (*)(DataType, ReduceOp, void*, const void*, const void*, size_t);

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) void KernelAvx512(
    DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  ForOp(type, op, dst, a, b, n);
}
__attribute__((target("avx2,fma,f16c"))) void KernelAvx2(DataType type, ReduceOp op, void* dst,
                                                         const void* a, const void* b, size_t n) {
  ForOp(type, op, dst, a, b, n);
}
#endif
void KernelBaseline(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  ForOp(type, op, dst, a, b, n);
}

struct Dispatch {
  Kernel kernel;
  Divider divide;
  const char* isa;
};

const Dispatch& Selected() {
  static const Dispatch dispatch = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("f16c")) {
      return Dispatch{KernelAvx512, DivideAvx512, "avx512"};
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      return Dispatch{KernelAvx2, DivideAvx2, "avx2"};
    }
    return Dispatch{KernelBaseline, DivideBaseline, "sse2"};
#elif defined(__aarch64__)
    // One copy: the baseline of aarch64 has Advanced SIMD (NEON), which the vectorizer uses.
    return Dispatch{KernelBaseline, DivideBaseline, "neon"};
#else
    return Dispatch{KernelBaseline, DivideBaseline, "baseline"};
#endif
  }();
  return dispatch;
}

}  // namespace

void Reduce(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  Kernel kernel = Selected().kernel;
  if (dst == a) {
    kernel(type, op, dst, b, nullptr, count);
  } else if (dst == b) {
    kernel(type, op, dst, a, nullptr, count);  // every op is commutative
  } else {
    kernel(type, op, dst, a, b, count);
  }
}

void Divide(DataType type, void* data, size_t count, int divisor) {
  if (divisor == 1 || count == 0) return;
  Selected().divide(type, data, count, divisor);
}

const char* ReduceIsa() { return Selected().isa; }

}  // namespace trainrun::collectives::internal
