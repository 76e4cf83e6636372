// Vector math for the cpu provider's own kernels. Each loop is written once over GCC
// vector types of W floats and instantiated three times: AVX-512 (W=16) and AVX2+FMA
// (W=8) inside functions compiled for those targets, chosen at run time by what the CPU
// supports, and a scalar fallback with the std:: functions. The approximations (exp,
// erf) are accurate to a few float ulps relative to ref's double results.
#pragma once

// The vector helpers are always inlined into functions compiled for their target, so the
// ABI of an out-of-line vector return never matters.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "slim/core/cpu_features.h"

namespace slim::cpu {

using slim::Isa;

// The level the kernels run at: core's probe, lowered by SLIM_ISA or set_isa_limit, so
// the fallbacks can be tested on any machine.
inline Isa detected_isa() { return active_isa(); }

template <int W>
struct Vec {
  typedef float F __attribute__((vector_size(W * 4)));
  typedef int32_t I __attribute__((vector_size(W * 4)));
};

// W bytes as one vector, for 8-bit data converted to and from Vec<W>::I lanes.
template <int W>
struct Bytes {
  typedef uint8_t U __attribute__((vector_size(W)));
  typedef int8_t S __attribute__((vector_size(W)));
};

#define SLIM_INLINE inline __attribute__((always_inline))

template <int W>
SLIM_INLINE typename Vec<W>::F load(const float* p) {
  typename Vec<W>::F v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int W>
SLIM_INLINE void store(float* p, typename Vec<W>::F v) {
  std::memcpy(p, &v, sizeof v);
}
// Broadcast through the integer bits (a float vector + scalar would turn -0 into +0). A
// loop assigning lanes one by one was compiled, where a constant could not be hoisted,
// into 16 masked broadcasts per vector: QuantizeLinear ran at scalar speed.
template <int W>
SLIM_INLINE typename Vec<W>::F splat(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, 4);
  const typename Vec<W>::I i = typename Vec<W>::I{} + bits;
  typename Vec<W>::F v;
  std::memcpy(&v, &i, sizeof v);
  return v;
}
// W 8-bit values (uint8, or int8 when is_signed) widened to int32 lanes. Through 16 bits:
// GCC 12 compiles the direct byte -> int32 conversion into one scalar insert per lane.
template <int W>
SLIM_INLINE typename Vec<W>::I widen_bytes(const uint8_t* x, bool is_signed) {
  using I = typename Vec<W>::I;
  if (is_signed) {
    typedef int16_t H __attribute__((vector_size(W * 2)));
    typename Bytes<W>::S b;
    std::memcpy(&b, x, W);
    return __builtin_convertvector(__builtin_convertvector(b, H), I);
  }
  typedef uint16_t H __attribute__((vector_size(W * 2)));
  typename Bytes<W>::U b;
  std::memcpy(&b, x, W);
  return __builtin_convertvector(__builtin_convertvector(b, H), I);
}
// The low byte of each int32 lane (lanes already within [-128, 127] or [0, 255]: the same
// bytes as int8 or uint8) stored to y. At 8 lanes through a byte shuffle: GCC 12 compiles
// the int32 -> byte conversion there into an extract, a shift and an or per lane.
template <int W>
SLIM_INLINE void store_low_bytes(void* y, typename Vec<W>::I v) {
  if constexpr (W == 8) {
    typedef uint8_t B __attribute__((vector_size(32)));
    typedef uint8_t Low __attribute__((vector_size(8)));
    B b;
    std::memcpy(&b, &v, sizeof b);
    const Low low = __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28);
    std::memcpy(y, &low, W);
  } else {
    const auto low = __builtin_convertvector(v, typename Bytes<W>::U);
    std::memcpy(y, &low, W);
  }
}
template <int W>
SLIM_INLINE typename Vec<W>::F vmax(typename Vec<W>::F a, typename Vec<W>::F b) {
  return a > b ? a : b;
}
template <int W>
SLIM_INLINE typename Vec<W>::F vmin(typename Vec<W>::F a, typename Vec<W>::F b) {
  return a < b ? a : b;
}

// exp(x): x = n ln2 + r with |r| <= ln2/2, exp(r) by a degree-6 Taylor polynomial
// (truncation error < 2e-8 relative), 2^n built in the exponent bits. Inputs are clamped
// to the finite float range, so overflow gives inf-like huge values without NaN.
template <int W>
SLIM_INLINE typename Vec<W>::F vexp(typename Vec<W>::F x) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  const F x_in = x;
  x = vmin<W>(vmax<W>(x, splat<W>(-87.3f)), splat<W>(88.7f));
  const F magic = splat<W>(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  F t = x * splat<W>(1.44269504088896341f) + magic;
  const F n = t - magic;
  // Two-part ln2 keeps r accurate (the high part times n is exact).
  F r = x - n * splat<W>(0.693359375f);
  r = r + n * splat<W>(2.12194440e-4f);
  F p = splat<W>(1.f / 720.f);
  p = p * r + splat<W>(1.f / 120.f);
  p = p * r + splat<W>(1.f / 24.f);
  p = p * r + splat<W>(1.f / 6.f);
  p = p * r + splat<W>(0.5f);
  p = p * r + splat<W>(1.f);
  p = p * r + splat<W>(1.f);
  const I ni = __builtin_convertvector(n, I);
  // n can reach 128 at the top of the range: split 2^n as 2^(n/2) * 2^(n - n/2).
  const I h = ni >> 1;
  const I e1 = (h + 127) << 23, e2 = (ni - h + 127) << 23;
  F s1, s2;
  std::memcpy(&s1, &e1, sizeof s1);
  std::memcpy(&s2, &e2, sizeof s2);
  F r2 = p * s1 * s2;
  // Beyond the clamp: overflow to inf and underflow to 0, as std::exp does; NaN stays NaN.
  r2 = x_in > splat<W>(88.72283f) ? splat<W>(INFINITY) : r2;
  r2 = x_in < splat<W>(-87.3f) ? splat<W>(0.f) : r2;
  return x_in != x_in ? x_in : r2;
}

template <int W>
SLIM_INLINE typename Vec<W>::F vsigmoid(typename Vec<W>::F x) {
  // exp of -|x| never overflows; the other half follows from sigmoid(-x) = 1 - sigmoid(x)
  // written as e / (1 + e), which keeps relative accuracy for large negative x.
  using F = typename Vec<W>::F;
  const F ax = x < splat<W>(0.f) ? -x : x;
  const F e = vexp<W>(-ax);
  const F one = splat<W>(1.f);
  const F pos = one / (one + e);
  return x >= splat<W>(0.f) ? pos : e * pos;
}

template <int W>
SLIM_INLINE typename Vec<W>::F vtanh(typename Vec<W>::F x) {
  using F = typename Vec<W>::F;
  const F ax = x < splat<W>(0.f) ? -x : x;
  // Large |x|: 1 - 2 / (exp(2|x|) + 1). Small |x|: odd Taylor series (exp would cancel).
  const F e = vexp<W>(splat<W>(-2.f) * ax);
  F big = (splat<W>(1.f) - e) / (splat<W>(1.f) + e);
  const F x2 = ax * ax;
  F p = splat<W>(-17.f / 315.f);
  p = p * x2 + splat<W>(2.f / 15.f);
  p = p * x2 + splat<W>(-1.f / 3.f);
  p = p * x2 + splat<W>(1.f);
  F small = p * ax;
  F r = ax < splat<W>(0.125f) ? small : big;
  return x < splat<W>(0.f) ? -r : r;
}

// erf: Taylor series below 0.5, above that 1 - poly(t) exp(-x^2) with
// t = 1 / (1 + p x) (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
template <int W>
SLIM_INLINE typename Vec<W>::F verf(typename Vec<W>::F x) {
  using F = typename Vec<W>::F;
  const F ax = x < splat<W>(0.f) ? -x : x;
  const F x2 = ax * ax;
  F s = splat<W>(-1.f / 1320.f);
  s = s * x2 + splat<W>(1.f / 216.f);
  s = s * x2 + splat<W>(-1.f / 42.f);
  s = s * x2 + splat<W>(1.f / 10.f);
  s = s * x2 + splat<W>(-1.f / 3.f);
  s = s * x2 + splat<W>(1.f);
  const F small = s * ax * splat<W>(1.12837916709551257f);
  const F t = splat<W>(1.f) / (splat<W>(1.f) + splat<W>(0.3275911f) * ax);
  F p = splat<W>(1.061405429f);
  p = p * t + splat<W>(-1.453152027f);
  p = p * t + splat<W>(1.421413741f);
  p = p * t + splat<W>(-0.284496736f);
  p = p * t + splat<W>(0.254829592f);
  const F big = splat<W>(1.f) - p * t * vexp<W>(-x2);
  F r = ax < splat<W>(0.5f) ? small : big;
  return x < splat<W>(0.f) ? -r : r;
}

// Defines name##_any params, which runs the loop template name<W> args at the widest
// vector width the active instruction set has (name<1> is the scalar loop).
#if defined(__x86_64__)
#define SLIM_DISPATCH3(name, params, args)                                                  \
  __attribute__((target("avx512f"))) void name##_avx512 params { name<16> args; }           \
  __attribute__((target("avx2,fma"))) void name##_avx2 params { name<8> args; }             \
  void name##_any params {                                                                  \
    switch (detected_isa()) {                                                               \
      case Isa::avx512: return name##_avx512 args;                                          \
      case Isa::avx2: return name##_avx2 args;                                              \
      case Isa::scalar:                                                                     \
      case Isa::neon: return name<1> args;                                                  \
    }                                                                                       \
  }
#elif defined(__aarch64__)
// NEON: the same loops at 4 lanes (ASIMD is aarch64's baseline).
#define SLIM_DISPATCH3(name, params, args)                                                  \
  void name##_any params {                                                                  \
    if (detected_isa() == Isa::neon) return name<4> args;                                   \
    return name<1> args;                                                                    \
  }
#else
#define SLIM_DISPATCH3(name, params, args) \
  void name##_any params { return name<1> args; }
#endif

}  // namespace slim::cpu
