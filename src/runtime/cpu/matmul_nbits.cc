// The cpu provider's MatMulNBits (com.microsoft): 4-bit blockwise-quantized weights,
// multiplied without ever unpacking the matrix. At compile time the constant weights are
// regrouped 16 rows of W (16 output columns) at a time so that one vector lane holds one
// output column: no horizontal sums, and each unpacked weight vector serves a tile of up
// to 4 rows of A (more rows: each group is unpacked once into floats that 8-row tiles
// read). The same idea as the llm module's repacked 16-row tiles
// (src/llm/kernels.cc), which cannot be shared: their activations follow ggml's Q8_0 (f16
// scales, blocks of 32), MatMulNBits' follow ONNX Runtime's (any block size, f32 scales,
// per-block zero points), and runtime sits on the llm module's floor.
//
// Two forms, picked by the node's accuracy_level as ONNX Runtime does:
// - float (0-3): w = q * scale + (-zero_point * scale) unpacked into float lanes, then
//   fused multiply-adds with broadcast A values (A zero-padded to whole blocks);
// - int8 (4): A quantized per block to int8 (ref's quantize_a_int8, the bits MLAS makes),
//   integer dots of the unsigned codes with it (AVX-512 VNNI vpdpbusd, else vpmaddubsw +
//   vpmaddwd, exact), then per block (dot - zero_point x sum(A codes)) x scale_A x scale_W.
// AVX-512, AVX2 and scalar versions read the same packed layout (x86-64; other
// architectures run the scalar ones); tests hold each to the ref kernel.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/simd.h"
#include "runtime/ref/contrib_common.h"
#include "slim/core/convert.h"

namespace slim::cpu {

namespace {

constexpr int kRows = 16;  // output columns per group: one per 32-bit lane of a zmm
constexpr int kTile = 4;   // rows of A per pass over a group's weights
constexpr int64_t kChunk = 256;  // K positions per pass of the unpacked float tiles

// The weights of one node, regrouped. Group g covers output columns 16g..16g+15 (columns
// past N have zero codes and scales).
// - float form: per pair of K positions (2p, 2p+1), 16 bytes; byte r is column r's code
//   at 2p (low nibble) and 2p+1 (high nibble): ONNX Runtime's bytes, transposed.
// - int8 form: per 8 K positions (8c..8c+7), 64 bytes; bytes 4r..4r+3 of column r hold
//   its codes at 8c..8c+3 (low nibbles) and 8c+4..8c+7 (high nibbles), so a nibble plane
//   is the 4-byte lane vpdpbusd multiplies with a broadcast dword of A codes.
// Per (group, block) 16 scales and 16 offsets: -zero_point x scale (float form) or the
// zero point itself (int8 form).
struct PackedNBits {
  ref::NBitsShape q;
  int64_t k_pad = 0, groups = 0, group_bytes = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scale, offset, bias;  // bias: groups x 16 (zeros when absent)
};

PackedNBits pack(const ref::NBitsShape& q, const Tensor& b, const Tensor& scales, const Tensor* zp,
                 const Tensor* bias) {
  PackedNBits p;
  p.q = q;
  p.k_pad = q.k_blocks * q.block;
  p.groups = (q.n + kRows - 1) / kRows;
  p.group_bytes = p.k_pad / 2 * kRows;
  p.codes.assign(size_t(p.groups * p.group_bytes), 0);
  p.scale.assign(size_t(p.groups * q.k_blocks * kRows), 0.f);
  p.offset = p.scale;
  p.bias.assign(size_t(p.groups * kRows), 0.f);
  const uint8_t* bb = b.data<uint8_t>();
  const std::vector<double> sv = tensor_to_doubles(scales);
  const auto code = [&](int64_t j, int64_t k) -> uint8_t {
    if (j >= q.n || k >= q.k) return 0;
    const uint8_t byte = bb[(j * q.k_blocks + k / q.block) * q.blob + (k % q.block) / 2];
    return (k % 2) ? byte >> 4 : byte & 15;
  };
  const auto zero_point = [&](int64_t j, int64_t kb) -> float {
    if (!zp) return 8.f;
    if (zp->dtype() == DType::u8) {
      const uint8_t byte = zp->data<uint8_t>()[j * ((q.k_blocks + 1) / 2) + kb / 2];
      return float((kb % 2) ? byte >> 4 : byte & 15);
    }
    return zp->data<float>()[j * q.k_blocks + kb];
  };
  for (int64_t g = 0; g < p.groups; ++g) {
    uint8_t* c = p.codes.data() + g * p.group_bytes;
    for (int r = 0; r < kRows; ++r) {
      const int64_t j = g * kRows + r;
      if (q.int8_a) {
        for (int64_t k = 0; k < p.k_pad; k += 8)
          for (int i = 0; i < 4; ++i) c[k * 8 + 4 * r + i] = uint8_t(code(j, k + i) | code(j, k + 4 + i) << 4);
      } else {
        for (int64_t k = 0; k < p.k_pad; k += 2) c[k / 2 * kRows + r] = uint8_t(code(j, k) | code(j, k + 1) << 4);
      }
      if (j >= q.n) continue;
      for (int64_t kb = 0; kb < q.k_blocks; ++kb) {
        const size_t at = size_t((g * q.k_blocks + kb) * kRows + r);
        p.scale[at] = float(sv[size_t(j * q.k_blocks + kb)]);
        p.offset[at] = q.int8_a ? zero_point(j, kb) : -zero_point(j, kb) * p.scale[at];
      }
      if (bias) p.bias[size_t(j)] = bias->data<float>()[j];
    }
  }
  return p;
}

// A's rows for the int8 form: codes (k_pad per row, zero past K), per block the scale and
// the sum of the codes.
struct QuantizedA {
  std::vector<int8_t> codes;
  std::vector<float> scale, sum;
};

// Everything one group tile needs: the group's weights, up to kTile rows of A (float
// rows of k_pad values, or the int8 form), and where its 16 output columns go.
struct Tile {
  const uint8_t* codes;
  const float *scale, *offset, *bias;
  const float* a;       // float form: row t at a + t * lda
  const int8_t* qa;     // int8 form: row t at qa + t * lda
  const float *sa, *qsum;  // int8 form: row t's block b at [t * k_blocks + b]
  int64_t lda, k_blocks, block;
  float* y;
  int64_t ldy;
  int rows, cols;  // rows of A (1..kTile), valid output columns (1..16; the unpacked
                   // AVX-512 tiles of two groups 1..32)
};

// ---------------- scalar (the reference for the vector versions) ----------------

void tile_f32_scalar(const Tile& t) {
  for (int m = 0; m < t.rows; ++m)
    for (int r = 0; r < t.cols; ++r) {
      float acc = t.bias[r];
      for (int64_t b = 0; b < t.k_blocks; ++b) {
        const float s = t.scale[b * kRows + r], z = t.offset[b * kRows + r];
        for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 2) {
          const uint8_t byte = t.codes[k / 2 * kRows + r];
          acc = std::fma(t.a[m * t.lda + k], std::fma(float(byte & 15), s, z), acc);
          acc = std::fma(t.a[m * t.lda + k + 1], std::fma(float(byte >> 4), s, z), acc);
        }
      }
      t.y[m * t.ldy + r] = acc;
    }
}

void tile_int8_scalar(const Tile& t) {
  for (int m = 0; m < t.rows; ++m)
    for (int r = 0; r < t.cols; ++r) {
      float acc = t.bias[r];
      for (int64_t b = 0; b < t.k_blocks; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 8) {
          const uint8_t* c = t.codes + k * 8 + 4 * r;
          const int8_t* x = t.qa + m * t.lda + k;
          for (int i = 0; i < 4; ++i) dot += int32_t(c[i] & 15) * x[i] + int32_t(c[i] >> 4) * x[4 + i];
        }
        const int64_t mb = m * t.k_blocks + b;
        const float f = std::fma(-t.offset[b * kRows + r], t.qsum[mb], float(dot));
        acc = std::fma(f, t.scale[b * kRows + r] * t.sa[mb], acc);
      }
      t.y[m * t.ldy + r] = acc;
    }
}

// Float form for more than kTile rows: a group's weights are unpacked once into w (k_pad
// rows of 16 floats, ws floats apart; the same values the tiles above compute) and every
// tile of A rows reads them from there, instead of unpacking them again per tile.
void unpack_group_scalar(const Tile& t, float* w, int64_t ws) {
  for (int64_t b = 0; b < t.k_blocks; ++b)
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 2)
      for (int r = 0; r < kRows; ++r) {
        const uint8_t byte = t.codes[k / 2 * kRows + r];
        const float s = t.scale[b * kRows + r], z = t.offset[b * kRows + r];
        w[k * ws + r] = std::fma(float(byte & 15), s, z);
        w[(k + 1) * ws + r] = std::fma(float(byte >> 4), s, z);
      }
}

// Adds the products of K positions [k0, k1) to y (to the bias when k0 is 0).
void tile_unpacked_scalar(const float* w, int64_t k0, int64_t k1, const Tile& t) {
  for (int m = 0; m < t.rows; ++m)
    for (int r = 0; r < t.cols; ++r) {
      float acc = k0 ? t.y[m * t.ldy + r] : t.bias[r];
      for (int64_t k = k0; k < k1; ++k) acc = std::fma(t.a[m * t.lda + k], w[k * kRows + r], acc);
      t.y[m * t.ldy + r] = acc;
    }
}

#if defined(__x86_64__)
// ---------------- AVX-512 ----------------

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* operands that -Wmaybe-uninitialized
// reports as false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SLIM_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

// Float form: four accumulators per row (K positions k mod 4), so a row's fused
// multiply-adds are four independent chains.
template <int T>
SLIM_AVX512 void tile_f32_avx512_t(const Tile& t) {
  __m512 acc[T][4];
  for (int m = 0; m < T; ++m) {
    acc[m][0] = _mm512_loadu_ps(t.bias);
    acc[m][1] = acc[m][2] = acc[m][3] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi32(15);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b) {
    const __m512 s = _mm512_loadu_ps(t.scale + b * kRows), z = _mm512_loadu_ps(t.offset + b * kRows);
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 4, c += 2 * kRows) {
      const __m512i x0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
      const __m512i x1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kRows)));
      const __m512 w[4] = {_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x0, m4)), s, z),
                           _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x0, 4)), s, z),
                           _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x1, m4)), s, z),
                           _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x1, 4)), s, z)};
      for (int m = 0; m < T; ++m)
        for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_fmadd_ps(_mm512_set1_ps(t.a[m * t.lda + k + i]), w[i], acc[m][i]);
    }
  }
  const __mmask16 keep = __mmask16((1u << t.cols) - 1);
  for (int m = 0; m < T; ++m)
    _mm512_mask_storeu_ps(t.y + m * t.ldy, keep,
                          _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3])));
}

SLIM_AVX512 void unpack_group_avx512(const Tile& t, float* w, int64_t ws) {
  const __m512i m4 = _mm512_set1_epi32(15);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b) {
    const __m512 s = _mm512_loadu_ps(t.scale + b * kRows), z = _mm512_loadu_ps(t.offset + b * kRows);
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 2, c += kRows) {
      const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
      _mm512_storeu_ps(w + k * ws, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x, m4)), s, z));
      _mm512_storeu_ps(w + (k + 1) * ws, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4)), s, z));
    }
  }
}

// Up to 8 rows x G groups (16 accumulators): each broadcast A value serves G fused
// multiply-adds. With one group the 8 broadcasts and the weight load per 8 FMAs kept the
// load ports busier than the FMA ports (M = 32, K = N = 4096: 13.6 ms, ONNX Runtime 13.0).
template <int T, int G>
SLIM_AVX512 void tile_unpacked_avx512_t(const float* w, int64_t k0, int64_t k1, const Tile& t) {
  __mmask16 keep[G];
  for (int j = 0; j < G; ++j) keep[j] = __mmask16((1u << std::clamp(t.cols - kRows * j, 0, kRows)) - 1);
  __m512 acc[T][G];
  for (int m = 0; m < T; ++m)
    for (int j = 0; j < G; ++j)
      acc[m][j] = k0 ? _mm512_maskz_loadu_ps(keep[j], t.y + m * t.ldy + kRows * j) : _mm512_loadu_ps(t.bias + kRows * j);
  for (int64_t k = k0; k < k1; ++k) {
    __m512 wv[G];
    for (int j = 0; j < G; ++j) wv[j] = _mm512_loadu_ps(w + (k * G + j) * kRows);
    for (int m = 0; m < T; ++m) {
      const __m512 x = _mm512_set1_ps(t.a[m * t.lda + k]);
      for (int j = 0; j < G; ++j) acc[m][j] = _mm512_fmadd_ps(x, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < T; ++m)
    for (int j = 0; j < G; ++j) _mm512_mask_storeu_ps(t.y + m * t.ldy + kRows * j, keep[j], acc[m][j]);
}

// Int8 form with VNNI: the block dot of 16 columns with one row of A codes, low and high
// nibble planes in separate accumulators. AVX-512 CPUs without VNNI (Skylake-SP) run the
// AVX2 tile: a copy of this one with vpmaddubsw would need a target without VNNI, or GCC
// may fuse its vpmaddwd + vpaddd into VNNI's vpdpwssd.
template <int T>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma"))) void tile_int8_vnni_t(const Tile& t) {
  __m512 acc[T];
  for (int m = 0; m < T; ++m) acc[m] = _mm512_loadu_ps(t.bias);
  const __m512i m4 = _mm512_set1_epi8(15);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b) {
    __m512i lo[T], hi[T];
    for (int m = 0; m < T; ++m) lo[m] = hi[m] = _mm512_setzero_si512();
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 8, c += 64) {
      const __m512i v = _mm512_loadu_si512(c);
      const __m512i pl = _mm512_and_si512(v, m4), ph = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      for (int m = 0; m < T; ++m) {
        int32_t x0, x1;
        std::memcpy(&x0, t.qa + m * t.lda + k, 4);
        std::memcpy(&x1, t.qa + m * t.lda + k + 4, 4);
        lo[m] = _mm512_dpbusd_epi32(lo[m], pl, _mm512_set1_epi32(x0));
        hi[m] = _mm512_dpbusd_epi32(hi[m], ph, _mm512_set1_epi32(x1));
      }
    }
    const __m512 sw = _mm512_loadu_ps(t.scale + b * kRows), zp = _mm512_loadu_ps(t.offset + b * kRows);
    for (int m = 0; m < T; ++m) {
      const int64_t mb = m * t.k_blocks + b;
      const __m512 f = _mm512_fnmadd_ps(zp, _mm512_set1_ps(t.qsum[mb]), _mm512_cvtepi32_ps(_mm512_add_epi32(lo[m], hi[m])));
      acc[m] = _mm512_fmadd_ps(f, _mm512_mul_ps(sw, _mm512_set1_ps(t.sa[mb])), acc[m]);
    }
  }
  const __mmask16 keep = __mmask16((1u << t.cols) - 1);
  for (int m = 0; m < T; ++m) _mm512_mask_storeu_ps(t.y + m * t.ldy, keep, acc[m]);
}

// ---------------- AVX2 ----------------

#define SLIM_AVX2 __attribute__((target("avx2,fma")))

SLIM_AVX2 inline void store_cols(float* y, __m256 lo, __m256 hi, int cols) {
  if (cols == kRows) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  alignas(32) float tmp[kRows];
  _mm256_store_ps(tmp, lo);
  _mm256_store_ps(tmp + 8, hi);
  std::memcpy(y, tmp, size_t(cols) * sizeof(float));
}

// Float form: 16 columns are two ymm halves; two accumulators per half and row.
template <int T>
SLIM_AVX2 void tile_f32_avx2_t(const Tile& t) {
  __m256 acc[T][2][2];
  for (int m = 0; m < T; ++m)
    for (int h = 0; h < 2; ++h) {
      acc[m][h][0] = _mm256_loadu_ps(t.bias + 8 * h);
      acc[m][h][1] = _mm256_setzero_ps();
    }
  const __m256i m4 = _mm256_set1_epi32(15);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b) {
    const __m256 s[2] = {_mm256_loadu_ps(t.scale + b * kRows), _mm256_loadu_ps(t.scale + b * kRows + 8)};
    const __m256 z[2] = {_mm256_loadu_ps(t.offset + b * kRows), _mm256_loadu_ps(t.offset + b * kRows + 8)};
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 2, c += kRows)
      for (int h = 0; h < 2; ++h) {
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8 * h)));
        const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(x, m4)), s[h], z[h]);
        const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4)), s[h], z[h]);
        for (int m = 0; m < T; ++m) {
          acc[m][h][0] = _mm256_fmadd_ps(_mm256_set1_ps(t.a[m * t.lda + k]), w0, acc[m][h][0]);
          acc[m][h][1] = _mm256_fmadd_ps(_mm256_set1_ps(t.a[m * t.lda + k + 1]), w1, acc[m][h][1]);
        }
      }
  }
  for (int m = 0; m < T; ++m)
    store_cols(t.y + m * t.ldy, _mm256_add_ps(acc[m][0][0], acc[m][0][1]), _mm256_add_ps(acc[m][1][0], acc[m][1][1]),
               t.cols);
}

SLIM_AVX2 void unpack_group_avx2(const Tile& t, float* w, int64_t ws) {
  const __m256i m4 = _mm256_set1_epi32(15);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b)
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_loadu_ps(t.scale + b * kRows + 8 * h), z = _mm256_loadu_ps(t.offset + b * kRows + 8 * h);
      for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 2) {
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + k / 2 * kRows + 8 * h)));
        _mm256_storeu_ps(w + k * ws + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(x, m4)), s, z));
        _mm256_storeu_ps(w + (k + 1) * ws + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4)), s, z));
      }
    }
}

// Up to 4 rows (8 accumulators of the 16 ymm registers).
template <int T>
SLIM_AVX2 void tile_unpacked_avx2_t(const float* w, int64_t k0, int64_t k1, const Tile& t) {
  __m256 acc[T][2];
  for (int m = 0; m < T; ++m) {
    if (k0 == 0) {
      acc[m][0] = _mm256_loadu_ps(t.bias);
      acc[m][1] = _mm256_loadu_ps(t.bias + 8);
    } else {
      alignas(32) float tmp[kRows] = {};
      std::memcpy(tmp, t.y + m * t.ldy, size_t(t.cols) * sizeof(float));
      acc[m][0] = _mm256_load_ps(tmp);
      acc[m][1] = _mm256_load_ps(tmp + 8);
    }
  }
  for (int64_t k = k0; k < k1; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kRows), w1 = _mm256_loadu_ps(w + k * kRows + 8);
    for (int m = 0; m < T; ++m) {
      const __m256 x = _mm256_set1_ps(t.a[m * t.lda + k]);
      acc[m][0] = _mm256_fmadd_ps(x, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(x, w1, acc[m][1]);
    }
  }
  for (int m = 0; m < T; ++m) store_cols(t.y + m * t.ldy, acc[m][0], acc[m][1], t.cols);
}

template <int T>
SLIM_AVX2 void tile_int8_avx2_t(const Tile& t) {
  __m256 acc[T][2];
  for (int m = 0; m < T; ++m) {
    acc[m][0] = _mm256_loadu_ps(t.bias);
    acc[m][1] = _mm256_loadu_ps(t.bias + 8);
  }
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const uint8_t* c = t.codes;
  for (int64_t b = 0; b < t.k_blocks; ++b) {
    __m256i dot[T][2];
    for (int m = 0; m < T; ++m) dot[m][0] = dot[m][1] = _mm256_setzero_si256();
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += 8, c += 64)
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32 * h));
        const __m256i pl = _mm256_and_si256(v, m4), ph = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int m = 0; m < T; ++m) {
          int32_t x0, x1;
          std::memcpy(&x0, t.qa + m * t.lda + k, 4);
          std::memcpy(&x1, t.qa + m * t.lda + k + 4, 4);
          // Four products of a code (<= 15) and an A code (|x| <= 127) fit int16.
          const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(pl, _mm256_set1_epi32(x0)),
                                               _mm256_maddubs_epi16(ph, _mm256_set1_epi32(x1)));
          dot[m][h] = _mm256_add_epi32(dot[m][h], _mm256_madd_epi16(s16, ones));
        }
      }
    for (int h = 0; h < 2; ++h) {
      const __m256 sw = _mm256_loadu_ps(t.scale + b * kRows + 8 * h), zp = _mm256_loadu_ps(t.offset + b * kRows + 8 * h);
      for (int m = 0; m < T; ++m) {
        const int64_t mb = m * t.k_blocks + b;
        const __m256 f = _mm256_fnmadd_ps(zp, _mm256_set1_ps(t.qsum[mb]), _mm256_cvtepi32_ps(dot[m][h]));
        acc[m][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(sw, _mm256_set1_ps(t.sa[mb])), acc[m][h]);
      }
    }
  }
  for (int m = 0; m < T; ++m) store_cols(t.y + m * t.ldy, acc[m][0], acc[m][1], t.cols);
}

#pragma GCC diagnostic pop
#endif  // defined(__x86_64__)

// ---------------- dispatch ----------------

using TileFn = void (*)(const Tile&);

// make(std::integral_constant<int, R>{}) for R = rows clamped to [1, Max]: the tiles are
// instantiated per row count.
template <int Max, typename Make>
auto by_rows(int rows, Make make) {
  decltype(make(std::integral_constant<int, 1>{})) fn = nullptr;
  rows = std::clamp(rows, 1, Max);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rows == I + 1 ? (fn = make(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
  }(std::make_integer_sequence<int, Max>{});
  return fn;
}

// Other architectures (aarch64 included: no NEON tiles yet) run the scalar tiles.
TileFn tile_fn(bool int8, int rows) {
#if defined(__x86_64__)
  const Isa isa = detected_isa();
  if (isa == Isa::avx512) {
    if (!int8) return by_rows<kTile>(rows, [](auto T) -> TileFn { return tile_f32_avx512_t<T.value>; });
    if (cpu_features().avx512vnni) return by_rows<kTile>(rows, [](auto T) -> TileFn { return tile_int8_vnni_t<T.value>; });
  }
  if (isa == Isa::avx2 || isa == Isa::avx512) {
    if (!int8) return by_rows<kTile>(rows, [](auto T) -> TileFn { return tile_f32_avx2_t<T.value>; });
    return by_rows<kTile>(rows, [](auto T) -> TileFn { return tile_int8_avx2_t<T.value>; });
  }
#else
  (void)rows;
#endif
  return int8 ? tile_int8_scalar : tile_f32_scalar;
}

using UnpackFn = void (*)(const Tile&, float*, int64_t);
using UnpackedTileFn = void (*)(const float*, int64_t, int64_t, const Tile&);

// The float form's unpack-once kernels at the active level: rows of A and groups of
// columns per tile, the unpacker, and the tile for a row count (1..rows) and a group
// count (1..groups).
struct UnpackedKernels {
  int rows, groups;
  UnpackFn unpack;
  UnpackedTileFn (*tile)(int rows, int groups);
};

UnpackedKernels unpacked_kernels() {
  switch (detected_isa()) {
#if defined(__x86_64__)
    case Isa::avx512:
      return {8, 2, unpack_group_avx512, [](int rows, int groups) {
                if (groups == 1)
                  return by_rows<8>(rows, [](auto T) { return UnpackedTileFn(tile_unpacked_avx512_t<T.value, 1>); });
                return by_rows<8>(rows, [](auto T) { return UnpackedTileFn(tile_unpacked_avx512_t<T.value, 2>); });
              }};
    case Isa::avx2:
      return {4, 1, unpack_group_avx2, [](int rows, int) {
                return by_rows<4>(rows, [](auto T) { return UnpackedTileFn(tile_unpacked_avx2_t<T.value>); });
              }};
#endif
    default:
      return {kTile, 1, unpack_group_scalar, [](int, int) { return UnpackedTileFn(tile_unpacked_scalar); }};
  }
}

// Calls fn(begin, end) over [0, n) items of `cost` multiply-adds each on slim's pool, or
// inline below `grain` multiply-adds in all. Not OpenMP (parallel_items): a parallel
// region ends at a barrier that waits for every thread, and on a busy machine a thread
// that does not get its core in time cost ~8 ms per call (a 2-thread decode step of
// 4096 x 4096 took 8 ms instead of 0.7); the pool's caller takes the chunks a late
// worker has not claimed.
template <typename Fn>
void split_items(const KernelContext& ctx, int64_t n, int64_t cost, int64_t grain, Fn&& fn) {
  const int64_t threads = std::min<int64_t>(ctx.pool().num_threads(), n * cost / grain);
  if (threads < 2 || n < 2) return fn(int64_t(0), n);
  ctx.pool().parallel_for(n, fn, std::max<int64_t>(1, n / (4 * threads)));
}

class MatMulNBitsKernel final : public OpKernel {
 public:
  explicit MatMulNBitsKernel(PackedNBits p) : p_(std::move(p)) {}

  void compute(KernelContext& ctx) const override {
    const Tensor& a = ctx.required_input(0);
    const ref::NBitsShape& q = p_.q;
    if (a.dtype() != DType::f32 || a.rank() < 1 || a.dim(-1) != q.k)
      ctx.fail(ErrorCode::invalid_argument, "A must be f32 ending in K=" + std::to_string(q.k) + ", got " + a.describe());
    Shape out_shape = a.shape();
    out_shape.back() = q.n;
    Tensor& y = ctx.output(0, DType::f32, out_shape);
    const int64_t m = a.numel() / q.k;
    if (m == 0) return;
    // A in the form the tiles read: int8 codes, or float rows padded to whole blocks.
    const float* av = a.data<float>();
    int64_t lda = q.k;
    if (q.int8_a) {
      qa_.codes.assign(size_t(m * p_.k_pad), 0);
      qa_.scale.resize(size_t(m * q.k_blocks));
      qa_.sum.resize(size_t(m * q.k_blocks));
      for (int64_t i = 0; i < m; ++i) {
        int8_t* codes = qa_.codes.data() + i * p_.k_pad;
        ref::quantize_a_int8(av + i * q.k, q.k, q.block, codes, qa_.scale.data() + i * q.k_blocks);
        for (int64_t b = 0; b < q.k_blocks; ++b) {
          int32_t s = 0;
          for (int64_t k = b * q.block; k < (b + 1) * q.block; ++k) s += codes[k];
          qa_.sum[size_t(i * q.k_blocks + b)] = float(s);
        }
      }
      lda = p_.k_pad;
    } else if (p_.k_pad != q.k) {
      padded_.assign(size_t(m * p_.k_pad), 0.f);
      for (int64_t i = 0; i < m; ++i) std::memcpy(padded_.data() + i * p_.k_pad, av + i * q.k, size_t(q.k) * 4);
      av = padded_.data();
      lda = p_.k_pad;
    }
    float* yv = y.data<float>();
    const auto tile = [&](int64_t g, int64_t i, int rows) {
      Tile t;
      t.codes = p_.codes.data() + g * p_.group_bytes;
      t.scale = p_.scale.data() + g * q.k_blocks * kRows;
      t.offset = p_.offset.data() + g * q.k_blocks * kRows;
      t.bias = p_.bias.data() + g * kRows;
      t.a = av + i * lda;
      t.qa = q.int8_a ? qa_.codes.data() + i * lda : nullptr;
      t.sa = q.int8_a ? qa_.scale.data() + i * q.k_blocks : nullptr;
      t.qsum = q.int8_a ? qa_.sum.data() + i * q.k_blocks : nullptr;
      t.lda = lda;
      t.k_blocks = q.k_blocks;
      t.block = q.block;
      t.y = yv + i * q.n + g * kRows;
      t.ldy = q.n;
      t.rows = int(std::min<int64_t>(rows, m - i));
      t.cols = int(std::min<int64_t>(kRows, q.n - g * kRows));
      return t;
    };
    // Under 4M multiply-adds stay on one thread: a parallel region on a busy machine waits
    // for its slowest thread, and a decode step of a 2048 x 2048 matrix takes ~0.2 ms.
    const int64_t cost = m * p_.k_pad * kRows, grain = int64_t(1) << 22;
    if (q.int8_a || m <= kTile) {
      const TileFn full = tile_fn(q.int8_a, kTile), rest = tile_fn(q.int8_a, int(m % kTile));
      split_items(ctx, p_.groups, cost, grain, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g)
          for (int64_t i = 0; i < m; i += kTile) {
            const Tile t = tile(g, i, kTile);
            (t.rows == kTile ? full : rest)(t);
          }
      });
      return;
    }
    const UnpackedKernels uk = unpacked_kernels();
    const size_t per_thread = size_t(p_.k_pad * kRows * uk.groups);
    const int64_t passes = (p_.groups + uk.groups - 1) / uk.groups;
    split_items(ctx, passes, cost * uk.groups, grain, [&](int64_t p0, int64_t p1) {
      // Each thread's unpacked weights, grown once to the largest K it has seen.
      thread_local std::vector<float> unpacked;
      if (unpacked.size() < per_thread) unpacked.resize(per_thread);
      float* w = unpacked.data();
      for (int64_t pass = p0; pass < p1; ++pass) {
        const int64_t g = pass * uk.groups;
        const int gs = int(std::min<int64_t>(uk.groups, p_.groups - g));
        for (int j = 0; j < gs; ++j) uk.unpack(tile(g + j, 0, 1), w + j * kRows, gs * kRows);
        const UnpackedTileFn full = uk.tile(uk.rows, gs), rest = uk.tile(int(m % uk.rows), gs);
        // K in chunks whose A rows and weights stay in L1 across the tiles of A.
        for (int64_t k0 = 0; k0 < p_.k_pad; k0 += kChunk)
          for (int64_t i = 0; i < m; i += uk.rows) {
            Tile t = tile(g, i, uk.rows);
            t.cols = int(std::min<int64_t>(kRows * gs, q.n - g * kRows));
            (t.rows == uk.rows ? full : rest)(w, k0, std::min(k0 + kChunk, p_.k_pad), t);
          }
      }
    });
  }

 private:
  PackedNBits p_;
  // Per-run scratch for A, grown to the largest A seen (runs of a session are serialized).
  mutable QuantizedA qa_;
  mutable std::vector<float> padded_;
};

// Why the cpu provider leaves a MatMulNBits node to ref, or nullopt when it takes it.
std::optional<std::string> nbits_check(const KernelBuildInfo& info) {
  // A and scales share one type: f32 scales make an A of not yet known dtype f32 (in LLM
  // graphs compile cannot tell, after a GroupQueryAttention whose present length is a
  // run-time value), and compute checks it.
  if (info.input(0).dtype && *info.input(0).dtype != DType::f32) return need_f32(info, 0);
  if (info.node.attr_int("bits", 4) != 4) return std::string("only 4-bit weights are implemented");
  for (int i : {1, 2})
    if (!info.input(i).constant) return "input " + std::to_string(i) + " is not a constant";
  if (info.input(2).constant->dtype() != DType::f32) return std::string("scales are not f32");
  if (info.has_input(3) && !info.input(3).constant) return std::string("zero_points are not a constant");
  if (info.has_input(4)) return std::string("g_idx is not implemented");
  if (info.has_input(5) && (!info.input(5).constant || info.input(5).constant->dtype() != DType::f32))
    return std::string("bias is not an f32 constant");
  return std::nullopt;
}

KernelDef matmul_nbits_def() {
  KernelDef def;
  def.op_type = "MatMulNBits";
  def.domain = "com.microsoft";
  def.claim = [](const KernelBuildInfo& info) {
    if (auto r = nbits_check(info)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    if (auto r = nbits_check(info)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    const ref::NBitsShape q = ref::NBitsShape::from_node(info.node);
    const Tensor& b = *info.input(1).constant;
    const Tensor& scales = *info.input(2).constant;
    const Tensor* zp = info.has_input(3) ? info.input(3).constant : nullptr;
    const Tensor* bias = info.has_input(5) ? info.input(5).constant : nullptr;
    const auto fail = [&](const std::string& what) {
      throw Error(ErrorCode::invalid_model, info.node.describe() + ": " + what);
    };
    if (b.dtype() != DType::u8 || b.numel() != q.n * q.k_blocks * q.blob)
      fail("B must be uint8 (" + std::to_string(q.n) + ", " + std::to_string(q.k_blocks) + ", " +
           std::to_string(q.blob) + "), got " + b.describe());
    if (scales.numel() != q.n * q.k_blocks) fail("scales " + scales.describe() + " do not have N x k_blocks elements");
    if (zp && !(zp->dtype() == DType::u8 ? zp->numel() == q.n * ((q.k_blocks + 1) / 2)
                                          : zp->dtype() == DType::f32 && zp->numel() == q.n * q.k_blocks))
      fail("zero_points " + zp->describe() + " are neither packed uint8 nor one f32 per block");
    if (bias && bias->numel() != q.n) fail("bias " + bias->describe() + " does not have N elements");
    return std::make_unique<MatMulNBitsKernel>(pack(q, b, scales, zp, bias));
  };
  return def;
}

}  // namespace

void register_matmul_nbits_kernels(KernelRegistry& r) { r.add(matmul_nbits_def()); }

}  // namespace slim::cpu
