// GGML tensor types as GGUF files store them: block sizes for every type a reader may
// meet, and bit-exact dequantization and reference quantization (the same algorithms as
// ggml's quantize_row_*_ref) for the types slim computes with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace slim::llm {

enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;
  int64_t block_elems;  // elements per block
  int64_t block_bytes;  // bytes per block
  bool computable;      // slim dequantizes, quantizes and multiplies this type
};

// nullptr when the id is not a type slim knows the layout of.
const GgmlTypeInfo* ggml_type_info(uint32_t type_id);
std::string ggml_type_name(uint32_t type_id);  // "type 99" for unknown ids

// Bytes of one row of n elements; n must be a multiple of the block size.
int64_t ggml_row_bytes(GgmlType type, int64_t n);

// The K-quant super-block size.
constexpr int64_t kQk = 256;

// dst[0..n) = the values src encodes. n is a multiple of the block size.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// Encodes n floats the way ggml's reference quantizers do (bit-exact), n a multiple of
// the block size. For f16/bf16 this is the round-to-nearest-even conversion.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace slim::llm
