#include "slim/llm/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "slim/llm/ggml_blocks.h"
#include "slim/core/cpu_features.h"
#include "slim/core/error.h"
#include "slim/core/half.h"

namespace slim::llm {

ActType act_type_for(GgmlType weight) {
  switch (weight) {
    case GgmlType::f32: return ActType::f32;
    case GgmlType::f16: return ActType::f16;
    case GgmlType::bf16: return ActType::bf16;
    case GgmlType::q8_0: case GgmlType::q4_0: return ActType::q8_0;
    case GgmlType::q4_k: case GgmlType::q6_k: return ActType::q8_k;
    default: break;
  }
  throw Error(ErrorCode::unsupported, "no kernel for weight type " + ggml_type_name(uint32_t(weight)));
}

int64_t f16_copy_offset(int64_t n) { return (n * 2 + 63) / 64 * 64; }

int64_t q8_0_aux_offset(int64_t n) { return (n / 32 * int64_t(sizeof(BlockQ8_0)) + n / 128 * 192 + 7) / 8 * 8; }

bool repackable_x16(GgmlType type) {
  return type == GgmlType::f16 || type == GgmlType::q8_0 || type == GgmlType::q4_0 || type == GgmlType::q4_k ||
         type == GgmlType::q6_k;
}

namespace {

// Runs f(std::integral_constant<int, K>{}) for K = nt when 1 <= nt <= M (else nothing):
// the tiles are instantiated per token count.
template <int M, typename F>
void with_token_count(int nt, F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((nt == I + 1 ? (f(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
  }(std::make_integer_sequence<int, M>{});
}

// Q4_K: per column of super-blocks, the 16 rows' d (32 bytes) and dmin (32), their 12
// scale bytes byte-major (byte k of row r at 64 + 16k + r), then the 128 code bytes as 32
// vectors (vector v holds bytes 4v..4v+3 of every row, row r at 4r): 2,304 bytes.
void repack_q4_k_x16(uint8_t* rows16, int64_t n) {
  const int64_t nb = n / 256, row_bytes = nb * int64_t(sizeof(BlockQ4K));
  std::vector<uint8_t> src(rows16, rows16 + 16 * row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = rows16 + b * 16 * int64_t(sizeof(BlockQ4K));
    for (int r = 0; r < 16; ++r) {
      const auto* blk = reinterpret_cast<const BlockQ4K*>(src.data() + r * row_bytes) + b;
      std::memcpy(o + 2 * r, &blk->d, 2);
      std::memcpy(o + 32 + 2 * r, &blk->dmin, 2);
      for (int k = 0; k < 12; ++k) o[64 + 16 * k + r] = blk->scales[k];
      for (int v = 0; v < 32; ++v) std::memcpy(o + 256 + 64 * v + 4 * r, blk->qs + 4 * v, 4);
    }
  }
}

// Q6_K: per column of super-blocks, the 16 rows' d (32 bytes), their 16 scales byte-major
// (scale k of row r at 32 + 16k + r), the 128 ql bytes as 32 vectors and the 64 qh bytes
// as 16 (vector v holds bytes 4v..4v+3 of every row, row r at 4r): 3,360 bytes.
void repack_q6_k_x16(uint8_t* rows16, int64_t n) {
  const int64_t nb = n / 256, row_bytes = nb * int64_t(sizeof(BlockQ6K));
  std::vector<uint8_t> src(rows16, rows16 + 16 * row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = rows16 + b * 16 * int64_t(sizeof(BlockQ6K));
    for (int r = 0; r < 16; ++r) {
      const auto* blk = reinterpret_cast<const BlockQ6K*>(src.data() + r * row_bytes) + b;
      std::memcpy(o + 2 * r, &blk->d, 2);
      for (int k = 0; k < 16; ++k) o[32 + 16 * k + r] = uint8_t(blk->scales[k]);
      for (int v = 0; v < 32; ++v) std::memcpy(o + 288 + 64 * v + 4 * r, blk->ql + 4 * v, 4);
      for (int v = 0; v < 16; ++v) std::memcpy(o + 2336 + 64 * v + 4 * r, blk->qh + 4 * v, 4);
    }
  }
}

// F16: column c holds the 16 rows' values (value of row r at 16c + r).
void repack_f16_x16(uint8_t* rows16, int64_t n) {
  std::vector<uint16_t> src(size_t(16 * n));
  std::memcpy(src.data(), rows16, src.size() * 2);
  auto* o = reinterpret_cast<uint16_t*>(rows16);
  for (int64_t c = 0; c < n; ++c)
    for (int r = 0; r < 16; ++r) o[16 * c + r] = src[size_t(r * n + c)];
}

}  // namespace

void repack_x16(GgmlType type, uint8_t* rows16, int64_t n) {
  if (!repackable_x16(type)) throw Error(ErrorCode::unsupported, "no 16-row layout for " + ggml_type_name(uint32_t(type)));
  if (type == GgmlType::q4_k) return repack_q4_k_x16(rows16, n);
  if (type == GgmlType::q6_k) return repack_q6_k_x16(rows16, n);
  if (type == GgmlType::f16) return repack_f16_x16(rows16, n);
  const bool q8 = type == GgmlType::q8_0;
  const int64_t nb = n / 32, block = q8 ? int64_t(sizeof(BlockQ8_0)) : int64_t(sizeof(BlockQ4_0));
  const int64_t row_bytes = nb * block, codes = block - 2;
  std::vector<uint8_t> src(rows16, rows16 + 16 * row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = rows16 + b * 16 * block;
    for (int r = 0; r < 16; ++r) {
      const uint8_t* blk = src.data() + r * row_bytes + b * block;  // f16 scale, then the codes
      std::memcpy(o + 2 * r, blk, 2);
      for (int64_t k = 0; k < codes / 4; ++k)
        for (int j = 0; j < 4; ++j) o[32 + 64 * k + 4 * r + j] = uint8_t(blk[2 + 4 * k + j] ^ (q8 ? 0x80 : 0));
    }
  }
}

int64_t max_act_row_bytes(int64_t n) {
  int64_t m = 0;
  for (ActType t : {ActType::f32, ActType::f16, ActType::bf16, ActType::q8_0, ActType::q8_k})
    m = std::max(m, act_row_bytes(t, n));
  return m;
}

int64_t act_row_bytes(ActType type, int64_t n) {
  switch (type) {
    case ActType::f32: return n * 4;
    case ActType::bf16: return n * 2;
    // The f16 row, then room for the f32 copy that kernel sets with F16 tiles append.
    case ActType::f16: return f16_copy_offset(n) + n * 4;
    // The blocks, room for the unpacked copy that tiled kernel sets append, the Q8Aux.
    case ActType::q8_0: return q8_0_aux_offset(n) + n / 32 * int64_t(sizeof(Q8Aux));
    case ActType::q8_k: return n / 256 * int64_t(sizeof(BlockQ8K));
  }
  return 0;
}

namespace {

// ---------------- scalar reference kernels ----------------

float dot_f32_scalar(int64_t n, const void* vw, const void* vx) {
  const float* w = static_cast<const float*>(vw);
  const float* x = static_cast<const float*>(vx);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(w[i]) * x[i];
  return float(s);
}

float dot_f16_scalar(int64_t n, const void* vw, const void* vx) {
  const uint16_t* w = static_cast<const uint16_t*>(vw);
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(f16_to_f32(w[i])) * f16_to_f32(x[i]);
  return float(s);
}

float dot_bf16_scalar(int64_t n, const void* vw, const void* vx) {
  const uint16_t* w = static_cast<const uint16_t*>(vw);
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(bf16_to_f32(w[i])) * bf16_to_f32(x[i]);
  return float(s);
}

float dot_q8_0_scalar(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ8_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float s = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += int(w[i].qs[j]) * x[i].qs[j];
    s += float(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(x[i].d));
  }
  return s;
}

float dot_q4_0_scalar(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  float s = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (int(w[i].qs[j] & 0xF) - 8) * x[i].qs[j];
      sumi += (int(w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
    }
    s += float(sumi) * (f16_to_f32(w[i].d) * f16_to_f32(x[i].d));
  }
  return s;
}

float dot_q4_k_scalar(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4K*>(vw);
  const auto* x = static_cast<const BlockQ8K*>(vx);
  float s = 0;
  for (int64_t i = 0; i < n / 256; ++i) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4k_scale_min(j, w[i].scales, &sc, &m);
      const uint8_t* q = w[i].qs + 32 * (j / 2);
      const int8_t* y = x[i].qs + 32 * j;
      int d = 0;
      for (int l = 0; l < 32; ++l) d += int((j & 1) ? (q[l] >> 4) : (q[l] & 0xF)) * y[l];
      sumi += d * sc;
      summ += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
    }
    s += x[i].d * f16_to_f32(w[i].d) * float(sumi) - x[i].d * f16_to_f32(w[i].dmin) * float(summ);
  }
  return s;
}

float dot_q6_k_scalar(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ6K*>(vw);
  const auto* x = static_cast<const BlockQ8K*>(vx);
  float s = 0;
  for (int64_t i = 0; i < n / 256; ++i) {
    int sumi = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w[i].ql + 64 * half;
      const uint8_t* qh = w[i].qh + 32 * half;
      const int8_t* sc = w[i].scales + 8 * half;
      const int8_t* y = x[i].qs + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = int((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        sumi += sc[is] * q1 * y[l] + sc[is + 2] * q2 * y[l + 32] + sc[is + 4] * q3 * y[l + 64] +
                sc[is + 6] * q4 * y[l + 96];
      }
    }
    s += x[i].d * f16_to_f32(w[i].d) * float(sumi);
  }
  return s;
}

template <bool Q8>
void tile_x16_scalar(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                     int64_t ldy) {
  const int64_t nb = n / 32, column = Q8 ? 16 * int64_t(sizeof(BlockQ8_0)) : 16 * int64_t(sizeof(BlockQ4_0));
  for (int t = 0; t < nt; ++t) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(x + t * xs);
    const auto* aux = reinterpret_cast<const Q8Aux*>(x + t * xs + q8_0_aux_offset(n));
    for (int r = 0; r < nr; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* col = w + b * column;
        uint16_t d;
        std::memcpy(&d, col + 2 * r, 2);
        // Unsigned codes: Q8_0 offset by 128, Q4_0 as stored (its values are codes - 8).
        int32_t s = (Q8 ? -128 : -8) * aux[b].sum;
        for (int k = 0; k < 4; ++k)
          for (int j = 0; j < 4; ++j) {
            const uint8_t c = col[32 + 64 * k + 4 * r + j];
            if constexpr (Q8) {
              s += int(c) * xb[b].qs[4 * k + j] + int(col[32 + 64 * (k + 4) + 4 * r + j]) * xb[b].qs[16 + 4 * k + j];
            } else {
              s += int(c & 0xF) * xb[b].qs[4 * k + j] + int(c >> 4) * xb[b].qs[16 + 4 * k + j];
            }
          }
        acc = std::fma(float(s), f16_to_f32(d) * aux[b].d, acc);
      }
      y[t * ldy + r] = acc;
    }
  }
}

// Repacked F16 against f16 activations: per (row, token) three running sums, column c
// going to sum c mod 3 with one fused multiply-add, then (s0 + s1) + s2.
void tile_f16_x16_scalar(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                         int64_t ldy) {
  const auto* wh = reinterpret_cast<const uint16_t*>(w);
  for (int t = 0; t < nt; ++t) {
    const auto* xh = reinterpret_cast<const uint16_t*>(x + t * xs);
    for (int r = 0; r < nr; ++r) {
      float a[3] = {0, 0, 0};
      for (int64_t c = 0; c < n; ++c) a[c % 3] = std::fma(f16_to_f32(wh[16 * c + r]), f16_to_f32(xh[c]), a[c % 3]);
      y[t * ldy + r] = (a[0] + a[1]) + a[2];
    }
  }
}

// Repacked Q4_K against Q8_K activations: per (row, token), block by block,
// acc = fma(float(sum of sc_j x dot_j), d x dx, acc), then acc = fma(-float(sum of
// m_j x bsums_j), dmin x dx, acc).
void tile_q4_k_x16_scalar(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                          int64_t ldy) {
  const int64_t nb = n / 256, column = 16 * int64_t(sizeof(BlockQ4K));
  for (int t = 0; t < nt; ++t) {
    const auto* xb = reinterpret_cast<const BlockQ8K*>(x + t * xs);
    for (int r = 0; r < nr; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* col = w + b * column;
        uint16_t d, dmin;
        std::memcpy(&d, col + 2 * r, 2);
        std::memcpy(&dmin, col + 32 + 2 * r, 2);
        uint8_t scales[12];
        for (int k = 0; k < 12; ++k) scales[k] = col[64 + 16 * k + r];
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          q4k_scale_min(j, scales, &sc, &m);
          int32_t dot = 0;
          for (int i = 0; i < 32; ++i) {
            const int v = 8 * (j / 2) + i / 4;
            const uint8_t c = col[256 + 64 * v + 4 * r + i % 4];
            dot += int((j & 1) ? (c >> 4) : (c & 0xF)) * xb[b].qs[32 * j + i];
          }
          sumi += int32_t(sc) * dot;
          summ += int32_t(m) * (xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
        }
        acc = std::fma(float(sumi), f16_to_f32(d) * xb[b].d, acc);
        acc = std::fma(-float(summ), f16_to_f32(dmin) * xb[b].d, acc);
      }
      y[t * ldy + r] = acc;
    }
  }
}

// Repacked Q6_K against Q8_K activations: per (row, token), block by block,
// acc = fma(float(sum over the 16 sub-blocks of sc_j x (codes . x_j - 32 bsum_j)), d x dx, acc).
// Element e = 128h + 32k + l (l < 32) has the low nibble of ql byte 64h + 32(k & 1) + l
// (the high one for k >= 2) and bits 2k, 2k + 1 of qh byte 32h + l, as in ggml.
void tile_q6_k_x16_scalar(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                          int64_t ldy) {
  const int64_t nb = n / 256, column = 16 * int64_t(sizeof(BlockQ6K));
  for (int t = 0; t < nt; ++t) {
    const auto* xb = reinterpret_cast<const BlockQ8K*>(x + t * xs);
    for (int r = 0; r < nr; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* col = w + b * column;
        uint16_t d;
        std::memcpy(&d, col + 2 * r, 2);
        int32_t sumi = 0;
        for (int j = 0; j < 16; ++j) {
          int32_t dot = -32 * xb[b].bsums[j];
          for (int e = 16 * j; e < 16 * j + 16; ++e) {
            const int h = e / 128, k = e % 128 / 32, l = e % 32;
            const int ql = 64 * h + 32 * (k & 1) + l, qh = 32 * h + l;
            const uint8_t lo = col[288 + 64 * (ql / 4) + 4 * r + ql % 4], hi = col[2336 + 64 * (qh / 4) + 4 * r + qh % 4];
            dot += int(((k >= 2 ? lo >> 4 : lo) & 0xF) | ((hi >> 2 * k) & 3) << 4) * xb[b].qs[e];
          }
          sumi += int32_t(int8_t(col[32 + 16 * j + r])) * dot;
        }
        acc = std::fma(float(sumi), f16_to_f32(d) * xb[b].d, acc);
      }
      y[t * ldy + r] = acc;
    }
  }
}

// Activations: ggml's x86 Q8_0 path (scale amax/127, round half to even).
void quantize_q8_0_scalar(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    y[i].d = f32_to_f16(amax / 127.f);
    const float id = amax != 0 ? 127.f / amax : 0.f;
    for (int j = 0; j < 32; ++j) y[i].qs[j] = int8_t(std::nearbyint(x[j] * id));
  }
}

void quantize_q8_k_scalar(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    float max = 0, amax = 0;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < 256; ++j) y[i].qs[j] = int8_t(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = int16_t(sum);
    }
    y[i].d = 1 / iscale;
  }
}

void axpy_f16_scalar(int64_t n, float a, const uint16_t* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * f16_to_f32(x[i]);
}

void silu_mul_scalar(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void f32_to_f16_row_scalar(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  while (best + 1 < n && std::isnan(x[best])) ++best;
  if (std::isnan(x[best])) return 0;
  for (int64_t i = best + 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

// x86-64 only: the AVX2 and AVX-512 VNNI regions (other architectures have their own
// sections below, or run the scalar set).
#if defined(__x86_64__)

// ---------------- AVX2 kernels ----------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "simd_exp_avx2.h"  // exp_nonpositive_avx2: the SiLU's sigmoid
#include "simd_hsum.h"  // hsum8

namespace {

// The first nr <= 16 results of a 16-row tile (rows 0-7 in lo, 8-15 in hi) to y.
inline void store_rows_x16(__m256 lo, __m256 hi, int nr, float* y) {
  alignas(32) float v[16];
  _mm256_store_ps(v, lo);
  _mm256_store_ps(v + 8, hi);
  std::memcpy(y, v, size_t(nr) * 4);
}

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

float dot_f32_avx2(int64_t n, const void* vw, const void* vx) {
  const float* w = static_cast<const float*>(vw);
  const float* x = static_cast<const float*>(vx);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

float dot_f16_avx2(int64_t n, const void* vw, const void* vx) {
  const uint16_t* w = static_cast<const uint16_t*>(vw);
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(load_f16x8(w + i), load_f16x8(x + i), a0);
    a1 = _mm256_fmadd_ps(load_f16x8(w + i + 8), load_f16x8(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(load_f16x8(w + i + 16), load_f16x8(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(load_f16x8(w + i + 24), load_f16x8(x + i + 24), a3);
  }
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += h2f(w[i]) * h2f(x[i]);
  return s;
}

float dot_bf16_avx2(int64_t n, const void* vw, const void* vx) {
  const uint16_t* w = static_cast<const uint16_t*>(vw);
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load_bf16x8(w + i), load_bf16x8(x + i), a0);
    a1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), load_bf16x8(x + i + 8), a1);
  }
  float s = hsum8(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += bf16_to_f32(w[i]) * bf16_to_f32(x[i]);
  return s;
}

// Signed int8 x int8 dot of 32 lanes as 8 int32 partial sums, via the sign trick that
// maddubs (unsigned x signed) needs.
inline __m256i dot_i8_avx2(__m256i a, __m256i b) {
  const __m256i ax = _mm256_sign_epi8(a, a);
  const __m256i sy = _mm256_sign_epi8(b, a);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

inline __m256i unpack_q4_0(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

float dot_q8_0_avx2(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ8_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    const __m256 d = _mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_avx2(qw, qx)), acc);
  }
  return hsum8(acc);
}

float dot_q4_0_avx2(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4_0*>(vw);
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i qw = unpack_q4_0(w[i].qs);
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    const __m256 d = _mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_avx2(qw, qx)), acc);
  }
  return hsum8(acc);
}

float dot_q4_k_avx2(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4K*>(vw);
  const auto* x = static_cast<const BlockQ8K*>(vx);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float acc_m = 0;
  for (int64_t i = 0; i < n / 256; ++i) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) q4k_scale_min(j, w[i].scales, &sc[j], &mn[j]);
    int summ = 0;
    for (int j = 0; j < 8; ++j) summ += mn[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * j));
      const __m256i lo = _mm256_and_si256(q4, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      const __m256i ylo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * j));
      const __m256i yhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * j + 32));
      const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_set1_epi16(sc[2 * j]));
      const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_set1_epi16(sc[2 * j + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    const float d = x[i].d * h2f(w[i].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    acc_m += x[i].d * h2f(w[i].dmin) * float(summ);
  }
  return hsum8(acc) - acc_m;
}

float dot_q6_k_avx2(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ6K*>(vw);
  const auto* x = static_cast<const BlockQ8K*>(vx);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 256; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w[i].ql + 64 * half;
      const int8_t* sc = w[i].scales + 8 * half;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qh + 32 * half));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
      for (int k = 0; k < 4; ++k) {
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 128 * half + 32 * k));
        const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], y), _mm256_maddubs_epi16(k32, y));
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

void quantize_q8_0_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float mx = _mm_cvtss_f32(m);
    y[i].d = uint16_t(_cvtss_sh(mx / 127.f, 0));
    const __m256 id = _mm256_set1_ps(mx != 0 ? 127.f / mx : 0.f);
    __m256i q[4];
    for (int k = 0; k < 4; ++k)
      q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // packs interleave 128-bit lanes; the permute restores element order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), p8);
  }
}

void axpy_f16_avx2(int64_t n, float a, const uint16_t* x, float* y) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * h2f(x[i]);
}

void f32_to_f16_row_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

// ---- 16-row repacked tiles (repack_x16) on AVX2 ----
// Int32 lane r of a register is row r of a group of eight, so 16 rows are two registers
// ("halves") and a block's dot for 8 rows needs no horizontal sums. Codes are split into
// 4-bit planes (0..15) and multiplied with maddubs (unsigned planes x signed activation
// bytes broadcast four at a time): a pair of products is at most 2 x 15 x 127 = 3,810, so
// eight maddubs results add up in int16 without saturating (30,480) before one madd
// widens them. Q8_0's unsigned codes (offset by 128) are low plane + 16 x high plane;
// both Q8_0 and Q4_0 correct for their unsigned codes with the activation sum (Q8Aux), as
// the scalar tile does. The integer block dots are therefore exact and equal the scalar
// ones; the float part is the same fma(float(dot), d_w x d_x, acc) per (row, token).

// One column of Q8_0 or Q4_0 codes split into planes: P[h][2k] = low nibbles and
// P[h][2k + 1] = high nibbles of code vector k, half h (rows 8h..8h+7). Batches split a
// column once into this buffer, which all their tokens read; one token (decode) splits
// the codes as it goes (PlanesDirect), saving the stores and loads.
template <bool Q8>
struct PlanesX16 {
  static constexpr int kVectors = Q8 ? 8 : 4;
  __m256i p[2][2 * kVectors];
  void split(const uint8_t* col) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < kVectors; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32 + 64 * k + 32 * h));
        p[h][2 * k] = _mm256_and_si256(v, m4);
        p[h][2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
  }
  // Low and high planes of code vector k, half h.
  void get(int h, int k, __m256i& lo, __m256i& hi) const {
    lo = p[h][2 * k];
    hi = p[h][2 * k + 1];
  }
};

struct PlanesDirect {
  const uint8_t* col;
  void get(int h, int k, __m256i& lo, __m256i& hi) const {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32 + 64 * k + 32 * h));
    lo = _mm256_and_si256(v, m4);
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  }
};

inline __m256i bcast4(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// The exact integer dot of one block for the 8 rows of half h: Q4_0 sums codes x
// activations (then -8 x sum), Q8_0 low planes + 16 x high planes (then -128 x sum).
template <bool Q8, typename Planes>
inline __m256i block_dot_x16(const Planes& pl, int h, const int8_t* q, __m256i bias) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (Q8) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i xv = bcast4(q + 4 * k);
      __m256i pl_lo, pl_hi;
      pl.get(h, k, pl_lo, pl_hi);
      lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(pl_lo, xv));
      hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(pl_hi, xv));
    }
    return _mm256_add_epi32(_mm256_add_epi32(bias, _mm256_madd_epi16(lo, ones)),
                            _mm256_madd_epi16(hi, _mm256_set1_epi16(16)));
  } else {
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m256i pl_lo, pl_hi;
      pl.get(h, k, pl_lo, pl_hi);
      s = _mm256_add_epi16(s, _mm256_maddubs_epi16(pl_lo, bcast4(q + 4 * k)));
      s = _mm256_add_epi16(s, _mm256_maddubs_epi16(pl_hi, bcast4(q + 16 + 4 * k)));
    }
    return _mm256_add_epi32(bias, _mm256_madd_epi16(s, ones));
  }
}

template <int NT, bool Q8>
void tile_x16_avx2_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kColumn = Q8 ? 16 * int64_t(sizeof(BlockQ8_0)) : 16 * int64_t(sizeof(BlockQ4_0));
  constexpr int64_t kAhead = (8192 + kColumn - 1) / kColumn;  // prefetch about 8 KiB ahead
  const int64_t nb = n / 32, aux_off = q8_0_aux_offset(n);
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  std::conditional_t<NT == 1, PlanesDirect, PlanesX16<Q8>> pl;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + kAhead * kColumn + o), _MM_HINT_T0);
    if constexpr (NT == 1) pl.col = col;
    else pl.split(col);
    const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
    const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16)));
    // One token at a time: unrolling the tokens let GCC interleave them and spill the
    // partial products (Q8_0 ran at a third of Q4_0's rate).
#pragma GCC unroll 1
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = x + t * xs;
      const int8_t* q = reinterpret_cast<const BlockQ8_0*>(xt)[b].qs;
      const Q8Aux* aux = reinterpret_cast<const Q8Aux*>(xt + aux_off) + b;
      const __m256i bias = _mm256_set1_epi32((Q8 ? -128 : -8) * aux->sum);
      const __m256 dx = _mm256_set1_ps(aux->d);
      acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot_x16<Q8>(pl, 0, q, bias)), _mm256_mul_ps(dw0, dx), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot_x16<Q8>(pl, 1, q, bias)), _mm256_mul_ps(dw1, dx), acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows_x16(acc[t][0], acc[t][1], nr, y + t * ldy);
}

void tile_q4_0_x16_avx2(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                        int64_t ldy) {
  with_token_count<8>(nt, [&](auto NT) { tile_x16_avx2_t<NT.value, false>(n, w, nr, x, xs, y, ldy); });
}

// Q8_0 batches: the sign trick, |w| x sign(x, w) per code vector (|w| <= 128, |x| <= 127:
// a pair is at most 32,512), one madd per vector. The column's signed codes and their
// absolute values are made once for all tokens. Kernel alone, one thread (2048 x 2048, 64
// tokens, thread CPU time): 44-47 GMAC/s against 37-39 for the nibble planes of Q4_0's
// kind, which need twice the maddubs and twice the buffer loads. One token (decode, bound
// by memory) keeps the nibble planes split in registers.
struct Q8SignPlanes {
  __m256i ws[2][8], aw[2][8];
  void split(const uint8_t* col) {
    const __m256i k80 = _mm256_set1_epi8(char(0x80));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 8; ++k) {
        const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32 + 64 * k + 32 * h)), k80);
        ws[h][k] = v;
        aw[h][k] = _mm256_abs_epi8(v);
      }
  }
};

inline __m256i block_dot_q8_sign(const Q8SignPlanes& pl, int h, const int8_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m256i xv = bcast4(q + 4 * k);
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(pl.aw[h][k], _mm256_sign_epi8(xv, pl.ws[h][k])), ones));
  }
  return s;
}

template <int NT>
void tile_q8_sign_avx2_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kColumn = 16 * int64_t(sizeof(BlockQ8_0));
  constexpr int64_t kAhead = (8192 + kColumn - 1) / kColumn;
  const int64_t nb = n / 32, aux_off = q8_0_aux_offset(n);
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  Q8SignPlanes pl;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + kAhead * kColumn + o), _MM_HINT_T0);
    pl.split(col);
    const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
    const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16)));
#pragma GCC unroll 1
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = x + t * xs;
      const int8_t* q = reinterpret_cast<const BlockQ8_0*>(xt)[b].qs;
      const Q8Aux* aux = reinterpret_cast<const Q8Aux*>(xt + aux_off) + b;
      const __m256 dx = _mm256_set1_ps(aux->d);
      acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot_q8_sign(pl, 0, q)), _mm256_mul_ps(dw0, dx), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot_q8_sign(pl, 1, q)), _mm256_mul_ps(dw1, dx), acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows_x16(acc[t][0], acc[t][1], nr, y + t * ldy);
}

void tile_q8_0_x16_avx2(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                       int64_t ldy) {
  if (nt == 1) return tile_x16_avx2_t<1, true>(n, w, nr, x, xs, y, ldy);
  with_token_count<8>(nt, [&](auto NT) { tile_q8_sign_avx2_t<NT.value>(n, w, nr, x, xs, y, ldy); });
}


// Repacked Q4_K (repack_x16): lane r is row r of a half. Per column the sub-block scales
// become int16 pairs (s, s) per lane, so one madd multiplies a sub-block's int16 partial
// dots by its scale and widens them; the mins term is four madds of (m_2k, m_2k+1) pairs
// with the activation's (bsums) pairs. A sub-block is 8 maddubs per half (at most 30,480
// per int16), so the integer sums are exact and the two FMAs per block follow the scalar
// tile. Decode (one token) splits the code nibbles as it goes; batches split them once per
// column into a buffer that all their tokens read.
struct Q4KColumnX16 {
  __m256i sc[2][8];   // per half and sub-block: the scale in both int16 of every lane
  __m256i mn[2][4];   // per half: mins (m_2k, m_2k+1) per lane
  __m256 dw[2], dmin[2];
};

inline void q4_k_column_x16(const uint8_t* col, Q4KColumnX16& c) {
  const __m256i m6 = _mm256_set1_epi32(63), m4d = _mm256_set1_epi32(0xF);
  for (int h = 0; h < 2; ++h) {
    c.dw[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16 * h)));
    c.dmin[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 32 + 16 * h)));
    __m256i S[12];
    for (int k = 0; k < 12; ++k)
      S[k] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(col + 64 + 16 * k + 8 * h)));
    __m256i sc[8], mn[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = _mm256_and_si256(S[j], m6);
      mn[j] = _mm256_and_si256(S[j + 4], m6);
      sc[j + 4] = _mm256_or_si256(_mm256_and_si256(S[j + 8], m4d), _mm256_slli_epi32(_mm256_srli_epi32(S[j], 6), 4));
      mn[j + 4] = _mm256_or_si256(_mm256_srli_epi32(S[j + 8], 4), _mm256_slli_epi32(_mm256_srli_epi32(S[j + 4], 6), 4));
    }
    for (int j = 0; j < 8; ++j) c.sc[h][j] = _mm256_or_si256(sc[j], _mm256_slli_epi32(sc[j], 16));
    for (int k = 0; k < 4; ++k) c.mn[h][k] = _mm256_or_si256(mn[2 * k], _mm256_slli_epi32(mn[2 * k + 1], 16));
  }
}

template <int NT>
void tile_q4_k_x16_avx2_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y,
                          int64_t ldy) {
  constexpr int64_t kColumn = 16 * int64_t(sizeof(BlockQ4K));
  constexpr bool kBuffered = NT > 1;
  const int64_t nb = n / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  Q4KColumnX16 cs;
  // planes[h][c][v][0/1]: low / high nibbles of code vector 8c + v, half h.
  __m256i planes[kBuffered ? 2 : 1][4][8][2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + 4 * kColumn + o), _MM_HINT_T0);
    q4_k_column_x16(col, cs);
    if constexpr (kBuffered)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 4; ++c)
          for (int v = 0; v < 8; ++v) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 256 + 64 * (8 * c + v) + 32 * h));
            planes[h][c][v][0] = _mm256_and_si256(q, m4);
            planes[h][c][v][1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8K& xb = reinterpret_cast<const BlockQ8K*>(x + t * xs)[b];
      __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int c = 0; c < 4; ++c) {
        __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, hi[2] = {lo[0], lo[0]};
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) {
          const __m256i xl = bcast4(xb.qs + 64 * c + 4 * v), xh = bcast4(xb.qs + 64 * c + 32 + 4 * v);
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            __m256i pl, ph;
            if constexpr (kBuffered) {
              pl = planes[h][c][v][0];
              ph = planes[h][c][v][1];
            } else {
              const __m256i q =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 256 + 64 * (8 * c + v) + 32 * h));
              pl = _mm256_and_si256(q, m4);
              ph = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
            lo[h] = _mm256_add_epi16(lo[h], _mm256_maddubs_epi16(pl, xl));
            hi[h] = _mm256_add_epi16(hi[h], _mm256_maddubs_epi16(ph, xh));
          }
        }
        for (int h = 0; h < 2; ++h)
          sumi[h] = _mm256_add_epi32(sumi[h], _mm256_add_epi32(_mm256_madd_epi16(lo[h], cs.sc[h][2 * c]),
                                                               _mm256_madd_epi16(hi[h], cs.sc[h][2 * c + 1])));
      }
      const __m256 dx = _mm256_set1_ps(xb.d);
      for (int h = 0; h < 2; ++h) {
        __m256i summ = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
          const int32_t bs0 = xb.bsums[4 * k] + xb.bsums[4 * k + 1], bs1 = xb.bsums[4 * k + 2] + xb.bsums[4 * k + 3];
          const __m256i bp = _mm256_set1_epi32(int32_t(uint32_t(uint16_t(bs0)) | (uint32_t(uint16_t(bs1)) << 16)));
          summ = _mm256_add_epi32(summ, _mm256_madd_epi16(cs.mn[h][k], bp));
        }
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[h]), _mm256_mul_ps(cs.dw[h], dx), acc[t][h]);
        acc[t][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(cs.dmin[h], dx), acc[t][h]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) store_rows_x16(acc[t][0], acc[t][1], nr, y + t * ldy);
}

void tile_q4_k_x16_avx2(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                        int64_t ldy) {
  with_token_count<8>(nt, [&](auto NT) { tile_q4_k_x16_avx2_t<NT.value>(n, w, nr, x, xs, y, ldy); });
}

// Repacked F16 against the f32 copy of f16 activations (widen_f16): lane r is row r of a
// half, each column one conversion per half and one FMA per half and token into running
// sum c mod 3, then (s0 + s1) + s2: the scalar tile's operations per (row, token). Two
// tokens at a time (12 accumulators of the 16 registers); weights prefetched 16 KiB ahead.
template <int NT>
void tile_f16_x16_avx2_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kAhead = 512;
  const uint16_t* wh = reinterpret_cast<const uint16_t*>(w);
  const float* xf[NT];
  for (int t = 0; t < NT; ++t) xf[t] = reinterpret_cast<const float*>(x + t * xs + f16_copy_offset(n));
  __m256 a[NT][2][3];
  for (int t = 0; t < NT; ++t)
    for (int h = 0; h < 2; ++h) a[t][h][0] = a[t][h][1] = a[t][h][2] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 3 <= n; c += 3) {
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * (c + kAhead)), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * (c + kAhead + 2)), _MM_HINT_T0);
#pragma GCC unroll 3
    for (int q = 0; q < 3; ++q) {
      const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + 16 * (c + q))));
      const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + 16 * (c + q) + 8)));
#pragma GCC unroll 2
      for (int t = 0; t < NT; ++t) {
        const __m256 xv = _mm256_set1_ps(xf[t][c + q]);
        a[t][0][q] = _mm256_fmadd_ps(w0, xv, a[t][0][q]);
        a[t][1][q] = _mm256_fmadd_ps(w1, xv, a[t][1][q]);
      }
    }
  }
  for (int q = 0; c < n; ++c, ++q) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + 16 * c)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + 16 * c + 8)));
    for (int t = 0; t < NT; ++t) {
      const __m256 xv = _mm256_set1_ps(xf[t][c]);
      a[t][0][q] = _mm256_fmadd_ps(w0, xv, a[t][0][q]);
      a[t][1][q] = _mm256_fmadd_ps(w1, xv, a[t][1][q]);
    }
  }
  for (int t = 0; t < NT; ++t)
    store_rows_x16(_mm256_add_ps(_mm256_add_ps(a[t][0][0], a[t][0][1]), a[t][0][2]),
                   _mm256_add_ps(_mm256_add_ps(a[t][1][0], a[t][1][1]), a[t][1][2]), nr, y + t * ldy);
}

void tile_f16_x16_avx2(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                       int64_t ldy) {
  for (int t0 = 0; t0 < nt; t0 += 2) {
    if (nt - t0 >= 2) tile_f16_x16_avx2_t<2>(n, w, nr, x + t0 * xs, xs, y + t0 * ldy, ldy);
    else tile_f16_x16_avx2_t<1>(n, w, nr, x + t0 * xs, xs, y + t0 * ldy, ldy);
  }
}

void widen_f16_avx2(const uint16_t* h, float* f, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, load_f16x8(h + i));
  for (; i < n; ++i) f[i] = h2f(h[i]);
}

// g_i = g_i sigmoid(g_i) u_i with e = exp(-|g_i|): sigmoid is 1 / (1 + e) for g_i >= 0
// and e / (1 + e) below (as the AVX-512 version).
void silu_mul_avx2(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(x, sign));  // -|x|
    const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
  }
  if (i < n) silu_mul_scalar(g + i, u + i, n - i);
}

// Per lane the first largest value and its index (NaN lanes never win a comparison; a
// lane's first -inf counts), then the largest over the lanes, the lowest index among
// equals, then the tail.
int64_t argmax_avx2(const float* x, int64_t n) {
  if (n >= (int64_t(1) << 31) || n < 8) return argmax_scalar(x, n);
  __m256 best = _mm256_set1_ps(-INFINITY);
  __m256i at = _mm256_set1_epi32(-1), idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8), none_v = _mm256_set1_epi32(-1);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 none = _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, none_v));
    const __m256 gt = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                                   _mm256_and_ps(none, _mm256_cmp_ps(v, best, _CMP_EQ_OQ)));
    best = _mm256_blendv_ps(best, v, gt);
    at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(idx), gt));
    idx = _mm256_add_epi32(idx, step);
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bi), at);
  int64_t r = -1;
  for (int j = 0; j < 8; ++j)
    if (bi[j] >= 0 && (r < 0 || bv[j] > x[r] || (bv[j] == x[r] && bi[j] < r))) r = bi[j];
  for (; i < n; ++i)
    if (!std::isnan(x[i]) && (r < 0 || x[i] > x[r])) r = i;
  return r < 0 ? 0 : r;
}

}  // namespace
#pragma GCC pop_options

namespace {
// Word indices of the permutes that gather four Q8_0 or Q4_0 blocks (see the AVX-512
// VNNI tiles below). constexpr data, not a static object: nothing here runs at start-up,
// so no AVX-512 code can run on a CPU without it.
struct GroupIndex {
  alignas(64) uint16_t q8_lo[32], q8_hi[32], q8_d[32], q4_qs[32], q4_d[32];
};
constexpr GroupIndex make_group_index() {
  GroupIndex g{};
  for (int j = 0; j < 32; ++j) {
    const int b = j / 8, k = j % 8;
    g.q8_lo[j] = uint16_t(17 * b + 1 + k);  // words of a 34-byte block: d, then 16 of codes
    g.q8_hi[j] = uint16_t(17 * b + 5 + k);  // second half, from a window starting 4 words later
    g.q4_qs[j] = uint16_t(9 * b + 1 + k);   // words of an 18-byte block: d, then 8 of codes
    g.q8_d[j] = uint16_t(j < 16 ? 17 * (j / 4) : 0);
    g.q4_d[j] = uint16_t(j < 16 ? 9 * (j / 4) : 0);
  }
  return g;
}
constexpr GroupIndex kGroupIndex = make_group_index();

}  // namespace

// ---------------- AVX-512 VNNI kernels (256-bit vectors, dpbusd) ----------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* operands that -Wuninitialized
// reports as false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "simd_exp.h"  // exp_nonpositive: the SiLU's sigmoid

namespace {

// Tiles of NR weight rows x NT activation rows over Q8_0 activations, four blocks (128
// elements) per step in 512-bit registers. Blocks stay in their GGUF layout: word
// permutes gather the first and the second 16 codes of four blocks into two registers, so
// dpbusd's int32 lanes 4b..4b+3 of register "lo" hold codes 0..15 of block b, and the f16
// scales are spread over the four lanes of their block. dpbusd multiplies unsigned by
// signed bytes: activations are offset by 128 (x ^ 0x80) and the weight rows start their
// accumulator at -128 x their code sums, so Q8_0 and Q4_0 (codes - 8) share one loop.
// Each (row, token) pair has its own accumulator and sees the same instructions in the
// same order whatever the tile shape, so batched prefill and one-token decode give
// bit-identical results.

constexpr int64_t kQ8Group = 4 * int64_t(sizeof(BlockQ8_0));  // 136 bytes
constexpr int64_t kQ4Group = 4 * int64_t(sizeof(BlockQ4_0));  // 72 bytes

struct Group {
  __m512i lo, hi;  // codes 0..15 and 16..31 of four blocks, 16 bytes per block
  __m512 d;        // block scale, one per int32 lane
};

// Reads exactly the 136 bytes of four Q8_0 blocks (the last load ends at the group's end).
inline Group load_q8_0_group(const uint8_t* p) {
  const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
  const __m512i a4 = _mm512_loadu_si512(p + 8), b4 = _mm512_loadu_si512(p + 72);
  Group g;
  g.lo = _mm512_permutex2var_epi16(a, _mm512_load_si512(kGroupIndex.q8_lo), b);
  g.hi = _mm512_permutex2var_epi16(a4, _mm512_load_si512(kGroupIndex.q8_hi), b4);
  g.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(a, _mm512_load_si512(kGroupIndex.q8_d), b)));
  return g;
}

// Turns unsigned Q4_0 codes into signed ones and gives their weight-side bias.
inline void q4_0_bias_and_codes(Group& g, __m512i& bias) {
  // -128 x sum(code - 8) over the eight codes of a lane = 8192 - 128 x sum(code).
  const __m512i kneg128 = _mm512_set1_epi8(char(-128)), k8 = _mm512_set1_epi8(8);
  bias = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_set1_epi32(8192), g.lo, kneg128), g.hi, kneg128);
  g.lo = _mm512_sub_epi8(g.lo, k8);
  g.hi = _mm512_sub_epi8(g.hi, k8);
}

// Four Q4_0 blocks as unsigned codes 0..15 (the masked load stops at the group's end).
inline Group load_q4_0_group_u(const uint8_t* p) {
  const __m512i a = _mm512_loadu_si512(p), b = _mm512_maskz_loadu_epi16(0xF, p + 64);
  const __m512i q = _mm512_permutex2var_epi16(a, _mm512_load_si512(kGroupIndex.q4_qs), b);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  Group g;
  g.lo = _mm512_and_si512(q, m4);
  g.hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
  g.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(kGroupIndex.q4_d), a)));
  return g;
}

// A Q8_0 activation group as the tiles consume it: codes offset by 128, scales per lane.
inline Group activation_group(const uint8_t* blocks) {
  const __m512i k80 = _mm512_set1_epi8(char(0x80));
  Group v = load_q8_0_group(blocks);
  v.lo = _mm512_xor_si512(v.lo, k80);
  v.hi = _mm512_xor_si512(v.hi, k80);
  return v;
}

constexpr int64_t kUnpackedGroup = int64_t(sizeof(Group));  // 192 bytes per 128 values
static_assert(sizeof(Group) == 192);

// The unpacked copy of a row of Q8_0 activations that quantize_act_row appends after the
// blocks, so that the tiles, which see every activation row once per group of weight rows,
// do not redo the permutes each time.
void unpack_q8_0_vnni(const void* blocks, void* dst, int64_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(blocks);
  for (int64_t g = 0; g < n / 128; ++g) {
    const Group v = activation_group(b + g * kQ8Group);
    uint8_t* o = static_cast<uint8_t*>(dst) + g * kUnpackedGroup;
    _mm512_storeu_si512(o, v.lo);
    _mm512_storeu_si512(o + 64, v.hi);
    _mm512_storeu_ps(o + 128, v.d);
  }
}

// Unpacked: activation rows carry the unpacked groups after their blocks (quantize_act_row
// of this kernel set); otherwise the groups are unpacked from the blocks on the fly. Both
// feed the same values to the same instructions, so the results are bit-identical.
template <int NR, int NT, bool Q4, bool Unpacked>
void tile_q_vnni_t(int64_t nb, const uint8_t* w, int64_t ws, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kGroupBytes = Q4 ? kQ4Group : kQ8Group;
  __m512 acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i k80 = _mm512_set1_epi8(char(0x80)), zero = _mm512_setzero_si512();
  const int64_t ng = nb / 4;
  const uint8_t* xu = x + nb * int64_t(sizeof(BlockQ8_0));
  for (int64_t g = 0; g < ng; ++g) {
    Group xg[NT];
    if constexpr (!Unpacked)
      for (int t = 0; t < NT; ++t) xg[t] = activation_group(x + t * xs + g * kQ8Group);
    for (int r = 0; r < NR; ++r) {
      const uint8_t* wp = w + r * ws + g * kGroupBytes;
      // Rows are short streams (a few KB) that the hardware prefetchers barely catch;
      // fetch the same place in the rows the next tile of the matmul reads.
      for (int64_t o = 0; o < kGroupBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(wp + 2 * NR * ws + o), _MM_HINT_T0);
      Group wg;
      __m512i bias;
      if constexpr (Q4) {
        wg = load_q4_0_group_u(wp);
        q4_0_bias_and_codes(wg, bias);
      } else {
        wg = load_q8_0_group(wp);
        bias = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, k80, wg.lo), k80, wg.hi));
      }
      for (int t = 0; t < NT; ++t) {
        __m512i xlo, xhi;
        __m512 xd;
        if constexpr (Unpacked) {
          // Rows need not be 64-byte aligned: unaligned loads.
          const uint8_t* xp = xu + t * xs + g * kUnpackedGroup;
          xlo = _mm512_loadu_si512(xp);
          xhi = _mm512_loadu_si512(xp + 64);
          xd = _mm512_loadu_ps(xp + 128);
        } else {
          xlo = xg[t].lo;
          xhi = xg[t].hi;
          xd = xg[t].d;
        }
        const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, xlo, wg.lo), xhi, wg.hi);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(wg.d, xd), acc[r][t]);
      }
    }
  }
  // The blocks after the last whole group, one at a time in 256-bit registers.
  const __m256i k80y = _mm256_set1_epi8(char(0x80)), zeroy = _mm256_setzero_si256();
  for (int64_t i = ng * 4; i < nb; ++i) {
    for (int r = 0; r < NR; ++r) {
      __m256i wq;
      float wd;
      if constexpr (Q4) {
        const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(w + r * ws) + i;
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
        wq = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F)),
                             _mm256_set1_epi8(8));
        wd = _cvtsh_ss(b->d);
      } else {
        const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + i;
        wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
        wd = _cvtsh_ss(b->d);
      }
      const __m256i bias = _mm256_sub_epi32(zeroy, _mm256_dpbusd_epi32(zeroy, k80y, wq));
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_0* c = reinterpret_cast<const BlockQ8_0*>(x + t * xs) + i;
        const __m256i xu = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c->qs)), k80y);
        const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(bias, xu, wq)),
                                       _mm256_set1_ps(wd * _cvtsh_ss(c->d)));
        acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_zextps256_ps512(v));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int NR, int NT>
void tile_q8_0_vnni_t(int64_t nb, const uint8_t* w, int64_t ws, const uint8_t* x, int64_t xs, float* y,
                      int64_t ldy) {
  tile_q_vnni_t<NR, NT, false, true>(nb, w, ws, x, xs, y, ldy);
}

template <int NR, int NT>
void tile_q4_0_vnni_t(int64_t nb, const uint8_t* w, int64_t ws, const uint8_t* x, int64_t xs, float* y,
                      int64_t ldy) {
  tile_q_vnni_t<NR, NT, true, true>(nb, w, ws, x, xs, y, ldy);
}
#define SLIM_TILE_SWITCH(fn)                                                         \
  switch (nr * 8 + nt) {                                                             \
    case 8 + 1: return fn<1, 1>(nb, w, ws, x, xs, y, ldy);                           \
    case 8 + 2: return fn<1, 2>(nb, w, ws, x, xs, y, ldy);                           \
    case 8 + 3: return fn<1, 3>(nb, w, ws, x, xs, y, ldy);                           \
    case 8 + 4: return fn<1, 4>(nb, w, ws, x, xs, y, ldy);                           \
    case 16 + 1: return fn<2, 1>(nb, w, ws, x, xs, y, ldy);                          \
    case 16 + 2: return fn<2, 2>(nb, w, ws, x, xs, y, ldy);                          \
    case 16 + 3: return fn<2, 3>(nb, w, ws, x, xs, y, ldy);                          \
    case 16 + 4: return fn<2, 4>(nb, w, ws, x, xs, y, ldy);                          \
    case 24 + 1: return fn<3, 1>(nb, w, ws, x, xs, y, ldy);                          \
    case 24 + 2: return fn<3, 2>(nb, w, ws, x, xs, y, ldy);                          \
    case 24 + 3: return fn<3, 3>(nb, w, ws, x, xs, y, ldy);                          \
    case 24 + 4: return fn<3, 4>(nb, w, ws, x, xs, y, ldy);                          \
    case 32 + 1: return fn<4, 1>(nb, w, ws, x, xs, y, ldy);                          \
    case 32 + 2: return fn<4, 2>(nb, w, ws, x, xs, y, ldy);                          \
    case 32 + 3: return fn<4, 3>(nb, w, ws, x, xs, y, ldy);                          \
    case 32 + 4: return fn<4, 4>(nb, w, ws, x, xs, y, ldy);                          \
    default: return;                                                                 \
  }

void tile_q8_0_vnni(int64_t n, const uint8_t* w, int64_t ws, int nr, const uint8_t* x, int64_t xs, int nt,
                    float* y, int64_t ldy) {
  const int64_t nb = n / 32;
  SLIM_TILE_SWITCH(tile_q8_0_vnni_t)
}

void tile_q4_0_vnni(int64_t n, const uint8_t* w, int64_t ws, int nr, const uint8_t* x, int64_t xs, int nt,
                    float* y, int64_t ldy) {
  const int64_t nb = n / 32;
  SLIM_TILE_SWITCH(tile_q4_0_vnni_t)
}
#undef SLIM_TILE_SWITCH

// Repacked weights (repack_x16): int32 lane r is row r of the group, so a block's dot for
// 16 rows is eight dpbusd of code vectors with one activation dword broadcast from memory
// each, and needs no horizontal sums. The codes of a column are loaded (and for Q4_0
// split into nibbles) once for all NT tokens.
template <int NT, bool Q8>
void tile_x16_vnni_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kColumn = Q8 ? 16 * int64_t(sizeof(BlockQ8_0)) : 16 * int64_t(sizeof(BlockQ4_0));
  // Prefetch about 8 KiB ahead (Q8_0: 16 columns, Q4_0: 29). Four columns ahead (2.2 /
  // 1.2 KiB) left decode waiting on memory: Q8_0 shared model 2,240 -> 2,630 tokens/s,
  // a 1 B Q4_0 model 38.8 -> 42.2 (one sequence, 1 thread, alternating runs).
  constexpr int64_t kAhead = (8192 + kColumn - 1) / kColumn;
  const int64_t nb = n / 32, aux_off = q8_0_aux_offset(n);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + kAhead * kColumn + o), _MM_HINT_T0);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
    __m512i c[8];  // codes 4k..4k+3 of every row in vector k
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(col + 32 + 64 * k);
      if constexpr (Q8) {
        c[k] = v;
        c[k + 4] = _mm512_loadu_si512(col + 32 + 64 * (k + 4));
      } else {
        c[k] = _mm512_and_si512(v, m4);
        c[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = x + t * xs;
      const int8_t* q = reinterpret_cast<const BlockQ8_0*>(xt)[b].qs;
      const Q8Aux* aux = reinterpret_cast<const Q8Aux*>(xt + aux_off) + b;
      __m512i s = _mm512_set1_epi32((Q8 ? -128 : -8) * aux->sum);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        int32_t v;
        std::memcpy(&v, q + 4 * k, 4);
        s = _mm512_dpbusd_epi32(s, c[k], _mm512_set1_epi32(v));
      }
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(aux->d)), acc[t]);
    }
  }
  const __mmask16 m = __mmask16((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

template <bool Q8>
void tile_x16_vnni(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                   int64_t ldy) {
  with_token_count<8>(nt, [&](auto NT) { tile_x16_vnni_t<NT.value, Q8>(n, w, nr, x, xs, y, ldy); });
}

// Repacked Q6_K (repack_x16): lane r is row r. A column goes in four chunks of 16 code
// vectors (4 consecutive codes of each row), built once for all NT tokens from 8 ql and 4 qh
// vectors; each token's sub-block dot is 4 dpbusd started at -32 x the activations' sum
// (the codes are stored +32), weighted by the rows' scale.
template <int NT>
void tile_q6_k_x16_vnni_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y,
                          int64_t ldy) {
  constexpr int64_t kColumn = 16 * int64_t(sizeof(BlockQ6K));
  const int64_t nb = n / 256;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + 2 * kColumn + o), _MM_HINT_T0);
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 2; ++g) {
        // c[k][i]: elements 128h + 32k + 16g + 4i .. +3, sub-block 8h + 2k + g.
        __m512i c[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512i l1 = _mm512_loadu_si512(col + 288 + 64 * (16 * h + 4 * g + i));
          const __m512i l2 = _mm512_loadu_si512(col + 288 + 64 * (16 * h + 4 * g + i + 8));
          const __m512i qh = _mm512_loadu_si512(col + 2336 + 64 * (8 * h + 4 * g + i));
          c[0][i] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
          c[1][i] = _mm512_or_si512(_mm512_and_si512(l2, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
          c[2][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(qh, m30));
          c[3][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l2, 4), m4),
                                    _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
        }
        __m512i sc[4];
        for (int k = 0; k < 4; ++k)
          sc[k] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 32 + 16 * (8 * h + 2 * k + g))));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const BlockQ8K& xb = reinterpret_cast<const BlockQ8K*>(x + t * xs)[b];
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            const int8_t* qx = xb.qs + 128 * h + 32 * k + 16 * g;
            __m512i dk = _mm512_set1_epi32(-32 * xb.bsums[8 * h + 2 * k + g]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
              int32_t a;
              std::memcpy(&a, qx + 4 * i, 4);
              dk = _mm512_dpbusd_epi32(dk, c[k][i], _mm512_set1_epi32(a));
            }
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(dk, sc[k]));
          }
        }
      }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
    for (int t = 0; t < NT; ++t) {
      const __m512 dx = _mm512_set1_ps(reinterpret_cast<const BlockQ8K*>(x + t * xs)[b].d);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, dx), acc[t]);
    }
  }
  const __mmask16 m = __mmask16((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

void tile_q6_k_x16_vnni(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                        int64_t ldy) {
  for (int t0 = 0; t0 < nt; t0 += 4)
    with_token_count<4>(std::min(4, nt - t0), [&](auto NT) {
      tile_q6_k_x16_vnni_t<NT.value>(n, w, nr, x + t0 * xs, xs, y + t0 * ldy, ldy);
    });
}

// Repacked Q4_K (repack_x16): lane r is row r. Per column the 16 rows' sub-block scales
// and mins are unpacked once into int32 vectors; each token's sub-block dot is 4 dpbusd
// (32 codes per row), weighted by its scale, and the mins term comes from the
// activation block's sums.
template <int NT>
void tile_q4_k_x16_vnni_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y,
                          int64_t ldy) {
  constexpr int64_t kColumn = 16 * int64_t(sizeof(BlockQ4K));
  const int64_t nb = n / 256;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi32(63), m4d = _mm512_set1_epi32(0xF);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = w + b * kColumn;
    for (int64_t o = 0; o < kColumn; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(col + 2 * kColumn + o), _MM_HINT_T0);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 32)));
    __m512i S[12];
    for (int k = 0; k < 12; ++k)
      S[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 64 + 16 * k)));
    __m512i sc[8], mn[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = _mm512_and_si512(S[j], m6);
      mn[j] = _mm512_and_si512(S[j + 4], m6);
      sc[j + 4] = _mm512_or_si512(_mm512_and_si512(S[j + 8], m4d), _mm512_slli_epi32(_mm512_srli_epi32(S[j], 6), 4));
      mn[j + 4] = _mm512_or_si512(_mm512_srli_epi32(S[j + 8], 4), _mm512_slli_epi32(_mm512_srli_epi32(S[j + 4], 6), 4));
    }
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i lo[8], hi[8];
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        const __m512i q = _mm512_loadu_si512(col + 256 + 64 * (8 * c + v));
        lo[v] = _mm512_and_si512(q, m4);
        hi[v] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      }
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const int8_t* qx = reinterpret_cast<const BlockQ8K*>(x + t * xs)[b].qs + 64 * c;
        __m512i dl = _mm512_setzero_si512(), dh = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) {
          int32_t a, h;
          std::memcpy(&a, qx + 4 * v, 4);
          std::memcpy(&h, qx + 32 + 4 * v, 4);
          dl = _mm512_dpbusd_epi32(dl, lo[v], _mm512_set1_epi32(a));
          dh = _mm512_dpbusd_epi32(dh, hi[v], _mm512_set1_epi32(h));
        }
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(dl, sc[2 * c]),
                                                             _mm512_mullo_epi32(dh, sc[2 * c + 1])));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8K& xb = reinterpret_cast<const BlockQ8K*>(x + t * xs)[b];
      __m512i summ = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j)
        summ = _mm512_add_epi32(summ, _mm512_mullo_epi32(mn[j], _mm512_set1_epi32(xb.bsums[2 * j] + xb.bsums[2 * j + 1])));
      const __m512 dx = _mm512_set1_ps(xb.d);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, dx), acc[t]);
    }
  }
  const __mmask16 m = __mmask16((1u << nr) - 1);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

void tile_q4_k_x16_vnni(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                        int64_t ldy) {
  for (int t0 = 0; t0 < nt; t0 += 4) {
    const uint8_t* xt = x + t0 * xs;
    float* yt = y + t0 * ldy;
    with_token_count<4>(std::min(4, nt - t0),
                        [&](auto NT) { tile_q4_k_x16_vnni_t<NT.value>(n, w, nr, xt, xs, yt, ldy); });
  }
}

inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// F16 weights against NT activation rows, 64 products per step in four independent
// 16-lane accumulators per row (ggml's F16 step on AVX-512), so the FMA latency is hidden.
// X = uint16_t reads f16 activations (the single dot); X = float reads their f32 copies
// (widen_f16), so each weight vector is converted once for all NT tokens and the
// activations not at all. Either way every (row, token) pair sees the same operations in
// the same order, so the F16 tiles are bit-identical to the dot whatever their shape.
template <typename X>
inline __m512 load_x16(const X* p) {
  if constexpr (std::is_same_v<X, float>) return _mm512_loadu_ps(p);
  else return load_f16x16(p);
}
inline float x_value(const float* p) { return *p; }
inline float x_value(const uint16_t* p) { return _cvtsh_ss(*p); }

template <int NT, typename X>
void row_f16_avx512(int64_t n, const uint16_t* w, const X* const* x, float* y, int64_t ldy) {
  __m512 a[NT][4];
  for (int t = 0; t < NT; ++t)
    for (int q = 0; q < 4; ++q) a[t][q] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int q = 0; q < 4; ++q) {
      const __m512 wv = load_f16x16(w + i + 16 * q);
      for (int t = 0; t < NT; ++t) a[t][q] = _mm512_fmadd_ps(wv, load_x16(x[t] + i + 16 * q), a[t][q]);
    }
  for (; i + 16 <= n; i += 16) {
    const __m512 wv = load_f16x16(w + i);
    for (int t = 0; t < NT; ++t) a[t][0] = _mm512_fmadd_ps(wv, load_x16(x[t] + i), a[t][0]);
  }
  for (int t = 0; t < NT; ++t) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])));
    for (int64_t j = i; j < n; ++j) s += _cvtsh_ss(w[j]) * x_value(x[t] + j);
    y[t * ldy] = s;
  }
}

float dot_f16_avx512(int64_t n, const void* vw, const void* vx) {
  const uint16_t* x[1] = {static_cast<const uint16_t*>(vx)};
  float y;
  row_f16_avx512<1>(n, static_cast<const uint16_t*>(vw), x, &y, 0);
  return y;
}

void tile_f16_avx512(int64_t n, const uint8_t* w, int64_t ws, int nr, const uint8_t* x, int64_t xs, int nt,
                     float* y, int64_t ldy) {
  const float* xf[4];
  for (int t = 0; t < nt; ++t) xf[t] = reinterpret_cast<const float*>(x + t * xs + f16_copy_offset(n));
  for (int r = 0; r < nr; ++r) {
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w + r * ws);
    with_token_count<4>(nt, [&](auto NT) { row_f16_avx512<NT.value>(n, wr, xf, y + r, ldy); });
  }
}

// g_i = silu(g_i) u_i = g_i sigmoid(g_i) u_i with e = exp(-|g_i|): sigmoid is 1 / (1 + e)
// for g_i >= 0 and e / (1 + e) below (within 1e-7 relative of the scalar std::exp form).
void silu_mul_avx512(float* g, const float* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __m512 sig = _mm512_mask_mul_ps(inv, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), e, inv);
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

// Per lane the first largest value and its index (NaN lanes start at -inf and never win
// a comparison), then the largest over the lanes, the lowest index among equals.
int64_t argmax_avx512(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __m512i at = _mm512_set1_epi32(-1), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  if (n >= (int64_t(1) << 31)) return argmax_scalar(x, n);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    // Strictly greater (ordered: false for NaN), or a lane's first -inf.
    const __mmask16 none = _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(-1));
    const __mmask16 gt =
        _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ) | _mm512_mask_cmp_ps_mask(m & none, v, best, _CMP_EQ_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    at = _mm512_mask_mov_epi32(at, gt, idx);
    idx = _mm512_add_epi32(idx, step);
  }
  alignas(64) float bv[16];
  alignas(64) int32_t bi[16];
  _mm512_store_ps(bv, best);
  _mm512_store_si512(bi, at);
  int64_t r = -1;
  for (int j = 0; j < 16; ++j)
    if (bi[j] >= 0 && (r < 0 || bv[j] > x[r] || (bv[j] == x[r] && bi[j] < r))) r = bi[j];
  return r < 0 ? 0 : r;
}

void widen_f16_avx512(const uint16_t* h, float* f, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(f + i, load_f16x16(h + i));
  for (; i < n; ++i) f[i] = _cvtsh_ss(h[i]);
}

// Repacked F16 (repack_x16), GR consecutive groups of 16 rows: lane r is row r, so each
// column is one conversion and one FMA per group and token with the token's value broadcast (from its f32 copy, see widen_f16), and
// no horizontal sums. Three accumulators per token (column c to c mod 3), the same
// operations per (row, token) as the scalar tile whatever NT is. Three is the count that
// serves both ends: one token needs three or more independent FMA chains (two: 32
// against 42 GMAC/s in cache, and decode 4-5 % slower), and eight tokens need the 24
// accumulators and the weight vector to fit the 32 registers (four sums spilled: 83
// against 93 GMAC/s for 16 rows x 8 tokens in cache).
//
// Weights are prefetched 16 KiB (512 columns) ahead, into the next group of rows at the
// end of a group (groups are contiguous). 1 KiB ahead left decode waiting on memory;
// alternating runs on the shared model, 1 thread: one sequence 1,047 -> 1,406 tokens/s,
// eight 2,610 -> 2,900 (8 KiB and 32 KiB ahead were slower than 16).
template <int NT, int GR>
void tile_f16_groups_t(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, float* y, int64_t ldy) {
  constexpr int64_t kAhead = 512;
  const uint16_t* wg[GR];  // the groups are consecutive: 16 rows of n values each
  for (int g = 0; g < GR; ++g) wg[g] = reinterpret_cast<const uint16_t*>(w) + 16 * n * g;
  const float* xf[NT];
  for (int t = 0; t < NT; ++t) xf[t] = reinterpret_cast<const float*>(x + t * xs + f16_copy_offset(n));
  __m512 a[GR][NT][3];
  for (int g = 0; g < GR; ++g)
    for (int t = 0; t < NT; ++t) a[g][t][0] = a[g][t][1] = a[g][t][2] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 3 <= n; c += 3) {
#pragma GCC unroll 2
    for (int g = 0; g < GR; ++g) {
      _mm_prefetch(reinterpret_cast<const char*>(wg[g] + 16 * (c + kAhead)), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wg[g] + 16 * (c + kAhead + 2)), _MM_HINT_T0);
    }
#pragma GCC unroll 3
    for (int q = 0; q < 3; ++q) {
      __m512 wv[GR];
#pragma GCC unroll 2
      for (int g = 0; g < GR; ++g) wv[g] = load_f16x16(wg[g] + 16 * (c + q));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_set1_ps(xf[t][c + q]);
#pragma GCC unroll 2
        for (int g = 0; g < GR; ++g) a[g][t][q] = _mm512_fmadd_ps(wv[g], xv, a[g][t][q]);
      }
    }
  }
  for (int q = 0; c < n; ++c, ++q)
    for (int g = 0; g < GR; ++g) {
      const __m512 wv = load_f16x16(wg[g] + 16 * c);
      for (int t = 0; t < NT; ++t) a[g][t][q] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xf[t][c]), a[g][t][q]);
    }
  for (int g = 0; g < GR; ++g) {
    const int rows = std::min(16, nr - 16 * g);
    const __mmask16 m = __mmask16((1u << rows) - 1);
    for (int t = 0; t < NT; ++t)
      _mm512_mask_storeu_ps(y + t * ldy + 16 * g, m, _mm512_add_ps(_mm512_add_ps(a[g][t][0], a[g][t][1]), a[g][t][2]));
  }
}

// Two consecutive groups (32 rows, GR = 2) against up to 4 tokens: each token's broadcast
// serves two weight vectors, 6 loads per 8 FMAs against 9 for 16 rows x 8 tokens (both
// fill 24 accumulators). Per (row, token) the same operations, so the same bits.
void tile_f16_x32_avx512(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                         int64_t ldy) {
  with_token_count<4>(nt, [&](auto NT) { tile_f16_groups_t<NT.value, 2>(n, w, nr, x, xs, y, ldy); });
}

void tile_f16_x16_avx512(int64_t n, const uint8_t* w, int nr, const uint8_t* x, int64_t xs, int nt, float* y,
                         int64_t ldy) {
  with_token_count<8>(nt, [&](auto NT) { tile_f16_groups_t<NT.value, 1>(n, w, nr, x, xs, y, ldy); });
}

float dot_q8_0_vnni(int64_t n, const void* vw, const void* vx) {
  float y;
  tile_q_vnni_t<1, 1, false, false>(n / 32, static_cast<const uint8_t*>(vw), 0, static_cast<const uint8_t*>(vx), 0,
                                    &y, 0);
  return y;
}

float dot_q4_0_vnni(int64_t n, const void* vw, const void* vx) {
  float y;
  tile_q_vnni_t<1, 1, true, false>(n / 32, static_cast<const uint8_t*>(vw), 0, static_cast<const uint8_t*>(vx), 0,
                                   &y, 0);
  return y;
}

float dot_q4_k_vnni(int64_t n, const void* vw, const void* vx) {
  const auto* w = static_cast<const BlockQ4K*>(vw);
  const auto* x = static_cast<const BlockQ8K*>(vx);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float acc_m = 0;
  for (int64_t i = 0; i < n / 256; ++i) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) q4k_scale_min(j, w[i].scales, &sc[j], &mn[j]);
    int summ = 0;
    for (int j = 0; j < 8; ++j) summ += mn[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * j));
      const __m256i lo = _mm256_and_si256(q4, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      const __m256i ylo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * j));
      const __m256i yhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * j + 32));
      const __m256i plo = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, ylo);
      const __m256i phi = _mm256_dpbusd_epi32(_mm256_setzero_si256(), hi, yhi);
      sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(plo, _mm256_set1_epi32(sc[2 * j])));
      sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(phi, _mm256_set1_epi32(sc[2 * j + 1])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * _cvtsh_ss(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    acc_m += x[i].d * _cvtsh_ss(w[i].dmin) * float(summ);
  }
  return hsum8(acc) - acc_m;
}

}  // namespace
#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif  // defined(__x86_64__)

namespace {

KernelSet make_scalar() {
  return {"scalar", dot_f32_scalar, dot_f16_scalar, dot_bf16_scalar, dot_q8_0_scalar, dot_q4_0_scalar,
          dot_q4_k_scalar, dot_q6_k_scalar, quantize_q8_0_scalar, quantize_q8_k_scalar, axpy_f16_scalar,
          f32_to_f16_row_scalar, silu_mul_scalar, argmax_scalar, nullptr, nullptr, nullptr, nullptr, nullptr,
          tile_x16_scalar<true>, tile_x16_scalar<false>, tile_q4_k_x16_scalar, tile_f16_x16_scalar, nullptr,
          tile_q6_k_x16_scalar};
}

#if defined(__x86_64__)
KernelSet make_avx2() {
  KernelSet k{"avx2", dot_f32_avx2, dot_f16_avx2, dot_bf16_avx2, dot_q8_0_avx2, dot_q4_0_avx2, dot_q4_k_avx2,
          dot_q6_k_avx2, quantize_q8_0_avx2, quantize_q8_k_scalar, axpy_f16_avx2, f32_to_f16_row_avx2,
          silu_mul_avx2, argmax_avx2};
  k.tile_q8_0x16 = tile_q8_0_x16_avx2;
  k.tile_q4_0x16 = tile_q4_0_x16_avx2;
  k.tile_q4_kx16 = tile_q4_k_x16_avx2;
  k.tile_f16x16 = tile_f16_x16_avx2;
  k.widen_f16 = widen_f16_avx2;
  return k;
}

KernelSet make_vnni() {
  KernelSet k = make_avx2();
  k.isa = "avx512vnni";
  k.dot_q8_0 = dot_q8_0_vnni;
  k.dot_q4_0 = dot_q4_0_vnni;
  k.dot_q4_k = dot_q4_k_vnni;
  k.dot_f16 = dot_f16_avx512;
  k.tile_q8_0 = tile_q8_0_vnni;
  k.tile_q4_0 = tile_q4_0_vnni;
  k.unpack_q8_0 = unpack_q8_0_vnni;
  k.tile_f16 = tile_f16_avx512;
  k.widen_f16 = widen_f16_avx512;
  k.tile_q8_0x16 = tile_x16_vnni<true>;
  k.tile_q4_0x16 = tile_x16_vnni<false>;
  k.tile_q4_kx16 = tile_q4_k_x16_vnni;
  k.tile_q6_kx16 = tile_q6_k_x16_vnni;
  k.tile_f16x16 = tile_f16_x16_avx512;
  k.tile_f16x32 = tile_f16_x32_avx512;
  k.silu_mul = silu_mul_avx512;
  k.argmax = argmax_avx512;
  return k;
}

// The sets, built on first use outside any target region (they hold function pointers
// only). The VNNI set needs AVX-512 VNNI on top of the avx512 level.
const KernelSet& avx2_kernels() {
  static const KernelSet k = make_avx2();
  return k;
}
const KernelSet& vnni_kernels() {
  static const KernelSet k = make_vnni();
  return k;
}
bool vnni_enabled() { return isa_enabled(Isa::avx512) && cpu_features().avx512vnni; }
#endif  // defined(__x86_64__)

}  // namespace

#if defined(__aarch64__)
#include "kernels_neon.inc"  // the NEON sets (ASIMD, and SDOT where the CPU has it)
#endif

std::vector<const KernelSet*> available_kernel_sets() {
  std::vector<const KernelSet*> v{&scalar_kernels()};
#if defined(__x86_64__)
  if (isa_enabled(Isa::avx2)) v.push_back(&avx2_kernels());
  if (vnni_enabled()) v.push_back(&vnni_kernels());
#endif
#if defined(__aarch64__)
  if (isa_enabled(Isa::neon)) v.push_back(&neon_kernels());
  if (neon_dotprod_enabled()) v.push_back(&neon_dotprod_kernels());
#endif
  return v;
}

const KernelSet& kernels() {
#if defined(__x86_64__)
  if (vnni_enabled()) return vnni_kernels();
  if (isa_enabled(Isa::avx2)) return avx2_kernels();
#endif
#if defined(__aarch64__)
  if (neon_dotprod_enabled()) return neon_dotprod_kernels();
  if (isa_enabled(Isa::neon)) return neon_kernels();
#endif
  return scalar_kernels();
}

const KernelSet& scalar_kernels() {
  static const KernelSet k = make_scalar();
  return k;
}

DotFn dot_fn(const KernelSet& k, GgmlType weight) {
  switch (weight) {
    case GgmlType::f32: return k.dot_f32;
    case GgmlType::f16: return k.dot_f16;
    case GgmlType::bf16: return k.dot_bf16;
    case GgmlType::q8_0: return k.dot_q8_0;
    case GgmlType::q4_0: return k.dot_q4_0;
    case GgmlType::q4_k: return k.dot_q4_k;
    case GgmlType::q6_k: return k.dot_q6_k;
    default: break;
  }
  throw Error(ErrorCode::unsupported, "no kernel for weight type " + ggml_type_name(uint32_t(weight)));
}

TileFn tile_fn(const KernelSet& k, GgmlType weight) {
  switch (weight) {
    case GgmlType::q8_0: return k.tile_q8_0;
    case GgmlType::q4_0: return k.tile_q4_0;
    case GgmlType::f16: return k.tile_f16;
    default: return nullptr;
  }
}

Tile16Fn tile16_fn(const KernelSet& k, GgmlType weight) {
  switch (weight) {
    case GgmlType::q8_0: return k.tile_q8_0x16;
    case GgmlType::q4_0: return k.tile_q4_0x16;
    case GgmlType::q4_k: return k.tile_q4_kx16;
    case GgmlType::q6_k: return k.tile_q6_kx16;
    case GgmlType::f16: return k.tile_f16x16;
    default: return nullptr;
  }
}

void quantize_act_row(const KernelSet& k, ActType type, const float* x, void* dst, int64_t n) {
  switch (type) {
    case ActType::f32: std::memcpy(dst, x, size_t(n) * 4); return;
    case ActType::f16:
      k.f32_to_f16_row(x, static_cast<uint16_t*>(dst), n);
      if (k.widen_f16)
        k.widen_f16(static_cast<uint16_t*>(dst), reinterpret_cast<float*>(static_cast<uint8_t*>(dst) + f16_copy_offset(n)), n);
      return;
    case ActType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i]);
      return;
    }
    case ActType::q8_0: {
      k.quantize_q8_0(x, dst, n);
      uint8_t* row = static_cast<uint8_t*>(dst);
      if (k.unpack_q8_0) k.unpack_q8_0(dst, row + n / 32 * int64_t(sizeof(BlockQ8_0)), n);
      const auto* blocks = static_cast<const BlockQ8_0*>(dst);
      auto* aux = reinterpret_cast<Q8Aux*>(row + q8_0_aux_offset(n));
      for (int64_t b = 0; b < n / 32; ++b) {
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += blocks[b].qs[j];
        aux[b] = {f16_to_f32(blocks[b].d), sum};
      }
      return;
    }
    case ActType::q8_k: k.quantize_q8_k(x, dst, n); return;
  }
}

}  // namespace slim::llm
