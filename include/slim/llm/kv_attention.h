// Attention kernels over runs of KV rows (a block of the paged cache, or the contiguous
// cache): scores of many keys against one query and the probability-weighted sum of many
// values, for f16 and q8 rows. AVX2 versions are picked at startup when the CPU has them;
// the scalar versions are the reference the tests hold them to.
#pragma once

#include <cstdint>

namespace slim::llm {

struct KvAttentionKernels {
  const char* isa;
  // out[i] = dot(q, k_i) for n f16 key rows at k + i * stride (elements).
  void (*scores_f16)(const uint16_t* k, int64_t stride, int n, const float* q, int hd, float* out);
  // out += sum_i p[i] * v_i over n f16 value rows.
  void (*accumulate_f16)(const uint16_t* v, int64_t stride, int n, const float* p, int hd, float* out);
  // q8 rows (int8 at x + i * hd, scale d[i]): out[i] = d[i] * dot(q, x_i).
  void (*scores_q8)(const int8_t* x, const float* d, int n, const float* q, int hd, float* out);
  // out += sum_i p[i] * d[i] * x_i.
  void (*accumulate_q8)(const int8_t* x, const float* d, int n, const float* p, int hd, float* out);
};

const KvAttentionKernels& kv_attention_kernels();         // best for this CPU
const KvAttentionKernels& kv_attention_kernels_scalar();  // reference

}  // namespace slim::llm
