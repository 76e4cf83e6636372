// The GGML block layouts, byte for byte as GGUF stores them, shared by the converters
// and the matmul kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace slim::llm {

struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // element j in the low nibble of qs[j], element j+16 in the high one
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ4K {
  uint16_t d;         // scale of the 6-bit sub-block scales
  uint16_t dmin;      // scale of the 6-bit sub-block mins
  uint8_t scales[12]; // 8 scales and 8 mins, 6 bits each, packed
  uint8_t qs[128];    // 4-bit quants; each 64 elements share 32 bytes (low, then high nibbles)
};
static_assert(sizeof(BlockQ4K) == 144);

struct BlockQ6K {
  uint8_t ql[128];   // low 4 bits
  uint8_t qh[64];    // high 2 bits
  int8_t scales[16]; // per 16 elements
  uint16_t d;
};
static_assert(sizeof(BlockQ6K) == 210);

// Activations for K-quant dot products: ggml's Q8_K, with per-16 sums for the mins.
struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8K) == 292);

// ggml's nearest_int: round half to even through the float mantissa, valid for |x| < 2^22.
inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

// The 6-bit scale and min of sub-block j of a Q4_K block.
inline void q4k_scale_min(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace slim::llm
