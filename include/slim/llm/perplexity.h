// Perplexity of a GGUF model on a text, as llama-perplexity scores it (non-overlapping
// chunks of n_ctx tokens, the second half of each scored), optionally beside a base
// model on the same tokens: KL(base || model) and next-token (argmax) agreement. Behind
// `slim perplexity` and `slim certify`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "slim/llm/model.h"

namespace slim::llm {

struct PerplexityOptions {
  int n_ctx = 512;  // chunk length in tokens, at least 8
  int chunks = 0;   // at most this many chunks (0: all)
  int threads = 0;
  // Wraps each chunk's evaluation (`base`: the base model's), so a caller can time and
  // meter the two models apart.
  std::function<void(bool base, const std::function<void()>& eval)> around_eval;
  std::function<void(int done, int chunks, double ppl)> progress;
};

struct PerplexityResult {
  size_t tokens = 0;  // of the whole text
  int chunks = 0;
  int64_t scored = 0;
  double nll = 0, nll_base = 0, kl = 0;  // sums over the scored tokens, in nats
  int64_t top1_same = 0;
  double ppl() const;
  double base_ppl() const;
  double mean_kl() const;
  double top1_agreement() const;
};

// Tokenizes `text` (named `source` in errors) with `model`'s tokenizer and scores it.
// Errors (invalid_argument): n_ctx below 8, a text shorter than one chunk, a base model
// with another vocabulary.
PerplexityResult perplexity(const std::shared_ptr<const LlamaModel>& model,
                            const std::shared_ptr<const LlamaModel>& base, const std::string& text,
                            const std::string& source, const PerplexityOptions& options);

}  // namespace slim::llm
