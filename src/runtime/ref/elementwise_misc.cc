// Ref kernels of the remaining elementwise ops: variadic Min/Max/Sum/Mean, Where, Clip
// (attribute and input forms), Cast and CastLike.
#include <cfloat>
#include <cmath>
#include <map>
#include <optional>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

// Folds every input into an accumulator with numpy broadcasting: out = fold(in0, in1, ...),
// then finish(acc, count) (Mean divides).
template <int Mask, typename Fold, typename Finish>
void map_variadic(KernelContext& ctx, const Fold& fold, const Finish& finish) {
  std::vector<const Tensor*> ins;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.required_input(i);
    if (!ins.empty() && t.dtype() != ins[0]->dtype())
      ctx.fail(ErrorCode::invalid_model, "input " + std::to_string(i) + " is " + t.describe() +
                                             " but input 0 is " + ins[0]->describe());
    ins.push_back(&t);
  }
  if (ins.empty()) ctx.fail(ErrorCode::invalid_model, "needs at least one input");
  const BroadcastPlan plan(ctx, ins);
  visit_class<Mask>(ctx, ins[0]->dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor& z = ctx.output(0, ins[0]->dtype(), plan.out_shape);
    T* out = elems_mut<T>(z);
    for (int64_t k = 0; k < plan.numel; ++k) {
      C acc = C(elems<T>(*ins[0])[plan.src(0, k)]);
      for (size_t i = 1; i < ins.size(); ++i) acc = fold(acc, C(elems<T>(*ins[i])[plan.src(i, k)]));
      out[k] = T(finish(acc, ins.size()));
    }
  });
}

// NaN wins Min and Max, as in numpy.minimum/maximum.
template <typename C>
C nan_min(C a, C b) {
  if constexpr (std::is_floating_point_v<C>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  return b < a ? b : a;
}
template <typename C>
C nan_max(C a, C b) {
  if constexpr (std::is_floating_point_v<C>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  return b > a ? b : a;
}

const auto kKeep = [](auto acc, size_t) { return acc; };

void compute_where(KernelContext& ctx) {
  const Tensor& cond = ctx.required_input(0);
  const Tensor& x = ctx.required_input(1);
  const Tensor& y = ctx.required_input(2);
  if (cond.dtype() != DType::boolean)
    ctx.fail(ErrorCode::invalid_model, "condition must be bool, got " + cond.describe());
  if (x.dtype() != y.dtype())
    ctx.fail(ErrorCode::invalid_model,
             "X " + x.describe() + " and Y " + y.describe() + " have different dtypes");
  const BroadcastPlan plan(ctx, {&cond, &x, &y});
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor& z = ctx.output(0, x.dtype(), plan.out_shape);
    const bool* c = cond.data<bool>();
    const T* px = elems<T>(x);
    const T* py = elems<T>(y);
    T* out = elems_mut<T>(z);
    for (int64_t k = 0; k < plan.numel; ++k)
      out[k] = c[plan.src(0, k)] ? px[plan.src(1, k)] : py[plan.src(2, k)];
  });
}

// out = min(max(x, lo), hi); a missing bound does not clip. With lo > hi every element
// becomes hi, as the ONNX reference does.
template <typename T>
void clip_into(KernelContext& ctx, const Tensor& x, const std::optional<T>& lo,
               const std::optional<T>& hi) {
  using C = compute_t<T>;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  const T* in = elems<T>(x);
  T* out = elems_mut<T>(y);
  for (int64_t i = 0; i < x.numel(); ++i) {
    C v = C(in[i]);
    if (lo && v < C(*lo)) v = C(*lo);
    if (hi && v > C(*hi)) v = C(*hi);
    out[i] = T(v);
  }
}

// Clip before opset 11: bounds are float attributes.
KernelDef clip_attr_kernel(int64_t since, int64_t until) {
  KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    std::optional<float> lo, hi;
    // Opsets 6-10 default the bounds to the float range; opset 1 leaves them unset.
    if (opset >= 6) {
      lo = -FLT_MAX;
      hi = FLT_MAX;
    }
    if (node.has_attr("min")) lo = node.attr_float("min", 0);
    if (node.has_attr("max")) hi = node.attr_float("max", 0);
    return make_kernel([lo, hi](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      visit_class<kFloat>(ctx, x.dtype(), "input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::optional<T> tlo, thi;
        if (lo) tlo = T(compute_t<T>(*lo));
        if (hi) thi = T(compute_t<T>(*hi));
        clip_into<T>(ctx, x, tlo, thi);
      });
    });
  };
  return KernelDef{"Clip", "", since, until, f, {}};
}

// Clip from opset 11: optional scalar inputs min (1) and max (2) of X's dtype.
void compute_clip_inputs(KernelContext& ctx) {
  const Tensor& x = ctx.required_input(0);
  visit_class<kNumeric>(ctx, x.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::optional<T> bound[2];
    for (int i = 0; i < 2; ++i) {
      const Tensor* b = ctx.input(1 + i);
      if (!b) continue;
      if (b->dtype() != x.dtype() || b->numel() != 1)
        ctx.fail(ErrorCode::invalid_argument,
                 std::string(i == 0 ? "min" : "max") + " must be a one-element " +
                     std::string(dtype_name(x.dtype())) + " tensor, got " + b->describe());
      bound[i] = elems<T>(*b)[0];
    }
    clip_into<T>(ctx, x, bound[0], bound[1]);
  });
}

void cast_into(KernelContext& ctx, DType to) {
  const Tensor& x = ctx.required_input(0);
  const Tensor converted = convert_dtype(x, to);
  Tensor& y = ctx.output(0, to, x.shape());
  y.copy_from(converted);
}

KernelDef cast_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const Attribute* attr = node.attr("to");
    if (!attr)
      throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'to' is missing");
    DType to;
    if (attr->kind == Attribute::Kind::s) {
      // Cast-1 names the type with a string ("FLOAT"); later versions use the enum.
      static const std::map<std::string, DType> kByName = {
          {"FLOAT", DType::f32},    {"UINT8", DType::u8},     {"INT8", DType::i8},
          {"UINT16", DType::u16},   {"INT16", DType::i16},    {"INT32", DType::i32},
          {"INT64", DType::i64},    {"BOOL", DType::boolean}, {"FLOAT16", DType::f16},
          {"DOUBLE", DType::f64},   {"UINT32", DType::u32},   {"UINT64", DType::u64},
          {"BFLOAT16", DType::bf16}};
      auto it = kByName.find(attr->s);
      if (it == kByName.end())
        throw Error(ErrorCode::unsupported,
                    node.describe() + ": cast to type '" + attr->s + "' is not supported");
      to = it->second;
    } else {
      const int64_t to_enum = node.attr_int("to", 0);
      if (!onnx_dtype_to_slim(to_enum, &to))
        throw Error(ErrorCode::unsupported,
                    node.describe() + ": cast to ONNX type " + std::to_string(to_enum) +
                        " (string, complex, float8 or unknown) is not supported");
    }
    return make_kernel([to](KernelContext& ctx) { cast_into(ctx, to); });
  };
  return KernelDef{"Cast", "", 1, INT_MAX, f, {}};
}

}  // namespace

void register_elementwise_misc_kernels(KernelRegistry& r) {
  r.add(KernelDef{"Max",
                  "",
                  1,
                  INT_MAX,
                  simple_kernel([](KernelContext& ctx) {
                    map_variadic<kNumeric>(
                        ctx, [](auto a, auto b) { return nan_max(a, b); }, kKeep);
                  }),
                  {}});
  r.add(KernelDef{"Min",
                  "",
                  1,
                  INT_MAX,
                  simple_kernel([](KernelContext& ctx) {
                    map_variadic<kNumeric>(
                        ctx, [](auto a, auto b) { return nan_min(a, b); }, kKeep);
                  }),
                  {}});
  r.add(KernelDef{"Sum",
                  "",
                  1,
                  INT_MAX,
                  simple_kernel([](KernelContext& ctx) {
                    map_variadic<kNumeric>(
                        ctx,
                        [](auto a, auto b) {
                          if constexpr (std::is_integral_v<decltype(a)>)
                            return wrap_add(a, b);
                          else
                            return a + b;
                        },
                        kKeep);
                  }),
                  {}});
  r.add(KernelDef{"Mean",
                  "",
                  1,
                  INT_MAX,
                  simple_kernel([](KernelContext& ctx) {
                    map_variadic<kFloat>(
                        ctx, [](auto a, auto b) { return a + b; },
                        [](auto acc, size_t n) { return acc / decltype(acc)(n); });
                  }),
                  {}});
  r.add(KernelDef{"Where", "", 9, INT_MAX, simple_kernel(compute_where), {}});
  r.add(clip_attr_kernel(1, 10));
  r.add(KernelDef{"Clip", "", 11, INT_MAX, simple_kernel(compute_clip_inputs), {}});
  r.add(cast_kernel());
  r.add(KernelDef{
      "CastLike",
      "",
      15,
      INT_MAX,
      simple_kernel([](KernelContext& ctx) { cast_into(ctx, ctx.required_input(1).dtype()); }),
      {}});
}

}  // namespace slim::ref
