// TextGenerator: the one interface through which the server (and the CLI) hosts a
// language model: tokens in, a stream of tokens out. LlamaGenerator implements it over a
// LlamaContext, keeping the KV cache of a shared prompt prefix between requests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slim/llm/model.h"
#include "slim/llm/sampler.h"

namespace slim::llm {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 128;
  SamplerOptions sampling;
  bool stop_at_eos = true;
  std::vector<int32_t> stop_tokens;     // besides EOS
  std::vector<std::string> stop_strings;
  // Text of one token, needed only for stop strings (from the tokenizer).
  std::function<std::string(int32_t)> token_text;
};

enum class StopReason { max_tokens, eos, stop_token, stop_string, callback, context_full };
const char* stop_reason_name(StopReason r);

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens (a stop token or string is included)
  StopReason stop = StopReason::max_tokens;
  int prompt_tokens = 0;
  int reused_prompt_tokens = 0;  // prefix served from the KV cache
  double prefill_seconds = 0, decode_seconds = 0;
  ExpertUsage experts;  // MoE models: what each expert computed for this request (n_expert 0 otherwise)
};

// Called with every generated token as soon as it exists; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

class TextGenerator {
 public:
  virtual ~TextGenerator() = default;
  virtual GenerationResult generate(const GenerationRequest& request, const TokenCallback& on_token) = 0;
  virtual int vocab_size() const = 0;
  virtual int eos_token() const = 0;
  virtual int context_size() const = 0;
};

class LlamaGenerator : public TextGenerator {
 public:
  LlamaGenerator(std::shared_ptr<const LlamaModel> model, ContextOptions options);
  GenerationResult generate(const GenerationRequest& request, const TokenCallback& on_token) override;
  int vocab_size() const override { return ctx_.model().config().n_vocab; }
  int eos_token() const override { return ctx_.model().eos_token(); }
  int context_size() const override { return ctx_.n_ctx(); }
  LlamaContext& context() { return ctx_; }

 private:
  LlamaContext ctx_;
  std::vector<int32_t> cached_;  // the tokens whose keys and values the cache holds
};

}  // namespace slim::llm
