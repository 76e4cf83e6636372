#include "slim/quant/calibrators.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slim/core/error.h"

namespace slim::quant {

namespace {

constexpr int kMseCandidates = 256;
// Entropy thresholds that clip more than this share of the values are not candidates.
constexpr double kEntropyMaxClipped = 0.01;

struct QRange {
  int qmin, qmax;
};

QRange qrange(const ActivationType& t) {
  if (t.dtype == DType::u8) return {0, 255};
  check(t.dtype == DType::i8, ErrorCode::invalid_argument,
        "activations quantize to u8 or i8, not " + std::string(dtype_name(t.dtype)));
  return t.symmetric ? QRange{-127, 127} : QRange{-128, 127};
}

// Index of the last non-empty bin, plus one.
int used_bins(const std::vector<double>& counts) {
  int n = int(counts.size());
  while (n > 0 && counts[size_t(n - 1)] == 0) --n;
  return n;
}

// MXNet's smoothing before the divergence: empty bins get eps, the others lose as much
// in total. Returns false when every bin is empty.
bool smooth(std::vector<double>& p) {
  const double eps = 1e-4;
  size_t zeros = 0;
  for (double v : p) zeros += v == 0;
  if (zeros == p.size()) return false;
  const double eps1 = eps * double(zeros) / double(p.size() - zeros);
  for (double& v : p) v += v == 0 ? eps : -eps1;
  return true;
}

// KL(p || q) of the normalized distributions (scipy.stats.entropy).
double divergence(const std::vector<double>& p, const std::vector<double>& q) {
  double sp = 0, sq = 0;
  for (size_t i = 0; i < p.size(); ++i) sp += p[i], sq += q[i];
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) kl += p[i] / sp * std::log((p[i] / sp) / (q[i] / sq));
  return kl;
}

Range clip_to(const TensorStats& s, double t) {
  const double absmax = std::max(std::fabs(s.min), std::fabs(s.max));
  t = std::min(t, absmax);
  return {std::max(s.min, -t), std::min(s.max, t)};
}

}  // namespace

CalibrationMethod parse_calibration_method(const std::string& name) {
  if (name == "minmax") return CalibrationMethod::minmax;
  if (name == "percentile") return CalibrationMethod::percentile;
  if (name == "entropy") return CalibrationMethod::entropy;
  if (name == "mse") return CalibrationMethod::mse;
  throw Error(ErrorCode::invalid_argument,
              "unknown calibrator '" + name + "' (minmax, percentile, entropy, mse)");
}

const char* calibration_method_name(CalibrationMethod m) {
  switch (m) {
    case CalibrationMethod::minmax:
      return "minmax";
    case CalibrationMethod::percentile:
      return "percentile";
    case CalibrationMethod::entropy:
      return "entropy";
    case CalibrationMethod::mse:
      return "mse";
  }
  return "?";
}

QuantParams quantization_params(Range r, const ActivationType& type) {
  const QRange q = qrange(type);
  float lo = std::min(float(r.lo), 0.0f), hi = std::max(float(r.hi), 0.0f);
  if (type.symmetric) {
    const float a = std::max(std::fabs(lo), std::fabs(hi));
    lo = -a;
    hi = a;
  }
  const float scale = (hi - lo) / float(q.qmax - q.qmin);
  if (!(scale >= std::numeric_limits<float>::min())) return {1.0f, 0};
  return {scale, int32_t(std::nearbyint(float(q.qmin) - lo / scale))};
}

float fake_quantize(float x, QuantParams p, const ActivationType& type) {
  const QRange q = qrange(type);
  const float v = std::nearbyint(x / p.scale) + float(p.zero_point);
  return (std::clamp(v, float(q.qmin), float(q.qmax)) - float(p.zero_point)) * p.scale;
}

int entropy_threshold_bins(const std::vector<double>& abs_counts, int levels) {
  const int n = used_bins(abs_counts);
  if (n <= levels) return n;
  double best = std::numeric_limits<double>::infinity();
  int best_i = n;
  double outliers = 0, total = 0;
  for (int k = 0; k < n; ++k) total += abs_counts[size_t(k)];
  for (int k = levels; k < n; ++k) outliers += abs_counts[size_t(k)];
  std::vector<double> p, q;
  for (int i = levels; i <= n; ++i) {
    if (i > levels) outliers -= abs_counts[size_t(i - 1)];
    // The search folds the clipped values into the last bin of both distributions, so a
    // threshold below most of the data (values far from 0: a variance) looks perfect.
    if (outliers > kEntropyMaxClipped * total) continue;
    p.assign(abs_counts.begin(), abs_counts.begin() + i);
    p[size_t(i - 1)] += outliers;
    // The first i bins merged into `levels` levels (the last takes the remainder), each
    // spread evenly over its non-empty bins.
    const int merged = i / levels;
    q.assign(size_t(i), 0.0);
    for (int j = 0; j < levels; ++j) {
      const int start = j * merged, stop = j == levels - 1 ? i : start + merged;
      double sum = 0;
      int nonzero = 0;
      for (int k = start; k < stop; ++k) {
        sum += abs_counts[size_t(k)];
        nonzero += p[size_t(k)] != 0;
      }
      if (nonzero)
        for (int k = start; k < stop; ++k) q[size_t(k)] = p[size_t(k)] != 0 ? sum / nonzero : 0.0;
    }
    smooth(p);
    const double kl = smooth(q) ? divergence(p, q) : std::numeric_limits<double>::infinity();
    if (kl < best) {
      best = kl;
      best_i = i;
    }
  }
  return best_i;
}

Range calibrate(const TensorStats& s, const CalibratorOptions& o, const ActivationType& type) {
  if (s.count == 0) return {0, 0};
  const double w = s.hist.bin_width();
  switch (o.method) {
    case CalibrationMethod::minmax:
      return {s.min, s.max};
    case CalibrationMethod::percentile: {
      const std::vector<double> a = s.hist.abs_counts();
      const double target = o.percentile / 100.0 * double(s.count);
      double cum = 0;
      size_t j = 0;
      for (; j + 1 < a.size(); ++j) {
        cum += a[j];
        if (cum >= target) break;
      }
      return clip_to(s, double(j + 1) * w);
    }
    case CalibrationMethod::entropy: {
      // int8 and asymmetric ranges over both signs have 128 levels a side; a u8 range
      // of non-negative values uses all 256 for |x|.
      const int levels = (!type.symmetric && s.min >= 0) ? 256 : 128;
      return clip_to(s, entropy_threshold_bins(s.hist.abs_counts(), levels) * w);
    }
    case CalibrationMethod::mse: {
      const std::vector<double>& c = s.hist.counts();
      const int half = s.hist.half_bins();
      std::vector<std::pair<float, double>> bins;  // centre, count
      for (size_t k = 0; k < c.size(); ++k)
        if (c[k] > 0) bins.emplace_back(float((double(k) - half + 0.5) * w), c[k]);
      const double absmax = std::max(std::fabs(s.min), std::fabs(s.max));
      double best = std::numeric_limits<double>::infinity(), best_t = absmax;
      for (int m = 1; m <= kMseCandidates; ++m) {
        const double t = absmax * m / kMseCandidates;
        const QuantParams p = quantization_params(clip_to(s, t), type);
        double err = 0;
        for (const auto& [x, n] : bins) {
          const double d = double(x) - double(fake_quantize(x, p, type));
          err += n * d * d;
        }
        if (err < best) {
          best = err;
          best_t = t;
        }
      }
      return clip_to(s, best_t);
    }
  }
  return {s.min, s.max};
}

namespace {

// A weight viewed as [outer, channels, inner] around the quantization axis.
struct ChannelView {
  int64_t outer = 1, channels = 1, inner = 1;
  ChannelView(const Shape& shape, int axis, int64_t numel) : inner(numel) {
    if (axis < 0) return;
    for (int d = 0; d < axis; ++d) outer *= shape[size_t(d)];
    channels = shape[size_t(axis)];
    inner = channels ? numel / outer / channels : 0;
  }
};

void round_channel(const float* x, int8_t* out, const ChannelView& v, int64_t c, float s,
                   int qmax) {
  const float hi = float(qmax);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      const int64_t k = (o * v.channels + c) * v.inner + i;
      out[k] = int8_t(std::clamp(std::nearbyint(x[k] / s), -hi, hi));
    }
}

}  // namespace

QuantizedWeight quantize_weight(const Tensor& w, int axis, int qmax) {
  check(w.dtype() == DType::f32, ErrorCode::invalid_argument,
        "quantize_weight: " + w.describe() + " is not f32");
  check(axis < w.rank(), ErrorCode::invalid_argument,
        "quantize_weight: axis " + std::to_string(axis) + " of " + w.describe());
  check(qmax >= 1 && qmax <= 127, ErrorCode::invalid_argument,
        "quantize_weight: qmax " + std::to_string(qmax) + " is not in [1, 127]");
  const Tensor src = w.contiguous();
  const float* x = src.data<float>();
  const ChannelView v(w.shape(), axis, w.numel());
  QuantizedWeight q;
  q.axis = axis;
  q.qmax = qmax;
  q.values = Tensor(DType::i8, w.shape());
  q.scales.assign(size_t(v.channels), 1.0f);
  for (int64_t c = 0; c < v.channels; ++c) {
    float absmax = 0;
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t i = 0; i < v.inner; ++i)
        absmax = std::max(absmax, std::fabs(x[(o * v.channels + c) * v.inner + i]));
    const float scale = (absmax - -absmax) / float(2 * qmax);
    q.scales[size_t(c)] = scale >= std::numeric_limits<float>::min() ? scale : 1.0f;
    round_channel(x, q.values.data<int8_t>(), v, c, q.scales[size_t(c)], qmax);
  }
  return q;
}

void widen_weight_scale(const Tensor& w, QuantizedWeight& q, int64_t c, float scale) {
  if (!(scale > q.scales[size_t(c)])) return;
  q.scales[size_t(c)] = scale;
  const Tensor src = w.contiguous();
  round_channel(src.data<float>(), q.values.data<int8_t>(),
                ChannelView(w.shape(), q.axis, w.numel()), c, scale, q.qmax);
}

Tensor dequantize_weight(const QuantizedWeight& q) {
  Tensor out(DType::f32, q.values.shape());
  const int8_t* v = q.values.data<int8_t>();
  float* o = out.data<float>();
  const int64_t n = out.numel();
  int64_t channels = int64_t(q.scales.size()), inner = n, outer = 1;
  if (q.axis >= 0) {
    for (int d = 0; d < q.axis; ++d) outer *= q.values.shape()[size_t(d)];
    inner = channels ? n / outer / channels : 0;
  }
  for (int64_t ob = 0; ob < outer; ++ob)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (ob * channels + c) * inner + i;
        o[k] = float(v[k]) * q.scales[size_t(c)];
      }
  return out;
}

}  // namespace slim::quant
