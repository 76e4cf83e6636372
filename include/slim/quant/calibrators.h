// Calibrators turn a tensor's statistics into the range its 8-bit form covers, and the
// range into ONNX QuantizeLinear parameters (scale, zero point). Weights are quantized
// here too: symmetric int8, per tensor or per output channel. docs/quantization.md gives
// the formulas.
#pragma once

#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/quant/statistics.h"

namespace slim::quant {

enum class CalibrationMethod { minmax, percentile, entropy, mse };

CalibrationMethod parse_calibration_method(const std::string& name);  // "minmax", ...
const char* calibration_method_name(CalibrationMethod m);

// The 8-bit type of activations: u8 or i8, asymmetric (a zero point anywhere) or
// symmetric (zero point 0 for i8, 128 for u8).
struct ActivationType {
  DType dtype = DType::u8;
  bool symmetric = false;
};

struct CalibratorOptions {
  CalibrationMethod method = CalibrationMethod::minmax;
  double percentile = 99.999;  // for `percentile`: the share of values kept, in percent
};

// A real range [lo, hi] (lo ≤ 0 ≤ hi after quantization_params widens it to hold 0).
struct Range {
  double lo = 0, hi = 0;
};

// The range the method picks for a tensor with these statistics. minmax: [min, max];
// the others pick a threshold T on |x| from the histogram and clip [min, max] to
// [−T, T]. `type` matters to entropy (its number of levels) and mse (its error model).
Range calibrate(const TensorStats& stats, const CalibratorOptions& options,
                const ActivationType& type);

// Scale and zero point of a range for a QuantizeLinear to `type`, as ONNX Runtime's
// quantizer computes them: the range widened to hold 0 (symmetric: to ±max|r|),
// scale = (hi − lo)/(qmax − qmin) (1 when that is 0), zero point = round(qmin − lo/scale),
// with [qmin, qmax] = [0, 255] (u8), [−128, 127] (i8) or [−127, 127] (symmetric i8).
struct QuantParams {
  float scale = 1;
  int32_t zero_point = 0;
};
QuantParams quantization_params(Range r, const ActivationType& type);
// ONNX's QuantizeLinear then DequantizeLinear of one value (round half to even).
float fake_quantize(float x, QuantParams p, const ActivationType& type);

// Per-channel (axis ≥ 0) or per-tensor (axis −1) symmetric int8 weights, values in
// [−qmax, qmax]: scale = max|w| / qmax over the channel (1 for an all-zero channel),
// q = clamp(round(w / scale)) with the division in f32 and round half to even. qmax 127
// (8 bits), or 64 (7 bits: ONNX Runtime's reduce_range, whose weights AVX2's vpmaddubsw
// multiplies without int16 saturation, so CPUs without VNNI need not split them).
struct QuantizedWeight {
  Tensor values;              // i8, the weight's shape
  std::vector<float> scales;  // one per channel, or one
  int axis = -1;
  int qmax = 127;
};
QuantizedWeight quantize_weight(const Tensor& w, int axis, int qmax = 127);
// Raises channel c's scale (of `q`, made from `w`) to `scale` and rounds its values again:
// a bias must fit int32 at scale s_x·s_w, which a near-zero channel's tiny s_w breaks.
void widen_weight_scale(const Tensor& w, QuantizedWeight& q, int64_t c, float scale);
Tensor dequantize_weight(const QuantizedWeight& q);  // f32

// Entropy calibration on |x| bins (TensorRT's search, as ONNX Runtime and MXNet run it):
// for each i from `levels` to the last non-empty bin that clips at most 1% of the values,
// the KL divergence between the first i bins (the rest folded into bin i−1) and their
// quantization to `levels` levels; returns the i of the smallest divergence (the
// threshold is i bin widths). Exposed for the tests.
int entropy_threshold_bins(const std::vector<double>& abs_counts, int levels);

}  // namespace slim::quant
