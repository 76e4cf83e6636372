// Ref pooling kernels: MaxPool (with indices), AveragePool, LpPool, their Global forms,
// and MaxUnpool, over any number of spatial dims. Values are pooled in double, which
// holds every element of the float and 8-bit types exactly.
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

[[noreturn]] void bad_attr(const Node& node, const std::string& msg) {
  throw Error(ErrorCode::invalid_model, node.describe() + ": " + msg);
}

enum class PoolKind { max, average, lp };

struct PoolAttrs {
  std::string auto_pad;
  Shape kernel_shape, strides, dilations, pads;
  bool ceil_mode = false, count_include_pad = false, column_major = false;
  double p = 2;

  PoolAttrs(const Node& node, int64_t opset, PoolKind kind) {
    auto_pad = node.attr_string("auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
      bad_attr(node, "unknown auto_pad '" + auto_pad + "'");
    if (!node.has_attr("kernel_shape")) bad_attr(node, "attribute 'kernel_shape' is required");
    kernel_shape = node.attr_ints("kernel_shape");
    strides = node.attr_ints("strides");
    dilations = node.attr_ints("dilations");
    pads = node.attr_ints("pads");
    ceil_mode = node.attr_int("ceil_mode", 0) != 0;
    count_include_pad = kind == PoolKind::average && node.attr_int("count_include_pad", 0) != 0;
    column_major = kind == PoolKind::max && node.attr_int("storage_order", 0) != 0;
    if (kind == PoolKind::lp) p = opset >= 2 ? double(node.attr_int("p", 2)) : double(node.attr_float("p", 2.f));
    if (kernel_shape.empty()) bad_attr(node, "kernel_shape is empty");
    for (int64_t v : kernel_shape) if (v < 1) bad_attr(node, "kernel_shape " + shape_str(kernel_shape) + " has a non-positive size");
    const size_t nd = kernel_shape.size();
    if (!strides.empty() && strides.size() != nd) bad_attr(node, "strides " + shape_str(strides) + " does not match kernel_shape");
    if (!dilations.empty() && dilations.size() != nd) bad_attr(node, "dilations " + shape_str(dilations) + " does not match kernel_shape");
    if (!pads.empty() && pads.size() != 2 * nd) bad_attr(node, "pads " + shape_str(pads) + " does not match kernel_shape");
    for (int64_t v : strides) if (v < 1) bad_attr(node, "strides " + shape_str(strides) + " has a non-positive stride");
    for (int64_t v : dilations) if (v < 1) bad_attr(node, "dilations " + shape_str(dilations) + " has a non-positive dilation");
    for (int64_t v : pads) if (v < 0) bad_attr(node, "pads " + shape_str(pads) + " has a negative pad");
    // Larger values cannot describe a real tensor and would overflow the size arithmetic.
    for (const Shape* v : {&kernel_shape, &strides, &dilations, &pads})
      for (int64_t x : *v)
        if (x > (int64_t(1) << 31)) bad_attr(node, "attribute value " + std::to_string(x) + " is out of range");
    if (strides.empty()) strides.assign(nd, 1);
    if (dilations.empty()) dilations.assign(nd, 1);
  }
};

struct PoolGeom {
  int64_t n = 0, c = 0;
  Shape in, out, k, stride, dil, pad_begin, pad_end;
};

PoolGeom pool_geometry(const KernelContext& ctx, const PoolAttrs& a, const Shape& x) {
  const size_t nd = a.kernel_shape.size();
  if (x.size() != nd + 2)
    ctx.fail(ErrorCode::invalid_argument, "input " + shape_str(x) + " does not have " + std::to_string(nd) + " spatial dims");
  PoolGeom g;
  g.n = x[0];
  g.c = x[1];
  g.in.assign(x.begin() + 2, x.end());
  g.k = a.kernel_shape;
  g.stride = a.strides;
  g.dil = a.dilations;
  g.pad_begin.assign(nd, 0);
  g.pad_end.assign(nd, 0);
  g.out.assign(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t span = (g.k[d] - 1) * g.dil[d] + 1, s = g.stride[d];
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t o = (g.in[d] + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (o - 1) * s + span - g.in[d]);
      g.pad_begin[d] = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pad_end[d] = total - g.pad_begin[d];
      g.out[d] = o;
      continue;
    }
    if (a.auto_pad == "NOTSET" && !a.pads.empty()) {
      g.pad_begin[d] = a.pads[d];
      g.pad_end[d] = a.pads[d + nd];
    }
    const int64_t avail = g.in[d] + g.pad_begin[d] + g.pad_end[d] - span;
    if (avail < 0)
      ctx.fail(ErrorCode::invalid_argument, "kernel " + shape_str(g.k) + " does not fit padded input " + shape_str(x));
    int64_t o = (a.ceil_mode ? (avail + s - 1) / s : avail / s) + 1;
    // A ceil-mode window must still start inside the input or its begin padding.
    if (a.ceil_mode && (o - 1) * s >= g.in[d] + g.pad_begin[d]) --o;
    g.out[d] = o;
  }
  return g;
}

// Shared pooling loop: for each output position it collects the valid input positions
// of the window and hands them to `reduce(values, flat_indices, count_with_pad)`.
template <typename Reduce>
void pool_loop(const PoolGeom& g, const std::vector<double>& x, Reduce reduce) {
  const size_t nd = g.in.size();
  const int64_t in_sz = shape_numel(g.in), out_sz = shape_numel(g.out), k_sz = shape_numel(g.k);
  Shape opos(nd, 0), kidx(nd, 0);
  std::vector<int64_t> flat_in;
  for (int64_t o = 0; o < out_sz; ++o) {
    flat_in.clear();
    int64_t with_pad = 0;
    std::fill(kidx.begin(), kidx.end(), 0);
    for (int64_t kk = 0; kk < k_sz; ++kk) {
      int64_t flat = 0;
      bool inside = true, in_padded = true;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t i = opos[d] * g.stride[d] - g.pad_begin[d] + kidx[d] * g.dil[d];
        if (i < 0 || i >= g.in[d]) inside = false;
        if (i >= g.in[d] + g.pad_end[d]) in_padded = false;
        flat = flat * g.in[d] + i;
      }
      if (in_padded) ++with_pad;
      if (inside) flat_in.push_back(flat);
      for (size_t d = nd; d-- > 0;) {
        if (++kidx[d] < g.k[d]) break;
        kidx[d] = 0;
      }
    }
    for (int64_t nc = 0; nc < g.n * g.c; ++nc) reduce(nc * out_sz + o, x.data() + nc * in_sz, nc * in_sz, flat_in, with_pad);
    for (size_t d = nd; d-- > 0;) {
      if (++opos[d] < g.out[d]) break;
      opos[d] = 0;
    }
  }
}

Shape pooled_shape(const PoolGeom& g) {
  Shape s{g.n, g.c};
  s.insert(s.end(), g.out.begin(), g.out.end());
  return s;
}

void check_pool_dtype(const KernelContext& ctx, const Tensor& x, bool allow_8bit) {
  const bool ok = dtype_is_float(x.dtype()) || (allow_8bit && (x.dtype() == DType::u8 || x.dtype() == DType::i8));
  if (!ok) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " has an unsupported dtype");
}

// ---------------------------------------------------------------- MaxPool / AveragePool / LpPool

class Pool final : public OpKernel {
 public:
  Pool(const Node& node, int64_t opset, PoolKind kind) : attrs_(node, opset, kind), kind_(kind) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    check_pool_dtype(ctx, x, kind_ == PoolKind::max);
    const PoolGeom g = pool_geometry(ctx, attrs_, x.shape());
    const Shape out_shape = pooled_shape(g);
    const std::vector<double> xv = tensor_to_doubles(x);
    std::vector<double> y(size_t(shape_numel(out_shape)));
    const bool want_idx = kind_ == PoolKind::max && ctx.output_wanted(1);
    std::vector<int64_t> idx(want_idx ? y.size() : 0);
    // Column-major indices run through the spatial dims first-fastest.
    const Shape cm_strides = [&] {
      Shape st(g.in.size());
      int64_t acc = 1;
      for (size_t d = 0; d < g.in.size(); ++d) { st[d] = acc; acc *= g.in[d]; }
      return st;
    }();
    pool_loop(g, xv, [&](int64_t at, const double* xs, int64_t base, const std::vector<int64_t>& flat, int64_t with_pad) {
      if (kind_ == PoolKind::max) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t arg = -1;
        for (int64_t f : flat)
          if (xs[f] > best || arg < 0) { best = xs[f]; arg = f; }
        y[size_t(at)] = best;
        if (want_idx) {
          int64_t v = arg;
          if (attrs_.column_major && arg >= 0) {
            v = 0;
            int64_t rest = arg;
            for (size_t d = g.in.size(); d-- > 0;) { v += (rest % g.in[d]) * cm_strides[d]; rest /= g.in[d]; }
          }
          idx[size_t(at)] = base + v;
        }
      } else if (kind_ == PoolKind::average) {
        double sum = 0;
        for (int64_t f : flat) sum += xs[f];
        const int64_t div = attrs_.count_include_pad ? with_pad : int64_t(flat.size());
        y[size_t(at)] = div > 0 ? sum / double(div) : 0.0;
      } else {
        double sum = 0;
        for (int64_t f : flat) sum += std::pow(std::fabs(xs[f]), attrs_.p);
        y[size_t(at)] = std::pow(sum, 1.0 / attrs_.p);
      }
    });
    write_doubles(ctx.output(0, x.dtype(), out_shape), y);
    if (want_idx) {
      int64_t* o = ctx.output(1, DType::i64, out_shape).data<int64_t>();
      std::copy(idx.begin(), idx.end(), o);
    }
  }

 private:
  PoolAttrs attrs_;
  PoolKind kind_;
};

class GlobalPool final : public OpKernel {
 public:
  GlobalPool(const Node& node, int64_t opset, PoolKind kind) : kind_(kind) {
    if (kind == PoolKind::lp) p_ = opset >= 2 ? double(node.attr_int("p", 2)) : double(node.attr_float("p", 2.f));
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    check_pool_dtype(ctx, x, false);
    if (x.rank() < 2) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " has rank below 2");
    Shape out_shape = x.shape();
    for (size_t d = 2; d < out_shape.size(); ++d) out_shape[d] = 1;
    const int64_t nc = x.dim(0) * x.dim(1);
    const int64_t sp = nc == 0 ? 0 : x.numel() / nc;
    const std::vector<double> xv = tensor_to_doubles(x);
    std::vector<double> y(static_cast<size_t>(nc));
    for (int64_t i = 0; i < nc; ++i) {
      const double* p = xv.data() + i * sp;
      double acc = kind_ == PoolKind::max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t j = 0; j < sp; ++j) {
        if (kind_ == PoolKind::max) acc = std::max(acc, p[j]);
        else if (kind_ == PoolKind::average) acc += p[j];
        else acc += std::pow(std::fabs(p[j]), p_);
      }
      if (kind_ == PoolKind::average) acc = sp > 0 ? acc / double(sp) : 0.0;
      if (kind_ == PoolKind::lp) acc = std::pow(acc, 1.0 / p_);
      y[size_t(i)] = acc;
    }
    write_doubles(ctx.output(0, x.dtype(), out_shape), y);
  }

 private:
  PoolKind kind_;
  double p_ = 2;
};

// ---------------------------------------------------------------- MaxUnpool

class MaxUnpool final : public OpKernel {
 public:
  MaxUnpool(const Node& node, int64_t opset) : attrs_(node, opset, PoolKind::max) {}
  void compute(KernelContext& ctx) const override {
    const Tensor x = ctx.required_input(0).contiguous();
    const Tensor& ind = ctx.required_input(1);
    if (ind.shape() != x.shape())
      ctx.fail(ErrorCode::invalid_argument, "indices " + ind.describe() + " do not match input " + x.describe());
    const size_t nd = attrs_.kernel_shape.size();
    if (size_t(x.rank()) != nd + 2)
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " does not have " + std::to_string(nd) + " spatial dims");
    // Indices address the unpooled shape implied by the pooling attributes; an explicit
    // output_shape may be larger, and then the values keep their coordinates.
    Shape pooled{x.dim(0), x.dim(1)};
    for (size_t d = 0; d < nd; ++d) {
      const int64_t pb = attrs_.pads.empty() ? 0 : attrs_.pads[d], pe = attrs_.pads.empty() ? 0 : attrs_.pads[d + nd];
      pooled.push_back((x.shape()[d + 2] - 1) * attrs_.strides[d] + attrs_.kernel_shape[d] - pb - pe);
      if (pooled.back() < 0) ctx.fail(ErrorCode::invalid_argument, "pads leave a negative output size");
    }
    Shape out_shape = pooled;
    if (const Tensor* os = ctx.input(2)) {
      out_shape = tensor_to_int64s(*os);
      bool ok = out_shape.size() == nd + 2 && out_shape[0] == x.dim(0) && out_shape[1] == x.dim(1);
      for (size_t d = 2; ok && d < out_shape.size(); ++d) ok = out_shape[d] >= pooled[d];
      if (!ok) ctx.fail(ErrorCode::invalid_argument, "output_shape " + shape_str(out_shape) + " does not fit input " + x.describe());
    }
    check_output_shape(ctx, out_shape);
    Tensor& out = ctx.output(0, x.dtype(), out_shape);
    std::memset(out.raw_data(), 0, out.nbytes());
    const std::vector<int64_t> idx = tensor_to_int64s(ind);
    const int64_t nc = x.dim(0) * x.dim(1);
    const int64_t in_sp = nc ? x.numel() / nc : 0, pooled_sp = nc ? shape_numel(pooled) / nc : 0;
    const int64_t out_sp = nc ? out.numel() / nc : 0;
    const size_t es = x.element_size();
    const char* in = static_cast<const char*>(x.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t k = idx[size_t(i)];
      // Indices are flat over the whole tensor; each must stay within its own (n, c) plane.
      const int64_t plane = i / std::max<int64_t>(in_sp, 1);
      if (k < plane * pooled_sp || k >= (plane + 1) * pooled_sp)
        ctx.fail(ErrorCode::invalid_argument, "index " + std::to_string(k) + " is outside its plane of the unpooled shape " + shape_str(pooled));
      int64_t rest = k - plane * pooled_sp, at = 0, mul = 1;
      for (size_t d = pooled.size(); d-- > 2;) {
        at += (rest % pooled[d]) * mul;
        rest /= pooled[d];
        mul *= out_shape[d];
      }
      std::memcpy(o + size_t(plane * out_sp + at) * es, in + size_t(i) * es, es);
    }
  }

 private:
  PoolAttrs attrs_;
};

// ---------------------------------------------------------------- RoiAlign

// RoiAlign averages (or maxes) bilinear samples on a regular grid inside each bin of each
// region of interest. It follows the ONNX Runtime formulation that the ONNX reference
// copies, including "max" taking the largest weighted corner of each sample.
class RoiAlign final : public OpKernel {
 public:
  RoiAlign(const Node& node, int64_t opset) {
    const std::string mode = node.attr_string("mode", "avg");
    if (mode != "avg" && mode != "max") bad_attr(node, "unknown mode '" + mode + "'");
    max_ = mode == "max";
    out_h_ = node.attr_int("output_height", 1);
    out_w_ = node.attr_int("output_width", 1);
    sampling_ratio_ = node.attr_int("sampling_ratio", 0);
    spatial_scale_ = node.attr_float("spatial_scale", 1.f);
    const std::string ct = opset >= 16 ? node.attr_string("coordinate_transformation_mode", "half_pixel") : "output_half_pixel";
    if (ct != "half_pixel" && ct != "output_half_pixel") bad_attr(node, "unknown coordinate_transformation_mode '" + ct + "'");
    half_pixel_ = ct == "half_pixel";
    if (out_h_ < 1 || out_w_ < 1 || out_h_ > (int64_t(1) << 20) || out_w_ > (int64_t(1) << 20))
      bad_attr(node, "output_height and output_width must be in [1, 2^20]");
    if (sampling_ratio_ < 0 || sampling_ratio_ > 1024) bad_attr(node, "sampling_ratio must be in [0, 1024]");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& rois = ctx.required_input(1);
    const Tensor& batch = ctx.required_input(2);
    check_pool_dtype(ctx, x, false);
    if (x.rank() != 4) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not NCHW");
    const int64_t num = rois.rank() == 2 ? rois.dim(0) : -1;
    if (num < 0 || rois.dim(1) != 4 || batch.rank() != 1 || batch.dim(0) != num)
      ctx.fail(ErrorCode::invalid_argument, "rois " + rois.describe() + " and batch_indices " + batch.describe() +
                                                " must be [R,4] and [R]");
    const int64_t c = x.dim(1), h = x.dim(2), w = x.dim(3);
    const std::vector<double> xv = tensor_to_doubles(x), rv = tensor_to_doubles(rois);
    const std::vector<int64_t> bi = tensor_to_int64s(batch);
    std::vector<double> y(size_t(num * c * out_h_ * out_w_));
    const double offset = half_pixel_ ? 0.5 : 0.0;
    for (int64_t r = 0; r < num; ++r) {
      const int64_t b = bi[size_t(r)];
      if (b < 0 || b >= x.dim(0))
        ctx.fail(ErrorCode::invalid_argument, "batch index " + std::to_string(b) + " of roi " + std::to_string(r) + " is out of range");
      const double* roi = rv.data() + r * 4;
      const double x0 = roi[0] * spatial_scale_ - offset, y0 = roi[1] * spatial_scale_ - offset;
      double rw = roi[2] * spatial_scale_ - offset - x0, rh = roi[3] * spatial_scale_ - offset - y0;
      if (!half_pixel_) {  // the legacy mode forces regions at least one pixel wide
        rw = std::max(rw, 1.0);
        rh = std::max(rh, 1.0);
      }
      if (!std::isfinite(rw) || !std::isfinite(rh) || std::fabs(rw) > 1e9 || std::fabs(rh) > 1e9)
        ctx.fail(ErrorCode::invalid_argument, "roi " + std::to_string(r) + " is not a finite region of a sane size");
      const double bin_h = rh / double(out_h_), bin_w = rw / double(out_w_);
      const int64_t gh = sampling_ratio_ > 0 ? sampling_ratio_ : int64_t(std::ceil(rh / double(out_h_)));
      const int64_t gw = sampling_ratio_ > 0 ? sampling_ratio_ : int64_t(std::ceil(rw / double(out_w_)));
      const double count = double(std::max<int64_t>(gh * gw, 1));
      for (int64_t ch = 0; ch < c; ++ch) {
        const double* plane = xv.data() + (b * c + ch) * h * w;
        for (int64_t ph = 0; ph < out_h_; ++ph)
          for (int64_t pw = 0; pw < out_w_; ++pw) {
            double acc = 0;
            bool first = true;
            for (int64_t iy = 0; iy < gh; ++iy)
              for (int64_t ix = 0; ix < gw; ++ix) {
                const double sy = y0 + double(ph) * bin_h + (double(iy) + 0.5) * bin_h / double(gh);
                const double sx = x0 + double(pw) * bin_w + (double(ix) + 0.5) * bin_w / double(gw);
                const double v = sample(plane, h, w, sy, sx);
                if (max_) acc = first ? v : std::max(acc, v);
                else acc += v;
                first = false;
              }
            y[size_t(((r * c + ch) * out_h_ + ph) * out_w_ + pw)] = max_ ? acc : acc / count;
          }
      }
    }
    write_doubles(ctx.output(0, x.dtype(), {num, c, out_h_, out_w_}), y);
  }

 private:
  // One bilinear sample; in max mode the largest of the four weighted corners.
  double sample(const double* p, int64_t h, int64_t w, double y, double x) const {
    if (y < -1.0 || y > double(h) || x < -1.0 || x > double(w)) return 0;
    y = std::max(y, 0.0);
    x = std::max(x, 0.0);
    int64_t yl = int64_t(y), xl = int64_t(x), yh, xh;
    if (yl >= h - 1) { yl = yh = h - 1; y = double(yl); } else { yh = yl + 1; }
    if (xl >= w - 1) { xl = xh = w - 1; x = double(xl); } else { xh = xl + 1; }
    const double ly = y - double(yl), lx = x - double(xl), hy = 1 - ly, hx = 1 - lx;
    const double v1 = hy * hx * p[yl * w + xl], v2 = hy * lx * p[yl * w + xh];
    const double v3 = ly * hx * p[yh * w + xl], v4 = ly * lx * p[yh * w + xh];
    return max_ ? std::max(std::max(v1, v2), std::max(v3, v4)) : v1 + v2 + v3 + v4;
  }

  bool max_ = false, half_pixel_ = true;
  int64_t out_h_ = 1, out_w_ = 1, sampling_ratio_ = 0;
  double spatial_scale_ = 1;
};

template <PoolKind kind, bool global>
KernelFactory pool_factory() {
  return [](const Node& n, int64_t opset) -> std::unique_ptr<OpKernel> {
    if constexpr (global) return std::make_unique<GlobalPool>(n, opset, kind);
    else return std::make_unique<Pool>(n, opset, kind);
  };
}

}  // namespace

void register_pool_kernels(KernelRegistry& r) {
  r.add({"MaxPool", "", 1, INT_MAX, pool_factory<PoolKind::max, false>(), {}});
  r.add({"AveragePool", "", 1, INT_MAX, pool_factory<PoolKind::average, false>(), {}});
  r.add({"LpPool", "", 1, INT_MAX, pool_factory<PoolKind::lp, false>(), {}});
  r.add({"GlobalMaxPool", "", 1, INT_MAX, pool_factory<PoolKind::max, true>(), {}});
  r.add({"GlobalAveragePool", "", 1, INT_MAX, pool_factory<PoolKind::average, true>(), {}});
  r.add({"GlobalLpPool", "", 1, INT_MAX, pool_factory<PoolKind::lp, true>(), {}});
  r.add({"RoiAlign", "", 10, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<RoiAlign>(n, o);
         }, {}});
  r.add({"MaxUnpool", "", 9, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<MaxUnpool>(n, o);
         }, {2}});
}

}  // namespace slim::ref
