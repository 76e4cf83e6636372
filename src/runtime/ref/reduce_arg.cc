// Ref kernels that select or scan along one axis: ArgMax, ArgMin, TopK and CumSum.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

KernelDef arg_kernel(const char* op, bool is_max) {
  KernelFactory f = [is_max](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const int64_t axis = node.attr_int("axis", 0);
    const bool keepdims = node.attr_int("keepdims", 1) != 0;
    const bool last = opset >= 12 && node.attr_int("select_last_index", 0) != 0;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      const int a = normalize_axis(ctx, axis, x.rank());
      if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
      const AxisSplit s(x.shape(), a);
      if (s.n == 0) ctx.fail(ErrorCode::invalid_argument, "cannot select along an empty axis");
      Shape out_shape = x.shape();
      if (keepdims)
        out_shape[size_t(a)] = 1;
      else
        out_shape.erase(out_shape.begin() + a);
      Tensor& y = ctx.output(0, DType::i64, out_shape);
      int64_t* out = y.data<int64_t>();
      visit_class<kNumeric>(ctx, x.dtype(), "input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const T* in = elems<T>(x);
        for (int64_t o = 0; o < s.outer; ++o)
          for (int64_t i = 0; i < s.inner; ++i) {
            const T* p = in + o * s.n * s.inner + i;
            int64_t best = 0;
            C bv = C(p[0]);
            for (int64_t j = 1; j < s.n; ++j) {
              const C v = C(p[j * s.inner]);
              const bool better = is_max ? (last ? v >= bv : v > bv) : (last ? v <= bv : v < bv);
              if (better) {
                best = j;
                bv = v;
              }
            }
            out[o * s.inner + i] = best;
          }
      });
    });
  };
  return KernelDef{op, "", 1, INT_MAX, f, {}};
}

// TopK: k from the attribute (opset 1) or input 1 (from opset 10); largest/sorted from 11.
// Equal values keep the lower index first.
KernelDef topk_kernel(int64_t since, int64_t until) {
  KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const int64_t axis = node.attr_int("axis", -1);
    const bool k_from_input = opset >= 10;
    const int64_t k_attr = node.attr_int("k", -1);
    if (!k_from_input && k_attr < 0)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": attribute 'k' is missing or negative");
    const bool largest = opset < 11 || node.attr_int("largest", 1) != 0;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
      const int a = normalize_axis(ctx, axis, x.rank());
      int64_t k = k_attr;
      if (k_from_input) {
        const Tensor& kt = ctx.required_input(1);
        if (kt.dtype() != DType::i64 || kt.numel() != 1)
          ctx.fail(ErrorCode::invalid_argument,
                   "K must be a one-element int64 tensor, got " + kt.describe());
        k = kt.data<int64_t>()[0];
      }
      const AxisSplit s(x.shape(), a);
      if (k < 0 || k > s.n)
        ctx.fail(ErrorCode::invalid_argument, "K = " + std::to_string(k) + " is outside [0, " +
                                                  std::to_string(s.n) + "] for axis " +
                                                  std::to_string(a) + " of " + x.describe());
      Shape out_shape = x.shape();
      out_shape[size_t(a)] = k;
      Tensor& values = ctx.output(0, x.dtype(), out_shape);
      Tensor& indices = ctx.output(1, DType::i64, out_shape);
      int64_t* pi = indices.data<int64_t>();
      visit_class<kNumeric>(ctx, x.dtype(), "input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const T* in = elems<T>(x);
        T* pv = elems_mut<T>(values);
        // The order is total (value, NaN above every number when largest and below when
        // smallest as numpy sorts, then the lower index), so selecting the k first and
        // sorting only those equals a stable sort of the line: a heap of k for small k
        // (most items lose one comparison with its top), nth_element (linear) otherwise.
        using Item = std::pair<C, int64_t>;
        const auto before = [largest](const Item& l, const Item& r) {
          if constexpr (std::is_floating_point_v<C>) {
            const bool nl = std::isnan(l.first), nr = std::isnan(r.first);
            if (nl != nr) return largest ? nl : nr;
            if (nl) return l.second < r.second;
          }
          if (l.first != r.first) return largest ? l.first > r.first : l.first < r.first;
          return l.second < r.second;
        };
        std::vector<Item> line(size_t(s.n));
        for (int64_t o = 0; o < s.outer; ++o)
          for (int64_t i = 0; i < s.inner; ++i) {
            const T* p = in + o * s.n * s.inner + i;
            for (int64_t j = 0; j < s.n; ++j) line[size_t(j)] = {C(p[j * s.inner]), j};
            if (k <= s.n / 64) {
              std::partial_sort(line.begin(), line.begin() + k, line.end(), before);
            } else {
              std::nth_element(line.begin(), line.begin() + k, line.end(), before);
              std::sort(line.begin(), line.begin() + k, before);
            }
            for (int64_t j = 0; j < k; ++j) {
              const int64_t dst = (o * k + j) * s.inner + i;
              pv[dst] = p[line[size_t(j)].second * s.inner];
              pi[dst] = line[size_t(j)].second;
            }
          }
      });
    });
  };
  return KernelDef{"TopK", "", since,
                   until,  f,  since >= 10 ? std::vector<int>{1} : std::vector<int>{}};
}

KernelDef cumsum_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const bool exclusive = node.attr_int("exclusive", 0) != 0;
    const bool reverse = node.attr_int("reverse", 0) != 0;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      const Tensor& at = ctx.required_input(1);
      if (!(at.dtype() == DType::i64 || at.dtype() == DType::i32) || at.numel() != 1)
        ctx.fail(ErrorCode::invalid_argument,
                 "axis must be a one-element int32 or int64 tensor, got " + at.describe());
      if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
      const int a = normalize_axis(ctx, tensor_to_int64s(at)[0], x.rank());
      const AxisSplit s(x.shape(), a);
      visit_class<kNumeric>(ctx, x.dtype(), "input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using A = std::conditional_t<kIsFloat<T>, double, T>;
        const T* in = elems<T>(x);
        Tensor& y = ctx.output(0, x.dtype(), x.shape());
        T* out = elems_mut<T>(y);
        for (int64_t o = 0; o < s.outer; ++o)
          for (int64_t i = 0; i < s.inner; ++i) {
            A acc = A(0);
            for (int64_t step = 0; step < s.n; ++step) {
              const int64_t j = reverse ? s.n - 1 - step : step;
              const int64_t idx = (o * s.n + j) * s.inner + i;
              A v;
              if constexpr (kIsFloat<T>)
                v = to_double(in[idx]);
              else
                v = in[idx];
              const auto add = [&] {
                if constexpr (kIsFloat<T>)
                  acc += v;
                else
                  acc = wrap_add(acc, v);
              };
              if (!exclusive) add();
              out[idx] = T(compute_t<T>(acc));
              if (exclusive) add();
            }
          }
      });
    });
  };
  return KernelDef{"CumSum", "", 11, INT_MAX, f, {}};
}

}  // namespace

void register_reduce_arg_kernels(KernelRegistry& r) {
  r.add(arg_kernel("ArgMax", true));
  r.add(arg_kernel("ArgMin", false));
  r.add(topk_kernel(1, 9));
  r.add(topk_kernel(10, INT_MAX));
  r.add(cumsum_kernel());
}

}  // namespace slim::ref
