#include "slim/llm/kv_attention.h"

#include <immintrin.h>

#include "slim/core/half.h"

namespace slim::llm {

namespace {

void scores_f16_scalar(const uint16_t* k, int64_t stride, int n, const float* q, int hd, float* out) {
  for (int i = 0; i < n; ++i) {
    const uint16_t* r = k + i * stride;
    float s = 0;
    for (int c = 0; c < hd; ++c) s += q[c] * f16_to_f32(r[c]);
    out[i] = s;
  }
}

void accumulate_f16_scalar(const uint16_t* v, int64_t stride, int n, const float* p, int hd, float* out) {
  for (int i = 0; i < n; ++i) {
    const uint16_t* r = v + i * stride;
    for (int c = 0; c < hd; ++c) out[c] += p[i] * f16_to_f32(r[c]);
  }
}

void scores_q8_scalar(const int8_t* x, const float* d, int n, const float* q, int hd, float* out) {
  for (int i = 0; i < n; ++i) {
    const int8_t* r = x + int64_t(i) * hd;
    float s = 0;
    for (int c = 0; c < hd; ++c) s += q[c] * float(r[c]);
    out[i] = s * d[i];
  }
}

void accumulate_q8_scalar(const int8_t* x, const float* d, int n, const float* p, int hd, float* out) {
  for (int i = 0; i < n; ++i) {
    const int8_t* r = x + int64_t(i) * hd;
    const float a = p[i] * d[i];
    for (int c = 0; c < hd; ++c) out[c] += a * float(r[c]);
  }
}

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight row sums at once: three rounds of pairwise adds instead of eight reductions.
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline __m256 load_h(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load_q8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

void scores_f16_avx2(const uint16_t* k, int64_t stride, int n, const float* q, int hd, float* out) {
  if (hd % 8 != 0) return scores_f16_scalar(k, stride, n, q, hd, out);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, load_h(k + (i + r) * stride + c), acc[r]);
    }
    _mm256_storeu_ps(out + i, hsum8(acc));
  }
  for (; i < n; ++i) {
    __m256 acc = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_h(k + i * stride + c), acc);
    out[i] = hsum(acc);
  }
}

void accumulate_f16_avx2(const uint16_t* v, int64_t stride, int n, const float* p, int hd, float* out) {
  if (hd % 8 != 0) return accumulate_f16_scalar(v, stride, n, p, hd, out);
  // Up to 64 output columns stay in registers across all rows.
  for (int c0 = 0; c0 < hd; c0 += 64) {
    const int w = hd - c0 < 64 ? hd - c0 : 64;
    __m256 o[8];
    for (int j = 0; j < w / 8; ++j) o[j] = _mm256_loadu_ps(out + c0 + 8 * j);
    for (int i = 0; i < n; ++i) {
      const __m256 a = _mm256_set1_ps(p[i]);
      const uint16_t* r = v + i * stride + c0;
      for (int j = 0; j < w / 8; ++j) o[j] = _mm256_fmadd_ps(a, load_h(r + 8 * j), o[j]);
    }
    for (int j = 0; j < w / 8; ++j) _mm256_storeu_ps(out + c0 + 8 * j, o[j]);
  }
}

void scores_q8_avx2(const int8_t* x, const float* d, int n, const float* q, int hd, float* out) {
  if (hd % 8 != 0) return scores_q8_scalar(x, d, n, q, hd, out);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, load_q8(x + int64_t(i + r) * hd + c), acc[r]);
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(hsum8(acc), _mm256_loadu_ps(d + i)));
  }
  for (; i < n; ++i) {
    __m256 acc = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_q8(x + int64_t(i) * hd + c), acc);
    out[i] = hsum(acc) * d[i];
  }
}

void accumulate_q8_avx2(const int8_t* x, const float* d, int n, const float* p, int hd, float* out) {
  if (hd % 8 != 0) return accumulate_q8_scalar(x, d, n, p, hd, out);
  for (int c0 = 0; c0 < hd; c0 += 64) {
    const int w = hd - c0 < 64 ? hd - c0 : 64;
    __m256 o[8];
    for (int j = 0; j < w / 8; ++j) o[j] = _mm256_loadu_ps(out + c0 + 8 * j);
    for (int i = 0; i < n; ++i) {
      const __m256 a = _mm256_set1_ps(p[i] * d[i]);
      const int8_t* r = x + int64_t(i) * hd + c0;
      for (int j = 0; j < w / 8; ++j) o[j] = _mm256_fmadd_ps(a, load_q8(r + 8 * j), o[j]);
    }
    for (int j = 0; j < w / 8; ++j) _mm256_storeu_ps(out + c0 + 8 * j, o[j]);
  }
}

}  // namespace

#pragma GCC pop_options

const KvAttentionKernels& kv_attention_kernels_scalar() {
  static const KvAttentionKernels k{"scalar", scores_f16_scalar, accumulate_f16_scalar, scores_q8_scalar,
                                    accumulate_q8_scalar};
  return k;
}

const KvAttentionKernels& kv_attention_kernels() {
  static const KvAttentionKernels* best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      static const KvAttentionKernels k{"avx2", scores_f16_avx2, accumulate_f16_avx2, scores_q8_avx2, accumulate_q8_avx2};
      return &k;
    }
    return &kv_attention_kernels_scalar();
  }();
  return *best;
}

}  // namespace slim::llm
