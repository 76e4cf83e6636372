#include "slim/llm/text_generator.h"

#include <algorithm>
#include <chrono>

#include "slim/core/error.h"

namespace slim::llm {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::max_tokens: return "max_tokens";
    case StopReason::eos: return "eos";
    case StopReason::stop_token: return "stop_token";
    case StopReason::stop_string: return "stop_string";
    case StopReason::callback: return "callback";
    case StopReason::context_full: return "context_full";
  }
  return "?";
}

LlamaGenerator::LlamaGenerator(std::shared_ptr<const LlamaModel> model, ContextOptions options)
    : ctx_(std::move(model), [&] {
        options.all_logits = false;
        return options;
      }()) {}

GenerationResult LlamaGenerator::generate(const GenerationRequest& req, const TokenCallback& on_token) {
  using clock = std::chrono::steady_clock;
  check(!req.prompt.empty(), ErrorCode::invalid_argument, "generate: empty prompt");
  check(req.max_tokens >= 0, ErrorCode::invalid_argument, "generate: max_tokens must be >= 0");
  check(req.stop_strings.empty() || bool(req.token_text), ErrorCode::invalid_argument,
        "generate: stop strings need a token_text function");
  check(int(req.prompt.size()) <= ctx_.n_ctx(), ErrorCode::resource_exhausted,
        "generate: prompt of " + std::to_string(req.prompt.size()) + " tokens exceeds the context of " +
            std::to_string(ctx_.n_ctx()));
  Sampler sampler(req.sampling, vocab_size());
  GenerationResult res;
  res.prompt_tokens = int(req.prompt.size());

  // Reuse the cached prefix, but always evaluate at least one prompt token so logits exist.
  size_t common = 0;
  while (common < cached_.size() && common < req.prompt.size() && cached_[common] == req.prompt[common]) ++common;
  common = std::min(common, req.prompt.size() - 1);
  ctx_.truncate(int(std::min<size_t>(common, size_t(ctx_.n_past()))));
  common = size_t(ctx_.n_past());
  cached_.assign(req.prompt.begin(), req.prompt.begin() + long(common));
  res.reused_prompt_tokens = int(common);

  ctx_.clear_expert_usage();
  auto t0 = clock::now();
  std::span<const int32_t> rest(req.prompt.data() + common, req.prompt.size() - common);
  ctx_.eval(rest);
  cached_.insert(cached_.end(), rest.begin(), rest.end());
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int32_t> history(req.prompt);
  history.reserve(req.prompt.size() + size_t(req.max_tokens));
  res.tokens.reserve(size_t(req.max_tokens));
  std::string tail;  // recent generated text, for stop strings
  size_t longest_stop = 0;
  for (const auto& s : req.stop_strings) longest_stop = std::max(longest_stop, s.size());

  for (int i = 0; i < req.max_tokens; ++i) {
    const int32_t tok = sampler.sample(ctx_.logits(), history);
    res.tokens.push_back(tok);
    history.push_back(tok);
    const bool keep_going = !on_token || on_token(tok);
    if (req.stop_at_eos && tok == eos_token()) {
      res.stop = StopReason::eos;
      break;
    }
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end()) {
      res.stop = StopReason::stop_token;
      break;
    }
    if (longest_stop > 0) {
      tail += req.token_text(tok);
      bool hit = false;
      for (const auto& s : req.stop_strings) hit = hit || (!s.empty() && tail.find(s) != std::string::npos);
      if (hit) {
        res.stop = StopReason::stop_string;
        break;
      }
      if (tail.size() > 2 * longest_stop + 64) tail.erase(0, tail.size() - longest_stop);
    }
    if (!keep_going) {
      res.stop = StopReason::callback;
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (ctx_.n_past() >= ctx_.n_ctx()) {
      res.stop = StopReason::context_full;
      break;
    }
    const int32_t one[1] = {tok};
    ctx_.eval(one);
    cached_.push_back(tok);
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  res.experts = ctx_.expert_usage();
  return res;
}

}  // namespace slim::llm
