// Ref kernels of Resize (opsets 10-19) and the older Upsample. Each resized axis gets a
// list of (input index, weight) taps per output coordinate, built from the mode, the
// coordinate transformation and the nearest rounding rule (ResizeSpec, shared with the
// cpu provider); an output element is the weighted sum over the product of its axes'
// taps. This separable form is exactly the ONNX definition (interpolation axis by axis)
// and covers nearest, linear and cubic.
#include <cmath>
#include <limits>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"
#include "runtime/ref/resize_geometry.h"

namespace slim::ref {

namespace {

[[noreturn]] void bad_attr(const Node& node, const std::string& msg) {
  throw Error(ErrorCode::invalid_model, node.describe() + ": " + msg);
}

using Mode = ResizeSpec::Mode;
using Tap = ResizeTap;

}  // namespace

ResizeSpec::ResizeSpec(const Node& node, int64_t opset, bool upsample) : opset_(opset), upsample_(upsample) {
  const std::string mode = node.attr_string("mode", "nearest");
  if (mode == "nearest") mode_ = Mode::nearest;
  else if (mode == "linear" || (upsample && mode == "bilinear")) mode_ = Mode::linear;
  else if (mode == "cubic" && !upsample && opset >= 11) mode_ = Mode::cubic;
  else bad_attr(node, "unknown mode '" + mode + "'");
  if (upsample && opset < 9) {
    if (!node.has_attr("scales")) bad_attr(node, "attribute 'scales' is required");
    for (float s : node.attr_floats("scales")) {
      if (!(s >= 1.f)) bad_attr(node, "scales must be >= 1");
      attr_scales_.push_back(double(s));
    }
  }
  legacy_ = upsample || opset < 11;
  if (legacy_) {
    coord_ = Coord::asymmetric;
    nearest_ = Nearest::legacy;
    return;
  }
  const std::string ct = node.attr_string("coordinate_transformation_mode", "half_pixel");
  if (ct == "half_pixel") coord_ = Coord::half_pixel;
  else if (ct == "half_pixel_symmetric" && opset >= 19) coord_ = Coord::half_pixel_symmetric;
  else if (ct == "pytorch_half_pixel") coord_ = Coord::pytorch_half_pixel;
  else if (ct == "align_corners") coord_ = Coord::align_corners;
  else if (ct == "asymmetric") coord_ = Coord::asymmetric;
  else if (ct == "tf_half_pixel_for_nn" && opset < 13) coord_ = Coord::tf_half_pixel_for_nn;
  else if (ct == "tf_crop_and_resize") coord_ = Coord::tf_crop_and_resize;
  else bad_attr(node, "unknown coordinate_transformation_mode '" + ct + "'");
  const std::string nm = node.attr_string("nearest_mode", "round_prefer_floor");
  if (nm == "round_prefer_floor") nearest_ = Nearest::round_prefer_floor;
  else if (nm == "round_prefer_ceil") nearest_ = Nearest::round_prefer_ceil;
  else if (nm == "floor") nearest_ = Nearest::floor;
  else if (nm == "ceil") nearest_ = Nearest::ceil;
  else bad_attr(node, "unknown nearest_mode '" + nm + "'");
  cubic_a_ = node.attr_float("cubic_coeff_a", -0.75f);
  exclude_outside_ = node.attr_int("exclude_outside", 0) != 0;
  extrapolation_ = node.attr_float("extrapolation_value", 0.f);
  if (opset >= 18) {
    axes_ = node.attr_ints("axes");
    antialias_ = node.attr_int("antialias", 0) != 0;
    const std::string kp = node.attr_string("keep_aspect_ratio_policy", "stretch");
    if (kp == "stretch") policy_ = AspectPolicy::stretch;
    else if (kp == "not_larger") policy_ = AspectPolicy::not_larger;
    else if (kp == "not_smaller") policy_ = AspectPolicy::not_smaller;
    else bad_attr(node, "unknown keep_aspect_ratio_policy '" + kp + "'");
  }
}

ResizeGeometry ResizeSpec::geometry(const Shape& in, const std::function<const Tensor*(int)>& input) const {
  auto fail = [](ErrorCode code, const std::string& msg) { throw Error(code, msg); };
  const int r = int(in.size());
  // Which axes the scales/sizes/roi inputs talk about.
  std::vector<int> axes;
  if (axes_.empty()) {
    for (int d = 0; d < r; ++d) axes.push_back(d);
  } else {
    std::vector<bool> seen(size_t(r), false);
    for (int64_t a : axes_) {
      if (r == 0) fail(ErrorCode::invalid_argument, "axes given for a scalar");
      const int64_t d = a < 0 ? a + r : a;
      if (d < 0 || d >= r)
        fail(ErrorCode::invalid_model, "axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
      if (seen[size_t(d)]) fail(ErrorCode::invalid_argument, "axes repeat axis " + std::to_string(d));
      seen[size_t(d)] = true;
      axes.push_back(int(d));
    }
  }
  const size_t na = axes.size();
  std::vector<double> scales_in, roi_in;
  std::vector<int64_t> sizes_in;
  if (scales_input() < 0) {
    scales_in = attr_scales_;
  } else if (legacy_) {
    const Tensor* t = input(1);
    if (!t) fail(ErrorCode::invalid_model, "input 1 (scales) is missing");
    scales_in = tensor_to_doubles(*t);
  } else {
    if (const Tensor* t = input(1)) roi_in = tensor_to_doubles(*t);
    if (const Tensor* t = input(2)) scales_in = tensor_to_doubles(*t);
    if (const Tensor* t = input(3)) sizes_in = tensor_to_int64s(*t);
  }
  if (scales_in.empty() == sizes_in.empty())
    fail(ErrorCode::invalid_argument, "exactly one of scales and sizes must be given");
  if (!scales_in.empty() && scales_in.size() != na)
    fail(ErrorCode::invalid_argument, "scales has " + std::to_string(scales_in.size()) + " values for " +
                                          std::to_string(na) + " axes of " + shape_str(in));
  if (!sizes_in.empty() && sizes_in.size() != na)
    fail(ErrorCode::invalid_argument, "sizes has " + std::to_string(sizes_in.size()) + " values for " +
                                          std::to_string(na) + " axes of " + shape_str(in));

  std::vector<double> scale(size_t(r), 1.0), roi_start(size_t(r), 0.0), roi_end(size_t(r), 1.0);
  ResizeGeometry g;
  g.out = in;
  Shape& out_shape = g.out;
  if (coord_ == Coord::tf_crop_and_resize) {
    if (roi_in.size() != 2 * na)
      fail(ErrorCode::invalid_argument,
           "roi has " + std::to_string(roi_in.size()) + " values, needs " + std::to_string(2 * na));
    for (size_t i = 0; i < na; ++i) {
      roi_start[size_t(axes[i])] = roi_in[i];
      roi_end[size_t(axes[i])] = roi_in[i + na];
    }
  }
  if (!scales_in.empty()) {
    for (size_t i = 0; i < na; ++i) {
      const double s = scales_in[i];
      if (!(s > 0) || !std::isfinite(s))
        fail(ErrorCode::invalid_argument, "scale " + std::to_string(s) + " is not positive");
      const int d = axes[i];
      scale[size_t(d)] = s;
      double len = double(in[size_t(d)]) * s;
      if (coord_ == Coord::tf_crop_and_resize) len *= roi_end[size_t(d)] - roi_start[size_t(d)];
      if (len > 1e12)
        fail(ErrorCode::resource_exhausted, "scale " + std::to_string(s) + " makes the output too large");
      out_shape[size_t(d)] = int64_t(std::floor(len));
    }
  } else {
    for (int64_t s : sizes_in)
      if (s < 0) fail(ErrorCode::invalid_argument, "sizes " + shape_str(sizes_in) + " has a negative size");
    if (policy_ == AspectPolicy::stretch) {
      for (size_t i = 0; i < na; ++i) {
        const int d = axes[i];
        out_shape[size_t(d)] = sizes_in[i];
        scale[size_t(d)] = in[size_t(d)] ? double(sizes_in[i]) / double(in[size_t(d)]) : 1.0;
      }
    } else {
      // One scale for all axes, the largest (smallest) that keeps every size within (beyond) the request.
      double s = policy_ == AspectPolicy::not_larger ? INFINITY : 0.0;
      for (size_t i = 0; i < na; ++i) {
        const double len = double(in[size_t(axes[i])]);
        if (len == 0) continue;
        const double v = double(sizes_in[i]) / len;
        s = policy_ == AspectPolicy::not_larger ? std::min(s, v) : std::max(s, v);
      }
      if (!std::isfinite(s) || s <= 0)
        fail(ErrorCode::invalid_argument, "sizes " + shape_str(sizes_in) + " give no usable scale");
      for (size_t i = 0; i < na; ++i) {
        const int d = axes[i];
        scale[size_t(d)] = s;
        out_shape[size_t(d)] = int64_t(std::round(s * double(in[size_t(d)])));
      }
    }
  }
  int64_t acc = 1;
  for (int64_t d : out_shape)
    if (d < 0 || __builtin_mul_overflow(acc, std::max<int64_t>(d, 1), &acc))
      fail(ErrorCode::invalid_argument, "output shape " + shape_str(out_shape) + " is not a valid tensor shape");
  for (int d = 0; d < r; ++d)
    g.axes.push_back(axis_taps(in[size_t(d)], out_shape[size_t(d)], scale[size_t(d)], roi_start[size_t(d)],
                               roi_end[size_t(d)]));
  g.scale = scale;
  g.from_sizes = !sizes_in.empty();
  g.aspect_kept = g.from_sizes && policy_ != AspectPolicy::stretch;
  return g;
}

// The input coordinate that output coordinate `o` maps to.
double ResizeSpec::source_coord(int64_t o, int64_t in_len, int64_t out_len, double scale, double roi0,
                                double roi1) const {
  // The ONNX definition measures the resized length as scale * input length, which
  // differs from the integer output length when the scale does not divide evenly.
  const double out_w = scale * double(in_len);
  const double x = double(o);
  switch (coord_) {
    case Coord::half_pixel: return (x + 0.5) / scale - 0.5;
    case Coord::half_pixel_symmetric: {
      const double adjustment = double(out_len) / out_w;
      const double center = double(in_len) / 2;
      const double offset = center * (1 - adjustment);
      return offset + (x + 0.5) / scale - 0.5;
    }
    case Coord::pytorch_half_pixel: return out_len > 1 ? (x + 0.5) / scale - 0.5 : -0.5;
    case Coord::align_corners: return out_w == 1 ? 0.0 : x * double(in_len - 1) / (out_w - 1);
    case Coord::asymmetric: return x / scale;
    case Coord::tf_half_pixel_for_nn: return (x + 0.5) / scale;
    case Coord::tf_crop_and_resize: {
      const double span = double(in_len - 1);
      const double v = out_len > 1 ? roi0 * span + x * (roi1 - roi0) * span / double(out_len - 1)
                                   : 0.5 * (roi0 + roi1) * span;
      return v;
    }
  }
  return x;
}

double ResizeSpec::cubic(double t) const {
  const double a = cubic_a_;
  t = std::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

// Downscaling with antialias stretches the interpolation filter by 1 / scale, so each
// output averages every input its footprint covers; weights are normalized to sum 1.
void ResizeSpec::antialias_taps(double xo, int64_t in_len, double scale, std::vector<Tap>& taps) const {
  const double s = std::min(scale, 1.0);
  const double support = (mode_ == Mode::linear ? 1.0 : 2.0) / s;
  const int64_t lo = int64_t(std::floor(xo - support)), hi = int64_t(std::ceil(xo + support));
  double sum = 0;
  for (int64_t i = lo; i <= hi; ++i) {
    const double t = std::fabs(double(i) - xo) * s;
    double w = mode_ == Mode::linear ? std::max(0.0, 1.0 - t) : cubic(t);
    if (exclude_outside_ && (i < 0 || i >= in_len)) w = 0;
    if (w == 0) continue;
    taps.push_back({std::clamp<int64_t>(i, 0, in_len - 1), w});
    sum += w;
  }
  if (sum != 0)
    for (auto& t : taps) t.weight /= sum;
  if (taps.empty()) taps.push_back({std::clamp<int64_t>(int64_t(std::floor(xo)), 0, in_len - 1), 0.0});
}

ResizeAxis ResizeSpec::axis_taps(int64_t in_len, int64_t out_len, double scale, double roi0, double roi1) const {
  ResizeAxis a;
  a.taps.resize(size_t(out_len));
  a.outside.assign(size_t(out_len), false);
  auto clamp_index = [in_len](int64_t i) { return std::clamp<int64_t>(i, 0, in_len - 1); };
  for (int64_t o = 0; o < out_len; ++o) {
    auto& taps = a.taps[size_t(o)];
    // Untouched axes map straight through, whatever the mode.
    if (out_len == in_len && scale == 1.0 && coord_ != Coord::tf_crop_and_resize) {
      taps.push_back({o, 1.0});
      continue;
    }
    const double xo = source_coord(o, in_len, out_len, scale, roi0, roi1);
    if (coord_ == Coord::tf_crop_and_resize && (xo < 0 || xo > double(in_len - 1))) {
      a.outside[size_t(o)] = true;
      taps.push_back({0, 0.0});
      continue;
    }
    if (antialias_ && mode_ != Mode::nearest) {
      antialias_taps(xo, in_len, scale, taps);
      continue;
    }
    const double fl = std::floor(xo);
    const double frac = xo - fl;
    const int64_t base = int64_t(fl);
    if (mode_ == Mode::nearest) {
      int64_t i = base;
      if (frac == 0) {
        i = base;
      } else {
        switch (nearest_) {
          case Nearest::round_prefer_floor: i = frac <= 0.5 ? base : base + 1; break;
          case Nearest::round_prefer_ceil: i = frac < 0.5 ? base : base + 1; break;
          case Nearest::floor: i = base; break;
          case Nearest::ceil: i = base + 1; break;
          case Nearest::legacy: i = scale < 1 ? base + 1 : base; break;
        }
      }
      taps.push_back({clamp_index(i), 1.0});
    } else if (mode_ == Mode::linear) {
      taps.push_back({clamp_index(base), 1 - frac});
      if (frac != 0) taps.push_back({clamp_index(base + 1), frac});
    } else {
      double sum = 0;
      for (int64_t j = -1; j <= 2; ++j) {
        const int64_t i = base + j;
        double w = cubic(double(j) - frac);
        if (exclude_outside_ && (i < 0 || i >= in_len)) w = 0;
        if (w == 0) continue;
        taps.push_back({clamp_index(i), w});
        sum += w;
      }
      if (exclude_outside_ && sum != 0)
        for (auto& t : taps) t.weight /= sum;
      if (taps.empty()) taps.push_back({clamp_index(base), 0.0});
    }
  }
  return a;
}

namespace {

class Resize final : public OpKernel {
 public:
  Resize(const Node& node, int64_t opset, bool upsample) : spec_(node, opset, upsample) {}

  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int r = x.rank();
    ResizeGeometry g;
    try {
      g = spec_.geometry(x.shape(), [&](int i) { return ctx.input(i); });
    } catch (const Error& e) {
      ctx.fail(e.code(), e.what());
    }
    const Shape& out_shape = g.out;
    const std::vector<ResizeAxis>& plan = g.axes;
    Tensor& out = ctx.output(0, x.dtype(), out_shape);
    if (out.numel() == 0) return;
    if (x.numel() == 0) ctx.fail(ErrorCode::invalid_argument, "cannot resize empty input " + x.describe() + " to " + shape_str(out_shape));
    const std::vector<double> xv = tensor_to_doubles(x);
    const Shape in_strides = contiguous_strides(x.shape());
    std::vector<double> y(size_t(out.numel()));
    std::vector<int64_t> opos(size_t(r), 0);
    std::vector<size_t> tap(size_t(r), 0);
    for (size_t k = 0; k < y.size(); ++k) {
      bool outside = false;
      for (int d = 0; d < r; ++d) outside = outside || plan[size_t(d)].outside[size_t(opos[size_t(d)])];
      if (outside) {
        y[k] = spec_.extrapolation();
      } else {
        // Sum over the product of this element's per-axis taps.
        double acc = 0;
        std::fill(tap.begin(), tap.end(), 0);
        while (true) {
          double w = 1;
          int64_t off = 0;
          for (int d = 0; d < r; ++d) {
            const Tap& t = plan[size_t(d)].taps[size_t(opos[size_t(d)])][tap[size_t(d)]];
            w *= t.weight;
            off += t.index * in_strides[size_t(d)];
          }
          acc += w * xv[size_t(off)];
          int d = r - 1;
          for (; d >= 0; --d) {
            if (++tap[size_t(d)] < plan[size_t(d)].taps[size_t(opos[size_t(d)])].size()) break;
            tap[size_t(d)] = 0;
          }
          if (d < 0) break;
        }
        y[k] = acc;
      }
      for (int d = r - 1; d >= 0; --d) {
        if (++opos[size_t(d)] < out_shape[size_t(d)]) break;
        opos[size_t(d)] = 0;
      }
    }
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* o = static_cast<T*>(out.raw_data());
      for (size_t i = 0; i < y.size(); ++i) {
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) o[i] = T(float(y[i]));
        else if constexpr (std::is_floating_point_v<T>) o[i] = T(y[i]);
        else if constexpr (std::is_same_v<T, bool>) o[i] = y[i] != 0;
        else o[i] = T(std::clamp(std::nearbyint(y[i]), double(std::numeric_limits<T>::lowest()), double(std::numeric_limits<T>::max())));
      }
    });
  }

 private:
  ResizeSpec spec_;
};

// ---------------------------------------------------------------- GridSample

// GridSample samples X at the normalized coordinates of `grid` (the last grid dim lists
// them innermost spatial axis first: x, then y, ...). The semantics follow PyTorch's
// grid_sample, which the ONNX definition was written from: padding clips or reflects
// the coordinate (linear, nearest) or each cubic tap, and taps outside stay 0.
class GridSample final : public OpKernel {
 public:
  GridSample(const Node& node, int64_t opset) {
    align_corners_ = node.attr_int("align_corners", 0) != 0;
    const std::string mode = node.attr_string("mode", opset >= 20 ? "linear" : "bilinear");
    if (mode == (opset >= 20 ? "linear" : "bilinear")) mode_ = Mode::linear;
    else if (mode == "nearest") mode_ = Mode::nearest;
    else if (mode == (opset >= 20 ? "cubic" : "bicubic")) mode_ = Mode::cubic;
    else bad_attr(node, "unknown mode '" + mode + "'");
    padding_ = node.attr_string("padding_mode", "zeros");
    if (padding_ != "zeros" && padding_ != "border" && padding_ != "reflection")
      bad_attr(node, "unknown padding_mode '" + padding_ + "'");
    max_rank_ = opset >= 20 ? INT_MAX : 4;
  }

  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const Tensor& grid = ctx.required_input(1);
    const int r = x.rank() - 2;
    if (r < 1 || x.rank() > max_rank_ || grid.rank() != x.rank() || grid.dim(0) != x.dim(0) || grid.dim(-1) != r)
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " and grid " + grid.describe() +
                                                " must be [N,C,spatial...] and [N,out spatial...," + std::to_string(r) + "]");
    if (!dtype_is_float(x.dtype()) || !dtype_is_float(grid.dtype()))
      ctx.fail(ErrorCode::invalid_argument, "input and grid must be float tensors");
    const int64_t n = x.dim(0), c = x.dim(1);
    const Shape in_sp(x.shape().begin() + 2, x.shape().end());
    const Shape out_sp(grid.shape().begin() + 1, grid.shape().end() - 1);
    Shape out_shape{n, c};
    out_shape.insert(out_shape.end(), out_sp.begin(), out_sp.end());
    Tensor& out = ctx.output(0, x.dtype(), out_shape);
    const std::vector<double> xv = tensor_to_doubles(x), gv = tensor_to_doubles(grid);
    const int64_t in_size = shape_numel(in_sp), out_size = shape_numel(out_sp);
    const Shape in_strides = contiguous_strides(in_sp);
    std::vector<double> y(size_t(out.numel()));
    std::vector<std::vector<Tap>> taps(static_cast<size_t>(r));
    std::vector<size_t> pick(static_cast<size_t>(r));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t o = 0; o < out_size; ++o) {
        const double* g = gv.data() + (b * out_size + o) * r;
        // Spatial axis d (outermost first) takes grid component r - 1 - d.
        for (int d = 0; d < r; ++d) taps[size_t(d)] = axis_taps(g[r - 1 - d], in_sp[size_t(d)]);
        for (int64_t ch = 0; ch < c; ++ch) {
          const double* plane = xv.data() + (b * c + ch) * in_size;
          double acc = 0;
          std::fill(pick.begin(), pick.end(), 0);
          while (true) {
            double w = 1;
            int64_t off = 0;
            bool inside = true;
            for (int d = 0; d < r; ++d) {
              const Tap& t = taps[size_t(d)][pick[size_t(d)]];
              w *= t.weight;
              if (t.index < 0) inside = false;
              else off += t.index * in_strides[size_t(d)];
            }
            if (inside) acc += w * plane[off];
            int d = r - 1;
            for (; d >= 0; --d) {
              if (++pick[size_t(d)] < taps[size_t(d)].size()) break;
              pick[size_t(d)] = 0;
            }
            if (d < 0) break;
          }
          y[size_t((b * c + ch) * out_size + o)] = acc;
        }
      }
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = static_cast<T*>(out.raw_data());
      for (size_t i = 0; i < y.size(); ++i) {
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) p[i] = T(float(y[i]));
        else p[i] = static_cast<T>(y[i]);
      }
    });
  }

 private:
  // Reflects a coordinate into [lo, hi] (PyTorch's reflect_coordinates, bounds halved).
  static double reflect(double v, double lo, double hi) {
    if (lo == hi) return 0;
    const double span = hi - lo;
    v = std::fabs(v - lo);
    const double extra = std::fmod(v, span);
    const int64_t flips = int64_t(std::floor(v / span));
    return flips % 2 == 0 ? lo + extra : hi - extra;
  }

  // A coordinate after padding: clipped (border) or reflected then clipped (reflection).
  double padded(double v, int64_t size) const {
    if (padding_ == "border") return std::clamp(v, 0.0, double(size - 1));
    if (padding_ == "reflection") {
      v = align_corners_ ? reflect(v, 0, double(size - 1)) : reflect(v, -0.5, double(size) - 0.5);
      return std::clamp(v, 0.0, double(size - 1));
    }
    return v;
  }

  // Index of a tap, or -1 when it lies outside the input (it then contributes 0).
  static int64_t inside(int64_t i, int64_t size) { return i >= 0 && i < size ? i : -1; }

  std::vector<Tap> axis_taps(double gn, int64_t size) const {
    if (!std::isfinite(gn)) return {{-1, 0.0}};
    // Unnormalize [-1, 1] to pixel coordinates.
    const double v = align_corners_ ? (gn + 1) / 2 * double(size - 1) : ((gn + 1) * double(size) - 1) / 2;
    std::vector<Tap> taps;
    if (mode_ == Mode::nearest) {
      taps.push_back({inside(int64_t(std::nearbyint(padded(v, size))), size), 1.0});
    } else if (mode_ == Mode::linear) {
      const double p = padded(v, size);
      const double f = std::floor(p);
      taps.push_back({inside(int64_t(f), size), 1 - (p - f)});
      taps.push_back({inside(int64_t(f) + 1, size), p - f});
    } else {
      // Cubic taps pad each index rather than the coordinate.
      const double f = std::floor(v), t = v - f;
      for (int64_t j = -1; j <= 2; ++j) {
        const double at = std::fabs(double(j) - t);
        const double w = at <= 1 ? ((kA + 2) * at - (kA + 3)) * at * at + 1
                                 : ((kA * at - 5 * kA) * at + 8 * kA) * at - 4 * kA;
        taps.push_back({inside(int64_t(padded(f + double(j), size)), size), w});
      }
    }
    return taps;
  }

  static constexpr double kA = -0.75;  // PyTorch's bicubic coefficient
  bool align_corners_ = false;
  Mode mode_ = Mode::linear;
  std::string padding_;
  int max_rank_ = 4;
};

}  // namespace

void register_resize_kernels(KernelRegistry& r) {
  r.add({"GridSample", "", 16, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<GridSample>(n, o);
         }, {}});
  r.add({"Resize", "", 10, 10, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Resize>(n, o, false);
         }, {1}});
  r.add({"Resize", "", 11, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Resize>(n, o, false);
         }, {1, 2, 3}});
  r.add({"Upsample", "", 7, 8, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Resize>(n, o, true);
         }, {}});
  r.add({"Upsample", "", 9, 10, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<Resize>(n, o, true);
         }, {1}});
}

}  // namespace slim::ref
