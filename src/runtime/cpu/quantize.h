// Vectorized element-type conversions of the cpu provider that its int8 kernels share
// (quantize.cc): the range of a float tensor, float -> 8-bit quantization and its
// inverse, each equal to the ref kernels to the bit (runtime/ref/quant_params.h).
#pragma once

#include <cstdint>

#include "runtime/cpu/simd.h"
#include "runtime/ref/quant_params.h"
#include "slim/runtime/kernel.h"

namespace slim::cpu {

// Clamping to [qlo - zp, qhi - zp] before rounding equals saturating after it (the bounds
// are integers); adding and subtracting 1.5 * 2^23 rounds half to even in the FPU's
// default mode, exactly for the clamped range. `v` is x / scale, or a stand-in for it.
template <int W>
SLIM_INLINE typename Vec<W>::I round_clamped(typename Vec<W>::F v, int32_t zp, float lo, float hi) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  const I nan = v != v;
  v = v < splat<W>(lo) ? splat<W>(lo) : v;
  v = v > splat<W>(hi) ? splat<W>(hi) : v;
  const F magic = splat<W>(12582912.f);
  v = (v + magic) - magic;
  v = nan ? splat<W>(0.f) : v;
  const I q = __builtin_convertvector(v, I) + zp;
  return nan ? I{} : q;
}

// Running minimum and maximum of x[0..n) folded into *lo / *hi; *nan set when x holds a NaN.
void min_max(const float* x, int64_t n, float* lo, float* hi, bool* nan);

// y = saturate(round_half_even(x / scale) + zero_point) into [qlo, qhi] (NaN -> 0), as
// uint8 when qlo is 0, else int8. Division, not multiplication by 1 / scale: that is
// what ONNX defines and ONNX Runtime computes.
void quantize(const float* x, void* y, int64_t n, float scale, int32_t zero_point, int32_t qlo,
              int32_t qhi);

// y = float(x - zero_point) * scale for uint8 (is_signed false) or int8 x.
void dequantize(const void* x, bool is_signed, float* y, int64_t n, float scale,
                int32_t zero_point);

// DynamicQuantizeLinear of x[0..n) over the session's threads: the scale and zero point
// of x's range, and x quantized into q. A NaN in x fails the node, as in ref.
ref::DynamicQuantParams dynamic_quantize(const KernelContext& ctx, const float* x, int64_t n,
                                         uint8_t* q);

// y[i] = table[x[i]] for n bytes (y may be x), vectorized where the CPU allows.
void lookup_bytes(const uint8_t* table, const uint8_t* x, uint8_t* y, int64_t n);

// The parameters of per-tensor quantized bytes.
struct QParams {
  float scale = 1.f;
  int32_t zp = 0;
  bool is_signed = false;
};

// The scale (input i) and zero point (input i + 1) of a node's per-tensor bytes, constants.
QParams qparams(const KernelBuildInfo& info, int i);

// c[0..n) = Q(DQ(a[i]) op DQ(b[i])), or Q(DQ(a[i]) op bv) when b is null, op Mul (mul) or
// Add: ref's DequantizeLinear, Add or Mul and QuantizeLinear to the bit (slim:QLinearAdd /
// slim:QLinearMul, and the residual Add of slim:QLinearConvAdd's epilogue). c may be a.
void qbinary(const uint8_t* a, const uint8_t* b, float bv, uint8_t* c, int64_t n, bool mul,
             QParams pa, QParams pb, QParams pc);

// y[i] = max(y[i], x[i]) for n bytes compared as uint8, or int8 when is_signed.
void max_bytes(uint8_t* y, const uint8_t* x, int64_t n, bool is_signed);

// NCHW -> NHWC (bytes_to_nhwc) and back (bytes_to_nchw) for n images of c channels and
// p pixels of one byte each.
void bytes_to_nhwc(const uint8_t* x, uint8_t* y, int64_t n, int64_t c, int64_t p);
void bytes_to_nchw(const uint8_t* x, uint8_t* y, int64_t n, int64_t c, int64_t p);

}  // namespace slim::cpu
