// The cpu provider's kernels of ONNX Runtime's elementwise and normalization contrib ops
// (com.microsoft): Gelu, BiasGelu, FastGelu, QuickGelu, SkipLayerNormalization and
// SkipSimplifiedLayerNormalization, f32, any shape. The loops are written once over
// simd.h's vector types and math (erf, tanh, sigmoid) and compiled for AVX-512, AVX2 and
// NEON, with the same loops at one lane as the fallback; rows are split over slim's pool
// (see matmul_nbits.cc for why not OpenMP).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/simd.h"

namespace slim::cpu {

namespace {

enum class Act { gelu, fast_gelu, quick_gelu };

template <int W>
SLIM_INLINE typename Vec<W>::F activate(Act act, float alpha, typename Vec<W>::F x) {
  using F = typename Vec<W>::F;
  const F half = splat<W>(0.5f), one = splat<W>(1.f);
  switch (act) {
    case Act::gelu: return half * x * (one + verf<W>(x * splat<W>(0.70710678118654752f)));
    case Act::fast_gelu: {
      const F inner = splat<W>(0.79788456080286536f) * (x + splat<W>(0.044715f) * x * x * x);
      return half * x * (one + vtanh<W>(inner));
    }
    case Act::quick_gelu: return x * vsigmoid<W>(splat<W>(alpha) * x);
  }
  return x;
}

// y = act(x + bias) for rows [r0, r1) of length h (bias: h values, or null).
template <int W>
SLIM_INLINE void activation_rows(Act act, float alpha, const float* x, const float* bias, float* y, int64_t h,
                                 int64_t r0, int64_t r1) {
  using F = typename Vec<W>::F;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    int64_t i = 0;
    for (; i + W <= h; i += W) {
      F v = load<W>(xr + i);
      if (bias) v = v + load<W>(bias + i);
      store<W>(yr + i, activate<W>(act, alpha, v));
    }
    if (i < h) {  // the tail through a zero-padded vector
      float buf[W] = {}, bb[W] = {};
      std::memcpy(buf, xr + i, size_t(h - i) * 4);
      if (bias) std::memcpy(bb, bias + i, size_t(h - i) * 4);
      store<W>(buf, activate<W>(act, alpha, load<W>(buf) + load<W>(bb)));
      std::memcpy(yr + i, buf, size_t(h - i) * 4);
    }
  }
}

struct SkipNormArgs {
  const float *x, *skip, *gamma, *beta, *bias;  // beta, bias may be null
  float *y, *mean, *inv_std, *sum;               // mean, inv_std, sum may be null
  int64_t h, skip_rows;                          // the skip repeats every skip_rows rows
  float eps;
  bool simplified;
};

template <int W>
SLIM_INLINE typename Vec<W>::F masked_load(const float* p, int64_t n) {
  float buf[W] = {};
  std::memcpy(buf, p, size_t(n) * 4);
  return load<W>(buf);
}

template <int W>
SLIM_INLINE float lanes_sum(typename Vec<W>::F v) {
  float s = 0;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

// s = x + skip + bias, then (s - mean) / sqrt(var + eps) * gamma + beta per row of h
// values (the simplified form: s / sqrt(mean(s^2) + eps) * gamma). s goes to `sum`, or
// to y first when the sum is not wanted.
template <int W>
SLIM_INLINE void skip_norm_rows(const SkipNormArgs& a, int64_t r0, int64_t r1) {
  using F = typename Vec<W>::F;
  const int64_t h = a.h;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = a.x + r * h;
    const float* kr = a.skip + (r % a.skip_rows) * h;
    float* s = (a.sum ? a.sum : a.y) + r * h;
    F acc = splat<W>(0.f);
    int64_t i = 0;
    for (; i + W <= h; i += W) {
      F v = load<W>(xr + i) + load<W>(kr + i);
      if (a.bias) v = v + load<W>(a.bias + i);
      store<W>(s + i, v);
      acc = acc + v;
    }
    for (; i < h; ++i) {
      s[i] = xr[i] + kr[i] + (a.bias ? a.bias[i] : 0.f);
      acc[0] += s[i];
    }
    const float mean = a.simplified ? 0.f : lanes_sum<W>(acc) / float(h);
    F var = splat<W>(0.f);
    const F vm = splat<W>(mean);
    for (i = 0; i + W <= h; i += W) {
      const F d = load<W>(s + i) - vm;
      var = var + d * d;
    }
    if (i < h) {
      F d = masked_load<W>(s + i, h - i) - vm;
      for (int64_t j = h - i; j < W; ++j) d[j] = 0.f;  // lanes past the row
      var = var + d * d;
    }
    const float inv = 1.f / std::sqrt(lanes_sum<W>(var) / float(h) + a.eps);
    float* yr = a.y + r * h;
    const F vi = splat<W>(inv);
    for (i = 0; i + W <= h; i += W) {
      F v = (load<W>(s + i) - vm) * vi * load<W>(a.gamma + i);
      if (a.beta) v = v + load<W>(a.beta + i);
      store<W>(yr + i, v);
    }
    for (; i < h; ++i) yr[i] = (s[i] - mean) * inv * a.gamma[i] + (a.beta ? a.beta[i] : 0.f);
    if (a.mean) a.mean[r] = mean;
    if (a.inv_std) a.inv_std[r] = inv;
  }
}

#if defined(__x86_64__)
#define SLIM_CONTRIB_DISPATCH(name, params, args)                                  \
  __attribute__((target("avx512f"))) void name##_avx512 params { name<16> args; } \
  __attribute__((target("avx2,fma"))) void name##_avx2 params { name<8> args; }   \
  void name##_any params {                                                         \
    switch (detected_isa()) {                                                      \
      case Isa::avx512: return name##_avx512 args;                                 \
      case Isa::avx2: return name##_avx2 args;                                     \
      default: return name<1> args;                                                \
    }                                                                              \
  }
#elif defined(__aarch64__)
#define SLIM_CONTRIB_DISPATCH(name, params, args)      \
  void name##_any params {                             \
    if (detected_isa() == Isa::neon) return name<4> args; \
    return name<1> args;                               \
  }
#else
#define SLIM_CONTRIB_DISPATCH(name, params, args) \
  void name##_any params { return name<1> args; }
#endif

SLIM_CONTRIB_DISPATCH(activation_rows,
                      (Act act, float alpha, const float* x, const float* bias, float* y, int64_t h, int64_t r0,
                       int64_t r1),
                      (act, alpha, x, bias, y, h, r0, r1))
SLIM_CONTRIB_DISPATCH(skip_norm_rows, (const SkipNormArgs& a, int64_t r0, int64_t r1), (a, r0, r1))

// fn(begin, end) over [0, rows) rows of `h` values on slim's pool; inline under 256K values.
template <typename Fn>
void split_rows(const KernelContext& ctx, int64_t rows, int64_t h, Fn&& fn) {
  const int64_t threads = std::min<int64_t>(ctx.pool().num_threads(), rows * h / (1 << 18));
  if (threads < 2 || rows < 2) return fn(int64_t(0), rows);
  ctx.pool().parallel_for(rows, fn, std::max<int64_t>(1, rows / (4 * threads)));
}

void require_f32(const KernelContext& ctx, const Tensor* t, const char* name) {
  if (t && t->dtype() != DType::f32)
    ctx.fail(ErrorCode::internal, std::string("cpu kernel claimed f32 but ") + name + " is " + t->describe());
}

class ActivationKernel final : public OpKernel {
 public:
  ActivationKernel(Act act, float alpha, bool bias_required) : act_(act), alpha_(alpha), bias_required_(bias_required) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor* bias = bias_required_ ? &ctx.required_input(1) : ctx.input(1);
    require_f32(ctx, &x, "X");
    require_f32(ctx, bias, "bias");
    const int64_t h = bias ? bias->numel() : std::max<int64_t>(x.rank() ? x.dim(-1) : 1, 1);
    if (bias && (bias->rank() != 1 || x.rank() == 0 || x.dim(-1) != h))
      ctx.fail(ErrorCode::invalid_argument, "bias " + bias->describe() + " must be 1-D with X's last dim, X is " +
                                                x.describe());
    Tensor& y = ctx.output(0, DType::f32, x.shape());
    const float* b = bias ? bias->data<float>() : nullptr;
    split_rows(ctx, x.numel() / h, h, [&](int64_t r0, int64_t r1) {
      activation_rows_any(act_, alpha_, x.data<float>(), b, y.data<float>(), h, r0, r1);
    });
  }

 private:
  Act act_;
  float alpha_;
  bool bias_required_;
};

class SkipNormKernel final : public OpKernel {
 public:
  SkipNormKernel(bool simplified, float eps) : simplified_(simplified), eps_(eps) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& skip = ctx.required_input(1);
    const Tensor& gamma = ctx.required_input(2);
    const Tensor* beta = simplified_ ? nullptr : ctx.input(3);
    const Tensor* bias = ctx.input(simplified_ ? 3 : 4);
    for (const Tensor* t : {&x, &skip, &gamma, beta, bias}) require_f32(ctx, t, "an input");
    const int64_t h = x.rank() ? x.dim(-1) : 0;
    const auto fail_shapes = [&] {
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + ", skip " + skip.describe() + " and gamma " +
                                                gamma.describe() + " do not fit");
    };
    if (x.rank() < 2 || h == 0 || gamma.numel() != h || skip.numel() == 0 || skip.dim(-1) != h ||
        x.numel() % skip.numel() != 0 || (beta && beta->numel() != h) || (bias && bias->numel() != h))
      fail_shapes();
    Shape tail = skip.shape();
    while (tail.size() > 1 && tail.front() == 1) tail.erase(tail.begin());
    if (tail.size() > x.shape().size() || !std::equal(tail.rbegin(), tail.rend(), x.shape().rbegin())) fail_shapes();
    const int64_t rows = x.numel() / h;
    Shape stat = x.shape();
    stat.back() = 1;
    SkipNormArgs a{x.data<float>(), skip.data<float>(), gamma.data<float>(),
                   beta ? beta->data<float>() : nullptr, bias ? bias->data<float>() : nullptr,
                   ctx.output(0, DType::f32, x.shape()).data<float>(),
                   ctx.output_wanted(1) ? ctx.output(1, DType::f32, stat).data<float>() : nullptr,
                   ctx.output_wanted(2) ? ctx.output(2, DType::f32, stat).data<float>() : nullptr,
                   ctx.output_wanted(3) ? ctx.output(3, DType::f32, x.shape()).data<float>() : nullptr,
                   h, skip.numel() / h, eps_, simplified_};
    split_rows(ctx, rows, h, [&](int64_t r0, int64_t r1) { skip_norm_rows_any(a, r0, r1); });
  }

 private:
  bool simplified_;
  float eps_;
};

// The input that fixes T's dtype is f32: a known one, or (unknown) a constant of the
// same type constraint (gamma), so an f16 model never reaches these kernels.
std::optional<std::string> need_f32_or_typed_by(const KernelBuildInfo& info, int i, int typed_by) {
  const NodeInputInfo& in = info.input(i);
  if (in.dtype) return need_f32(info, i);
  if (typed_by >= 0 && info.input(typed_by).dtype == DType::f32) return std::nullopt;
  return "dtype of input " + std::to_string(i) + " is unknown";
}

// bias_input: input 1 is a bias along X's last axis (required when bias_required).
KernelDef activation_def(const char* op, Act act, bool bias_input, bool bias_required = false) {
  KernelDef def;
  def.op_type = op;
  def.domain = "com.microsoft";
  def.claim = [bias_input](const KernelBuildInfo& info) {
    if (info.node.outputs.size() != 1) return Claim::no("expects one output");
    if (bias_input && info.has_input(1)) {
      if (auto r = need_f32_or_typed_by(info, 1, 0)) return Claim::no(*r);
      if (auto r = need_f32_or_typed_by(info, 0, 1)) return Claim::no(*r);
    } else if (auto r = need_f32(info, 0)) {
      return Claim::no(*r);
    }
    return Claim::yes();
  };
  def.build = [act, bias_required](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<ActivationKernel>(act, info.node.attr_float("alpha", 1.702f), bias_required);
  };
  return def;
}

KernelDef skip_norm_def(bool simplified) {
  KernelDef def;
  def.op_type = simplified ? "SkipSimplifiedLayerNormalization" : "SkipLayerNormalization";
  def.domain = "com.microsoft";
  def.claim = [simplified](const KernelBuildInfo& info) {
    if (simplified && info.node.outputs.size() > 1 && !info.node.outputs[1].empty())
      return Claim::no("output 1 (mean) of the RMS normalization");
    if (auto r = need_f32(info, 2)) return Claim::no(*r);
    for (int i : {0, 1, 3, 4})
      if (info.has_input(i))
        if (auto r = need_f32_or_typed_by(info, i, 2)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [simplified](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<SkipNormKernel>(simplified, info.node.attr_float("epsilon", 1e-12f));
  };
  return def;
}

}  // namespace

void register_contrib_kernels(KernelRegistry& r) {
  r.add(activation_def("Gelu", Act::gelu, false));
  r.add(activation_def("BiasGelu", Act::gelu, true, true));
  r.add(activation_def("FastGelu", Act::fast_gelu, true));
  r.add(activation_def("QuickGelu", Act::quick_gelu, false));
  r.add(skip_norm_def(false));
  r.add(skip_norm_def(true));
}

}  // namespace slim::cpu
