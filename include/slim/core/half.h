// Conversions between float and the 16-bit float formats (IEEE half, bfloat16) that
// ONNX, GGUF and the KV cache store. Round to nearest even, NaN and Inf preserved.
#pragma once

#include <bit>
#include <cstdint>

namespace slim {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int shift = std::countl_zero(mant) - 21;  // leading zeros within the 10-bit field + 1
    mant = (mant << shift) & 0x3ffu;
    bits = sign | (uint32_t(113 - shift) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);       // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);      // overflow rounds to Inf
  if (a < 0x38800000u) {                                       // subnormal or zero in f16
    // value = a as float; f16 subnormal unit is 2^-24. Use float arithmetic for rounding.
    const float v = std::bit_cast<float>(a);
    // Adding 0.5 (2^-1) shifts the mantissa so its low bits are the 2^-24 units,
    // rounded to nearest even by the FPU.
    const float r = v + 0.5f;
    return uint16_t(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  uint32_t m = a + 0xc8000fffu + ((a >> 13) & 1u);  // rebias exponent (-112 << 23) and round
  return uint16_t(sign | (m >> 13));
}

}  // namespace slim
