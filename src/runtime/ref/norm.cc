// Ref kernels of the normalizations: BatchNormalization (inference and training mode),
// LayerNormalization, InstanceNormalization, GroupNormalization, LpNormalization, LRN and
// MeanVarianceNormalization. Statistics are computed in double.
#include <cmath>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

std::vector<double> as_doubles(const KernelContext& ctx, const Tensor& t, int64_t expect,
                               const char* name) {
  if (!dtype_is_float(t.dtype()) || t.numel() != expect)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " must be a float tensor of " +
                                              std::to_string(expect) + " elements, got " +
                                              t.describe());
  return tensor_to_doubles(t);
}

// Writes doubles into a new output of the given dtype and shape, rounding once.
void write_output(KernelContext& ctx, int index, DType dtype, const Shape& shape,
                  const std::vector<double>& v) {
  Tensor& y = ctx.output(index, dtype, shape);
  visit_class<kFloat>(ctx, dtype, "output", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = elems_mut<T>(y);
    for (size_t i = 0; i < v.size(); ++i) out[i] = T(compute_t<T>(v[i]));
  });
}

void require_float(const KernelContext& ctx, const Tensor& x) {
  if (!dtype_is_float(x.dtype())) fail_dtype(ctx, x.dtype(), "input");
}

// N, C and the spatial size of an (N, C, D1, ...) input.
struct NcsSplit {
  int64_t n = 1, c = 1, spatial = 1;
  NcsSplit(const KernelContext& ctx, const Tensor& x) {
    if (x.rank() < 2)
      ctx.fail(ErrorCode::invalid_argument, "input must be (N, C, ...), got " + x.describe());
    n = x.dim(0);
    c = x.dim(1);
    for (int d = 2; d < x.rank(); ++d) spatial *= x.dim(d);
  }
};

KernelDef batchnorm_kernel() {
  KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const double eps = node.attr_float("epsilon", 1e-5f);
    const double momentum = node.attr_float("momentum", 0.9f);
    const bool training = opset >= 14 && node.attr_int("training_mode", 0) != 0;
    if (opset < 9 && node.attr_int("spatial", 1) == 0)
      throw Error(ErrorCode::unsupported, node.describe() + ": spatial=0 is not supported");
    if (opset < 14) {
      for (size_t i = 1; i < node.outputs.size(); ++i)
        if (!node.outputs[i].empty())
          throw Error(ErrorCode::unsupported,
                      node.describe() + ": training outputs before opset 14 are not supported");
    } else if (!training) {
      for (size_t i = 1; i < node.outputs.size(); ++i)
        if (!node.outputs[i].empty())
          throw Error(ErrorCode::invalid_model,
                      node.describe() + ": running_mean/running_var need training_mode=1");
    }
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      const NcsSplit s(ctx, x);
      const std::vector<double> scale = as_doubles(ctx, ctx.required_input(1), s.c, "scale");
      const std::vector<double> bias = as_doubles(ctx, ctx.required_input(2), s.c, "B");
      std::vector<double> mean = as_doubles(ctx, ctx.required_input(3), s.c, "input_mean");
      std::vector<double> var = as_doubles(ctx, ctx.required_input(4), s.c, "input_var");
      const std::vector<double> xv = tensor_to_doubles(x);
      if (training) {
        // Batch statistics over every axis but the channel; the variance is the
        // population (biased) one.
        std::vector<double> bm(size_t(s.c), 0), bv(size_t(s.c), 0);
        const double cnt = double(s.n * s.spatial);
        for (int64_t n = 0; n < s.n; ++n)
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t i = 0; i < s.spatial; ++i)
              bm[size_t(c)] += xv[size_t((n * s.c + c) * s.spatial + i)];
        for (auto& m : bm) m /= cnt;
        for (int64_t n = 0; n < s.n; ++n)
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t i = 0; i < s.spatial; ++i) {
              const double d = xv[size_t((n * s.c + c) * s.spatial + i)] - bm[size_t(c)];
              bv[size_t(c)] += d * d;
            }
        for (auto& v : bv) v /= cnt;
        std::vector<double> run_mean(size_t(s.c)), run_var(size_t(s.c));
        for (size_t c = 0; c < size_t(s.c); ++c) {
          run_mean[c] = mean[c] * momentum + bm[c] * (1 - momentum);
          run_var[c] = var[c] * momentum + bv[c] * (1 - momentum);
        }
        if (ctx.output_wanted(1))
          write_output(ctx, 1, ctx.required_input(3).dtype(), {s.c}, run_mean);
        if (ctx.output_wanted(2))
          write_output(ctx, 2, ctx.required_input(4).dtype(), {s.c}, run_var);
        mean = bm;
        var = bv;
      }
      std::vector<double> y(xv.size());
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t c = 0; c < s.c; ++c) {
          const double k = scale[size_t(c)] / std::sqrt(var[size_t(c)] + eps);
          for (int64_t i = 0; i < s.spatial; ++i) {
            const size_t at = size_t((n * s.c + c) * s.spatial + i);
            y[at] = (xv[at] - mean[size_t(c)]) * k + bias[size_t(c)];
          }
        }
      write_output(ctx, 0, x.dtype(), x.shape(), y);
    });
  };
  return KernelDef{"BatchNormalization", "", 1, INT_MAX, f, {}};
}

KernelDef layernorm_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t axis = node.attr_int("axis", -1);
    const double eps = node.attr_float("epsilon", 1e-5f);
    const int64_t stash = node.attr_int("stash_type", 1);
    if (stash != 1 && stash != 11)
      throw Error(ErrorCode::invalid_model, node.describe() +
                                                ": stash_type must be 1 (float) or "
                                                "11 (double), got " +
                                                std::to_string(stash));
    const DType stat_dtype = stash == 1 ? DType::f32 : DType::f64;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
      const int a = normalize_axis(ctx, axis, x.rank());
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < x.rank(); ++d) (d < a ? outer : inner) *= x.dim(d);
      // Scale and B broadcast to X's shape; their index maps give each X element's value.
      const Tensor& scale_t = ctx.required_input(1);
      const Tensor* bias_t = ctx.input(2);
      const auto param_map = [&](const Tensor& t, const char* name) {
        if (broadcast_shapes(ctx, {t.shape(), x.shape()}) != x.shape())
          ctx.fail(ErrorCode::invalid_argument, std::string(name) + " " + t.describe() +
                                                    " does not broadcast to X " + x.describe());
        return broadcast_index_map(t.shape(), x.shape());
      };
      const std::vector<int64_t> smap = param_map(scale_t, "Scale");
      const std::vector<double> scale = tensor_to_doubles(scale_t);
      std::vector<int64_t> bmap;
      std::vector<double> bias;
      if (bias_t) {
        bmap = param_map(*bias_t, "B");
        bias = tensor_to_doubles(*bias_t);
      }
      const std::vector<double> xv = tensor_to_doubles(x);
      std::vector<double> y(xv.size()), mean(static_cast<size_t>(outer)),
          inv_std(static_cast<size_t>(outer));
      for (int64_t o = 0; o < outer; ++o) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < inner; ++i) m += xv[size_t(o * inner + i)];
        m /= double(inner);
        for (int64_t i = 0; i < inner; ++i) {
          const double d = xv[size_t(o * inner + i)] - m;
          v += d * d;
        }
        v /= double(inner);
        const double is = 1.0 / std::sqrt(v + eps);
        mean[size_t(o)] = m;
        inv_std[size_t(o)] = is;
        for (int64_t i = 0; i < inner; ++i) {
          const size_t at = size_t(o * inner + i);
          y[at] =
              (xv[at] - m) * is * scale[size_t(smap[at])] + (bias_t ? bias[size_t(bmap[at])] : 0.0);
        }
      }
      write_output(ctx, 0, x.dtype(), x.shape(), y);
      Shape stat_shape = x.shape();
      for (int d = a; d < x.rank(); ++d) stat_shape[size_t(d)] = 1;
      if (ctx.output_wanted(1)) write_output(ctx, 1, stat_dtype, stat_shape, mean);
      if (ctx.output_wanted(2)) write_output(ctx, 2, stat_dtype, stat_shape, inv_std);
    });
  };
  return KernelDef{"LayerNormalization", "", 17, INT_MAX, f, {}};
}

// Normalizes each (n, group) block of `per_group` channels over channels and space, then
// applies a per-channel affine (InstanceNormalization is the one-channel-per-group case).
void group_normalize(KernelContext& ctx, const Tensor& x, int64_t groups, double eps,
                     const std::vector<double>& scale, const std::vector<double>& bias) {
  const NcsSplit s(ctx, x);
  const int64_t per_group = s.c / groups;
  const int64_t block = per_group * s.spatial;
  const std::vector<double> xv = tensor_to_doubles(x);
  std::vector<double> y(xv.size());
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t base = size_t((n * s.c + g * per_group) * s.spatial);
      double m = 0, v = 0;
      for (int64_t i = 0; i < block; ++i) m += xv[base + size_t(i)];
      m /= double(block);
      for (int64_t i = 0; i < block; ++i) {
        const double d = xv[base + size_t(i)] - m;
        v += d * d;
      }
      v /= double(block);
      const double is = 1.0 / std::sqrt(v + eps);
      for (int64_t i = 0; i < block; ++i) {
        const size_t c = size_t(g * per_group + i / s.spatial);
        y[base + size_t(i)] = (xv[base + size_t(i)] - m) * is * scale[c] + bias[c];
      }
    }
  write_output(ctx, 0, x.dtype(), x.shape(), y);
}

KernelDef instancenorm_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const double eps = node.attr_float("epsilon", 1e-5f);
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      const NcsSplit s(ctx, x);
      group_normalize(ctx, x, s.c, eps, as_doubles(ctx, ctx.required_input(1), s.c, "scale"),
                      as_doubles(ctx, ctx.required_input(2), s.c, "B"));
    });
  };
  return KernelDef{"InstanceNormalization", "", 1, INT_MAX, f, {}};
}

// GroupNormalization-18 scales per group; from opset 21 per channel.
KernelDef groupnorm_kernel() {
  KernelFactory f = [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    const double eps = node.attr_float("epsilon", 1e-5f);
    if (!node.has_attr("num_groups"))
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": attribute 'num_groups' is missing");
    const int64_t groups = node.attr_int("num_groups", 0);
    if (groups <= 0)
      throw Error(ErrorCode::invalid_model, node.describe() + ": num_groups must be positive");
    const bool per_channel = opset >= 21;
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      const NcsSplit s(ctx, x);
      if (s.c % groups != 0)
        ctx.fail(ErrorCode::invalid_argument, std::to_string(s.c) +
                                                  " channels are not divisible into " +
                                                  std::to_string(groups) + " groups");
      const int64_t len = per_channel ? s.c : groups;
      std::vector<double> scale = as_doubles(ctx, ctx.required_input(1), len, "scale");
      std::vector<double> bias = as_doubles(ctx, ctx.required_input(2), len, "bias");
      if (!per_channel) {
        std::vector<double> sc(size_t(s.c)), bc(size_t(s.c));
        for (int64_t c = 0; c < s.c; ++c) {
          sc[size_t(c)] = scale[size_t(c / (s.c / groups))];
          bc[size_t(c)] = bias[size_t(c / (s.c / groups))];
        }
        scale = sc;
        bias = bc;
      }
      group_normalize(ctx, x, groups, eps, scale, bias);
    });
  };
  return KernelDef{"GroupNormalization", "", 18, INT_MAX, f, {}};
}

KernelDef lpnorm_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t axis = node.attr_int("axis", -1);
    const int64_t p = node.attr_int("p", 2);
    if (p != 1 && p != 2)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": p must be 1 or 2, got " + std::to_string(p));
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      if (x.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "input must have rank >= 1");
      const AxisSplit s(x.shape(), normalize_axis(ctx, axis, x.rank()));
      const std::vector<double> xv = tensor_to_doubles(x);
      std::vector<double> y(xv.size());
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) {
          double norm = 0;
          for (int64_t j = 0; j < s.n; ++j) {
            const double v = xv[size_t((o * s.n + j) * s.inner + i)];
            norm += p == 1 ? std::fabs(v) : v * v;
          }
          if (p == 2) norm = std::sqrt(norm);
          for (int64_t j = 0; j < s.n; ++j) {
            const size_t at = size_t((o * s.n + j) * s.inner + i);
            y[at] = xv[at] / norm;
          }
        }
      write_output(ctx, 0, x.dtype(), x.shape(), y);
    });
  };
  return KernelDef{"LpNormalization", "", 1, INT_MAX, f, {}};
}

KernelDef lrn_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t size = node.attr_int("size", 0);
    if (size <= 0)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": attribute 'size' must be positive");
    const double alpha = node.attr_float("alpha", 1e-4f);
    const double beta = node.attr_float("beta", 0.75f);
    const double bias = node.attr_float("bias", 1.0f);
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      const NcsSplit s(ctx, x);
      const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;  // floor below, ceil above
      const std::vector<double> xv = tensor_to_doubles(x);
      std::vector<double> y(xv.size());
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t c = 0; c < s.c; ++c)
          for (int64_t i = 0; i < s.spatial; ++i) {
            double sq = 0;
            for (int64_t cc = std::max<int64_t>(0, c - lo); cc <= std::min(s.c - 1, c + hi); ++cc) {
              const double v = xv[size_t((n * s.c + cc) * s.spatial + i)];
              sq += v * v;
            }
            const size_t at = size_t((n * s.c + c) * s.spatial + i);
            y[at] = xv[at] / std::pow(bias + alpha / double(size) * sq, beta);
          }
      write_output(ctx, 0, x.dtype(), x.shape(), y);
    });
  };
  return KernelDef{"LRN", "", 1, INT_MAX, f, {}};
}

// MVN follows its ONNX function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9).
KernelDef mvn_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const std::vector<int64_t> axes = node.attr_ints("axes", {0, 2, 3});
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      require_float(ctx, x);
      const int rank = x.rank();
      std::vector<bool> reduced(size_t(rank), false);
      for (int64_t a : axes) reduced[size_t(normalize_axis(ctx, a, rank))] = true;
      Shape kept = x.shape();
      for (int d = 0; d < rank; ++d)
        if (reduced[size_t(d)]) kept[size_t(d)] = 1;
      const std::vector<int64_t> map = broadcast_index_map(kept, x.shape());
      const int64_t groups = shape_numel(kept);
      const std::vector<double> xv = tensor_to_doubles(x);
      std::vector<double> sum(size_t(groups), 0), sq(size_t(groups), 0);
      std::vector<int64_t> cnt(size_t(groups), 0);
      for (size_t k = 0; k < xv.size(); ++k) {
        sum[size_t(map[k])] += xv[k];
        sq[size_t(map[k])] += xv[k] * xv[k];
        ++cnt[size_t(map[k])];
      }
      std::vector<double> y(xv.size());
      for (size_t k = 0; k < xv.size(); ++k) {
        const size_t g = size_t(map[k]);
        const double m = sum[g] / double(cnt[g]);
        const double var = sq[g] / double(cnt[g]) - m * m;
        y[k] = (xv[k] - m) / (std::sqrt(std::max(var, 0.0)) + 1e-9);
      }
      write_output(ctx, 0, x.dtype(), x.shape(), y);
    });
  };
  return KernelDef{"MeanVarianceNormalization", "", 9, INT_MAX, f, {}};
}

}  // namespace

void register_norm_kernels(KernelRegistry& r) {
  r.add(batchnorm_kernel());
  r.add(layernorm_kernel());
  r.add(instancenorm_kernel());
  r.add(groupnorm_kernel());
  r.add(lpnorm_kernel());
  r.add(lrn_kernel());
  r.add(mvn_kernel());
}

}  // namespace slim::ref
