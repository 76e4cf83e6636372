// Ref convolution kernels: Conv, ConvTranspose, ConvInteger and QLinearConv over any
// number of spatial dims. One geometry routine resolves auto_pad/pads/output_shape and
// two plain loops (direct and transposed) do the arithmetic, in double for float
// types and in int64 for the integer ones, so they serve as an exact oracle.
#include <cmath>
#include <cstring>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

[[noreturn]] void bad_attr(const Node& node, const std::string& msg) {
  throw Error(ErrorCode::invalid_model, node.describe() + ": " + msg);
}

constexpr int64_t kMaxConvAttr = int64_t(1) << 31;

// Attributes shared by all convolution ops, validated when the kernel is built.
struct ConvAttrs {
  std::string auto_pad;
  Shape kernel_shape, strides, dilations, pads, output_padding, output_shape;
  int64_t group = 1;

  ConvAttrs(const Node& node, bool transposed) {
    auto_pad = node.attr_string("auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
      bad_attr(node, "unknown auto_pad '" + auto_pad + "'");
    kernel_shape = node.attr_ints("kernel_shape");
    strides = node.attr_ints("strides");
    dilations = node.attr_ints("dilations");
    pads = node.attr_ints("pads");
    group = node.attr_int("group", 1);
    if (transposed) {
      output_padding = node.attr_ints("output_padding");
      output_shape = node.attr_ints("output_shape");
    }
    if (group < 1) bad_attr(node, "group must be positive");
    for (int64_t v : kernel_shape) if (v < 1) bad_attr(node, "kernel_shape " + shape_str(kernel_shape) + " has a non-positive size");
    for (int64_t v : strides) if (v < 1) bad_attr(node, "strides " + shape_str(strides) + " has a non-positive stride");
    for (int64_t v : dilations) if (v < 1) bad_attr(node, "dilations " + shape_str(dilations) + " has a non-positive dilation");
    for (int64_t v : pads) if (v < 0) bad_attr(node, "pads " + shape_str(pads) + " has a negative pad");
    for (int64_t v : output_padding) if (v < 0) bad_attr(node, "output_padding " + shape_str(output_padding) + " is negative");
    if (pads.size() % 2) bad_attr(node, "pads " + shape_str(pads) + " has an odd length");
    // Larger values cannot describe a real tensor and would overflow the size arithmetic.
    for (const Shape* v : {&kernel_shape, &strides, &dilations, &pads, &output_padding, &output_shape})
      for (int64_t x : *v)
        if (x > kMaxConvAttr) bad_attr(node, "attribute value " + std::to_string(x) + " is out of range");
  }
};

// Resolved sizes of one convolution. For ConvTranspose `in`/`out` are still the
// input/output spatial sizes; `pad` is the begin padding.
struct ConvGeom {
  int64_t n = 0, c = 0, m = 0, group = 1;
  Shape in, k, out, stride, dil, pad;
  int64_t in_size() const { return shape_numel(in); }
  int64_t out_size() const { return shape_numel(out); }
  int64_t k_size() const { return shape_numel(k); }
};

// Fills the common parts; `w_in_ch` is the weight dim that counts input channels per group.
ConvGeom common_geometry(const KernelContext& ctx, const ConvAttrs& a, const Shape& x, const Shape& w) {
  if (x.size() < 3 || w.size() != x.size())
    ctx.fail(ErrorCode::invalid_argument, "input " + shape_str(x) + " and weight " + shape_str(w) +
                                              " must both be N x C x spatial of one rank");
  const size_t nd = x.size() - 2;
  ConvGeom g;
  g.n = x[0];
  g.c = x[1];
  g.group = a.group;
  g.in.assign(x.begin() + 2, x.end());
  g.k.assign(w.begin() + 2, w.end());
  if (!a.kernel_shape.empty() && a.kernel_shape != g.k)
    ctx.fail(ErrorCode::invalid_argument, "kernel_shape " + shape_str(a.kernel_shape) + " disagrees with weight " + shape_str(w));
  auto per_dim = [&](const Shape& v, const char* name) {
    if (v.empty()) return Shape(nd, 1);
    if (v.size() != nd) ctx.fail(ErrorCode::invalid_argument, std::string(name) + " " + shape_str(v) + " does not have " + std::to_string(nd) + " values");
    return v;
  };
  g.stride = per_dim(a.strides, "strides");
  g.dil = per_dim(a.dilations, "dilations");
  if (!a.pads.empty() && a.pads.size() != 2 * nd)
    ctx.fail(ErrorCode::invalid_argument, "pads " + shape_str(a.pads) + " does not have " + std::to_string(2 * nd) + " values");
  return g;
}

ConvGeom conv_geometry(const KernelContext& ctx, const ConvAttrs& a, const Shape& x, const Shape& w) {
  ConvGeom g = common_geometry(ctx, a, x, w);
  const size_t nd = g.in.size();
  g.m = w[0];
  if (w[1] * a.group != g.c || g.m % a.group != 0)
    ctx.fail(ErrorCode::invalid_argument, "weight " + shape_str(w) + " does not fit input " + shape_str(x) +
                                              " with group " + std::to_string(a.group));
  g.pad.assign(nd, 0);
  g.out.assign(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t span = (g.k[d] - 1) * g.dil[d] + 1;
    int64_t pb = 0, pe = 0;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t o = (g.in[d] + g.stride[d] - 1) / g.stride[d];
      const int64_t total = std::max<int64_t>(0, (o - 1) * g.stride[d] + span - g.in[d]);
      pb = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (a.auto_pad == "NOTSET" && !a.pads.empty()) {
      pb = a.pads[d];
      pe = a.pads[d + nd];
    }
    const int64_t avail = g.in[d] + pb + pe - span;
    if (avail < 0)
      ctx.fail(ErrorCode::invalid_argument, "kernel " + shape_str(g.k) + " does not fit padded input " + shape_str(x));
    g.pad[d] = pb;
    g.out[d] = avail / g.stride[d] + 1;
  }
  return g;
}

ConvGeom conv_transpose_geometry(const KernelContext& ctx, const ConvAttrs& a, const Shape& x, const Shape& w) {
  ConvGeom g = common_geometry(ctx, a, x, w);
  const size_t nd = g.in.size();
  if (w[0] != g.c || g.c % a.group != 0)
    ctx.fail(ErrorCode::invalid_argument, "weight " + shape_str(w) + " does not fit input " + shape_str(x) +
                                              " with group " + std::to_string(a.group));
  g.m = w[1] * a.group;
  Shape out_pad = a.output_padding.empty() ? Shape(nd, 0) : a.output_padding;
  if (out_pad.size() != nd) ctx.fail(ErrorCode::invalid_argument, "output_padding " + shape_str(out_pad) + " does not have " + std::to_string(nd) + " values");
  Shape want = a.output_shape;
  if (want.size() == nd + 2) want.erase(want.begin(), want.begin() + 2);
  if (!want.empty() && want.size() != nd)
    ctx.fail(ErrorCode::invalid_argument, "output_shape " + shape_str(a.output_shape) + " does not have " + std::to_string(nd) + " values");
  g.pad.assign(nd, 0);
  g.out.assign(nd, 0);
  auto floor_half = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
  for (size_t d = 0; d < nd; ++d) {
    const int64_t span = (g.k[d] - 1) * g.dil[d] + 1;
    const int64_t full = g.stride[d] * (g.in[d] - 1) + out_pad[d] + span;
    const bool same = a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER";
    if (!want.empty() || same) {
      const int64_t o = !want.empty() ? want[d] : g.in[d] * g.stride[d];
      const int64_t total = full - o;
      // SAME_UPPER puts the smaller half of the padding first, everything else the larger.
      g.pad[d] = a.auto_pad == "SAME_UPPER" ? floor_half(total) : total - floor_half(total);
      g.out[d] = o;
    } else {
      const int64_t pb = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[d];
      const int64_t pe = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[d + nd];
      g.pad[d] = pb;
      g.out[d] = full - pb - pe;
    }
    if (g.out[d] < 0) ctx.fail(ErrorCode::invalid_argument, "output size of spatial dim " + std::to_string(d) + " is negative");
  }
  return g;
}

// Multi-indices of every kernel position, row-major.
std::vector<Shape> kernel_positions(const Shape& k) {
  std::vector<Shape> pos;
  Shape idx(k.size(), 0);
  const int64_t n = shape_numel(k);
  for (int64_t i = 0; i < n; ++i) {
    pos.push_back(idx);
    for (size_t d = k.size(); d-- > 0;) {
      if (++idx[d] < k[d]) break;
      idx[d] = 0;
    }
  }
  return pos;
}

// y[n, m, o...] = bias[m] + sum over c in m's group and kernel positions of x * w.
// Output positions are handled in blocks: for each block a table gives, per (position,
// kernel tap), the flat input index or -1 for padding; then one input channel plane at a
// time is swept, which keeps that plane in cache.
template <typename A>
void conv_direct(const ConvGeom& g, const A* x, const A* w, const A* bias, A* y) {
  const size_t nd = g.in.size();
  const int64_t in_sz = g.in_size(), out_sz = g.out_size(), k_sz = g.k_size();
  const int64_t cg = g.c / g.group, mg = g.m / g.group;
  const std::vector<Shape> kpos = kernel_positions(g.k);
  constexpr int64_t kBlock = 4096;
  std::vector<int64_t> in_at(size_t(std::min(kBlock, out_sz) * k_sz));
  Shape opos(nd, 0);
  for (int64_t o0 = 0; o0 < out_sz; o0 += kBlock) {
    const int64_t ob = std::min(kBlock, out_sz - o0);
    for (int64_t o = 0; o < ob; ++o) {
      for (int64_t kk = 0; kk < k_sz; ++kk) {
        int64_t flat = 0;
        for (size_t d = 0; d < nd; ++d) {
          const int64_t i = opos[d] * g.stride[d] - g.pad[d] + kpos[size_t(kk)][d] * g.dil[d];
          if (i < 0 || i >= g.in[d]) {
            flat = -1;
            break;
          }
          flat = flat * g.in[d] + i;
        }
        in_at[size_t(o * k_sz + kk)] = flat;
      }
      for (size_t d = nd; d-- > 0;) {
        if (++opos[d] < g.out[d]) break;
        opos[d] = 0;
      }
    }
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t oc = 0; oc < g.m; ++oc) {
        const int64_t grp = oc / mg;
        A* yb = y + (n * g.m + oc) * out_sz + o0;
        for (int64_t o = 0; o < ob; ++o) yb[o] = bias ? bias[oc] : A(0);
        for (int64_t ic = 0; ic < cg; ++ic) {
          const A* xb = x + (n * g.c + grp * cg + ic) * in_sz;
          const A* wb = w + (oc * cg + ic) * k_sz;
          for (int64_t o = 0; o < ob; ++o) {
            const int64_t* at = in_at.data() + o * k_sz;
            A acc = 0;
            for (int64_t kk = 0; kk < k_sz; ++kk)
              if (at[kk] >= 0) acc += xb[at[kk]] * wb[kk];
            yb[o] += acc;
          }
        }
      }
  }
}

// Scatters every input element through the kernel into the output (the adjoint of
// conv_direct); weights are laid out [C, M/group, k...].
template <typename A>
void conv_transposed(const ConvGeom& g, const A* x, const A* w, const A* bias, A* y) {
  const size_t nd = g.in.size();
  const int64_t in_sz = g.in_size(), out_sz = g.out_size(), k_sz = g.k_size();
  const int64_t cg = g.c / g.group, mg = g.m / g.group;
  const std::vector<Shape> kpos = kernel_positions(g.k);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oc = 0; oc < g.m; ++oc)
      for (int64_t o = 0; o < out_sz; ++o) y[(n * g.m + oc) * out_sz + o] = bias ? bias[oc] : A(0);
  Shape ipos(nd, 0);
  std::vector<int64_t> out_at(static_cast<size_t>(k_sz));
  for (int64_t i = 0; i < in_sz; ++i) {
    for (int64_t kk = 0; kk < k_sz; ++kk) {
      int64_t flat = 0;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t o = ipos[d] * g.stride[d] - g.pad[d] + kpos[size_t(kk)][d] * g.dil[d];
        if (o < 0 || o >= g.out[d]) {
          flat = -1;
          break;
        }
        flat = flat * g.out[d] + o;
      }
      out_at[size_t(kk)] = flat;
    }
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t ic = 0; ic < g.c; ++ic) {
        const int64_t grp = ic / cg;
        const A xv = x[(n * g.c + ic) * in_sz + i];
        for (int64_t mm = 0; mm < mg; ++mm) {
          const int64_t oc = grp * mg + mm;
          const A* wb = w + (ic * mg + mm) * k_sz;
          A* yb = y + (n * g.m + oc) * out_sz;
          for (int64_t kk = 0; kk < k_sz; ++kk)
            if (out_at[size_t(kk)] >= 0) yb[out_at[size_t(kk)]] += xv * wb[kk];
        }
      }
    for (size_t d = nd; d-- > 0;) {
      if (++ipos[d] < g.in[d]) break;
      ipos[d] = 0;
    }
  }
}

std::vector<double> bias_values(const KernelContext& ctx, int input, int64_t m) {
  const Tensor* b = ctx.input(input);
  if (!b) return {};
  if (b->numel() != m)
    ctx.fail(ErrorCode::invalid_argument, "bias " + b->describe() + " does not have " + std::to_string(m) + " values");
  return tensor_to_doubles(*b);
}

// ---------------------------------------------------------------- Conv / ConvTranspose

class Conv final : public OpKernel {
 public:
  Conv(const Node& node, bool transposed) : attrs_(node, transposed), transposed_(transposed) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& w = ctx.required_input(1);
    if (!dtype_is_float(x.dtype()) || w.dtype() != x.dtype())
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " and weight " + w.describe() +
                                                " must share one float dtype");
    const ConvGeom g = transposed_ ? conv_transpose_geometry(ctx, attrs_, x.shape(), w.shape())
                                   : conv_geometry(ctx, attrs_, x.shape(), w.shape());
    const std::vector<double> xv = tensor_to_doubles(x), wv = tensor_to_doubles(w);
    const std::vector<double> bv = bias_values(ctx, 2, g.m);
    Shape out_shape{g.n, g.m};
    out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
    check_output_shape(ctx, out_shape);
    std::vector<double> y(size_t(shape_numel(out_shape)));
    const double* b = bv.empty() ? nullptr : bv.data();
    if (transposed_) conv_transposed(g, xv.data(), wv.data(), b, y.data());
    else conv_direct(g, xv.data(), wv.data(), b, y.data());
    write_doubles(ctx.output(0, x.dtype(), out_shape), y);
  }

 private:
  ConvAttrs attrs_;
  bool transposed_;
};

// ---------------------------------------------------------------- ConvInteger / QLinearConv

bool is_8bit(DType t) { return t == DType::u8 || t == DType::i8; }

// Zero points: one value, or (for the weight) one per output channel.
std::vector<int64_t> zero_points(const KernelContext& ctx, int input, DType want, int64_t per_channel, const char* name) {
  const Tensor* z = ctx.input(input);
  if (!z) return {0};
  if (z->dtype() != want)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " " + z->describe() + " must have dtype " + std::string(dtype_name(want)));
  if (z->numel() != 1 && z->numel() != per_channel)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " " + z->describe() + " must hold 1 or " + std::to_string(per_channel) + " values");
  return tensor_to_int64s(*z);
}

std::vector<double> scales(const KernelContext& ctx, int input, int64_t per_channel, const char* name) {
  const Tensor& s = ctx.required_input(input);
  if (s.numel() != 1 && s.numel() != per_channel)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " " + s.describe() + " must hold 1 or " + std::to_string(per_channel) + " values");
  return tensor_to_doubles(s);
}

// The integer convolution both ops share: (x - x_zp) conv (w - w_zp[m]) in int64.
std::vector<int64_t> integer_conv(const KernelContext& ctx, const ConvAttrs& attrs, int x_in, int xz_in,
                                  int w_in, int wz_in, ConvGeom& g) {
  const Tensor& x = ctx.required_input(x_in);
  const Tensor& w = ctx.required_input(w_in);
  if (!is_8bit(x.dtype()) || !is_8bit(w.dtype()))
    ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " and weight " + w.describe() + " must be 8-bit integers");
  g = conv_geometry(ctx, attrs, x.shape(), w.shape());
  const std::vector<int64_t> xz = zero_points(ctx, xz_in, x.dtype(), 1, "x_zero_point");
  const std::vector<int64_t> wz = zero_points(ctx, wz_in, w.dtype(), g.m, "w_zero_point");
  std::vector<int64_t> xv = tensor_to_int64s(x), wv = tensor_to_int64s(w);
  for (auto& v : xv) v -= xz[0];
  const int64_t per_m = wv.size() / size_t(std::max<int64_t>(g.m, 1));
  for (size_t i = 0; i < wv.size(); ++i) wv[i] -= wz.size() == 1 ? wz[0] : wz[i / size_t(per_m)];
  std::vector<int64_t> y(size_t(g.n * g.m * g.out_size()));
  conv_direct<int64_t>(g, xv.data(), wv.data(), nullptr, y.data());
  return y;
}

class ConvInteger final : public OpKernel {
 public:
  ConvInteger(const Node& node, int64_t) : attrs_(node, false) {}
  void compute(KernelContext& ctx) const override {
    ConvGeom g;
    const std::vector<int64_t> y = integer_conv(ctx, attrs_, 0, 2, 1, 3, g);
    Shape out_shape{g.n, g.m};
    out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
    int32_t* o = ctx.output(0, DType::i32, out_shape).data<int32_t>();
    for (size_t i = 0; i < y.size(); ++i) o[i] = int32_t(y[i]);
  }

 private:
  ConvAttrs attrs_;
};

class QLinearConv final : public OpKernel {
 public:
  QLinearConv(const Node& node, int64_t) : attrs_(node, false) {}
  void compute(KernelContext& ctx) const override {
    ConvGeom g;
    std::vector<int64_t> acc = integer_conv(ctx, attrs_, 0, 2, 3, 5, g);
    const std::vector<double> xs = scales(ctx, 1, 1, "x_scale");
    const std::vector<double> ws = scales(ctx, 4, g.m, "w_scale");
    const std::vector<double> ys = scales(ctx, 6, 1, "y_scale");
    const Tensor* yz_t = ctx.input(7);
    const DType out_t = yz_t ? yz_t->dtype() : DType::u8;
    if (!is_8bit(out_t)) ctx.fail(ErrorCode::invalid_argument, "y_zero_point " + yz_t->describe() + " is not 8-bit");
    const int64_t yz = zero_points(ctx, 7, out_t, 1, "y_zero_point")[0];
    std::vector<int64_t> bias;
    if (const Tensor* b = ctx.input(8)) {
      if (b->dtype() != DType::i32 || b->numel() != g.m)
        ctx.fail(ErrorCode::invalid_argument, "bias " + b->describe() + " must be i32 with " + std::to_string(g.m) + " values");
      bias = tensor_to_int64s(*b);
    }
    Shape out_shape{g.n, g.m};
    out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
    Tensor& out = ctx.output(0, out_t, out_shape);
    const int64_t lo = out_t == DType::u8 ? 0 : -128, hi = out_t == DType::u8 ? 255 : 127;
    const int64_t out_sz = g.out_size();
    for (size_t i = 0; i < acc.size(); ++i) {
      const int64_t m = int64_t(i / size_t(out_sz)) % g.m;
      // Requantize in float, as the ONNX reference and ONNX Runtime do.
      const float mult = float(xs[0]) * float(ws.size() == 1 ? ws[0] : ws[size_t(m)]) / float(ys[0]);
      const int64_t a = acc[i] + (bias.empty() ? 0 : bias[size_t(m)]);
      const int64_t q = std::clamp<int64_t>(int64_t(std::nearbyint(float(a) * mult)) + yz, lo, hi);
      if (out_t == DType::u8) out.data<uint8_t>()[i] = uint8_t(q);
      else out.data<int8_t>()[i] = int8_t(q);
    }
  }

 private:
  ConvAttrs attrs_;
};

// The output of a convolution from its input shapes: what the kernels' geometry computes.
using OutputDType = DType (*)(const KernelBuildInfo&);
OutputInference conv_outputs(bool transposed, int weight_input, OutputDType dtype) {
  return [=](const KernelBuildInfo& info, const KernelContext& ctx) {
    const ConvAttrs attrs(info.node, transposed);
    const Shape& x = *info.input(0).shape;
    const Shape& w = *info.input(weight_input).shape;
    const ConvGeom g = transposed ? conv_transpose_geometry(ctx, attrs, x, w) : conv_geometry(ctx, attrs, x, w);
    Shape y{g.n, g.m};
    y.insert(y.end(), g.out.begin(), g.out.end());
    return std::vector<std::pair<DType, Shape>>{{dtype(info), y}};
  };
}

DType input_dtype(const KernelBuildInfo& info) { return *info.input(0).dtype; }
DType i32_dtype(const KernelBuildInfo&) { return DType::i32; }
// QLinearConv's output has its zero point's type, u8 without one.
DType qlinear_dtype(const KernelBuildInfo& info) { return info.has_input(7) ? *info.input(7).dtype : DType::u8; }

}  // namespace

void register_conv_kernels(KernelRegistry& r) {
  r.add(with_inferred_outputs({"Conv", "", 1, INT_MAX, [](const Node& n, int64_t) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Conv>(n, false);
         }, {}}, conv_outputs(false, 1, input_dtype)));
  r.add(with_inferred_outputs({"ConvTranspose", "", 1, INT_MAX, [](const Node& n, int64_t) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Conv>(n, true);
         }, {}}, conv_outputs(true, 1, input_dtype)));
  r.add(with_inferred_outputs({"ConvInteger", "", 10, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<ConvInteger>(n, o);
         }, {}}, conv_outputs(false, 1, i32_dtype)));
  r.add(with_inferred_outputs({"QLinearConv", "", 10, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<QLinearConv>(n, o);
         }, {}}, conv_outputs(false, 3, qlinear_dtype)));
}

}  // namespace slim::ref
