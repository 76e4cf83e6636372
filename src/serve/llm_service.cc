#include "slim/serve/llm_service.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <random>

#include "slim/core/error.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/kv_policy.h"
#include "slim/llm/kv_scheduler.h"
#include "slim/llm/model.h"
#include "slim/serve/energy_ledger.h"
#include "slim/serve/metrics.h"

namespace slim::serve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Bytes at the end of `s` that start a UTF-8 character not complete yet.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// Length of the longest suffix of `s` that is a proper prefix of one of the stop strings.
size_t stop_prefix_tail(const std::string& s, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops)
    for (size_t n = std::min(s.size(), stop.size() - 1); n > best; --n)
      if (s.compare(s.size() - n, n, stop, 0, n) == 0) {
        best = n;
        break;
      }
  return best;
}

// Expert counters of one model version: a (layer, expert) slot each up to this many, else one
// per expert summed over layers, so a model with hundreds of experts in dozens of layers
// stays a bounded label set.
constexpr int kMaxExpertSeries = 1024;

const std::vector<double> kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

}  // namespace

// ---------------------------------------------------------------- generation

void LlmGeneration::push(LlmEvent e) {
  std::lock_guard lock(mu_);
  if (!e.finish.empty()) --open_choices_;
  events_.push_back(std::move(e));
  cv_.notify_all();
}

bool LlmGeneration::next(std::vector<LlmEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

bool LlmGeneration::finished() const {
  std::lock_guard lock(mu_);
  return open_choices_ == 0 && events_.empty();
}

// ---------------------------------------------------------------- service

struct LlmService::Impl {
  std::shared_ptr<const llm::LlamaModel> model;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat;
  std::string bos_text, eos_text;
  std::vector<bool> end_of_generation;  // per token: EOS and the end-of-turn tokens
  std::unique_ptr<llm::LlamaContext> ctx;
  std::unique_ptr<llm::KvBatchScheduler> sched;

  // One choice of a generation, owned by the loop thread.
  struct Choice {
    std::shared_ptr<LlmGeneration> gen;
    int index = 0, id = -1, priority = 0;
    std::vector<std::string> stop;
    int top_logprobs = -1;
    std::string held;  // text not sent yet: maybe the start of a stop string
    std::vector<TokenLogprob> held_logprobs;
    Clock::time_point submitted, last_token;
    int tokens = 0;
    bool stopped = false;
  };
  struct Pending {
    llm::KvBatchRequest request;
    std::shared_ptr<Choice> choice;
  };

  std::mutex mu;  // inbox, queued counts, stop
  std::condition_variable cv;
  std::vector<Pending> inbox;
  std::map<int, int> in_flight_by_priority;
  bool stop = false;
  std::map<int, std::shared_ptr<Choice>> active;  // loop thread only: by scheduler id
  std::vector<double> logprob_scratch;            // loop thread only: one token's logprobs
  std::vector<int32_t> id_scratch;
  std::thread loop;

  // Metrics (null when the service has no registry).
  Metrics* metrics = nullptr;
  std::string model_name;
  Counter *prompt_tokens = nullptr, *generated_tokens = nullptr, *preemptions = nullptr, *reused_tokens = nullptr,
          *requests_total = nullptr;
  Gauge *running = nullptr, *waiting = nullptr, *kv_used = nullptr, *kv_free = nullptr, *hit_ratio = nullptr;
  // Energy (null when not metered): the kind of its steps, the counters per priority, and the
  // final events of requests that finished in a step, held until the step's energy is shared.
  EnergyLedger* energy = nullptr;
  EnergyLedger::Kind energy_kind;
  std::string version;
  std::map<int, EnergyLedger::Series> energy_series;
  struct Finished {
    int id, priority;
    std::shared_ptr<LlmGeneration> gen;
    LlmEvent event;
  };
  std::vector<Finished> finishing;
  bool in_step = false;
  // Mixture-of-Experts models: counters per (layer, expert), the shared expert at index
  // n_expert of each layer, then one for the rest of the forward pass ("other"; no routed
  // counter). Layers share one slot ("all") when a slot each would make too many series.
  struct ExpertSeries {
    Counter *routed = nullptr, *flops = nullptr, *joules = nullptr, *grams = nullptr;
  };
  std::vector<ExpertSeries> expert_series;
  int expert_layers = 0;
  llm::ExpertUsage zero_usage, step_usage;  // the model's shape with no work; one step's work
  std::atomic<int> status_running{0}, status_waiting{0}, status_cached{0};
  std::atomic<int64_t> status_used{0};
  int64_t last_preemptions = 0;

  Histogram& histogram(const char* name, const char* help, int priority) {
    return metrics->histogram(name, help, kLatencyBuckets,
                              {{"model", model_name}, {"priority", std::to_string(priority)}});
  }

  void on_token(Choice& c, int32_t tok, const float* logits);
  void on_finish(Choice& c, const llm::KvBatchResult& r);
  bool step();  // sched->step(), metered when `energy` is set
  void share_energy(const EnergyCost& cost);
  void make_expert_series();
  void account_experts(const EnergyCost* cost);
  LlmGeneration* generation(int id, int* priority);
  const EnergyLedger::Series& series(int priority) {
    auto it = energy_series.find(priority);
    if (it == energy_series.end())
      it = energy_series.emplace(priority, energy->series(model_name, version, std::to_string(priority))).first;
    return it->second;
  }
  void run();
  void publish();
};

void LlmService::Impl::on_token(Choice& c, int32_t tok, const float* logits) {
  const Clock::time_point now = Clock::now();
  if (metrics) {
    if (c.tokens == 0)
      histogram("slim_llm_time_to_first_token_seconds", "Time from a request's arrival to its first token.", c.priority)
          .observe(seconds(now - c.submitted));
    else
      histogram("slim_llm_inter_token_latency_seconds", "Time between two tokens of one sequence.", c.priority)
          .observe(seconds(now - c.last_token));
    generated_tokens->inc();
  }
  c.last_token = now;
  ++c.tokens;
  c.gen->completion_tokens_.fetch_add(1);
  if (c.gen->cancelled_ || c.stopped) return;
  if (tok >= 0 && size_t(tok) < end_of_generation.size() && end_of_generation[size_t(tok)]) {
    c.stopped = true;  // the end token itself is not text
    return;
  }
  const std::string piece = tokenizer->token_to_piece(tok);
  if (c.top_logprobs >= 0) {
    std::vector<double>& lp = logprob_scratch;
    llm::log_softmax(logits, model->config().n_vocab, lp);
    TokenLogprob t{piece, lp[size_t(tok)], {}};
    // Ids the tokenizer can spell (a model's vocabulary may be padded beyond it).
    std::vector<int32_t>& ids = id_scratch;
    ids.resize(std::min<size_t>(lp.size(), size_t(tokenizer->vocab_size())));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t k = std::min(ids.size(), size_t(c.top_logprobs));
    std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(),
                      [&](int32_t a, int32_t b) { return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b); });
    for (size_t i = 0; i < k; ++i) t.top.emplace_back(tokenizer->token_to_piece(ids[i]), lp[size_t(ids[i])]);
    c.held_logprobs.push_back(std::move(t));
  }
  c.held += piece;
  LlmEvent e;
  e.choice = c.index;
  size_t cut = std::string::npos;
  for (const std::string& s : c.stop) cut = std::min(cut, c.held.find(s));
  if (cut != std::string::npos) {
    e.text = c.held.substr(0, cut);
    c.held.clear();
    c.stopped = true;
  } else {
    const size_t keep = std::max(stop_prefix_tail(c.held, c.stop), incomplete_utf8_tail(c.held));
    e.text = c.held.substr(0, c.held.size() - keep);
    c.held.erase(0, c.held.size() - keep);
  }
  // Logprobs go out with the text of their tokens, or with the stop that ends them.
  if (!e.text.empty() || c.stopped) e.logprobs = std::move(c.held_logprobs), c.held_logprobs.clear();
  if (!e.text.empty() || !e.logprobs.empty()) c.gen->push(std::move(e));
}

void LlmService::Impl::on_finish(Choice& c, const llm::KvBatchResult& r) {
  c.gen->reused_tokens_.fetch_add(r.reused_tokens);
  c.gen->preemptions_.fetch_add(r.preemptions);
  LlmEvent e;
  e.choice = c.index;
  switch (r.finish) {
    case llm::KvFinish::length:
    case llm::KvFinish::stopped:
      e.text = std::move(c.held);  // what was held back for a stop string that never came
      e.logprobs = std::move(c.held_logprobs);
      e.finish = c.stopped ? "stop" : "length";
      break;
    case llm::KvFinish::cancelled: e.finish = "cancelled"; break;
    case llm::KvFinish::failed:
      e.finish = "error";
      e.error = r.error;
      break;
  }
  if (metrics)
    histogram("slim_llm_request_duration_seconds", "Time from a request's arrival to its last token.", c.priority)
        .observe(seconds(Clock::now() - c.submitted));
  {
    std::lock_guard lock(mu);
    if (--in_flight_by_priority[c.priority] == 0) in_flight_by_priority.erase(c.priority);
  }
  if (energy && in_step)
    finishing.push_back({c.id, c.priority, c.gen, std::move(e)});
  else
    c.gen->push(std::move(e));
}

// The generation of a scheduler id in the last step: running, or finished in it.
LlmGeneration* LlmService::Impl::generation(int id, int* priority) {
  if (auto it = active.find(id); it != active.end()) {
    *priority = it->second->priority;
    return it->second->gen.get();
  }
  for (const Finished& f : finishing)
    if (f.id == id) {
      *priority = f.priority;
      return f.gen.get();
    }
  return nullptr;
}

// A step's energy goes to its sequences by their tokens; a request's final event waits for
// its share.
void LlmService::Impl::share_energy(const EnergyCost& cost) {
  int64_t tokens = 0;
  for (const llm::KvStepShare& s : sched->last_step()) tokens += s.tokens;
  for (const llm::KvStepShare& s : sched->last_step()) {
    int priority = 0;
    LlmGeneration* gen = generation(s.id, &priority);
    if (!gen) continue;
    const double share = double(s.tokens) / double(tokens);
    const EnergyCost c{cost.joules * share, cost.grams * share};
    auto& j = s.prefill ? gen->prefill_joules_ : gen->decode_joules_;
    j.store(j.load() + c.joules);
    gen->grams_.store(gen->grams_.load() + c.grams);
    series(priority).add(c, 0);
  }
  for (Finished& f : finishing) {
    // A request counts once, when its first choice ends.
    if (f.event.choice == 0) series(f.priority).requests->inc();
    f.gen->push(std::move(f.event));
  }
  finishing.clear();
}

void LlmService::Impl::make_expert_series() {
  const int L = zero_usage.n_layer, E = zero_usage.n_expert;
  expert_layers = L * (E + 1) <= kMaxExpertSeries ? L : 1;
  auto make = [&](const std::string& layer, const std::string& expert, bool routed) {
    Labels l = {{"model", model_name}, {"version", version}, {"layer", layer}, {"expert", expert}};
    ExpertSeries s;
    if (routed)
      s.routed = &metrics->counter("slim_llm_expert_routed_tokens_total",
                                   "Tokens routed to a Mixture-of-Experts model's expert (shared: every token).", l);
    s.flops = &metrics->counter("slim_llm_expert_flops_total",
                                "FLOPs of an expert, counted from the routing (other: attention, "
                                "routers, output head).",
                                l);
    if (energy) {
      l.emplace_back("source", energy->source());
      s.joules = &metrics->counter("slim_llm_expert_joules_total",
                                   "The steps' energy above idle attributed to an expert by its "
                                   "share of their FLOPs.",
                                   l);
      l.emplace_back("region", energy->region());
      s.grams = &metrics->counter("slim_llm_expert_carbon_grams_total", "Carbon of an expert's energy (gCO2e).", l);
    }
    expert_series.push_back(s);
  };
  for (int l = 0; l < expert_layers; ++l) {
    const std::string layer = expert_layers == L ? std::to_string(l) : "all";
    for (int e = 0; e < E; ++e) make(layer, std::to_string(e), true);
    if (zero_usage.shared_token_flops > 0)
      make(layer, "shared", true);
    else
      expert_series.emplace_back();
  }
  make("all", "other", false);
}

// The step's expert work, read off the context's per-sequence accounting (then cleared, so
// that each step reads only its own): to the counters and, metered, to each request, with
// the step's energy split by FLOPs.
void LlmService::Impl::account_experts(const EnergyCost* cost) {
  llm::ExpertUsage& step = step_usage;
  step.clear();
  for (const llm::KvStepShare& s : sched->last_step()) {
    const llm::ExpertUsage& u = ctx->expert_usage(s.seq);
    step.add(u);
    int priority = 0;
    if (LlmGeneration* g = cost ? generation(s.id, &priority) : nullptr) {
      if (g->experts_.routed.empty()) g->experts_ = zero_usage;
      g->experts_.add(u);
    }
    ctx->clear_expert_usage(s.seq);
  }
  const double total = step.total_flops();
  if (expert_series.empty() || total <= 0) return;
  auto put = [&](const ExpertSeries& s, double routed, double flops) {
    if (!s.flops || flops == 0) return;
    if (s.routed) s.routed->inc(routed);
    s.flops->inc(flops);
    if (cost && s.joules) {
      s.joules->inc(cost->joules * flops / total);
      s.grams->inc(cost->grams * flops / total);
    }
  };
  const size_t E = size_t(step.n_expert);
  for (int l = 0; l < step.n_layer; ++l) {
    const ExpertSeries* layer = expert_series.data() + size_t(expert_layers == step.n_layer ? l : 0) * (E + 1);
    for (size_t e = 0; e < E; ++e) put(layer[e], double(step.count(l, int(e))), step.expert_flops(l, int(e)));
    put(layer[E], double(step.tokens), double(step.tokens) * step.shared_token_flops);
  }
  put(expert_series.back(), 0, step.other_flops);
}

bool LlmService::Impl::step() {
  if (!energy) {
    const bool busy = sched->step();
    if (!zero_usage.routed.empty()) account_experts(nullptr);
    return busy;
  }
  EnergyLedger::Span span(*energy, energy_kind);
  in_step = true;
  bool busy = false;
  try {
    busy = sched->step();
  } catch (...) {
    in_step = false;
    share_energy({});
    throw;
  }
  in_step = false;
  const EnergyCost cost = span.finish();
  if (!zero_usage.routed.empty()) account_experts(&cost);
  share_energy(cost);
  return busy;
}

void LlmService::Impl::publish() {
  const llm::KvBlockPool& pool = ctx->kv_cache().pool();
  status_running = sched->running();
  status_waiting = sched->waiting();
  status_cached = sched->cached_sequences();
  status_used = pool.used_blocks();
  if (!metrics) return;
  const llm::KvBatchStats& st = sched->stats();
  running->set(sched->running());
  waiting->set(sched->waiting());
  kv_used->set(double(pool.used_blocks()));
  kv_free->set(double(pool.free_blocks()));
  if (st.prompt_tokens > 0) hit_ratio->set(double(st.reused_tokens) / double(st.prompt_tokens));
  preemptions->inc(double(st.preemptions - last_preemptions));
  last_preemptions = st.preemptions;
}

void LlmService::Impl::run() {
  bool busy = false;
  int64_t last_reused = 0, last_prompt = 0;
  for (;;) {
    std::vector<Pending> fresh;
    {
      std::unique_lock lock(mu);
      if (!busy) cv.wait(lock, [&] { return stop || !inbox.empty(); });
      if (stop) break;
      fresh.swap(inbox);
    }
    for (Pending& p : fresh) {
      Choice* c = p.choice.get();
      p.request.on_token = [this, c](int32_t tok, const float* logits) {
        on_token(*c, tok, logits);
        return !c->stopped && !c->gen->cancelled_;
      };
      p.request.on_finish = [this, c](const llm::KvBatchResult& r) {
        on_finish(*c, r);
        active.erase(c->id);  // destroys *c: nothing may follow
      };
      try {
        c->id = sched->submit(std::move(p.request));
        active.emplace(c->id, p.choice);
      } catch (const Error& e) {
        llm::KvBatchResult r;
        r.finish = llm::KvFinish::failed;
        r.error = e.what();
        on_finish(*c, r);
      }
    }
    for (auto& [id, c] : active)
      if (c->gen->cancelled_) sched->cancel(id);
    try {
      busy = step();
    } catch (const std::exception& e) {
      std::cerr << "slim serve: model '" << model_name << "': " << e.what() << "\n";
      busy = false;
    }
    if (metrics) {
      const llm::KvBatchStats& st = sched->stats();
      prompt_tokens->inc(double(st.prompt_tokens - last_prompt));
      reused_tokens->inc(double(st.reused_tokens - last_reused));
      last_prompt = st.prompt_tokens;
      last_reused = st.reused_tokens;
    }
    for (auto& [id, c] : active) {
      const int64_t b = sched->sequence_bytes(id);
      if (b > c->gen->kv_bytes_.load()) c->gen->kv_bytes_ = b;
    }
    publish();
  }
  // Stopping: whatever is still queued or running ends with an error.
  std::vector<Pending> left;
  {
    std::lock_guard lock(mu);
    left.swap(inbox);
  }
  for (Pending& p : left) {
    llm::KvBatchResult r;
    r.finish = llm::KvFinish::failed;
    r.error = "the server is shutting down";
    on_finish(*p.choice, r);
  }
  auto still = active;
  for (auto& [id, c] : still) {
    llm::KvBatchResult r;
    r.finish = llm::KvFinish::failed;
    r.error = "the server is shutting down";
    on_finish(*c, r);
  }
  active.clear();
}

LlmService::LlmService(std::string name, const std::string& gguf_path, LlmOptions options, Metrics* metrics,
                       EnergyLedger* energy, std::string version)
    : name_(std::move(name)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.energy = energy;
  m.version = std::move(version);
  const LlmOptions& o = options_;
  check(o.max_sequences >= 1, ErrorCode::invalid_argument, "max_sequences must be >= 1");
  check(o.prefill_chunk >= 1 && o.max_step_tokens >= o.max_sequences, ErrorCode::invalid_argument,
        "the step must hold at least one token of every running sequence");
  m.model = llm::LlamaModel::load(gguf_path);
  m.tokenizer = llm::load_gguf_tokenizer(m.model->gguf());
  const text::TokenizerSpec& spec = m.tokenizer->spec();
  if (spec.bos_id >= 0) m.bos_text = m.tokenizer->token_text(spec.bos_id);
  if (spec.eos_id >= 0) m.eos_text = m.tokenizer->token_text(spec.eos_id);
  std::string tmpl = o.chat_template;
  if (tmpl.empty()) tmpl = m.model->gguf().get_string("tokenizer.chat_template", "");
  if (tmpl.empty()) {
    std::cerr << "slim serve: model '" << name_ << "' has no chat template (tokenizer.chat_template); "
              << "chat requests use ChatML\n";
    tmpl = text::ChatTemplate::chatml();
  }
  try {
    m.chat = std::make_unique<text::ChatTemplate>(tmpl);
  } catch (const Error& e) {
    throw Error(ErrorCode::unsupported, "model '" + name_ + "': its chat template cannot be rendered (" + e.what() +
                                            "); give one that can with --chat-template FILE");
  }
  // Generation ends at EOS and at the end-of-turn tokens chat templates write.
  m.end_of_generation.assign(size_t(m.tokenizer->vocab_size()), false);
  if (spec.eos_id >= 0) m.end_of_generation[size_t(spec.eos_id)] = true;
  for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>"})
    if (auto id = m.tokenizer->token_id(t);
        id && m.tokenizer->token_type(*id) == text::TokenType::control && size_t(*id) < m.end_of_generation.size())
      m.end_of_generation[size_t(*id)] = true;

  llm::ContextOptions co;
  co.n_ctx = o.n_ctx;
  co.n_threads = o.threads;
  co.n_batch = o.max_step_tokens;
  co.kv.paged = true;
  co.kv.k_type = co.kv.v_type = llm::parse_kv_type(o.kv_type);
  const int cache = o.kv_policy.empty() ? (o.cache_sequences < 0 ? o.max_sequences : o.cache_sequences) : 0;
  co.kv.max_seqs = o.max_sequences + cache;
  if (!o.kv_policy.empty()) co.kv.policy = llm::make_kv_policy(o.kv_policy, llm::KvBudget::parse(o.kv_budget));
  // Room for the running sequences at full context; cached prefixes live in what they
  // leave free.
  co.kv.pool_bytes = o.kv_pool_bytes;
  co.kv.pool_seqs = o.max_sequences;
  m.ctx = std::make_unique<llm::LlamaContext>(m.model, co);
  n_ctx_ = m.ctx->n_ctx();
  llm::KvBatchOptions so;
  so.max_step_tokens = o.max_step_tokens;
  so.prefill_chunk = o.prefill_chunk;
  so.max_running = o.max_sequences;
  so.prefix_cache = cache > 0;
  m.sched = std::make_unique<llm::KvBatchScheduler>(*m.ctx, so);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  m.metrics = metrics;
  m.model_name = name_;
  if (metrics) {
    const Labels l = {{"model", name_}};
    m.prompt_tokens = &metrics->counter("slim_llm_prompt_tokens_total", "Prompt tokens of admitted requests.", l);
    m.generated_tokens = &metrics->counter("slim_llm_generated_tokens_total", "Tokens generated.", l);
    m.reused_tokens = &metrics->counter("slim_llm_prefix_cache_reused_tokens_total",
                                        "Prompt tokens whose KV came from the prefix cache.", l);
    m.preemptions = &metrics->counter("slim_llm_preemptions_total",
                                      "Running sequences preempted by more urgent requests.", l);
    m.requests_total = &metrics->counter("slim_llm_requests_total", "Requests accepted.", l);
    m.running = &metrics->gauge("slim_llm_sequences_running", "Sequences generating.", l);
    m.waiting = &metrics->gauge("slim_llm_sequences_waiting", "Sequences waiting for a slot or KV blocks.", l);
    m.kv_used = &metrics->gauge("slim_llm_kv_blocks_used", "KV pool blocks in use (cached prefixes included).", l);
    m.kv_free = &metrics->gauge("slim_llm_kv_blocks_free", "KV pool blocks free.", l);
    m.hit_ratio = &metrics->gauge("slim_llm_prefix_cache_hit_ratio",
                                  "Share of prompt tokens served from the prefix cache.", l);
    metrics->gauge("slim_llm_kv_block_bytes", "Bytes of one KV pool block.", l)
        .set(double(m.ctx->kv_cache().pool().block_bytes()));
    m.publish();
  }
  if (m.model->config().n_expert > 0) {
    m.zero_usage = m.ctx->expert_usage_total();
    m.zero_usage.clear();
    m.step_usage = m.zero_usage;
    if (metrics) m.make_expert_series();
  }
  m.loop = std::thread([&m] { m.run(); });
  std::cerr << "slim serve: language model '" << name_ << "' (" << m.model->config().arch << ", "
            << m.model->n_params() << " parameters, context " << n_ctx_ << ", " << o.max_sequences
            << " sequences, KV " << o.kv_type << (o.kv_policy.empty() ? "" : " " + o.kv_policy + " " + o.kv_budget)
            << ", kernels " << m.ctx->kernel_isa() << ")\n";
}

LlmService::~LlmService() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->loop.joinable()) impl_->loop.join();
  // The metric series stay: a reloaded model's new service shares them, and an unload
  // drops them (InferenceServer::unload_model).
}

std::string LlmService::render_chat(std::span<const text::ChatMessage> messages) const {
  text::ChatTemplateContext c;
  c.bos_token = impl_->bos_text;
  c.eos_token = impl_->eos_text;
  c.add_generation_prompt = true;
  return impl_->chat->render(messages, c);
}

std::vector<int32_t> LlmService::tokenize(const std::string& prompt) const {
  text::EncodeOptions eo;
  eo.parse_special = true;
  // BOS as the tokenizer says, unless the text (a chat template's output) starts with it.
  eo.add_special = impl_->bos_text.empty() || prompt.rfind(impl_->bos_text, 0) != 0;
  return impl_->tokenizer->encode(prompt, eo);
}

const EnergyLedger* LlmService::energy() const { return impl_->energy; }

int LlmService::vocab_size() const { return impl_->model->config().n_vocab; }

std::shared_ptr<LlmGeneration> LlmService::submit(LlmRequest r) {
  Impl& m = *impl_;
  check(!r.prompt.empty(), ErrorCode::invalid_argument, "the prompt is empty");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab_size())
      throw Error(ErrorCode::invalid_argument,
                  "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(vocab_size()));
  const int64_t n_prompt = int64_t(r.prompt.size());
  if (r.max_tokens == 0) r.max_tokens = int(std::max<int64_t>(0, n_ctx_ - n_prompt));
  if (r.max_tokens < 1 || n_prompt + r.max_tokens > n_ctx_)
    throw Error(ErrorCode::invalid_argument,
                "this model's maximum context length is " + std::to_string(n_ctx_) + " tokens; the request has " +
                    std::to_string(n_prompt) + " prompt tokens" +
                    (r.max_tokens >= 1 ? " and asks for " + std::to_string(r.max_tokens) + " more" : ""));
  check(r.n >= 1, ErrorCode::invalid_argument, "n must be at least 1");
  { llm::Sampler probe(r.sampling, vocab_size()); }  // bad options are the client's error
  auto gen = std::make_shared<LlmGeneration>();
  gen->prompt_tokens_ = int(n_prompt);
  gen->open_choices_ = r.n;
  const Clock::time_point now = Clock::now();
  std::vector<Impl::Pending> batch;
  for (int i = 0; i < r.n; ++i) {
    llm::KvBatchRequest kr(r.prompt, r.max_tokens);
    kr.sampling = r.sampling;
    kr.sampling.seed = r.sampling.seed + uint64_t(i);
    kr.priority = r.priority;
    auto c = std::make_shared<Impl::Choice>();
    c->gen = gen;
    c->index = i;
    c->priority = r.priority;
    c->stop = r.stop;
    c->top_logprobs = r.top_logprobs;
    c->submitted = now;
    batch.push_back({std::move(kr), std::move(c)});
  }
  {
    std::lock_guard lock(m.mu);
    if (m.stop) throw Error(ErrorCode::unavailable, "the server is shutting down");
    int& queued = m.in_flight_by_priority[r.priority];
    if (queued + r.n > options_.max_queue) {
      if (queued == 0) m.in_flight_by_priority.erase(r.priority);
      throw Error(ErrorCode::resource_exhausted, "model '" + name_ + "' has " + std::to_string(options_.max_queue) +
                                                     " requests of priority " + std::to_string(r.priority) +
                                                     " in flight, the most it queues; retry later");
    }
    queued += r.n;
    for (auto& p : batch) m.inbox.push_back(std::move(p));
  }
  m.cv.notify_all();
  if (m.requests_total) m.requests_total->inc();
  return gen;
}

LlmStatus LlmService::status() const {
  LlmStatus s;
  s.running = impl_->status_running;
  s.waiting = impl_->status_waiting;
  s.cached = impl_->status_cached;
  s.kv_blocks_used = impl_->status_used;
  s.kv_blocks_total = impl_->ctx->kv_cache().pool().capacity();
  s.kv_block_bytes = impl_->ctx->kv_cache().pool().block_bytes();
  return s;
}

}  // namespace slim::serve
