// Ref kernels of the ReduceX family. The axes come from an attribute in early opsets and
// from input 1 later (ReduceSum from 13, the others from 18), where an empty axes list
// reduces everything unless noop_with_empty_axes is set.
#include <algorithm>
#include <cmath>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

enum class ReduceOp { sum, mean, max, min, prod, l1, l2, log_sum, log_sum_exp, sum_square };

struct ReduceAttrs {
  ReduceOp op;
  bool axes_from_input = false;
  std::vector<int64_t> axes;  // from the attribute
  bool keepdims = true;
  bool noop_with_empty_axes = false;
};

// Floats accumulate in double (the oracle should be more precise than what it checks);
// integers accumulate in their own type, wrapping.
template <typename T>
using reduce_acc_t = std::conditional_t<kIsFloat<T>, double, T>;

template <typename T>
void reduce_typed(KernelContext& ctx, const ReduceAttrs& at, const Tensor& x,
                  const std::vector<bool>& reduced, bool noop) {
  using A = reduce_acc_t<T>;
  const Shape& in_shape = x.shape();
  const size_t rank = in_shape.size();
  Shape out_shape, kept_shape;  // kept_shape: reduced dims as 1, for index arithmetic
  for (size_t d = 0; d < rank; ++d) {
    const bool r = !noop && reduced[d];
    kept_shape.push_back(r ? 1 : in_shape[d]);
    if (!r || at.keepdims) out_shape.push_back(r ? 1 : in_shape[d]);
  }
  const int64_t out_n = shape_numel(kept_shape);
  const int64_t in_n = x.numel();
  const int64_t count = out_n == 0 ? 0 : in_n / std::max<int64_t>(out_n, 1);
  const Shape kept_strides = contiguous_strides(kept_shape);
  const T* in = elems<T>(x);

  // Flat output index of every input element, walking the input row-major.
  std::vector<int64_t> dst(static_cast<size_t>(in_n));
  {
    std::vector<int64_t> idx(rank, 0);
    int64_t o = 0;
    for (int64_t k = 0; k < in_n; ++k) {
      dst[size_t(k)] = o;
      for (size_t d = rank; d-- > 0;) {
        ++idx[d];
        if (kept_shape[d] != 1) o += kept_strides[d];
        if (idx[d] < in_shape[d]) break;
        if (kept_shape[d] != 1) o -= kept_strides[d] * idx[d];
        idx[d] = 0;
      }
    }
  }

  const auto value = [&](int64_t k) -> A {
    if constexpr (kIsFloat<T>)
      return to_double(in[k]);
    else
      return in[k];
  };
  std::vector<A> acc(static_cast<size_t>(out_n));
  A init = A(0);
  if (at.op == ReduceOp::prod) init = A(1);
  if (at.op == ReduceOp::max)
    init = kIsFloat<T> ? A(-std::numeric_limits<double>::infinity())
                       : std::numeric_limits<A>::lowest();
  if (at.op == ReduceOp::min)
    init = kIsFloat<T> ? A(std::numeric_limits<double>::infinity()) : std::numeric_limits<A>::max();
  std::fill(acc.begin(), acc.end(), init);

  // log-sum-exp subtracts each group's maximum first so exp cannot overflow.
  std::vector<double> shift;
  if (at.op == ReduceOp::log_sum_exp) {
    shift.assign(size_t(out_n), -std::numeric_limits<double>::infinity());
    for (int64_t k = 0; k < in_n; ++k) {
      double& s = shift[size_t(dst[size_t(k)])];
      s = std::max(s, double(value(k)));
    }
    for (double& s : shift)
      if (std::isinf(s)) s = 0;  // all -inf (or empty): exp(-inf - 0) = 0 keeps the result -inf
  }

  for (int64_t k = 0; k < in_n; ++k) {
    A& a = acc[size_t(dst[size_t(k)])];
    const A v = value(k);
    switch (at.op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
      case ReduceOp::log_sum:
        if constexpr (kIsFloat<T>)
          a += v;
        else
          a = wrap_add(a, v);
        break;
      case ReduceOp::prod:
        if constexpr (kIsFloat<T>)
          a *= v;
        else
          a = wrap_mul(a, v);
        break;
      case ReduceOp::max:
        if constexpr (kIsFloat<T>)
          a = (std::isnan(v) || v > a) ? v : a;
        else
          a = std::max(a, v);
        break;
      case ReduceOp::min:
        if constexpr (kIsFloat<T>)
          a = (std::isnan(v) || v < a) ? v : a;
        else
          a = std::min(a, v);
        break;
      case ReduceOp::l1:
        if constexpr (kIsFloat<T>)
          a += std::fabs(v);
        else if constexpr (std::is_signed_v<A>)
          a = wrap_add(a, v < 0 ? wrap_sub(A(0), v) : v);
        else
          a = wrap_add(a, v);
        break;
      case ReduceOp::l2:
      case ReduceOp::sum_square:
        if constexpr (kIsFloat<T>)
          a += v * v;
        else
          a = wrap_add(a, wrap_mul(v, v));
        break;
      case ReduceOp::log_sum_exp:
        if constexpr (kIsFloat<T>) a += std::exp(v - shift[size_t(dst[size_t(k)])]);
        break;
    }
  }

  Tensor& y = ctx.output(0, x.dtype(), out_shape);
  T* out = elems_mut<T>(y);
  for (int64_t o = 0; o < out_n; ++o) {
    const A a = acc[size_t(o)];
    double r;
    switch (at.op) {
      case ReduceOp::mean:
        if constexpr (kIsFloat<T>) {
          r = count == 0 ? std::numeric_limits<double>::quiet_NaN() : double(a) / double(count);
        } else {
          if (count == 0) ctx.fail(ErrorCode::invalid_argument, "integer mean of an empty set");
          out[o] = T(a / A(count));
          continue;
        }
        break;
      case ReduceOp::l2:
        r = std::sqrt(double(a));
        break;
      case ReduceOp::log_sum:
        r = std::log(double(a));
        break;
      case ReduceOp::log_sum_exp:
        r = std::log(double(a)) + shift[size_t(o)];
        break;
      default:
        out[o] = T(compute_t<T>(a));
        continue;
    }
    out[o] = T(compute_t<T>(r));
  }
}

void compute_reduce(KernelContext& ctx, const ReduceAttrs& at) {
  const Tensor& x = ctx.required_input(0);
  const int rank = x.rank();
  std::vector<int64_t> axes = at.axes;
  if (at.axes_from_input) {
    axes.clear();
    if (const Tensor* a = ctx.input(1)) {
      if (a->dtype() != DType::i64 || a->rank() > 1)
        ctx.fail(ErrorCode::invalid_argument,
                 "axes must be a 1-D int64 tensor, got " + a->describe());
      axes = tensor_to_int64s(*a);
    }
  }
  std::vector<bool> reduced(size_t(rank), axes.empty());
  for (int64_t a : axes) {
    const int n = normalize_axis(ctx, a, rank);
    if (rank == 0) continue;
    if (reduced[size_t(n)] && !axes.empty())
      ctx.fail(ErrorCode::invalid_model, "axis " + std::to_string(a) + " is repeated in axes");
    reduced[size_t(n)] = true;
  }
  const bool noop = axes.empty() && at.noop_with_empty_axes;
  if (at.op == ReduceOp::log_sum_exp && !dtype_is_float(x.dtype()))
    fail_dtype(ctx, x.dtype(), "ReduceLogSumExp input");
  visit_class<kNumeric>(ctx, x.dtype(), "input", [&](auto tag) {
    reduce_typed<typename decltype(tag)::type>(ctx, at, x, reduced, noop);
  });
}

void add_reduce(KernelRegistry& r, const char* op, ReduceOp rop, int64_t axes_input_since) {
  KernelFactory f = [rop, axes_input_since](const Node& node,
                                            int64_t opset) -> std::unique_ptr<OpKernel> {
    ReduceAttrs at;
    at.op = rop;
    at.axes_from_input = opset >= axes_input_since;
    if (at.axes_from_input && node.has_attr("axes"))
      throw Error(ErrorCode::invalid_model, node.describe() + ": from opset " +
                                                std::to_string(axes_input_since) +
                                                " axes is an input, not an attribute");
    at.axes = node.attr_ints("axes");
    at.keepdims = node.attr_int("keepdims", 1) != 0;
    at.noop_with_empty_axes = node.attr_int("noop_with_empty_axes", 0) != 0;
    return make_kernel([at](KernelContext& ctx) { compute_reduce(ctx, at); });
  };
  // The attribute form's output shape depends on nothing but shapes; the input form's
  // on the axes values.
  r.add(KernelDef{op, "", 1, axes_input_since - 1, f, {}});
  r.add(KernelDef{op, "", axes_input_since, INT_MAX, f, {1}});
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  add_reduce(r, "ReduceSum", ReduceOp::sum, 13);
  add_reduce(r, "ReduceMean", ReduceOp::mean, 18);
  add_reduce(r, "ReduceMax", ReduceOp::max, 18);
  add_reduce(r, "ReduceMin", ReduceOp::min, 18);
  add_reduce(r, "ReduceProd", ReduceOp::prod, 18);
  add_reduce(r, "ReduceL1", ReduceOp::l1, 18);
  add_reduce(r, "ReduceL2", ReduceOp::l2, 18);
  add_reduce(r, "ReduceLogSum", ReduceOp::log_sum, 18);
  add_reduce(r, "ReduceLogSumExp", ReduceOp::log_sum_exp, 18);
  add_reduce(r, "ReduceSumSquare", ReduceOp::sum_square, 18);
}

}  // namespace slim::ref
