// Ref kernel of Det: the determinant of each trailing (M, M) matrix, by LU decomposition
// with partial pivoting in double.
#include <cmath>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

double determinant(std::vector<double> a, int64_t m) {
  double det = 1;
  for (int64_t col = 0; col < m; ++col) {
    int64_t pivot = col;
    for (int64_t r = col + 1; r < m; ++r)
      if (std::fabs(a[size_t(r * m + col)]) > std::fabs(a[size_t(pivot * m + col)])) pivot = r;
    if (a[size_t(pivot * m + col)] == 0) return 0;
    if (pivot != col) {
      for (int64_t k = 0; k < m; ++k) std::swap(a[size_t(col * m + k)], a[size_t(pivot * m + k)]);
      det = -det;
    }
    const double p = a[size_t(col * m + col)];
    det *= p;
    for (int64_t r = col + 1; r < m; ++r) {
      const double f = a[size_t(r * m + col)] / p;
      for (int64_t k = col; k < m; ++k) a[size_t(r * m + k)] -= f * a[size_t(col * m + k)];
    }
  }
  return det;
}

void compute_det(KernelContext& ctx) {
  const Tensor& x = ctx.required_input(0);
  if (!dtype_is_float(x.dtype())) fail_dtype(ctx, x.dtype(), "input");
  if (x.rank() < 2 || x.dim(-1) != x.dim(-2))
    ctx.fail(ErrorCode::invalid_argument, "input must be (..., M, M), got " + x.describe());
  const int64_t m = x.dim(-1);
  const Shape out_shape(x.shape().begin(), x.shape().end() - 2);
  const int64_t batches = shape_numel(out_shape);
  const std::vector<double> xv = tensor_to_doubles(x);
  Tensor& y = ctx.output(0, x.dtype(), out_shape);
  visit_class<kFloat>(ctx, x.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = elems_mut<T>(y);
    for (int64_t b = 0; b < batches; ++b) {
      std::vector<double> mat(xv.begin() + b * m * m, xv.begin() + (b + 1) * m * m);
      out[b] = T(compute_t<T>(determinant(std::move(mat), m)));
    }
  });
}

}  // namespace

void register_math_det_kernels(KernelRegistry& r) {
  r.add(KernelDef{"Det", "", 11, INT_MAX, simple_kernel(compute_det), {}});
}

}  // namespace slim::ref
