// The cpu provider's element-type conversions: Cast between f32 and f16 and from 8- and
// 32-bit integers to f32, QuantizeLinear and DequantizeLinear (per tensor and per axis,
// 8-bit, scales and zero points constant or not), DynamicQuantizeLinear, and the byte-level
// slim:QLookup / slim:QLinearAdd / slim:QLinearMul of QDQ models. Loops are
// written once over simd.h's vector types (AVX-512, AVX2, NEON, scalar; F16C / AVX-512
// conversions for f16) and give ref's results to the bit: quantization rounds x / scale
// half to even, as ONNX defines it (runtime/ref/quant_params.h).
#include "runtime/cpu/quantize.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/simd.h"
#include "runtime/ref/math_common.h"
#include "runtime/ref/quant_params.h"
#include "runtime/cpu/dnnl_int8.h"
#include "slim/core/half.h"
#include "slim/runtime/fused_ops.h"

namespace slim::cpu {

namespace {

template <int W>
SLIM_INLINE void min_max_loop(const float* x, int64_t n, float* lo, float* hi, bool* nan) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  F vlo = splat<W>(*lo), vhi = splat<W>(*hi);
  I bad = I{} == 1;  // all false
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F v = load<W>(x + i);
    vlo = v < vlo ? v : vlo;  // a NaN compares false and leaves the bounds alone
    vhi = v > vhi ? v : vhi;
    bad |= v != v;
  }
  float l = *lo, h = *hi;
  bool any_nan = false;
  for (int k = 0; k < W; ++k) {
    l = std::min(l, vlo[k]);
    h = std::max(h, vhi[k]);
    any_nan = any_nan || bad[k];
  }
  for (; i < n; ++i) {
    any_nan = any_nan || x[i] != x[i];
    if (x[i] < l) l = x[i];
    if (x[i] > h) h = x[i];
  }
  *lo = l;
  *hi = h;
  *nan = *nan || any_nan;
}

// Whether any lane of a comparison result is set.
template <int W>
SLIM_INLINE bool any_lane(typename Vec<W>::I m) {
  if constexpr (W == 16) {
    // Narrowed to bytes (vpmovdb), then one 128-bit test (vptest).
    const auto b = __builtin_convertvector(m, typename Bytes<W>::S);
    unsigned __int128 all;
    std::memcpy(&all, &b, 16);
    return all != 0;
  } else if constexpr (W == 8) {
    // The two halves or-ed: AVX2 has no narrowing to bytes, and GCC 12 converts lane by lane.
    typedef int32_t H __attribute__((vector_size(16)));
    const H o =
        __builtin_shufflevector(m, m, 0, 1, 2, 3) | __builtin_shufflevector(m, m, 4, 5, 6, 7);
    unsigned __int128 all;
    std::memcpy(&all, &o, 16);
    return all != 0;
  } else {
    bool any = false;
    for (int k = 0; k < W; ++k) any = any || m[k];
    return any;
  }
}

// Division costs about ten multiplications. x * (1 / scale) is within 1.5 float ulps of
// the quotient x / scale, so the two round to different integers only when the quotient
// lies within that of a half-way point: such vectors (a few in a thousand) are divided.
template <int W>
SLIM_INLINE typename Vec<W>::I quantize_vec(typename Vec<W>::F x, float scale, float inv,
                                            int32_t zp, float lo, float hi) {
  using F = typename Vec<W>::F;
  if (inv != 0.f) {
    const F v = x * splat<W>(inv);
    const F r = (v + splat<W>(12582912.f)) - splat<W>(12582912.f);
    F d = v - r, av = v;
    d = d < splat<W>(0.f) ? -d : d;
    av = av < splat<W>(0.f) ? -av : av;
    if (!any_lane<W>(d >= splat<W>(0.5f) - av * splat<W>(0x1p-21f) - splat<W>(0x1p-40f)))
      return round_clamped<W>(v, zp, lo, hi);
  }
  return round_clamped<W>(x / splat<W>(scale), zp, lo, hi);
}

template <int W>
SLIM_INLINE void quantize_loop(const float* x, void* y, int64_t n, float scale, int32_t zp,
                               int32_t qlo, int32_t qhi) {
  const float lo = float(qlo - zp), hi = float(qhi - zp);
  // 1 / scale must be a normal float for the error bound above; else always divide.
  const float inv = std::isnormal(1.f / scale) ? 1.f / scale : 0.f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    // 2 KiB ahead: a network's input has left the caches by the next run, and on a Sapphire
    // Rapids VM the hardware's prefetch alone left this loop waiting on it (PP-OCRv4's
    // detector's 2 MB input: 1.15 -> 0.50 ms at AVX2, 0.63 -> 0.49 ms at AVX-512).
    __builtin_prefetch(x + i + 512);
    store_low_bytes<W>(static_cast<uint8_t*>(y) + i,
                       quantize_vec<W>(load<W>(x + i), scale, inv, zp, lo, hi));
  }
  for (; i < n; ++i) {
    const int32_t q = ref::quantize_value(x[i], scale, zp, qlo, qhi);
    if (qlo == 0)
      static_cast<uint8_t*>(y)[i] = uint8_t(q);
    else
      static_cast<int8_t*>(y)[i] = int8_t(q);
  }
}

template <int W>
SLIM_INLINE void dequantize_loop(const void* x, bool is_signed, float* y, int64_t n, float scale,
                                 int32_t zp) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const I v = widen_bytes<W>(static_cast<const uint8_t*>(x) + i, is_signed);
    store<W>(y + i, __builtin_convertvector(v - zp, F) * splat<W>(scale));
  }
  for (; i < n; ++i) {
    const int32_t v =
        is_signed ? static_cast<const int8_t*>(x)[i] : static_cast<const uint8_t*>(x)[i];
    y[i] = float(v - zp) * scale;
  }
}

// Integers to f32: C++'s conversion (round to nearest for int32 beyond 2^24).
template <int W, typename T>
SLIM_INLINE void int_to_f32_loop(const T* x, float* y, int64_t n) {
  typedef T V __attribute__((vector_size(W * sizeof(T))));
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V v;
    std::memcpy(&v, x + i, sizeof v);
    store<W>(y + i, __builtin_convertvector(v, typename Vec<W>::F));
  }
  for (; i < n; ++i) y[i] = float(x[i]);
}

template <int W>
void int_to_f32(DType from, const void* x, float* y, int64_t n) {
  switch (from) {
    case DType::i32:
      return int_to_f32_loop<W>(static_cast<const int32_t*>(x), y, n);
    case DType::u8:
      return int_to_f32_loop<W>(static_cast<const uint8_t*>(x), y, n);
    case DType::i8:
      return int_to_f32_loop<W>(static_cast<const int8_t*>(x), y, n);
    default:
      return;
  }
}

SLIM_DISPATCH3(min_max_loop, (const float* x, int64_t n, float* lo, float* hi, bool* nan),
               (x, n, lo, hi, nan))
SLIM_DISPATCH3(quantize_loop,
               (const float* x, void* y, int64_t n, float scale, int32_t zp, int32_t qlo,
                int32_t qhi),
               (x, y, n, scale, zp, qlo, qhi))
SLIM_DISPATCH3(dequantize_loop,
               (const void* x, bool is_signed, float* y, int64_t n, float scale, int32_t zp),
               (x, is_signed, y, n, scale, zp))
SLIM_DISPATCH3(int_to_f32, (DType from, const void* x, float* y, int64_t n), (from, x, y, n))

// f16 <-> f32: the CPU's conversion instructions (round to nearest even, as half.h).
#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* operands that -Wmaybe-uninitialized
// reports as false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}
__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}
__attribute__((target("avx512f"))) void f16_to_f32_avx512(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i,
                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
#pragma GCC diagnostic pop
#endif

void f32_to_f16_any(const float* x, uint16_t* y, int64_t n) {
#if defined(__x86_64__)
  if (detected_isa() == Isa::avx512) return f32_to_f16_avx512(x, y, n);
  if (detected_isa() == Isa::avx2) return f32_to_f16_avx2(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

void f16_to_f32_any(const uint16_t* x, float* y, int64_t n) {
#if defined(__x86_64__)
  if (detected_isa() == Isa::avx512) return f16_to_f32_avx512(x, y, n);
  if (detected_isa() == Isa::avx2) return f16_to_f32_avx2(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

// Elements per task below which splitting over threads costs more than it saves.
constexpr int64_t kGrain = 1 << 16;

// Calls fn(begin, end) over [0, n) in pieces of whole 64-element blocks (so vector loops
// run on full vectors), split over the session's threads.
template <typename Fn>
void parallel_elements(const KernelContext& ctx, int64_t n, Fn&& fn) {
  const int64_t blocks = (n + 63) / 64;
  parallel_items(ctx, blocks, 64, kGrain,
                 [&](int64_t b, int64_t e) { fn(b * 64, std::min(n, e * 64)); });
}

// ---------------------------------------------------------------------------------------
// Cast

bool cast_supported(DType from, DType to) {
  if (from == to) return true;
  if (to == DType::f32)
    return from == DType::f16 || from == DType::i32 || from == DType::u8 || from == DType::i8;
  return to == DType::f16 && from == DType::f32;
}

class CastKernel final : public OpKernel {
 public:
  CastKernel(DType from, DType to, Shape shape) : from_(from), to_(to), shape_(std::move(shape)) {}
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = to_;
    *shape = shape_;
    return i == 0;
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    if (x.dtype() != from_ || x.shape() != shape_)
      ctx.fail(ErrorCode::internal, "cpu kernel was compiled for " +
                                        std::string(dtype_name(from_)) + shape_str(shape_) +
                                        " but got " + x.describe());
    Tensor& y = ctx.output(0, to_, shape_);
    const char* px = static_cast<const char*>(x.raw_data());
    char* py = static_cast<char*>(y.raw_data());
    const int64_t xs = dtype_size(from_), ys = dtype_size(to_);
    parallel_elements(ctx, x.numel(), [&](int64_t b, int64_t e) {
      const void* src = px + b * xs;
      void* dst = py + b * ys;
      if (from_ == to_)
        std::memcpy(dst, src, size_t((e - b) * xs));
      else if (from_ == DType::f16)
        f16_to_f32_any(static_cast<const uint16_t*>(src), static_cast<float*>(dst), e - b);
      else if (to_ == DType::f16)
        f32_to_f16_any(static_cast<const float*>(src), static_cast<uint16_t*>(dst), e - b);
      else
        int_to_f32_any(from_, src, static_cast<float*>(dst), e - b);
    });
  }

 private:
  DType from_, to_;
  Shape shape_;
};

std::optional<DType> cast_to(const Node& node) {
  DType to;
  if (!node.has_attr("to") || !ref::onnx_dtype_to_slim(node.attr_int("to", 0), &to))
    return std::nullopt;
  return to;
}

KernelDef cast_def() {
  KernelDef def;
  def.op_type = "Cast";
  def.since_version = 6;
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    const auto from = info.input(0).dtype, to = cast_to(info.node);
    if (!from || !to || !cast_supported(*from, *to))
      return Claim::no("casts f16 <-> f32, 8/32-bit integers to f32 and to the same type only");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<CastKernel>(*info.input(0).dtype, *cast_to(info.node),
                                        *info.input(0).shape);
  };
  return def;
}

}  // namespace

void min_max(const float* x, int64_t n, float* lo, float* hi, bool* nan) {
  min_max_loop_any(x, n, lo, hi, nan);
}

void quantize(const float* x, void* y, int64_t n, float scale, int32_t zero_point, int32_t qlo,
              int32_t qhi) {
  quantize_loop_any(x, y, n, scale, zero_point, qlo, qhi);
}

void dequantize(const void* x, bool is_signed, float* y, int64_t n, float scale,
                int32_t zero_point) {
  dequantize_loop_any(x, is_signed, y, n, scale, zero_point);
}

ref::DynamicQuantParams dynamic_quantize(const KernelContext& ctx, const float* x, int64_t n,
                                         uint8_t* q) {
  // The range in chunks of their own (in any order they give the same min and max).
  constexpr int64_t kChunks = 64;
  float lo[kChunks], hi[kChunks];
  bool nan[kChunks];
  parallel_items(ctx, kChunks, n / kChunks + 1, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      lo[k] = hi[k] = 0.f;
      nan[k] = false;
      const int64_t begin = n * k / kChunks, end = n * (k + 1) / kChunks;
      min_max(x + begin, end - begin, &lo[k], &hi[k], &nan[k]);
    }
  });
  float l = 0.f, h = 0.f;
  for (int64_t k = 0; k < kChunks; ++k) {
    if (nan[k]) ctx.fail(ErrorCode::invalid_argument, "input contains NaN");
    l = std::min(l, lo[k]);
    h = std::max(h, hi[k]);
  }
  const ref::DynamicQuantParams p = ref::dynamic_quant_params(l, h);
  parallel_elements(ctx, n, [&](int64_t b, int64_t e) {
    if (p.scale == 0.f)
      std::memset(q + b, p.zero_point, size_t(e - b));
    else
      quantize(x + b, q + b, e - b, p.scale, p.zero_point, 0, 255);
  });
  return p;
}

namespace {

// ---------------------------------------------------------------------------------------
// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear

// Which scale and zero point each element takes: one for the tensor, or one per index
// along an axis (runs of `inner` elements, `dim` of them, repeated `outer` times).
struct QuantAxis {
  int64_t outer = 1, dim = 1, inner = 1;
};

// The parameter layout ref accepts (per tensor; per axis from opset 13, 1-D scale).
std::optional<std::string> quant_axis(const KernelBuildInfo& info, QuantAxis* a) {
  for (int i : {0, 1})
    if (auto r = need_static(info, i)) return r;
  const Shape& x = *info.input(0).shape;
  const Shape& scale = *info.input(1).shape;
  if (info.input(1).dtype != DType::f32) return std::string("the scale is not f32");
  if (info.has_input(2) && info.input(2).shape != info.input(1).shape)
    return std::string("zero point and scale differ in shape");
  if (info.node.attr_int("block_size", 0) != 0) return std::string("blocked quantization");
  a->inner = shape_numel(x);
  if (shape_numel(scale) == 1 && scale.size() <= 1) return std::nullopt;
  const int64_t rank = int64_t(x.size()), axis = info.node.attr_int("axis", 1);
  const int64_t ax = axis < 0 ? axis + rank : axis;
  if (info.opset < 13 || scale.size() != 1 || ax < 0 || ax >= rank || x[size_t(ax)] != scale[0])
    return std::string("the scale fits neither the tensor nor the axis");
  a->dim = scale[0];
  a->outer = a->inner = 1;
  for (int64_t d = 0; d < ax; ++d) a->outer *= x[size_t(d)];
  for (int64_t d = ax + 1; d < rank; ++d) a->inner *= x[size_t(d)];
  return std::nullopt;
}

std::optional<DType> quantize_output(const KernelBuildInfo& info) {
  if (info.has_input(2)) return info.input(2).dtype;
  const int64_t code = info.node.attr_int("output_dtype", 0);
  if (code == 0 || code == 2) return DType::u8;
  if (code == 3) return DType::i8;
  return std::nullopt;
}

// Runs fn(element offset, count, parameter index) over the tensor's runs, split over threads.
template <typename Fn>
void for_each_run(const KernelContext& ctx, const QuantAxis& a, Fn&& fn) {
  if (a.dim == 1) {
    parallel_elements(ctx, a.inner, [&](int64_t b, int64_t e) { fn(b, e - b, 0); });
    return;
  }
  parallel_items(ctx, a.outer * a.dim, a.inner, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) fn(r * a.inner, a.inner, r % a.dim);
  });
}

int32_t zero_point(const Tensor* z, int64_t k) {
  if (!z) return 0;
  return z->dtype() == DType::u8 ? int32_t(z->data<uint8_t>()[k]) : int32_t(z->data<int8_t>()[k]);
}

// A per-tensor QuantizeLinear of a 4-D tensor read by a QLinearConv (a quantized CNN's
// input) writes its bytes channels-last, as that convolution wants them, instead of
// oneDNN reordering them there.
class QuantizeKernel final : public OpKernel {
 public:
  QuantizeKernel(QuantAxis a, Shape shape, DType out) : a_(a), shape_(std::move(shape)), out_(out) {
    if (shape_.size() == 4 && a_.dim == 1 && (out_ == DType::u8 || out_ == DType::i8))
      nhwc_y_ = int8_nhwc_layout(shape_, out_);
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = out_;
    *shape = shape_;
    return i == 0;
  }
  bool can_write_output_in(int i, uint64_t layout) const override {
    return i == 0 && layout != 0 && layout == nhwc_y_;
  }
  void use_private_output(int i, uint64_t) override { cl_y_ = i == 0; }
  void compute(KernelContext& ctx) const override {
    const float* x = ctx.required_input(0).data<float>();
    const float* scale = ctx.required_input(1).data<float>();
    const Tensor* z = ctx.input(2);
    void* y = ctx.output(0, out_, shape_).raw_data();
    const int32_t lo = out_ == DType::u8 ? 0 : -128, hi = out_ == DType::u8 ? 255 : 127;
    void* to = y;
    if (cl_y_) to = thread_scratch(size_t(shape_numel(shape_)));
    for_each_run(ctx, a_, [&](int64_t off, int64_t n, int64_t k) {
      quantize(x + off, static_cast<char*>(to) + off, n, scale[k], zero_point(z, k), lo, hi);
    });
    if (cl_y_)
      bytes_to_nhwc(static_cast<const uint8_t*>(to), static_cast<uint8_t*>(y), shape_[0], shape_[1],
                    shape_[2] * shape_[3]);
  }

 private:
  QuantAxis a_;
  Shape shape_;
  DType out_;
  uint64_t nhwc_y_ = 0;
  bool cl_y_ = false;
};

class DequantizeKernel final : public OpKernel {
 public:
  DequantizeKernel(QuantAxis a, Shape shape, DType in) : a_(a), shape_(std::move(shape)), in_(in) {}
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = shape_;
    return i == 0;
  }
  void compute(KernelContext& ctx) const override {
    const char* x = static_cast<const char*>(ctx.required_input(0).raw_data());
    const float* scale = ctx.required_input(1).data<float>();
    const Tensor* z = ctx.input(2);
    float* y = ctx.output(0, DType::f32, shape_).data<float>();
    for_each_run(ctx, a_, [&](int64_t off, int64_t n, int64_t k) {
      dequantize(x + off, in_ == DType::i8, y + off, n, scale[k], zero_point(z, k));
    });
  }

 private:
  QuantAxis a_;
  Shape shape_;
  DType in_;
};

class DynamicQuantizeKernel final : public OpKernel {
 public:
  explicit DynamicQuantizeKernel(Shape shape) : shape_(std::move(shape)) {}
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = i == 1 ? DType::f32 : DType::u8;
    *shape = i == 0 ? shape_ : Shape{};
    return i >= 0 && i < 3;
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    uint8_t* q = ctx.output(0, DType::u8, shape_).data<uint8_t>();
    const ref::DynamicQuantParams p = dynamic_quantize(ctx, x.data<float>(), x.numel(), q);
    *ctx.output(1, DType::f32, {}).data<float>() = p.scale;
    *ctx.output(2, DType::u8, {}).data<uint8_t>() = p.zero_point;
  }

 private:
  Shape shape_;
};

bool is_8bit(std::optional<DType> t) {
  return t == DType::u8 || t == DType::i8;
}

KernelDef quantize_def() {
  KernelDef def;
  def.op_type = "QuantizeLinear";
  def.since_version = 10;
  def.claim = [](const KernelBuildInfo& info) {
    QuantAxis a;
    if (auto r = need_f32(info, 0)) return Claim::no(*r);
    if (auto r = quant_axis(info, &a)) return Claim::no(*r);
    if (!is_8bit(quantize_output(info))) return Claim::no("8-bit outputs only");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    QuantAxis a;
    quant_axis(info, &a);
    return std::make_unique<QuantizeKernel>(a, *info.input(0).shape, *quantize_output(info));
  };
  return def;
}

KernelDef dequantize_def() {
  KernelDef def;
  def.op_type = "DequantizeLinear";
  def.since_version = 10;
  def.claim = [](const KernelBuildInfo& info) {
    QuantAxis a;
    if (!is_8bit(info.input(0).dtype)) return Claim::no("8-bit inputs only");
    if (info.has_input(2) && info.input(2).dtype != info.input(0).dtype)
      return Claim::no("zero point and input differ in type");
    if (auto r = quant_axis(info, &a)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    QuantAxis a;
    quant_axis(info, &a);
    return std::make_unique<DequantizeKernel>(a, *info.input(0).shape, *info.input(0).dtype);
  };
  return def;
}

KernelDef dynamic_quantize_def() {
  KernelDef def;
  def.op_type = "DynamicQuantizeLinear";
  def.since_version = 11;
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = need_f32(info, 0)) return Claim::no(*r);
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<DynamicQuantizeKernel>(*info.input(0).shape);
  };
  return def;
}

// ---------------------------------------------------------------------------------------
// slim:QLookup and slim:QLinearAdd / slim:QLinearMul (fused_ops.h): what fuse_qdq_elementwise
// makes of DequantizeLinear -> elementwise op -> QuantizeLinear on per-tensor bytes.

#if defined(__x86_64__)
// 64 lookups per step where the CPU has AVX-512 VBMI: two two-register byte permutes
// cover the table's halves and the index's top bit picks one. Scalar elsewhere.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t lookup_vbmi(
    const uint8_t* table, const uint8_t* x, uint8_t* y, int64_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
  }
  return i;
}
#endif

#if defined(__x86_64__)
// 32 bytes at a time without VBMI, in 16 vpshufb of 16-byte rows. vpshufb reads an index's
// low nibble and gives 0 where its top bit is set. With z_h = x - 16 h (bytes, wrapping)
// and x < 128 in row H = x >> 4: z_h = 16 (H - h) + (x & 15) keeps its top bit clear for
// h <= H and is negative (-112..-1) for h > H, so the lookups of rows 0..7 give
// D_0[x & 15] ^ ... ^ D_H[x & 15] = T_H[x & 15] when D_0 = T_0 and D_h = T_h ^ T_{h-1}.
// For x >= 128 the same holds of x - 128 = z_8 and rows 8..15; x's top bit picks the sum.
// 3 simple operations a row (was a compare and a 3-operation blend on top of the lookup).
__attribute__((target("avx2"))) int64_t lookup_avx2(const uint8_t* table, const uint8_t* x,
                                                    uint8_t* y, int64_t n) {
  alignas(32) uint8_t d[16][32];
  for (int h = 0; h < 16; ++h)
    for (int j = 0; j < 16; ++j) {
      const uint8_t v = table[16 * h + j] ^ (h % 8 != 0 ? table[16 * (h - 1) + j] : 0);
      d[h][j] = d[h][j + 16] = v;
    }
  const __m256i sixteen = _mm256_set1_epi8(16);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    __m256i z = v, sum[2];
    for (int half = 0; half < 2; ++half) {
      __m256i r = _mm256_setzero_si256();
      for (int h = 8 * half; h < 8 * half + 8; ++h) {
        r = _mm256_xor_si256(
            r, _mm256_shuffle_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(d[h])), z));
        z = _mm256_sub_epi8(z, sixteen);
      }
      sum[half] = r;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_blendv_epi8(sum[0], sum[1], v));
  }
  return i;
}
#endif

void lookup(const uint8_t* table, const uint8_t* x, uint8_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (vbmi && detected_isa() == Isa::avx512) i = lookup_vbmi(table, x, y, n);
  else if (detected_isa() == Isa::avx512 || detected_isa() == Isa::avx2)
    i = lookup_avx2(table, x, y, n);
#endif
  for (; i < n; ++i) y[i] = table[x[i]];
}

// y[p * c + k] = tables[k * 256 + x[p * c + k]] for `pixels` runs of c channels-last bytes
// (a table per channel). At AVX2, 8 lookups a vpgatherdd (4-byte reads at the byte
// offsets; the tables need 3 readable bytes after them), where the scalar loop took about
// 2 cycles a byte (PP-OCRv4's detector's SE gates at AVX2: 1.1 ms of its run).
#if defined(__x86_64__)
__attribute__((target("avx2"))) int64_t lookup_per_channel_avx2(const uint8_t* tables,
                                                                const uint8_t* x, uint8_t* y,
                                                                int64_t pixels, int64_t c) {
  const int64_t c8 = c / 8 * 8;
  if (c8 == 0) return 0;
  const __m256i lane = _mm256_setr_epi32(0, 256, 512, 768, 1024, 1280, 1536, 1792);
  const __m128i pick = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const int* base = reinterpret_cast<const int*>(tables);
  for (int64_t p = 0; p < pixels; ++p) {
    const uint8_t* xp = x + p * c;
    uint8_t* yp = y + p * c;
    for (int64_t k = 0; k < c8; k += 8) {
      const __m256i at = _mm256_add_epi32(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(xp + k))),
          _mm256_add_epi32(lane, _mm256_set1_epi32(int(k * 256))));
      const __m256i v = _mm256_i32gather_epi32(base, at, 1);
      const __m128i l = _mm_shuffle_epi8(_mm256_castsi256_si128(v), pick);
      const __m128i h = _mm_shuffle_epi8(_mm256_extracti128_si256(v, 1), pick);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(yp + k), _mm_unpacklo_epi32(l, h));
    }
    for (int64_t k = c8; k < c; ++k) yp[k] = tables[k * 256 + xp[k]];
  }
  return pixels;
}
#endif

void lookup_per_channel(const uint8_t* tables, const uint8_t* x, uint8_t* y, int64_t pixels,
                        int64_t c) {
  int64_t p = 0;
#if defined(__x86_64__)
  if ((detected_isa() == Isa::avx512 || detected_isa() == Isa::avx2) &&
      !cpu_features().slow_gathers)
    p = lookup_per_channel_avx2(tables, x, y, pixels, c);
#endif
  for (; p < pixels; ++p)
    for (int64_t k = 0; k < c; ++k) y[p * c + k] = tables[k * 256 + x[p * c + k]];
}

// A table lookup per byte; the bytes may arrive channels-last from a QLinearConv (the op
// is elementwise), and then leave so for the next one.
class QLookupKernel final : public OpKernel {
 public:
  QLookupKernel(const KernelBuildInfo& info)
      : shape_(*info.input(0).shape), x_(*info.input(0).dtype), y_(info.input(1).constant->dtype()) {
    const Tensor t = info.input(1).constant->contiguous();
    std::memcpy(table_, t.raw_data(), 256);
    if (shape_.size() == 4) {
      nhwc_x_ = int8_nhwc_layout(shape_, *info.input(0).dtype);
      nhwc_y_ = int8_nhwc_layout(shape_, y_);
    }
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = y_;
    *shape = shape_;
    return i == 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    return i == 0 && layout != 0 && layout == nhwc_x_;
  }
  void use_private_input(int i, uint64_t) override { channels_last_ = i == 0; }
  uint64_t private_output_layout(int i) const override {
    return i == 0 && channels_last_ ? nhwc_y_ : 0;
  }
  void use_private_output(int i, uint64_t) override { y_channels_last_ = i == 0; }
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, shape_, x_);
    const auto* x = static_cast<const uint8_t*>(ctx.required_input(0).raw_data());
    auto* y = static_cast<uint8_t*>(ctx.output(0, y_, shape_).raw_data());
    if (channels_last_ && !y_channels_last_) {
      // NHWC in, NCHW out (a reader that takes plain bytes): looked up and transposed.
      const int64_t c = shape_[1], pixels = shape_[2] * shape_[3];
      for (int64_t img = 0; img < shape_[0]; ++img, x += c * pixels, y += c * pixels)
        for (int64_t p = 0; p < pixels; ++p)
          for (int64_t k = 0; k < c; ++k) y[k * pixels + p] = table_[x[p * c + k]];
      return;
    }
    parallel_items(ctx, shape_numel(shape_), 1, kGrain,
                   [&](int64_t b, int64_t e) { lookup(table_, x + b, y + b, e - b); });
  }

 private:
  Shape shape_;
  DType x_, y_;
  uint8_t table_[256];
  uint64_t nhwc_x_ = 0, nhwc_y_ = 0;
  bool channels_last_ = false, y_channels_last_ = false;
};

KernelDef qlookup_def() {
  KernelDef def;
  def.op_type = "QLookup";
  def.domain = kFusedDomain;
  def.since_version = kFusedOpset;
  def.claim = [](const KernelBuildInfo& info) {
    if (!is_8bit(info.input(0).dtype)) return Claim::no("8-bit inputs only");
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    const Tensor* t = info.input(1).constant;
    if (!t || !is_8bit(t->dtype()) || t->numel() != 256)
      return Claim::no("the table is not 256 constant 8-bit values");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<QLookupKernel>(info);
  };
  return def;
}

// Rounded as the DequantizeLinear nodes, the Add or Mul and the QuantizeLinear they
// replace: GCC would otherwise contract a dequantizing multiply and the Add into an FMA.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
// c[0..n) = Q(DQ(a[i]) op DQ(b[i])), or Q(DQ(a[i]) op bv) when b is null.
template <int W>
SLIM_INLINE void qbinary_loop(const uint8_t* a, const uint8_t* b, float bv, uint8_t* c, int64_t n,
                              bool mul, QParams pa, QParams pb, QParams pc) {
  using F = typename Vec<W>::F;
  const int32_t qlo = pc.is_signed ? -128 : 0, qhi = pc.is_signed ? 127 : 255;
  const float lo = float(qlo - pc.zp), hi = float(qhi - pc.zp);
  const float inv = std::isnormal(1.f / pc.scale) ? 1.f / pc.scale : 0.f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F fa = __builtin_convertvector(widen_bytes<W>(a + i, pa.is_signed) - pa.zp, F) *
                 splat<W>(pa.scale);
    const F fb = b ? __builtin_convertvector(widen_bytes<W>(b + i, pb.is_signed) - pb.zp, F) *
                         splat<W>(pb.scale)
                   : splat<W>(bv);
    const auto q = quantize_vec<W>(mul ? fa * fb : fa + fb, pc.scale, inv, pc.zp, lo, hi);
    store_low_bytes<W>(c + i, q);
  }
  auto value = [](const uint8_t* p, int64_t k, QParams q) {
    return float((q.is_signed ? int32_t(int8_t(p[k])) : int32_t(p[k])) - q.zp) * q.scale;
  };
  for (; i < n; ++i) {
    const float fa = value(a, i, pa), fb = b ? value(b, i, pb) : bv;
    c[i] = uint8_t(ref::quantize_value(mul ? fa * fb : fa + fb, pc.scale, pc.zp, qlo, qhi));
  }
}
SLIM_DISPATCH3(qbinary_loop,
               (const uint8_t* a, const uint8_t* b, float bv, uint8_t* c, int64_t n, bool mul,
                QParams pa, QParams pb, QParams pc),
               (a, b, bv, c, n, mul, pa, pb, pc))

#if defined(__x86_64__)
// GCC 12's AVX-512 widening intrinsics start from _mm512_undefined_epi32 (a false
// -Wmaybe-uninitialized, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// qbinary_loop<16> written with AVX-512 intrinsics, the same operations in the same order
// (so the same bytes): GCC compiled the generic vectors' widening, any-lane test and byte
// stores through the stack, and this loop was a fifth of PP-OCR's detector's 8-bit run.
__attribute__((target("avx512f"))) void qbinary_avx512(const uint8_t* a, const uint8_t* b, float bv,
                                                       uint8_t* c, int64_t n, bool mul, QParams pa,
                                                       QParams pb, QParams pc) {
  const int32_t qlo = pc.is_signed ? -128 : 0, qhi = pc.is_signed ? 127 : 255;
  const float inv = std::isnormal(1.f / pc.scale) ? 1.f / pc.scale : 0.f;
  const __m512i za = _mm512_set1_epi32(pa.zp), zb = _mm512_set1_epi32(pb.zp),
                zc = _mm512_set1_epi32(pc.zp);
  const __m512 sa = _mm512_set1_ps(pa.scale), sb = _mm512_set1_ps(pb.scale),
               sc = _mm512_set1_ps(pc.scale);
  const __m512 vinv = _mm512_set1_ps(inv), magic = _mm512_set1_ps(12582912.f),
               fbv = _mm512_set1_ps(bv);
  const __m512 lo = _mm512_set1_ps(float(qlo - pc.zp)), hi = _mm512_set1_ps(float(qhi - pc.zp));
  const __m512 half = _mm512_set1_ps(0.5f), e21 = _mm512_set1_ps(0x1p-21f),
               e40 = _mm512_set1_ps(0x1p-40f);
  const __m512i sign = _mm512_set1_epi32(0x7fffffff);
  auto widen = [](const uint8_t* p, bool s) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return s ? _mm512_cvtepi8_epi32(x) : _mm512_cvtepu8_epi32(x);
  };
  auto abs_ps = [&](__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), sign));
  };
  auto round_clamped = [&](__m512 v) {
    // min/max clamp (a NaN lane ends as 0 either way), rounded half to even by the
    // conversion (MXCSR's default, as the magic number's rounding).
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    return _mm512_maskz_mov_epi32(_mm512_knot(nan), _mm512_add_epi32(_mm512_cvtps_epi32(v), zc));
  };
  auto step = [&](const uint8_t* ap, const uint8_t* bp, uint8_t* cp) {
    const __m512 fa =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(widen(ap, pa.is_signed), za)), sa);
    const __m512 fb =
        bp ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(widen(bp, pb.is_signed), zb)), sb)
           : fbv;
    const __m512 x = mul ? _mm512_mul_ps(fa, fb) : _mm512_add_ps(fa, fb);
    __m512i q;
    bool divide = true;
    if (inv != 0.f) {
      const __m512 v = _mm512_mul_ps(x, vinv);
      const __m512 r = _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
      const __m512 d = abs_ps(_mm512_sub_ps(v, r));
      const __m512 bound = _mm512_sub_ps(_mm512_sub_ps(half, _mm512_mul_ps(abs_ps(v), e21)), e40);
      if (_mm512_cmp_ps_mask(d, bound, _CMP_GE_OQ) == 0) {
        q = round_clamped(v);
        divide = false;
      }
    }
    if (divide) q = round_clamped(_mm512_div_ps(x, sc));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(cp), _mm512_cvtepi32_epi8(q));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) step(a + i, b ? b + i : nullptr, c + i);
  if (i < n) {
    // The tail through 16-byte copies (24-channel rows would otherwise run a third scalar).
    alignas(16) uint8_t ta[16] = {}, tb[16] = {}, tc[16];
    std::memcpy(ta, a + i, size_t(n - i));
    if (b) std::memcpy(tb, b + i, size_t(n - i));
    step(ta, b ? tb : nullptr, tc);
    std::memcpy(c + i, tc, size_t(n - i));
  }
}

#pragma GCC diagnostic pop

// The same at AVX2, 8 lanes.
__attribute__((target("avx2"))) void qbinary_avx2(const uint8_t* a, const uint8_t* b, float bv,
                                                  uint8_t* c, int64_t n, bool mul, QParams pa,
                                                  QParams pb, QParams pc) {
  const int32_t qlo = pc.is_signed ? -128 : 0, qhi = pc.is_signed ? 127 : 255;
  const float inv = std::isnormal(1.f / pc.scale) ? 1.f / pc.scale : 0.f;
  const __m256i za = _mm256_set1_epi32(pa.zp), zb = _mm256_set1_epi32(pb.zp),
                zc = _mm256_set1_epi32(pc.zp);
  const __m256 sa = _mm256_set1_ps(pa.scale), sb = _mm256_set1_ps(pb.scale),
               sc = _mm256_set1_ps(pc.scale);
  const __m256 vinv = _mm256_set1_ps(inv), magic = _mm256_set1_ps(12582912.f),
               fbv = _mm256_set1_ps(bv);
  const __m256 lo = _mm256_set1_ps(float(qlo - pc.zp)), hi = _mm256_set1_ps(float(qhi - pc.zp));
  const __m256 half = _mm256_set1_ps(0.5f), e21 = _mm256_set1_ps(0x1p-21f),
               e40 = _mm256_set1_ps(0x1p-40f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // Byte 0 of each 32-bit lane, per 128-bit half.
  const __m128i pick = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  auto widen = [](const uint8_t* p, bool s) __attribute__((target("avx2"))) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return s ? _mm256_cvtepi8_epi32(x) : _mm256_cvtepu8_epi32(x);
  };
  auto round_clamped = [&](__m256 v) __attribute__((target("avx2"))) {
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_andnot_si256(_mm256_castps_si256(nan),
                               _mm256_add_epi32(_mm256_cvtps_epi32(v), zc));
  };
  auto step = [&](const uint8_t* ap, const uint8_t* bp, uint8_t* cp)
      __attribute__((target("avx2"))) {
    const __m256 fa =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(widen(ap, pa.is_signed), za)), sa);
    const __m256 fb =
        bp ? _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(widen(bp, pb.is_signed), zb)), sb)
           : fbv;
    const __m256 x = mul ? _mm256_mul_ps(fa, fb) : _mm256_add_ps(fa, fb);
    __m256i q;
    bool divide = true;
    if (inv != 0.f) {
      const __m256 v = _mm256_mul_ps(x, vinv);
      const __m256 r = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
      const __m256 d = _mm256_and_ps(_mm256_sub_ps(v, r), sign);
      const __m256 bound =
          _mm256_sub_ps(_mm256_sub_ps(half, _mm256_mul_ps(_mm256_and_ps(v, sign), e21)), e40);
      if (_mm256_movemask_ps(_mm256_cmp_ps(d, bound, _CMP_GE_OQ)) == 0) {
        q = round_clamped(v);
        divide = false;
      }
    }
    if (divide) q = round_clamped(_mm256_div_ps(x, sc));
    const __m128i l = _mm_shuffle_epi8(_mm256_castsi256_si128(q), pick);
    const __m128i h = _mm_shuffle_epi8(_mm256_extracti128_si256(q, 1), pick);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(cp), _mm_unpacklo_epi32(l, h));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) step(a + i, b ? b + i : nullptr, c + i);
  if (i < n) {
    alignas(16) uint8_t ta[8] = {}, tb[8] = {}, tc[8];
    std::memcpy(ta, a + i, size_t(n - i));
    if (b) std::memcpy(tb, b + i, size_t(n - i));
    step(ta, b ? tb : nullptr, tc);
    std::memcpy(c + i, tc, size_t(n - i));
  }
}
#endif

#pragma GCC pop_options

#if defined(__x86_64__)
// max_bytes: 64 bytes a step at AVX-512 (the tail under a mask), 32 at AVX2.
__attribute__((target("avx512f,avx512bw"))) int64_t max_bytes_avx512(uint8_t* y, const uint8_t* x,
                                                                     int64_t n, bool is_signed) {
  auto step = [&](__m512i a, __m512i b) __attribute__((target("avx512f,avx512bw"))) {
    return is_signed ? _mm512_max_epi8(a, b) : _mm512_max_epu8(a, b);
  };
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(y + i, step(_mm512_loadu_si512(y + i), _mm512_loadu_si512(x + i)));
  if (i < n) {
    const __mmask64 m = (uint64_t(1) << (n - i)) - 1;
    _mm512_mask_storeu_epi8(
        y + i, m, step(_mm512_maskz_loadu_epi8(m, y + i), _mm512_maskz_loadu_epi8(m, x + i)));
  }
  return n;
}

__attribute__((target("avx2"))) int64_t max_bytes_avx2(uint8_t* y, const uint8_t* x, int64_t n,
                                                       bool is_signed) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + i)),
                  b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        is_signed ? _mm256_max_epi8(a, b) : _mm256_max_epu8(a, b));
  }
  return i;
}
#endif

}  // namespace

// c[0..n) = Q(DQ(a[i]) op DQ(b[i])), or Q(DQ(a[i]) op bv) when b is null, at the level
// the kernels run at.
void qbinary(const uint8_t* a, const uint8_t* b, float bv, uint8_t* c, int64_t n, bool mul,
             QParams pa, QParams pb, QParams pc) {
#if defined(__x86_64__)
  if (detected_isa() == Isa::avx512) return qbinary_avx512(a, b, bv, c, n, mul, pa, pb, pc);
  if (detected_isa() == Isa::avx2) return qbinary_avx2(a, b, bv, c, n, mul, pa, pb, pc);
#endif
  qbinary_loop_any(a, b, bv, c, n, mul, pa, pb, pc);
}

QParams qparams(const KernelBuildInfo& info, int i) {
  QParams p;
  p.scale = info.input(i).constant->contiguous().data<float>()[0];
  const Tensor z = info.input(i + 1).constant->contiguous();
  p.is_signed = z.dtype() == DType::i8;
  p.zp = p.is_signed ? int32_t(z.data<int8_t>()[0]) : int32_t(z.data<uint8_t>()[0]);
  return p;
}

void max_bytes(uint8_t* y, const uint8_t* x, int64_t n, bool is_signed) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (detected_isa() == Isa::avx512)
    i = max_bytes_avx512(y, x, n, is_signed);
  else if (detected_isa() == Isa::avx2)
    i = max_bytes_avx2(y, x, n, is_signed);
#endif
  for (; i < n; ++i)
    y[i] = is_signed ? uint8_t(std::max(int8_t(y[i]), int8_t(x[i]))) : std::max(y[i], x[i]);
}

// NCHW <-> NHWC bytes of n images of c channels and p pixels each, in 32 x 32 tiles.
void bytes_to_nhwc(const uint8_t* x, uint8_t* y, int64_t n, int64_t c, int64_t p) {
  for (int64_t img = 0; img < n; ++img, x += c * p, y += c * p)
    for (int64_t q0 = 0; q0 < p; q0 += 32)
      for (int64_t k0 = 0; k0 < c; k0 += 32) {
        const int64_t q1 = std::min(p, q0 + 32), k1 = std::min(c, k0 + 32);
        for (int64_t q = q0; q < q1; ++q)
          for (int64_t k = k0; k < k1; ++k) y[q * c + k] = x[k * p + q];
      }
}
void bytes_to_nchw(const uint8_t* x, uint8_t* y, int64_t n, int64_t c, int64_t p) {
  for (int64_t img = 0; img < n; ++img, x += c * p, y += c * p)
    for (int64_t k0 = 0; k0 < c; k0 += 32)
      for (int64_t q0 = 0; q0 < p; q0 += 32) {
        const int64_t q1 = std::min(p, q0 + 32), k1 = std::min(c, k0 + 32);
        for (int64_t k = k0; k < k1; ++k)
          for (int64_t q = q0; q < q1; ++q) y[k * p + q] = x[q * c + k];
      }
}

namespace {

// Both inputs of the output's shape, or one of them constant over a trailing block of it
// (SE's x * gate [N, C, 1, 1], a scalar): Add and Mul commute exactly, so that one is B.
// 4-D bytes may arrive channels-last from a QLinearConv or QLookup (the full inputs, and
// a [N, C, 1, 1] B, which is the same bytes in either layout) and then leave so: the
// residual Adds and SE's Muls of a CNN keep its 8-bit chain in NHWC. An input in the
// other layout than the output is transposed first. slim:QLinearMulAdd (a QLinearMul and the
// residual slim:QLinearAdd after it, fuse_residual_qlinear_add: the shortcut around an SE
// gate, R + R * gate) then adds the residual R (input 10) to each run of products while it
// is in cache, R read in the layout the results are made in (transposed first if not).
class QLinearBinaryKernel final : public OpKernel {
 public:
  QLinearBinaryKernel(const KernelBuildInfo& info, bool swap, int64_t inner)
      : mul_(info.node.op_type != "QLinearAdd"), swap_(swap), inner_(inner) {
    const int a = swap ? 3 : 0, b = swap ? 0 : 3;
    y_shape_ = *info.input(a).shape;
    pa_ = qparams(info, a + 1);
    pb_ = qparams(info, b + 1);
    pc_ = qparams(info, 6);
    add_ = info.inputs.size() == 15;
    if (add_) {
      pm_ = qparams(info, 8);
      pr_ = qparams(info, 11);
      pd_ = qparams(info, 13);
      residual_is_a_ = info.node.inputs[10] == info.node.inputs[size_t(a)];
    }
    y_ = (add_ ? pd_ : pc_).is_signed ? DType::i8 : DType::u8;
    if (y_shape_.size() == 4) {
      const Shape& bs = *info.input(b).shape;
      nhwc_a_ = int8_nhwc_layout(y_shape_, *info.input(a).dtype);
      nhwc_y_ = int8_nhwc_layout(y_shape_, y_);
      if (add_) nhwc_r_ = int8_nhwc_layout(y_shape_, *info.input(10).dtype);
      // B: full, or [N, C, 1, 1] (bytes identical in both layouts).
      if (inner_ == 0)
        nhwc_b_ = int8_nhwc_layout(bs, *info.input(b).dtype);
      else if (bs.size() == 4 && bs[0] == y_shape_[0] && bs[1] == y_shape_[1] && bs[2] == 1 &&
               bs[3] == 1)
        nhwc_b_ = int8_nhwc_layout(bs, *info.input(b).dtype), gate_ = true;
      else
        nhwc_a_ = nhwc_r_ = 0;  // other broadcasts: plain NCHW only
    }
  }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = y_;
    *shape = y_shape_;
    return i == 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    if (layout == 0) return false;
    if (i == 10) return layout == nhwc_r_;
    if (i != 0 && i != 3) return false;
    const bool is_a = (i == 3) == swap_;
    return layout == (is_a ? nhwc_a_ : nhwc_b_);
  }
  void use_private_input(int i, uint64_t) override {
    if (i == 10)
      cl_r_ = true;
    else if ((i == 3) == swap_)
      cl_a_ = true;
    else if (inner_ == 0)
      cl_b_ = true;
  }
  uint64_t private_output_layout(int i) const override {
    // Channels-last out when a full input came so (a gated A, or either of two full ones, or
    // the residual).
    return i == 0 && (cl_a_ || cl_b_ || cl_r_) && (inner_ == 0 || gate_) ? nhwc_y_ : 0;
  }
  void use_private_output(int i, uint64_t) override { cl_y_ = i == 0; }

  void compute(KernelContext& ctx) const override {
    const auto* a = static_cast<const uint8_t*>(ctx.required_input(swap_ ? 3 : 0).raw_data());
    const auto* b = static_cast<const uint8_t*>(ctx.required_input(swap_ ? 0 : 3).raw_data());
    const auto* r = add_ ? static_cast<const uint8_t*>(ctx.required_input(10).raw_data()) : nullptr;
    if (add_ && ctx.required_input(10).shape() != y_shape_)
      ctx.fail(ErrorCode::invalid_argument, "the residual " + ctx.required_input(10).describe() +
                                                " does not have the output's shape");
    auto* c = static_cast<uint8_t*>(ctx.output(0, y_, y_shape_).raw_data());
    const int64_t n = shape_numel(y_shape_);
    // The layout the results are made in: the one that needs the fewest transposes (a
    // gated A that came channels-last stays so, and a plain output is transposed).
    const bool work_cl =
        inner_ != 0 ? cl_a_ : int(cl_a_) + int(cl_b_) + int(cl_r_) + int(cl_y_) >= 2;
    const bool need_a = cl_a_ != work_cl, need_b = inner_ == 0 && cl_b_ != work_cl,
               need_r = add_ && cl_r_ != work_cl, need_c = work_cl != cl_y_;
    uint8_t* tmp = nullptr;
    if (need_a || need_b || need_r || need_c)
      tmp = static_cast<uint8_t*>(
          thread_scratch(size_t(n) * size_t(need_a + need_b + need_r + need_c)));
    int64_t nb = 1, ch = 1, px = 1;
    if (y_shape_.size() == 4) nb = y_shape_[0], ch = y_shape_[1], px = y_shape_[2] * y_shape_[3];
    uint8_t* at = tmp;
    auto relayout = [&](const uint8_t* x, bool to_cl) {
      uint8_t* t = at;
      at += n;
      if (to_cl)
        bytes_to_nhwc(x, t, nb, ch, px);
      else
        bytes_to_nchw(x, t, nb, ch, px);
      return t;
    };
    if (need_a) a = relayout(a, work_cl);
    if (need_b) b = relayout(b, work_cl);
    if (need_r) r = relayout(r, work_cl);
    uint8_t* out = need_c ? at : c;
    // Elements [s, s + m) of the results made: plus the residual's (slim:QLinearMulAdd).
    auto residual = [&](int64_t s, int64_t m) {
      if (add_) qbinary(out + s, r + s, 0.f, out + s, m, false, pm_, pr_, pd_);
    };
    if (inner_ == 0) {
      parallel_items(ctx, n, 1, kGrain, [&](int64_t s, int64_t e) {
        qbinary(a + s, b + s, 0.f, out + s, e - s, mul_, pa_, pb_, pc_);
        residual(s, e - s);
      });
    } else if (gate_ && (!add_ || residual_is_a_) && px >= kTablePixels &&
               (detected_isa() != Isa::avx512 || !cpu_features().slow_gathers)) {
      // With one gate byte per channel (and the residual A itself) each channel's result
      // is a function of A's byte alone: one 256-entry table per channel, made by the same
      // qbinary calls on the 256 byte values (so the same bytes), then looked up: faster
      // than the arithmetic (PP-OCRv4's detector's 8 QLinearMulAdds, channels-last, with
      // gathered lookups: 1.15 -> 0.47 ms at AVX-512, about 2 -> 0.50 ms at AVX2). Where
      // gathers are slowed (CpuFeatures::slow_gathers) AVX-512 keeps its 16-lane arithmetic
      // (0.82 ms against 1.07 for scalar lookups) and AVX2 looks up byte by byte (1.27 ms).
      std::vector<uint8_t> tables(size_t(nb * ch) * 256 + 3);  // + 3: lookup_per_channel
      uint8_t values[256];
      std::iota(values, values + 256, 0);
      for (int64_t g = 0; g < nb * ch; ++g) {
        uint8_t* t = tables.data() + g * 256;
        const int32_t v = pb_.is_signed ? int32_t(int8_t(b[g])) : int32_t(b[g]);
        qbinary(values, nullptr, float(v - pb_.zp) * pb_.scale, t, 256, mul_, pa_, pb_, pc_);
        if (add_) qbinary(t, values, 0.f, t, 256, false, pm_, pr_, pd_);
      }
      if (work_cl) {
        parallel_items(ctx, nb * px, ch, kGrain, [&](int64_t s, int64_t e) {
          // Runs of pixels within one image (one set of tables).
          for (int64_t p = s; p < e;) {
            const int64_t img = p / px, run = std::min(e, (img + 1) * px) - p;
            lookup_per_channel(tables.data() + img * ch * 256, a + p * ch, out + p * ch, run, ch);
            p += run;
          }
        });
      } else {
        parallel_items(ctx, nb * ch, px, kGrain, [&](int64_t s, int64_t e) {
          for (int64_t g = s; g < e; ++g)
            lookup_bytes(tables.data() + g * 256, a + g * px, out + g * px, px);
        });
      }
    } else if (work_cl) {
      // A [N, H, W, C] with B [N, C]: each pixel's channels against B's row, B's row
      // repeated over runs of pixels (about 512 bytes) so one call covers several.
      const int64_t run = std::max<int64_t>(1, 512 / ch);
      std::vector<uint8_t> tiled(size_t(nb * run * ch));
      for (int64_t img = 0; img < nb; ++img)
        for (int64_t k = 0; k < run; ++k)
          std::memcpy(tiled.data() + (img * run + k) * ch, b + img * ch, size_t(ch));
      parallel_items(ctx, nb * px, ch, kGrain, [&](int64_t s, int64_t e) {
        for (int64_t p = s; p < e;) {
          const int64_t img = p / px, m = std::min({run, e - p, (img + 1) * px - p});
          qbinary(a + p * ch, tiled.data() + img * run * ch, 0.f, out + p * ch, m * ch, mul_, pa_,
                  pb_, pc_);
          residual(p * ch, m * ch);
          p += m;
        }
      });
    } else {
      parallel_items(ctx, n / inner_, inner_, kGrain, [&](int64_t s, int64_t e) {
        for (int64_t o = s; o < e; ++o) {
          const int32_t v = pb_.is_signed ? int32_t(int8_t(b[o])) : int32_t(b[o]);
          qbinary(a + o * inner_, nullptr, float(v - pb_.zp) * pb_.scale, out + o * inner_, inner_,
                  mul_, pa_, pb_, pc_);
          residual(o * inner_, inner_);
        }
      });
    }
    if (need_c) bytes_to_nchw(out, c, nb, ch, px);
  }

 private:
  bool mul_, swap_;
  int64_t inner_;  // 0: both full; else B holds one value per run of inner_ elements
  Shape y_shape_;
  DType y_ = DType::u8;
  QParams pa_, pb_, pc_;
  // slim:QLinearMulAdd: the products' parameters as the Add reads them, R's, the sum's.
  bool add_ = false;
  bool residual_is_a_ = false;  // slim:QLinearMulAdd's R is A (x + x * gate)
  // Gated images of at least this many pixels go through per-channel tables below AVX-512
  // (256 values made per channel, against 1 per pixel per channel looked up).
  static constexpr int64_t kTablePixels = 256;
  QParams pm_, pr_, pd_;
  uint64_t nhwc_a_ = 0, nhwc_b_ = 0, nhwc_r_ = 0, nhwc_y_ = 0;
  bool gate_ = false;  // B is [N, C, 1, 1]
  // Channels-last A, B (full), R, output.
  bool cl_a_ = false, cl_b_ = false, cl_r_ = false, cl_y_ = false;
};

// Which input is full (swap: the second) and B's run length (0: B full too), or why not.
// slim:QLinearMulAdd: also the Add's inputs 8-14, R of the output's shape.
std::optional<std::string> qbinary_setup(const KernelBuildInfo& info, bool* swap, int64_t* inner) {
  const bool add = info.node.op_type == "QLinearMulAdd";
  if (info.inputs.size() != (add ? 15u : 8u))
    return std::string(add ? "takes 15 inputs" : "takes 8 inputs");
  if (add) {
    if (!is_8bit(info.input(10).dtype)) return std::string("8-bit inputs only");
    if (auto r = need_static(info, 10)) return r;
    for (int i : {8, 9, 11, 12, 13, 14}) {
      const Tensor* t = info.input(i).constant;
      const bool scale = i == 8 || i == 11 || i == 13;
      if (!t || t->numel() != 1 || (scale ? t->dtype() != DType::f32 : !is_8bit(t->dtype())))
        return std::string("scales and zero points must be constant scalars");
    }
    if (info.input(9).constant->dtype() != info.input(7).constant->dtype())
      return std::string("the products' zero points differ in type");
    const Shape& a = *info.input(0).shape;
    const Shape& b = *info.input(3).shape;
    if (*info.input(10).shape != (shape_numel(b) > shape_numel(a) ? b : a))
      return std::string("R does not have the output's shape");
  }
  for (int i : {0, 3}) {
    if (!is_8bit(info.input(i).dtype)) return std::string("8-bit inputs only");
    if (auto r = need_static(info, i)) return r;
  }
  for (int i : {1, 2, 4, 5, 6, 7}) {
    const Tensor* t = info.input(i).constant;
    const bool scale = i == 1 || i == 4 || i == 6;
    if (!t || t->numel() != 1 || (scale ? t->dtype() != DType::f32 : !is_8bit(t->dtype())))
      return std::string("scales and zero points must be constant scalars");
  }
  Shape a = *info.input(0).shape, b = *info.input(3).shape;
  *swap = shape_numel(b) > shape_numel(a);
  if (*swap) std::swap(a, b);
  if (a == b) {
    *inner = 0;
    return std::nullopt;
  }
  if (b.size() > a.size()) return std::string("B has a higher rank than A");
  b.insert(b.begin(), a.size() - b.size(), 1);
  // B = A's shape up to axis k, then ones.
  size_t k = b.size();
  while (k > 0 && b[k - 1] == 1) --k;
  for (size_t d = 0; d < k; ++d)
    if (b[d] != a[d]) return std::string("broadcasts other than over trailing axes");
  *inner = 1;
  for (size_t d = k; d < a.size(); ++d) *inner *= a[d];
  if (*inner == 0) return std::string("empty");
  return std::nullopt;
}

KernelDef qbinary_def(const char* op) {
  KernelDef def;
  def.op_type = op;
  def.domain = kFusedDomain;
  def.since_version = kFusedOpset;
  def.claim = [](const KernelBuildInfo& info) {
    bool swap;
    int64_t inner;
    if (auto r = qbinary_setup(info, &swap, &inner)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    bool swap = false;
    int64_t inner = 0;
    qbinary_setup(info, &swap, &inner);
    return std::make_unique<QLinearBinaryKernel>(info, swap, inner);
  };
  return def;
}

// DepthToSpace of 4-D bytes: where a quantized ConvTranspose whose kernel equals its
// stride goes (fuse_qdq: a 1x1 QLinearConv to kernel-area x channels, then this). It reads
// a QLinearConv's channels-last bytes and hands them on so; in DCR mode each output pixel
// of a channels-last output is one run of C bytes.
class ByteDepthToSpaceKernel final : public ByteLayoutKernel {
 public:
  ByteDepthToSpaceKernel(const KernelBuildInfo& info, int64_t bs, bool dcr)
      : ByteLayoutKernel(*info.input(0).dtype, *info.input(0).shape,
                         output_shape(*info.input(0).shape, bs)),
        bs_(bs),
        dcr_(dcr) {}
  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, x_shape_, t_);
    const auto* x = static_cast<const uint8_t*>(ctx.required_input(0).raw_data());
    auto* y = static_cast<uint8_t*>(ctx.output(0, t_, y_shape_).raw_data());
    const int64_t n = x_shape_[0], xc = x_shape_[1], h = x_shape_[2], w = x_shape_[3],
                  c = y_shape_[1];
    const int64_t oh = y_shape_[2], ow = y_shape_[3], bs = bs_;
    // The input channel of output channel k at block offset (a, b).
    auto in_channel = [&](int64_t k, int64_t a, int64_t b) {
      return dcr_ ? (a * bs + b) * c + k : k * bs * bs + a * bs + b;
    };
    parallel_items(ctx, n * oh, ow * c, 1 << 15, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t img = r / oh, i = (r % oh) / bs, a = (r % oh) % bs;
        const uint8_t* xi = x + img * xc * h * w;
        uint8_t* yi = y + img * c * oh * ow;
        const int64_t yr = r % oh;
        if (cl_x_ && !cl_y_ && dcr_) {
          // Channels-last in, plain out: each output row of channel k strides through
          // the input row's pixels.
          for (int64_t k = 0; k < c; ++k) {
            const uint8_t* in = xi + i * w * xc + a * bs * c + k;
            uint8_t* d = yi + (k * oh + yr) * ow;
            for (int64_t j = 0; j < w; ++j)
              for (int64_t b = 0; b < bs; ++b) d[j * bs + b] = in[j * xc + b * c];
          }
          continue;
        }
        for (int64_t q = 0; q < ow; ++q) {
          const int64_t j = q / bs, b = q % bs;
          if (cl_x_ && cl_y_ && dcr_) {
            std::memcpy(yi + (yr * ow + q) * c, xi + (i * w + j) * xc + in_channel(0, a, b),
                        size_t(c));
            continue;
          }
          for (int64_t k = 0; k < c; ++k) {
            const int64_t ch = in_channel(k, a, b);
            const uint8_t v = cl_x_ ? xi[(i * w + j) * xc + ch] : xi[(ch * h + i) * w + j];
            if (cl_y_)
              yi[(yr * ow + q) * c + k] = v;
            else
              yi[(k * oh + yr) * ow + q] = v;
          }
        }
      }
    });
  }

 private:
  static Shape output_shape(const Shape& x, int64_t bs) {
    return {x[0], x[1] / (bs * bs), x[2] * bs, x[3] * bs};
  }
  int64_t bs_;
  bool dcr_;
};

KernelDef depth_to_space_def() {
  KernelDef def;
  def.op_type = "DepthToSpace";
  def.since_version = 1;
  def.claim = [](const KernelBuildInfo& info) {
    if (!is_8bit(info.input(0).dtype)) return Claim::no("8-bit inputs only");
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    const Shape& s = *info.input(0).shape;
    const int64_t bs = info.node.attr_int("blocksize", 0);
    const std::string mode = info.node.attr_string("mode", "DCR");
    if (s.size() != 4) return Claim::no("4-D inputs only");
    if (bs < 1 || s[1] % (bs * bs) != 0) return Claim::no("channels not a multiple of blocksize^2");
    if (mode != "DCR" && mode != "CRD") return Claim::no("mode must be DCR or CRD");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<ByteDepthToSpaceKernel>(info, info.node.attr_int("blocksize", 0),
                                                    info.node.attr_string("mode", "DCR") == "DCR");
  };
  return def;
}

}  // namespace

void lookup_bytes(const uint8_t* table, const uint8_t* x, uint8_t* y, int64_t n) {
  lookup(table, x, y, n);
}

void register_quantize_kernels(KernelRegistry& r) {
  r.add(cast_def());
  r.add(quantize_def());
  r.add(dequantize_def());
  r.add(dynamic_quantize_def());
  r.add(qlookup_def());
  r.add(qbinary_def("QLinearAdd"));
  r.add(qbinary_def("QLinearMul"));
  r.add(qbinary_def("QLinearMulAdd"));
  r.add(depth_to_space_def());
}

}  // namespace slim::cpu
