// Ref kernels of Softmax, LogSoftmax and Hardmax. Before opset 13 the input is coerced to
// 2-D at `axis` (default 1) and the op runs over the flattened trailing dims; from 13 it
// runs along the single axis `axis` (default -1).
#include <cmath>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

enum class SoftmaxKind { softmax, log_softmax, hardmax };

void compute_softmax(KernelContext& ctx, SoftmaxKind kind, int64_t axis, bool coerce_2d) {
  const Tensor& x = ctx.required_input(0);
  const int rank = x.rank();
  if (rank == 0 && !coerce_2d) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
  // The coerced form also accepts axis == rank (every dim goes to the outer part).
  const int a =
      (coerce_2d && (axis == rank || axis == 0)) ? int(axis) : normalize_axis(ctx, axis, rank);
  int64_t outer = 1, n = 1, inner = 1;
  if (coerce_2d) {
    for (int d = 0; d < rank; ++d) (d < a ? outer : n) *= x.shape()[size_t(d)];
  } else {
    const AxisSplit s(x.shape(), a);
    outer = s.outer;
    n = s.n;
    inner = s.inner;
  }
  visit_class<kFloat>(ctx, x.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = elems<T>(x);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    T* out = elems_mut<T>(y);
    std::vector<double> row(static_cast<size_t>(n));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * n * inner + i;
        double mx = -std::numeric_limits<double>::infinity();
        int64_t arg = 0;
        for (int64_t j = 0; j < n; ++j) {
          row[size_t(j)] = to_double(in[base + j * inner]);
          if (row[size_t(j)] > mx) {
            mx = row[size_t(j)];
            arg = j;
          }
        }
        if (kind == SoftmaxKind::hardmax) {
          for (int64_t j = 0; j < n; ++j) out[base + j * inner] = T(compute_t<T>(j == arg ? 1 : 0));
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(row[size_t(j)] - mx);
        for (int64_t j = 0; j < n; ++j) {
          const double v = kind == SoftmaxKind::softmax ? std::exp(row[size_t(j)] - mx) / sum
                                                        : row[size_t(j)] - mx - std::log(sum);
          out[base + j * inner] = T(compute_t<T>(v));
        }
      }
  });
}

void add_softmax(KernelRegistry& r, const char* op, SoftmaxKind kind) {
  KernelFactory f = [kind](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const bool coerce_2d = opset < 13;
    const int64_t axis = node.attr_int("axis", coerce_2d ? 1 : -1);
    return make_kernel([=](KernelContext& ctx) { compute_softmax(ctx, kind, axis, coerce_2d); });
  };
  r.add(KernelDef{op, "", 1, INT_MAX, f, {}});
}

}  // namespace

void register_math_softmax_kernels(KernelRegistry& r) {
  add_softmax(r, "Softmax", SoftmaxKind::softmax);
  add_softmax(r, "LogSoftmax", SoftmaxKind::log_softmax);
  add_softmax(r, "Hardmax", SoftmaxKind::hardmax);
}

}  // namespace slim::ref
