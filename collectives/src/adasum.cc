// Adasum's two kernels (partial dot products and norms; the scaled sum) are loops the compiler
// vectorizes, compiled per instruction set as src/reduce.cc's are, and the algorithm moves halves
// of the buffer over Send/Recv as Horovod's adasum.h does over MPI. Unlike Horovod, which needs a
// power of two, n ranks fold into the largest power of two first (as recursive doubling does,
// algorithms.cc), and the dot products of each level are summed by recursive doubling among that
// level's group over the same transport, rather than over MPI communicators made per level.
#include "adasum.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "element_codec.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
namespace {

// Element codecs: the stored type T and the type its arithmetic runs in, Compute. float32 computes
// in double; float16 and bfloat16 in float32, where the product of two of their values is exact
// (11 and 8 significant bits: 22 and 16 < 24), so their dot products lose nothing before the
// double sums. Going through float also keeps float16 on F16C's conversions: GCC turns a float16
// widened to float and then to double into one library call per element (__extendhfdf2), 7x
// slower than Average at 16 MiB.
struct F32 {
  using T = float;
  using Compute = double;
  TRAINRUN_INLINE static Compute Load(T v) { return v; }
  TRAINRUN_INLINE static T Store(Compute v) { return static_cast<float>(v); }
};
struct F64 {
  using T = double;
  using Compute = double;
  TRAINRUN_INLINE static Compute Load(T v) { return v; }
  TRAINRUN_INLINE static T Store(Compute v) { return v; }
};
struct F16 {
  using T = Half;
  using Compute = float;
  TRAINRUN_INLINE static Compute Load(T v) { return static_cast<float>(v); }
  TRAINRUN_INLINE static T Store(Compute v) { return static_cast<Half>(v); }
};
struct BF16 {
  using T = uint16_t;
  using Compute = float;
  TRAINRUN_INLINE static Compute Load(T v) { return BFloat16ToFloat(v); }
  TRAINRUN_INLINE static T Store(Compute f) { return FloatToBFloat16(f); }
};

// Sums is a.b, |a|^2 and |b|^2 of two ranges.
struct Sums {
  double dot = 0;
  double aa = 0;
  double bb = 0;
};

// Eight partial sums of each, so that the loop vectorizes without reassociating a single sum.
template <typename C>
TRAINRUN_INLINE Sums DotsOf(const void* a_in, const void* b_in, size_t n) {
  const auto* __restrict a = static_cast<const typename C::T*>(a_in);
  const auto* __restrict b = static_cast<const typename C::T*>(b_in);
  constexpr size_t kLanes = 8;
  double dot[kLanes] = {};
  double aa[kLanes] = {};
  double bb[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const typename C::Compute x = C::Load(a[i + j]);
      const typename C::Compute y = C::Load(b[i + j]);
      dot[j] += static_cast<double>(x * y);
      aa[j] += static_cast<double>(x * x);
      bb[j] += static_cast<double>(y * y);
    }
  }
  for (size_t j = 0; i < n; ++i, ++j) {
    const typename C::Compute x = C::Load(a[i]);
    const typename C::Compute y = C::Load(b[i]);
    dot[j] += static_cast<double>(x * y);
    aa[j] += static_cast<double>(x * x);
    bb[j] += static_cast<double>(y * y);
  }
  Sums s;
  for (size_t j = 0; j < kLanes; ++j) {
    s.dot += dot[j];
    s.aa += aa[j];
    s.bb += bb[j];
  }
  return s;
}

// a = ca * a + cb * b, in C::Compute.
template <typename C>
TRAINRUN_INLINE void ScaledAddOf(void* a_in, double ca, const void* b_in, double cb, size_t n) {
  auto* __restrict a = static_cast<typename C::T*>(a_in);
  const auto* __restrict b = static_cast<const typename C::T*>(b_in);
  const auto ka = static_cast<typename C::Compute>(ca);
  const auto kb = static_cast<typename C::Compute>(cb);
  for (size_t i = 0; i < n; ++i) a[i] = C::Store(ka * C::Load(a[i]) + kb * C::Load(b[i]));
}

TRAINRUN_INLINE Sums DotsFor(DataType type, const void* a, const void* b, size_t n) {
  switch (type) {
    case DataType::kFloat32:
      return DotsOf<F32>(a, b, n);
    case DataType::kFloat64:
      return DotsOf<F64>(a, b, n);
    case DataType::kFloat16:
      return DotsOf<F16>(a, b, n);
    case DataType::kBFloat16:
      return DotsOf<BF16>(a, b, n);
    default:
      return Sums{};  // AdasumSupports refused it before
  }
}

TRAINRUN_INLINE void ScaledAddFor(DataType type, void* a, double ca, const void* b, double cb,
                                  size_t n) {
  switch (type) {
    case DataType::kFloat32:
      return ScaledAddOf<F32>(a, ca, b, cb, n);
    case DataType::kFloat64:
      return ScaledAddOf<F64>(a, ca, b, cb, n);
    case DataType::kFloat16:
      return ScaledAddOf<F16>(a, ca, b, cb, n);
    case DataType::kBFloat16:
      return ScaledAddOf<BF16>(a, ca, b, cb, n);
    default:
      return;
  }
}

struct Kernels {
  Sums (*dots)(DataType, const void*, const void*, size_t);
  void (*scaled_add)(DataType, void*, double, const void*, double, size_t);
};

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma,f16c"))) Sums DotsAvx2(DataType type, const void* a, const void* b,
                                                       size_t n) {
  return DotsFor(type, a, b, n);
}
__attribute__((target("avx2,fma,f16c"))) void ScaledAddAvx2(DataType type, void* a, double ca,
                                                            const void* b, double cb, size_t n) {
  ScaledAddFor(type, a, ca, b, cb, n);
}
#endif
Sums DotsBaseline(DataType type, const void* a, const void* b, size_t n) {
  return DotsFor(type, a, b, n);
}
void ScaledAddBaseline(DataType type, void* a, double ca, const void* b, double cb, size_t n) {
  ScaledAddFor(type, a, ca, b, cb, n);
}

const Kernels& Selected() {
  static const Kernels kernels = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      return Kernels{DotsAvx2, ScaledAddAvx2};
    }
#endif
    return Kernels{DotsBaseline, ScaledAddBaseline};
  }();
  return kernels;
}

// Adasum is one rank's view of one AdasumAllreduce.
class Adasum {
 public:
  Adasum(AlgorithmContext& ctx, char* data, const std::vector<size_t>& tensor_counts, DataType type)
      : t_(ctx.transport), ctx_(ctx), data_(data), type_(type), e_(ElementSize(type)) {
    begin_.assign(1, 0);
    for (size_t c : tensor_counts) begin_.push_back(begin_.back() + c);
    count_ = begin_.back();
    sums_.resize(3 * tensor_counts.size());
    int p = 1;
    while (p * 2 <= t_.size()) p *= 2;
    p_ = p;
    extra_ = t_.size() - p;
  }

  void Run() {
    const int r = t_.rank();
    const size_t bytes = count_ * e_;
    // Ranks 2i and 2i+1 (i < extra) fold into one: the even one hands its vector to the odd one,
    // which combines the two whole vectors itself and takes part in the levels; the even one
    // waits for the result.
    if (r < 2 * extra_ && r % 2 == 0) {
      t_.Send(r + 1, data_, bytes);
      t_.Recv(r + 1, data_, bytes);
      t_.WaitAll();
      return;
    }
    const bool folded = r < 2 * extra_;
    tmp_ = Scratch(folded ? count_ : count_ - count_ / 2);
    if (folded) {
      t_.Wait(t_.Recv(r - 1, tmp_, bytes));
      PartialSums(0, count_, /*left=*/false);  // the even rank's vector is the left one
      Combine(0, count_, /*left=*/false);
    }
    v_ = folded ? r / 2 : r - extra_;
    // Levels: halve the range, combine this rank's half with the partner's copy of it.
    std::vector<std::pair<size_t, size_t>> ranges;  // the range before each level
    size_t lo = 0;
    size_t hi = count_;
    for (int level = 1; level < p_; level <<= 1) {
      ranges.emplace_back(lo, hi);
      const int peer = Real(v_ ^ level);
      const bool left = (v_ & level) == 0;
      const size_t mid = lo + (hi - lo) / 2;
      const size_t keep_lo = left ? lo : mid;
      const size_t keep_hi = left ? mid : hi;
      const size_t give_lo = left ? mid : lo;
      const size_t give_hi = left ? hi : mid;
      if (keep_hi > keep_lo) t_.Recv(peer, tmp_, (keep_hi - keep_lo) * e_);
      if (give_hi > give_lo) t_.Send(peer, data_ + give_lo * e_, (give_hi - give_lo) * e_);
      t_.WaitAll();
      PartialSums(keep_lo, keep_hi, left);
      GroupSum(level);
      Combine(keep_lo, keep_hi, left);
      lo = keep_lo;
      hi = keep_hi;
    }
    // The mirrored allgather: at each level, back from the last, swap halves with the partner.
    for (int level = p_ / 2; level >= 1; level >>= 1) {
      const auto [parent_lo, parent_hi] = ranges.back();
      ranges.pop_back();
      const int peer = Real(v_ ^ level);
      const size_t other_lo = lo == parent_lo ? hi : parent_lo;
      const size_t other_hi = lo == parent_lo ? parent_hi : lo;
      if (other_hi > other_lo) t_.Recv(peer, data_ + other_lo * e_, (other_hi - other_lo) * e_);
      if (hi > lo) t_.Send(peer, data_ + lo * e_, (hi - lo) * e_);
      t_.WaitAll();
      lo = parent_lo;
      hi = parent_hi;
    }
    if (folded) {
      t_.Send(r - 1, data_, bytes);
      t_.WaitAll();
    }
  }

 private:
  // Real is the rank of virtual rank `v` (one of the p that run the levels).
  int Real(int v) const { return v < extra_ ? 2 * v + 1 : v + extra_; }

  char* Scratch(size_t elements) {
    const size_t bytes = std::max<size_t>(1, elements * e_);
    if (ctx_.scratch.size() < bytes) ctx_.scratch.resize(bytes);
    return ctx_.scratch.data();
  }

  // ForTensors calls f(i, from, to) for each tensor i with elements in [lo, hi), clipped to it.
  template <typename F>
  void ForTensors(size_t lo, size_t hi, F&& f) const {
    const size_t tensors = begin_.size() - 1;
    size_t i =
        static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), lo) - begin_.begin());
    i = i == 0 ? 0 : i - 1;
    for (; i < tensors && begin_[i] < hi; ++i) {
      const size_t from = std::max(begin_[i], lo);
      const size_t to = std::min(begin_[i + 1], hi);
      if (from < to) f(i, from, to);
    }
  }

  // PartialSums sets sums_ to each tensor's a.b, |left|^2 and |right|^2 over [lo, hi), where this
  // rank's copy is in data_ and the partner's in tmp_ (from `lo`); `left`: this rank's copy is the
  // left vector (of the lower ranks). Tensors without elements here add zeros.
  void PartialSums(size_t lo, size_t hi, bool left) {
    std::fill(sums_.begin(), sums_.end(), 0.0);
    const Kernels& k = Selected();
    ForTensors(lo, hi, [&](size_t i, size_t from, size_t to) {
      const Sums s = k.dots(type_, data_ + from * e_, tmp_ + (from - lo) * e_, to - from);
      sums_[3 * i] = s.dot;
      sums_[3 * i + 1] = left ? s.aa : s.bb;
      sums_[3 * i + 2] = left ? s.bb : s.aa;
    });
  }

  // GroupSum adds up sums_ over the 2 * level virtual ranks of this level's group, by recursive
  // doubling. Every member ends with the same bits: each step adds two equal pairs of numbers in
  // either order, and floating-point addition commutes.
  void GroupSum(int level) {
    incoming_.resize(sums_.size());
    const size_t bytes = sums_.size() * sizeof(double);
    if (bytes == 0) return;
    for (int mask = 1; mask <= level; mask <<= 1) {
      const int peer = Real(v_ ^ mask);
      t_.Recv(peer, incoming_.data(), bytes);
      t_.Send(peer, sums_.data(), bytes);
      t_.WaitAll();
      for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += incoming_[i];
    }
  }

  // Combine replaces [lo, hi) of data_ by the Adasum of it and tmp_'s copy, tensor by tensor,
  // from the whole vectors' sums in sums_.
  void Combine(size_t lo, size_t hi, bool left) {
    static const double kTiny = std::sqrt(DBL_MIN);  // Horovod's threshold for a zero vector
    const Kernels& k = Selected();
    ForTensors(lo, hi, [&](size_t i, size_t from, size_t to) {
      const double dot = sums_[3 * i];
      const double left_norm = sums_[3 * i + 1];
      const double right_norm = sums_[3 * i + 2];
      const double left_coeff = left_norm >= kTiny ? 1.0 - dot / left_norm * 0.5 : 1.0;
      const double right_coeff = right_norm >= kTiny ? 1.0 - dot / right_norm * 0.5 : 1.0;
      k.scaled_add(type_, data_ + from * e_, left ? left_coeff : right_coeff,
                   tmp_ + (from - lo) * e_, left ? right_coeff : left_coeff, to - from);
    });
  }

  Transport& t_;
  AlgorithmContext& ctx_;
  char* data_;
  char* tmp_ = nullptr;
  DataType type_;
  size_t e_;
  size_t count_ = 0;
  std::vector<size_t> begin_;  // tensor i is [begin_[i], begin_[i + 1])
  std::vector<double> sums_;   // per tensor: a.b, |left|^2, |right|^2
  std::vector<double> incoming_;
  int p_ = 1;      // the largest power of two <= n
  int extra_ = 0;  // n - p_: the pairs that fold first
  int v_ = 0;      // this rank among the p_
};

}  // namespace

bool AdasumSupports(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 || type == DataType::kFloat16 ||
         type == DataType::kBFloat16;
}

void AdasumAllreduce(AlgorithmContext& ctx, void* data, const std::vector<size_t>& tensor_counts,
                     DataType type) {
  TRAINRUN_ENFORCE(AdasumSupports(type), "Adasum of ", DataTypeName(type));
  size_t count = 0;
  for (size_t c : tensor_counts) count += c;
  if (ctx.transport.size() == 1 || count == 0) return;
  Adasum(ctx, static_cast<char*>(data), tensor_counts, type).Run();
}

}  // namespace trainrun::collectives::internal
