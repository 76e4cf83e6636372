// Ref kernels of ONNX's linear quantization: QuantizeLinear, DequantizeLinear (per
// tensor and per axis), DynamicQuantizeLinear and QLinearMatMul. Rounding is half to
// even and requantization is done in float, matching the ONNX definitions.
#include <cmath>
#include <limits>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/quant_params.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {


struct QRange {
  int64_t lo, hi;
};

QRange qrange(const KernelContext& ctx, DType t) {
  switch (t) {
    case DType::u8: return {0, 255};
    case DType::i8: return {-128, 127};
    case DType::u16: return {0, 65535};
    case DType::i16: return {-32768, 32767};
    default: ctx.fail(ErrorCode::unsupported, "quantized dtype " + std::string(dtype_name(t)) + " is not supported");
  }
}

void write_floats(Tensor& out, const std::vector<float>& v) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.raw_data());
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) o[i] = T(v[i]);
      else o[i] = static_cast<T>(v[i]);
    }
  });
}

// For each element of x, which entry of a per-tensor (size 1) or per-axis parameter applies.
struct ParamIndex {
  int64_t inner = 1, dim = 1;
  bool per_axis = false;
  int64_t operator()(int64_t i) const { return per_axis ? (i / inner) % dim : 0; }
};

ParamIndex param_index(const KernelContext& ctx, const Tensor& x, const Tensor& scale, int64_t axis_attr, int64_t opset,
                       const Tensor* zero_point) {
  ParamIndex p;
  if (zero_point && zero_point->shape() != scale.shape())
    ctx.fail(ErrorCode::invalid_argument, "zero point " + zero_point->describe() + " and scale " + scale.describe() + " differ in shape");
  if (scale.numel() == 1 && scale.rank() <= 1) return p;
  if (opset < 13 || scale.rank() != 1)
    ctx.fail(ErrorCode::invalid_argument, "scale " + scale.describe() + " must be a scalar" +
                                              std::string(opset >= 13 ? " or 1-D" : ""));
  if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "per-axis scale " + scale.describe() + " for a scalar input");
  const int axis = normalize_axis(ctx, axis_attr, x.rank());
  if (x.shape()[size_t(axis)] != scale.numel())
    ctx.fail(ErrorCode::invalid_argument, "scale " + scale.describe() + " does not match axis " + std::to_string(axis) + " of " + x.describe());
  p.per_axis = true;
  p.dim = scale.numel();
  for (int d = axis + 1; d < x.rank(); ++d) p.inner *= x.shape()[size_t(d)];
  return p;
}

std::vector<float> floats_of(const Tensor& t) {
  const std::vector<double> d = tensor_to_doubles(t);
  return std::vector<float>(d.begin(), d.end());
}

// ---------------------------------------------------------------- QuantizeLinear

class QuantizeLinear final : public OpKernel {
 public:
  QuantizeLinear(const Node& node, int64_t opset) : opset_(opset) {
    axis_ = node.attr_int("axis", 1);
    if (node.attr_int("block_size", 0) != 0)
      throw Error(ErrorCode::unsupported, node.describe() + ": blocked quantization (block_size) is not supported");
    if (node.has_attr("output_dtype")) {
      const int64_t code = node.attr_int("output_dtype", 0);
      if (code == 2) output_dtype_ = DType::u8;
      else if (code == 3) output_dtype_ = DType::i8;
      else if (code == 4) output_dtype_ = DType::u16;
      else if (code == 5) output_dtype_ = DType::i16;
      else if (code != 0) throw Error(ErrorCode::unsupported, node.describe() + ": output_dtype " + std::to_string(code) + " is not supported");
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& scale = ctx.required_input(1);
    const Tensor* zp = ctx.input(2);
    const DType out_t = zp ? zp->dtype() : output_dtype_.value_or(DType::u8);
    const QRange r = qrange(ctx, out_t);
    const ParamIndex pi = param_index(ctx, x, scale, axis_, opset_, zp);
    const std::vector<float> xs = floats_of(x), ss = floats_of(scale);
    const std::vector<int64_t> zs = zp ? tensor_to_int64s(*zp) : std::vector<int64_t>(ss.size(), 0);
    std::vector<int64_t> y(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const size_t k = size_t(pi(int64_t(i)));
      y[i] = quantize_value(xs[i], ss[k], int32_t(zs[k]), int32_t(r.lo), int32_t(r.hi));
    }
    write_ints(ctx.output(0, out_t, x.shape()), y);
  }

 private:
  int64_t opset_, axis_;
  std::optional<DType> output_dtype_;
};

// ---------------------------------------------------------------- DequantizeLinear

class DequantizeLinear final : public OpKernel {
 public:
  DequantizeLinear(const Node& node, int64_t opset) : opset_(opset) {
    axis_ = node.attr_int("axis", 1);
    if (node.attr_int("block_size", 0) != 0)
      throw Error(ErrorCode::unsupported, node.describe() + ": blocked quantization (block_size) is not supported");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& scale = ctx.required_input(1);
    const Tensor* zp = ctx.input(2);
    if (!dtype_is_integer(x.dtype()))
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not an integer tensor");
    if (zp && zp->dtype() != x.dtype())
      ctx.fail(ErrorCode::invalid_argument, "zero point " + zp->describe() + " and input " + x.describe() + " differ in dtype");
    if (!dtype_is_float(scale.dtype())) ctx.fail(ErrorCode::invalid_argument, "scale " + scale.describe() + " is not a float tensor");
    const ParamIndex pi = param_index(ctx, x, scale, axis_, opset_, zp);
    const std::vector<int64_t> xs = tensor_to_int64s(x);
    const std::vector<float> ss = floats_of(scale);
    const std::vector<int64_t> zs = zp ? tensor_to_int64s(*zp) : std::vector<int64_t>(ss.size(), 0);
    std::vector<float> y(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const int64_t k = pi(int64_t(i));
      y[i] = float(xs[i] - zs[size_t(k)]) * ss[size_t(k)];
    }
    write_floats(ctx.output(0, scale.dtype(), x.shape()), y);
  }

 private:
  int64_t opset_, axis_;
};

// ---------------------------------------------------------------- DynamicQuantizeLinear

void dynamic_quantize_linear(KernelContext& ctx) {
  const Tensor& x = ctx.required_input(0);
  if (x.dtype() != DType::f32) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not f32");
  const std::vector<float> xs = floats_of(x);
  float lo = 0.f, hi = 0.f;
  for (float v : xs) {
    if (std::isnan(v)) ctx.fail(ErrorCode::invalid_argument, "input contains NaN");
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const DynamicQuantParams p = dynamic_quant_params(lo, hi);
  uint8_t* y = ctx.output(0, DType::u8, x.shape()).data<uint8_t>();
  for (size_t i = 0; i < xs.size(); ++i)
    y[i] = p.scale == 0.f ? p.zero_point : uint8_t(quantize_value(xs[i], p.scale, p.zero_point, 0, 255));
  *ctx.output(1, DType::f32, {}).data<float>() = p.scale;
  *ctx.output(2, DType::u8, {}).data<uint8_t>() = p.zero_point;
}

// ---------------------------------------------------------------- QLinearMatMul

void qlinear_matmul(KernelContext& ctx) {
  const Tensor& a = ctx.required_input(0);
  const Tensor& b = ctx.required_input(3);
  for (const Tensor* t : {&a, &b})
    if (t->dtype() != DType::u8 && t->dtype() != DType::i8)
      ctx.fail(ErrorCode::invalid_argument, "input " + t->describe() + " is not 8-bit");
  const MatMulPlan p(ctx, a.shape(), b.shape());
  const int64_t m = p.m, k = p.k, n = p.n;

  auto params = [&](int s_in, int z_in, int64_t per, DType t, const char* name) {
    const Tensor& s = ctx.required_input(s_in);
    const Tensor* z = ctx.input(z_in);
    if (s.numel() != 1 && s.numel() != per)
      ctx.fail(ErrorCode::invalid_argument, std::string(name) + "_scale " + s.describe() + " must hold 1 or " + std::to_string(per) + " values");
    if (z && (z->numel() != s.numel() || z->dtype() != t))
      ctx.fail(ErrorCode::invalid_argument, std::string(name) + "_zero_point " + (z ? z->describe() : "") + " does not match its scale and input");
    std::vector<float> sv = floats_of(s);
    std::vector<int64_t> zv = z ? tensor_to_int64s(*z) : std::vector<int64_t>(sv.size(), 0);
    return std::make_pair(sv, zv);
  };
  const auto [a_s, a_z] = params(1, 2, m, a.dtype(), "a");
  const auto [b_s, b_z] = params(4, 5, n, b.dtype(), "b");
  const Tensor* yz_t = ctx.input(7);
  const DType out_t = yz_t ? yz_t->dtype() : DType::u8;
  const auto [y_s, y_z] = params(6, 7, 1, out_t, "y");
  const QRange r = qrange(ctx, out_t);

  const std::vector<int64_t> av = tensor_to_int64s(a), bv = tensor_to_int64s(b);
  std::vector<int64_t> y(size_t(p.batches * m * n));
  for (size_t bi = 0; bi < size_t(p.batches); ++bi) {
    const int64_t* ap = av.data() + p.a_batch[bi] * m * k;
    const int64_t* bp = bv.data() + p.b_batch[bi] * k * n;
    for (int64_t i = 0; i < m; ++i) {
      const size_t ai = a_s.size() == 1 ? 0 : size_t(i);
      for (int64_t j = 0; j < n; ++j) {
        const size_t bj = b_s.size() == 1 ? 0 : size_t(j);
        int64_t acc = 0;
        for (int64_t t = 0; t < k; ++t) acc += (ap[i * k + t] - a_z[ai]) * (bp[t * n + j] - b_z[bj]);
        const float mult = a_s[ai] * b_s[bj] / y_s[0];
        const float q = std::nearbyint(float(acc) * mult) + float(y_z[0]);
        y[(bi * size_t(m) + size_t(i)) * size_t(n) + size_t(j)] = int64_t(std::clamp(q, float(r.lo), float(r.hi)));
      }
    }
  }
  write_ints(ctx.output(0, out_t, p.out_shape), y);
}

}  // namespace

void register_quant_kernels(KernelRegistry& r) {
  r.add({"QuantizeLinear", "", 10, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<QuantizeLinear>(n, o);
         }, {}});
  r.add({"DequantizeLinear", "", 10, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<DequantizeLinear>(n, o);
         }, {}});
  r.add({"DynamicQuantizeLinear", "", 11, INT_MAX, simple_kernel(dynamic_quantize_linear), {}});
  r.add(with_inferred_outputs({"QLinearMatMul", "", 10, INT_MAX, simple_kernel(qlinear_matmul), {}},
                              [](const KernelBuildInfo& info, const KernelContext& ctx) {
                                const MatMulPlan p(ctx, *info.input(0).shape, *info.input(3).shape);
                                const DType t = info.has_input(7) ? *info.input(7).dtype : DType::u8;
                                return std::vector<std::pair<DType, Shape>>{{t, p.out_shape}};
                              }));
}

}  // namespace slim::ref
