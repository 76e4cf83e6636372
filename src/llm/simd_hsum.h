// The sum of a 256-bit register's eight floats, shared by the AVX2 and AVX-512 kernels of
// kernels.cc and kv_attention.cc. Include it inside namespace slim::llm, in a region
// compiled for AVX2 (#pragma GCC target) of a file that includes <immintrin.h>; the
// function is static, one copy per file (AVX-512 regions of the file may call it).
#pragma once

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
