#include "slim/llm/kv_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "slim/core/half.h"

namespace slim::llm {

namespace {

void scores_f16_scalar(const uint16_t* k, int64_t stride, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const uint16_t* r = k + i * stride;
      float s = 0;
      for (int c = 0; c < hd; ++c) s += q[j * hd + c] * f16_to_f32(r[c]);
      out[j * ldo + i] = s;
    }
}

void accumulate_f16_scalar(const uint16_t* v, int64_t stride, int n, const float* p, int64_t ldp, int g, int hd,
                           float* out) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const uint16_t* r = v + i * stride;
      for (int c = 0; c < hd; ++c) out[j * hd + c] += p[j * ldp + i] * f16_to_f32(r[c]);
    }
}

void scores_q8_scalar(const int8_t* x, const float* d, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const int8_t* r = x + int64_t(i) * hd;
      float s = 0;
      for (int c = 0; c < hd; ++c) s += q[j * hd + c] * float(r[c]);
      out[j * ldo + i] = s * d[i];
    }
}

void softmax_scalar(float* x, int n, float scale) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) {
    x[i] *= scale;
    mx = std::max(mx, x[i]);
  }
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void accumulate_q8_scalar(const int8_t* x, const float* d, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const int8_t* r = x + int64_t(i) * hd;
      const float a = p[j * ldp + i] * d[i];
      for (int c = 0; c < hd; ++c) out[j * hd + c] += a * float(r[c]);
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

// Four row sums at once: two rounds of pairwise adds instead of four reductions.
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

struct HalfRows {
  const uint16_t* base;
  int64_t stride;
  __m256 load(int i, int c) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i * stride + c)));
  }
};

struct Q8Rows {
  const int8_t* base;
  int hd;
  __m256 load(int i, int c) const {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(base + int64_t(i) * hd + c))));
  }
};

// Raw dot products of G queries with n rows, 4 rows at a time (4G accumulators fit the 16
// registers for G <= 3).
template <int G, typename Rows>
void scores_g(const Rows& rows, int n, const float* q, int hd, float* out, int64_t ldo) {
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256 acc[G][4];
    for (int j = 0; j < G; ++j)
      for (int r = 0; r < 4; ++r) acc[j][r] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8)
      for (int r = 0; r < 4; ++r) {
        const __m256 kv = rows.load(i + r, c);
        for (int j = 0; j < G; ++j) acc[j][r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * hd + c), kv, acc[j][r]);
      }
    for (int j = 0; j < G; ++j) _mm_storeu_ps(out + j * ldo + i, hsum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
  }
  for (; i < n; ++i) {
    __m256 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
      const __m256 kv = rows.load(i, c);
      for (int j = 0; j < G; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * hd + c), kv, acc[j]);
    }
    for (int j = 0; j < G; ++j) out[j * ldo + i] = hsum(acc[j]);
  }
}

// out_j += sum_i w_j(i) * row_i, 32 columns of G outputs held in registers across rows.
template <int G, typename Rows, typename Weight>
void accumulate_g(const Rows& rows, int n, Weight w, int hd, float* out) {
  for (int c0 = 0; c0 < hd; c0 += 32) {
    const int blocks = (hd - c0 < 32 ? hd - c0 : 32) / 8;
    __m256 o[G][4];
    for (int j = 0; j < G; ++j)
      for (int b = 0; b < blocks; ++b) o[j][b] = _mm256_loadu_ps(out + j * hd + c0 + 8 * b);
    for (int i = 0; i < n; ++i) {
      __m256 a[G];
      for (int j = 0; j < G; ++j) a[j] = _mm256_set1_ps(w(j, i));
      for (int b = 0; b < blocks; ++b) {
        const __m256 v = rows.load(i, c0 + 8 * b);
        for (int j = 0; j < G; ++j) o[j][b] = _mm256_fmadd_ps(a[j], v, o[j][b]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int b = 0; b < blocks; ++b) _mm256_storeu_ps(out + j * hd + c0 + 8 * b, o[j][b]);
  }
}

template <typename Rows>
void scores_any(const Rows& rows, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  for (int j = 0; j < g; j += 3) {
    const float* qj = q + j * hd;
    float* oj = out + j * ldo;
    switch (g - j < 3 ? g - j : 3) {
      case 1: scores_g<1>(rows, n, qj, hd, oj, ldo); break;
      case 2: scores_g<2>(rows, n, qj, hd, oj, ldo); break;
      default: scores_g<3>(rows, n, qj, hd, oj, ldo); break;
    }
  }
}

void scores_f16_avx2(const uint16_t* k, int64_t stride, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 8 != 0) return scores_f16_scalar(k, stride, n, q, g, hd, out, ldo);
  scores_any(HalfRows{k, stride}, n, q, g, hd, out, ldo);
}

void scores_q8_avx2(const int8_t* x, const float* d, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 8 != 0) return scores_q8_scalar(x, d, n, q, g, hd, out, ldo);
  scores_any(Q8Rows{x, hd}, n, q, g, hd, out, ldo);
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) out[j * ldo + i] *= d[i];
}

template <typename Rows, typename Weight>
void accumulate_any(const Rows& rows, int n, Weight w, int g, int hd, float* out) {
  for (int j = 0; j < g; j += 3) {
    auto wj = [&](int jj, int i) { return w(j + jj, i); };
    float* oj = out + j * hd;
    switch (g - j < 3 ? g - j : 3) {
      case 1: accumulate_g<1>(rows, n, wj, hd, oj); break;
      case 2: accumulate_g<2>(rows, n, wj, hd, oj); break;
      default: accumulate_g<3>(rows, n, wj, hd, oj); break;
    }
  }
}

void accumulate_f16_avx2(const uint16_t* v, int64_t stride, int n, const float* p, int64_t ldp, int g, int hd,
                         float* out) {
  if (hd % 8 != 0) return accumulate_f16_scalar(v, stride, n, p, ldp, g, hd, out);
  accumulate_any(HalfRows{v, stride}, n, [&](int j, int i) { return p[j * ldp + i]; }, g, hd, out);
}

void accumulate_q8_avx2(const int8_t* x, const float* d, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  if (hd % 8 != 0) return accumulate_q8_scalar(x, d, n, p, ldp, g, hd, out);
  accumulate_any(Q8Rows{x, hd}, n, [&](int j, int i) { return p[j * ldp + i] * d[i]; }, g, hd, out);
}

}  // namespace

#pragma GCC pop_options

// AVX-512: f16 rows of a multiple of 16 values, 16 per step; other widths go to the AVX2
// kernels. As there, a query's sums do not depend on how many queries share the call.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq")

namespace {

inline __m512 load_half16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Raw dot products of G queries with n f16 rows, 4 rows at a time: each (row, query)
// accumulates 16 lanes, folded to 8 and summed four rows at once.
template <int G>
void scores_g512(const uint16_t* k, int64_t stride, int n, const float* q, int hd, float* out, int64_t ldo) {
  auto fold = [](__m512 a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))); };
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    __m512 acc[G][4];
    for (int j = 0; j < G; ++j)
      for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c += 16)
      for (int r = 0; r < 4; ++r) {
        const __m512 kv = load_half16(k + (i + r) * stride + c);
        for (int j = 0; j < G; ++j) acc[j][r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * hd + c), kv, acc[j][r]);
      }
    for (int j = 0; j < G; ++j)
      _mm_storeu_ps(out + j * ldo + i, hsum4(fold(acc[j][0]), fold(acc[j][1]), fold(acc[j][2]), fold(acc[j][3])));
  }
  for (; i < n; ++i) {
    __m512 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c += 16) {
      const __m512 kv = load_half16(k + i * stride + c);
      for (int j = 0; j < G; ++j) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * hd + c), kv, acc[j]);
    }
    for (int j = 0; j < G; ++j) out[j * ldo + i] = hsum(fold(acc[j]));
  }
}

void scores_f16_avx512(const uint16_t* k, int64_t stride, int n, const float* q, int g, int hd, float* out,
                       int64_t ldo) {
  if (hd % 16 != 0) return scores_f16_avx2(k, stride, n, q, g, hd, out, ldo);
  for (int j = 0; j < g; j += 3) {
    switch (g - j < 3 ? g - j : 3) {
      case 1: scores_g512<1>(k, stride, n, q + j * hd, hd, out + j * ldo, ldo); break;
      case 2: scores_g512<2>(k, stride, n, q + j * hd, hd, out + j * ldo, ldo); break;
      default: scores_g512<3>(k, stride, n, q + j * hd, hd, out + j * ldo, ldo); break;
    }
  }
}

// out_j += sum_i p_j(i) * row_i, 64 columns of G outputs held in registers across rows.
template <int G>
void accumulate_g512(const uint16_t* v, int64_t stride, int n, const float* p, int64_t ldp, int hd, float* out) {
  for (int c0 = 0; c0 < hd; c0 += 64) {
    const int blocks = (hd - c0 < 64 ? hd - c0 : 64) / 16;
    __m512 o[G][4];
    for (int j = 0; j < G; ++j)
      for (int b = 0; b < blocks; ++b) o[j][b] = _mm512_loadu_ps(out + j * hd + c0 + 16 * b);
    for (int i = 0; i < n; ++i) {
      __m512 a[G];
      for (int j = 0; j < G; ++j) a[j] = _mm512_set1_ps(p[j * ldp + i]);
      for (int b = 0; b < blocks; ++b) {
        const __m512 x = load_half16(v + i * stride + c0 + 16 * b);
        for (int j = 0; j < G; ++j) o[j][b] = _mm512_fmadd_ps(a[j], x, o[j][b]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int b = 0; b < blocks; ++b) _mm512_storeu_ps(out + j * hd + c0 + 16 * b, o[j][b]);
  }
}

void accumulate_f16_avx512(const uint16_t* v, int64_t stride, int n, const float* p, int64_t ldp, int g, int hd,
                           float* out) {
  if (hd % 16 != 0) return accumulate_f16_avx2(v, stride, n, p, ldp, g, hd, out);
  for (int j = 0; j < g; j += 4) {
    switch (g - j < 4 ? g - j : 4) {
      case 1: accumulate_g512<1>(v, stride, n, p + j * ldp, ldp, hd, out + j * hd); break;
      case 2: accumulate_g512<2>(v, stride, n, p + j * ldp, ldp, hd, out + j * hd); break;
      case 3: accumulate_g512<3>(v, stride, n, p + j * ldp, ldp, hd, out + j * hd); break;
      default: accumulate_g512<4>(v, stride, n, p + j * ldp, ldp, hd, out + j * hd); break;
    }
  }
}

// exp(x) for x <= 0 (scores minus their maximum): x = n ln2 + r with |r| <= ln2 / 2,
// exp(r) by its Taylor polynomial to r^7 (relative error below 2e-8), times 2^n. Below
// -103 the result underflows to 0.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

void softmax_avx512(float* x, int n, float scale) {
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
    _mm512_storeu_ps(x + i, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  float mx = _mm512_reduce_max_ps(vmax);
  for (; i < n; ++i) {
    x[i] *= scale;
    mx = std::max(mx, x[i]);
  }
  const __m512 vm = _mm512_set1_ps(mx);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
    _mm512_mask_storeu_ps(x + i, m, e);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  const __m512 inv = _mm512_set1_ps(float(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

}  // namespace

#pragma GCC pop_options

const KvAttentionKernels& kv_attention_kernels_scalar() {
  static const KvAttentionKernels k{"scalar", scores_f16_scalar, accumulate_f16_scalar, scores_q8_scalar,
                                    accumulate_q8_scalar, softmax_scalar};
  return k;
}

const KvAttentionKernels& kv_attention_kernels() {
  static const KvAttentionKernels* best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      static const KvAttentionKernels k{"avx512", scores_f16_avx512, accumulate_f16_avx512, scores_q8_avx2,
                                        accumulate_q8_avx2, softmax_avx512};
      return &k;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      static const KvAttentionKernels k{"avx2", scores_f16_avx2, accumulate_f16_avx2, scores_q8_avx2, accumulate_q8_avx2,
                                        softmax_scalar};
      return &k;
    }
    return &kv_attention_kernels_scalar();
  }();
  return *best;
}

}  // namespace slim::llm
