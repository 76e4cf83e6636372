// Ref kernels of one-input elementwise ops: math functions, activations, logical and
// bitwise Not, IsNaN/IsInf.
#include <cmath>
#include <numbers>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

// y = fn(x) elementwise, same dtype; fn receives and returns compute_t<T>.
template <int Mask, typename Fn>
void map_unary(KernelContext& ctx, const Fn& fn) {
  const Tensor& x = ctx.required_input(0);
  visit_class<Mask>(ctx, x.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T* in = elems<T>(x);
    T* out = elems_mut<T>(y);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) out[i] = T(fn(C(in[i])));
  });
}

// y = pred(x) elementwise into a bool tensor.
template <int Mask, typename Fn>
void map_predicate(KernelContext& ctx, const Fn& pred) {
  const Tensor& x = ctx.required_input(0);
  visit_class<Mask>(ctx, x.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor& y = ctx.output(0, DType::boolean, x.shape());
    const T* in = elems<T>(x);
    bool* out = y.data<bool>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) out[i] = pred(C(in[i]));
  });
}

template <int Mask, typename Fn>
KernelDef unary(const char* op, int64_t since, Fn fn) {
  return KernelDef{
      op, "", since, INT_MAX, simple_kernel([fn](KernelContext& ctx) { map_unary<Mask>(ctx, fn); }),
      {}};
}

// An op whose function depends on float attributes read at compile time: make(node)
// returns the elementwise lambda.
template <int Mask, typename Make>
KernelDef unary_attr(const char* op, int64_t since, Make make) {
  KernelFactory f = [make](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    auto fn = make(node);
    return make_kernel([fn](KernelContext& ctx) { map_unary<Mask>(ctx, fn); });
  };
  return KernelDef{op, "", since, INT_MAX, f, {}};
}

template <typename C>
C stable_sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}

// log(1 + exp(x)) without overflow for large x.
template <typename C>
C softplus(C x) {
  return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

}  // namespace

void register_elementwise_unary_kernels(KernelRegistry& r) {
  // Integer negation and absolute value wrap at the minimum like two's complement.
  r.add(unary<kFloat | kSigned>("Neg", 1, [](auto x) {
    using C = decltype(x);
    if constexpr (std::is_integral_v<C>)
      return wrap_sub(C(0), x);
    else
      return C(-x);
  }));
  r.add(unary<kNumeric>("Abs", 1, [](auto x) {
    using C = decltype(x);
    if constexpr (std::is_unsigned_v<C>)
      return x;
    else if constexpr (std::is_integral_v<C>)
      return x < 0 ? wrap_sub(C(0), x) : x;
    else
      return C(std::fabs(x));
  }));
  // NaN and signed zeros pass through, as numpy.sign does.
  r.add(unary<kNumeric>("Sign", 9, [](auto x) {
    using C = decltype(x);
    return x > C(0) ? C(1) : (x < C(0) ? C(-1) : x);
  }));
  r.add(unary<kFloat>("Reciprocal", 1, [](auto x) { return decltype(x)(1) / x; }));
  r.add(unary<kFloat>("Sqrt", 1, [](auto x) { return std::sqrt(x); }));
  r.add(unary<kFloat>("Exp", 1, [](auto x) { return std::exp(x); }));
  r.add(unary<kFloat>("Log", 1, [](auto x) { return std::log(x); }));
  r.add(unary<kFloat>("Floor", 1, [](auto x) { return std::floor(x); }));
  r.add(unary<kFloat>("Ceil", 1, [](auto x) { return std::ceil(x); }));
  // Round halves to even: nearbyint in the default rounding mode.
  r.add(unary<kFloat>("Round", 11, [](auto x) { return std::nearbyint(x); }));
  r.add(unary<kFloat>("Erf", 9, [](auto x) { return std::erf(x); }));
  r.add(unary<kFloat>("Sin", 7, [](auto x) { return std::sin(x); }));
  r.add(unary<kFloat>("Cos", 7, [](auto x) { return std::cos(x); }));
  r.add(unary<kFloat>("Tan", 7, [](auto x) { return std::tan(x); }));
  r.add(unary<kFloat>("Asin", 7, [](auto x) { return std::asin(x); }));
  r.add(unary<kFloat>("Acos", 7, [](auto x) { return std::acos(x); }));
  r.add(unary<kFloat>("Atan", 7, [](auto x) { return std::atan(x); }));
  r.add(unary<kFloat>("Sinh", 9, [](auto x) { return std::sinh(x); }));
  r.add(unary<kFloat>("Cosh", 9, [](auto x) { return std::cosh(x); }));
  r.add(unary<kFloat>("Tanh", 1, [](auto x) { return std::tanh(x); }));
  r.add(unary<kFloat>("Asinh", 9, [](auto x) { return std::asinh(x); }));
  r.add(unary<kFloat>("Acosh", 9, [](auto x) { return std::acosh(x); }));
  r.add(unary<kFloat>("Atanh", 9, [](auto x) { return std::atanh(x); }));

  // Activations.
  r.add(unary<kFloat | kSigned>("Relu", 1,
                                [](auto x) { return x > decltype(x)(0) ? x : decltype(x)(0); }));
  r.add(unary<kFloat>("Sigmoid", 1, [](auto x) { return stable_sigmoid(x); }));
  r.add(unary<kFloat>("Softsign", 1, [](auto x) { return x / (decltype(x)(1) + std::fabs(x)); }));
  r.add(unary<kFloat>("Softplus", 1, [](auto x) { return softplus(x); }));
  r.add(unary<kFloat>("Mish", 18, [](auto x) { return x * std::tanh(softplus(x)); }));
  r.add(unary<kFloat>("HardSwish", 14, [](auto x) {
    using C = decltype(x);
    return x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5)));
  }));
  r.add(unary_attr<kFloat>("LeakyRelu", 1, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 0.01f);
    return [alpha](auto x) {
      using C = decltype(x);
      return x < C(0) ? C(alpha) * x : x;
    };
  }));
  r.add(unary_attr<kFloat>("Elu", 1, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 1.0f);
    return [alpha](auto x) {
      using C = decltype(x);
      return x < C(0) ? C(alpha) * (std::exp(x) - C(1)) : x;
    };
  }));
  r.add(unary_attr<kFloat>("Selu", 1, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 1.67326319217681884765625f);
    const double gamma = n.attr_float("gamma", 1.05070102214813232421875f);
    return [alpha, gamma](auto x) {
      using C = decltype(x);
      return x > C(0) ? C(gamma) * x : C(gamma) * (C(alpha) * std::exp(x) - C(alpha));
    };
  }));
  r.add(unary_attr<kFloat>("Celu", 12, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 1.0f);
    if (alpha == 0)
      throw Error(ErrorCode::invalid_model, n.describe() + ": attribute 'alpha' must not be 0");
    return [alpha](auto x) {
      using C = decltype(x);
      return std::max(C(0), x) + std::min(C(0), C(alpha) * (std::exp(x / C(alpha)) - C(1)));
    };
  }));
  r.add(unary_attr<kFloat>("HardSigmoid", 1, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 0.2f);
    const double beta = n.attr_float("beta", 0.5f);
    return [alpha, beta](auto x) {
      using C = decltype(x);
      return std::max(C(0), std::min(C(1), C(alpha) * x + C(beta)));
    };
  }));
  r.add(unary_attr<kFloat>("ThresholdedRelu", 10, [](const Node& n) {
    const double alpha = n.attr_float("alpha", 1.0f);
    return [alpha](auto x) {
      using C = decltype(x);
      return x > C(alpha) ? x : C(0);
    };
  }));
  r.add(unary_attr<kFloat>("Gelu", 20, [](const Node& n) {
    const std::string approx = n.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh")
      throw Error(ErrorCode::invalid_model, n.describe() +
                                                ": attribute 'approximate' must be "
                                                "'none' or 'tanh', got '" +
                                                approx + "'");
    const bool use_tanh = approx == "tanh";
    return [use_tanh](auto x) {
      using C = decltype(x);
      if (use_tanh) {
        const C k = C(std::sqrt(2.0 / std::numbers::pi));
        return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
      }
      return C(0.5) * x * (C(1) + std::erf(x / C(std::numbers::sqrt2)));
    };
  }));
  // Shrink accepts integers too; its float thresholds are applied in double.
  r.add(unary_attr<kNumeric>("Shrink", 9, [](const Node& n) {
    const double bias = n.attr_float("bias", 0.0f);
    const double lambd = n.attr_float("lambd", 0.5f);
    return [bias, lambd](auto x) {
      using C = decltype(x);
      const double v = double(x);
      if (v < -lambd) return C(v + bias);
      if (v > lambd) return C(v - bias);
      return C(0);
    };
  }));

  r.add(unary<kBool>("Not", 1, [](bool x) { return !x; }));
  r.add(unary<kInt>("BitwiseNot", 18, [](auto x) { return decltype(x)(~x); }));

  r.add(KernelDef{"IsNaN",
                  "",
                  9,
                  INT_MAX,
                  simple_kernel([](KernelContext& ctx) {
                    map_predicate<kFloat>(ctx, [](auto x) { return std::isnan(x); });
                  }),
                  {}});
  r.add(KernelDef{"IsInf",
                  "",
                  10,
                  INT_MAX,
                  [](const Node& n, int64_t) -> std::unique_ptr<OpKernel> {
                    const bool neg = n.attr_int("detect_negative", 1) != 0;
                    const bool pos = n.attr_int("detect_positive", 1) != 0;
                    return make_kernel([neg, pos](KernelContext& ctx) {
                      map_predicate<kFloat>(ctx, [neg, pos](auto x) {
                        return std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg));
                      });
                    });
                  },
                  {}});
}

}  // namespace slim::ref
