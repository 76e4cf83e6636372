// Sampling and the TextGenerator: greedy equals argmax decoding, seeded sampling is
// reproducible and follows the softmax, filters cut what they should, stop conditions and
// KV-cache prefix reuse behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/sampler.h"
#include "slim/llm/text_generator.h"

namespace slim::llm {
namespace {

using testing::fixture;

SamplerOptions greedy() {
  SamplerOptions o;
  o.temperature = 0;
  return o;
}

TEST(Sampler, GreedyIsFirstArgmax) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  Sampler s(greedy(), 5);
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  const float logits[] = {3.0f, 2.0f, -1.0f};
  SamplerOptions o = greedy();
  o.repeat_penalty = 2.0f;
  Sampler s(o, 3);
  const int32_t hist[] = {0, 0};  // 3 / 2 = 1.5 < 2: token 1 wins
  EXPECT_EQ(s.sample(logits, hist), 1);
  SamplerOptions o2 = greedy();
  o2.repeat_penalty = 1.4f;
  Sampler s2(o2, 3);
  EXPECT_EQ(s2.sample(logits, hist), 0);  // 3 / 1.4 = 2.14 > 2
  // Outside the window the penalty does not apply.
  o.repeat_last_n = 1;
  Sampler s3(o, 3);
  const int32_t hist2[] = {0, 2};
  EXPECT_EQ(s3.sample(logits, hist2), 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesSubtractPerTokenAndPerOccurrence) {
  const float logits[] = {3.0f, 2.0f, 1.5f};
  const int32_t hist[] = {0, 0, 1};
  SamplerOptions o = greedy();
  o.frequency_penalty = 0.6f;  // token 0: 3 - 1.2 = 1.8, token 1: 1.4, token 2: 1.5
  Sampler s(o, 3);
  EXPECT_EQ(s.sample(logits, hist), 0);
  o.frequency_penalty = 0.8f;  // token 0: 1.4, token 1: 1.2, token 2: 1.5
  Sampler s2(o, 3);
  EXPECT_EQ(s2.sample(logits, hist), 2);
  o.frequency_penalty = 0;
  o.presence_penalty = 1.2f;  // 1.8, 0.8, 1.5: once per token, however often it occurs
  Sampler s3(o, 3);
  EXPECT_EQ(s3.sample(logits, hist), 0);
  o.presence_penalty = 1.6f;  // 1.4, 0.4, 1.5
  Sampler s4(o, 3);
  EXPECT_EQ(s4.sample(logits, hist), 2);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f, 0.5f};
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = 42;
  Sampler a(o, 4), b(o, 4);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a.sample(logits.data(), {});
    EXPECT_EQ(x, b.sample(logits.data(), {}));
    counts[x]++;
  }
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  for (int i = 0; i < 4; ++i) {
    const double p = std::exp(double(logits[size_t(i)])) / z;
    // 4.5 standard deviations of a binomial proportion.
    EXPECT_NEAR(counts[i] / double(n), p, 4.5 * std::sqrt(p * (1 - p) / n)) << i;
  }
}

TEST(Sampler, TemperatureSharpens) {
  const std::vector<float> logits = {1.0f, 0.0f};
  SamplerOptions o;
  o.top_k = 0;
  o.top_p = 1;
  o.min_p = 0;
  o.temperature = 0.25f;
  Sampler s(o, 2);
  int zeros = 0;
  for (int i = 0; i < 20000; ++i) zeros += s.sample(logits.data(), {}) == 0;
  const double p = 1.0 / (1.0 + std::exp(-4.0));  // softmax of logits / 0.25
  EXPECT_NEAR(zeros / 20000.0, p, 0.01);
}

TEST(Sampler, FiltersCutTheTail) {
  // Probabilities about 0.64, 0.24, 0.09, 0.03.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  auto seen = [&](SamplerOptions o) {
    o.temperature = 1.0f;
    Sampler s(o, 4);
    std::vector<int> c(4);
    for (int i = 0; i < 5000; ++i) c[size_t(s.sample(logits.data(), {}))]++;
    return c;
  };
  SamplerOptions k2;
  k2.top_k = 2;
  k2.top_p = 1;
  k2.min_p = 0;
  auto c = seen(k2);
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[2] + c[3], 0);
  SamplerOptions p;
  p.top_k = 0;
  p.top_p = 0.9f;  // 0.64 + 0.24 = 0.88 < 0.9: the third token is kept, the fourth not
  p.min_p = 0;
  c = seen(p);
  EXPECT_GT(c[2], 0);
  EXPECT_EQ(c[3], 0);
  SamplerOptions m;
  m.top_k = 0;
  m.top_p = 1;
  m.min_p = 0.2f;  // keeps p >= 0.128: tokens 0 and 1
  c = seen(m);
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[2] + c[3], 0);
}

TEST(Sampler, RejectsBadOptions) {
  SamplerOptions o;
  o.top_p = 0;
  EXPECT_THROW(Sampler(o, 4), Error);
  SamplerOptions o2;
  o2.repeat_penalty = 0;
  EXPECT_THROW(Sampler(o2, 4), Error);
  EXPECT_THROW(Sampler(SamplerOptions{}, 0), Error);
}

ContextOptions test_options() {
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  return o;
}

std::vector<int32_t> manual_greedy(const std::string& model_name, const std::vector<int32_t>& prompt, int n) {
  auto model = LlamaModel::load(fixture(model_name));
  LlamaContext ctx(model, test_options());
  ctx.eval(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const float* l = ctx.logits();
    const int32_t t = int32_t(std::max_element(l, l + model->config().n_vocab) - l);
    out.push_back(t);
    ctx.eval(std::span<const int32_t>(&t, 1));
  }
  return out;
}

TEST(Generator, GreedyMatchesManualArgmaxLoopAndStreams) {
  auto model = LlamaModel::load(fixture("llama_q4_k.gguf"));
  LlamaGenerator gen(model, test_options());
  GenerationRequest req;
  req.prompt = {5, 17, 33, 9};
  req.max_tokens = 12;
  req.sampling = greedy();
  req.stop_at_eos = false;
  std::vector<int32_t> streamed;
  GenerationResult r = gen.generate(req, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  EXPECT_EQ(r.tokens, manual_greedy("llama_q4_k.gguf", req.prompt, 12));
  EXPECT_EQ(streamed, r.tokens);
  EXPECT_EQ(r.stop, StopReason::max_tokens);
  EXPECT_EQ(r.prompt_tokens, 4);
}

TEST(Generator, ReusesPromptPrefixWithIdenticalResults) {
  auto model = LlamaModel::load(fixture("qwen2_q4_k.gguf"));
  LlamaGenerator gen(model, test_options());
  GenerationRequest req;
  req.prompt = {5, 17, 33, 9, 100, 101};
  req.max_tokens = 6;
  req.sampling = greedy();
  req.stop_at_eos = false;
  GenerationResult first = gen.generate(req, {});
  EXPECT_EQ(first.reused_prompt_tokens, 0);
  GenerationResult again = gen.generate(req, {});
  EXPECT_EQ(again.reused_prompt_tokens, 5);
  EXPECT_EQ(again.tokens, first.tokens);
  req.prompt = {5, 17, 33, 200};
  GenerationResult other = gen.generate(req, {});
  EXPECT_EQ(other.reused_prompt_tokens, 3);
  EXPECT_EQ(other.tokens, manual_greedy("qwen2_q4_k.gguf", req.prompt, 6));
}

TEST(Generator, StopsOnStopTokenStringCallbackAndContext) {
  auto model = LlamaModel::load(fixture("llama_f16.gguf"));
  LlamaGenerator gen(model, test_options());
  GenerationRequest req;
  req.prompt = {5, 17, 33};
  req.max_tokens = 10;
  req.sampling = greedy();
  req.stop_at_eos = false;
  const std::vector<int32_t> free_run = gen.generate(req, {}).tokens;
  ASSERT_EQ(free_run.size(), 10u);

  GenerationRequest stop_tok = req;
  stop_tok.stop_tokens = {free_run[3]};
  GenerationResult r = gen.generate(stop_tok, {});
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin());
  EXPECT_EQ(r.stop, StopReason::stop_token);
  EXPECT_EQ(r.tokens.size(), first + 1);

  GenerationRequest stop_str = req;
  stop_str.token_text = [](int32_t t) { return "<" + std::to_string(t) + ">"; };
  stop_str.stop_strings = {"<" + std::to_string(free_run[2]) + "><" + std::to_string(free_run[3]) + ">"};
  r = gen.generate(stop_str, {});
  EXPECT_EQ(r.stop, StopReason::stop_string);
  EXPECT_LE(r.tokens.size(), 4u);

  r = gen.generate(req, [n = 0](int32_t) mutable { return ++n < 2; });
  EXPECT_EQ(r.stop, StopReason::callback);
  EXPECT_EQ(r.tokens.size(), 2u);

  GenerationRequest eos = req;
  eos.stop_at_eos = true;
  r = gen.generate(eos, {});
  if (std::find(free_run.begin(), free_run.end(), 2) == free_run.end()) {
    EXPECT_EQ(r.tokens, free_run);
  }

  GenerationRequest longer = req;
  longer.max_tokens = 100;
  r = gen.generate(longer, {});
  EXPECT_EQ(r.stop, StopReason::context_full);
  EXPECT_EQ(int(r.tokens.size()), 64 - 3 + 1);

  GenerationRequest empty = req;
  empty.prompt.clear();
  EXPECT_THROW(gen.generate(empty, {}), Error);
}

}  // namespace
}  // namespace slim::llm
