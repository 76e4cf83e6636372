// Ref kernels of broadcasting two-input elementwise ops: arithmetic (Add Sub Mul Div Pow
// Mod), comparisons, logical and bitwise ops, BitShift and PRelu.
#include <cmath>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

constexpr int64_t kNoLegacyAxis = INT64_MIN;

// The legacy axis of a node before opset 7 (kNoLegacyAxis when numpy rules apply).
int64_t legacy_axis_of(const Node& node, int64_t opset) {
  if (opset >= 7 || node.attr_int("broadcast", 0) == 0 || !node.has_attr("axis"))
    return kNoLegacyAxis;
  return node.attr_int("axis", 0);
}

void check_same_dtype(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    ctx.fail(ErrorCode::invalid_model,
             "inputs have different dtypes: " + a.describe() + " and " + b.describe());
}

// z = fn(a, b) with numpy broadcasting; a and b share a dtype, z has it too unless
// `OutBool`, then z is bool (comparisons).
// Before opset 7, binary ops broadcast only with broadcast=1, aligning B's dims with A's
// starting at `axis` instead of at the end. Returns B viewed with trailing 1s so that
// numpy broadcasting gives that alignment; B itself when no legacy axis applies.
Tensor legacy_aligned(const KernelContext& ctx, const Tensor& a, const Tensor& b,
                      int64_t legacy_axis) {
  if (legacy_axis == kNoLegacyAxis) return b;
  const int64_t axis = legacy_axis < 0 ? legacy_axis + a.rank() : legacy_axis;
  if (axis < 0 || axis + b.rank() > a.rank())
    ctx.fail(ErrorCode::invalid_model, "legacy broadcast axis " + std::to_string(legacy_axis) +
                                           " does not fit B " + b.describe() + " into A " +
                                           a.describe());
  Shape s = b.shape();
  s.resize(size_t(a.rank() - axis), 1);
  return b.reshape(s);
}

template <int Mask, bool OutBool = false, typename Fn>
void map_binary(KernelContext& ctx, const Fn& fn, int64_t legacy_axis = kNoLegacyAxis) {
  const Tensor& a = ctx.required_input(0);
  const Tensor b = legacy_aligned(ctx, a, ctx.required_input(1), legacy_axis);
  check_same_dtype(ctx, a, b);
  const BroadcastPlan plan(ctx, {&a, &b});
  visit_class<Mask>(ctx, a.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    using Out = std::conditional_t<OutBool, bool, T>;
    Tensor& z = ctx.output(0, OutBool ? DType::boolean : a.dtype(), plan.out_shape);
    const T* pa = elems<T>(a);
    const T* pb = elems<T>(b);
    Out* out = elems_mut<Out>(z);
    for (int64_t k = 0; k < plan.numel; ++k)
      out[k] = Out(fn(C(pa[plan.src(0, k)]), C(pb[plan.src(1, k)])));
  });
}

template <int Mask, bool OutBool = false, typename Fn>
KernelDef binary(const char* op, int64_t since, Fn fn) {
  KernelFactory f = [fn](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const int64_t axis = legacy_axis_of(node, opset);
    return make_kernel(
        [fn, axis](KernelContext& ctx) { map_binary<Mask, OutBool>(ctx, fn, axis); });
  };
  return KernelDef{op, "", since, INT_MAX, f, {}};
}

template <typename C>
void check_nonzero_divisor(const KernelContext& ctx, C b) {
  if constexpr (std::is_integral_v<C>)
    if (b == C(0)) ctx.fail(ErrorCode::invalid_argument, "integer division by zero");
}

// Integer division truncating toward zero, with INT_MIN / -1 wrapping instead of trapping.
template <typename C>
C int_div(C a, C b) {
  if constexpr (std::is_signed_v<C>)
    if (b == C(-1)) return wrap_sub(C(0), a);
  return C(a / b);
}

// Integer base ** integer exponent by squaring, wrapping on overflow. A negative exponent
// truncates 1 / base**-e toward zero, as a C cast of the real result would.
template <typename T, typename E>
T int_pow(const KernelContext& ctx, T base, E e) {
  if constexpr (std::is_signed_v<E>) {
    if (e < 0) {
      if (base == T(0)) ctx.fail(ErrorCode::invalid_argument, "0 raised to a negative power");
      if (base == T(1)) return T(1);
      if constexpr (std::is_signed_v<T>)
        if (base == T(-1)) return (e % 2 == 0) ? T(1) : T(-1);
      return T(0);
    }
  }
  T result = T(1);
  uint64_t n = uint64_t(e);
  T b = base;
  while (n) {
    if (n & 1) result = wrap_mul(result, b);
    b = wrap_mul(b, b);
    n >>= 1;
  }
  return result;
}

void compute_pow(KernelContext& ctx, int64_t legacy_axis) {
  const Tensor& a = ctx.required_input(0);
  const Tensor b = legacy_aligned(ctx, a, ctx.required_input(1), legacy_axis);
  const BroadcastPlan plan(ctx, {&a, &b});
  visit_class<kNumeric>(ctx, a.dtype(), "base", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor& z = ctx.output(0, a.dtype(), plan.out_shape);
    const T* pa = elems<T>(a);
    T* out = elems_mut<T>(z);
    visit_class<kNumeric>(ctx, b.dtype(), "exponent", [&](auto etag) {
      using E = typename decltype(etag)::type;
      const E* pb = elems<E>(b);
      for (int64_t k = 0; k < plan.numel; ++k) {
        const T x = pa[plan.src(0, k)];
        const E e = pb[plan.src(1, k)];
        if constexpr (kIsFloat<T>) {
          out[k] = T(C(std::pow(C(x), C(to_double(e)))));
        } else if constexpr (!kIsFloat<E>) {
          out[k] = int_pow(ctx, x, e);
        } else {
          out[k] = T(std::pow(double(x), to_double(e)));
        }
      }
    });
  });
}

KernelDef mod_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t fmod = node.attr_int("fmod", 0);
    if (fmod != 0 && fmod != 1)
      throw Error(
          ErrorCode::invalid_model,
          node.describe() + ": attribute 'fmod' must be 0 or 1, got " + std::to_string(fmod));
    return make_kernel([fmod](KernelContext& ctx) {
      const Tensor& a = ctx.required_input(0);
      if (dtype_is_float(a.dtype()) && fmod == 0)
        ctx.fail(ErrorCode::invalid_model, "floating-point Mod requires fmod=1");
      map_binary<kNumeric>(ctx, [&](auto x, auto y) {
        using C = decltype(x);
        if constexpr (std::is_floating_point_v<C>) {
          return C(std::fmod(x, y));
        } else {
          check_nonzero_divisor(ctx, y);
          if constexpr (std::is_signed_v<C>) {
            if (y == C(-1)) return C(0);  // avoids INT_MIN % -1
            C r = C(x % y);
            // fmod=0 takes the divisor's sign (Python %), fmod=1 the dividend's (C fmod).
            if (fmod == 0 && r != 0 && ((r < 0) != (y < 0))) r = C(r + y);
            return r;
          } else {
            return C(x % y);
          }
        }
      });
    });
  };
  return KernelDef{"Mod", "", 10, INT_MAX, f, {}};
}

KernelDef bitshift_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const std::string dir = node.attr_string("direction", "");
    if (dir != "LEFT" && dir != "RIGHT")
      throw Error(
          ErrorCode::invalid_model,
          node.describe() + ": attribute 'direction' must be LEFT or RIGHT, got '" + dir + "'");
    const bool left = dir == "LEFT";
    return make_kernel([left](KernelContext& ctx) {
      map_binary<kUnsigned>(ctx, [left](auto x, auto s) {
        using C = decltype(x);
        // Shifting by the bit width or more is undefined in C++; every bit is shifted out.
        if (uint64_t(s) >= sizeof(C) * 8) return C(0);
        return left ? C(x << s) : C(x >> s);
      });
    });
  };
  return KernelDef{"BitShift", "", 11, INT_MAX, f, {}};
}

// PRelu broadcasts the slope to X's shape (unidirectionally). Before opset 7 a 1-D slope
// of X's channel count applies per channel (dim 1), as PyTorch exports it.
void compute_prelu(KernelContext& ctx, bool legacy_channel_slope) {
  const Tensor& x = ctx.required_input(0);
  Tensor slope = ctx.required_input(1);
  if (legacy_channel_slope && slope.rank() == 1 && x.rank() > 2 && slope.dim(0) == x.dim(1) &&
      slope.dim(0) != 1) {
    Shape s(size_t(x.rank() - 1), 1);
    s[0] = slope.dim(0);
    slope = slope.reshape(s);
  }
  check_same_dtype(ctx, x, slope);
  const BroadcastPlan plan(ctx, {&x, &slope});
  if (plan.out_shape != x.shape())
    ctx.fail(ErrorCode::invalid_argument,
             "slope " + slope.describe() + " does not broadcast to X " + x.describe());
  const int64_t axis = legacy_channel_slope && slope.rank() == x.rank() - 1 ? 1 : kNoLegacyAxis;
  map_binary<kFloat | kSigned>(
      ctx,
      [](auto v, auto s) {
        using C = decltype(v);
        return v < C(0) ? C(s * v) : v;
      },
      axis);
}

}  // namespace

void register_elementwise_binary_kernels(KernelRegistry& r) {
  r.add(binary<kNumeric>("Add", 1, [](auto a, auto b) {
    if constexpr (std::is_integral_v<decltype(a)>)
      return wrap_add(a, b);
    else
      return a + b;
  }));
  r.add(binary<kNumeric>("Sub", 1, [](auto a, auto b) {
    if constexpr (std::is_integral_v<decltype(a)>)
      return wrap_sub(a, b);
    else
      return a - b;
  }));
  r.add(binary<kNumeric>("Mul", 1, [](auto a, auto b) {
    if constexpr (std::is_integral_v<decltype(a)>)
      return wrap_mul(a, b);
    else
      return a * b;
  }));
  r.add(KernelDef{"Div",
                  "",
                  1,
                  INT_MAX,
                  [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
                    const int64_t axis = legacy_axis_of(node, opset);
                    return make_kernel([axis](KernelContext& ctx) {
                      map_binary<kNumeric>(
                          ctx,
                          [&](auto a, auto b) {
                            using C = decltype(a);
                            if constexpr (std::is_integral_v<C>) {
                              check_nonzero_divisor(ctx, b);
                              return int_div(a, b);
                            } else {
                              return a / b;
                            }
                          },
                          axis);
                    });
                  },
                  {}});
  r.add(KernelDef{"Pow",
                  "",
                  1,
                  INT_MAX,
                  [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
                    const int64_t axis = legacy_axis_of(node, opset);
                    return make_kernel([axis](KernelContext& ctx) { compute_pow(ctx, axis); });
                  },
                  {}});
  r.add(mod_kernel());
  r.add(KernelDef{"PRelu",
                  "",
                  1,
                  INT_MAX,
                  [](const Node&, int64_t opset) -> std::unique_ptr<OpKernel> {
                    const bool legacy = opset < 7;
                    return make_kernel(
                        [legacy](KernelContext& ctx) { compute_prelu(ctx, legacy); });
                  },
                  {}});

  r.add(binary<kAll, true>("Equal", 1, [](auto a, auto b) { return a == b; }));
  r.add(binary<kNumeric, true>("Less", 1, [](auto a, auto b) { return a < b; }));
  r.add(binary<kNumeric, true>("Greater", 1, [](auto a, auto b) { return a > b; }));
  r.add(binary<kNumeric, true>("LessOrEqual", 12, [](auto a, auto b) { return a <= b; }));
  r.add(binary<kNumeric, true>("GreaterOrEqual", 12, [](auto a, auto b) { return a >= b; }));
  r.add(binary<kBool>("And", 1, [](bool a, bool b) { return a && b; }));
  r.add(binary<kBool>("Or", 1, [](bool a, bool b) { return a || b; }));
  r.add(binary<kBool>("Xor", 1, [](bool a, bool b) { return a != b; }));
  r.add(binary<kInt>("BitwiseAnd", 18, [](auto a, auto b) { return decltype(a)(a & b); }));
  r.add(binary<kInt>("BitwiseOr", 18, [](auto a, auto b) { return decltype(a)(a | b); }));
  r.add(binary<kInt>("BitwiseXor", 18, [](auto a, auto b) { return decltype(a)(a ^ b); }));
  r.add(bitshift_kernel());
}

}  // namespace slim::ref
