// Continuous batching over a paged LlamaContext: every step is one forward pass that
// carries one token of each decoding sequence plus prefill chunks of newly admitted ones,
// so the weights are read once per step for the whole batch. Requests are admitted
// between steps when a sequence slot and enough pool blocks are free (never more than
// the pool can hold: a request that does not fit waits).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "slim/llm/model.h"
#include "slim/llm/sampler.h"

namespace slim::llm {

struct KvBatchOptions {
  int max_step_tokens = 256;  // tokens per forward pass (decode tokens + prefill chunks)
  int prefill_chunk = 128;    // most prompt tokens of one sequence per step
};

inline SamplerOptions greedy_sampling() {
  SamplerOptions o;
  o.temperature = 0;
  return o;
}

struct KvBatchRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplerOptions sampling = greedy_sampling();
};

struct KvBatchResult {
  std::vector<int32_t> tokens;
  int first_step = -1, last_step = -1;  // steps that produced the first and last token
};

struct KvBatchStats {
  int64_t steps = 0, decode_tokens = 0, prefill_tokens = 0;
  int max_running = 0;
  int64_t waits = 0;  // steps in which a queued request could not be admitted
};

class KvBatchScheduler {
 public:
  // ctx must have a paged KV cache; its sequence slots are all used by the scheduler.
  KvBatchScheduler(LlamaContext& ctx, KvBatchOptions options);
  int submit(KvBatchRequest request);  // returns the request id (index into results())
  // One forward pass. Returns false when there was nothing left to do.
  bool step();
  void run();  // until every request is done
  const std::vector<KvBatchResult>& results() const { return results_; }
  const KvBatchStats& stats() const { return stats_; }
  int running() const { return int(running_.size()); }

 private:
  struct Running {
    int id, seq, prefilled = 0;
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> history;
    int64_t reserved_blocks = 0;
  };
  void admit();
  int64_t worst_case_blocks(const KvBatchRequest& r) const;

  LlamaContext& ctx_;
  KvBatchOptions options_;
  std::vector<KvBatchRequest> requests_;
  std::vector<KvBatchResult> results_;
  std::deque<int> queue_;
  std::vector<Running> running_;
  int64_t reserved_ = 0;
  KvBatchStats stats_;
};

}  // namespace slim::llm
