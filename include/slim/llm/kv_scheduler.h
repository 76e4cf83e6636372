// Continuous batching over a paged LlamaContext: every step is one forward pass that
// carries one token of each decoding sequence plus prefill chunks of newly admitted ones,
// so the weights are read once per step for the whole batch. Requests are admitted
// between steps, most urgent first, when a sequence slot and enough pool blocks are free
// (never more than the pool can hold: a request that does not fit waits). A waiting
// request more urgent than a running one preempts it: the running one gives up its slot
// and blocks and resumes later from its tokens so far, producing exactly what it would
// have produced (its KV is recomputed, or found again in the prefix cache).
// With the prefix cache, finished and preempted sequences keep their KV in the spare
// slots; a new request whose tokens start with a cached sequence's shares its blocks and
// prefills only the rest. Cached sequences are evicted least recently used first, as soon
// as a running sequence needs their slot or blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slim/llm/model.h"
#include "slim/llm/sampler.h"

namespace slim::llm {

struct KvBatchOptions {
  int max_step_tokens = 256;  // tokens per forward pass (decode tokens + prefill chunks)
  int prefill_chunk = 128;    // most prompt tokens of one sequence per step
  int max_running = 0;        // sequences generating at once; 0: every slot of the cache
  // Keep the KV of finished and preempted sequences in the slots beyond max_running for
  // reuse. Needs a cache that keeps every token (no eviction policy): a pruned cache is
  // not the prefix of anything.
  bool prefix_cache = false;
  bool preempt = true;  // a more urgent waiting request preempts the least urgent running one
};

inline SamplerOptions greedy_sampling() {
  SamplerOptions o;
  o.temperature = 0;
  return o;
}

enum class KvFinish { length, stopped, cancelled, failed };
const char* kv_finish_name(KvFinish f);

struct KvBatchResult {
  std::vector<int32_t> tokens;
  int first_step = -1, last_step = -1;  // steps that produced the first and last token
  KvFinish finish = KvFinish::length;
  std::string error;        // failed: why
  int reused_tokens = 0;    // tokens whose KV came from the prefix cache instead of a prefill
  int preemptions = 0;
};

struct KvBatchRequest {
  KvBatchRequest() = default;
  KvBatchRequest(std::vector<int32_t> p, int max_new) : prompt(std::move(p)), max_tokens(max_new) {}
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplerOptions sampling = greedy_sampling();
  int priority = 0;  // lower is more urgent
  // Each generated token, with the logits it was drawn from; returning false finishes the
  // request (KvFinish::stopped) after that token.
  std::function<bool(int32_t token, const float* logits)> on_token;
  // Called once when the request ends; its result is then not kept in the scheduler.
  std::function<void(const KvBatchResult&)> on_finish;
};

struct KvBatchStats {
  int64_t steps = 0, decode_tokens = 0, prefill_tokens = 0;
  int max_running = 0;
  int64_t waits = 0;  // steps in which a queued request could not be admitted
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0, reused_tokens = 0;  // prefix cache: tokens looked up, tokens found
};

// A request's tokens in one step: prompt tokens (a prefill chunk, or a preempted
// sequence's recomputation) or the one token of a decoding sequence.
struct KvStepShare {
  int id = 0;
  int tokens = 0;
  bool prefill = false;
  int seq = -1;  // the context's sequence slot that ran them (its ExpertUsage has their routing)
};

class KvBatchScheduler {
 public:
  // ctx must have a paged KV cache; its sequence slots are all used by the scheduler.
  KvBatchScheduler(LlamaContext& ctx, KvBatchOptions options);
  ~KvBatchScheduler();
  // Returns the request id. Throws invalid_argument / resource_exhausted for a request
  // that can never run (empty prompt, longer than the context, more blocks than the pool).
  int submit(KvBatchRequest request);
  // Finishes a waiting or running request (KvFinish::cancelled) at the next step.
  void cancel(int id);
  // One forward pass. Returns false when there was nothing left to do.
  bool step();
  void run();  // until every request is done
  // The result of a finished request that has no on_finish callback.
  const KvBatchResult& result(int id) const;
  const KvBatchStats& stats() const { return stats_; }
  // The requests of the last step() that ran a forward pass, with their tokens (for sharing
  // the step's cost); empty when it ran none.
  const std::vector<KvStepShare>& last_step() const { return last_step_; }
  int running() const { return int(running_.size()); }
  int waiting() const { return int(waiting_.size()); }
  int cached_sequences() const { return int(cache_.size()); }
  // KV bytes the sequence of a running request holds (0 when it is not running).
  int64_t sequence_bytes(int id) const;
  // Drops every cached prefix (the pool is then empty when nothing runs).
  void clear_prefix_cache();

 private:
  struct Job;
  struct CacheEntry {
    int seq;
    std::vector<int32_t> tokens;  // whose KV the sequence holds
    int64_t last_used;
  };
  void admit();
  bool start(Job& j);
  void preempt(Job& j);
  void finish(Job& j, KvFinish why, std::string error = {});
  void release_sequence(Job& j);
  void evict(size_t entry);
  // Evicts the least recently used entry other than `keep`; returns its index, or
  // size_t(-1) when there was none to evict.
  size_t evict_lru(size_t keep);
  int64_t worst_case_blocks(const KvBatchRequest& r) const;
  int64_t outstanding_blocks() const;  // blocks running sequences may still take

  LlamaContext& ctx_;
  KvBatchOptions options_;
  int max_running_ = 0;
  std::map<int, std::unique_ptr<Job>> jobs_;             // waiting and running, by id
  std::map<std::pair<int, int64_t>, Job*> waiting_;      // by (priority, arrival)
  std::vector<Job*> running_;
  std::vector<CacheEntry> cache_;
  std::map<int, KvBatchResult> results_;
  int next_id_ = 0;
  int64_t arrivals_ = 0, clock_ = 0, reserved_ = 0;
  KvBatchStats stats_;
  std::vector<KvStepShare> last_step_;
};

}  // namespace slim::llm
