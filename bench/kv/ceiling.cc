// How much batching can gain on this machine for an F16 model, from the matmuls alone:
// the time of one token's pass over an F16 weight matrix the size of the shared model
// (15.7 M values, 31 MB, so it comes from memory as in a decode step) against one pass of
// 8 tokens, with the engine's own tile (KernelSet::tile_f16x16, the kernel of a batched
// decode step) on repacked rows. 8 x t(1) / t(8) bounds "8 sequences per step against one
// at a time" before attention and every other per-token cost. Also prints the machine's
// 512-bit FMA peak (independent multiply-adds in registers), the 8-token tile's ceiling.
//   bench/kv/ceiling.sh [BUILD_DIR]
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "slim/core/cpu_features.h"
#include "slim/core/half.h"
#include "slim/llm/kernels.h"

using namespace slim::llm;

namespace {

volatile float g_sink;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if defined(__x86_64__)
// Multiply-adds per second of 24 independent 16-lane FMA chains (the FMA units' peak).
[[gnu::target("avx512f")]] double fma_peak() {
  __m512 a[24];
  for (int i = 0; i < 24; ++i) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  __m512 x = _mm512_set1_ps(0.999f);
  const __m512 y = _mm512_set1_ps(1e-4f);
  const int64_t n = 4'000'000;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < n; ++k) {
      asm volatile("" : "+v"(x));  // one loop-carried input, so the loop is not folded
#pragma GCC unroll 24
      for (int i = 0; i < 24; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    best = std::min(best, seconds_since(t0));
  }
  float sum = 0;
  for (int i = 0; i < 24; ++i) sum += _mm512_reduce_add_ps(a[i]);
  g_sink = sum;  // the chains' results are used, so they are computed
  return double(n) * 24 * 16 / best;
}
#else
double fma_peak() { return 0; }  // measured on x86-64 (AVX-512) only
#endif

}  // namespace

int main() {
  const KernelSet& k = kernels();
  if (!k.tile_f16x16) {
    std::printf("kernel set %s has no F16 tile; nothing to measure\n", k.isa);
    return 0;
  }
  const int64_t cols = 384, rows = 40'960;  // 15.7 M values
  const int64_t wb = cols * 2, xb = act_row_bytes(ActType::f16, cols);
  std::vector<uint8_t> w(size_t(rows * wb));
  uint32_t s = 1;
  for (int64_t i = 0; i < rows * cols; ++i) {
    s = s * 1664525u + 1013904223u;
    const uint16_t h = slim::f32_to_f16(float(int32_t(s >> 8) - (1 << 23)) / float(1 << 28));
    std::memcpy(w.data() + 2 * i, &h, 2);
  }
  for (int64_t r = 0; r < rows; r += 16) repack_x16(slim::llm::GgmlType::f16, w.data() + r * wb, cols);
  std::vector<uint8_t> x(size_t(8 * xb));
  std::vector<float> xf(static_cast<size_t>(cols));
  for (int t = 0; t < 8; ++t) {
    for (int64_t c = 0; c < cols; ++c) xf[size_t(c)] = float((c * 7 + t * 13) % 17) / 17.f - 0.5f;
    quantize_act_row(k, ActType::f16, xf.data(), x.data() + t * xb, cols);
  }
  std::vector<float> y(size_t(8 * rows));
  auto pass = [&](int nt) {
    double best = 1e30;
    for (int rep = 0; rep < 15; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t r = 0; r < rows; r += 16) k.tile_f16x16(cols, w.data() + r * wb, 16, x.data(), xb, nt, y.data() + r, rows);
      best = std::min(best, seconds_since(t0));
    }
    return best;
  };
  const double t1 = pass(1), t8 = pass(8), macs = double(rows) * cols;
  std::printf("kernel set %s, F16 weights %.1f MB\n", k.isa, double(rows * wb) / 1e6);
  if (slim::isa_enabled(slim::Isa::avx512))
    std::printf("FMA peak (512-bit, in registers)   %7.1f GMAC/s\n", fma_peak() / 1e9);
  std::printf("1 token:  %.3f ms per pass        %7.1f GMAC/s\n", t1 * 1e3, macs / t1 / 1e9);
  std::printf("8 tokens: %.3f ms per pass        %7.1f GMAC/s\n", t8 * 1e3, 8 * macs / t8 / 1e9);
  std::printf("matmul-only batching ceiling, 8 x t(1) / t(8): %.2fx\n", 8 * t1 / t8);
  return 0;
}
