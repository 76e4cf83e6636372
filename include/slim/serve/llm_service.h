// LlmService: one GGUF language model served to many clients. A loop thread owns the
// model's context and its KvBatchScheduler (continuous batching, preempting priorities,
// prefix cache) and steps it while there is work; requests come in from any thread and
// their tokens go out as text events that the OpenAI front door (openai.h) streams. The
// service turns tokens into text: stop strings are found across token boundaries and text
// that may still turn out to be part of one, or an incomplete UTF-8 character, is held
// back until it cannot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "slim/llm/model.h"
#include "slim/llm/sampler.h"
#include "slim/text/chat_template.h"

namespace slim::serve {

class Metrics;
class EnergyLedger;

struct LlmOptions {
  int max_sequences = 4;     // sequences generating at once (llama-server's -np)
  int cache_sequences = -1;  // prefix-cache slots beside them; -1: as many, 0: no prefix cache
  int n_ctx = 0;             // tokens per sequence; 0: the training context, capped at 4096
  int threads = 0;           // kernel threads; 0: all hardware threads
  std::string kv_type = "f16";  // f32, f16, q8, q4
  std::string kv_policy;        // an eviction policy of the kv module ("" keeps every token)
  std::string kv_budget = "0.5";  // its budget: "0.25", "25%" or a token count
  int64_t kv_pool_bytes = 0;    // 0: room for every running sequence at full context
  // Prompt tokens of one sequence per step, and tokens per forward pass: a step is what an
  // urgent request may have to wait for, so they stay small (prefill is compute-bound, so
  // larger steps would gain little).
  int prefill_chunk = 128;
  int max_step_tokens = 256;
  int default_priority = 0;     // lower is more urgent (vLLM's convention)
  int max_queue = 256;          // requests per priority level, waiting and running; more get 429
  std::string chat_template;    // Jinja source overriding the model's; "" keeps the model's
};

struct LlmRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 0;  // 0: up to the context
  llm::SamplerOptions sampling;
  std::vector<std::string> stop;
  int top_logprobs = -1;  // -1: no logprobs; n >= 0: the chosen token's and the n most likely
  int n = 1;              // choices, sampled independently (seeds seed, seed+1, ...)
  int priority = 0;
};

struct TokenLogprob {
  std::string token;  // the token's bytes
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};

// Something that happened to one choice of a generation.
struct LlmEvent {
  int choice = 0;
  std::string text;                    // new text (may be empty)
  std::vector<TokenLogprob> logprobs;  // of the tokens this event covers
  std::string finish;                  // "" while running; then "stop", "length" or "error"
  std::string error;                   // finish == "error": why
};

// The output of one request as it is produced.
class LlmGeneration {
 public:
  // Waits up to `timeout` for events; appends them and returns true if there were any.
  bool next(std::vector<LlmEvent>& out, std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool finished() const;  // every choice has had its final event
  int prompt_tokens() const { return prompt_tokens_; }
  int completion_tokens() const { return completion_tokens_.load(); }
  int reused_tokens() const { return reused_tokens_.load(); }
  int preemptions() const { return preemptions_.load(); }
  int64_t kv_bytes() const { return kv_bytes_.load(); }  // most KV any of its sequences held
  // Its share of each step's energy by tokens, prefill and decode apart, and the carbon
  // (slim serve --energy; complete when finished()).
  double prefill_joules() const { return prefill_joules_.load(); }
  double decode_joules() const { return decode_joules_.load(); }
  double carbon_grams() const { return grams_.load(); }
  // Mixture-of-Experts models, metered: what each expert computed for it (all choices;
  // complete when finished(); n_expert 0 otherwise).
  const llm::ExpertUsage& experts() const { return experts_; }

 private:
  friend class LlmService;
  void push(LlmEvent e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LlmEvent> events_;
  int open_choices_ = 0;
  int prompt_tokens_ = 0;
  std::atomic<int> completion_tokens_{0}, reused_tokens_{0}, preemptions_{0};
  std::atomic<int64_t> kv_bytes_{0};
  std::atomic<double> prefill_joules_{0}, decode_joules_{0}, grams_{0};
  llm::ExpertUsage experts_;  // written by the loop thread before the final events
  std::atomic<bool> cancelled_{false};
};

struct LlmStatus {
  int running = 0, waiting = 0, cached = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0, kv_block_bytes = 0;
};

class LlmService {
 public:
  // Loads the model and its tokenizer and starts the loop thread. Throws invalid_model /
  // unsupported / not_found naming the file. With `energy`, each step is metered and its
  // energy shared by the sequences in it by their tokens (`version` labels the counters).
  LlmService(std::string name, const std::string& gguf_path, LlmOptions options, Metrics* metrics,
             EnergyLedger* energy = nullptr, std::string version = "1");
  ~LlmService();  // stops the loop; requests still running end with an "error" event
  LlmService(const LlmService&) = delete;
  LlmService& operator=(const LlmService&) = delete;

  const std::string& name() const { return name_; }
  const EnergyLedger* energy() const;  // null unless metered
  const LlmOptions& options() const { return options_; }
  int context_size() const { return n_ctx_; }
  int64_t created() const { return created_; }  // unix seconds of the load

  // The prompt text of a conversation (the chat template) and its tokens.
  std::string render_chat(std::span<const text::ChatMessage> messages) const;
  // Tokens of a prompt: BOS as the tokenizer says unless the text (a chat template's
  // output) starts with it; special-token text is matched.
  std::vector<int32_t> tokenize(const std::string& text) const;
  int vocab_size() const;

  // Validates and queues. Throws invalid_argument for a request that cannot run (empty
  // prompt, prompt plus max_tokens beyond the context, bad sampling options, bad token
  // ids) and resource_exhausted when its priority level's queue is full.
  std::shared_ptr<LlmGeneration> submit(LlmRequest request);
  LlmStatus status() const;

 private:
  struct Impl;
  std::string name_;
  LlmOptions options_;
  int n_ctx_ = 0;
  int64_t created_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slim::serve
