// Continuous batching: sequences decoded together, with chunked prefill and admission
// between steps, produce exactly the tokens each produces alone; requests that do not fit
// wait, and requests that can never fit are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/kv_scheduler.h"

namespace slim::llm {
namespace {

std::vector<int32_t> prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % 290) + 3;
  return t;
}

ContextOptions paged(int max_seqs, int64_t pool_bytes = 0) {
  ContextOptions o;
  o.n_ctx = 96;
  o.n_threads = 2;
  o.kv.paged = true;
  o.kv.max_seqs = max_seqs;
  o.kv.pool_bytes = pool_bytes;
  return o;
}

// Greedy decoding of one sequence on its own.
std::vector<int32_t> alone(const std::shared_ptr<const LlamaModel>& m, const std::vector<int32_t>& p, int n) {
  LlamaContext ctx(m, paged(1));
  ctx.eval(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const float* l = ctx.logits();
    const int32_t t = int32_t(std::max_element(l, l + m->config().n_vocab) - l);
    out.push_back(t);
    if (i + 1 < n) ctx.eval(std::span<const int32_t>(&t, 1));
  }
  return out;
}

TEST(KvBatchScheduler, BatchedDecodingEqualsSeparateRuns) {
  auto model = LlamaModel::load(testing::fixture("llama_q4_0.gguf"));
  const std::vector<std::vector<int32_t>> prompts = {prompt(30, 1), prompt(9, 2), prompt(45, 3), prompt(3, 4)};
  const std::vector<int> lens = {12, 20, 5, 9};
  LlamaContext ctx(model, paged(3));  // four requests, three slots: one waits
  KvBatchScheduler sched(ctx, {24, 7});  // small steps and chunks: prefill is split and interleaved
  for (size_t i = 0; i < prompts.size(); ++i) sched.submit({prompts[i], lens[i]});
  sched.run();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(sched.results()[i].tokens, alone(model, prompts[i], lens[i])) << "request " << i;
  const KvBatchStats& st = sched.stats();
  EXPECT_EQ(st.max_running, 3);
  EXPECT_EQ(st.prefill_tokens, 30 + 9 + 45 + 3);
  EXPECT_EQ(st.decode_tokens, (12 - 1) + (20 - 1) + (5 - 1) + (9 - 1));
  EXPECT_GT(st.waits, 0);
  // Fewer steps than running the requests one after another.
  EXPECT_LT(st.steps, int64_t(12 + 20 + 5 + 9));
  EXPECT_EQ(ctx.kv_cache().pool().used_blocks(), 0);  // everything returned
}

TEST(KvBatchScheduler, SmallPoolMakesRequestsWaitAndRefusesImpossibleOnes) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  // 2 layers x 2 KV heads x 2 blocks (32 tokens) fit: one request of <= 32 tokens at a time.
  LlamaContext ctx(model, paged(4, 8 * 4096));
  KvBatchScheduler sched(ctx, {64, 64});
  sched.submit({prompt(20, 5), 10});
  sched.submit({prompt(12, 6), 4});
  try {
    sched.submit({prompt(40, 7), 4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::resource_exhausted);
    EXPECT_NE(std::string(e.what()).find("needs 12 KV blocks, the pool has 8"), std::string::npos) << e.what();
  }
  sched.run();
  EXPECT_EQ(sched.stats().max_running, 1);
  EXPECT_EQ(sched.results()[0].tokens, alone(model, prompt(20, 5), 10));
  EXPECT_EQ(sched.results()[1].tokens, alone(model, prompt(12, 6), 4));
  EXPECT_GT(sched.results()[1].first_step, sched.results()[0].last_step);
}

TEST(KvBatchScheduler, NeedsAPagedCache) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  ContextOptions o;
  o.n_ctx = 32;
  LlamaContext ctx(model, o);
  EXPECT_THROW(KvBatchScheduler(ctx, {}), Error);
}

}  // namespace
}  // namespace slim::llm
