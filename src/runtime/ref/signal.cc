// Ref kernels for signal processing: DFT (17, axis as an input from 20), STFT (17), the
// cosine windows HannWindow, HammingWindow, BlackmanWindow (17) and MelWeightMatrix (17).
// Transforms run in double through FftPlan (fft.h), O(n log n) for every length.
#include <cmath>

#include "runtime/ref/fft.h"
#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

using cd = std::complex<double>;

template <typename K>
KernelFactory factory() {
  return [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> { return std::make_unique<K>(node, opset); };
}

bool bool_attr(const Node& node, const char* name, int64_t def) {
  const int64_t v = node.attr_int(name, def);
  if (v != 0 && v != 1)
    throw Error(ErrorCode::invalid_model, node.describe() + ": attribute '" + name + "' must be 0 or 1, got " + std::to_string(v));
  return v == 1;
}

// The output dtype an `output_datatype` attribute names: a numeric type, not bool.
DType output_datatype(const Node& node) {
  const int64_t code = node.attr_int("output_datatype", 1);
  DType t{};
  if (!onnx_dtype_to_slim(code, &t) || t == DType::boolean)
    throw Error(ErrorCode::invalid_model, node.describe() + ": output_datatype " + std::to_string(code) + " is not a numeric type slim supports");
  return t;
}

// A one-element integer input (int32 or int64).
int64_t scalar_int(const KernelContext& ctx, int i, const char* what) {
  const Tensor& t = ctx.required_input(i);
  if ((t.dtype() != DType::i32 && t.dtype() != DType::i64) || t.numel() != 1)
    ctx.fail(ErrorCode::invalid_argument, std::string(what) + " must be one int32 or int64 value, got " + t.describe());
  return tensor_to_int64s(t)[0];
}

double scalar_float(const KernelContext& ctx, int i, const char* what) {
  const Tensor& t = ctx.required_input(i);
  if (!dtype_is_float(t.dtype()) || t.numel() != 1)
    ctx.fail(ErrorCode::invalid_argument, std::string(what) + " must be one floating-point value, got " + t.describe());
  return tensor_to_doubles(t)[0];
}

// Real ([..., 1]) or complex ([..., 2]) floating-point signal; returns 1 or 2.
int64_t signal_components(const KernelContext& ctx, const Tensor& x, int min_rank) {
  if (!dtype_is_float(x.dtype()))
    ctx.fail(ErrorCode::unsupported, "input of dtype " + std::string(dtype_name(x.dtype())) + " is not supported (float types only)");
  if (x.rank() < min_rank || (x.dim(x.rank() - 1) != 1 && x.dim(x.rank() - 1) != 2))
    ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " must have rank >= " + std::to_string(min_rank) +
                                              " and end in a dimension of 1 (real) or 2 (complex)");
  return x.dim(x.rank() - 1);
}

// ---------------------------------------------------------------- DFT

// One transform of length n per line along `axis` (zero-padded or truncated to n); the
// inverse is scaled by 1/n as numpy's ifft; onesided keeps bins [0, n/2] of a real input.
class Dft final : public OpKernel {
 public:
  Dft(const Node& node, int64_t opset) : opset_(opset) {
    if (opset < 20) axis_ = node.attr_int("axis", 1);
    inverse_ = bool_attr(node, "inverse", 0);
    onesided_ = bool_attr(node, "onesided", 0);
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int64_t comps = signal_components(ctx, x, 2);
    const int r = x.rank();
    const int64_t axis = opset_ >= 20 && ctx.input(2) ? scalar_int(ctx, 2, "axis") : opset_ >= 20 ? -2 : axis_;
    const int64_t a = axis < 0 ? axis + r : axis;
    if (a < 0 || a > r - 2)
      ctx.fail(ErrorCode::invalid_argument, "axis " + std::to_string(axis) + " is outside [-" + std::to_string(r) + ", -2] and [0, " +
                                                std::to_string(r - 2) + "] for input " + x.describe());
    if (onesided_ && comps == 2)
      ctx.fail(ErrorCode::invalid_argument, "onesided needs a real input (last dimension 1), got " + x.describe());
    const int64_t len = x.dim(a);
    const int64_t n = ctx.input(1) ? scalar_int(ctx, 1, "dft_length") : len;
    if (n < 1) ctx.fail(ErrorCode::invalid_argument, "dft_length " + std::to_string(n) + " is not positive");
    const int64_t out_n = onesided_ ? n / 2 + 1 : n;
    Shape shape = x.shape();
    shape[size_t(a)] = out_n;
    shape.back() = 2;
    check_output_shape(ctx, shape);
    const AxisSplit s(x.shape(), int(a));
    const int64_t inner = s.inner / comps;  // the dims between the axis and the components
    const std::vector<double> in = tensor_to_doubles(x);
    std::vector<double> y(size_t(shape_numel(shape)));
    const FftPlan plan(n);
    std::vector<cd> buf(static_cast<size_t>(n));
    const double scale = inverse_ ? 1.0 / double(n) : 1.0;
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double* p = in.data() + ((o * len + j) * inner + i) * comps;
          buf[size_t(j)] = j >= len ? cd(0, 0) : cd(p[0], comps == 2 ? p[1] : 0.0);
        }
        plan.transform(buf.data(), inverse_);
        for (int64_t k = 0; k < out_n; ++k) {
          double* q = y.data() + ((o * out_n + k) * inner + i) * 2;
          q[0] = buf[size_t(k)].real() * scale;
          q[1] = buf[size_t(k)].imag() * scale;
        }
      }
    write_doubles(ctx.output(0, x.dtype(), shape), y);
  }

 private:
  int64_t opset_;
  int64_t axis_ = 1;
  bool inverse_ = false, onesided_ = false;
};

// ---------------------------------------------------------------- STFT

// Frames of frame_length samples every frame_step samples (only whole frames), each
// multiplied by the window and transformed: output [batch, frames, bins, 2].
class Stft final : public OpKernel {
 public:
  Stft(const Node& node, int64_t) { onesided_ = bool_attr(node, "onesided", 1); }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int64_t comps = signal_components(ctx, x, 3);
    if (x.rank() != 3) ctx.fail(ErrorCode::invalid_argument, "signal " + x.describe() + " must be [batch, length, 1 or 2]");
    if (onesided_ && comps == 2)
      ctx.fail(ErrorCode::invalid_argument, "onesided needs a real signal (last dimension 1), got " + x.describe());
    const int64_t step = scalar_int(ctx, 1, "frame_step");
    if (step < 1) ctx.fail(ErrorCode::invalid_argument, "frame_step " + std::to_string(step) + " is not positive");
    const Tensor* window = ctx.input(2);
    if (window && (window->rank() != 1 || !dtype_is_float(window->dtype())))
      ctx.fail(ErrorCode::invalid_argument, "window must be a 1-D floating-point tensor, got " + window->describe());
    if (!window && !ctx.input(3)) ctx.fail(ErrorCode::invalid_argument, "needs a window or a frame_length");
    const int64_t n = ctx.input(3) ? scalar_int(ctx, 3, "frame_length") : window->dim(0);
    if (window && window->dim(0) != n)
      ctx.fail(ErrorCode::invalid_argument, "window " + window->describe() + " does not have frame_length " + std::to_string(n) + " values");
    const int64_t len = x.dim(1);
    if (n < 1 || n > len)
      ctx.fail(ErrorCode::invalid_argument, "frame length " + std::to_string(n) + " is outside [1, " + std::to_string(len) +
                                                "], the signal length");
    const int64_t frames = (len - n) / step + 1, bins = onesided_ ? n / 2 + 1 : n, batch = x.dim(0);
    const Shape shape{batch, frames, bins, 2};
    check_output_shape(ctx, shape);
    const std::vector<double> in = tensor_to_doubles(x);
    const std::vector<double> w = window ? tensor_to_doubles(*window) : std::vector<double>(size_t(n), 1.0);
    std::vector<double> y(size_t(shape_numel(shape)));
    const FftPlan plan(n);
    std::vector<cd> buf(static_cast<size_t>(n));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t f = 0; f < frames; ++f) {
        const double* p = in.data() + (b * len + f * step) * comps;
        for (int64_t j = 0; j < n; ++j)
          buf[size_t(j)] = cd(p[j * comps], comps == 2 ? p[j * comps + 1] : 0.0) * w[size_t(j)];
        plan.transform(buf.data(), false);
        double* q = y.data() + (b * frames + f) * bins * 2;
        for (int64_t k = 0; k < bins; ++k) {
          q[2 * k] = buf[size_t(k)].real();
          q[2 * k + 1] = buf[size_t(k)].imag();
        }
      }
    write_doubles(ctx.output(0, x.dtype(), shape), y);
  }

 private:
  bool onesided_ = true;
};

// ---------------------------------------------------------------- windows

// Generalized cosine windows y[n] = sum_k (-1)^k a_k cos(2 pi k n / N), with N = size
// (periodic) or size - 1 (symmetric).
class CosineWindow final : public OpKernel {
 public:
  CosineWindow(const Node& node, std::vector<double> coeffs) : coeffs_(std::move(coeffs)) {
    periodic_ = bool_attr(node, "periodic", 1);
    out_ = output_datatype(node);
  }
  void compute(KernelContext& ctx) const override {
    const int64_t n = scalar_int(ctx, 0, "size");
    if (n < 0 || n > (int64_t(1) << 32)) ctx.fail(ErrorCode::invalid_argument, "size " + std::to_string(n) + " is outside [0, 2^32]");
    const double denom = double(periodic_ ? n : n - 1);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      double sign = 1;
      for (size_t k = 0; k < coeffs_.size(); ++k, sign = -sign)
        v[size_t(i)] += sign * coeffs_[k] * (denom > 0 ? std::cos(2 * M_PI * double(k) * double(i) / denom) : 1.0);
    }
    write_doubles(ctx.output(0, out_, {n}), v);
  }

 private:
  std::vector<double> coeffs_;
  bool periodic_ = true;
  DType out_ = DType::f32;
};

KernelFactory window_factory(std::vector<double> coeffs) {
  return [coeffs](const Node& n, int64_t) -> std::unique_ptr<OpKernel> { return std::make_unique<CosineWindow>(n, coeffs); };
}

// ---------------------------------------------------------------- MelWeightMatrix

// The ONNX definition step by step: num_mel_bins + 2 points equally spaced on the mel scale
// mel(f) = 2595 log10(1 + f / 700) from lower to upper edge (the step divides by
// num_mel_bins + 2), mapped to spectrogram bins floor((dft_length + 1) hz / sample_rate);
// mel bin i is the triangle rising from point i to point i + 1 and falling to point i + 2.
class MelWeightMatrix final : public OpKernel {
 public:
  MelWeightMatrix(const Node& node, int64_t) : out_(output_datatype(node)) {}
  void compute(KernelContext& ctx) const override {
    const int64_t mel_bins = scalar_int(ctx, 0, "num_mel_bins"), dft_length = scalar_int(ctx, 1, "dft_length");
    const int64_t sample_rate = scalar_int(ctx, 2, "sample_rate");
    const double lower = scalar_float(ctx, 3, "lower_edge_hertz"), upper = scalar_float(ctx, 4, "upper_edge_hertz");
    if (mel_bins < 1 || dft_length < 1 || sample_rate < 1)
      ctx.fail(ErrorCode::invalid_argument, "num_mel_bins, dft_length and sample_rate must be positive, got " +
                                                std::to_string(mel_bins) + ", " + std::to_string(dft_length) + ", " + std::to_string(sample_rate));
    if (!(lower >= 0 && lower <= upper))
      ctx.fail(ErrorCode::invalid_argument, "edges [" + std::to_string(lower) + ", " + std::to_string(upper) + "] Hz are not 0 <= lower <= upper");
    const int64_t spec_bins = dft_length / 2 + 1;
    check_output_shape(ctx, {spec_bins, mel_bins});
    const auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
    const double low_mel = mel(lower), step = (mel(upper) - low_mel) / double(mel_bins + 2);
    std::vector<int64_t> points(size_t(mel_bins + 2));
    for (int64_t i = 0; i < mel_bins + 2; ++i) {
      const double hz = 700.0 * (std::pow(10.0, (double(i) * step + low_mel) / 2595.0) - 1.0);
      const double bin = std::floor(double(dft_length + 1) * hz / double(sample_rate));
      if (!(bin >= 0 && bin < double(spec_bins)))
        ctx.fail(ErrorCode::invalid_argument, "upper_edge_hertz " + std::to_string(upper) + " maps past the last of " +
                                                  std::to_string(spec_bins) + " spectrogram bins (sample_rate " + std::to_string(sample_rate) + ")");
      points[size_t(i)] = int64_t(bin);
    }
    std::vector<double> w(size_t(spec_bins * mel_bins), 0.0);
    for (int64_t i = 0; i < mel_bins; ++i) {
      const int64_t left = points[size_t(i)], center = points[size_t(i + 1)], right = points[size_t(i + 2)];
      if (center == left)
        w[size_t(center * mel_bins + i)] = 1;
      else
        for (int64_t j = left; j <= center; ++j) w[size_t(j * mel_bins + i)] = double(j - left) / double(center - left);
      for (int64_t j = center; j < right; ++j) w[size_t(j * mel_bins + i)] = double(right - j) / double(right - center);
    }
    write_doubles(ctx.output(0, out_, {spec_bins, mel_bins}), w);
  }

 private:
  DType out_;
};

}  // namespace

void register_signal_kernels(KernelRegistry& r) {
  r.add({"DFT", "", 17, INT_MAX, factory<Dft>(), {1, 2}});
  r.add({"STFT", "", 17, INT_MAX, factory<Stft>(), {1, 3}});
  r.add({"HannWindow", "", 17, INT_MAX, window_factory({0.5, 0.5}), {0}});
  r.add({"HammingWindow", "", 17, INT_MAX, window_factory({25.0 / 46.0, 21.0 / 46.0}), {0}});
  r.add({"BlackmanWindow", "", 17, INT_MAX, window_factory({0.42, 0.5, 0.08}), {0}});
  r.add({"MelWeightMatrix", "", 17, INT_MAX, factory<MelWeightMatrix>(), {0, 1}});
}

}  // namespace slim::ref
