// The cpu provider's Resize (opsets 10+) and Upsample: nearest and linear, every
// coordinate transformation and nearest rounding rule, scales or sizes, any rank. The
// taps come from ref's ResizeSpec, at compile time when the roi/scales/sizes inputs are
// constants (else at the first run with their values), so both providers pick the same
// input pixels. The work is separable, as
// the ONNX definition is: resized axes before the last two are done one at a time as
// blends of whole rows, and the last two together, one output row at a time: the one or
// two source rows are blended (vertical), then gathered along the row (horizontal) with
// AVX-512/AVX2 gathers. An output row whose taps equal the previous row's (nearest
// upsampling) is a copy of it. Linear results are rounded to f32 after each axis, so
// they differ from ref's double sums by a few ulps; nearest copies are exact. Bilinear
// resizing of 2-D images (and 4-D NCHW) is ONNX Runtime's four-neighbour sum instead, to
// its bit (see BilinearAxis).
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/dnnl_int8.h"
#include "runtime/cpu/quantize.h"
#include "runtime/cpu/simd.h"
#include "runtime/ref/resize_geometry.h"
#include "slim/core/convert.h"

namespace slim::cpu {
namespace {

using ref::ResizeAxis;
using ref::ResizeSpec;

// One axis as at most two taps per output coordinate: y = w0 * x[i0] + w1 * x[i1], with
// w1 = 0 (and i1 = i0) for a single tap, which then reads x[i0] alone (weight 1 for
// linear, always for nearest) so infinities never meet a zero weight.
struct AxisPlan {
  int64_t in = 1, out = 1;
  bool identity = true;
  std::vector<int32_t> i0, i1;
  std::vector<float> w0, w1;
  std::vector<int64_t> outside;  // output coordinates that take the extrapolation value
  bool same_taps(int64_t a, int64_t b) const {
    return i0[size_t(a)] == i0[size_t(b)] && i1[size_t(a)] == i1[size_t(b)] && w0[size_t(a)] == w0[size_t(b)] &&
           w1[size_t(a)] == w1[size_t(b)];
  }
  bool single(int64_t o) const { return w1[size_t(o)] == 0.f; }
};

// Bilinear resizing of the last two axes as ONNX Runtime's CPU kernel computes it
// (UpsampleBilinear): per output pixel the four neighbours weighted by products of
// per-axis distances, computed in float from ORT's float coordinates and summed in its
// order. ref's separable double sums differ from it by an ulp here and there, which a
// DynamicQuantizeLinear after the Resize turns into a different 8-bit value: quantized
// models that upsample (ISNet's decoder) drifted from ONNX Runtime by the end.
struct BilinearAxis {
  std::vector<int32_t> i1, i2;
  std::vector<float> d1, d2;  // distances to i1 and i2: i1's weight is d2, i2's d1
};

// ORT's float coordinate of output index o (GetOriginalCoordinateFromResizedCoordinate),
// clamped, and its neighbours and distances (SetupUpsampleBilinear).
BilinearAxis bilinear_axis(ref::ResizeSpec::Coord coord, int64_t in, int64_t out, float scale) {
  using Coord = ref::ResizeSpec::Coord;
  BilinearAxis a;
  for (int64_t o = 0; o < out; ++o) {
    const float x = float(o);
    float c = x;
    if (scale != 1.f) {
      switch (coord) {
        case Coord::asymmetric: c = x / scale; break;
        case Coord::pytorch_half_pixel: c = out > 1 ? (x + 0.5f) / scale - 0.5f : 0.f; break;
        case Coord::align_corners: c = out == 1 ? 0.f : x * float(in - 1) / float(out - 1); break;
        default: c = (x + 0.5f) / scale - 0.5f; break;  // half_pixel
      }
    }
    c = std::max(0.f, std::min(c, float(in - 1)));
    const int32_t i1 = std::min(int32_t(c), int32_t(in - 1)), i2 = std::min(i1 + 1, int32_t(in - 1));
    a.i1.push_back(i1);
    a.i2.push_back(i2);
    a.d1.push_back(i1 == i2 ? 0.5f : std::fabs(c - float(i1)));
    a.d2.push_back(i1 == i2 ? 0.5f : std::fabs(c - float(i2)));
  }
  return a;
}

// ---------------------------------------------------------------------------------------
// Row primitives

// y = a0 * r0 + a1 * r1 (a whole row: the vertical step and the leading-axis passes).
template <int W>
SLIM_INLINE void blend_rows(const float* r0, float a0, const float* r1, float a1, float* y, int64_t n) {
  using F = typename Vec<W>::F;
  const F v0 = splat<W>(a0), v1 = splat<W>(a1);
  int64_t i = 0;
  for (; i + W <= n; i += W) store<W>(y + i, load<W>(r0 + i) * v0 + load<W>(r1 + i) * v1);
  for (; i < n; ++i) y[i] = r0[i] * a0 + r1[i] * a1;
}
SLIM_DISPATCH3(blend_rows, (const float* r0, float a0, const float* r1, float a1, float* y, int64_t n),
               (r0, a0, r1, a1, y, n))

void scale_row(const float* r, float a, float* y, int64_t n) {
  if (a == 1.f) {
    if (y != r) std::memcpy(y, r, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = r[i] * a;
}

void gather_scalar(const float* x, const int32_t* idx, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[idx[i]];
}
void interp_scalar(const float* x, const int32_t* i0, const int32_t* i1, const float* w0, const float* w1, float* y,
                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = x[i0[i]] * w0[i];
    y[i] = w1[i] == 0.f ? p : p + x[i1[i]] * w1[i];
  }
}

#if defined(__x86_64__)
// The masked form: GCC 12's plain _mm512_i32gather_ps reads an undefined source vector.
__attribute__((target("avx512f"))) inline __m512 gather16(const float* x, const int32_t* idx) {
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xffff, _mm512_loadu_si512(idx), x, 4);
}
__attribute__((target("avx512f"))) void gather_avx512(const float* x, const int32_t* idx, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, gather16(x, idx + i));
  gather_scalar(x, idx + i, y + i, n - i);
}
__attribute__((target("avx2,fma"))) void gather_avx2(const float* x, const int32_t* idx, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_i32gather_ps(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + i)), 4));
  gather_scalar(x, idx + i, y + i, n - i);
}
__attribute__((target("avx512f"))) void interp_avx512(const float* x, const int32_t* i0, const int32_t* i1,
                                                      const float* w0, const float* w1, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 b = _mm512_loadu_ps(w1 + i);
    const __m512 p = _mm512_mul_ps(gather16(x, i0 + i), _mm512_loadu_ps(w0 + i));
    const __m512 q = _mm512_mul_ps(gather16(x, i1 + i), b);
    const __mmask16 two = _mm512_cmp_ps_mask(b, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    _mm512_storeu_ps(y + i, _mm512_mask_add_ps(p, two, p, q));
  }
  interp_scalar(x, i0 + i, i1 + i, w0 + i, w1 + i, y + i, n - i);
}
__attribute__((target("avx2,fma"))) void interp_avx2(const float* x, const int32_t* i0, const int32_t* i1,
                                                     const float* w0, const float* w1, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 b = _mm256_loadu_ps(w1 + i);
    const __m256i j0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(i0 + i));
    const __m256i j1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(i1 + i));
    const __m256 p = _mm256_mul_ps(_mm256_i32gather_ps(x, j0, 4), _mm256_loadu_ps(w0 + i));
    const __m256 q = _mm256_mul_ps(_mm256_i32gather_ps(x, j1, 4), b);
    const __m256 two = _mm256_cmp_ps(b, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    _mm256_storeu_ps(y + i, _mm256_add_ps(p, _mm256_and_ps(two, q)));
  }
  interp_scalar(x, i0 + i, i1 + i, w0 + i, w1 + i, y + i, n - i);
}
#endif


// One output row of ORT's bilinear sum from input rows r1 and r2 (y's neighbours), the
// products and sums rounded one by one as ORT's (FMA-free) build rounds them. A neighbour
// of weight 0 adds 0, not 0 * x: an infinity there stays out, as in ref.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void bilinear_row_scalar(const BilinearAxis& w, const float* r1, const float* r2, float dy1, float dy2, float* y,
                         int64_t begin, int64_t n) {
  auto term = [](float weight, float x) { return weight == 0.f ? 0.f : weight * x; };
  for (int64_t c = begin; c < n; ++c) {
    const int32_t x1 = w.i1[size_t(c)], x2 = w.i2[size_t(c)];
    const float dx1 = w.d1[size_t(c)], dx2 = w.d2[size_t(c)];
    y[c] = term(dx2 * dy2, r1[x1]) + term(dx1 * dy2, r1[x2]) + term(dx2 * dy1, r2[x1]) + term(dx1 * dy1, r2[x2]);
  }
}

#if defined(__x86_64__)
// weight * x, or 0 where the weight is 0.
__attribute__((target("avx512f"))) inline __m512 bilinear_term16(__m512 weight, const float* r, const int32_t* idx) {
  const __mmask16 none = _mm512_cmp_ps_mask(weight, _mm512_setzero_ps(), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(none, _mm512_mul_ps(weight, gather16(r, idx)), _mm512_setzero_ps());
}
__attribute__((target("avx512f"))) void bilinear_row_avx512(const BilinearAxis& w, const float* r1, const float* r2,
                                                            float dy1, float dy2, float* y, int64_t n) {
  const __m512 vdy1 = _mm512_set1_ps(dy1), vdy2 = _mm512_set1_ps(dy2);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 dx1 = _mm512_loadu_ps(w.d1.data() + c), dx2 = _mm512_loadu_ps(w.d2.data() + c);
    const int32_t *x1 = w.i1.data() + c, *x2 = w.i2.data() + c;
    __m512 v = _mm512_add_ps(bilinear_term16(_mm512_mul_ps(dx2, vdy2), r1, x1),
                             bilinear_term16(_mm512_mul_ps(dx1, vdy2), r1, x2));
    v = _mm512_add_ps(v, bilinear_term16(_mm512_mul_ps(dx2, vdy1), r2, x1));
    _mm512_storeu_ps(y + c, _mm512_add_ps(v, bilinear_term16(_mm512_mul_ps(dx1, vdy1), r2, x2)));
  }
  bilinear_row_scalar(w, r1, r2, dy1, dy2, y, c, n);
}
__attribute__((target("avx2,fma"))) inline __m256 bilinear_term8(__m256 weight, const float* r, const int32_t* idx) {
  const __m256 x = _mm256_i32gather_ps(r, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)), 4);
  return _mm256_blendv_ps(_mm256_mul_ps(weight, x), _mm256_setzero_ps(),
                          _mm256_cmp_ps(weight, _mm256_setzero_ps(), _CMP_EQ_OQ));
}
__attribute__((target("avx2,fma"))) void bilinear_row_avx2(const BilinearAxis& w, const float* r1, const float* r2,
                                                           float dy1, float dy2, float* y, int64_t n) {
  const __m256 vdy1 = _mm256_set1_ps(dy1), vdy2 = _mm256_set1_ps(dy2);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 dx1 = _mm256_loadu_ps(w.d1.data() + c), dx2 = _mm256_loadu_ps(w.d2.data() + c);
    const int32_t *x1 = w.i1.data() + c, *x2 = w.i2.data() + c;
    __m256 v = _mm256_add_ps(bilinear_term8(_mm256_mul_ps(dx2, vdy2), r1, x1),
                             bilinear_term8(_mm256_mul_ps(dx1, vdy2), r1, x2));
    v = _mm256_add_ps(v, bilinear_term8(_mm256_mul_ps(dx2, vdy1), r2, x1));
    _mm256_storeu_ps(y + c, _mm256_add_ps(v, bilinear_term8(_mm256_mul_ps(dx1, vdy1), r2, x2)));
  }
  bilinear_row_scalar(w, r1, r2, dy1, dy2, y, c, n);
}
#endif
#pragma GCC pop_options

void bilinear_row(const BilinearAxis& w, const float* r1, const float* r2, float dy1, float dy2, float* y, int64_t n) {
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512: return bilinear_row_avx512(w, r1, r2, dy1, dy2, y, n);
    case Isa::avx2: return bilinear_row_avx2(w, r1, r2, dy1, dy2, y, n);
#endif
    default: return bilinear_row_scalar(w, r1, r2, dy1, dy2, y, 0, n);
  }
}

// Along the last axis: nearest gathers x[i0]; linear blends two gathers.
void horizontal(const AxisPlan& a, bool nearest, const float* x, float* y) {
  const int64_t n = a.out;
  if (a.identity) {
    if (y != x) std::memcpy(y, x, size_t(n) * 4);
    return;
  }
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512:
      return nearest ? gather_avx512(x, a.i0.data(), y, n)
                     : interp_avx512(x, a.i0.data(), a.i1.data(), a.w0.data(), a.w1.data(), y, n);
    case Isa::avx2:
      return nearest ? gather_avx2(x, a.i0.data(), y, n)
                     : interp_avx2(x, a.i0.data(), a.i1.data(), a.w0.data(), a.w1.data(), y, n);
#endif
    default:
      return nearest ? gather_scalar(x, a.i0.data(), y, n)
                     : interp_scalar(x, a.i0.data(), a.i1.data(), a.w0.data(), a.w1.data(), y, n);
  }
}

// ---------------------------------------------------------------------------------------
// The kernel

struct ResizePlan {
  Shape in, out;
  bool nearest = true;
  float extrapolation = 0.f;
  std::optional<std::pair<BilinearAxis, BilinearAxis>> bilinear;  // height, width
  std::vector<AxisPlan> axes;  // one per input axis
  std::vector<int> leading;    // changed axes before the last two, each a pass over whole rows
  std::vector<int64_t> scratch;  // floats of each leading pass's result
};

// The plan for input shape `in` and the roi/scales/sizes values `input(i)` gives; an
// Error (ref's message) when those values are invalid.
ResizePlan make_plan(const ResizeSpec& spec, const Shape& in, const std::function<const Tensor*(int)>& input) {
  const auto g = spec.geometry(in, input);
  ResizePlan p;
  p.in = in;
  p.out = g.out;
  p.nearest = spec.mode() == ResizeSpec::Mode::nearest;
  p.extrapolation = float(spec.extrapolation());
  if (shape_numel(p.in) == 0 && shape_numel(p.out) != 0)
    throw Error(ErrorCode::invalid_argument, "cannot resize empty input " + shape_str(in) + " to " + shape_str(p.out));
  for (size_t d = 0; d < in.size(); ++d) {
    const ResizeAxis& src = g.axes[d];
    AxisPlan a;
    a.in = in[d];
    a.out = p.out[d];
    if (a.in > INT32_MAX || a.out > INT32_MAX)
      throw Error(ErrorCode::unsupported, "an axis longer than 2^31 elements");
    for (int64_t o = 0; o < a.out; ++o) {
      const auto& taps = src.taps[size_t(o)];
      if (src.outside[size_t(o)]) a.outside.push_back(o);
      a.i0.push_back(int32_t(taps[0].index));
      a.w0.push_back(float(taps[0].weight));
      a.i1.push_back(int32_t(taps.size() > 1 ? taps[1].index : taps[0].index));
      a.w1.push_back(taps.size() > 1 ? float(taps[1].weight) : 0.f);
      a.identity = a.identity && taps.size() == 1 && taps[0].index == o && taps[0].weight == 1.0;
    }
    a.identity = a.identity && a.in == a.out && a.outside.empty();
    p.axes.push_back(std::move(a));
  }
  // ORT's bilinear kernel: linear mode, 2-D, or 4-D resizing the last two axes only.
  using Coord = ref::ResizeSpec::Coord;
  const int r = int(in.size());
  bool bilinear = !p.nearest && (r == 2 || (r == 4 && p.axes[0].identity && p.axes[1].identity)) &&
                  !g.aspect_kept && (spec.coord() == Coord::half_pixel || spec.coord() == Coord::asymmetric ||
                                     spec.coord() == Coord::pytorch_half_pixel || spec.coord() == Coord::align_corners);
  // ORT's align_corners divides by the output length, ONNX by scale * input length: only
  // where they agree.
  for (int d = r - 2; bilinear && d < r; ++d)
    bilinear = in[size_t(d)] > 0 && p.out[size_t(d)] > 0 &&
               (spec.coord() != Coord::align_corners || double(p.out[size_t(d)]) == g.scale[size_t(d)] * double(in[size_t(d)]));
  if (bilinear) {
    auto axis = [&](int d) {
      const float scale = g.from_sizes ? float(p.out[size_t(d)]) / float(in[size_t(d)]) : float(g.scale[size_t(d)]);
      return bilinear_axis(spec.coord(), in[size_t(d)], p.out[size_t(d)], scale);
    };
    p.bilinear.emplace(axis(r - 2), axis(r - 1));
  }
  Shape cur = in;
  for (int d = 0; d + 2 < int(in.size()); ++d) {
    if (p.axes[size_t(d)].identity) continue;
    p.leading.push_back(d);
    cur[size_t(d)] = p.out[size_t(d)];
    p.scratch.push_back(shape_numel(cur));
  }
  return p;
}

// What the cpu kernel covers: f32 of static shape, nearest or linear (no antialias:
// at most two taps per axis), and when roi/scales/sizes are constants, valid values.
std::optional<std::string> resize_check(const KernelBuildInfo& info, bool upsample, std::optional<ResizePlan>* plan) {
  if (info.node.outputs.size() != 1) return std::string("expects one output");
  if (auto r = need_f32(info, 0)) return r;
  if (auto r = need_static(info, 0)) return r;
  if (info.input(0).shape->empty()) return std::string("scalar input");
  try {
    const ResizeSpec spec(info.node, info.opset, upsample);
    if (spec.mode() == ResizeSpec::Mode::cubic) return std::string("cubic mode is not implemented");
    if (spec.antialias()) return std::string("antialias is not implemented");
    for (int i = 1; i < int(info.inputs.size()); ++i)
      if (info.has_input(i) && !info.input(i).constant) return std::nullopt;  // planned at run time
    *plan = make_plan(spec, *info.input(0).shape,
                      [&](int i) { return info.has_input(i) ? info.input(i).constant : nullptr; });
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

class ResizeKernel final : public OpKernel {
 public:
  // `plan`: fixed at compile time from constant inputs; absent: made at run time from the
  // input values (and kept while they repeat).
  ResizeKernel(ResizeSpec spec, Shape in, std::optional<ResizePlan> plan)
      : spec_(std::move(spec)), in_(std::move(in)), fixed_(plan.has_value()) {
    if (plan) prepare(std::move(*plan));
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (!fixed_) return false;
    *dtype = DType::f32;
    *shape = p_.out;
    return i == 0;
  }

  void compute(KernelContext& ctx) const override {
    if (!fixed_) replan(ctx);
    const float* x = ctx.required_input(0).data<float>();
    Tensor& y = ctx.output(0, DType::f32, p_.out);
    if (y.numel() == 0) return;
    Shape cur = p_.in;
    for (size_t k = 0; k < p_.leading.size(); ++k) {
      float* dst = scratch_[k].data();
      leading_pass(ctx, p_.leading[k], cur, x, dst);
      cur[size_t(p_.leading[k])] = p_.out[size_t(p_.leading[k])];
      x = dst;
    }
    last_two(ctx, cur, x, y.data<float>());
  }

 private:
  void prepare(ResizePlan p) const {
    p_ = std::move(p);
    rank_ = int(p_.in.size());
    scratch_.clear();
    for (int64_t n : p_.scratch) scratch_.emplace_back(size_t(n));
  }

  // Non-constant roi/scales/sizes: plan again when their values change.
  void replan(const KernelContext& ctx) const {
    std::vector<double> key;
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const Tensor* t = ctx.input(i);
      key.push_back(t ? double(t->numel()) : -1.0);
      if (t) {
        const auto v = tensor_to_doubles(*t);
        key.insert(key.end(), v.begin(), v.end());
      }
    }
    if (planned_ && key == key_) return;
    try {
      prepare(make_plan(spec_, in_, [&](int i) { return ctx.input(i); }));
    } catch (const Error& e) {
      planned_ = false;
      ctx.fail(e.code(), e.what());
    }
    key_ = std::move(key);
    planned_ = true;
  }

  // Axis d of a tensor of shape s: [pre, in, post] -> [pre, out, post], rows of `post`.
  void leading_pass(const KernelContext& ctx, int d, const Shape& s, const float* x, float* y) const {
    const AxisPlan& a = p_.axes[size_t(d)];
    int64_t pre = 1, post = 1;
    for (int k = 0; k < rank_; ++k)
      if (k != d) (k < d ? pre : post) *= s[size_t(k)];
    parallel_items(ctx, pre * a.out, post * 4, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t q = t / a.out, o = t % a.out;
        float* dst = y + t * post;
        const float* r0 = x + (q * a.in + a.i0[size_t(o)]) * post;
        const float* r1 = x + (q * a.in + a.i1[size_t(o)]) * post;
        if (a.single(o)) scale_row(r0, a.w0[size_t(o)], dst, post);
        else blend_rows_any(r0, a.w0[size_t(o)], r1, a.w1[size_t(o)], dst, post);
      }
    });
    fill_outside(a, pre, post, y);
  }

  // The last two axes (the last one alone for rank 1): one output row at a time.
  void last_two(const KernelContext& ctx, const Shape& s, const float* x, float* y) const {
    const AxisPlan& h = rank_ >= 2 ? p_.axes[size_t(rank_ - 2)] : unit_;
    const AxisPlan& w = p_.axes[size_t(rank_ - 1)];
    int64_t planes = 1;
    for (int k = 0; k < rank_ - 2; ++k) planes *= s[size_t(k)];
    const int64_t rows = planes * h.out;
    if (p_.bilinear) {
      const auto& [bh, bw] = *p_.bilinear;
      parallel_items(ctx, rows, w.out * 4, 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t q = t / h.out, o = t % h.out;
          const float* plane = x + q * h.in * w.in;
          bilinear_row(bw, plane + bh.i1[size_t(o)] * w.in, plane + bh.i2[size_t(o)] * w.in, bh.d1[size_t(o)],
                       bh.d2[size_t(o)], y + t * w.out, w.out);
        }
      });
      return;
    }
    parallel_items(ctx, rows, w.out * 4, 1 << 15, [&](int64_t b, int64_t e) {
      std::vector<float> buf(size_t(w.in));
      for (int64_t t = b; t < e; ++t) {
        const int64_t q = t / h.out, o = t % h.out;
        float* dst = y + t * w.out;
        if (t > b && o > 0 && h.same_taps(o, o - 1)) {
          std::memcpy(dst, dst - w.out, size_t(w.out) * 4);
          continue;
        }
        const float* r0 = x + (q * h.in + h.i0[size_t(o)]) * w.in;
        const float* row = r0;
        if (!h.single(o)) {
          blend_rows_any(r0, h.w0[size_t(o)], x + (q * h.in + h.i1[size_t(o)]) * w.in, h.w1[size_t(o)], buf.data(),
                         w.in);
          row = buf.data();
        } else if (h.w0[size_t(o)] != 1.f) {
          scale_row(r0, h.w0[size_t(o)], buf.data(), w.in);
          row = buf.data();
        }
        horizontal(w, p_.nearest, row, dst);
        for (int64_t c : w.outside) dst[c] = p_.extrapolation;
      }
    });
    if (rank_ >= 2) fill_outside(h, planes, w.out, y);
  }

  // tf_crop_and_resize: output coordinates of axis `a` that map outside the input.
  void fill_outside(const AxisPlan& a, int64_t pre, int64_t post, float* y) const {
    for (int64_t q = 0; q < pre; ++q)
      for (int64_t o : a.outside) std::fill_n(y + (q * a.out + o) * post, post, p_.extrapolation);
  }

  ResizeSpec spec_;
  Shape in_;
  bool fixed_;
  // The plan and the intermediate results of the leading passes; replanned at run time
  // when the inputs are not constants (runs of a session are serialized).
  mutable ResizePlan p_;
  mutable int rank_ = 0;
  mutable std::vector<std::vector<float>> scratch_;
  mutable std::vector<double> key_;
  mutable bool planned_ = false;
  // The height axis of a 1-D resize: one row, taken as it is.
  const AxisPlan unit_ = [] {
    AxisPlan a;
    a.i0 = a.i1 = {0};
    a.w0 = {1.f};
    a.w1 = {0.f};
    return a;
  }();
};

// 8-bit nearest resizing of the last two axes of 4-D bytes: what a quantized model's
// DequantizeLinear -> Resize -> QuantizeLinear becomes (fuse_qdq_elementwise; nearest
// copies values, so on bytes it is exact). Batch and channels unchanged, no extrapolated
// coordinates. The bytes may arrive channels-last from a QLinearConv, QLookup or
// QLinearAdd and then leave so (each output pixel a copy of a source pixel's channels).
std::optional<std::string> byte_resize_check(const KernelBuildInfo& info, bool upsample,
                                             ResizePlan* plan) {
  if (info.node.outputs.size() != 1) return std::string("expects one output");
  if (auto r = need_static(info, 0)) return r;
  if (info.input(0).shape->size() != 4) return std::string("8-bit inputs: 4-D only");
  for (int i = 1; i < int(info.inputs.size()); ++i)
    if (info.has_input(i) && !info.input(i).constant)
      return std::string("8-bit inputs: constant roi/scales/sizes only");
  try {
    const ResizeSpec spec(info.node, info.opset, upsample);
    if (spec.mode() != ResizeSpec::Mode::nearest)
      return std::string("8-bit inputs: nearest mode only");
    if (spec.antialias()) return std::string("antialias is not implemented");
    *plan = make_plan(spec, *info.input(0).shape,
                      [&](int i) { return info.has_input(i) ? info.input(i).constant : nullptr; });
  } catch (const Error& e) {
    return std::string(e.what());
  }
  const ResizePlan& p = *plan;
  if (!p.leading.empty() || p.in[0] != p.out[0] || p.in[1] != p.out[1])
    return std::string("8-bit inputs: only the last two axes resized");
  for (int d : {2, 3}) {
    const AxisPlan& a = p.axes[size_t(d)];
    if (!a.outside.empty()) return std::string("8-bit inputs: no extrapolation");
    for (int64_t o = 0; o < a.out; ++o)
      if (!a.single(o) || a.i0[size_t(o)] < 0 || a.i0[size_t(o)] >= a.in)
        return std::string("8-bit inputs: one tap per output pixel");
  }
  return std::nullopt;
}

class ByteResizeKernel final : public ByteLayoutKernel {
 public:
  ByteResizeKernel(ResizePlan p, DType t) : ByteLayoutKernel(t, p.in, p.out), p_(std::move(p)) {}

  void compute(KernelContext& ctx) const override {
    const Tensor& xt = ctx.required_input(0);
    if (xt.shape() != p_.in || xt.dtype() != t_)
      return ctx.fail(ErrorCode::invalid_argument,
                      "input is " + shape_str(xt.shape()) + ", compiled for " + shape_str(p_.in));
    const auto* x = static_cast<const uint8_t*>(xt.raw_data());
    auto* y = static_cast<uint8_t*>(ctx.output(0, t_, p_.out).raw_data());
    const AxisPlan &h = p_.axes[2], &w = p_.axes[3];
    const int64_t n = p_.in[0], c = p_.in[1], ih = h.in, iw = w.in, oh = h.out, ow = w.out;
    if (n * c * oh * ow == 0) return;
    if (cl_x_ && cl_y_) {
      parallel_items(ctx, n * oh, ow * c, 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t img = t / oh, o = t % oh;
          uint8_t* dst = y + t * ow * c;
          if (t > b && o > 0 && h.i0[size_t(o)] == h.i0[size_t(o - 1)]) {
            std::memcpy(dst, dst - ow * c, size_t(ow * c));
            continue;
          }
          const uint8_t* src = x + (img * ih + h.i0[size_t(o)]) * iw * c;
          for (int64_t q = 0; q < ow; ++q)
            std::memcpy(dst + q * c, src + w.i0[size_t(q)] * c, size_t(c));
        }
      });
    } else if (cl_x_) {
      // Channels-last in, NCHW out (a reader that takes plain bytes): the smaller input
      // transposed first, then resized as plain bytes.
      auto* t = static_cast<uint8_t*>(thread_scratch(size_t(n * c * ih * iw)));
      bytes_to_nchw(x, t, n, c, ih * iw);
      plain(ctx, t, y);
    } else {
      plain(ctx, x, y);
    }
  }

 private:
  void plain(const KernelContext& ctx, const uint8_t* x, uint8_t* y) const {
    const AxisPlan &h = p_.axes[2], &w = p_.axes[3];
    const int64_t n = p_.in[0], c = p_.in[1], ih = h.in, iw = w.in, oh = h.out, ow = w.out;
    {
      parallel_items(ctx, n * c * oh, ow, 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t plane = t / oh, o = t % oh;
          uint8_t* dst = y + t * ow;
          if (t > b && o > 0 && h.i0[size_t(o)] == h.i0[size_t(o - 1)]) {
            std::memcpy(dst, dst - ow, size_t(ow));
            continue;
          }
          const uint8_t* src = x + (plane * ih + h.i0[size_t(o)]) * iw;
          for (int64_t q = 0; q < ow; ++q) dst[q] = src[w.i0[size_t(q)]];
        }
      });
    }
  }

  ResizePlan p_;
};

bool byte_input(const KernelBuildInfo& info) {
  return info.input(0).dtype &&
         (*info.input(0).dtype == DType::u8 || *info.input(0).dtype == DType::i8);
}

KernelDef resize_def(const std::string& op, int64_t since, int64_t until, bool upsample,
                     std::vector<int> shape_inputs) {
  KernelDef def;
  def.op_type = op;
  def.since_version = since;
  def.until_version = until;
  def.shape_inputs = std::move(shape_inputs);
  def.claim = [upsample](const KernelBuildInfo& info) {
    if (byte_input(info)) {
      ResizePlan p;
      if (auto r = byte_resize_check(info, upsample, &p)) return Claim::no(*r);
      return Claim::yes();
    }
    std::optional<ResizePlan> p;
    if (auto r = resize_check(info, upsample, &p)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [upsample](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    if (byte_input(info)) {
      ResizePlan p;
      if (auto r = byte_resize_check(info, upsample, &p))
        throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
      return std::make_unique<ByteResizeKernel>(std::move(p), *info.input(0).dtype);
    }
    std::optional<ResizePlan> p;
    if (auto r = resize_check(info, upsample, &p))
      throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<ResizeKernel>(ResizeSpec(info.node, info.opset, upsample), *info.input(0).shape,
                                          std::move(p));
  };
  return def;
}

}  // namespace

void register_resize_kernels(KernelRegistry& r) {
  r.add(resize_def("Resize", 10, 10, false, {1}));
  r.add(resize_def("Resize", 11, INT_MAX, false, {1, 2, 3}));
  r.add(resize_def("Upsample", 7, 8, true, {}));
  r.add(resize_def("Upsample", 9, 10, true, {1}));
}

}  // namespace slim::cpu
