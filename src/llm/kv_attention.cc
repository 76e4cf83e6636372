#include "slim/llm/kv_attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "slim/core/cpu_features.h"
#include "slim/core/half.h"

namespace slim::llm {

namespace {

void scores_f16_run_scalar(const uint16_t* k, int64_t stride, int n, const float* q, int g, int hd, float* out,
                           int64_t ldo) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const uint16_t* r = k + i * stride;
      float s = 0;
      for (int c = 0; c < hd; ++c) s += q[j * hd + c] * f16_to_f32(r[c]);
      out[j * ldo + i] = s;
    }
}

void accumulate_f16_run_scalar(const uint16_t* v, int64_t stride, int n, const float* p, int64_t ldp, int g, int hd,
                               float* out) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const uint16_t* r = v + i * stride;
      for (int c = 0; c < hd; ++c) out[j * hd + c] += p[j * ldp + i] * f16_to_f32(r[c]);
    }
}

// A row's score does not depend on its run, and each output sums its rows in order, so a
// run at a time gives the sums of one call over all rows.
void scores_f16_scalar(const KvF16Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  k.each(n, [&](int, const uint16_t* r, int i0, int len) { scores_f16_run_scalar(r, k.stride, len, q, g, hd, out + i0, ldo); });
}

void accumulate_f16_scalar(const KvF16Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  v.each(n, [&](int, const uint16_t* r, int i0, int len) {
    accumulate_f16_run_scalar(r, v.stride, len, p + i0, ldp, g, hd, out);
  });
}

void scores_q8_run_scalar(const int8_t* x, const float* d, int n, const float* q, int g, int hd, float* out,
                          int64_t ldo) {
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

void accumulate_q8_run_scalar(const int8_t* x, const float* d, int n, const float* p, int64_t ldp, int g, int hd,
                              float* out) {
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) {
      const int8_t* r = x + int64_t(i) * hd;
      const float a = p[j * ldp + i] * d[i];
      for (int c = 0; c < hd; ++c) out[j * hd + c] += a * float(r[c]);
    }
}

void scores_q8_scalar(const KvQ8Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  k.each(n, [&](int r, const int8_t* x, int i0, int len) {
    scores_q8_run_scalar(x, k.scales(r), len, q, g, hd, out + i0, ldo);
  });
}

void accumulate_q8_scalar(const KvQ8Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  v.each(n, [&](int r, const int8_t* x, int i0, int len) {
    accumulate_q8_run_scalar(x, v.scales(r), len, p + i0, ldp, g, hd, out);
  });
}

// k_ic = m_c + d_c * code_ic, so q.k_i = sum_c q_c m_c + sum_c (q_c d_c) code_ic: one
// multiply per element, as for q8.
void scores_q4_scalar(const uint8_t* x, const uint16_t* dm, int n, const float* q, int g, int hd, float* out,
                      int64_t ldo) {
  for (int j = 0; j < g; ++j) {
    const float* qj = q + j * hd;
    float base = 0;
    for (int c = 0; c < hd; ++c) base += qj[c] * f16_to_f32(dm[hd + c]);
    for (int i = 0; i < n; ++i) {
      const uint8_t* r = x + int64_t(i) * hd / 2;
      float s = 0;
      for (int c = 0; c < hd; c += 2)
        s += qj[c] * f16_to_f32(dm[c]) * float(r[c / 2] & 15) + qj[c + 1] * f16_to_f32(dm[c + 1]) * float(r[c / 2] >> 4);
      out[j * ldo + i] = base + s;
    }
  }
}

// v_ic = m_i + d_i * code_ic: out_c += sum_i p_i d_i code_ic, plus sum_i p_i m_i for every c.
void accumulate_q4_scalar(const uint8_t* x, const uint16_t* dm, int n, const float* p, int64_t ldp, int g, int hd,
                          float* out) {
  for (int j = 0; j < g; ++j) {
    float* o = out + j * hd;
    float base = 0;
    for (int i = 0; i < n; ++i) {
      const uint8_t* r = x + int64_t(i) * hd / 2;
      const float a = p[j * ldp + i] * f16_to_f32(dm[i]);
      base += p[j * ldp + i] * f16_to_f32(dm[kKvBlockTokens + i]);
      for (int c = 0; c < hd; c += 2) {
        o[c] += a * float(r[c / 2] & 15);
        o[c + 1] += a * float(r[c / 2] >> 4);
      }
    }
    for (int c = 0; c < hd; ++c) o[c] += base;
  }
}

}  // namespace

// Runs f(std::integral_constant<int, G>{}, j) for the queries j .. j + G - 1, in groups
// of up to M: the kernels are instantiated per group size.
template <int M, typename F>
void for_query_groups(int g, F&& f) {
  for (int j = 0; j < g; j += M) {
    const int size = std::min(M, g - j);
    [&]<int... I>(std::integer_sequence<int, I...>) {
      ((size == I + 1 ? (f(std::integral_constant<int, I + 1>{}, j), 0) : 0), ...);
    }(std::make_integer_sequence<int, M>{});
  }
}

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "simd_exp_avx2.h"  // exp_nonpositive_avx2: scores minus their maximum
#include "simd_hsum.h"  // hsum8

namespace {

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
    for (int j = 0; j < G; ++j) out[j * ldo + i] = hsum8(acc[j]);
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
  for_query_groups<3>(g, [&](auto G, int j) { scores_g<G.value>(rows, n, q + j * hd, hd, out + j * ldo, ldo); });
}

void scores_f16_avx2(const KvF16Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 8 != 0) return scores_f16_scalar(k, n, q, g, hd, out, ldo);
  k.each(n, [&](int, const uint16_t* r, int i0, int len) {
    scores_any(HalfRows{r, k.stride}, len, q, g, hd, out + i0, ldo);
  });
}

void scores_q8_avx2(const KvQ8Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 8 != 0) return scores_q8_scalar(k, n, q, g, hd, out, ldo);
  k.each(n, [&](int r, const int8_t* x, int i0, int len) {
    scores_any(Q8Rows{x, hd}, len, q, g, hd, out + i0, ldo);
    const float* d = k.scales(r);
    for (int j = 0; j < g; ++j)
      for (int i = 0; i < len; ++i) out[j * ldo + i0 + i] *= d[i];
  });
}

template <typename Rows, typename Weight>
void accumulate_any(const Rows& rows, int n, Weight w, int g, int hd, float* out) {
  for_query_groups<3>(g, [&](auto G, int j) {
    accumulate_g<G.value>(rows, n, [&](int jj, int i) { return w(j + jj, i); }, hd, out + j * hd);
  });
}

void accumulate_f16_avx2(const KvF16Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  if (hd % 8 != 0) return accumulate_f16_scalar(v, n, p, ldp, g, hd, out);
  v.each(n, [&](int, const uint16_t* r, int i0, int len) {
    accumulate_any(HalfRows{r, v.stride}, len, [&](int j, int i) { return p[j * ldp + i0 + i]; }, g, hd, out);
  });
}

void accumulate_q8_avx2(const KvQ8Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  if (hd % 8 != 0) return accumulate_q8_scalar(v, n, p, ldp, g, hd, out);
  v.each(n, [&](int r, const int8_t* x, int i0, int len) {
    const float* d = v.scales(r);
    accumulate_any(Q8Rows{x, hd}, len, [&](int j, int i) { return p[j * ldp + i0 + i] * d[i]; }, g, hd, out);
  });
}

// As softmax_avx512: scaled scores and their maximum, exp(s - max) by the polynomial of
// simd_exp_avx2.h summed in double, then one multiply by the inverse sum (within 1e-6 of
// the scalar std::exp form).
void softmax_avx2(float* x, int n, float scale) {
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
    _mm256_storeu_ps(x + i, v);
    vmax = _mm256_max_ps(vmax, v);
  }
  alignas(32) float m8[8];
  _mm256_store_ps(m8, vmax);
  float mx = -INFINITY;
  for (float v : m8) mx = std::max(mx, v);
  for (int j = i; j < n; ++j) {
    x[j] *= scale;
    mx = std::max(mx, x[j]);
  }
  const __m256 vm = _mm256_set1_ps(mx);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double d4[4];
  _mm256_store_pd(d4, _mm256_add_pd(s0, s1));
  double sum = (d4[0] + d4[1]) + (d4[2] + d4[3]);
  if (i < n) {
    alignas(32) float t[8] = {};
    std::copy(x + i, x + n, t);
    const __m256 e = exp_nonpositive_avx2(_mm256_sub_ps(_mm256_load_ps(t), vm));
    _mm256_store_ps(t, e);
    for (int j = i; j < n; ++j) {
      x[j] = t[j - i];
      sum += t[j - i];
    }
  }
  const float invf = float(1.0 / sum);
  const __m256 inv = _mm256_set1_ps(invf);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= invf;
}

}  // namespace

#pragma GCC pop_options

// AVX-512: f16 and q8 rows of a multiple of 16 values, 16 per step; other widths go to the AVX2
// kernels. As there, a query's sums do not depend on how many queries share the call.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl")
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* operands that -Wuninitialized
// reports, and it warns about the vector ABI of lambdas in this region: false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"

#include "simd_exp.h"  // exp_nonpositive: scores minus their maximum

namespace {

inline __m512 load_half16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One run's rows for the AVX-512 kernels: load(i, c) gives 16 values of row i from column
// c as f32, weight(p, i) the factor of row i's probability p in a value sum, and finish
// scales a run's raw scores (q8 rows: by their scales; f16: nothing to do).
struct Half16Rows {
  const uint16_t* base;
  int64_t stride;
  __m512 load(int i, int c) const { return load_half16(base + i * stride + c); }
  float weight(float p, int) const { return p; }
  void finish(float*, int64_t, int, int) const {}
};

struct Q8x16Rows {
  const int8_t* base;
  int64_t hd;
  const float* d;
  __m512 load(int i, int c) const {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + int64_t(i) * hd + c))));
  }
  float weight(float p, int i) const { return p * d[i]; }
  void finish(float* out, int64_t ldo, int g, int n) const {
    for (int j = 0; j < g; ++j)
      for (int i = 0; i < n; ++i) out[j * ldo + i] *= d[i];
  }
};

inline Half16Rows rows_of(const KvF16Rows& k, int r) { return {k.start(r), k.stride}; }
inline Q8x16Rows rows_of(const KvQ8Rows& k, int r) { return {k.start(r), k.stride, k.scales(r)}; }

// f(rows of one run, index of its first row, rows) per run, in order. Inlined into the
// kernel, so that f's sums stay in registers across runs (called, they lived in memory
// and the value kernel took twice as long).
template <typename T, typename F>
[[gnu::always_inline]] inline void each_run(const KvRowRuns<T>& rows, int n, F&& f) {
  rows.each(n, [&](int r, const T*, int i0, int len) { f(rows_of(rows, r), i0, len); });
}

// Raw dot products of G queries with n rows, 4 rows at a time: each (row, query)
// accumulates 16 lanes, folded to 8 and summed four rows at once. C > 0: rows of 16 C
// values, with the queries held in registers instead of loaded at every FMA (the loads
// bound the kernel: in cache 5.8 -> 5.2 ns per row for 3 queries at hd = 64 in one
// process, alternating; 8 sequences x 512 decode at 1 thread +2-4 %). Eight rows at a time
// with their sums reduced together by shuffles across rows was no faster.
template <int G, int C, typename T>
void scores_g512(const KvRowRuns<T>& runs, int n, const float* q, int hd, float* out, int64_t ldo) {
  auto fold = [](__m512 a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))); };
  const int chunks = C > 0 ? C : hd / 16;
  __m512 qv[G][C > 0 ? C : 1];
  if constexpr (C > 0)
    for (int j = 0; j < G; ++j)
      for (int k = 0; k < C; ++k) qv[j][k] = _mm512_loadu_ps(q + j * hd + 16 * k);
  auto query = [&](int j, int k) {
    if constexpr (C > 0)
      return qv[j][k];
    else
      return _mm512_loadu_ps(q + j * hd + 16 * k);
  };
  each_run(runs, n, [&](const auto& rows, int i0, int len) {
    float* o = out + i0;
    int i = 0;
    for (; i + 4 <= len; i += 4) {
      __m512 acc[G][4];
      for (int j = 0; j < G; ++j)
        for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_setzero_ps();
      for (int k = 0; k < chunks; ++k)
        for (int r = 0; r < 4; ++r) {
          const __m512 kv = rows.load(i + r, 16 * k);
          for (int j = 0; j < G; ++j) acc[j][r] = _mm512_fmadd_ps(query(j, k), kv, acc[j][r]);
        }
      for (int j = 0; j < G; ++j)
        _mm_storeu_ps(o + j * ldo + i, hsum4(fold(acc[j][0]), fold(acc[j][1]), fold(acc[j][2]), fold(acc[j][3])));
    }
    for (; i < len; ++i) {
      __m512 acc[G];
      for (int j = 0; j < G; ++j) acc[j] = _mm512_setzero_ps();
      for (int k = 0; k < chunks; ++k) {
        const __m512 kv = rows.load(i, 16 * k);
        for (int j = 0; j < G; ++j) acc[j] = _mm512_fmadd_ps(query(j, k), kv, acc[j]);
      }
      for (int j = 0; j < G; ++j) o[j * ldo + i] = hsum8(fold(acc[j]));
    }
    rows.finish(o, ldo, G, len);
  });
}

template <typename T>
void scores_avx512(const KvRowRuns<T>& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  for_query_groups<3>(g, [&](auto G, int j) {
    if (hd == 64)
      scores_g512<G.value, 4>(k, n, q + j * hd, hd, out + j * ldo, ldo);
    else
      scores_g512<G.value, 0>(k, n, q + j * hd, hd, out + j * ldo, ldo);
  });
}

void scores_f16_avx512(const KvF16Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 16 != 0) return scores_f16_avx2(k, n, q, g, hd, out, ldo);
  scores_avx512(k, n, q, g, hd, out, ldo);
}

void scores_q8_avx512(const KvQ8Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo) {
  if (hd % 16 != 0) return scores_q8_avx2(k, n, q, g, hd, out, ldo);
  scores_avx512(k, n, q, g, hd, out, ldo);
}

// out_j += sum_i w_j(i) * row_i for B blocks of 16 columns from c0, with w_j(i) =
// rows.weight(p[j * ldp + i], i); G x B outputs held in registers across rows, and across
// the runs of a paged stream (one call per block stored and reloaded them, and the calls
// took half the time: 3.9 against 2.2 ns per row in cache for G = 3, hd = 64). B is a
// template argument: with a run-time count the accumulators lived on the stack, and each
// FMA waited for the store of the one before (8.1 against 3.9 ns per row).
template <int G, int B, typename T>
void accumulate_gb512(const KvRowRuns<T>& runs, int n, const float* p, int64_t ldp, int hd, int c0, float* out) {
  __m512 o[G][B];
  for (int j = 0; j < G; ++j)
    for (int b = 0; b < B; ++b) o[j][b] = _mm512_loadu_ps(out + j * hd + c0 + 16 * b);
  each_run(runs, n, [&](const auto& rows, int i0, int len) {
    for (int i = 0; i < len; ++i) {
      __m512 a[G];
      for (int j = 0; j < G; ++j) a[j] = _mm512_set1_ps(rows.weight(p[j * ldp + i0 + i], i));
      for (int b = 0; b < B; ++b) {
        const __m512 x = rows.load(i, c0 + 16 * b);
        for (int j = 0; j < G; ++j) o[j][b] = _mm512_fmadd_ps(a[j], x, o[j][b]);
      }
    }
  });
  for (int j = 0; j < G; ++j)
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(out + j * hd + c0 + 16 * b, o[j][b]);
}

// out_j += sum_i w_j(i) * row_i, 64 columns at a time, up to 4 queries at once.
template <typename T>
void accumulate_avx512(const KvRowRuns<T>& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  for_query_groups<4>(g, [&](auto G, int j) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
      const float* pj = p + j * ldp;
      float* oj = out + j * hd;
      switch ((hd - c0 < 64 ? hd - c0 : 64) / 16) {
        case 4: accumulate_gb512<G.value, 4>(v, n, pj, ldp, hd, c0, oj); break;
        case 3: accumulate_gb512<G.value, 3>(v, n, pj, ldp, hd, c0, oj); break;
        case 2: accumulate_gb512<G.value, 2>(v, n, pj, ldp, hd, c0, oj); break;
        default: accumulate_gb512<G.value, 1>(v, n, pj, ldp, hd, c0, oj); break;
      }
    }
  });
}

void accumulate_f16_avx512(const KvF16Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  if (hd % 16 != 0) return accumulate_f16_avx2(v, n, p, ldp, g, hd, out);
  accumulate_avx512(v, n, p, ldp, g, hd, out);
}

void accumulate_q8_avx512(const KvQ8Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out) {
  if (hd % 16 != 0) return accumulate_q8_avx2(v, n, p, ldp, g, hd, out);
  accumulate_avx512(v, n, p, ldp, g, hd, out);
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

// 4-bit rows of a multiple of 32 values: 16 code bytes widen to 16 int32 lanes, whose low
// nibbles are channels 0, 2, .., 30 of the chunk and high nibbles channels 1, 3, .., 31.
inline void q4_codes16(const uint8_t* p, __m512* even, __m512* odd) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  *even = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
  *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}

constexpr int kQ4MaxHd = 256;

// Keys quantized per channel: the queries' q_c d_c are split into even and odd channels
// once, then each row costs one widening per 32 channels and one FMA per 16 channels and
// query; rows go 4 at a time into the same folded sums as the f16 scores.
template <int G>
void scores_q4_g512(const uint8_t* x, const uint16_t* dm, int n, const float* q, int hd, float* out, int64_t ldo) {
  alignas(64) float qe[G][kQ4MaxHd / 2], qo[G][kQ4MaxHd / 2];
  float base[G];
  const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  for (int j = 0; j < G; ++j) {
    __m512 b = _mm512_setzero_ps();
    for (int c = 0; c < hd; c += 32) {
      const __m512 q0 = _mm512_loadu_ps(q + j * hd + c), q1 = _mm512_loadu_ps(q + j * hd + c + 16);
      const __m512 a0 = _mm512_mul_ps(q0, load_half16(dm + c)), a1 = _mm512_mul_ps(q1, load_half16(dm + c + 16));
      _mm512_store_ps(qe[j] + c / 2, _mm512_permutex2var_ps(a0, ev, a1));
      _mm512_store_ps(qo[j] + c / 2, _mm512_permutex2var_ps(a0, od, a1));
      b = _mm512_fmadd_ps(q1, load_half16(dm + hd + c + 16), _mm512_fmadd_ps(q0, load_half16(dm + hd + c), b));
    }
    base[j] = _mm512_reduce_add_ps(b);
  }
  auto fold = [](__m512 a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))); };
  const int rb = hd / 2;  // bytes per row
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    __m512 acc[G][4];
    for (int j = 0; j < G; ++j)
      for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_setzero_ps();
    for (int b = 0; b < rb; b += 16)
      for (int r = 0; r < 4; ++r) {
        __m512 e, o;
        q4_codes16(x + int64_t(i + r) * rb + b, &e, &o);
        for (int j = 0; j < G; ++j)
          acc[j][r] = _mm512_fmadd_ps(_mm512_load_ps(qo[j] + b), o, _mm512_fmadd_ps(_mm512_load_ps(qe[j] + b), e, acc[j][r]));
      }
    for (int j = 0; j < G; ++j)
      _mm_storeu_ps(out + j * ldo + i, _mm_add_ps(_mm_set1_ps(base[j]), hsum4(fold(acc[j][0]), fold(acc[j][1]), fold(acc[j][2]), fold(acc[j][3]))));
  }
  for (; i < n; ++i) {
    __m512 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < rb; b += 16) {
      __m512 e, o;
      q4_codes16(x + int64_t(i) * rb + b, &e, &o);
      for (int j = 0; j < G; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_load_ps(qo[j] + b), o, _mm512_fmadd_ps(_mm512_load_ps(qe[j] + b), e, acc[j]));
    }
    for (int j = 0; j < G; ++j) out[j * ldo + i] = base[j] + hsum8(fold(acc[j]));
  }
}

void scores_q4_avx512(const uint8_t* x, const uint16_t* dm, int n, const float* q, int g, int hd, float* out,
                      int64_t ldo) {
  if (hd % 32 != 0 || hd > kQ4MaxHd) return scores_q4_scalar(x, dm, n, q, g, hd, out, ldo);
  for_query_groups<3>(g, [&](auto G, int j) { scores_q4_g512<G.value>(x, dm, n, q + j * hd, hd, out + j * ldo, ldo); });
}

// Values quantized per token: out_j gathers p_j(i) d_i x codes in even- and odd-channel
// registers (up to 128 channels per pass), interleaved back into channel order at the end,
// plus sum_i p_j(i) m_i in every channel.
template <int G>
void accumulate_q4_g512(const uint8_t* x, const uint16_t* dm, int n, const float* p, int64_t ldp, int hd, float* out) {
  const int rb = hd / 2;
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  // Per row and query p d (for the codes) and p m (summed), n <= kKvBlockTokens rows.
  const __mmask16 rows = __mmask16((1u << n) - 1);
  const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(rows, dm));
  const __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(rows, dm + kKvBlockTokens));
  alignas(64) float pd[G][kKvBlockTokens];
  float base[G];
  for (int j = 0; j < G; ++j) {
    const __m512 pj = _mm512_maskz_loadu_ps(rows, p + j * ldp);
    _mm512_store_ps(pd[j], _mm512_mul_ps(pj, d));
    base[j] = _mm512_reduce_add_ps(_mm512_mul_ps(pj, m));
  }
  for (int b0 = 0; b0 < rb; b0 += 64) {  // 64 code bytes = 128 channels per pass
    const int chunks = (rb - b0 < 64 ? rb - b0 : 64) / 16;
    __m512 e[G][4], o[G][4];
    for (int j = 0; j < G; ++j)
      for (int k = 0; k < chunks; ++k) e[j][k] = o[j][k] = _mm512_setzero_ps();
    for (int i = 0; i < n; ++i) {
      __m512 a[G];
      for (int j = 0; j < G; ++j) a[j] = _mm512_set1_ps(pd[j][i]);
      for (int k = 0; k < chunks; ++k) {
        __m512 ce, co;
        q4_codes16(x + int64_t(i) * rb + b0 + 16 * k, &ce, &co);
        for (int j = 0; j < G; ++j) {
          e[j][k] = _mm512_fmadd_ps(a[j], ce, e[j][k]);
          o[j][k] = _mm512_fmadd_ps(a[j], co, o[j][k]);
        }
      }
    }
    for (int j = 0; j < G; ++j) {
      const __m512 bj = _mm512_set1_ps(base[j]);
      for (int k = 0; k < chunks; ++k) {
        float* oc = out + j * hd + 2 * (b0 + 16 * k);
        _mm512_storeu_ps(oc, _mm512_add_ps(_mm512_loadu_ps(oc), _mm512_add_ps(_mm512_permutex2var_ps(e[j][k], lo, o[j][k]), bj)));
        _mm512_storeu_ps(oc + 16, _mm512_add_ps(_mm512_loadu_ps(oc + 16), _mm512_add_ps(_mm512_permutex2var_ps(e[j][k], hi, o[j][k]), bj)));
      }
    }
  }
}

void accumulate_q4_avx512(const uint8_t* x, const uint16_t* dm, int n, const float* p, int64_t ldp, int g, int hd,
                          float* out) {
  if (hd % 32 != 0 || n > kKvBlockTokens) return accumulate_q4_scalar(x, dm, n, p, ldp, g, hd, out);
  for_query_groups<3>(g, [&](auto G, int j) { accumulate_q4_g512<G.value>(x, dm, n, p + j * ldp, ldp, hd, out + j * hd); });
}

}  // namespace

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif  // defined(__x86_64__)

#if defined(__aarch64__)
#include "kv_attention_neon.inc"
#endif

const KvAttentionKernels& kv_attention_kernels_scalar() {
  static const KvAttentionKernels k{"scalar",          scores_f16_scalar, accumulate_f16_scalar, scores_q8_scalar,
                                    accumulate_q8_scalar, scores_q4_scalar,  accumulate_q4_scalar,  softmax_scalar};
  return k;
}

// Built on first use, outside the target regions (function pointers only).
const KvAttentionKernels& kv_attention_kernels() {
#if defined(__aarch64__)
  if (isa_enabled(Isa::neon)) return kv_attention_kernels_neon();
#endif
#if defined(__x86_64__)
  if (isa_enabled(Isa::avx512)) {
    static const KvAttentionKernels k{"avx512",          scores_f16_avx512,    accumulate_f16_avx512,
                                      scores_q8_avx512,  accumulate_q8_avx512, scores_q4_avx512,
                                      accumulate_q4_avx512, softmax_avx512};
    return k;
  }
  if (isa_enabled(Isa::avx2)) {
    static const KvAttentionKernels k{"avx2",           scores_f16_avx2,      accumulate_f16_avx2,
                                      scores_q8_avx2,   accumulate_q8_avx2,   scores_q4_scalar,
                                      accumulate_q4_scalar, softmax_avx2};
    return k;
  }
#endif
  return kv_attention_kernels_scalar();
}

}  // namespace slim::llm
