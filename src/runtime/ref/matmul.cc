// Ref kernels of the matrix products MatMul (numpy semantics), Gemm and MatMulInteger.
// Straight triple loops with double accumulation for floats: the oracle for fast GEMMs.
#include <algorithm>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

void compute_matmul(KernelContext& ctx) {
  const Tensor& a = ctx.required_input(0);
  const Tensor& b = ctx.required_input(1);
  if (a.dtype() != b.dtype())
    ctx.fail(ErrorCode::invalid_model,
             "inputs have different dtypes: " + a.describe() + " and " + b.describe());
  const MatMulPlan p(ctx, a.shape(), b.shape());
  visit_class<kFloat | kInt>(ctx, a.dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<kIsFloat<T>, double, T>;
    const T* pa = elems<T>(a);
    const T* pb = elems<T>(b);
    Tensor& y = ctx.output(0, a.dtype(), p.out_shape);
    T* out = elems_mut<T>(y);
    std::vector<A> row(static_cast<size_t>(p.n));
    for (int64_t bt = 0; bt < p.batches; ++bt) {
      const T* ma = pa + p.a_batch[size_t(bt)] * p.m * p.k;
      const T* mb = pb + p.b_batch[size_t(bt)] * p.k * p.n;
      T* mo = out + bt * p.m * p.n;
      // Row by row with B walked along its rows (i, t, j order): each output element
      // still sums its k products in order, but memory is read contiguously.
      for (int64_t i = 0; i < p.m; ++i) {
        std::fill(row.begin(), row.end(), A(0));
        for (int64_t t = 0; t < p.k; ++t) {
          const T av = ma[i * p.k + t];
          const T* brow = mb + t * p.n;
          for (int64_t j = 0; j < p.n; ++j) {
            if constexpr (kIsFloat<T>)
              row[size_t(j)] += to_double(av) * to_double(brow[j]);
            else
              row[size_t(j)] = wrap_add(row[size_t(j)], wrap_mul(av, brow[j]));
          }
        }
        for (int64_t j = 0; j < p.n; ++j) mo[i * p.n + j] = T(compute_t<T>(row[size_t(j)]));
      }
    }
  });
}

// Zero points of MatMulInteger: a scalar, or a vector along A's rows (M) / B's columns (N).
std::vector<int32_t> zero_points(const KernelContext& ctx, int index, DType expect, int64_t len,
                                 const char* name) {
  const Tensor* z = ctx.input(index);
  if (!z) return std::vector<int32_t>(size_t(len), 0);
  if (z->dtype() != expect)
    ctx.fail(ErrorCode::invalid_argument,
             std::string(name) + " " + z->describe() + " must have the dtype of its matrix");
  const std::vector<int64_t> v = tensor_to_int64s(*z);
  if (v.size() == 1) return std::vector<int32_t>(size_t(len), int32_t(v[0]));
  if (z->rank() == 1 && int64_t(v.size()) == len) return std::vector<int32_t>(v.begin(), v.end());
  ctx.fail(ErrorCode::unsupported, std::string(name) + " " + z->describe() +
                                       " must be a scalar or a vector of length " +
                                       std::to_string(len));
}

void compute_matmul_integer(KernelContext& ctx) {
  const Tensor& a = ctx.required_input(0);
  const Tensor& b = ctx.required_input(1);
  for (const Tensor* t : {&a, &b})
    if (t->dtype() != DType::u8 && t->dtype() != DType::i8)
      ctx.fail(ErrorCode::invalid_argument, "inputs must be uint8 or int8, got " + t->describe());
  const MatMulPlan p(ctx, a.shape(), b.shape());
  const std::vector<int32_t> za = zero_points(ctx, 2, a.dtype(), p.m, "a_zero_point");
  const std::vector<int32_t> zb = zero_points(ctx, 3, b.dtype(), p.n, "b_zero_point");
  const std::vector<int64_t> va = tensor_to_int64s(a), vb = tensor_to_int64s(b);
  Tensor& y = ctx.output(0, DType::i32, p.out_shape);
  int32_t* out = y.data<int32_t>();
  for (int64_t bt = 0; bt < p.batches; ++bt) {
    const int64_t* ma = va.data() + p.a_batch[size_t(bt)] * p.m * p.k;
    const int64_t* mb = vb.data() + p.b_batch[size_t(bt)] * p.k * p.n;
    int32_t* mo = out + bt * p.m * p.n;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        int64_t acc = 0;
        for (int64_t t = 0; t < p.k; ++t)
          acc += (ma[i * p.k + t] - za[size_t(i)]) * (mb[t * p.n + j] - zb[size_t(j)]);
        mo[i * p.n + j] = int32_t(acc);
      }
  }
}

// Gemm: Y = alpha * op(A) * op(B) + beta * C, C broadcast to (M, N).
KernelDef gemm_kernel() {
  KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const double alpha = node.attr_float("alpha", 1.0f);
    const double beta = node.attr_float("beta", 1.0f);
    const bool trans_a = node.attr_int("transA", 0) != 0;
    const bool trans_b = node.attr_int("transB", 0) != 0;
    // Before opset 7, C broadcast only with broadcast=1; an unbroadcast C must be (M, N).
    const bool legacy_no_broadcast = opset < 7 && node.attr_int("broadcast", 0) == 0;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& a = ctx.required_input(0);
      const Tensor& b = ctx.required_input(1);
      const Tensor* c = ctx.input(2);
      if (a.rank() != 2 || b.rank() != 2)
        ctx.fail(ErrorCode::invalid_argument,
                 "A and B must be 2-D, got " + a.describe() + " and " + b.describe());
      if (a.dtype() != b.dtype() || (c && c->dtype() != a.dtype()))
        ctx.fail(ErrorCode::invalid_model, "A, B and C must share a dtype");
      const int64_t m = trans_a ? a.dim(1) : a.dim(0);
      const int64_t k = trans_a ? a.dim(0) : a.dim(1);
      const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
      const int64_t n = trans_b ? b.dim(0) : b.dim(1);
      if (k != kb)
        ctx.fail(ErrorCode::invalid_argument,
                 "inner dimensions differ: A " + a.describe() + " B " + b.describe());
      const Shape out_shape{m, n};
      std::vector<int64_t> cmap;
      if (c) {
        if (legacy_no_broadcast && c->shape() != out_shape)
          ctx.fail(ErrorCode::invalid_argument, "C " + c->describe() + " must be " +
                                                    shape_str(out_shape) + " without broadcast=1");
        if (c->rank() > 2 || broadcast_shapes(ctx, {c->shape(), out_shape}) != out_shape)
          ctx.fail(ErrorCode::invalid_argument,
                   "C " + c->describe() + " does not broadcast to " + shape_str(out_shape));
        cmap = broadcast_index_map(c->shape(), out_shape);
      }
      // op(A) as (M, K) rows and op(B) as (N, K) rows, in double, so that every dot
      // product below reads two contiguous rows.
      const std::vector<double> av = tensor_to_doubles(a), bv = tensor_to_doubles(b);
      std::vector<double> ar(static_cast<size_t>(m * k)), br(static_cast<size_t>(n * k));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t t = 0; t < k; ++t)
          ar[size_t(i * k + t)] = trans_a ? av[size_t(t * m + i)] : av[size_t(i * k + t)];
      for (int64_t j = 0; j < n; ++j)
        for (int64_t t = 0; t < k; ++t)
          br[size_t(j * k + t)] = trans_b ? bv[size_t(j * k + t)] : bv[size_t(t * n + j)];
      const std::vector<double> cv = c ? tensor_to_doubles(*c) : std::vector<double>{};
      visit_class<kFloat | kInt>(ctx, a.dtype(), "input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor& y = ctx.output(0, a.dtype(), out_shape);
        T* out = elems_mut<T>(y);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            const double* arow = ar.data() + i * k;
            const double* brow = br.data() + j * k;
            for (int64_t t = 0; t < k; ++t) acc += arow[t] * brow[t];
            double v = alpha * acc;
            if (c) v += beta * cv[size_t(cmap[size_t(i * n + j)])];
            out[i * n + j] = T(compute_t<T>(v));
          }
      });
    });
  };
  return with_inferred_outputs(KernelDef{"Gemm", "", 1, INT_MAX, f, {}}, [](const KernelBuildInfo& info, const KernelContext& ctx) {
    const Shape& a = *info.input(0).shape;
    const Shape& b = *info.input(1).shape;
    if (a.size() != 2 || b.size() != 2) ctx.fail(ErrorCode::invalid_argument, "A and B must be 2-D");
    const bool trans_a = info.node.attr_int("transA", 0) != 0, trans_b = info.node.attr_int("transB", 0) != 0;
    return std::vector<std::pair<DType, Shape>>{{*info.input(0).dtype, {a[trans_a ? 1 : 0], b[trans_b ? 0 : 1]}}};
  });
}

// MatMul's output shape, in `dtype` (nullopt: A's).
OutputInference matmul_outputs(std::optional<DType> dtype) {
  return [=](const KernelBuildInfo& info, const KernelContext& ctx) {
    const MatMulPlan p(ctx, *info.input(0).shape, *info.input(1).shape);
    return std::vector<std::pair<DType, Shape>>{{dtype.value_or(*info.input(0).dtype), p.out_shape}};
  };
}

}  // namespace

void register_matmul_kernels(KernelRegistry& r) {
  r.add(with_inferred_outputs(KernelDef{"MatMul", "", 1, INT_MAX, simple_kernel(compute_matmul), {}},
                              matmul_outputs(std::nullopt)));
  r.add(with_inferred_outputs(KernelDef{"MatMulInteger", "", 10, INT_MAX, simple_kernel(compute_matmul_integer), {}},
                              matmul_outputs(DType::i32)));
  r.add(gemm_kernel());
}

}  // namespace slim::ref
