// The internal ops that graph optimization passes produce (domain "slim", version 1):
// a Conv, Gemm or MatMul with a bias, a residual input and an activation folded in. They
// never come from a file (validate_graph refuses the domain); every provider that claims
// one must compute exactly what the unfused chain computes, and ref is the oracle.
//
//   slim:FusedConv   inputs X, W, [B], [Z]   Conv's attributes + activation
//   slim:FusedGemm   inputs A, B, [C], [Z]   Gemm's attributes + activation
//   slim:FusedMatMul inputs A, B, [bias], [Z]  bias broadcasts over the last axis
//
//   Y = min(max(act(op(...) + Z) * output_scale + output_shift, output_min), output_max)
//   (Z, the residual, has Y's shape; the bias is part of op)
//
//   slim:DynamicQuantizeConv inputs X (f32), W (8-bit, constant), W_zero_point, W_scale, [B]
//       Conv's attributes + activation: the DynamicQuantizeLinear -> ConvInteger -> Cast ->
//       Mul(x_scale * W_scale) -> Add(B) -> activation chain of dynamically quantized
//       models, each step rounded as the unfused nodes round it:
//   Y = act(float(ConvInteger(q, W, x_zero_point, W_zero_point)) * (x_scale * W_scale[m]) + B[m])
//   where (q, x_scale, x_zero_point) = DynamicQuantizeLinear(X); W_zero_point (may be
//   absent, "") and W_scale hold one value or one per output channel m.
//
//   slim:QLookup inputs X (u8/i8), T (u8/i8 constant [256]): Y[i] = T[X[i]'s byte], of T's
//       dtype: a DequantizeLinear -> elementwise ops -> QuantizeLinear chain on one
//       per-tensor quantized tensor, tabulated (passes: fuse_qdq_elementwise).
//   slim:QLinearConvLookup inputs QLinearConv's nine (bias may be ""), T (u8/i8 constant
//       [256]): QLinearConv, then each byte through T (of T's dtype): a convolution and the
//       activation tabulated after it (passes: fuse_qlinear_conv_lookup).
//   slim:QLinearConvAdd inputs QLinearConv's nine (bias may be ""), T (as
//       QLinearConvLookup's, or ""), then slim:QLinearAdd's seven after A: A_scale,
//       A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point: the bytes of
//       QLinearConv (through T) are A of a QLinearAdd with B of the output's shape: a
//       convolution and the residual Add after it (passes: fuse_residual_qlinear_add).
//   slim:QLinearMulAdd inputs slim:QLinearMul's eight, then slim:QLinearAdd's seven after A
//       (as slim:QLinearConvAdd's): the product's bytes are A of a QLinearAdd with B of the
//       output's shape (the shortcut around a squeeze-excitation gate, B + B * gate).
//   slim:QLinearAdd / slim:QLinearMul inputs A, A_scale, A_zero_point, B, B_scale,
//       B_zero_point, C_scale, C_zero_point (scalars): C = QuantizeLinear(
//       DequantizeLinear(A) op DequantizeLinear(B)), each step rounded to f32 as the
//       nodes it replaces (ONNX Runtime's com.microsoft ops of these names requantize in
//       their own way); A and B broadcast.
//   slim:QLinearGlobalAveragePool inputs X (u8/i8, [N, C, spatial...]), X_scale,
//       X_zero_point, Y_scale, Y_zero_point (scalars): ONNX Runtime's com.microsoft op of
//       this name (what its QDQ transformer makes of DequantizeLinear -> GlobalAveragePool
//       -> QuantizeLinear), Y [N, C, 1...] = saturate(round_half_even(float(sum(X) -
//       n * X_zero_point) * (X_scale / (Y_scale * float(n)))) + Y_zero_point), n pixels.
//
// Attributes: `activation` (string, absent or "" for none) and `activation_params`
// (floats): Relu; Clip [min, max]; Sigmoid; HardSwish; SiLU (x * sigmoid(x));
// Gelu (erf form); GeluTanh (tanh approximation); LeakyRelu [alpha]; Tanh. Then
// `output_scale` and `output_shift` (floats, default 1 and 0): a Mul and an Add by scalars
// after the activation (PaddleOCR's learnable affine blocks), each rounded to f32, and
// `output_min`/`output_max` (default -inf/inf): a Max and a Min with scalars (TensorFlow
// exports' tf.maximum after LeakyRelu), NaN winning as in the ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "slim/onnx/graph.h"

namespace slim {

inline constexpr const char* kFusedDomain = "slim";
inline constexpr int kFusedOpset = 1;

enum class Activation { none, relu, clip, sigmoid, hard_swish, silu, gelu, gelu_tanh, leaky_relu, tanh };

struct ActivationSpec {
  Activation kind = Activation::none;
  float p0 = 0.f, p1 = 0.f;  // Clip: min, max; LeakyRelu: alpha
  float scale = 1.f, shift = 0.f;          // output_scale, output_shift
  float lo = -INFINITY, hi = INFINITY;     // output_min, output_max
  bool has_affine() const { return scale != 1.f || shift != 0.f; }
  bool has_clamp() const { return lo != -INFINITY || hi != INFINITY; }
};

// Parses the `activation` / `activation_params` attribute pair; nullopt-like failure is
// reported by returning false so the caller can name the node in its error.
inline bool parse_activation(const std::string& name, const std::vector<float>& params,
                             ActivationSpec* out) {
  static const struct { const char* name; Activation kind; size_t n_params; } kTable[] = {
      {"", Activation::none, 0},         {"Relu", Activation::relu, 0},
      {"Clip", Activation::clip, 2},     {"Sigmoid", Activation::sigmoid, 0},
      {"HardSwish", Activation::hard_swish, 0}, {"SiLU", Activation::silu, 0},
      {"Gelu", Activation::gelu, 0},     {"GeluTanh", Activation::gelu_tanh, 0},
      {"LeakyRelu", Activation::leaky_relu, 1}, {"Tanh", Activation::tanh, 0},
  };
  for (const auto& e : kTable) {
    if (name != e.name) continue;
    if (params.size() != e.n_params) return false;
    out->kind = e.kind;
    out->p0 = e.n_params > 0 ? params[0] : 0.f;
    out->p1 = e.n_params > 1 ? params[1] : 0.f;
    return true;
  }
  return false;
}

// The activation and output affine of a slim:Fused* node; false when the activation is
// unknown or has the wrong number of params (the caller names the node in its error).
inline bool parse_fused_activation(const Node& node, ActivationSpec* out) {
  if (!parse_activation(node.attr_string("activation", ""), node.attr_floats("activation_params"), out)) return false;
  out->scale = node.attr_float("output_scale", 1.f);
  out->shift = node.attr_float("output_shift", 0.f);
  out->lo = node.attr_float("output_min", -INFINITY);
  out->hi = node.attr_float("output_max", INFINITY);
  return true;
}

// The scalar definition every vectorized version is tested against. It matches the ref
// kernels of the unfused ops (Relu, Clip, Sigmoid, HardSwish, Mul(x, Sigmoid(x)),
// Gelu, LeakyRelu, Tanh) bit for bit: the same float formulas in the same order
// (Sigmoid's two branches keep exp from overflowing; Gelu divides by sqrt 2).
inline float apply_activation(const ActivationSpec& a, float x) {
  auto sigmoid = [](float v) {
    if (v >= 0.f) return 1.f / (1.f + std::exp(-v));
    const float e = std::exp(v);
    return e / (1.f + e);
  };
  switch (a.kind) {
    case Activation::none: return x;
    case Activation::relu: return x > 0.f ? x : 0.f;
    case Activation::clip: return x < a.p0 ? a.p0 : (x > a.p1 ? a.p1 : x);
    case Activation::sigmoid: return sigmoid(x);
    case Activation::hard_swish: return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f));
    case Activation::silu: return x * sigmoid(x);
    case Activation::gelu:
      return 0.5f * x * (1.f + std::erf(x / float(std::numbers::sqrt2)));
    case Activation::gelu_tanh: {
      const float k = float(std::sqrt(2.0 / std::numbers::pi));
      return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
    }
    case Activation::leaky_relu: return x < 0.f ? a.p0 * x : x;
    case Activation::tanh: return std::tanh(x);
  }
  return x;
}

// The activation, then the output affine as the unfused Mul and Add round it, then the
// clamp as Max and Min compute it (NaN wins).
inline float apply_fused_epilogue(const ActivationSpec& a, float x) {
  float v = apply_activation(a, x);
  if (a.scale != 1.f) v = v * a.scale;
  if (a.shift != 0.f) v = v + a.shift;
  if (a.has_clamp() && !std::isnan(v)) v = std::min(std::max(v, a.lo), a.hi);
  return v;
}

}  // namespace slim
