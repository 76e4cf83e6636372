// The cpu provider's own math kernels: f32 binary arithmetic (and Max/Min) with numpy
// broadcasting and, on the same walk, comparisons and logical ops of any dtype;
// activations, Softmax/LogSoftmax, LayerNormalization, BatchNormalization and
// ReduceSum/Mean/Max/Min. Loops are vectorized (simd.h, AVX-512/AVX2 chosen at run time,
// scalar fallback) and split over the threads when a tensor is large enough to pay for
// the hand-off.
#include <algorithm>
#include <cfloat>
#include <numeric>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/simd.h"
#include "slim/core/convert.h"
#include "slim/core/dispatch.h"
#include "slim/runtime/provider.h"

namespace slim::cpu {

namespace {

template <typename Fn>
void parallel_items(const KernelContext& ctx, int64_t n, int64_t cost, Fn&& fn) {
  cpu::parallel_items(ctx, n, cost, kElementsPerThread, fn);
}

// ---------------------------------------------------------------------------------------
// Unary activations

enum class Unary {
  relu, leaky_relu, sigmoid, tanh, erf, gelu, gelu_tanh, hard_swish, hard_sigmoid, exp, neg, abs, clip,
  sqrt, square, pow_half,  // Sqrt; Pow by 2 and by 0.5
  log,
};

struct UnaryParams {
  Unary op = Unary::relu;
  float alpha = 0.f, beta = 0.f;  // clip: the bounds
};

template <int W>
SLIM_INLINE typename Vec<W>::F unary_vec(const UnaryParams& p, typename Vec<W>::F x) {
  using F = typename Vec<W>::F;
  const F zero = splat<W>(0.f), one = splat<W>(1.f), half = splat<W>(0.5f);
  switch (p.op) {
    case Unary::relu: return x > zero ? x : zero;
    case Unary::leaky_relu: return x < zero ? x * splat<W>(p.alpha) : x;
    case Unary::sigmoid: return vsigmoid<W>(x);
    case Unary::tanh: return vtanh<W>(x);
    case Unary::erf: return verf<W>(x);
    case Unary::gelu: return half * x * (one + verf<W>(x * splat<W>(0.70710678118654752f)));
    case Unary::gelu_tanh: {
      const F inner = splat<W>(0.7978845608028654f) * (x + splat<W>(0.044715f) * x * x * x);
      return half * x * (one + vtanh<W>(inner));
    }
    case Unary::hard_swish: {
      const F h = vmin<W>(vmax<W>(x * splat<W>(1.f / 6.f) + half, zero), one);
      return x * h;
    }
    case Unary::hard_sigmoid:
      return vmin<W>(vmax<W>(x * splat<W>(p.alpha) + splat<W>(p.beta), zero), one);
    case Unary::exp: return vexp<W>(x);
    case Unary::neg: return -x;
    case Unary::abs: return x < zero ? -x : x;
    case Unary::clip: {
      // NaN compares false and passes through, as in ref.
      x = x < splat<W>(p.alpha) ? splat<W>(p.alpha) : x;
      return x > splat<W>(p.beta) ? splat<W>(p.beta) : x;
    }
    case Unary::square: return x * x;  // exact in double, so ref's pow(x, 2) rounds to the same
    case Unary::log: {
      F r;  // logf per lane: ref's std::log on floats, to the bit
      for (int i = 0; i < W; ++i) r[i] = std::log(x[i]);
      return r;
    }
    case Unary::sqrt:
    case Unary::pow_half: {
      F r;
      for (int i = 0; i < W; ++i) r[i] = __builtin_sqrtf(x[i]);
      if (p.op == Unary::sqrt) return r;
      // pow(x, 0.5): +0 for -0 (adding +0 does that) and +inf for -inf.
      r = r + zero;
      return x == splat<W>(-INFINITY) ? splat<W>(INFINITY) : r;
    }
  }
  return x;
}

float unary_scalar(const UnaryParams& p, float x) {
  switch (p.op) {
    case Unary::relu: return x > 0.f ? x : 0.f;
    case Unary::leaky_relu: return x < 0.f ? x * p.alpha : x;
    case Unary::sigmoid: return float(1.0 / (1.0 + std::exp(-double(x))));
    case Unary::tanh: return std::tanh(x);
    case Unary::erf: return std::erf(x);
    case Unary::gelu: return float(0.5 * x * (1.0 + std::erf(double(x) * 0.70710678118654752)));
    case Unary::gelu_tanh:
      return float(0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * double(x) * x * x))));
    case Unary::hard_swish: return x * std::min(std::max(x / 6.f + 0.5f, 0.f), 1.f);
    case Unary::hard_sigmoid: return std::min(std::max(x * p.alpha + p.beta, 0.f), 1.f);
    case Unary::exp: return std::exp(x);
    case Unary::neg: return -x;
    case Unary::abs: return std::fabs(x);
    case Unary::clip: {
      x = x < p.alpha ? p.alpha : x;
      return x > p.beta ? p.beta : x;
    }
    case Unary::square: return x * x;
    case Unary::sqrt: return std::sqrt(x);
    case Unary::log: return std::log(x);
    case Unary::pow_half: return std::pow(x, 0.5f);
  }
  return x;
}

// Whole vectors, then the tail through a padded vector so every element takes the same path.
template <int W>
SLIM_INLINE void unary_loop(const UnaryParams& p, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store<W>(y + i, unary_vec<W>(p, load<W>(x + i)));
  if (i < n) {
    float buf[W] = {};
    std::memcpy(buf, x + i, size_t(n - i) * 4);
    store<W>(buf, unary_vec<W>(p, load<W>(buf)));
    std::memcpy(y + i, buf, size_t(n - i) * 4);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void unary_avx512(const UnaryParams& p, const float* x, float* y, int64_t n) {
  unary_loop<16>(p, x, y, n);
}
__attribute__((target("avx2,fma"))) void unary_avx2(const UnaryParams& p, const float* x, float* y, int64_t n) {
  unary_loop<8>(p, x, y, n);
}
#elif defined(__aarch64__)
// ASIMD is part of the aarch64 base architecture: 4-lane vectors need no target attribute.
void unary_neon(const UnaryParams& p, const float* x, float* y, int64_t n) { unary_loop<4>(p, x, y, n); }
#endif

void unary_run(const UnaryParams& p, const float* x, float* y, int64_t n) {
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512: return unary_avx512(p, x, y, n);
    case Isa::avx2: return unary_avx2(p, x, y, n);
#elif defined(__aarch64__)
    case Isa::neon: return unary_neon(p, x, y, n);
#endif
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = unary_scalar(p, x[i]);
      return;
  }
}

void unary_compute(KernelContext& ctx, const UnaryParams& p, const ChannelPassThrough& layout) {
  const Tensor& x = ctx.required_input(0);
  Tensor& y = ctx.output(0, DType::f32, x.shape());
  const float* px = x.data<float>();
  float* py = layout.target(y);
  constexpr int64_t kBlock = 4096;
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  parallel_items(ctx, blocks, kBlock, [&](int64_t b, int64_t e) {
    const int64_t lo = b * kBlock, hi = std::min(n, e * kBlock);
    unary_run(p, px + lo, py + lo, hi - lo);
  });
  layout.finish(ctx, y);
}

// A one-input elementwise kernel: takes its input's channel layout and passes it on. Its
// output has the input's shape, so compile needs no probe run (a Relu of a 1024x1024
// network's activations took a second of compile each).
class ElementwiseKernel : public OpKernel {
 public:
  explicit ElementwiseKernel(const Shape& shape) : shape_(shape) { layout_.set_shape(shape); }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = shape_;
    return i == 0;
  }
  uint64_t private_output_layout(int i) const override { return i == 0 ? layout_.offer() : 0; }
  bool accepts_private_input(int i, uint64_t layout) const override { return i == 0 && layout_.accepts(layout); }
  void use_private_input(int i, uint64_t layout) override { layout_.use_input(layout); }
  void use_private_output(int i, uint64_t layout) override { layout_.use_output(layout); }

 protected:
  Shape shape_;
  ChannelPassThrough layout_;
};

class UnaryKernel final : public ElementwiseKernel {
 public:
  UnaryKernel(UnaryParams p, const Shape& shape) : ElementwiseKernel(shape), p_(p) {}
  void compute(KernelContext& ctx) const override { unary_compute(ctx, p_, layout_); }

 private:
  UnaryParams p_;
};

std::optional<std::string> need_one_f32_static(const KernelBuildInfo& info) {
  if (info.inputs.size() != 1 || info.node.outputs.size() != 1) return std::string("expects one input and one output");
  if (auto r = need_f32(info, 0)) return r;
  return need_static(info, 0);
}

KernelDef unary_def(const std::string& op, int64_t since, Unary kind) {
  KernelDef def;
  def.op_type = op;
  def.since_version = since;
  auto params = [kind](const Node& node, UnaryParams* p) -> std::optional<std::string> {
    p->op = kind;
    if (kind == Unary::leaky_relu) p->alpha = node.attr_float("alpha", 0.01f);
    if (kind == Unary::hard_sigmoid) {
      p->alpha = node.attr_float("alpha", 0.2f);
      p->beta = node.attr_float("beta", 0.5f);
    }
    if (kind == Unary::gelu) {
      const std::string approx = node.attr_string("approximate", "none");
      if (approx == "tanh") p->op = Unary::gelu_tanh;
      else if (approx != "none") return "approximate '" + approx + "'";
    }
    return std::nullopt;
  };
  def.claim = [params](const KernelBuildInfo& info) {
    if (auto r = need_one_f32_static(info)) return Claim::no(*r);
    UnaryParams p;
    if (auto r = params(info.node, &p)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [params](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    UnaryParams p;
    if (auto r = params(info.node, &p)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<UnaryKernel>(p, *info.input(0).shape);
  };
  return def;
}

// Clip: bounds from the attributes (opsets 6-10, defaulting to the float range) or from
// optional one-element inputs (11+), read at each run so they need not be constants.
class ClipKernel final : public ElementwiseKernel {
 public:
  ClipKernel(const Shape& shape, float lo, float hi, bool bound_inputs)
      : ElementwiseKernel(shape), lo_(lo), hi_(hi), bound_inputs_(bound_inputs) {}
  void compute(KernelContext& ctx) const override {
    UnaryParams p{Unary::clip, lo_, hi_};
    for (int i = 1; bound_inputs_ && i <= 2; ++i) {
      const Tensor* b = ctx.input(i);
      if (!b) continue;
      if (b->dtype() != DType::f32 || b->numel() != 1)
        ctx.fail(ErrorCode::invalid_argument, std::string(i == 1 ? "min" : "max") +
                                                  " must be a one-element f32 tensor, got " + b->describe());
      (i == 1 ? p.alpha : p.beta) = b->data<float>()[0];
    }
    unary_compute(ctx, p, layout_);
  }

 private:
  float lo_, hi_;
  bool bound_inputs_;
};

KernelDef clip_def() {
  KernelDef def;
  def.op_type = "Clip";
  def.since_version = 6;  // opset 1's bounds and consumed_inputs are not worth a kernel
  def.claim = [](const KernelBuildInfo& info) {
    if (info.node.outputs.size() != 1) return Claim::no("expects one output");
    if (auto r = need_f32(info, 0)) return Claim::no(*r);
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    for (int i = 1; i < int(info.inputs.size()); ++i)
      if (info.has_input(i))
        if (auto r = need_f32(info, i)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    const Shape& s = *info.input(0).shape;
    if (info.opset >= 11) return std::make_unique<ClipKernel>(s, -INFINITY, INFINITY, true);
    return std::make_unique<ClipKernel>(s, info.node.attr_float("min", -FLT_MAX), info.node.attr_float("max", FLT_MAX),
                                        false);
  };
  return def;
}

// Pow by a constant scalar exponent of 2 or 0.5 (the squares and roots of normalizations
// written out); other exponents stay with ref.
KernelDef pow_def() {
  KernelDef def;
  def.op_type = "Pow";
  def.since_version = 7;  // before 7: the broadcast/axis attributes
  auto kind = [](const KernelBuildInfo& info, Unary* op) -> std::optional<std::string> {
    if (info.inputs.size() != 2 || info.node.outputs.size() != 1) return std::string("expects two inputs");
    if (auto r = need_f32(info, 0)) return r;
    if (auto r = need_static(info, 0)) return r;
    const Tensor* e = info.input(1).constant;
    if (!e || e->numel() != 1 || e->rank() > int(info.input(0).shape->size()))
      return std::string("exponent is not a constant scalar");
    const double v = tensor_to_doubles(*e)[0];
    if (v == 2.0) *op = Unary::square;
    else if (v == 0.5) *op = Unary::pow_half;
    else return "exponent " + std::to_string(v);
    return std::nullopt;
  };
  def.claim = [kind](const KernelBuildInfo& info) {
    Unary op;
    if (auto r = kind(info, &op)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    UnaryParams p;
    if (auto r = kind(info, &p.op)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<UnaryKernel>(p, *info.input(0).shape);
  };
  return def;
}

// ---------------------------------------------------------------------------------------
// Binary arithmetic with broadcasting

enum class Binary { add, sub, mul, div, max, min };

template <int W>
SLIM_INLINE typename Vec<W>::F binary_vec(Binary op, typename Vec<W>::F a, typename Vec<W>::F b) {
  switch (op) {
    case Binary::add: return a + b;
    case Binary::sub: return a - b;
    case Binary::mul: return a * b;
    case Binary::div: return a / b;
    // NaN wins, as in ref (numpy's maximum/minimum); else b only when strictly beyond a.
    case Binary::max: return (a != a) | (b != b) ? splat<W>(NAN) : (b > a ? b : a);
    case Binary::min: return (a != a) | (b != b) ? splat<W>(NAN) : (b < a ? b : a);
  }
  return a;
}

float binary_scalar(Binary op, float x, float z) {
  switch (op) {
    case Binary::add: return x + z;
    case Binary::sub: return x - z;
    case Binary::mul: return x * z;
    case Binary::div: return x / z;
    case Binary::max: return std::isnan(x) || std::isnan(z) ? NAN : (z > x ? z : x);
    case Binary::min: return std::isnan(x) || std::isnan(z) ? NAN : (z < x ? z : x);
  }
  return x;
}

// One row: a and b advance by sa, sb in {0, 1} (0 = the operand is broadcast along it).
template <int W>
SLIM_INLINE void binary_row(Binary op, const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  using F = typename Vec<W>::F;
  int64_t i = 0;
  const F va0 = splat<W>(a[0]), vb0 = splat<W>(b[0]);
  for (; i + W <= n; i += W) {
    const F va = sa ? load<W>(a + i) : va0;
    const F vb = sb ? load<W>(b + i) : vb0;
    store<W>(y + i, binary_vec<W>(op, va, vb));
  }
  for (; i < n; ++i) y[i] = binary_scalar(op, a[sa * i], b[sb * i]);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void binary_avx512(Binary op, const float* a, int64_t sa, const float* b, int64_t sb,
                                                      float* y, int64_t n) {
  binary_row<16>(op, a, sa, b, sb, y, n);
}
__attribute__((target("avx2,fma"))) void binary_avx2(Binary op, const float* a, int64_t sa, const float* b, int64_t sb,
                                                     float* y, int64_t n) {
  binary_row<8>(op, a, sa, b, sb, y, n);
}
#elif defined(__aarch64__)
void binary_neon(Binary op, const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  binary_row<4>(op, a, sa, b, sb, y, n);
}
#endif
void binary_run(Binary op, const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512: return binary_avx512(op, a, sa, b, sb, y, n);
    case Isa::avx2: return binary_avx2(op, a, sa, b, sb, y, n);
#elif defined(__aarch64__)
    case Isa::neon: return binary_neon(op, a, sa, b, sb, y, n);
#endif
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = binary_scalar(op, a[sa * i], b[sb * i]);
      return;
  }
}

// ---------------------------------------------------------------------------------------
// Comparisons and logical ops: two inputs of one dtype (any numeric one; bool for Equal
// and the logical ops), a bool output, the same broadcast walk as the arithmetic.

enum class Predicate { eq, lt, gt, le, ge, logical_and, logical_or, logical_xor };

// On scalars a bool; on GCC vectors a lane mask (-1 where true).
template <typename X>
SLIM_INLINE auto predicate(Predicate op, X a, X b) {
  switch (op) {
    case Predicate::eq: return a == b;
    case Predicate::lt: return a < b;
    case Predicate::gt: return a > b;
    case Predicate::le: return a <= b;
    case Predicate::ge: return a >= b;
    case Predicate::logical_and: return a && b;
    case Predicate::logical_or: return a || b;
    case Predicate::logical_xor: return (a != X{}) != (b != X{});
  }
  return a == b;
}

// f16/bf16 compare as float (exactly); bool lanes are bytes.
template <typename T>
using PredicateLane = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float,
                                         std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

// One row, a and b advancing by sa, sb in {0, 1}; W floats' worth of bytes per vector.
template <int W, typename T>
SLIM_INLINE void predicate_row(Predicate op, const T* a, int64_t sa, const T* b, int64_t sb, bool* y, int64_t n) {
  using L = PredicateLane<T>;
  int64_t i = 0;
  if constexpr (W > 1 && sizeof(L) == sizeof(T)) {
    constexpr int lanes = W * 4 / int(sizeof(T));
    typedef L V __attribute__((vector_size(lanes * sizeof(T))));
    typedef uint8_t B __attribute__((vector_size(lanes)));
    V va0, vb0;
    for (int k = 0; k < lanes; ++k) va0[k] = L(a[0]), vb0[k] = L(b[0]);
    for (; i + lanes <= n; i += lanes) {
      V va = va0, vb = vb0;
      if (sa) std::memcpy(&va, a + i, sizeof va);
      if (sb) std::memcpy(&vb, b + i, sizeof vb);
      const B r = __builtin_convertvector(predicate(op, va, vb), B) & 1;
      std::memcpy(y + i, &r, sizeof r);
    }
  }
  for (; i < n; ++i) y[i] = predicate(op, L(a[sa * i]), L(b[sb * i]));
}

#if defined(__x86_64__)
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void predicate_avx512(
    Predicate op, const T* a, int64_t sa, const T* b, int64_t sb, bool* y, int64_t n) {
  predicate_row<16>(op, a, sa, b, sb, y, n);
}
template <typename T>
__attribute__((target("avx2,fma"))) void predicate_avx2(Predicate op, const T* a, int64_t sa, const T* b, int64_t sb,
                                                        bool* y, int64_t n) {
  predicate_row<8>(op, a, sa, b, sb, y, n);
}
#endif

template <typename T>
void predicate_run(int op, const char* a, int64_t sa, const char* b, int64_t sb, char* y, int64_t n) {
  const Predicate p = Predicate(op);
  const T* ta = reinterpret_cast<const T*>(a);
  const T* tb = reinterpret_cast<const T*>(b);
  bool* ty = reinterpret_cast<bool*>(y);
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512: return predicate_avx512<T>(p, ta, sa, tb, sb, ty, n);
    case Isa::avx2: return predicate_avx2<T>(p, ta, sa, tb, sb, ty, n);
#elif defined(__aarch64__)
    case Isa::neon: return predicate_row<4>(p, ta, sa, tb, sb, ty, n);
#endif
    default: return predicate_row<1>(p, ta, sa, tb, sb, ty, n);
  }
}

// A row function of the walk below: an op of either kind, element pointers as bytes.
using RowFn = void (*)(int op, const char* a, int64_t sa, const char* b, int64_t sb, char* y, int64_t n);

void arithmetic_run(int op, const char* a, int64_t sa, const char* b, int64_t sb, char* y, int64_t n) {
  binary_run(Binary(op), reinterpret_cast<const float*>(a), sa, reinterpret_cast<const float*>(b), sb,
             reinterpret_cast<float*>(y), n);
}

// The broadcast walk, worked out at compile time: outer dims (coalesced where both
// operands continue contiguously) with each operand's strides, and one inner row.
struct BroadcastPlan {
  Shape y;
  Shape outer, a_str, b_str;  // outer dims and the element strides of a and b along them
  int64_t inner = 1, a_inner = 1, b_inner = 1;
  int64_t rows = 1;
};

std::optional<BroadcastPlan> plan_broadcast(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape ap(rank - a.size(), 1), bp(rank - b.size(), 1);
  ap.insert(ap.end(), a.begin(), a.end());
  bp.insert(bp.end(), b.begin(), b.end());
  BroadcastPlan p;
  p.y.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    if (ap[d] != bp[d] && ap[d] != 1 && bp[d] != 1) return std::nullopt;
    p.y[d] = ap[d] == 1 ? bp[d] : ap[d];
  }
  const Shape as = contiguous_strides(ap), bs = contiguous_strides(bp);
  // Dims with their broadcast strides, size-1 output dims dropped.
  Shape dims, sa, sb;
  for (size_t d = 0; d < rank; ++d) {
    if (p.y[d] == 1) continue;
    dims.push_back(p.y[d]);
    sa.push_back(ap[d] == 1 ? 0 : as[d]);
    sb.push_back(bp[d] == 1 ? 0 : bs[d]);
  }
  // Coalesce from the inside out.
  Shape cd, ca, cb;
  for (size_t i = dims.size(); i-- > 0;) {
    if (!cd.empty() && sa[i] == ca.front() * cd.front() && sb[i] == cb.front() * cd.front()) {
      cd.front() *= dims[i];
      continue;
    }
    cd.insert(cd.begin(), dims[i]);
    ca.insert(ca.begin(), sa[i]);
    cb.insert(cb.begin(), sb[i]);
  }
  if (cd.empty()) {
    cd = {1};
    ca = {1};
    cb = {1};
  }
  // Coalescing merged a zero-stride dim only with other zero-stride dims, so the inner
  // strides are 0 or 1 as binary_row needs.
  p.inner = cd.back();
  p.a_inner = ca.back() ? 1 : 0;
  p.b_inner = cb.back() ? 1 : 0;
  if ((ca.back() != 0 && ca.back() != 1) || (cb.back() != 0 && cb.back() != 1)) return std::nullopt;
  p.outer.assign(cd.begin(), cd.end() - 1);
  p.a_str.assign(ca.begin(), ca.end() - 1);
  p.b_str.assign(cb.begin(), cb.end() - 1);
  p.rows = shape_numel(p.outer);
  return p;
}

class BinaryKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = out_dtype_;
    *shape = p_.y;
    return i == 0;
  }
  // `row` runs `op` on rows of `in_dtype` into rows of `out_dtype`. `full`: the operand of
  // the output's shape when the other is a single element (f32 arithmetic then passes
  // that operand's channel layout through), else -1.
  // `b`, when defined, is the second operand instead of input 1 (Not is x == false).
  BinaryKernel(RowFn row, int op, DType in_dtype, DType out_dtype, BroadcastPlan plan, int full, Tensor b = {})
      : row_(row), op_(op), in_size_(int64_t(dtype_size(in_dtype))), out_size_(int64_t(dtype_size(out_dtype))),
        out_dtype_(out_dtype), p_(std::move(plan)), full_(full), b_(std::move(b)) {
    layout_.set_shape(p_.y);
  }
  uint64_t private_output_layout(int i) const override { return i == 0 ? layout_.offer() : 0; }
  bool accepts_private_input(int i, uint64_t layout) const override { return i == full_ && layout_.accepts(layout); }
  void use_private_input(int i, uint64_t layout) override { layout_.use_input(layout); }
  void use_private_output(int i, uint64_t layout) override { layout_.use_output(layout); }
  void compute(KernelContext& ctx) const override {
    const Tensor& a = ctx.required_input(0);
    const Tensor& b = b_.defined() ? b_ : ctx.required_input(1);
    Tensor& y = ctx.output(0, out_dtype_, p_.y);
    if (y.numel() == 0) return;
    const char* pa = static_cast<const char*>(a.raw_data());
    const char* pb = static_cast<const char*>(b.raw_data());
    char* py = full_ >= 0 ? reinterpret_cast<char*>(layout_.target(y)) : static_cast<char*>(y.raw_data());
    // Long rows are cut into pieces so a single row still spreads over the threads.
    const int64_t piece = p_.rows >= 8 ? p_.inner : std::max<int64_t>(4096, (p_.inner + 7) / 8);
    const int64_t pieces = (p_.inner + piece - 1) / piece;
    parallel_items(ctx, p_.rows * pieces, std::min(piece, p_.inner), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t row = t / pieces, lo = (t % pieces) * piece, n = std::min(piece, p_.inner - lo);
        int64_t oa = 0, ob = 0, r = row;
        for (size_t d = p_.outer.size(); d-- > 0;) {
          const int64_t i = r % p_.outer[d];
          r /= p_.outer[d];
          oa += i * p_.a_str[d];
          ob += i * p_.b_str[d];
        }
        row_(op_, pa + (oa + lo * p_.a_inner) * in_size_, p_.a_inner, pb + (ob + lo * p_.b_inner) * in_size_,
             p_.b_inner, py + (row * p_.inner + lo) * out_size_, n);
      }
    });
    if (full_ >= 0) layout_.finish(ctx, y);
  }

 private:
  RowFn row_;
  int op_;
  int64_t in_size_, out_size_;
  DType out_dtype_;
  BroadcastPlan p_;
  int full_;
  Tensor b_;
  ChannelPassThrough layout_;
};

std::optional<std::string> need_static_broadcast(const KernelBuildInfo& info) {
  if (info.inputs.size() != 2) return "expects two inputs";
  for (int i = 0; i < 2; ++i)
    if (auto r = need_static(info, i)) return r;
  if (!plan_broadcast(*info.input(0).shape, *info.input(1).shape)) return "shapes do not broadcast";
  return std::nullopt;
}

KernelDef binary_def(const std::string& op, Binary kind) {
  KernelDef def;
  def.op_type = op;
  def.since_version = 7;  // before 7 these ops had the `broadcast`/`axis` attributes
  def.claim = [](const KernelBuildInfo& info) {
    if (info.inputs.size() != 2) return Claim::no("expects two inputs");
    if (auto r = need_all_f32_static(info)) return Claim::no(*r);
    if (auto r = need_static_broadcast(info)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    const Shape &a = *info.input(0).shape, &b = *info.input(1).shape;
    auto plan = plan_broadcast(a, b);
    if (!plan) throw Error(ErrorCode::internal, info.node.describe() + ": shapes do not broadcast");
    const int full = shape_numel(b) == 1 && a == plan->y ? 0 : shape_numel(a) == 1 && b == plan->y ? 1 : -1;
    return std::make_unique<BinaryKernel>(arithmetic_run, int(kind), DType::f32, DType::f32, std::move(*plan), full);
  };
  return def;
}

// `numeric`: Less, Greater and the ...OrEqual forms take numbers; Equal takes bools too,
// the logical ops bools only.
KernelDef predicate_def(const std::string& op, int64_t since, Predicate kind) {
  const bool logical = kind >= Predicate::logical_and, numeric = kind != Predicate::eq && !logical;
  KernelDef def;
  def.op_type = op;
  def.since_version = since;
  def.claim = [=](const KernelBuildInfo& info) {
    if (auto r = need_static_broadcast(info)) return Claim::no(*r);
    const auto &a = info.input(0).dtype, &b = info.input(1).dtype;
    if (!a || !b) return Claim::no("input dtypes are unknown");
    if (*a != *b) return Claim::no("inputs have different dtypes");
    if ((logical && *a != DType::boolean) || (numeric && *a == DType::boolean))
      return Claim::no(std::string("input 0 is ") + std::string(dtype_name(*a)));
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    auto plan = plan_broadcast(*info.input(0).shape, *info.input(1).shape);
    if (!plan) throw Error(ErrorCode::internal, info.node.describe() + ": shapes do not broadcast");
    const DType dt = *info.input(0).dtype;
    const RowFn row = visit_dtype(dt, [](auto tag) -> RowFn { return predicate_run<typename decltype(tag)::type>; });
    return std::make_unique<BinaryKernel>(row, int(kind), dt, DType::boolean, std::move(*plan), -1);
  };
  return def;
}

KernelDef not_def() {
  KernelDef def;
  def.op_type = "Not";
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = need_static(info, 0)) return Claim::no(*r);
    if (info.input(0).dtype != DType::boolean) return Claim::no("input 0 is not bool");
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<BinaryKernel>(predicate_run<bool>, int(Predicate::eq), DType::boolean, DType::boolean,
                                          *plan_broadcast(*info.input(0).shape, {}), -1, Tensor::scalar<bool>(false));
  };
  return def;
}

// ---------------------------------------------------------------------------------------
// Row kernels: Softmax, LogSoftmax, LayerNormalization, ReduceSum/ReduceMean

template <int W>
SLIM_INLINE float row_max(const float* x, int64_t n) {
  using F = typename Vec<W>::F;
  F m = splat<W>(-INFINITY);
  int64_t i = 0;
  for (; i + W <= n; i += W) m = vmax<W>(m, load<W>(x + i));
  float r = -INFINITY;
  for (int k = 0; k < W; ++k) r = std::max(r, m[k]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

template <int W>
SLIM_INLINE float row_sum(const float* x, int64_t n) {
  using F = typename Vec<W>::F;
  F s0 = splat<W>(0.f), s1 = splat<W>(0.f);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 += load<W>(x + i);
    s1 += load<W>(x + i + W);
  }
  for (; i + W <= n; i += W) s0 += load<W>(x + i);
  s0 += s1;
  double r = 0;
  for (int k = 0; k < W; ++k) r += s0[k];
  for (; i < n; ++i) r += x[i];
  return float(r);
}

// y = exp(x - m), returns the sum.
template <int W>
SLIM_INLINE float row_exp_sum(const float* x, float* y, int64_t n, float m) {
  using F = typename Vec<W>::F;
  F s = splat<W>(0.f);
  const F vm = splat<W>(m);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F e = vexp<W>(load<W>(x + i) - vm);
    store<W>(y + i, e);
    s += e;
  }
  double r = 0;
  for (int k = 0; k < W; ++k) r += s[k];
  if (i < n) {
    float buf[W];
    for (int k = 0; k < W; ++k) buf[k] = i + k < n ? x[i + k] - m : -INFINITY;
    store<W>(buf, vexp<W>(load<W>(buf)));
    for (int64_t k = 0; i + k < n; ++k) {
      y[i + k] = buf[k];
      r += buf[k];
    }
  }
  return float(r);
}

template <int W>
SLIM_INLINE void row_affine(const float* x, float* y, int64_t n, float mul, float add) {
  using F = typename Vec<W>::F;
  const F vm = splat<W>(mul), va = splat<W>(add);
  int64_t i = 0;
  for (; i + W <= n; i += W) store<W>(y + i, load<W>(x + i) * vm + va);
  for (; i < n; ++i) y[i] = x[i] * mul + add;
}

template <int W>
SLIM_INLINE void softmax_rows(const float* x, float* y, int64_t rows, int64_t n, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float m = row_max<W>(xr, n);
    if (log) {
      // exp into y as scratch, then overwrite with x - m - log(sum).
      const float s = row_exp_sum<W>(xr, yr, n, m);
      row_affine<W>(xr, yr, n, 1.f, -m - std::log(s));
    } else {
      const float s = row_exp_sum<W>(xr, yr, n, m);
      row_affine<W>(yr, yr, n, 1.f / s, 0.f);
    }
  }
}

template <int W>
SLIM_INLINE void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t n, const float* scale,
                                 const float* bias, float eps) {
  using F = typename Vec<W>::F;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float mean = row_sum<W>(xr, n) / float(n);
    // Second pass over the deviations: no cancellation from E[x^2] - E[x]^2.
    const F vm = splat<W>(mean);
    F acc = splat<W>(0.f);
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const F d = load<W>(xr + i) - vm;
      acc += d * d;
    }
    double var = 0;
    for (int k = 0; k < W; ++k) var += acc[k];
    for (; i < n; ++i) var += double(xr[i] - mean) * (xr[i] - mean);
    const float rstd = float(1.0 / std::sqrt(var / double(n) + double(eps)));
    const F vr = splat<W>(rstd);
    for (i = 0; i + W <= n; i += W) {
      F v = (load<W>(xr + i) - vm) * vr * load<W>(scale + i);
      if (bias) v += load<W>(bias + i);
      store<W>(yr + i, v);
    }
    for (; i < n; ++i) yr[i] = (xr[i] - mean) * rstd * scale[i] + (bias ? bias[i] : 0.f);
  }
}

// BatchNormalization: rows [first, first + rows) of an (N*C) x n matrix, row r in channel
// r % C: y = (x - mean) * k + b, the order of ref's terms.
template <int W>
SLIM_INLINE void batch_norm_rows(const float* x, float* y, int64_t first, int64_t rows, int64_t n, int64_t channels,
                                 const float* mean, const float* k, const float* b) {
  using F = typename Vec<W>::F;
  for (int64_t r = first; r < first + rows; ++r) {
    const int64_t c = r % channels;
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const F vm = splat<W>(mean[c]), vk = splat<W>(k[c]), vb = splat<W>(b[c]);
    int64_t i = 0;
    for (; i + W <= n; i += W) store<W>(yr + i, (load<W>(xr + i) - vm) * vk + vb);
    for (; i < n; ++i) yr[i] = (xr[i] - mean[c]) * k[c] + b[c];
  }
}

template <int W>
SLIM_INLINE void row_reduce(const float* x, float* y, int64_t rows, int64_t n, float mul) {
  for (int64_t r = 0; r < rows; ++r) y[r] = row_sum<W>(x + r * n, n) * mul;
}

// a NaN-propagating max (or min): once a NaN is in, it stays, as in ref.
SLIM_INLINE float extreme(float acc, float v, bool max) {
  return std::isnan(v) || (max ? v > acc : v < acc) ? v : acc;
}

template <int W>
SLIM_INLINE void row_extreme(const float* x, float* y, int64_t rows, int64_t n, bool max) {
  using F = typename Vec<W>::F;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    F m = splat<W>(max ? -INFINITY : INFINITY);
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const F v = load<W>(xr + i);
      if (max) m = (v != v) | (v > m) ? v : m;
      else m = (v != v) | (v < m) ? v : m;
    }
    float acc = max ? -INFINITY : INFINITY;
    for (int k = 0; k < W; ++k) acc = extreme(acc, m[k], max);
    for (; i < n; ++i) acc = extreme(acc, xr[i], max);
    y[r] = acc;
  }
}

SLIM_DISPATCH3(softmax_rows, (const float* x, float* y, int64_t rows, int64_t n, bool log), (x, y, rows, n, log))
SLIM_DISPATCH3(layer_norm_rows,
               (const float* x, float* y, int64_t rows, int64_t n, const float* s, const float* b, float eps),
               (x, y, rows, n, s, b, eps))
SLIM_DISPATCH3(batch_norm_rows,
               (const float* x, float* y, int64_t first, int64_t rows, int64_t n, int64_t channels, const float* m,
                const float* k, const float* b),
               (x, y, first, rows, n, channels, m, k, b))
SLIM_DISPATCH3(row_reduce, (const float* x, float* y, int64_t rows, int64_t n, float mul), (x, y, rows, n, mul))
SLIM_DISPATCH3(row_extreme, (const float* x, float* y, int64_t rows, int64_t n, bool max), (x, y, rows, n, max))

// Rows of length n from a shape split at `axis`.
void split_rows(const Shape& s, int axis, int64_t* rows, int64_t* n) {
  *rows = 1;
  *n = 1;
  for (int d = 0; d < int(s.size()); ++d) (d < axis ? *rows : *n) *= s[size_t(d)];
}

class SoftmaxKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = shape_;
    return i == 0;
  }
  SoftmaxKernel(Shape shape, int axis, bool log) : shape_(std::move(shape)), log_(log) {
    split_rows(shape_, axis, &rows_, &n_);
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    Tensor& y = ctx.output(0, DType::f32, shape_);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallel_items(ctx, rows_, n_, [&](int64_t b, int64_t e) {
      softmax_rows_any(px + b * n_, py + b * n_, e - b, n_, log_);
    });
  }

 private:
  Shape shape_;
  bool log_;
  int64_t rows_ = 1, n_ = 1;
};

// The axis a Softmax normalizes over, as a row split; nullopt when the rows are not
// contiguous (opset 13+ with an axis other than the last).
std::optional<int> softmax_axis(const KernelBuildInfo& info, std::string* why) {
  const Shape& s = *info.input(0).shape;
  const int rank = int(s.size());
  const int64_t def_axis = info.opset >= 13 ? -1 : 1;
  int64_t axis = info.node.attr_int("axis", def_axis);
  if (axis < -rank || axis >= std::max(rank, 1)) {
    *why = "axis out of range";
    return std::nullopt;
  }
  if (axis < 0) axis += rank;
  if (info.opset >= 13) {
    for (int d = int(axis) + 1; d < rank; ++d)
      if (s[size_t(d)] != 1) {
        *why = "softmax over an axis other than the last";
        return std::nullopt;
      }
  }
  return int(axis);
}

KernelDef softmax_def(const std::string& op, bool log) {
  KernelDef def;
  def.op_type = op;
  def.since_version = 1;
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = need_one_f32_static(info)) return Claim::no(*r);
    std::string why;
    if (!softmax_axis(info, &why)) return Claim::no(why);
    return Claim::yes();
  };
  def.build = [log](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    std::string why;
    const auto axis = softmax_axis(info, &why);
    if (!axis) throw Error(ErrorCode::internal, info.node.describe() + ": " + why);
    return std::make_unique<SoftmaxKernel>(*info.input(0).shape, *axis, log);
  };
  return def;
}

class LayerNormKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = shape_;
    return i == 0;
  }
  LayerNormKernel(Shape shape, int axis, float eps, bool bias) : shape_(std::move(shape)), eps_(eps), bias_(bias) {
    split_rows(shape_, axis, &rows_, &n_);
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const float* scale = ctx.required_input(1).data<float>();
    const float* bias = bias_ ? ctx.required_input(2).data<float>() : nullptr;
    Tensor& y = ctx.output(0, DType::f32, shape_);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallel_items(ctx, rows_, n_, [&](int64_t b, int64_t e) {
      layer_norm_rows_any(px + b * n_, py + b * n_, e - b, n_, scale, bias, eps_);
    });
  }

 private:
  Shape shape_;
  float eps_;
  bool bias_;
  int64_t rows_ = 1, n_ = 1;
};

std::optional<std::string> layer_norm_check(const KernelBuildInfo& info, int* axis_out) {
  if (info.node.outputs.size() != 1) return std::string("Mean/InvStdDev outputs are not implemented");
  if (info.node.attr_int("stash_type", 1) != 1) return std::string("stash_type other than float");
  if (auto r = need_all_f32_static(info)) return r;
  if (!info.has_input(1)) return std::string("missing Scale");
  const Shape& s = *info.input(0).shape;
  const int rank = int(s.size());
  int64_t axis = info.node.attr_int("axis", -1);
  if (axis < -rank || axis >= rank) return std::string("axis out of range");
  if (axis < 0) axis += rank;
  const Shape norm(s.begin() + axis, s.end());
  const int64_t n = shape_numel(norm);
  for (int i = 1; i <= 2; ++i)
    if (info.has_input(i) && shape_numel(*info.input(i).shape) != n)
      return std::string("Scale/B do not have the normalized shape");
  *axis_out = int(axis);
  return std::nullopt;
}

KernelDef layer_norm_def() {
  KernelDef def;
  def.op_type = "LayerNormalization";
  def.since_version = 17;
  def.claim = [](const KernelBuildInfo& info) {
    int axis = 0;
    if (auto r = layer_norm_check(info, &axis)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    int axis = 0;
    if (auto r = layer_norm_check(info, &axis)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<LayerNormKernel>(*info.input(0).shape, axis, info.node.attr_float("epsilon", 1e-5f),
                                             info.has_input(2));
  };
  return def;
}

// BatchNormalization in inference form over (N, C, ...): per channel k = scale /
// sqrt(var + eps) (in double, as ref), from the inputs at each run.
class BatchNormKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = shape_;
    return i == 0;
  }
  BatchNormKernel(Shape shape, double eps) : shape_(std::move(shape)), eps_(eps) {
    channels_ = shape_[1];
    rows_ = shape_[0] * channels_;
    n_ = shape_numel(shape_) / std::max<int64_t>(rows_, 1);
  }
  void compute(KernelContext& ctx) const override {
    const float* scale = ctx.required_input(1).data<float>();
    const float* bias = ctx.required_input(2).data<float>();
    const float* mean = ctx.required_input(3).data<float>();
    const float* var = ctx.required_input(4).data<float>();
    std::vector<float> k(static_cast<size_t>(channels_));
    for (int64_t c = 0; c < channels_; ++c) k[size_t(c)] = float(double(scale[c]) / std::sqrt(double(var[c]) + eps_));
    const float* x = ctx.required_input(0).data<float>();
    float* y = ctx.output(0, DType::f32, shape_).data<float>();
    parallel_items(ctx, rows_, n_, [&](int64_t b, int64_t e) {
      batch_norm_rows_any(x, y, b, e - b, n_, channels_, mean, k.data(), bias);
    });
  }

 private:
  Shape shape_;
  double eps_;
  int64_t channels_ = 1, rows_ = 1, n_ = 1;
};

std::optional<std::string> batch_norm_check(const KernelBuildInfo& info) {
  const Node& node = info.node;
  if (node.attr_int("training_mode", 0) != 0) return std::string("training_mode");
  if (info.opset < 9 && node.attr_int("spatial", 1) == 0) return std::string("spatial=0");
  for (size_t o = 1; o < node.outputs.size(); ++o)
    if (!node.outputs[o].empty()) return std::string("mean/var outputs are not implemented");
  if (info.inputs.size() != 5) return std::string("expects five inputs");
  if (auto r = need_all_f32_static(info)) return r;
  const Shape& s = *info.input(0).shape;
  if (s.size() < 2) return std::string("input of rank below 2");
  for (int i = 1; i <= 4; ++i)
    if (shape_numel(*info.input(i).shape) != s[1]) return "input " + std::to_string(i) + " is not one value per channel";
  return std::nullopt;
}

KernelDef batch_norm_def() {
  KernelDef def;
  def.op_type = "BatchNormalization";
  def.since_version = 7;  // before 7: is_test and consumed_inputs
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = batch_norm_check(info)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    if (auto r = batch_norm_check(info)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<BatchNormKernel>(*info.input(0).shape, info.node.attr_float("epsilon", 1e-5f));
  };
  return def;
}

// ReduceSum/Mean/Max/Min whose reduced axes form one block at the end (rows) or the
// start (columns) of the shape, after size-1 dims are ignored.
enum class Reduce { sum, mean, max, min };

struct ReducePlan {
  Shape y;
  int64_t rows = 1, n = 1;
  bool columns = false;
  Reduce op = Reduce::sum;
  float mul = 1.f;
};

std::optional<std::string> reduce_plan(const KernelBuildInfo& info, Reduce op, ReducePlan* p) {
  const Node& node = info.node;
  if (node.outputs.size() != 1) return std::string("expects one output");
  if (auto r = need_f32(info, 0)) return r;
  if (auto r = need_static(info, 0)) return r;
  const Shape& s = *info.input(0).shape;
  const int rank = int(s.size());
  const bool axes_input = op == Reduce::sum ? info.opset >= 13 : info.opset >= 18;
  Shape axes;
  if (axes_input) {
    if (info.has_input(1)) {
      const Tensor* t = info.input(1).constant;
      if (!t) return std::string("axes input is not a constant");
      if (t->dtype() != DType::i64) return std::string("axes are not int64");
      axes.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    }
  } else {
    axes = node.attr_ints("axes");
  }
  const bool keepdims = node.attr_int("keepdims", 1) != 0;
  if (axes.empty()) {
    if (axes_input && node.attr_int("noop_with_empty_axes", 0) != 0) return std::string("noop_with_empty_axes");
    for (int d = 0; d < rank; ++d) axes.push_back(d);
  }
  std::vector<bool> reduced(size_t(rank), false);
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) return std::string("axis out of range");
    const int64_t d = a < 0 ? a + rank : a;
    if (reduced[size_t(d)]) return std::string("repeated axis");
    reduced[size_t(d)] = true;
  }
  for (int64_t v : s)
    if (v == 0) return std::string("empty input");
  // The pattern of kept (K) and reduced (R) dims, size-1 dims left out: K*R* or R*K*.
  std::string pattern;
  for (int d = 0; d < rank; ++d)
    if (s[size_t(d)] != 1) pattern += reduced[size_t(d)] ? 'R' : 'K';
  const size_t first_r = pattern.find('R'), last_k = pattern.rfind('K');
  const bool trailing = first_r == std::string::npos || last_k == std::string::npos || last_k < first_r;
  const size_t first_k = pattern.find('K'), last_r = pattern.rfind('R');
  const bool leading = !trailing && last_r < first_k;
  if (!trailing && !leading) return std::string("reduced axes are not one block at either end");
  int64_t kept = 1, red = 1;
  for (int d = 0; d < rank; ++d) {
    (reduced[size_t(d)] ? red : kept) *= s[size_t(d)];
    if (!reduced[size_t(d)]) p->y.push_back(s[size_t(d)]);
    else if (keepdims) p->y.push_back(1);
  }
  p->columns = leading;
  p->rows = leading ? red : kept;
  p->n = leading ? kept : red;
  p->op = op;
  p->mul = op == Reduce::mean ? float(1.0 / double(red)) : 1.f;
  return std::nullopt;
}

class ReduceKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = p_.y;
    return i == 0;
  }
  explicit ReduceKernel(ReducePlan p) : p_(std::move(p)) {}
  void compute(KernelContext& ctx) const override {
    const float* x = ctx.required_input(0).data<float>();
    Tensor& y = ctx.output(0, DType::f32, p_.y);
    float* py = y.data<float>();
    if (p_.columns) {
      // Split the kept columns across threads; each walks every row of its slice.
      parallel_items(ctx, p_.n, p_.rows, [&](int64_t b, int64_t e) {
        column_sum_any_offset(x, py, b, e);
      });
    } else {
      const bool extreme = p_.op == Reduce::max || p_.op == Reduce::min;
      parallel_items(ctx, p_.rows, p_.n, [&](int64_t b, int64_t e) {
        if (extreme) row_extreme_any(x + b * p_.n, py + b, e - b, p_.n, p_.op == Reduce::max);
        else row_reduce_any(x + b * p_.n, py + b, e - b, p_.n, p_.mul);
      });
    }
  }

 private:
  // Columns [b, e) of a rows x n matrix, 256 at a time so the sums stay in registers/L1.
  void column_sum_any_offset(const float* x, float* y, int64_t b, int64_t e) const {
    for (int64_t j0 = b; j0 < e; j0 += 256) {
      const int64_t j1 = std::min(e, j0 + 256);
      column_sum_strided(x + j0, y + j0, j1 - j0);
    }
  }
  void column_sum_strided(const float* x, float* y, int64_t width) const {
    // column_sum over a window of `width` columns of rows spaced p_.n apart.
    float buf[256];
    const bool max = p_.op == Reduce::max;
    if (max || p_.op == Reduce::min) {
      std::fill(buf, buf + width, max ? -INFINITY : INFINITY);
      for (int64_t r = 0; r < p_.rows; ++r)
        for (int64_t j = 0; j < width; ++j) buf[j] = extreme(buf[j], x[r * p_.n + j], max);
      std::copy(buf, buf + width, y);
      return;
    }
    std::fill(buf, buf + width, 0.f);
    for (int64_t r = 0; r < p_.rows; ++r) {
      const float* xr = x + r * p_.n;
      for (int64_t j = 0; j < width; ++j) buf[j] += xr[j];
    }
    for (int64_t j = 0; j < width; ++j) y[j] = buf[j] * p_.mul;
  }
  ReducePlan p_;
};

KernelDef reduce_def(const std::string& op, Reduce kind) {
  KernelDef def;
  def.op_type = op;
  def.since_version = 1;
  def.claim = [kind](const KernelBuildInfo& info) {
    ReducePlan p;
    if (auto r = reduce_plan(info, kind, &p)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    ReducePlan p;
    if (auto r = reduce_plan(info, kind, &p)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return std::make_unique<ReduceKernel>(std::move(p));
  };
  return def;
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  r.add(unary_def("Relu", 6, Unary::relu));
  r.add(unary_def("LeakyRelu", 6, Unary::leaky_relu));
  r.add(unary_def("Sigmoid", 6, Unary::sigmoid));
  r.add(unary_def("Tanh", 6, Unary::tanh));
  r.add(unary_def("Erf", 9, Unary::erf));
  r.add(unary_def("Gelu", 20, Unary::gelu));
  r.add(unary_def("HardSwish", 14, Unary::hard_swish));
  r.add(unary_def("HardSigmoid", 6, Unary::hard_sigmoid));
  r.add(unary_def("Exp", 6, Unary::exp));
  r.add(unary_def("Neg", 6, Unary::neg));
  r.add(unary_def("Abs", 6, Unary::abs));
  r.add(unary_def("Sqrt", 6, Unary::sqrt));
  r.add(unary_def("Log", 6, Unary::log));
  r.add(clip_def());
  r.add(pow_def());
  r.add(binary_def("Add", Binary::add));
  r.add(binary_def("Sub", Binary::sub));
  r.add(binary_def("Mul", Binary::mul));
  r.add(binary_def("Div", Binary::div));
  r.add(binary_def("Max", Binary::max));  // two inputs; one or three and more stay with ref
  r.add(binary_def("Min", Binary::min));
  r.add(predicate_def("Equal", 7, Predicate::eq));  // numpy broadcasting from 7
  r.add(predicate_def("Less", 7, Predicate::lt));
  r.add(predicate_def("Greater", 7, Predicate::gt));
  r.add(predicate_def("LessOrEqual", 12, Predicate::le));
  r.add(predicate_def("GreaterOrEqual", 12, Predicate::ge));
  r.add(predicate_def("And", 7, Predicate::logical_and));
  r.add(predicate_def("Or", 7, Predicate::logical_or));
  r.add(predicate_def("Xor", 7, Predicate::logical_xor));
  r.add(not_def());
  r.add(softmax_def("Softmax", false));
  r.add(softmax_def("LogSoftmax", true));
  r.add(layer_norm_def());
  r.add(batch_norm_def());
  r.add(reduce_def("ReduceSum", Reduce::sum));
  r.add(reduce_def("ReduceMean", Reduce::mean));
  r.add(reduce_def("ReduceMax", Reduce::max));
  r.add(reduce_def("ReduceMin", Reduce::min));
}

}  // namespace slim::cpu
