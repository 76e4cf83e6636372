// 8-bit convolutions and matrix products on oneDNN (dnnl_int8.h), and the cpu kernels on
// them: ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul (also what QDQ models'
// DequantizeLinear -> Conv/MatMul -> QuantizeLinear become: passes, fuse_qdq) and
// slim:DynamicQuantizeConv, the DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(scale)
// -> Add(bias) -> Relu chain of dynamically quantized models as one node (passes:
// fuse_dynamic_quantize_conv).
#include "runtime/cpu/dnnl_int8.h"

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <array>
#include <cstring>
#include <numeric>

#include "runtime/cpu/quantize.h"
#include "runtime/cpu/simd.h"
#include "runtime/ref/quant_params.h"
#include "slim/runtime/fused_ops.h"

namespace slim::cpu {

using dnnl::memory;

Int8Dot int8_dot() {
  dnnl_engine();  // holds oneDNN to slim's level first
  const unsigned isa = unsigned(dnnl::get_effective_cpu_isa());
  auto has = [&](dnnl::cpu_isa level) { return (isa & unsigned(level)) == unsigned(level); };
  if (has(dnnl::cpu_isa::avx512_core_amx)) return Int8Dot::amx;
  if (has(dnnl::cpu_isa::avx512_core_vnni)) return Int8Dot::avx512_vnni;
  if (has(dnnl::cpu_isa::avx2_vnni)) return Int8Dot::avx_vnni;
  return Int8Dot::none;
}

namespace {

// ---------------------------------------------------------------------------------------
// Weights: w - w_zp = w8 + comp[channel]

struct PreparedWeights {
  std::vector<int8_t> w8;     // in the caller's order, K doubled (hi then lo) when split
  std::vector<int32_t> comp;  // per output channel
  bool any_comp = false;
};

// w8 (elementwise) and comp per output channel, for weights with zero points `w_zp`
// (none, one, or one per channel).
PreparedWeights prepare_weights(const Tensor& w, const Tensor* w_zp, int64_t channels) {
  const Tensor wc = w.contiguous();
  const bool is_u8 = wc.dtype() == DType::u8;
  PreparedWeights p;
  const auto* bytes = static_cast<const uint8_t*>(wc.raw_data());
  p.w8.resize(size_t(wc.numel()));
  for (size_t i = 0; i < p.w8.size(); ++i)
    p.w8[i] = int8_t(is_u8 ? bytes[i] ^ 0x80 : bytes[i]);  // w - 128 for uint8
  const Tensor z = w_zp ? w_zp->contiguous() : Tensor();
  p.comp.resize(size_t(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t k = z.defined() && z.numel() > 1 ? c : 0;
    const int32_t zp = !z.defined() ? 0
                       : is_u8      ? int32_t(z.data<uint8_t>()[k])
                                    : int32_t(z.data<int8_t>()[k]);
    p.comp[size_t(c)] = (is_u8 ? 128 : 0) - zp;
    p.any_comp = p.any_comp || p.comp[size_t(c)] != 0;
  }
  return p;
}

// Whether vpmaddubsw sums every pair of u8 x w8 products exactly: with every |w8| <= 64 a
// pair's sum is at most 2 * 255 * 64 = 32640 < 32767 in magnitude, so weights need no
// split without VNNI (what `slim quantize --reduce-range` writes: 7-bit weights).
bool pair_safe(const std::vector<int8_t>& w8) {
  return std::all_of(w8.begin(), w8.end(), [](int8_t v) { return v >= -64 && v <= 64; });
}

// w8 = hi + lo with both in [-64, 64] (hi = floor(w8 / 2)).
inline int8_t half_hi(int8_t v) {
  return int8_t(v >> 1);
}
inline int8_t half_lo(int8_t v) {
  return int8_t(v - (v >> 1));
}

// ---------------------------------------------------------------------------------------
// The source: 8-bit NCHW or NHWC in, unsigned NHWC (channels read twice when split) out,
// and the per-pixel channel sums of (x - x_zp) that the weight compensation multiplies.

// Pixels [b, e) of one image into dst (NHWC, pixel b at dst, pixels `stride` bytes apart,
// c or 2c channels each): each group's channels shifted to unsigned (x + 128 for int8, as
// a byte: x ^ 0x80), twice when split.
void to_channels_last(const uint8_t* x, bool x_channels_last, int64_t c, int64_t pixels, int64_t b,
                      int64_t e, int64_t group, bool flip, bool split, int64_t stride,
                      uint8_t* dst) {
  const uint8_t mask = flip ? 0x80 : 0;
  const int64_t cg = c / group, cs = stride, quads = (c + 3) / 4;
  const uint32_t mask4 = flip ? 0x80808080u : 0;
  // Whole 4-byte quads where the destination has room (the direct convolution rounds its
  // channels up to 4): channels past c, which meet zero weights there, take the next
  // pixel's first ones (NHWC; none reads past the image: its last pixels go byte by byte)
  // or zeros (NCHW, four planes interleaved: a quarter of the stores).
  const bool whole_quads = group == 1 && !split && stride >= 4 * quads;
  if (!x_channels_last && whole_quads) {
    static constexpr uint8_t zeros[64] = {};
    for (int64_t p0 = b; p0 < e; p0 += 64) {
      const int64_t pn = std::min<int64_t>(64, e - p0);
      for (int64_t q = 0; q < quads; ++q) {
        const uint8_t* plane[4];
        for (int64_t i = 0; i < 4; ++i)
          plane[i] = 4 * q + i < c ? x + (4 * q + i) * pixels + p0 : zeros;
        uint8_t* out = dst + (p0 - b) * cs + 4 * q;
        for (int64_t j = 0; j < pn; ++j) {
          const uint32_t v = (uint32_t(plane[0][j]) | uint32_t(plane[1][j]) << 8 |
                              uint32_t(plane[2][j]) << 16 | uint32_t(plane[3][j]) << 24) ^
                             mask4;
          std::memcpy(out + j * cs, &v, 4);
        }
      }
    }
    return;
  }
  if (x_channels_last && whole_quads) {
    for (int64_t p = b; p < e; ++p) {
      const uint8_t* src = x + p * c;
      uint8_t* out = dst + (p - b) * cs;
      if ((p * c + 4 * quads) > pixels * c) {
        for (int64_t k = 0; k < c; ++k) out[k] = src[k] ^ mask;
        continue;
      }
      for (int64_t q = 0; q < quads; ++q) {
        uint32_t v;
        std::memcpy(&v, src + 4 * q, 4);
        v ^= mask4;
        std::memcpy(out + 4 * q, &v, 4);
      }
    }
    return;
  }
  if (x_channels_last) {
    for (int64_t p = b; p < e; ++p) {
      const uint8_t* src = x + p * c;
      uint8_t* out = dst + (p - b) * cs;
      for (int64_t g = 0; g < group; ++g) {
        uint8_t* o = out + g * (split ? 2 * cg : cg);
        for (int64_t k = 0; k < cg; ++k) o[k] = src[g * cg + k] ^ mask;
        if (split) std::memcpy(o + cg, o, size_t(cg));
      }
    }
    return;
  }
  // NCHW: tiles of pixels, so each channel's run in the tile is read once.
  for (int64_t p0 = b; p0 < e; p0 += 64) {
    const int64_t pn = std::min<int64_t>(64, e - p0);
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t o0 = ch / cg * (split ? 2 * cg : cg) + ch % cg;
      const uint8_t* src = x + ch * pixels + p0;
      uint8_t* out = dst + (p0 - b) * cs + o0;
      for (int64_t j = 0; j < pn; ++j) out[j * cs] = src[j] ^ mask;
      if (split)
        for (int64_t j = 0; j < pn; ++j) out[j * cs + cg] = src[j] ^ mask;
    }
  }
}

// s[i] += x[i] over n elements.
template <int W>
SLIM_INLINE void add_bytes(int32_t* s, const uint8_t* x, bool is_signed, int64_t n) {
  using I = typename Vec<W>::I;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    I v;
    std::memcpy(&v, s + i, sizeof v);
    v += widen_bytes<W>(x + i, is_signed);
    std::memcpy(s + i, &v, sizeof v);
  }
  for (; i < n; ++i) s[i] += is_signed ? int32_t(int8_t(x[i])) : int32_t(x[i]);
}

// The sum of x[0..n).
template <int W>
SLIM_INLINE int32_t sum_bytes(const uint8_t* x, bool is_signed, int64_t n) {
  typename Vec<W>::I acc{};
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += widen_bytes<W>(x + i, is_signed);
  int32_t sum = 0;
  for (int k = 0; k < W; ++k) sum += acc[k];
  for (; i < n; ++i) sum += is_signed ? int32_t(int8_t(x[i])) : int32_t(x[i]);
  return sum;
}

// s[i] += x[i] over n int32.
template <int W>
SLIM_INLINE void add_ints(int32_t* s, const int32_t* x, int64_t n) {
  using I = typename Vec<W>::I;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    I a, b;
    std::memcpy(&a, s + i, sizeof a);
    std::memcpy(&b, x + i, sizeof b);
    a += b;
    std::memcpy(s + i, &a, sizeof a);
  }
  for (; i < n; ++i) s[i] += x[i];
}

SLIM_DISPATCH3(add_bytes, (int32_t * s, const uint8_t* x, bool is_signed, int64_t n),
               (s, x, is_signed, n))
SLIM_DISPATCH3(add_ints, (int32_t * s, const int32_t* x, int64_t n), (s, x, n))
template <int W>
SLIM_INLINE void sum_pixels(const uint8_t* x, bool is_signed, int64_t c, int64_t cg, int64_t group,
                            int32_t base, int64_t pixels, int64_t p0, int64_t p1, int32_t* sums) {
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t g = 0; g < group; ++g)
      sums[g * pixels + p] = base + sum_bytes<W>(x + p * c + g * cg, is_signed, cg);
}
SLIM_DISPATCH3(sum_pixels,
               (const uint8_t* x, bool is_signed, int64_t c, int64_t cg, int64_t group,
                int32_t base, int64_t pixels, int64_t p0, int64_t p1, int32_t* sums),
               (x, is_signed, c, cg, group, base, pixels, p0, p1, sums))

// s[k] = the sum of plane k (n bytes each) over `planes` planes.
template <int W>
SLIM_INLINE void sum_planes(const uint8_t* x, bool is_signed, int64_t planes, int64_t n, int32_t* s) {
  for (int64_t k = 0; k < planes; ++k) s[k] = sum_bytes<W>(x + k * n, is_signed, n);
}
SLIM_DISPATCH3(sum_planes, (const uint8_t* x, bool is_signed, int64_t planes, int64_t n, int32_t* s),
               (x, is_signed, planes, n, s))

// ---------------------------------------------------------------------------------------
// The epilogue: sums (NHWC int32) + comp[oc] * box[g][p] to the output.

// Rounded as the Mul and the Add it replaces: GCC would otherwise contract the multiply
// and the add into one FMA (one rounding instead of two).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <int W>
SLIM_INLINE void dequantize_row(const int32_t* acc, int64_t n, int32_t add, const int32_t* comp,
                                const float* scale, const float* bias, bool relu, float* out) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  int64_t k = 0;
  for (; k + W <= n; k += W) {
    I a, c;
    std::memcpy(&a, acc + k, sizeof a);
    std::memcpy(&c, comp + k, sizeof c);
    F v = __builtin_convertvector(a + c * add, F) * load<W>(scale + k);
    if (bias) v = v + load<W>(bias + k);
    if (relu) v = v > splat<W>(0.f) ? v : splat<W>(0.f);
    store<W>(out + k, v);
  }
  for (; k < n; ++k) {
    float v = float(acc[k] + comp[k] * add) * scale[k];
    if (bias) v = v + bias[k];
    if (relu) v = v > 0.f ? v : 0.f;
    out[k] = v;
  }
}

SLIM_DISPATCH3(dequantize_row,
               (const int32_t* acc, int64_t n, int32_t add, const int32_t* comp, const float* scale,
                const float* bias, bool relu, float* out),
               (acc, n, add, comp, scale, bias, relu, out))
#pragma GCC pop_options

// QLinearConv's and QLinearMatMul's requantization (Int8Output) of one row.
template <int W>
SLIM_INLINE void requantize_row(const int32_t* acc, int64_t n, int32_t add, const int32_t* comp,
                                const int32_t* qbias, const float* scale, int32_t zp,
                                bool is_signed, uint8_t* out) {
  using I = typename Vec<W>::I;
  const int32_t qlo = is_signed ? -128 : 0, qhi = is_signed ? 127 : 255;
  const float lo = float(qlo - zp), hi = float(qhi - zp);
  int64_t k = 0;
  for (; k + W <= n; k += W) {
    I a, c{}, b{};
    std::memcpy(&a, acc + k, sizeof a);
    if (comp) std::memcpy(&c, comp + k, sizeof c);
    if (qbias) std::memcpy(&b, qbias + k, sizeof b);
    const I q = round_clamped<W>(__builtin_convertvector(a + c * add + b, typename Vec<W>::F) *
                                     load<W>(scale + k),
                                 zp, lo, hi);
    store_low_bytes<W>(out + k, q);
  }
  for (; k < n; ++k) {
    const int32_t a = acc[k] + (comp ? comp[k] * add : 0) + (qbias ? qbias[k] : 0);
    const float q = std::nearbyint(std::clamp(float(a) * scale[k], lo, hi));
    out[k] = uint8_t(int32_t(q) + zp);
  }
}

SLIM_DISPATCH3(requantize_row,
               (const int32_t* acc, int64_t n, int32_t add, const int32_t* comp,
                const int32_t* qbias, const float* scale, int32_t zp, bool is_signed,
                uint8_t* out),
               (acc, n, add, comp, qbias, scale, zp, is_signed, out))

// One row of sums (plus comp[k] * add) to where `out` wants them: `sums` or `values` or
// `bytes` (one of them set; rows of values or sums may be acc itself).
void finish_row(const int32_t* acc, int64_t n, int32_t add, const int32_t* comp,
                const Int8Output& out, int64_t c0, int32_t* sums, float* values, uint8_t* bytes) {
  if (values)
    dequantize_row_any(acc, n, add, comp, out.scale + c0, out.bias ? out.bias + c0 : nullptr,
                       out.relu, values);
  else if (bytes)
    requantize_row_any(acc, n, add, comp, out.qbias ? out.qbias + c0 : nullptr, out.scale + c0,
                       out.zero_point, out.bytes_signed, bytes);
  else
    for (int64_t k = 0; k < n; ++k) sums[k] = acc[k] + comp[k] * add;
}

// Requantized rows without compensation, n elements from a row's start: runs of
// out.period elements, so the vector loop covers rows of any width.
#if defined(__x86_64__)
// The sums read 1 KiB ahead are prefetched: oneDNN's whole-image sums (a depthwise
// convolution's: 2.6 MB at PP-OCRv4's detector's 1/2 resolution) have left the L2 by the
// time they are read, and on a Sapphire Rapids VM the hardware's prefetch alone kept the
// loop waiting on them (the prefetch took a tenth off the detector's requantization).
constexpr int64_t kRequantAhead = 256;
// requantize_rows at AVX-512 in intrinsics: the same operations as requantize_row<16>
// (int32 sum plus bias, to float, times the scale, clamped, rounded half to even, plus the
// zero point), a period's tail under a lane mask instead of scalar code and no call per
// period (the epilogue was a sixth of PP-OCR's detector's 8-bit run).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as in quantize.cc
// The bounds and zero point of one requantization at AVX-512 (Int8Output's).
struct Requant512 {
  __m512 lo, hi;
  __m512i zp;
  __attribute__((target("avx512f"))) explicit Requant512(const Int8Output& out) {
    const int32_t qlo = out.bytes_signed ? -128 : 0, qhi = out.bytes_signed ? 127 : 255;
    lo = _mm512_set1_ps(float(qlo - out.zero_point));
    hi = _mm512_set1_ps(float(qhi - out.zero_point));
    zp = _mm512_set1_epi32(out.zero_point);
  }
  // 16 sums (bias included) times their scales, as int32 lanes of the output's bytes.
  __attribute__((target("avx512f"), always_inline)) inline __m512i operator()(__m512i a,
                                                                              __m512 scale) const {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), scale);
    // Clamped (min/max: a NaN lane, which ends as 0 anyway, may take either bound) and
    // rounded half to even by the conversion itself (MXCSR's default, which the magic
    // number of the generic code relies on too).
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    return _mm512_maskz_mov_epi32(_mm512_knot(nan), _mm512_add_epi32(_mm512_cvtps_epi32(v), zp));
  }
};

__attribute__((target("avx512f"))) void requantize_rows_avx512(const int32_t* acc, int64_t n,
                                                               const Int8Output& out,
                                                               uint8_t* bytes) {
  const Requant512 requant(out);
  for (int64_t s = 0; s < n; s += out.period) {
    const int64_t m = std::min(out.period, n - s);
    for (int64_t k = 0; k < m; k += 16) {
      __builtin_prefetch(acc + s + k + kRequantAhead);
      const __mmask16 mk = m - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (m - k)) - 1);
      __m512i a = _mm512_maskz_loadu_epi32(mk, acc + s + k);
      if (out.qbias) a = _mm512_add_epi32(a, _mm512_maskz_loadu_epi32(mk, out.qbias + k));
      _mm512_mask_cvtepi32_storeu_epi8(bytes + s + k, mk,
                                       requant(a, _mm512_maskz_loadu_ps(mk, out.scale + k)));
    }
  }
}

#pragma GCC diagnostic pop

// The same at AVX2, 8 lanes.
struct Requant256 {
  __m256 lo, hi;
  __m256i zp;
  __m128i pick;
  // No scale is NaN or infinite, so no product is NaN (an int32 sum is finite).
  bool finite = true;
  bool is_signed = false;  // int8 bytes out
  __attribute__((target("avx2"))) explicit Requant256(const Int8Output& out) {
    const int32_t qlo = out.bytes_signed ? -128 : 0, qhi = out.bytes_signed ? 127 : 255;
    lo = _mm256_set1_ps(float(qlo - out.zero_point));
    hi = _mm256_set1_ps(float(qhi - out.zero_point));
    zp = _mm256_set1_epi32(out.zero_point);
    pick = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (int64_t k = 0; k < out.period; ++k) finite = finite && std::isfinite(out.scale[k]);
    is_signed = out.bytes_signed;
  }
  // The 8 requantized values, int32 lanes in [qlo, qhi].
  __attribute__((target("avx2"), always_inline)) inline __m256i values(__m256i a,
                                                                       __m256 scale) const {
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(a), scale);
    const __m256i q =
        _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi)), zp);
    if (finite) return q;
    return _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)), q);
  }
  // The 8 output bytes, in the low half.
  __attribute__((target("avx2"), always_inline)) inline __m128i operator()(__m256i a,
                                                                           __m256 scale) const {
    return bytes8(values(a, scale));
  }
  // values' lanes as bytes, in the low half.
  __attribute__((target("avx2"), always_inline)) inline __m128i bytes8(__m256i q) const {
    const __m128i l = _mm_shuffle_epi8(_mm256_castsi256_si128(q), pick);
    const __m128i h = _mm_shuffle_epi8(_mm256_extracti128_si256(q, 1), pick);
    return _mm_unpacklo_epi32(l, h);
  }
};

// requantize_rows at AVX2: 32 values a step, narrowed by saturating packs (in range
// already, so exact) and one lane permute instead of two shuffles and an unpack per 8. The
// period is a multiple of 8, so no 8 lanes straddle its end; the last n % 8 go through
// local copies.
__attribute__((target("avx2"))) void requantize_rows_avx2(const int32_t* acc, int64_t n,
                                                          const Int8Output& out, uint8_t* bytes) {
  const Requant256 requant(out);
  const int64_t period = out.period;
  auto q8 = [&](const int32_t* a32, int64_t c) __attribute__((target("avx2"))) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a32));
    if (out.qbias)
      a = _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out.qbias + c)));
    return requant.values(a, _mm256_loadu_ps(out.scale + c));
  };
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0, c = 0;  // c = i % period
  auto next = [&] {
    i += 8;
    c = c + 8 == period ? 0 : c + 8;
  };
  for (; i + 32 <= n;) {
    __builtin_prefetch(acc + i + kRequantAhead);
    __builtin_prefetch(acc + i + kRequantAhead + 16);
    __m256i q[4];
    uint8_t* to = bytes + i;
    for (int j = 0; j < 4; ++j) {
      q[j] = q8(acc + i, c);
      next();
    }
    const __m256i w = _mm256_packs_epi32(q[0], q[1]), x = _mm256_packs_epi32(q[2], q[3]);
    const __m256i b = out.bytes_signed ? _mm256_packs_epi16(w, x) : _mm256_packus_epi16(w, x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm256_permutevar8x32_epi32(b, order));
  }
  for (; i + 8 <= n; next())
    _mm_storel_epi64(reinterpret_cast<__m128i*>(bytes + i), requant.bytes8(q8(acc + i, c)));
  if (i < n) {
    alignas(32) int32_t ta[8] = {}, tb[8] = {};
    alignas(32) float ts[8] = {};
    alignas(16) uint8_t tc[16];
    const size_t r = size_t(n - i);
    std::memcpy(ta, acc + i, r * 4);
    if (out.qbias) std::memcpy(tb, out.qbias + c, r * 4);
    std::memcpy(ts, out.scale + c, r * 4);
    __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(ta));
    a = _mm256_add_epi32(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(tb)));
    _mm_store_si128(reinterpret_cast<__m128i*>(tc), requant(a, _mm256_load_ps(ts)));
    std::memcpy(bytes + i, tc, r);
  }
}
#endif

void requantize_rows(const int32_t* acc, int64_t n, const Int8Output& out, uint8_t* bytes) {
#if defined(__x86_64__)
  if (detected_isa() == Isa::avx512) return requantize_rows_avx512(acc, n, out, bytes);
  if (detected_isa() == Isa::avx2) return requantize_rows_avx2(acc, n, out, bytes);
#endif
  for (int64_t s = 0; s < n; s += out.period)
    requantize_row_any(acc + s, std::min(out.period, n - s), 0, nullptr, out.qbias, out.scale,
                       out.zero_point, out.bytes_signed, bytes + s);
}

// Requantized rows [p0, p1) of oc bytes: through the table, then plus the residual's rows
// (`residual`: the image's, or the band's, NHWC).
void finish_bytes(const Int8Output& out, const uint8_t* residual, int64_t oc, uint8_t* bytes,
                  int64_t p0, int64_t p1) {
  uint8_t* b = bytes + p0 * oc;
  const int64_t n = (p1 - p0) * oc;
  if (out.table) lookup_bytes(out.table, b, b, n);
  if (residual) qbinary(b, residual + p0 * oc, 0.f, b, n, false, out.add_a, out.add_b, out.add_c);
}

// Rows [p0, p1) of one image's sums acc [pixels, oc] (NHWC), plus comp[oc] * box[g][p]
// (box may be null), into `sums`, `values` or `bytes` (NHWC, row p at p * oc; sums or
// values may be acc itself: each row is read before it is written).
void finish_rows(const int32_t* acc, const int32_t* box, int64_t pixels, int64_t oc, int64_t group,
                 const std::vector<int32_t>& comp, const Int8Output& out, int32_t* sums,
                 float* values, uint8_t* bytes, const uint8_t* residual, int64_t p0, int64_t p1) {
  // Without compensation the groups of a pixel are one row (depthwise: 1 channel each).
  if (!box && bytes && out.period) {
    requantize_rows(acc + p0 * oc, (p1 - p0) * oc, out, bytes + p0 * oc);
    finish_bytes(out, residual, oc, bytes, p0, p1);
    return;
  }
  const int64_t ocg = box ? oc / group : oc;
  if (!box) group = 1;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t o0 = p * oc + g * ocg, c0 = g * ocg;
      finish_row(acc + o0, ocg, box ? box[g * pixels + p] : 0, comp.data() + c0, out, c0,
                 sums ? sums + o0 : nullptr, values ? values + o0 : nullptr,
                 bytes ? bytes + o0 : nullptr);
    }
  if (bytes) finish_bytes(out, residual, oc, bytes, p0, p1);
}

memory::desc u8_md(const memory::dims& d, memory::format_tag f) {
  return memory::desc(d, memory::data_type::u8, f);
}

// Consecutive pieces of one scratch buffer, each 64-byte aligned.
struct ScratchLayout {
  size_t bytes = 0;
  size_t add(size_t n) {
    const size_t at = bytes;
    bytes += (n + 63) / 64 * 64;
    return at;
  }
};

template <typename T>
T* piece(void* scratch, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(scratch) + offset);
}

// ---------------------------------------------------------------------------------------
// The direct convolution: slim's own kernel for requantized convolutions of one group
// whose weights need no compensation, where vpdpbusd sums u8 x s8 products exactly
// (int8_dot), or at plain AVX2 where the weights are pair-safe (every |w8| <= 64): there
// vpmaddubsw sums each pair of a 4-byte group exactly in int16 and vpmaddwd (by ones)
// adds the two pairs into int32, three instructions in place of vpdpbusd's one. oneDNN
// 2.6's 8-bit kernels at AVX2 and each call's set-up had left PP-OCR's detector only 1.39x
// faster than f32 at AVX2 with AVX-VNNI.
//
// The source is unsigned NHWC bytes, cp (the channels rounded up to 4) bytes per pixel,
// with the padding around the image: where it arrives otherwise (NCHW, int8, padded,
// channels not a multiple of 4) it is copied into such a buffer first, the padding and
// the extra channels filled with the zero point, so that (x - x_zp) is 0 there (padding
// adds nothing, as in ONNX Runtime; the extra channels' weights are 0). The weights are
// packed once per block of output channels (up to 4 vectors at AVX-512, 2 or 3 at AVX2),
// [tap][cp / 4][block lanes][4], zeros past the last channel. A tile of mr consecutive
// output pixels (raster order) times one block accumulates in registers: one vpdpbusd per
// 4 input channels, pixel and vector, the pixel's 4 bytes broadcast. sum(x * w) - x_zp *
// sum(w) + bias is the sum oneDNN computes plus the bias, requantized in registers as
// requantize_rows does (the same operations, so the same bytes) and stored. The image's last tile, when shorter, starts mr pixels before its
// end (or at 0, its extra pixels repeating the last) and stores only its new pixels.

// The instruction the direct convolution sums with (see direct_dot); depthwise256 and
// depthwise_vnni256: a depthwise convolution's own kernel (see dw_tile_avx2).
enum class DirectDot { none, amx, vnni512, vnni256, pairs256, depthwise256, depthwise_vnni256 };

// The direct kernel's instruction at the level oneDNN runs (int8_dot), or at plain AVX2
// (no VNNI) the pairs kernel where the weights are pair-safe; none where it does not run.
DirectDot direct_dot(Int8Dot dot, bool pair_safe) {
  switch (dot) {
    case Int8Dot::amx:
      return DirectDot::amx;
    case Int8Dot::avx512_vnni:
      return DirectDot::vnni512;
    case Int8Dot::avx_vnni:
      return DirectDot::vnni256;
    case Int8Dot::none:
      break;
  }
  const unsigned isa = unsigned(dnnl::get_effective_cpu_isa()),
                 avx2 = unsigned(dnnl::cpu_isa::avx2);
  return pair_safe && (isa & avx2) == avx2 ? DirectDot::pairs256 : DirectDot::none;
}

// What one tile call reads and writes.
struct DirectTile {
  const uint8_t* src;    // the (padded) source image
  const int64_t* pixel;  // mr offsets in src: each output pixel's first tap
  const int64_t* tap;    // the taps' offsets from there
  int64_t taps, quads;   // taps; channel quads (cp / 4)
  const int8_t* w;       // the block's packed weights
  const uint8_t* src_c;  // depthwise: src at the block's first channel
  const int32_t* bias;   // the block's bias - x_zp * sum(w), one per lane
  const float* scale;    // the block's scales, one per lane
  uint8_t* y;            // the tile's first pixel at the block's first channel
  int64_t ldy;           // output channels (bytes from one pixel to the next)
  int first, last;       // the tile's pixels [first, last) are stored
  int cols;              // channels of the block that exist
};

class DirectConv {
 public:
  // The kernel for g, or none where it does not run (see make). w8: the weights
  // [oc, c, kh, kw] as oneDNN would take them.
  static std::unique_ptr<DirectConv> make(const ConvGeometry& g, const std::vector<int8_t>& w8,
                                          DirectDot dot, ScratchLayout& layout);
  // One image: x (NCHW, or NHWC when x_channels_last; int8 when flip) into y (NHWC bytes).
  void run(const KernelContext& ctx, const uint8_t* x, bool x_channels_last, bool flip,
           int32_t x_zero_point, const Int8Output& out, uint8_t* y, void* scratch) const;

  // Calls fn(tile, nr) for every block of output tiles [t0, t1) (nr: the block's vectors),
  // and applies out.table and out.residual (the image's) to their bytes.
  template <typename Fn>
  void each_tile(const uint8_t* src, const int32_t* bias, const float* scale, const Int8Output& out,
                 uint8_t* y, int64_t t0, int64_t t1, Fn&& fn) const;

  DirectDot dot = DirectDot::none;
  int lanes = 0, nr = 0, mr = 0;  // lanes per vector; vectors per block; pixels per tile

 private:
  // The depthwise kernel (DirectDot::depthwise256, depthwise_vnni256): blocks of 16 channels (nr 1,
  // 16 lanes), tiles of 4 pixels, the channels rounded up to 16 in the source's copy.
  static std::unique_ptr<DirectConv> make_depthwise(const ConvGeometry& g,
                                                    const std::vector<int8_t>& w8, DirectDot dot,
                                                    ScratchLayout& layout);
  // g, the padded source of cp channels a pixel and the taps' offsets in it.
  void set_source(const ConvGeometry& g, int64_t cp) {
    g_ = g;
    cp_ = cp;
    hp_ = g.x[2] + g.pad_l[0] + g.pad_r[0];
    wp_ = g.x[3] + g.pad_l[1] + g.pad_r[1];
    for (int64_t a = 0; a < g.w[2]; ++a)
      for (int64_t t = 0; t < g.w[3]; ++t)
        taps_.push_back((a * (g.dil[0] + 1) * wp_ + t * (g.dil[1] + 1)) * cp_);
  }
  // The scratch of a run: the source's copy, the lanes' biases and scales.
  void reserve(ScratchLayout& layout) {
    src_at_ = layout.add(size_t(hp_ * wp_ * cp_));
    bias_at_ = layout.add(size_t(ocp_) * 4);
    scale_at_ = layout.add(size_t(ocp_) * 4);
  }

  ConvGeometry g_;
  int64_t cp_ = 0, hp_ = 0, wp_ = 0, ocp_ = 0;  // padded channels, height, width; lanes' channels
  std::vector<int8_t> w_;                       // packed
  int64_t w_stride_ = 0;                        // bytes of w_ per output channel
  std::vector<int32_t> wsum_;                   // sum(w) per output channel
  std::vector<int64_t> taps_;
  size_t src_at_ = 0, bias_at_ = 0, scale_at_ = 0;
};

template <typename Fn>
void DirectConv::each_tile(const uint8_t* src, const int32_t* bias, const float* scale,
                           const Int8Output& out, uint8_t* y, int64_t t0, int64_t t1,
                           Fn&& fn) const {
  const int64_t oc = g_.y[1], ow = g_.y[3], pixels = g_.y[2] * ow, block = int64_t(nr) * lanes;
  std::array<int64_t, 16> pixel{};
  int64_t looked_up = t0 * mr;  // pixels before this one are finished
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t p0 = std::max<int64_t>(0, std::min(t * mr, pixels - mr));
    int64_t oy = p0 / ow, ox = p0 % ow;  // one division per tile, not one per pixel
    for (int m = 0; m < mr; ++m) {
      pixel[size_t(m)] = (oy * g_.stride[0] * wp_ + ox * g_.stride[1]) * cp_;
      if (p0 + m + 1 < pixels && ++ox == ow) ox = 0, ++oy;
    }
    DirectTile tile{};
    tile.pixel = pixel.data();
    tile.tap = taps_.data();
    tile.taps = int64_t(taps_.size());
    tile.quads = cp_ / 4;
    tile.ldy = oc;
    tile.first = int(t * mr - p0);
    tile.last = int(std::min<int64_t>(mr, pixels - p0));
    for (int64_t c0 = 0; c0 < oc; c0 += block) {
      tile.src = src;
      tile.src_c = src + c0;
      tile.w = w_.data() + c0 * w_stride_;
      tile.bias = bias + c0;
      tile.scale = scale + c0;
      tile.y = y + p0 * oc + c0;
      tile.cols = int(std::min(block, oc - c0));
      fn(tile, int((tile.cols + lanes - 1) / lanes));
    }
    // The table and the residual over runs of at least 4 KiB (a call per tile cost more
    // than the lookups).
    const int64_t done = p0 + tile.last;
    if ((out.table || out.residual) && (t + 1 == t1 || (done - looked_up) * oc >= 4096)) {
      finish_bytes(out, out.residual, oc, y, looked_up, done);
      looked_up = done;
    }
  }
}

#if defined(__x86_64__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
#define SLIM_VNNI512 __attribute__((target("avx512f,avx512vnni")))
#define SLIM_VNNI256 __attribute__((target("avx2,avxvnni")))

#define SLIM_AVX2 __attribute__((target("avx2,fma")))
// A tile's NR vectors of 16 output channels x MR pixels (NR * MR <= 24 of the 32 zmm
// registers), requantized and stored.
template <int NR, int MR>
SLIM_VNNI512 inline __attribute__((always_inline)) void store_tile_avx512(
    const DirectTile& t, const Requant512& requant, const __m512i (&acc)[MR][NR]) {
  for (int j = 0; j < NR; ++j) {
    const int rest = std::clamp(t.cols - 16 * j, 0, 16);
    const __mmask16 keep = rest == 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1);
    const __m512i bias = _mm512_loadu_si512(t.bias + 16 * j);
    const __m512 scale = _mm512_loadu_ps(t.scale + 16 * j);
    for (int m = 0; m < MR; ++m)
      if (m >= t.first && m < t.last)
        _mm512_mask_cvtepi32_storeu_epi8(t.y + m * t.ldy + 16 * j, keep,
                                         requant(_mm512_add_epi32(acc[m][j], bias), scale));
  }
}

template <int NR, int MR>
SLIM_VNNI512 void direct_tile_avx512(const DirectTile& t, const Requant512& requant) {
  __m512i acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_si512();
  const int8_t* w = t.w;
  for (int64_t a = 0; a < t.taps; ++a) {
    const uint8_t* s = t.src + t.tap[a];
    for (int64_t q = 0; q < t.quads; ++q, w += NR * 64) {
      __m512i wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_si512(w + j * 64);
      for (int m = 0; m < MR; ++m) {
        int32_t x;
        std::memcpy(&x, s + t.pixel[m] + 4 * q, 4);
        const __m512i xb = _mm512_set1_epi32(x);
        for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], xb, wv[j]);
      }
    }
  }
  store_tile_avx512<NR, MR>(t, requant, acc);
}

// NR vectors of 8 output channels x MR pixels (NR * MR <= 12 of the 16 ymm registers).
template <int NR, int MR>
__attribute__((target("avx2"), always_inline)) inline void store_tile_avx2(
    const DirectTile& t, const Requant256& requant, const __m256i (&acc)[MR][NR]) {
  for (int j = 0; j < NR; ++j) {
    const int rest = std::clamp(t.cols - 8 * j, 0, 8);
    const __m256i bias = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.bias + 8 * j));
    const __m256 scale = _mm256_loadu_ps(t.scale + 8 * j);
    for (int m = 0; m < MR; ++m) {
      if (m < t.first || m >= t.last) continue;
      const __m128i q = requant(_mm256_add_epi32(acc[m][j], bias), scale);
      uint8_t* to = t.y + m * t.ldy + 8 * j;
      if (rest == 8) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(to), q);
      } else {
        alignas(16) uint8_t tmp[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(tmp), q);
        std::memcpy(to, tmp, size_t(rest));
      }
    }
  }
}

// acc + the 4-byte groups' sums of u8 x s8 products: vpdpbusd (AVX-VNNI), or at plain
// AVX2 for pair-safe weights vpmaddubsw (pairs in int16, exact as |w| <= 64) and vpmaddwd
// by ones (the two pairs of a group into int32).
SLIM_VNNI256 inline __attribute__((always_inline)) __m256i dot_vnni256(__m256i acc, __m256i x,
                                                                       __m256i w) {
  return _mm256_dpbusd_avx_epi32(acc, x, w);
}

SLIM_AVX2 inline __attribute__((always_inline)) __m256i dot_pairs256(__m256i acc, __m256i x,
                                                                     __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1)));
}

// The AVX2 tile, one body for both instructions: stamped out once per target, since the
// pairs kernel must not require AVX-VNNI (GCC inlines no intrinsic of a wider target).
#define SLIM_DIRECT_TILE_256(name, target, dot)                                     \
  template <int NR, int MR>                                                         \
  target void name(const DirectTile& t, const Requant256& requant) {                \
    __m256i acc[MR][NR];                                                            \
    for (int m = 0; m < MR; ++m)                                                    \
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm256_setzero_si256();              \
    const int8_t* w = t.w;                                                          \
    for (int64_t a = 0; a < t.taps; ++a) {                                          \
      const uint8_t* s = t.src + t.tap[a];                                          \
      for (int64_t q = 0; q < t.quads; ++q, w += NR * 32) {                         \
        __m256i wv[NR];                                                             \
        for (int j = 0; j < NR; ++j)                                                \
          wv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * 32)); \
        for (int m = 0; m < MR; ++m) {                                              \
          int32_t x;                                                                \
          std::memcpy(&x, s + t.pixel[m] + 4 * q, 4);                               \
          const __m256i xb = _mm256_set1_epi32(x);                                  \
          for (int j = 0; j < NR; ++j) acc[m][j] = dot(acc[m][j], xb, wv[j]);       \
        }                                                                           \
      }                                                                             \
    }                                                                               \
    store_tile_avx2<NR, MR>(t, requant, acc);                                       \
  }
SLIM_DIRECT_TILE_256(direct_tile_avx2, SLIM_VNNI256, dot_vnni256)
SLIM_DIRECT_TILE_256(direct_tile_pairs256, SLIM_AVX2, dot_pairs256)
#undef SLIM_DIRECT_TILE_256
// Tiles [t0, t1) at AVX-512 VNNI and at AVX-VNNI: the layer's tile height mr goes with
// its widest block (pixels x vectors: 6 x 4, 8 x 3, 12 x 2 or 12 x 1 at AVX-512; 4 x 3,
// 6 x 2 or 12 x 1 at AVX2), a narrower last block keeps it.
#define SLIM_DIRECT_CASE(isa, NR, MR) \
  case MR * 10 + NR:                  \
    return direct_tile_##isa<NR, MR>(t, requant);
SLIM_VNNI512 void direct_tiles_avx512(const DirectConv& d, const uint8_t* src, const int32_t* bias,
                                      const float* scale, const Int8Output& out, uint8_t* y,
                                      int64_t t0, int64_t t1) {
  const Requant512 requant(out);
  d.each_tile(src, bias, scale, out, y, t0, t1, [&](const DirectTile& t, int nr) SLIM_VNNI512 {
    switch (d.mr * 10 + nr) {
      SLIM_DIRECT_CASE(avx512, 4, 6)
      SLIM_DIRECT_CASE(avx512, 3, 6)
      SLIM_DIRECT_CASE(avx512, 2, 6)
      SLIM_DIRECT_CASE(avx512, 1, 6)
      SLIM_DIRECT_CASE(avx512, 3, 8)
      SLIM_DIRECT_CASE(avx512, 2, 8)
      SLIM_DIRECT_CASE(avx512, 1, 8)
      SLIM_DIRECT_CASE(avx512, 2, 12)
      default:
        SLIM_DIRECT_CASE(avx512, 1, 12)
    }
  });
}

// The two AVX2 kernels' tiles, stamped out per target: tile heights m3, m2, m1 for blocks
// of 3, 2 and 1 vectors. The pairs kernel holds a vector of ones and a product in
// registers too: at most 10 sums in flight (3 x 3, 2 x 5, 1 x 10) of the 16 ymm registers.
#define SLIM_DIRECT_TILES_256(isa, target, m3, m2, m1)                                         \
  target void direct_tiles_##isa(const DirectConv& d, const uint8_t* src, const int32_t* bias, \
                                 const float* scale, const Int8Output& out, uint8_t* y,        \
                                 int64_t t0, int64_t t1) {                                     \
    const Requant256 requant(out);                                                             \
    d.each_tile(src, bias, scale, out, y, t0, t1, [&](const DirectTile& t, int nr) target {    \
      switch (d.mr * 10 + nr) {                                                                \
        SLIM_DIRECT_CASE(isa, 3, m3)                                                           \
        SLIM_DIRECT_CASE(isa, 2, m2)                                                           \
        SLIM_DIRECT_CASE(isa, 1, m2)                                                           \
        default:                                                                               \
          SLIM_DIRECT_CASE(isa, 1, m1)                                                         \
      }                                                                                        \
    });                                                                                        \
  }
SLIM_DIRECT_TILES_256(avx2, SLIM_VNNI256, 4, 6, 12)
SLIM_DIRECT_TILES_256(pairs256, SLIM_AVX2, 3, 5, 10)
#undef SLIM_DIRECT_TILES_256
#undef SLIM_DIRECT_CASE

// A depthwise tile: MR pixels x 16 channels. Each channel sums its own taps, so there are
// no groups of 4 channels for vpdpbusd: the bytes of two taps are widened to int16 and
// interleaved (vpunpcklwd / vpunpckhwd), and vpmaddwd multiplies them by the two taps'
// weights and adds each pair into int32, exactly (|u8 x s8| < 2^15) and without VNNI (with
// AVX-VNNI, vpdpwssd does that and the accumulation in one). The low interleave holds
// channels 0-3 and 8-11, the high one 4-7 and 12-15 (the weights are packed in that order,
// [tap pair][low, high][16 int16]), put back in order before the requantization. The taps
// come in pairs (an odd last one with a zero weight). Stamped out once per target, as the
// direct tiles are.
SLIM_AVX2 inline __attribute__((always_inline)) __m256i pair_madd256(__m256i acc, __m256i x,
                                                                     __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w));
}
SLIM_VNNI256 inline __attribute__((always_inline)) __m256i pair_dp256(__m256i acc, __m256i x,
                                                                      __m256i w) {
  return _mm256_dpwssd_avx_epi32(acc, x, w);
}
#define SLIM_DW_TILE_256(name, tiles, target, pair)                                            \
  template <int MR>                                                                            \
  target void name(const DirectTile& t, const Requant256& requant) {                           \
    __m256i lo[MR], hi[MR];                                                                    \
    for (int m = 0; m < MR; ++m) lo[m] = hi[m] = _mm256_setzero_si256();                       \
    const auto* w = reinterpret_cast<const __m256i*>(t.w);                                     \
    for (int64_t a = 0; a < t.taps; a += 2, w += 2) {                                          \
      const __m256i wl = _mm256_loadu_si256(w), wh = _mm256_loadu_si256(w + 1);                \
      const uint8_t *s0 = t.src_c + t.tap[a], *s1 = t.src_c + t.tap[a + 1];                    \
      for (int m = 0; m < MR; ++m) {                                                           \
        const __m256i x0 = _mm256_cvtepu8_epi16(                                               \
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(s0 + t.pixel[m]))), \
                      x1 = _mm256_cvtepu8_epi16(                                               \
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(s1 + t.pixel[m]))); \
        lo[m] = pair(lo[m], _mm256_unpacklo_epi16(x0, x1), wl);                                \
        hi[m] = pair(hi[m], _mm256_unpackhi_epi16(x0, x1), wh);                                \
      }                                                                                        \
    }                                                                                          \
    store_dw_tile_avx2<MR>(t, requant, lo, hi);                                                \
  }                                                                                            \
  target void tiles(const DirectConv& d, const uint8_t* src, const int32_t* bias,              \
                    const float* scale, const Int8Output& out, uint8_t* y, int64_t t0,         \
                    int64_t t1) {                                                              \
    const Requant256 requant(out);                                                             \
    d.each_tile(src, bias, scale, out, y, t0, t1,                                              \
                [&](const DirectTile& t, int) target { name<4>(t, requant); });                \
  }

// The tile's 16 channels of pixels [first, last), requantized and stored. The sums stay in
// the interleaves' order (the biases and scales are put in it instead), so vpackssdw of
// the low and high ones gives the 16 channels in order, and vpack(u)swb two pixels' at a
// time (one lane permute puts each pixel's 16 bytes together).
template <int MR>
__attribute__((target("avx2"), always_inline)) inline void store_dw_tile_avx2(
    const DirectTile& t, const Requant256& requant, const __m256i (&lo)[MR],
    const __m256i (&hi)[MR]) {
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.bias)),
                b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.bias + 8));
  const __m256 c0 = _mm256_loadu_ps(t.scale), c1 = _mm256_loadu_ps(t.scale + 8);
  // Channels 0-3 | 8-11 and 4-7 | 12-15, as the low and high interleaves hold them.
  const __m256i bl = _mm256_permute2x128_si256(b0, b1, 0x20),
                bh = _mm256_permute2x128_si256(b0, b1, 0x31);
  const __m256 cl = _mm256_permute2f128_ps(c0, c1, 0x20), ch = _mm256_permute2f128_ps(c0, c1, 0x31);
  auto words = [&](int m) __attribute__((target("avx2"))) {
    return _mm256_packs_epi32(requant.values(_mm256_add_epi32(lo[m], bl), cl),
                              requant.values(_mm256_add_epi32(hi[m], bh), ch));
  };
  auto store = [&](int m, __m128i q) __attribute__((target("avx2"))) {
    uint8_t* to = t.y + m * t.ldy;
    if (t.cols == 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to), q);
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), q);
      std::memcpy(to, tmp, size_t(t.cols));
    }
  };
  const bool is_signed = requant.is_signed;
  for (int m = t.first; m < t.last; m += 2) {
    const __m256i w0 = words(m), w1 = m + 1 < t.last ? words(m + 1) : w0;
    const __m256i b = is_signed ? _mm256_packs_epi16(w0, w1) : _mm256_packus_epi16(w0, w1);
    const __m256i q = _mm256_permute4x64_epi64(b, 0xd8);  // pixel m's 16 bytes, then m + 1's
    store(m, _mm256_castsi256_si128(q));
    if (m + 1 < t.last) store(m + 1, _mm256_extracti128_si256(q, 1));
  }
}
SLIM_DW_TILE_256(dw_tile_avx2, dw_tiles_avx2, SLIM_AVX2, pair_madd256)
SLIM_DW_TILE_256(dw_tile_vnni256, dw_tiles_vnni256, SLIM_VNNI256, pair_dp256)
#undef SLIM_DW_TILE_256

#pragma GCC diagnostic pop
#endif

std::unique_ptr<DirectConv> DirectConv::make(const ConvGeometry& g, const std::vector<int8_t>& w8,
                                             DirectDot dot, ScratchLayout& layout) {
#if defined(__x86_64__)
  const int64_t c = g.x[1], oc = g.y[1], kh = g.w[2], kw = g.w[3], k = c * kh * kw;
  if (dot == DirectDot::depthwise256 || dot == DirectDot::depthwise_vnni256)
    return make_depthwise(g, w8, dot, layout);
  if (dot == DirectDot::none || g.group != 1) return nullptr;
  // Under 32 bytes summed per output (PP-OCR's first 3x3 of 3 channels, 1x1 ones of 12-24)
  // or 8 output channels (a 1x1 of 4) the requantization and the source's copy outweigh
  // the products, and oneDNN's kernels were 10-60% faster (up to 3x at 4 channels).
  // Depthwise convolutions at AVX-512 stay there too: a kernel of vpdpbusd on bytes widened
  // to int32 lanes was 10-40% slower than oneDNN's on the detector's 16-32 channels.
  if (k < 32 || oc < 8) return nullptr;
  if (dot == DirectDot::amx && k >= 64) return nullptr;
  // At plain AVX2 1x1 convolutions stay on oneDNN (whose kernels multiply with the same
  // vpmaddubsw + vpmaddwd, and band large images): with them on the pairs kernel PP-OCRv4's
  // detector (7-bit weights, 1 thread) ran in 22.78 ms, without 22.37 (k x k ones made no
  // difference either way: 22.35 with none on it).
  if (dot == DirectDot::pairs256 && kh * kw == 1) return nullptr;
  auto d = std::make_unique<DirectConv>();
  d->dot = dot;
  d->lanes = dot == DirectDot::vnni256 || dot == DirectDot::pairs256 ? 8 : 16;
  const int64_t vectors = (oc + d->lanes - 1) / d->lanes;
  if (d->lanes == 16) {
    d->nr = int(std::min<int64_t>(vectors, 4));
    d->mr = d->nr == 4 ? 6 : d->nr == 3 ? 8 : 12;
  } else {
    // 3 x 4 where the vectors come in threes (PP-OCR's 24, 48, 96... channels: a block of
    // 1 x 6 after ones of 2 x 6 had only 6 sums in flight), else 2 x 6, 1 x 12.
    d->nr = vectors % 3 == 0 ? 3 : int(std::min<int64_t>(vectors, 2));
    if (dot == DirectDot::pairs256)
      d->mr = d->nr == 3 ? 3 : d->nr == 2 ? 5 : 10;  // see SLIM_DIRECT_TILES_256
    else
      d->mr = d->nr == 3 ? 4 : d->nr == 2 ? 6 : 12;
  }
  d->set_source(g, (c + 3) / 4 * 4);
  d->ocp_ = vectors * d->lanes;
  // Block by block (the last one's vectors only): [tap][quad][lane][4].
  const int64_t taps = kh * kw, block = int64_t(d->nr) * d->lanes;
  d->w_.assign(size_t(d->ocp_ * taps * d->cp_), 0);
  d->wsum_.assign(size_t(d->ocp_), 0);
  for (int64_t c0 = 0; c0 < oc; c0 += block) {
    const int64_t width = std::min(block, d->ocp_ - c0);
    int8_t* to = d->w_.data() + c0 * taps * d->cp_;
    for (int64_t a = 0; a < taps; ++a)
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < width && c0 + j < oc; ++j) {
          const int8_t v = w8[size_t(((c0 + j) * c + i) * taps + a)];
          d->wsum_[size_t(c0 + j)] += v;
          to[((a * d->cp_ / 4 + i / 4) * width + j) * 4 + i % 4] = v;
        }
  }
  d->w_stride_ = taps * d->cp_;
  d->reserve(layout);
  return d;
#else
  (void)g, (void)w8, (void)dot, (void)layout;
  return nullptr;
#endif
}

std::unique_ptr<DirectConv> DirectConv::make_depthwise(const ConvGeometry& g,
                                                       const std::vector<int8_t>& w8, DirectDot dot,
                                                       ScratchLayout& layout) {
  const int64_t c = g.x[1], kh = g.w[2], kw = g.w[3], taps = kh * kw;
  if (g.group != c || g.y[1] != c) return nullptr;
  auto d = std::make_unique<DirectConv>();
  d->dot = dot;
  d->lanes = 16;
  d->nr = 1;
  d->mr = 4;
  d->set_source(g, (c + 15) / 16 * 16);
  d->ocp_ = d->cp_;
  if (taps % 2) d->taps_.push_back(d->taps_[0]);  // its weights are 0
  const int64_t pairs = int64_t(d->taps_.size()) / 2;
  // Per block of 16 channels and tap pair: the low interleave's 8 channel pairs (channels
  // 0-3, 8-11), then the high one's (4-7, 12-15), each (w[tap], w[tap + 1]) as int16.
  d->w_stride_ = pairs * 4;
  d->w_.assign(size_t(d->ocp_ * d->w_stride_), 0);
  d->wsum_.assign(size_t(d->ocp_), 0);
  auto* packed = reinterpret_cast<int16_t*>(d->w_.data());
  for (int64_t k = 0; k < c; ++k) {
    const int64_t block = k / 16, j = k % 16, half = j % 8 / 4, at = j / 8 * 4 + j % 4;
    for (int64_t a = 0; a < taps; ++a) {
      const int8_t v = w8[size_t(k * taps + a)];
      d->wsum_[size_t(k)] += v;
      packed[((block * pairs + a / 2) * 2 + half) * 16 + at * 2 + a % 2] = v;
    }
  }
  d->reserve(layout);
  return d;
}

void DirectConv::run(const KernelContext& ctx, const uint8_t* x, bool x_channels_last, bool flip,
                     int32_t x_zero_point, const Int8Output& out, uint8_t* y, void* scratch) const {
#if defined(__x86_64__)
  const int64_t c = g_.x[1], ih = g_.x[2], iw = g_.x[3], oc = g_.y[1];
  const int32_t zp = flip ? x_zero_point + 128 : x_zero_point;
  auto* bias = piece<int32_t>(scratch, bias_at_);
  auto* scale = piece<float>(scratch, scale_at_);
  for (int64_t k = 0; k < ocp_; ++k) {
    bias[k] = k < oc ? (out.qbias ? out.qbias[k] : 0) - zp * wsum_[size_t(k)] : 0;
    scale[k] = k < oc ? out.scale[k] : 0.f;
  }
  // The source as it is (unsigned NHWC, no padding, channels in quads), or copied.
  const bool padded = hp_ != ih || wp_ != iw;
  const uint8_t* src = x;
  if (!x_channels_last || flip || padded || cp_ != c) {
    uint8_t* buf = piece<uint8_t>(scratch, src_at_);
    // The zero point around the image (and, where channels are rounded up, everywhere).
    if (cp_ != c) {
      std::memset(buf, zp, size_t(hp_ * wp_ * cp_));
    } else if (padded) {
      const int64_t row = wp_ * cp_, top = g_.pad_l[0], left = g_.pad_l[1] * cp_;
      std::memset(buf, zp, size_t(top * row));
      std::memset(buf + (top + ih) * row, zp, size_t((hp_ - top - ih) * row));
      for (int64_t r = top; r < top + ih; ++r) {
        std::memset(buf + r * row, zp, size_t(left));
        std::memset(buf + r * row + left + iw * cp_, zp, size_t(row - left - iw * cp_));
      }
    }
    parallel_items(ctx, ih, iw * c, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        to_channels_last(x, x_channels_last, c, ih * iw, r * iw, (r + 1) * iw, 1, flip, false, cp_,
                         buf + ((r + g_.pad_l[0]) * wp_ + g_.pad_l[1]) * cp_);
    });
    src = buf;
  }
  const int64_t pixels = g_.y[2] * g_.y[3], tiles = (pixels + mr - 1) / mr;
  const bool depthwise = dot == DirectDot::depthwise256 || dot == DirectDot::depthwise_vnni256;
  const int64_t sums = depthwise ? 1 : cp_;  // summed per tap and output
  parallel_items(ctx, tiles, mr * int64_t(taps_.size()) * sums * ocp_, kMacsPerThread,
                 [&](int64_t b, int64_t e) {
                   if (dot == DirectDot::depthwise256)
                     dw_tiles_avx2(*this, src, bias, scale, out, y, b, e);
                   else if (dot == DirectDot::depthwise_vnni256)
                     dw_tiles_vnni256(*this, src, bias, scale, out, y, b, e);
                   else if (dot == DirectDot::pairs256)
                     direct_tiles_pairs256(*this, src, bias, scale, out, y, b, e);
                   else if (dot == DirectDot::vnni256)
                     direct_tiles_avx2(*this, src, bias, scale, out, y, b, e);
                   else
                     direct_tiles_avx512(*this, src, bias, scale, out, y, b, e);
                 });
#else
  (void)ctx, (void)x, (void)x_channels_last, (void)flip, (void)x_zero_point, (void)out, (void)y,
      (void)scratch;
#endif
}

// A reorder run once at compile, on the compiling thread alone: a parallel region there
// leaves OpenMP's workers spinning while compile goes on without them (on two busy cores
// the 8-bit ISNet took 7 s to compile instead of 2).
void reorder_once(memory& from, memory& to) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  dnnl::stream stream(dnnl_engine());
  dnnl::reorder(from, to).execute(stream, from, to);
  stream.wait();
  omp_set_num_threads(threads);
}

// oneDNN's primitives keep no scratchpad of their own: theirs is a piece of the kernel's.
dnnl::primitive_attr zero_point_attr() {
  dnnl::primitive_attr attr;
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace

// What an 8-bit convolution and matmul share: a oneDNN u8s8 primitive with a run-time
// source zero point (zero_point_attr), its packed weights and its OpenMP threads.
struct ZeroPointPrimitive {
  dnnl::primitive prim;
  mutable memory weights, src, dst, zp, pad;
  mutable int32_t zp_value = 0;
  mutable dnnl::stream stream;
  // Multiply-adds of one call: the primitive's OpenMP threads (limit_dnnl_threads), set
  // again before each oneDNN call since the loops between them set their own.
  int64_t macs = 0;

  // Inside the setup's dnnl_call: the primitive of `pd`, and the weights reordered once from
  // `weights_user` into the layout it chose.
  template <typename PrimitiveDesc>
  void build(const PrimitiveDesc& pd, const memory::desc& weights_user, const int8_t* w) {
    const auto& eng = dnnl_engine();
    prim = dnnl::primitive(pd);
    weights = memory(pd.weights_desc(), eng);
    memory wu(weights_user, eng, const_cast<int8_t*>(w));
    reorder_once(wu, weights);
    src = memory(pd.src_desc(), eng, DNNL_MEMORY_NONE);
    dst = memory(pd.dst_desc(), eng, DNNL_MEMORY_NONE);
    pad = memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    zp = memory(memory::desc({1}, memory::data_type::s32, memory::format_tag::x), eng, &zp_value);
  }
  // int32 sums of (source - zero_point) x weights into `to` (unsigned source bytes).
  void run(const KernelContext& ctx, const char* what, int32_t zero_point, const void* from, int32_t* to,
           void* scratchpad) const {
    dnnl_call(ctx.node(), what, [&] {
      limit_dnnl_threads(ctx, macs, kMacsPerThread);
      zp_value = zero_point;
      src.set_data_handle(const_cast<void*>(from));
      dst.set_data_handle(to);
      pad.set_data_handle(scratchpad);
      prim.execute(stream, {{DNNL_ARG_SRC, src},
                            {DNNL_ARG_WEIGHTS, weights},
                            {DNNL_ARG_DST, dst},
                            {DNNL_ARG_SCRATCHPAD, pad},
                            {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zp}});
      stream.wait();
      return 0;
    });
  }
};

// ---------------------------------------------------------------------------------------
// Int8Conv

// One image at a time: the primitive, its buffers and the compensation's sums are per image.
struct Int8Conv::State : ZeroPointPrimitive {
  bool split = false, signed_source = false;
  int64_t cs = 0;  // channels oneDNN reads: C, or 2C when split
  PreparedWeights pw;
  // oneDNN's reorders between ONNX's NCHW and the NHWC the kernels run in: an unsigned
  // source not split, and the results (in place over the sums, then into the output).
  dnnl::reorder src_reorder, out_reorder;
  mutable memory src_plain, src_nhwc, out_nhwc, out_plain;
  // Scratch: the source in NHWC (unless used as it is), the sums (NHWC), the channel sums
  // [group, H*W] and window sums [group, OH*OW] of the compensation, oneDNN's scratchpad.
  ScratchLayout layout;
  // Requantized bytes in NHWC on their way to an NCHW output.
  size_t src_at = 0, dst_at = 0, bytes_at = 0, sums_at = 0, box_at = 0, pad_at = 0;
  // Output rows per oneDNN call (0: the whole image at once): see the constructor.
  int64_t band = 0;
  // slim's kernel instead of oneDNN's, where it runs.
  std::unique_ptr<DirectConv> direct;
};

Int8Conv::Int8Conv(const Node& node, const ConvGeometry& g, const Tensor& w,
                   const Tensor* w_zero_point, bool signed_source, DType out)
    : g_(g), s_(std::make_unique<State>()) {
  State& s = *s_;
  const int64_t c = g.x[1], oc = g.y[1], group = g.group;
  // Depthwise kernels widen each byte to 32 bits (no pair sums to saturate), and split
  // weights (two channels per group) would send them to oneDNN's reference kernel:
  // 57-190 ms instead of 2-8 for PP-OCR's classifier at SLIM_ISA=avx2.
  // Pair-safe weights (every |w8| <= 64) need no split either.
  s.pw = prepare_weights(w, w_zero_point, oc);
  const bool safe = pair_safe(s.pw.w8);
  s.split = int8_dot() == Int8Dot::none && !(group == c && group == oc) && !safe;
  s.signed_source = signed_source;
  const int64_t cg = c / group, ocg = oc / group, k = cg * g.w[2] * g.w[3];
  s.cs = s.split ? 2 * c : c;
  const bool bytes = out == DType::u8 || out == DType::i8;
  // Depthwise convolutions at AVX2 take slim's own kernel (with AVX-VNNI or without):
  // oneDNN's took PP-OCRv4's detector's depthwise ones 2-3x as long as f32 did.
  const bool depthwise = group == c && group == oc && detected_isa() == Isa::avx2;
  const DirectDot dw =
      int8_dot() == Int8Dot::avx_vnni ? DirectDot::depthwise_vnni256 : DirectDot::depthwise256;
  if (bytes && !s.pw.any_comp)
    s.direct =
        DirectConv::make(g, s.pw.w8, depthwise ? dw : direct_dot(int8_dot(), safe), s.layout);
  const memory::dims src_dims = {1, s.cs, g.x[2], g.x[3]}, dst_dims = {1, oc, g.y[2], g.y[3]};
  // A requantized 1x1 convolution (stride 1, no padding, one group, no compensation) of a
  // large image runs in bands of rows whose int32 sums (at most 512 KiB) are requantized
  // while still in cache, instead of writing and reading back every sum of the image
  // (PP-OCR's detector's 1x1 convolutions at 1/2 and 1/4 resolution: 5 MB of sums each).
  const bool one_by_one = g.w[2] == 1 && g.w[3] == 1 && g.stride[0] == 1 && g.stride[1] == 1 &&
                          g.pad_l[0] == 0 && g.pad_l[1] == 0 && g.pad_r[0] == 0 &&
                          g.pad_r[1] == 0 && group == 1;
  if (!s.direct && one_by_one && !s.pw.any_comp && bytes && g.x[2] == g.y[2] && g.x[3] == g.y[3]) {
    const int64_t row = g.y[3] * oc * 4;
    for (int64_t r = g.y[2] - 1; r >= 1; --r)
      if (g.y[2] % r == 0 && r * row <= (int64_t(512) << 10)) {
        s.band = r;
        break;
      }
  }
  const int64_t rows = s.band ? s.band : g.y[2];
  s.macs = oc * rows * g.y[3] * (s.cs / group) * g.w[2] * g.w[3];
  limit_dnnl_threads_at_build(s.macs, kMacsPerThread);
  dnnl_call(node, "8-bit convolution setup", [&] {
    const auto& eng = dnnl_engine();
    s.stream = dnnl::stream(eng);
    const auto t = out == DType::f32  ? memory::data_type::f32
                   : out == DType::u8 ? memory::data_type::u8
                   : out == DType::i8 ? memory::data_type::s8
                                      : memory::data_type::s32;
    s.out_nhwc = memory(memory::desc(dst_dims, t, memory::format_tag::nhwc), eng, DNNL_MEMORY_NONE);
    s.out_plain =
        memory(memory::desc(dst_dims, t, memory::format_tag::nchw), eng, DNNL_MEMORY_NONE);
    s.out_reorder = dnnl::reorder(s.out_nhwc, s.out_plain);
    if (bytes) s.bytes_at = s.layout.add(size_t(shape_numel(dst_dims)));
    if (s.direct) return 0;
    // oneDNN's weights: [group,] OCg, ICg (twice: hi, then lo), kh, kw.
    const int64_t ks = s.split ? 2 * k : k;
    std::vector<int8_t> wd(size_t(oc * ks));
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t i = 0; i < k; ++i) {
        const int8_t v = s.pw.w8[size_t(o * k + i)];
        if (s.split) {
          wd[size_t(o * ks + i)] = half_hi(v);
          wd[size_t(o * ks + k + i)] = half_lo(v);
        } else {
          wd[size_t(o * ks + i)] = v;
        }
      }
    memory::dims wdims = {ocg, s.split ? 2 * cg : cg, g.w[2], g.w[3]};
    if (group > 1) wdims.insert(wdims.begin(), group);
    const memory::dims conv_src = {1, s.cs, s.band ? s.band : g.x[2], g.x[3]},
                       conv_dst = {1, oc, rows, g.y[3]};
    const auto desc = dnnl::convolution_forward::desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        u8_md(conv_src, memory::format_tag::nhwc),
        memory::desc(wdims, memory::data_type::s8, memory::format_tag::any),
        memory::desc(conv_dst, memory::data_type::s32, memory::format_tag::nhwc), to_dims(g.stride),
        to_dims(g.dil), to_dims(g.pad_l), to_dims(g.pad_r));
    dnnl::convolution_forward::primitive_desc pd(desc, zero_point_attr(), eng);
    // AMX multiplies 64-byte rows of the reduction: with fewer (1x1 convolutions of 12-48
    // channels, PP-OCR's detector's first layers) most of each tile is padding, and
    // oneDNN's VNNI kernels were 1.3-1.6x faster there. A small call does not pay for the
    // tiles' set-up either: PP-OCR's classifier's 1x1 convolutions to 16-32 channels of 96
    // pixels (0.1-0.2 M products) took 0.05-0.15 ms on AMX, 0.002-0.008 ms on VNNI. Take the
    // first that is not AMX.
    constexpr int64_t kAmxMinMacs = int64_t(1) << 22;
    if ((k < 64 || s.macs < kAmxMinMacs) &&
        std::string(pd.impl_info_str()).find("amx") != std::string::npos) {
      dnnl::convolution_forward::primitive_desc other = pd;
      while (other.next_impl())
        if (std::string(other.impl_info_str()).find("amx") == std::string::npos) {
          pd = other;
          break;
        }
    }
    // The weights reorder also computes what oneDNN needs for the source zero point.
    s.build(pd,
            memory::desc(wdims, memory::data_type::s8,
                         group > 1 ? memory::format_tag::goihw : memory::format_tag::oihw),
            wd.data());
    if (!s.split && !signed_source) {
      s.src_plain = memory(u8_md(src_dims, memory::format_tag::nchw), eng, DNNL_MEMORY_NONE);
      s.src_nhwc = memory(u8_md(src_dims, memory::format_tag::nhwc), eng, DNNL_MEMORY_NONE);
      s.src_reorder = dnnl::reorder(s.src_plain, s.src_nhwc);
    }
    s.src_at = s.layout.add(size_t(s.cs * g.x[2] * g.x[3]));
    s.dst_at = s.layout.add(size_t(oc * rows * g.y[3]) * 4);
    if (s.pw.any_comp) {
      s.sums_at = s.layout.add(size_t(group * g.x[2] * g.x[3]) * 4);
      s.box_at = s.layout.add(size_t(group * g.y[2] * g.y[3]) * 4);
    }
    s.pad_at = s.layout.add(pd.scratchpad_desc().get_size());
    return 0;
  });
}

Int8Conv::~Int8Conv() = default;

size_t Int8Conv::scratch_bytes() const {
  return s_->layout.bytes;
}

bool Int8Conv::split() const {
  return s_->split;
}

bool Int8Conv::direct() const {
  return s_->direct != nullptr;
}

void Int8Conv::run(const KernelContext& ctx, const void* x, bool x_channels_last,
                   int32_t x_zero_point, const Int8Output& out, void* scratch) const {
  const State& s = *s_;
  const int64_t n = g_.x[0], c = g_.x[1], oc = g_.y[1], group = g_.group, cg = c / group;
  const int64_t ih = g_.x[2], iw = g_.x[3], oh = g_.y[2], ow = g_.y[3], kh = g_.w[2], kw = g_.w[3];
  const int64_t pixels = ih * iw, opixels = oh * ow;
  int32_t* acc = piece<int32_t>(scratch, s.dst_at);
  int32_t* sums = piece<int32_t>(scratch, s.sums_at);
  int32_t* box = s.pw.any_comp ? piece<int32_t>(scratch, s.box_at) : nullptr;
  // NHWC results (from, in scratch) into the NCHW output.
  auto to_nchw = [&](void* from, void* to) {
    dnnl_call(ctx.node(), "reorder to NCHW", [&] {
      limit_dnnl_threads(ctx, s.macs, kMacsPerThread);
      s.out_nhwc.set_data_handle(from);
      s.out_plain.set_data_handle(to);
      s.out_reorder.execute(s.stream, s.out_nhwc, s.out_plain);
      s.stream.wait();
      return 0;
    });
  };
  // An unsigned NHWC source oneDNN reads as it is; the rest is converted first.
  const bool in_place = x_channels_last && !s.split && !s.signed_source;
  for (int64_t img = 0; img < n; ++img) {
    const uint8_t* xi = static_cast<const uint8_t*>(x) + img * c * pixels;
    const int64_t at = img * oc * opixels;
    if (s.direct) {
      uint8_t* y = static_cast<uint8_t*>(out.bytes) + at;
      uint8_t* bytes_to = out.channels_last ? y : piece<uint8_t>(scratch, s.bytes_at);
      Int8Output image = out;
      if (image.residual) image.residual += at;
      s.direct->run(ctx, xi, x_channels_last, s.signed_source, x_zero_point, image, bytes_to,
                    scratch);
      if (!out.channels_last) to_nchw(bytes_to, y);
      continue;
    }
    uint8_t* src = in_place ? const_cast<uint8_t*>(xi) : piece<uint8_t>(scratch, s.src_at);
    if (!in_place && !x_channels_last && s.src_reorder) {
      dnnl_call(ctx.node(), "reorder to NHWC", [&] {
        limit_dnnl_threads(ctx, s.macs, kMacsPerThread);
        s.src_plain.set_data_handle(const_cast<uint8_t*>(xi));
        s.src_nhwc.set_data_handle(src);
        s.src_reorder.execute(s.stream, s.src_plain, s.src_nhwc);
        s.stream.wait();
        return 0;
      });
    } else if (!in_place) {
      parallel_items(ctx, pixels, c, 1 << 16, [&](int64_t b, int64_t e) {
        to_channels_last(xi, x_channels_last, c, pixels, b, e, group, s.signed_source, s.split,
                         s.cs, src + b * s.cs);
      });
    }
    if (box) {
      // Window sums of the channel sums of (x - x_zp); padding adds nothing.
      const int32_t base = -int32_t(cg) * x_zero_point;
      if (x_channels_last) {
        parallel_items(ctx, pixels, c, 1 << 16, [&](int64_t b, int64_t e) {
          sum_pixels_any(xi, s.signed_source, c, cg, group, base, pixels, b, e, sums);
        });
      } else {
        parallel_items(ctx, group, cg * pixels, 1 << 16, [&](int64_t b, int64_t e) {
          for (int64_t gi = b; gi < e; ++gi) {
            std::fill_n(sums + gi * pixels, pixels, base);
            for (int64_t k = 0; k < cg; ++k)
              add_bytes_any(sums + gi * pixels, xi + (gi * cg + k) * pixels, s.signed_source,
                            pixels);
          }
        });
      }
      // On the calling thread: a few vector adds per output pixel are not worth a
      // parallel region (each one waits for its slowest thread on busy cores).
      for (int64_t r = 0; r < group * oh; ++r) {
        const int64_t gi = r / oh, y = r % oh;
        const int32_t* sg = sums + gi * pixels;
        int32_t* bo = box + gi * opixels + y * ow;
        std::fill_n(bo, ow, 0);
        for (int64_t a = 0; a < kh; ++a) {
          const int64_t yi = y * g_.stride[0] - g_.pad_l[0] + a * (g_.dil[0] + 1);
          if (yi < 0 || yi >= ih) continue;
          for (int64_t t = 0; t < kw; ++t) {
            // Output columns whose tap t falls inside the row.
            const int64_t off = t * (g_.dil[1] + 1) - g_.pad_l[1], st = g_.stride[1];
            const int64_t lo = std::max<int64_t>(0, (-off + st - 1) / st);
            const int64_t hi = std::min<int64_t>(ow, (iw - off + st - 1) / st);
            if (st == 1) {
              if (hi > lo) add_ints_any(bo + lo, sg + yi * iw + lo + off, hi - lo);
            } else {
              for (int64_t xo = lo; xo < hi; ++xo) bo[xo] += sg[yi * iw + xo * st + off];
            }
          }
        }
      }
    }
    // The results in NHWC: into the output, or over the sums (bytes: into their own
    // buffer) and then reordered into it.
    if (s.band) {
      // Band by band: the sums of `band` rows, requantized while in cache.
      uint8_t* bytes_to = out.channels_last ? static_cast<uint8_t*>(out.bytes) + at
                                            : piece<uint8_t>(scratch, s.bytes_at);
      const int64_t bp = s.band * ow;
      for (int64_t r0 = 0; r0 < oh; r0 += s.band) {
        s.run(ctx, "8-bit convolution", s.signed_source ? x_zero_point + 128 : x_zero_point,
              src + r0 * iw * s.cs, acc, piece<char>(scratch, s.pad_at));
        parallel_items(ctx, bp, oc, 1 << 15, [&](int64_t b, int64_t e) {
          finish_rows(acc, nullptr, bp, oc, group, s.pw.comp, out, nullptr, nullptr,
                      bytes_to + r0 * ow * oc,
                      out.residual ? out.residual + at + r0 * ow * oc : nullptr, b, e);
        });
      }
      if (!out.channels_last) to_nchw(bytes_to, static_cast<uint8_t*>(out.bytes) + at);
      continue;
    }
    s.run(ctx, "8-bit convolution", s.signed_source ? x_zero_point + 128 : x_zero_point, src, acc,
          piece<char>(scratch, s.pad_at));
    int32_t* sums_to = out.sums ? (out.channels_last ? out.sums + at : acc) : nullptr;
    float* values_to =
        out.values ? (out.channels_last ? out.values + at : reinterpret_cast<float*>(acc)) : nullptr;
    uint8_t* bytes_to =
        out.bytes ? (out.channels_last ? static_cast<uint8_t*>(out.bytes) + at
                                       : piece<uint8_t>(scratch, s.bytes_at))
                  : nullptr;
    parallel_items(ctx, opixels, oc, 1 << 15, [&](int64_t b, int64_t e) {
      finish_rows(acc, box, opixels, oc, group, s.pw.comp, out, sums_to, values_to, bytes_to,
                  out.residual ? out.residual + at : nullptr, b, e);
    });
    if (!out.channels_last)
      to_nchw(bytes_to ? static_cast<void*>(bytes_to) : acc,
              out.values  ? static_cast<void*>(out.values + at)
              : out.bytes ? static_cast<void*>(static_cast<uint8_t*>(out.bytes) + at)
                          : static_cast<void*>(out.sums + at));
  }
}

// ---------------------------------------------------------------------------------------
// Int8MatMul

struct Int8MatMul::State : ZeroPointPrimitive {
  bool split = false, signed_a = false;
  int64_t ks = 0;  // K, or 2K when split
  PreparedWeights pw;
  // Scratch: A shifted to unsigned and/or read twice, the sums (unless they are the
  // output), A's row sums for the compensation, oneDNN's scratchpad.
  ScratchLayout layout;
  size_t a_at = 0, dst_at = 0, rows_at = 0, pad_at = 0;
};

Int8MatMul::Int8MatMul(const Node& node, int64_t rows, const Tensor& b, const Tensor* b_zero_point,
                       bool signed_a)
    : rows_(rows), k_(b.shape()[0]), n_(b.shape()[1]), s_(std::make_unique<State>()) {
  State& s = *s_;
  s.pw = prepare_weights(b, b_zero_point, n_);
  s.split = int8_dot() == Int8Dot::none && !pair_safe(s.pw.w8);
  s.signed_a = signed_a;
  s.ks = s.split ? 2 * k_ : k_;
  // B [K, N]: when split, the hi rows and then the lo rows.
  std::vector<int8_t> wd(size_t(s.ks * n_));
  for (int64_t i = 0; i < k_ * n_; ++i) {
    const int8_t v = s.pw.w8[size_t(i)];
    if (s.split) {
      wd[size_t(i)] = half_hi(v);
      wd[size_t(k_ * n_ + i)] = half_lo(v);
    } else {
      wd[size_t(i)] = v;
    }
  }
  s.macs = rows_ * s.ks * n_;
  limit_dnnl_threads_at_build(s.macs, kMacsPerThread);
  dnnl_call(node, "8-bit matmul setup", [&] {
    const auto& eng = dnnl_engine();
    s.stream = dnnl::stream(eng);
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(
            u8_md({rows_, s.ks}, memory::format_tag::ab),
            memory::desc({s.ks, n_}, memory::data_type::s8, memory::format_tag::any),
            memory::desc({rows_, n_}, memory::data_type::s32, memory::format_tag::ab)),
        zero_point_attr(), eng);
    s.build(pd, memory::desc({s.ks, n_}, memory::data_type::s8, memory::format_tag::ab), wd.data());
    if (s.split || s.signed_a) s.a_at = s.layout.add(size_t(rows_ * s.ks));
    s.dst_at = s.layout.add(size_t(rows_ * n_) * 4);
    s.rows_at = s.layout.add(size_t(rows_) * 4);
    s.pad_at = s.layout.add(pd.scratchpad_desc().get_size());
    return 0;
  });
}

Int8MatMul::~Int8MatMul() = default;

size_t Int8MatMul::scratch_bytes() const {
  return s_->layout.bytes;
}

bool Int8MatMul::split() const {
  return s_->split;
}

void Int8MatMul::run(const KernelContext& ctx, const void* a, int32_t a_zero_point,
                     const Int8Output& out, void* scratch) const {
  const State& s = *s_;
  const uint8_t* a8 = static_cast<const uint8_t*>(a);
  const bool convert = s.split || s.signed_a;
  uint8_t* a_buf = piece<uint8_t>(scratch, s.a_at);
  int32_t* row_sums = piece<int32_t>(scratch, s.rows_at);
  if (convert || s.pw.any_comp)
    parallel_items(ctx, rows_, k_, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const uint8_t* row = a8 + r * k_;
        if (convert) {
          const uint8_t mask = s.signed_a ? 0x80 : 0;
          uint8_t* o = a_buf + r * s.ks;
          for (int64_t k = 0; k < k_; ++k) o[k] = row[k] ^ mask;
          if (s.split) std::memcpy(o + k_, o, size_t(k_));
        }
        if (s.pw.any_comp) {
          int32_t sum = 0;
          for (int64_t k = 0; k < k_; ++k)
            sum += s.signed_a ? int32_t(int8_t(row[k])) : int32_t(row[k]);
          row_sums[r] = sum - int32_t(k_) * a_zero_point;
        }
      }
    });
  int32_t* sums = out.sums ? out.sums : piece<int32_t>(scratch, s.dst_at);
  s.run(ctx, "8-bit matmul", s.signed_a ? a_zero_point + 128 : a_zero_point,
        convert ? static_cast<const void*>(a_buf) : a, sums, piece<char>(scratch, s.pad_at));
  if (out.sums && !s.pw.any_comp) return;
  parallel_items(ctx, rows_, n_, 1 << 15, [&](int64_t b, int64_t e) {
    if (out.bytes && out.period && !s.pw.any_comp)
      return requantize_rows(sums + b * n_, (e - b) * n_, out,
                             static_cast<uint8_t*>(out.bytes) + b * n_);
    for (int64_t r = b; r < e; ++r)
      finish_row(sums + r * n_, n_, s.pw.any_comp ? row_sums[r] : 0, s.pw.comp.data(), out, 0,
                 out.sums ? sums + r * n_ : nullptr, out.values ? out.values + r * n_ : nullptr,
                 out.bytes ? static_cast<uint8_t*>(out.bytes) + r * n_ : nullptr);
  });
}

// ---------------------------------------------------------------------------------------
// Kernels

namespace {

bool is_8bit(std::optional<DType> t) {
  return t == DType::u8 || t == DType::i8;
}

std::optional<std::string> need_8bit(const KernelBuildInfo& info, int i) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return "input " + std::to_string(i) + " is missing";
  if (!is_8bit(in.dtype)) return "input " + std::to_string(i) + " is not 8-bit";
  return std::nullopt;
}

// A zero point read at run time: absent, or one value of `dtype`.
std::optional<std::string> need_scalar_zero_point(const KernelBuildInfo& info, int i,
                                                  std::optional<DType> dtype) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return std::nullopt;
  if (in.dtype != dtype)
    return "zero point " + std::to_string(i) + " differs in type from its tensor";
  if (!in.shape || shape_numel(*in.shape) != 1)
    return "zero point " + std::to_string(i) + " is not one value";
  return std::nullopt;
}

// A constant input of `dtype`: one value, or one per channel (any shape of that size).
std::optional<std::string> need_constant_per_channel(const KernelBuildInfo& info, int i,
                                                     std::optional<DType> dtype, int64_t channels) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return std::nullopt;
  if (!in.constant) return "input " + std::to_string(i) + " is not a constant";
  if (in.constant->dtype() != dtype) return "input " + std::to_string(i) + " has the wrong type";
  if (in.constant->numel() != 1 && in.constant->numel() != channels)
    return "input " + std::to_string(i) + " is neither one value nor one per output channel";
  return std::nullopt;
}

int32_t zero_point_at(const KernelContext& ctx, int i) {
  const Tensor* z = ctx.input(i);
  if (!z) return 0;
  return z->dtype() == DType::u8 ? int32_t(z->data<uint8_t>()[0]) : int32_t(z->data<int8_t>()[0]);
}

// ConvInteger and slim:DynamicQuantizeConv: a 2-D convolution of an 8-bit (or, fused, f32)
// source by constant 8-bit weights.
std::optional<std::string> int8_conv_geometry(const KernelBuildInfo& info, bool fused,
                                              ConvGeometry* g) {
  if (info.node.outputs.size() != 1) return std::string("expects one output");
  if (auto r = fused ? need_f32(info, 0) : need_8bit(info, 0)) return r;
  if (auto r = need_static(info, 0)) return r;
  if (auto r = need_8bit(info, 1)) return r;
  if (!info.input(1).constant) return std::string("the weights are not constant");
  if (info.input(0).shape->size() != 4 || info.input(1).constant->rank() != 4)
    return std::string("2-D convolutions (4-D tensors) only");
  if (auto r =
          conv_geometry(info.node, *info.input(0).shape, info.input(1).constant->shape(), false, g))
    return r;
  return std::nullopt;
}

class ConvIntegerKernel final : public OpKernel {
 public:
  ConvIntegerKernel(const KernelBuildInfo& info, const ConvGeometry& g)
      : x_dtype_(*info.input(0).dtype),
        conv_(info.node, g, *info.input(1).constant, info.input(3).constant, x_dtype_ == DType::i8,
              DType::i32) {}
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::i32;
    *shape = conv_.geometry().y;
    return i == 0;
  }
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, conv_.geometry().x, x_dtype_);
    Int8Output out;
    out.sums = ctx.output(0, DType::i32, conv_.geometry().y).data<int32_t>();
    conv_.run(ctx, ctx.required_input(0).raw_data(), false, zero_point_at(ctx, 2), out,
              thread_scratch(conv_.scratch_bytes()));
  }

 private:
  DType x_dtype_;
  Int8Conv conv_;
};

KernelDef conv_integer_def() {
  KernelDef def;
  def.op_type = "ConvInteger";
  def.since_version = 10;
  def.claim = [](const KernelBuildInfo& info) {
    ConvGeometry g;
    if (auto r = int8_conv_geometry(info, false, &g)) return Claim::no(*r);
    if (auto r = need_scalar_zero_point(info, 2, info.input(0).dtype)) return Claim::no(*r);
    if (auto r = need_constant_per_channel(info, 3, info.input(1).dtype, g.y[1]))
      return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    ConvGeometry g;
    int8_conv_geometry(info, false, &g);
    return std::make_unique<ConvIntegerKernel>(info, g);
  };
  return def;
}

class MatMulIntegerKernel final : public OpKernel {
 public:
  MatMulIntegerKernel(const KernelBuildInfo& info, int64_t rows)
      : a_shape_(*info.input(0).shape),
        a_dtype_(*info.input(0).dtype),
        mm_(info.node, rows, *info.input(1).constant, info.input(3).constant,
            a_dtype_ == DType::i8) {
    y_shape_ = a_shape_;
    y_shape_.back() = info.input(1).constant->shape()[1];
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::i32;
    *shape = y_shape_;
    return i == 0;
  }
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, a_shape_, a_dtype_);
    Int8Output out;
    out.sums = ctx.output(0, DType::i32, y_shape_).data<int32_t>();
    mm_.run(ctx, ctx.required_input(0).raw_data(), zero_point_at(ctx, 2), out,
            thread_scratch(mm_.scratch_bytes()));
  }

 private:
  Shape a_shape_, y_shape_;
  DType a_dtype_;
  Int8MatMul mm_;
};

KernelDef matmul_integer_def() {
  KernelDef def;
  def.op_type = "MatMulInteger";
  def.since_version = 10;
  def.claim = [](const KernelBuildInfo& info) {
    if (info.node.outputs.size() != 1) return Claim::no("expects one output");
    for (int i : {0, 1})
      if (auto r = need_8bit(info, i)) return Claim::no(*r);
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    const Tensor* b = info.input(1).constant;
    if (!b || b->rank() != 2) return Claim::no("B is not a constant matrix");
    const Shape& a = *info.input(0).shape;
    if (a.size() < 2 || a.back() != b->shape()[0])
      return Claim::no("A is not a [..., M, K] matrix for B");
    if (auto r = need_scalar_zero_point(info, 2, info.input(0).dtype)) return Claim::no(*r);
    if (info.input(3).constant && info.input(3).constant->rank() > 1)
      return Claim::no("b_zero_point is not 1-D");
    if (auto r = need_constant_per_channel(info, 3, info.input(1).dtype, b->shape()[1]))
      return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    const Shape& a = *info.input(0).shape;
    return std::make_unique<MatMulIntegerKernel>(info, shape_numel(a) / a.back());
  };
  return def;
}

// slim:DynamicQuantizeConv (fused_ops.h): the source's range, scale and zero point as
// DynamicQuantizeLinear computes them, the source quantized into a buffer of the kernel
// (in the layout it arrived in: quantization is elementwise), the 8-bit convolution, and
// its sums dequantized by x_scale * w_scale[oc] with the bias and Relu, as the unfused
// nodes round them. It reads and writes f32 in NCHW or NHWC, whichever its neighbours
// agree on (a chain of them runs channels-last throughout).
// A convolution that reads x and writes y NCHW, or NHWC (layouts nhwc_x_ and nhwc_y_, set by
// the kernel) where its neighbours agree, so chains of them hand data on channels-last.
class ChannelsLastConv : public OpKernel {
 public:
  uint64_t private_output_layout(int i) const override { return i == 0 ? nhwc_y_ : 0; }
  bool accepts_private_input(int i, uint64_t layout) const override { return i == 0 && layout == nhwc_x_; }
  uint64_t wanted_input_layout(int i) const override { return i == 0 ? nhwc_x_ : 0; }
  bool can_write_output_in(int i, uint64_t layout) const override { return i == 0 && layout == nhwc_y_; }
  void use_private_output(int i, uint64_t) override { y_channels_last_ = i == 0; }
  void use_private_input(int i, uint64_t) override { x_channels_last_ = x_channels_last_ || i == 0; }

 protected:
  uint64_t nhwc_x_ = 0, nhwc_y_ = 0;
  bool x_channels_last_ = false, y_channels_last_ = false;
};

class DynamicQuantizeConvKernel final : public ChannelsLastConv {
 public:
  DynamicQuantizeConvKernel(const KernelBuildInfo& info, const ConvGeometry& g, ActivationSpec act)
      : conv_(info.node, g, *info.input(1).constant, info.input(2).constant, false, DType::f32),
        relu_(act.kind == Activation::relu) {
    const int64_t oc = g.y[1];
    const Tensor ws = info.input(3).constant->contiguous();
    for (int64_t k = 0; k < oc; ++k) w_scale_.push_back(ws.data<float>()[ws.numel() == 1 ? 0 : k]);
    if (info.has_input(4)) {
      const Tensor b = info.input(4).constant->contiguous();
      bias_.assign(b.data<float>(), b.data<float>() + oc);
    }
    scale_.resize(size_t(oc));
    q_bytes_ = (size_t(shape_numel(g.x)) + 63) / 64 * 64;
    nhwc_x_ = layout_tag(f32_md(g.x, memory::format_tag::nhwc));
    nhwc_y_ = layout_tag(f32_md(g.y, memory::format_tag::nhwc));
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = conv_.geometry().y;
    return i == 0;
  }

  void compute(KernelContext& ctx) const override {
    const ConvGeometry& g = conv_.geometry();
    check_input_shape(ctx, 0, g.x);
    uint8_t* q = static_cast<uint8_t*>(thread_scratch(q_bytes_ + conv_.scratch_bytes()));
    const ref::DynamicQuantParams p =
        dynamic_quantize(ctx, ctx.required_input(0).data<float>(), shape_numel(g.x), q);
    // The Mul of the two scales, then the Mul of the sums by it: each rounded to f32.
    for (size_t k = 0; k < scale_.size(); ++k) scale_[k] = p.scale * w_scale_[k];
    Int8Output out;
    out.values = ctx.output(0, DType::f32, g.y).data<float>();
    out.scale = scale_.data();
    out.bias = bias_.empty() ? nullptr : bias_.data();
    out.relu = relu_;
    out.channels_last = y_channels_last_;
    conv_.run(ctx, q, x_channels_last_, p.zero_point, out, q + q_bytes_);
  }

 private:
  Int8Conv conv_;
  bool relu_;
  std::vector<float> w_scale_, bias_;
  mutable std::vector<float> scale_;
  size_t q_bytes_ = 0;  // the quantized source, at the start of the scratch
};

std::optional<std::string> dynamic_quantize_conv_setup(const KernelBuildInfo& info, ConvGeometry* g,
                                                       ActivationSpec* act) {
  if (auto r = int8_conv_geometry(info, true, g)) return r;
  const int64_t oc = g->y[1];
  if (auto r = need_constant_per_channel(info, 2, info.input(1).dtype, oc)) return r;
  if (!info.has_input(3)) return std::string("missing w_scale");
  if (auto r = need_constant_per_channel(info, 3, DType::f32, oc)) return r;
  if (info.has_input(4)) {
    if (auto r = need_constant_per_channel(info, 4, DType::f32, oc)) return r;
    if (info.input(4).constant->numel() != oc)
      return std::string("the bias is not one value per output channel");
  }
  if (info.inputs.size() > 5) return std::string("too many inputs");
  if (!parse_fused_activation(info.node, act)) return std::string("unknown activation");
  if ((act->kind != Activation::none && act->kind != Activation::relu) || act->has_affine() ||
      act->has_clamp())
    return std::string("fuses Relu only");
  return std::nullopt;
}

KernelDef dynamic_quantize_conv_def() {
  KernelDef def;
  def.op_type = "DynamicQuantizeConv";
  def.domain = kFusedDomain;
  def.since_version = kFusedOpset;
  def.claim = [](const KernelBuildInfo& info) {
    ConvGeometry g;
    ActivationSpec act;
    if (auto r = dynamic_quantize_conv_setup(info, &g, &act)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    ConvGeometry g;
    ActivationSpec act;
    dynamic_quantize_conv_setup(info, &g, &act);
    return std::make_unique<DynamicQuantizeConvKernel>(info, g, act);
  };
  return def;
}

// ---------------------------------------------------------------------------------------
// QLinearConv and QLinearMatMul (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, bias]):
// what fuse_qdq makes of DequantizeLinear -> Conv/MatMul -> QuantizeLinear, and what
// QOperator files hold. Scales and zero points are constants, so the requantization is
// fixed at build: ref's and ONNX Runtime's float(sum + bias) * (x_scale * w_scale / y_scale).

struct Requant {
  // Per output channel, repeated to `period` elements (Int8Output::period).
  std::vector<float> scale;
  std::vector<int32_t> bias;
  int64_t period = 0;
  int32_t x_zp = 0, y_zp = 0;
  DType x = DType::u8, y = DType::u8;
};

// Checks the parameters of a QLinear node with `channels` outputs and fills *r.
std::optional<std::string> qlinear_params(const KernelBuildInfo& info, int64_t channels,
                                          Requant* r) {
  if (info.node.outputs.size() != 1) return std::string("expects one output");
  for (int i : {0, 3})
    if (auto e = need_8bit(info, i)) return e;
  if (auto e = need_static(info, 0)) return e;
  if (!info.input(3).constant) return std::string("the weights are not constant");
  for (int i : {1, 6})
    if (!info.has_input(i)) return "input " + std::to_string(i) + " is missing";
  if (auto e = need_constant_per_channel(info, 1, DType::f32, 1)) return e;
  if (auto e = need_constant_per_channel(info, 2, info.input(0).dtype, 1)) return e;
  if (auto e = need_constant_per_channel(info, 4, DType::f32, channels)) return e;
  if (auto e = need_constant_per_channel(info, 5, info.input(3).dtype, channels)) return e;
  if (auto e = need_constant_per_channel(info, 6, DType::f32, 1)) return e;
  if (info.has_input(7) && !is_8bit(info.input(7).dtype))
    return std::string("y_zero_point is not 8-bit");
  if (auto e = need_constant_per_channel(info, 7, info.input(7).dtype, 1)) return e;
  if (info.has_input(8)) {
    if (auto e = need_constant_per_channel(info, 8, DType::i32, channels)) return e;
    if (info.input(8).constant->numel() != channels)
      return std::string("the bias is not one value per output channel");
  }
  // (slim:QLinearConvLookup's and slim:QLinearConvAdd's inputs from 9 on are checked by
  // their claims.)
  const size_t most = info.node.domain != kFusedDomain           ? 9
                      : info.node.op_type == "QLinearConvLookup" ? 10
                                                                 : 17;
  if (info.inputs.size() > most) return std::string("too many inputs");
  auto value = [&](int i) { return info.input(i).constant->contiguous(); };
  auto zero_point = [&](int i) {
    if (!info.has_input(i)) return int32_t(0);
    const Tensor z = value(i);
    return z.dtype() == DType::u8 ? int32_t(z.data<uint8_t>()[0]) : int32_t(z.data<int8_t>()[0]);
  };
  r->x = *info.input(0).dtype;
  r->y = info.has_input(7) ? *info.input(7).dtype : DType::u8;
  r->x_zp = zero_point(2);
  r->y_zp = zero_point(7);
  const float xs = value(1).data<float>()[0], ys = value(6).data<float>()[0];
  const Tensor ws = value(4);
  r->period = std::lcm(channels, int64_t(16));
  r->scale.resize(size_t(r->period));
  for (int64_t c = 0; c < r->period; ++c)
    r->scale[size_t(c)] = xs * ws.data<float>()[ws.numel() == 1 ? 0 : c % channels] / ys;
  if (info.has_input(8)) {
    const Tensor b = value(8);
    for (int64_t c = 0; c < r->period; ++c) r->bias.push_back(b.data<int32_t>()[c % channels]);
  }
  return std::nullopt;
}

Int8Output requantized(const Requant& r, void* bytes) {
  Int8Output out;
  out.bytes = bytes;
  out.scale = r.scale.data();
  out.qbias = r.bias.empty() ? nullptr : r.bias.data();
  out.zero_point = r.y_zp;
  out.period = r.period;
  out.bytes_signed = r.y == DType::i8;
  return out;
}

memory::desc bytes_md(const Shape& s, DType t, memory::format_tag f) {
  return memory::desc(memory::dims(s.begin(), s.end()),
                      t == DType::i8 ? memory::data_type::s8 : memory::data_type::u8, f);
}

}  // namespace

uint64_t int8_nhwc_layout(const Shape& nchw, DType t) {
  return layout_tag(bytes_md(nchw, t, memory::format_tag::nhwc));
}

namespace {

// Reads and writes NCHW, or NHWC where its neighbours agree: a chain of them (and
// 8-bit MaxPool and Concat between) hands bytes on channels-last, as oneDNN computes them.
// QLinearConv, slim:QLinearConvLookup (its bytes then through a 256-entry table, in
// the table's type: the activation after it, which fuse_qlinear_conv_lookup folds in) and
// slim:QLinearConvAdd (then, with or without a table, the residual slim:QLinearAdd after
// it: fuse_residual_qlinear_add), whose residual B is read channels-last where its producer
// writes so and transposed into the kernel's scratch otherwise.
class QLinearConvKernel final : public ChannelsLastConv {
 public:
  QLinearConvKernel(const KernelBuildInfo& info, const ConvGeometry& g, Requant r)
      : conv_(info.node, g, *info.input(3).constant, info.input(5).constant, r.x == DType::i8, r.y),
        r_(std::move(r)),
        out_(r_.y) {
    if (info.has_input(9)) {
      const Tensor t = info.input(9).constant->contiguous();
      std::memcpy(table_.data(), t.raw_data(), 256);
      out_ = t.dtype();
      has_table_ = true;
    }
    if (info.inputs.size() == 17) {
      add_ = true;
      add_a_ = qparams(info, 10);
      add_b_ = qparams(info, 13);
      add_c_ = qparams(info, 15);
      nhwc_b_ = int8_nhwc_layout(g.y, *info.input(12).dtype);
      out_ = add_c_.is_signed ? DType::i8 : DType::u8;
    }
    nhwc_x_ = int8_nhwc_layout(g.x, r_.x);
    nhwc_y_ = int8_nhwc_layout(g.y, out_);
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = out_;
    *shape = conv_.geometry().y;
    return i == 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    return i == 12 ? add_ && layout == nhwc_b_ : ChannelsLastConv::accepts_private_input(i, layout);
  }
  uint64_t wanted_input_layout(int i) const override {
    return i == 12 ? (add_ ? nhwc_b_ : 0) : ChannelsLastConv::wanted_input_layout(i);
  }
  void use_private_input(int i, uint64_t layout) override {
    if (i == 12)
      b_channels_last_ = true;
    else
      ChannelsLastConv::use_private_input(i, layout);
  }
  void compute(KernelContext& ctx) const override {
    const ConvGeometry& g = conv_.geometry();
    check_input_shape(ctx, 0, g.x, r_.x);
    Int8Output out = requantized(r_, ctx.output(0, out_, g.y).raw_data());
    out.channels_last = y_channels_last_;
    if (has_table_) out.table = table_.data();
    const size_t conv_bytes = conv_.scratch_bytes();
    auto* scratch = static_cast<uint8_t*>(
        thread_scratch(conv_bytes + (add_ && !b_channels_last_ ? size_t(shape_numel(g.y)) : 0)));
    if (add_) {
      const Tensor& b = ctx.required_input(12);
      if (b.shape() != g.y)
        ctx.fail(ErrorCode::invalid_argument,
                 "B " + b.describe() + " does not have the output's shape");
      out.residual = static_cast<const uint8_t*>(b.raw_data());
      if (!b_channels_last_) {
        bytes_to_nhwc(out.residual, scratch + conv_bytes, g.y[0], g.y[1], g.y[2] * g.y[3]);
        out.residual = scratch + conv_bytes;
      }
      out.add_a = add_a_;
      out.add_b = add_b_;
      out.add_c = add_c_;
    }
    conv_.run(ctx, ctx.required_input(0).raw_data(), x_channels_last_, r_.x_zp, out, scratch);
  }

 private:
  Int8Conv conv_;
  Requant r_;
  DType out_;
  std::array<uint8_t, 256> table_{};
  bool has_table_ = false;
  bool add_ = false, b_channels_last_ = false;
  QParams add_a_, add_b_, add_c_;
  uint64_t nhwc_b_ = 0;
};

std::optional<std::string> qlinear_conv_setup(const KernelBuildInfo& info, ConvGeometry* g,
                                              Requant* r) {
  if (auto e = need_8bit(info, 0)) return e;
  if (auto e = need_static(info, 0)) return e;
  const Tensor* w = info.input(3).constant;
  if (!w || !is_8bit(w->dtype())) return std::string("the weights are not 8-bit constants");
  if (info.input(0).shape->size() != 4 || w->rank() != 4)
    return std::string("2-D convolutions (4-D tensors) only");
  if (auto e = conv_geometry(info.node, *info.input(0).shape, w->shape(), false, g)) return e;
  return qlinear_params(info, g->y[1], r);
}

// What a QLinearConv kernel does after requantizing.
enum class ConvEpilogue { none, lookup, add };

// Why slim:QLinearConvLookup's table (input 9) or slim:QLinearConvAdd's inputs from 9 on
// do not fit the convolution's output `y` (bytes of type yt), or nothing.
std::optional<std::string> epilogue_inputs(const KernelBuildInfo& info, ConvEpilogue e,
                                           const Shape& y, DType yt) {
  if (e == ConvEpilogue::none) return std::nullopt;
  if (info.inputs.size() != (e == ConvEpilogue::lookup ? 10u : 17u))
    return std::string(e == ConvEpilogue::lookup
                           ? "takes QLinearConv's 9 inputs and a table"
                           : "takes QLinearConv's 9 inputs, a table and QLinearAdd's 7 after A");
  if (info.has_input(9) || e == ConvEpilogue::lookup) {
    const Tensor* t = info.input(9).constant;
    if (!t || !is_8bit(t->dtype()) || t->numel() != 256)
      return std::string("the table is not 256 constant 8-bit values");
    yt = t->dtype();
  }
  if (e == ConvEpilogue::lookup) return std::nullopt;
  for (int i : {10, 13, 15}) {
    const Tensor* s = info.input(i).constant;
    const Tensor* z = info.input(i + 1).constant;
    if (!s || s->dtype() != DType::f32 || s->numel() != 1 || !z || !is_8bit(z->dtype()) ||
        z->numel() != 1)
      return std::string("the Add's scales and zero points must be constant scalars");
  }
  if (info.input(11).constant->dtype() != yt)
    return std::string("A_zero_point differs in type from the convolution's bytes");
  if (auto r = need_8bit(info, 12)) return r;
  if (auto r = need_static(info, 12)) return r;
  if (*info.input(12).shape != y) return std::string("B does not have the output's shape");
  if (info.input(14).constant->dtype() != *info.input(12).dtype)
    return std::string("B_zero_point differs in type from B");
  return std::nullopt;
}

// QLinearConv, slim:QLinearConvLookup (its 9 inputs and a 256-entry table the kernel
// applies as it requantizes) and slim:QLinearConvAdd (then the residual Add): one kernel.
KernelDef qlinear_conv_def(ConvEpilogue e) {
  KernelDef def;
  def.op_type = e == ConvEpilogue::none     ? "QLinearConv"
                : e == ConvEpilogue::lookup ? "QLinearConvLookup"
                                            : "QLinearConvAdd";
  if (e != ConvEpilogue::none) def.domain = kFusedDomain;
  def.since_version = e != ConvEpilogue::none ? kFusedOpset : 10;
  def.claim = [e](const KernelBuildInfo& info) {
    ConvGeometry g;
    Requant r;
    if (auto why = qlinear_conv_setup(info, &g, &r)) return Claim::no(*why);
    if (auto why = epilogue_inputs(info, e, g.y, r.y)) return Claim::no(*why);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    ConvGeometry g;
    Requant r;
    qlinear_conv_setup(info, &g, &r);
    return std::make_unique<QLinearConvKernel>(info, g, std::move(r));
  };
  return def;
}

class QLinearMatMulKernel final : public OpKernel {
 public:
  QLinearMatMulKernel(const KernelBuildInfo& info, Requant r)
      : a_shape_(*info.input(0).shape),
        r_(std::move(r)),
        mm_(info.node, shape_numel(a_shape_) / a_shape_.back(), *info.input(3).constant,
            info.input(5).constant, r_.x == DType::i8) {
    y_shape_ = a_shape_;
    y_shape_.back() = info.input(3).constant->shape()[1];
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = r_.y;
    *shape = y_shape_;
    return i == 0;
  }
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, a_shape_, r_.x);
    mm_.run(ctx, ctx.required_input(0).raw_data(), r_.x_zp,
            requantized(r_, ctx.output(0, r_.y, y_shape_).raw_data()),
            thread_scratch(mm_.scratch_bytes()));
  }

 private:
  Shape a_shape_, y_shape_;
  Requant r_;
  Int8MatMul mm_;
};

std::optional<std::string> qlinear_matmul_setup(const KernelBuildInfo& info, Requant* r) {
  if (auto e = need_8bit(info, 0)) return e;
  if (auto e = need_static(info, 0)) return e;
  const Tensor* b = info.input(3).constant;
  if (!b || b->rank() != 2) return std::string("B is not a constant matrix");
  const Shape& a = *info.input(0).shape;
  if (a.size() < 2 || a.back() != b->shape()[0])
    return std::string("A is not a [..., M, K] matrix for B");
  for (int i : {4, 5})
    if (info.input(i).constant && info.input(i).constant->rank() > 1)
      return "input " + std::to_string(i) + " is not 1-D";
  if (info.has_input(8)) return std::string("takes 8 inputs");
  return qlinear_params(info, b->shape()[1], r);
}

KernelDef qlinear_matmul_def() {
  KernelDef def;
  def.op_type = "QLinearMatMul";
  def.since_version = 10;
  def.claim = [](const KernelBuildInfo& info) {
    Requant r;
    if (auto e = qlinear_matmul_setup(info, &r)) return Claim::no(*e);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    Requant r;
    qlinear_matmul_setup(info, &r);
    return std::make_unique<QLinearMatMulKernel>(info, std::move(r));
  };
  return def;
}

// slim:QLinearGlobalAveragePool (fused_ops.h): the channel sums of NCHW bytes, or of NHWC
// bytes from a QLinearConv or QLookup, requantized as QLinearConv's sums (bias -n * x_zp,
// scale x_scale / (y_scale * n)). A [N, C, 1, 1] output is the same bytes in either layout.
class QLinearGlobalAveragePoolKernel final : public OpKernel {
 public:
  explicit QLinearGlobalAveragePoolKernel(const KernelBuildInfo& info)
      : x_shape_(*info.input(0).shape), x_(*info.input(0).dtype) {
    y_shape_ = x_shape_;
    std::fill(y_shape_.begin() + 2, y_shape_.end(), 1);
    auto value = [&](int i) { return info.input(i).constant->contiguous(); };
    auto zero_point = [&](int i) {
      const Tensor z = value(i);
      return z.dtype() == DType::u8 ? int32_t(z.data<uint8_t>()[0]) : int32_t(z.data<int8_t>()[0]);
    };
    y_ = value(4).dtype();
    const int64_t n = shape_numel(x_shape_) / (x_shape_[0] * x_shape_[1]);
    scale_.fill(value(1).data<float>()[0] / (value(3).data<float>()[0] * float(n)));
    bias_.fill(-int32_t(n) * zero_point(2));
    out_.scale = scale_.data();
    out_.qbias = bias_.data();
    out_.period = 16;
    out_.zero_point = zero_point(4);
    out_.bytes_signed = y_ == DType::i8;
    if (x_shape_.size() == 4) {
      nhwc_x_ = int8_nhwc_layout(x_shape_, x_);
      nhwc_y_ = int8_nhwc_layout(y_shape_, y_);
    }
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = y_;
    *shape = y_shape_;
    return i == 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    return i == 0 && layout != 0 && layout == nhwc_x_;
  }
  void use_private_input(int i, uint64_t) override { channels_last_ = i == 0; }
  uint64_t private_output_layout(int i) const override { return i == 0 ? nhwc_y_ : 0; }
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, x_shape_, x_);
    const int64_t c = x_shape_[1], pixels = shape_numel(x_shape_) / (x_shape_[0] * c);
    const auto* x = static_cast<const uint8_t*>(ctx.required_input(0).raw_data());
    auto* y = static_cast<uint8_t*>(ctx.output(0, y_, y_shape_).raw_data());
    auto* sums = static_cast<int32_t*>(thread_scratch(size_t(c) * 4));
    const bool is_signed = x_ == DType::i8;
    for (int64_t img = 0; img < x_shape_[0]; ++img, x += c * pixels, y += c) {
      if (channels_last_) {
        std::fill_n(sums, c, 0);
        for (int64_t p = 0; p < pixels; ++p) add_bytes_any(sums, x + p * c, is_signed, c);
      } else {
        sum_planes_any(x, is_signed, c, pixels, sums);
      }
      requantize_rows(sums, c, out_, y);
    }
  }

 private:
  Shape x_shape_, y_shape_;
  DType x_, y_ = DType::u8;
  std::array<float, 16> scale_;
  std::array<int32_t, 16> bias_;
  Int8Output out_;
  uint64_t nhwc_x_ = 0, nhwc_y_ = 0;
  bool channels_last_ = false;
};

KernelDef qlinear_global_average_pool_def() {
  KernelDef def;
  def.op_type = "QLinearGlobalAveragePool";
  def.domain = kFusedDomain;
  def.since_version = kFusedOpset;
  def.claim = [](const KernelBuildInfo& info) {
    if (info.inputs.size() != 5) return Claim::no("takes 5 inputs");
    if (auto e = need_8bit(info, 0)) return Claim::no(*e);
    if (auto e = need_static(info, 0)) return Claim::no(*e);
    if (info.input(0).shape->size() < 3) return Claim::no("X is not [N, C, spatial...]");
    for (int i : {1, 2, 3, 4}) {
      const Tensor* t = info.input(i).constant;
      const bool scale = i == 1 || i == 3;
      if (!t || t->numel() != 1 || (scale ? t->dtype() != DType::f32 : !is_8bit(t->dtype())))
        return Claim::no("scales and zero points must be constant scalars");
    }
    if (info.input(2).constant->dtype() != *info.input(0).dtype)
      return Claim::no("x_zero_point differs in type from X");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<QLinearGlobalAveragePoolKernel>(info);
  };
  return def;
}

}  // namespace

void register_dnnl_int8_kernels(KernelRegistry& r) {
  r.add(qlinear_global_average_pool_def());
  r.add(conv_integer_def());
  r.add(matmul_integer_def());
  r.add(dynamic_quantize_conv_def());
  r.add(qlinear_conv_def(ConvEpilogue::none));
  r.add(qlinear_conv_def(ConvEpilogue::lookup));
  r.add(qlinear_conv_def(ConvEpilogue::add));
  r.add(qlinear_matmul_def());
}

}  // namespace slim::cpu
