// Ref kernels of the training losses NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLoss (reduction none/sum/mean, class weights, ignore_index).
#include <cmath>
#include <optional>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

enum class Reduction { none, sum, mean };

struct LossAttrs {
  Reduction reduction = Reduction::mean;
  std::optional<int64_t> ignore_index;
};

LossAttrs parse_loss_attrs(const Node& node) {
  LossAttrs at;
  const std::string red = node.attr_string("reduction", "mean");
  if (red == "none")
    at.reduction = Reduction::none;
  else if (red == "sum")
    at.reduction = Reduction::sum;
  else if (red == "mean")
    at.reduction = Reduction::mean;
  else
    throw Error(ErrorCode::invalid_model,
                node.describe() + ": reduction must be none, sum or mean, got '" + red + "'");
  if (node.has_attr("ignore_index")) at.ignore_index = node.attr_int("ignore_index", 0);
  return at;
}

// NLL over log-probabilities `logp` laid out (N, C, D) with D the flattened extra dims,
// targets (N, D). Writes output 0 in `dtype`, shaped like the target for reduction none.
void nll_into(KernelContext& ctx, const LossAttrs& at, const std::vector<double>& logp,
              const Shape& input_shape, const Tensor& target, const Tensor* weight, DType dtype) {
  if (input_shape.size() < 2)
    ctx.fail(ErrorCode::invalid_argument,
             "input must be (N, C, ...), got " + shape_str(input_shape));
  const int64_t n = input_shape[0], c = input_shape[1];
  int64_t d = 1;
  for (size_t i = 2; i < input_shape.size(); ++i) d *= input_shape[i];
  Shape expect_target{n};
  expect_target.insert(expect_target.end(), input_shape.begin() + 2, input_shape.end());
  if (target.shape() != expect_target ||
      (target.dtype() != DType::i64 && target.dtype() != DType::i32))
    ctx.fail(ErrorCode::invalid_argument, "target " + target.describe() +
                                              " must be int32/int64 of shape " +
                                              shape_str(expect_target));
  std::vector<double> w;
  if (weight) {
    if (!dtype_is_float(weight->dtype()) || weight->shape() != Shape{c})
      ctx.fail(ErrorCode::invalid_argument, "weight " + weight->describe() +
                                                " must be a float vector of " + std::to_string(c) +
                                                " classes");
    w = tensor_to_doubles(*weight);
  }
  const std::vector<int64_t> t = tensor_to_int64s(target);
  std::vector<double> loss(size_t(n * d));
  double loss_sum = 0, weight_sum = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      const int64_t cls = t[size_t(i * d + j)];
      if (at.ignore_index && cls == *at.ignore_index) {
        loss[size_t(i * d + j)] = 0;
        continue;
      }
      if (cls < 0 || cls >= c)
        ctx.fail(ErrorCode::invalid_argument, "target " + std::to_string(cls) + " at " +
                                                  std::to_string(i * d + j) + " is outside [0, " +
                                                  std::to_string(c) + ")");
      const double wt = weight ? w[size_t(cls)] : 1.0;
      const double l = -logp[size_t((i * c + cls) * d + j)] * wt;
      loss[size_t(i * d + j)] = l;
      loss_sum += l;
      weight_sum += wt;
    }
  if (at.reduction == Reduction::none) {
    Tensor& y = ctx.output(0, dtype, target.shape());
    visit_class<kFloat>(ctx, dtype, "output", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* out = elems_mut<T>(y);
      for (size_t k = 0; k < loss.size(); ++k) out[k] = T(compute_t<T>(loss[k]));
    });
    return;
  }
  const double v = at.reduction == Reduction::sum ? loss_sum : loss_sum / weight_sum;
  Tensor& y = ctx.output(0, dtype, {});
  visit_class<kFloat>(ctx, dtype, "output", [&](auto tag) {
    using T = typename decltype(tag)::type;
    elems_mut<T>(y)[0] = T(compute_t<T>(v));
  });
}

KernelDef nll_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const LossAttrs at = parse_loss_attrs(node);
    return make_kernel([at](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      if (!dtype_is_float(x.dtype())) fail_dtype(ctx, x.dtype(), "input");
      nll_into(ctx, at, tensor_to_doubles(x), x.shape(), ctx.required_input(1), ctx.input(2),
               x.dtype());
    });
  };
  return KernelDef{"NegativeLogLikelihoodLoss", "", 12, INT_MAX, f, {}};
}

// SoftmaxCrossEntropyLoss = NLL of LogSoftmax over the class axis (1); the optional
// second output is that log-probability tensor.
KernelDef sce_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const LossAttrs at = parse_loss_attrs(node);
    return make_kernel([at](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      if (!dtype_is_float(x.dtype())) fail_dtype(ctx, x.dtype(), "scores");
      if (x.rank() < 2)
        ctx.fail(ErrorCode::invalid_argument, "scores must be (N, C, ...), got " + x.describe());
      const AxisSplit s(x.shape(), 1);
      std::vector<double> v = tensor_to_doubles(x);
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) {
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < s.n; ++j)
            mx = std::max(mx, v[size_t((o * s.n + j) * s.inner + i)]);
          double sum = 0;
          for (int64_t j = 0; j < s.n; ++j)
            sum += std::exp(v[size_t((o * s.n + j) * s.inner + i)] - mx);
          const double lse = mx + std::log(sum);
          for (int64_t j = 0; j < s.n; ++j) v[size_t((o * s.n + j) * s.inner + i)] -= lse;
        }
      nll_into(ctx, at, v, x.shape(), ctx.required_input(1), ctx.input(2), x.dtype());
      if (ctx.output_wanted(1)) {
        Tensor& lp = ctx.output(1, x.dtype(), x.shape());
        visit_class<kFloat>(ctx, x.dtype(), "scores", [&](auto tag) {
          using T = typename decltype(tag)::type;
          T* out = elems_mut<T>(lp);
          for (size_t k = 0; k < v.size(); ++k) out[k] = T(compute_t<T>(v[k]));
        });
      }
    });
  };
  return KernelDef{"SoftmaxCrossEntropyLoss", "", 12, INT_MAX, f, {}};
}

}  // namespace

void register_loss_kernels(KernelRegistry& r) {
  r.add(nll_kernel());
  r.add(sce_kernel());
}

}  // namespace slim::ref
