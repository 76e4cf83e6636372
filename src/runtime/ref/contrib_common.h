// Private helpers of the com.microsoft contrib kernels (contrib.cc, contrib_attention.cc)
// and the cpu provider's MatMulNBits: input reading, the MatMulNBits weight geometry, and
// the rotary embedding of one head row.
#pragma once

#include <string>
#include <vector>

#include "runtime/ref/math_common.h"

namespace slim::ref {

// A float tensor's elements as doubles; unsupported naming `name` for other dtypes.
std::vector<double> contrib_floats(const KernelContext& ctx, const Tensor& t, const char* name);
// Writes output `index` of `dtype` and `shape` from doubles, rounding once.
void contrib_write(KernelContext& ctx, int index, DType dtype, const Shape& shape,
                   const std::vector<double>& v);
// invalid_argument unless `t` has n elements.
void contrib_check_numel(const KernelContext& ctx, const Tensor& t, int64_t n, const char* name);
// Throws unsupported "<node>: <what> is not supported" when `cond` holds (kernel factories).
void contrib_unsupported_if(const Node& node, bool cond, const std::string& what);

// MatMulNBits: B is (N, k_blocks, blob) bytes of `bits`-bit codes, first code in the low
// bits; a block of `block` codes along K has one scale and one zero point (packed like B,
// or a float per block; 2^(bits - 1) when absent); K need not be a multiple of block.
struct NBitsShape {
  int64_t k = 0, n = 0, bits = 4, block = 0, k_blocks = 0, blob = 0;
  // accuracy_level 4: A is quantized to int8 per block of K first, as ONNX Runtime does.
  bool int8_a = false;
  // Validates the attributes (K, N, bits, block_size) and refuses g_idx.
  static NBitsShape from_node(const Node& node);
  // The weights (q - zero_point) * scale as an (N, K) matrix, rounded to float, from the
  // kernel's inputs 1-3 (checked against the attributes).
  std::vector<float> dequantize(const KernelContext& ctx) const;
};

// MatMulNBits' int8 form of an A row (accuracy_level 4), as ONNX Runtime's MLAS makes it:
// per block of `block` values, scale = max|a| / 127 and q = round-to-even(a / scale) in
// float. Writes q to `codes` (k values) and the scale of each block to `scales`.
void quantize_a_int8(const float* a, int64_t k, int64_t block, int8_t* codes, float* scales);

// Rotary embedding attributes shared by RotaryEmbedding and GroupQueryAttention.
struct RotaryAttrs {
  bool interleaved = false;
  int64_t num_heads = 0, rotary_dim = 0;
};
// Rotates the first `rot` values of a head row by the angles of one position (cos/sin
// hold rot / 2 values): pairs (i, i + rot/2), or (2i, 2i + 1) when interleaved.
void rotate(double* row, const double* cos, const double* sin, int64_t rot, bool interleaved);

}  // namespace slim::ref
