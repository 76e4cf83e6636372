// Attention kernels over runs of KV rows (a block of the paged cache, or the contiguous
// cache): scores of many keys against one query and the probability-weighted sum of many
// values, for f16, q8 and 4-bit rows. AVX-512 (rows of a multiple of 16 values; 4-bit: 32) and AVX2
// versions (x86-64), NEON f16/q8 ones (aarch64) are picked at startup when the CPU has them;
// the scalar versions are the reference the tests hold them to.
#pragma once

#include <algorithm>
#include <cstdint>

namespace slim::llm {

// Tokens per block of the paged KV cache (a block of 4-bit values stores this many per-row
// scales, then as many minimums).
constexpr int kKvBlockTokens = 16;

// Key or value rows in runs: the blocks of a paged stream (run = kKvBlockTokens rows, run
// r at base + runs[r] * run_stride), or one run from base (runs = nullptr). Rows of a run
// are stride elements apart; only the last run may be shorter. One call takes a stream's
// whole run list, so the kernels keep their sums in registers from block to block. q8
// rows (int8 codes, hd per row) keep their float scales after their run's codes, as in a
// paged block: at start(r) + run * stride.
template <typename T>
struct KvRowRuns {
  const T* base = nullptr;
  const int32_t* runs = nullptr;
  int64_t run_stride = 0;
  int run = 0;
  int64_t stride = 0;
  // Bytes from each run's start that each() fetches kAhead runs ahead of use (a paged
  // block's part: its rows and, for q8, their scales). Blocks lie anywhere in the pool,
  // where the hardware prefetcher, which follows streams within a page, cannot run ahead.
  int64_t fetch_bytes = 0;
  static constexpr int kAhead = 4;

  // One run of rows stride apart (f16; q8 codes need run = the row count, see above).
  static KvRowRuns contiguous(const T* base, int64_t stride, int rows = INT32_MAX) {
    return {base, nullptr, 0, rows, stride};
  }
  const T* start(int r) const { return runs ? base + int64_t(runs[r]) * run_stride : base; }
  const float* scales(int r) const { return reinterpret_cast<const float*>(start(r) + int64_t(run) * stride); }
  // f(run index, its first row, index of that row, rows) for each run of n rows, in order,
  // fetching ahead when fetch_bytes is set. (The fetch loop stays written out here: GCC
  // judged a function or lambda that only prefetches free of side effects and dropped
  // its calls.)
  template <typename F>
  [[gnu::always_inline]] void each(int n, F&& f) const {
    const int nruns = n <= 0 ? 0 : runs ? (n + run - 1) / run : 1;
    for (int r = 0; r < nruns; ++r) {
      if (runs && fetch_bytes > 0)
        for (int a = r == 0 ? 0 : r + kAhead; a <= r + kAhead && a < nruns; ++a) {
          const char* p = reinterpret_cast<const char*>(start(a));
          for (int64_t o = 0; o < fetch_bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
        }
      const int i0 = r * (runs ? run : 0);
      f(r, start(r), i0, runs ? std::min(run, n - i0) : n);
    }
  }
};
using KvF16Rows = KvRowRuns<uint16_t>;
using KvQ8Rows = KvRowRuns<int8_t>;

// Every kernel takes g queries at once (the query heads that share a KV head under
// grouped-query attention), so each key and value row is loaded and converted once for
// all of them. A query's result does not depend on g: the same sums in the same order.
struct KvAttentionKernels {
  const char* isa;
  // out[j * ldo + i] = dot(q_j, k_i) for queries q_j = q + j * hd and the first n f16 key
  // rows k_i of k.
  void (*scores_f16)(const KvF16Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo);
  // out_j += sum_i p[j * ldp + i] * v_i over the first n f16 value rows; out_j = out + j * hd.
  void (*accumulate_f16)(const KvF16Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out);
  // q8 rows (int8 codes x_i, scale d_i; stride hd): out[j * ldo + i] = d_i * dot(q_j, x_i).
  void (*scores_q8)(const KvQ8Rows& k, int n, const float* q, int g, int hd, float* out, int64_t ldo);
  // out_j += sum_i p[j * ldp + i] * d_i * x_i.
  void (*accumulate_q8)(const KvQ8Rows& v, int n, const float* p, int64_t ldp, int g, int hd, float* out);
  // 4-bit keys of a block (KIVI: per channel): codes at x + i * hd / 2, two per byte
  // (channel 2k in the low nibble of byte k), dm = hd f16 scales then hd f16 minimums;
  // out[j * ldo + i] = dot(q_j, m + d * codes_i).
  void (*scores_q4)(const uint8_t* x, const uint16_t* dm, int n, const float* q, int g, int hd, float* out, int64_t ldo);
  // 4-bit values of a block (per token): codes as for keys, dm = kKvBlockTokens f16 scales
  // then kKvBlockTokens f16 minimums, one per row; out_j += sum_i p[j * ldp + i] * (m_i + d_i * codes_i).
  void (*accumulate_q4)(const uint8_t* x, const uint16_t* dm, int n, const float* p, int64_t ldp, int g, int hd,
                        float* out);
  // The attention softmax of n raw scores, in place: x_i = exp(s_i - max_k s_k) / sum, with
  // s_i = scale * x_i. Both KV caches call it, so they agree bit for bit.
  void (*softmax)(float* x, int n, float scale);
};

const KvAttentionKernels& kv_attention_kernels();         // best at core's active_isa()
const KvAttentionKernels& kv_attention_kernels_scalar();  // reference

}  // namespace slim::llm
