// Token sampling for generation: repetition, presence and frequency penalties, then top-k, top-p, min-p and
// temperature, then a seeded draw (the order llama.cpp's default chain uses); a
// temperature of 0 is greedy argmax. All buffers are sized once per sampler.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace slim::llm {

struct SamplerOptions {
  float temperature = 0.8f;    // <= 0: greedy
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off
  // OpenAI's penalties: a token's logit less presence_penalty once it occurs, less
  // frequency_penalty per occurrence (0: off; -2..2 as OpenAI allows).
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  int repeat_last_n = 64;      // how many recent tokens the penalties look at
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws invalid_argument for out-of-range options.
  Sampler(const SamplerOptions& options, int n_vocab);
  // history: the tokens so far (prompt and generated), for the repetition penalty.
  int32_t sample(const float* logits, std::span<const int32_t> history);
  void reseed(uint64_t seed) { rng_.seed(seed); }
  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  int n_vocab_;
  std::mt19937_64 rng_;
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<Candidate> cand_;
  std::vector<float> penalized_;
  std::vector<std::pair<int32_t, int>> counts_;  // distinct tokens of the penalty window
};

// Log-probabilities of one logits row (in double, max-subtracted): what perplexity and
// KV-cache evaluation score tokens with.
void log_softmax(const float* logits, int n, std::vector<double>& out);

}  // namespace slim::llm
