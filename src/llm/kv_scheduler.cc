#include "slim/llm/kv_scheduler.h"

#include <algorithm>

#include "slim/core/error.h"

namespace slim::llm {

const char* kv_finish_name(KvFinish f) {
  switch (f) {
    case KvFinish::length: return "length";
    case KvFinish::stopped: return "stopped";
    case KvFinish::cancelled: return "cancelled";
    case KvFinish::failed: return "failed";
  }
  return "?";
}

// A request from submission to its end. `history` holds the prompt and the tokens
// generated so far; the sequence's KV holds its first n_eval. A step feeds the tokens in
// between (a prefill chunk, or the one token sampled last) and samples the next token
// once the KV has caught up: prefill, decode and the recomputation after a preemption are
// the same loop.
struct KvBatchScheduler::Job {
  int id = 0;
  int64_t arrival = 0;
  KvBatchRequest req;
  KvBatchResult res;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> history;
  int seq = -1, n_eval = 0;
  int64_t reserved = 0;
  bool started = false, cancelled = false;
};

KvBatchScheduler::KvBatchScheduler(LlamaContext& ctx, KvBatchOptions options) : ctx_(ctx), options_(options) {
  KvCache& cache = ctx_.kv_cache();  // throws for a contiguous cache
  if (options_.max_step_tokens <= 0 || options_.prefill_chunk <= 0)
    throw Error(ErrorCode::invalid_argument, "batch scheduler: step and chunk sizes must be positive");
  if (options_.max_running < 0) throw Error(ErrorCode::invalid_argument, "batch scheduler: max_running must be >= 0");
  max_running_ = options_.max_running == 0 ? cache.max_seqs() : std::min(options_.max_running, cache.max_seqs());
  for (int s = 0; s < cache.max_seqs(); ++s)
    if (cache.active(s)) ctx_.remove_sequence(s);
}

KvBatchScheduler::~KvBatchScheduler() = default;

// Blocks the request could take if nothing were evicted: admission reserves them, so a
// running sequence can always take its next step and the pool never runs dry mid-request.
int64_t KvBatchScheduler::worst_case_blocks(const KvBatchRequest& r) const {
  const KvLayout& L = ctx_.kv_cache().layout();
  const int64_t tokens = int64_t(r.prompt.size()) + r.max_tokens;
  return (tokens + kKvBlockTokens - 1) / kKvBlockTokens * L.total_heads();
}

// What the running sequences may still allocate: their reservation less what they hold.
// Cached prefixes are evicted until the free blocks cover it, so no step can run dry.
int64_t KvBatchScheduler::outstanding_blocks() const {
  const KvCache& cache = ctx_.kv_cache();
  const KvLayout& L = cache.layout();
  int64_t total = 0;
  for (const Job* j : running_) {
    int64_t held = 0;
    for (int l = 0; l < L.n_layer; ++l)
      for (int h = 0; h < L.heads(l); ++h) held += int64_t(cache.stream(j->seq, l, h).blocks.size());
    total += std::max<int64_t>(0, j->reserved - held);
  }
  return total;
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
  const int n_vocab = ctx_.model().config().n_vocab;
  for (int32_t t : r.prompt)
    if (t < 0 || t >= n_vocab)
      throw Error(ErrorCode::invalid_argument, "batch scheduler: token id " + std::to_string(t) +
                                                   " is outside the vocabulary of " + std::to_string(n_vocab));
  auto j = std::make_unique<Job>();
  j->sampler = std::make_unique<Sampler>(r.sampling, n_vocab);  // rejects bad options now
  j->id = next_id_++;
  j->arrival = arrivals_++;
  j->history = r.prompt;
  j->reserved = worst_case_blocks(r);
  j->req = std::move(r);
  waiting_.emplace(std::make_pair(j->req.priority, j->arrival), j.get());
  const int id = j->id;
  jobs_.emplace(id, std::move(j));
  return id;
}

void KvBatchScheduler::cancel(int id) {
  auto it = jobs_.find(id);
  if (it != jobs_.end()) it->second->cancelled = true;
}

const KvBatchResult& KvBatchScheduler::result(int id) const {
  auto it = results_.find(id);
  if (it == results_.end())
    throw Error(ErrorCode::not_found, "batch scheduler: request " + std::to_string(id) + " has not finished");
  return it->second;
}

int64_t KvBatchScheduler::sequence_bytes(int id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() || it->second->seq < 0 ? 0 : ctx_.kv_cache().sequence_bytes(it->second->seq);
}

void KvBatchScheduler::evict(size_t entry) {
  ctx_.remove_sequence(cache_[entry].seq);
  cache_.erase(cache_.begin() + long(entry));
}

size_t KvBatchScheduler::evict_lru(size_t keep) {
  size_t victim = cache_.size();
  for (size_t i = 0; i < cache_.size(); ++i)
    if (i != keep && (victim == cache_.size() || cache_[i].last_used < cache_[victim].last_used)) victim = i;
  if (victim == cache_.size()) return size_t(-1);
  evict(victim);
  return victim;
}

void KvBatchScheduler::clear_prefix_cache() {
  while (!cache_.empty()) evict(cache_.size() - 1);
}

// The job's sequence leaves the running set; with the prefix cache its KV stays as a
// cached prefix (unless another entry already holds it or extends it).
void KvBatchScheduler::release_sequence(Job& j) {
  if (j.seq < 0) return;
  running_.erase(std::find(running_.begin(), running_.end(), &j));
  reserved_ -= j.reserved;
  bool keep = options_.prefix_cache && j.n_eval > 0;
  const std::span<const int32_t> held(j.history.data(), size_t(j.n_eval));
  for (size_t i = 0; keep && i < cache_.size();) {
    const std::vector<int32_t>& t = cache_[i].tokens;
    const size_t n = std::min(t.size(), held.size());
    if (!std::equal(t.begin(), t.begin() + long(n), held.begin())) {
      ++i;
    } else if (t.size() >= held.size()) {
      keep = false;  // an entry already holds all of it
      cache_[i].last_used = ++clock_;
    } else {
      evict(i);  // ours extends it
    }
  }
  if (keep)
    cache_.push_back({j.seq, std::vector<int32_t>(held.begin(), held.end()), ++clock_});
  else
    ctx_.remove_sequence(j.seq);
  j.seq = -1;
  j.n_eval = 0;
}

// Gives the job a sequence (sharing the longest cached prefix of its tokens) once its
// blocks and a slot can be had by evicting cached prefixes.
bool KvBatchScheduler::start(Job& j) {
  KvCache& cache = ctx_.kv_cache();
  const size_t none = size_t(-1);
  size_t best = none, best_len = 0;
  for (size_t i = 0; i < cache_.size(); ++i) {
    const std::vector<int32_t>& t = cache_[i].tokens;
    const size_t n = std::min(t.size(), j.history.size() - 1);  // the last token is fed to get logits
    const size_t lcp = size_t(std::mismatch(t.begin(), t.begin() + long(n), j.history.begin()).first - t.begin());
    if (lcp > best_len) best = i, best_len = lcp;
  }
  // Room for the job: a free slot, and free blocks for what it may still take beyond the
  // blocks it would share with the cached prefix. Other cached prefixes go first.
  auto short_of_room = [&] {
    const int free_slots = cache.max_seqs() - int(running_.size()) - int(cache_.size());
    const int64_t shared = best == none ? 0 : cache.fork_shared_blocks(cache_[best].seq, int(best_len));
    return free_slots < 1 || cache.pool().free_blocks() < outstanding_blocks() + j.reserved - shared;
  };
  for (size_t evicted; short_of_room() && (evicted = evict_lru(best)) != none;)
    if (best != none && evicted < best) --best;
  const bool drop_source = short_of_room();
  j.seq = -1;
  j.n_eval = 0;
  if (best != none) {
    try {
      j.seq = ctx_.fork_sequence(cache_[best].seq, int(best_len));  // copies partial blocks
      j.n_eval = int(best_len);
      cache_[best].last_used = ++clock_;
    } catch (const Error&) {  // no free block for the copies
      evict(best);
      best = none;
    }
    // Still short: the job keeps the blocks it shares and the cached prefix goes (the
    // reservations guarantee room once no prefix is cached).
    if (j.seq >= 0 && drop_source) evict(best);
  }
  if (j.seq < 0) {
    if (short_of_room()) return false;
    j.seq = ctx_.add_sequence();
  }
  if (!j.started) {
    stats_.prompt_tokens += int64_t(j.req.prompt.size());
    stats_.reused_tokens += std::min<int64_t>(j.n_eval, int64_t(j.req.prompt.size()));
    j.started = true;
  }
  j.res.reused_tokens += j.n_eval;
  reserved_ += j.reserved;
  running_.push_back(&j);
  return true;
}

void KvBatchScheduler::preempt(Job& j) {
  release_sequence(j);
  ++j.res.preemptions;
  ++stats_.preemptions;
  waiting_.emplace(std::make_pair(j.req.priority, j.arrival), &j);
}

void KvBatchScheduler::admit() {
  const int64_t capacity = ctx_.kv_cache().pool().capacity();
  while (!waiting_.empty()) {
    Job& head = *waiting_.begin()->second;
    if (int(running_.size()) < max_running_ && reserved_ + head.reserved <= capacity) {
      if (!start(head)) break;
      waiting_.erase(waiting_.begin());
      continue;
    }
    // Preempt only when giving up every less urgent running sequence makes room.
    Job* victim = nullptr;
    int64_t freeable = 0;
    int n_less = 0;
    for (Job* r : running_)
      if (r->req.priority > head.req.priority) {
        freeable += r->reserved;
        ++n_less;
        if (!victim || std::make_pair(r->req.priority, r->arrival) > std::make_pair(victim->req.priority, victim->arrival))
          victim = r;
      }
    const bool can_fit = int(running_.size()) - n_less < max_running_ && reserved_ - freeable + head.reserved <= capacity;
    if (!options_.preempt || !victim || !can_fit) break;
    preempt(*victim);
  }
  if (!waiting_.empty()) ++stats_.waits;
}

void KvBatchScheduler::finish(Job& j, KvFinish why, std::string error) {
  release_sequence(j);
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (it->second == &j) {
      waiting_.erase(it);
      break;
    }
  j.res.finish = why;
  j.res.error = std::move(error);
  std::unique_ptr<Job> owned = std::move(jobs_.at(j.id));
  jobs_.erase(j.id);
  if (owned->req.on_finish)
    owned->req.on_finish(owned->res);
  else
    results_.emplace(owned->id, std::move(owned->res));
}

bool KvBatchScheduler::step() {
  last_step_.clear();
  std::vector<Job*> cancelled;
  for (auto& [id, j] : jobs_)
    if (j->cancelled) cancelled.push_back(j.get());
  for (Job* j : cancelled) finish(*j, KvFinish::cancelled);
  admit();
  if (running_.empty()) return false;
  std::vector<LlamaContext::SeqTokens> batch;
  std::vector<Job*> owner;
  int budget = options_.max_step_tokens;
  // Decoding sequences first, one token each, so long prompts never stall them; then
  // prefill chunks. Within each, the most urgent first: an urgent prompt is never left
  // out of a step by less urgent ones.
  std::vector<Job*> order = running_;
  std::stable_sort(order.begin(), order.end(), [](const Job* a, const Job* b) {
    return std::make_pair(a->req.priority, a->arrival) < std::make_pair(b->req.priority, b->arrival);
  });
  for (int pass = 0; pass < 2; ++pass)
    for (Job* j : order) {
      const int pending = int(j->history.size()) - j->n_eval;
      if ((pending == 1) != (pass == 0) || budget == 0) continue;
      const int n = std::min({options_.prefill_chunk, budget, pending});
      batch.push_back({j->seq, std::span<const int32_t>(j->history.data() + j->n_eval, size_t(n))});
      owner.push_back(j);
      budget -= n;
    }
  try {
    ctx_.eval_sequences(batch);
  } catch (const std::exception& e) {
    for (Job* j : owner) finish(*j, KvFinish::failed, e.what());
    return true;
  }
  const int step_index = int(stats_.steps++);
  std::vector<std::pair<Job*, KvFinish>> done;
  for (size_t e = 0; e < batch.size(); ++e) {
    Job& j = *owner[e];
    const int n = int(batch[e].tokens.size());
    j.n_eval += n;
    const bool decode = n == 1 && !j.res.tokens.empty();
    (decode ? stats_.decode_tokens : stats_.prefill_tokens) += n;
    last_step_.push_back({j.id, n, !decode, batch[e].seq});
    if (j.n_eval < int(j.history.size())) continue;  // more to feed: no token yet
    const float* logits = ctx_.sequence_logits(int(e));
    const int32_t tok = j.sampler->sample(logits, j.history);
    if (j.res.first_step < 0) j.res.first_step = step_index;
    j.res.last_step = step_index;
    j.res.tokens.push_back(tok);
    j.history.push_back(tok);
    const bool go = !j.req.on_token || j.req.on_token(tok, logits);
    if (!go)
      done.emplace_back(&j, KvFinish::stopped);
    else if (int(j.res.tokens.size()) >= j.req.max_tokens)
      done.emplace_back(&j, KvFinish::length);
  }
  stats_.max_running = std::max(stats_.max_running, int(running_.size()));
  for (auto& [j, why] : done) finish(*j, why);
  return true;
}

void KvBatchScheduler::run() {
  while (step()) {
  }
  if (!waiting_.empty()) throw Error(ErrorCode::internal, "batch scheduler: requests left that can never be admitted");
}

}  // namespace slim::llm
