// The arithmetic of ONNX's linear quantization that the ref kernels define and the cpu
// provider's vectorized kernels must reproduce to the bit: DynamicQuantizeLinear's scale
// and zero point from its input's range, and the saturating round of x / scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace slim::ref {

struct DynamicQuantParams {
  float scale = 0.f;
  uint8_t zero_point = 0;
};

// u8 parameters for values in [lo, hi]; the range always includes 0 so that 0 is exactly
// representable. An all-zero input gives scale 0 (ONNX's formula; ONNX Runtime uses 1).
inline DynamicQuantParams dynamic_quant_params(float lo, float hi) {
  lo = std::min(lo, 0.f);
  hi = std::max(hi, 0.f);
  DynamicQuantParams p;
  p.scale = (hi - lo) / 255.f;
  p.zero_point =
      p.scale == 0.f ? 0 : uint8_t(std::nearbyint(std::clamp(0.f - lo / p.scale, 0.f, 255.f)));
  return p;
}

// saturate(round_half_even(x / scale) + zero_point) into [lo, hi]; NaN gives 0.
inline int32_t quantize_value(float x, float scale, int32_t zero_point, int32_t lo, int32_t hi) {
  const float q = std::nearbyint(x / scale);
  return std::isnan(q) ? 0 : int32_t(std::clamp(q + float(zero_point), float(lo), float(hi)));
}

}  // namespace slim::ref
