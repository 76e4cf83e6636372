#include "slim/llm/kv_scheduler.h"

#include <algorithm>

#include "slim/core/error.h"

namespace slim::llm {

KvBatchScheduler::KvBatchScheduler(LlamaContext& ctx, KvBatchOptions options) : ctx_(ctx), options_(options) {
  KvCache& cache = ctx_.kv_cache();  // throws for a contiguous cache
  if (options_.max_step_tokens <= 0 || options_.prefill_chunk <= 0)
    throw Error(ErrorCode::invalid_argument, "batch scheduler: step and chunk sizes must be positive");
  for (int s = 0; s < cache.max_seqs(); ++s)
    if (cache.active(s)) ctx_.remove_sequence(s);
}

// Blocks the request could take if nothing were evicted: admission reserves them, so a
// running sequence can always take its next step and the pool never runs dry mid-request.
int64_t KvBatchScheduler::worst_case_blocks(const KvBatchRequest& r) const {
  const KvLayout& L = ctx_.kv_cache().layout();
  const int64_t tokens = int64_t(r.prompt.size()) + r.max_tokens;
  return (tokens + kKvBlockTokens - 1) / kKvBlockTokens * L.n_layer * L.n_head_kv;
}

int KvBatchScheduler::submit(KvBatchRequest r) {
  const KvCache& cache = ctx_.kv_cache();
  if (r.prompt.empty()) throw Error(ErrorCode::invalid_argument, "batch scheduler: empty prompt");
  if (r.max_tokens < 1) throw Error(ErrorCode::invalid_argument, "batch scheduler: max_tokens must be >= 1");
  if (int64_t(r.prompt.size()) + r.max_tokens > cache.max_tokens())
    throw Error(ErrorCode::resource_exhausted, "batch scheduler: " + std::to_string(r.prompt.size()) + " prompt + " +
                                                   std::to_string(r.max_tokens) + " new tokens exceed the context of " +
                                                   std::to_string(cache.max_tokens()));
  if (worst_case_blocks(r) > cache.pool().capacity())
    throw Error(ErrorCode::resource_exhausted, "batch scheduler: a request of " +
                                                   std::to_string(int64_t(r.prompt.size()) + r.max_tokens) +
                                                   " tokens needs " + std::to_string(worst_case_blocks(r)) +
                                                   " KV blocks, the pool has " + std::to_string(cache.pool().capacity()));
  Sampler probe(r.sampling, ctx_.model().config().n_vocab);  // rejects bad options now
  requests_.push_back(std::move(r));
  results_.emplace_back();
  queue_.push_back(int(requests_.size()) - 1);
  return int(requests_.size()) - 1;
}

void KvBatchScheduler::admit() {
  const KvCache& cache = ctx_.kv_cache();
  while (!queue_.empty() && int(running_.size()) < cache.max_seqs()) {
    const KvBatchRequest& r = requests_[size_t(queue_.front())];
    const int64_t need = worst_case_blocks(r);
    if (reserved_ + need > cache.pool().capacity()) {
      ++stats_.waits;
      return;
    }
    Running run;
    run.id = queue_.front();
    run.seq = ctx_.add_sequence();
    run.sampler = std::make_unique<Sampler>(r.sampling, ctx_.model().config().n_vocab);
    run.history = r.prompt;
    run.reserved_blocks = need;
    reserved_ += need;
    queue_.pop_front();
    running_.push_back(std::move(run));
  }
  if (!queue_.empty()) ++stats_.waits;
}

bool KvBatchScheduler::step() {
  admit();
  if (running_.empty()) return false;
  std::vector<LlamaContext::SeqTokens> batch;
  std::vector<size_t> owner;  // running_ index of each batch entry
  int budget = options_.max_step_tokens;
  // Decoding sequences first: one token each, so long prompts never stall them.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Running& r = running_[i];
    if (r.prefilled < int(requests_[size_t(r.id)].prompt.size())) continue;
    batch.push_back({r.seq, std::span<const int32_t>(&r.history.back(), 1)});
    owner.push_back(i);
    --budget;
  }
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Running& r = running_[i];
    const std::vector<int32_t>& p = requests_[size_t(r.id)].prompt;
    if (r.prefilled >= int(p.size())) continue;
    const int n = std::min({options_.prefill_chunk, budget, int(p.size()) - r.prefilled});
    batch.push_back({r.seq, std::span<const int32_t>(p.data() + r.prefilled, size_t(n))});
    owner.push_back(i);
    budget -= n;
  }
  ctx_.eval_sequences(batch);
  const int step_index = int(stats_.steps++);
  std::vector<size_t> finished;
  for (size_t e = 0; e < batch.size(); ++e) {
    Running& r = running_[owner[e]];
    const KvBatchRequest& req = requests_[size_t(r.id)];
    const bool decoding = r.prefilled >= int(req.prompt.size());
    if (decoding) {
      ++stats_.decode_tokens;
    } else {
      r.prefilled += int(batch[e].tokens.size());
      stats_.prefill_tokens += int64_t(batch[e].tokens.size());
      if (r.prefilled < int(req.prompt.size())) continue;  // more prompt to go: no token yet
    }
    const int32_t tok = r.sampler->sample(ctx_.sequence_logits(int(e)), r.history);
    KvBatchResult& res = results_[size_t(r.id)];
    if (res.first_step < 0) res.first_step = step_index;
    res.last_step = step_index;
    res.tokens.push_back(tok);
    r.history.push_back(tok);
    if (int(res.tokens.size()) >= req.max_tokens) finished.push_back(owner[e]);
  }
  stats_.max_running = std::max(stats_.max_running, int(running_.size()));
  std::sort(finished.rbegin(), finished.rend());
  for (size_t i : finished) {
    ctx_.remove_sequence(running_[i].seq);
    reserved_ -= running_[i].reserved_blocks;
    running_.erase(running_.begin() + long(i));
  }
  return true;
}

void KvBatchScheduler::run() {
  while (step()) {
  }
  if (!queue_.empty()) throw Error(ErrorCode::internal, "batch scheduler: requests left that can never be admitted");
}

}  // namespace slim::llm
