// Continuous batching: sequences decoded together, with chunked prefill and admission
// between steps, produce exactly the tokens each produces alone; requests that do not fit
// wait, and requests that can never fit are refused. Urgent requests preempt less urgent
// ones, which resume with the same output; the prefix cache serves shared prompt prefixes
// without changing any output; cancelled requests return their blocks.
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
    EXPECT_EQ(sched.result(int(i)).tokens, alone(model, prompts[i], lens[i])) << "request " << i;
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
  EXPECT_EQ(sched.result(0).tokens, alone(model, prompt(20, 5), 10));
  EXPECT_EQ(sched.result(1).tokens, alone(model, prompt(12, 6), 4));
  EXPECT_GT(sched.result(1).first_step, sched.result(0).last_step);
}

TEST(KvBatchScheduler, UrgentRequestPreemptsAndTheVictimResumesWithTheSameOutput) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  for (bool cache : {false, true}) {
    LlamaContext ctx(model, paged(2));
    KvBatchOptions o{64, 16};
    o.max_running = 1;  // one running sequence; the other slot holds a cached prefix
    o.prefix_cache = cache;
    KvBatchScheduler sched(ctx, o);
    KvBatchRequest background{prompt(20, 11), 30};
    background.priority = 5;
    int urgent_id = -1;
    int seen = 0;
    // The urgent request arrives once the background one has produced 6 tokens.
    background.on_token = [&](int32_t, const float*) {
      if (++seen == 6) {
        KvBatchRequest urgent{prompt(10, 12), 8};
        urgent.priority = 0;
        urgent_id = sched.submit(urgent);
      }
      return true;
    };
    const int bg = sched.submit(background);
    sched.run();
    const KvBatchResult& b = sched.result(bg);
    const KvBatchResult& u = sched.result(urgent_id);
    EXPECT_EQ(b.preemptions, 1) << "cache " << cache;
    EXPECT_EQ(sched.stats().preemptions, 1);
    EXPECT_EQ(b.tokens, alone(model, prompt(20, 11), 30)) << "cache " << cache;
    EXPECT_EQ(u.tokens, alone(model, prompt(10, 12), 8));
    EXPECT_LT(u.last_step, b.last_step);  // the urgent one finished first
    // With the cache the victim's KV (20 prompt + 6 generated tokens) was found again.
    EXPECT_EQ(b.reused_tokens, cache ? 20 + 6 - 1 : 0);
    sched.clear_prefix_cache();
    EXPECT_EQ(ctx.kv_cache().pool().used_blocks(), 0);
  }
}

TEST(KvBatchScheduler, EqualPrioritiesDoNotPreempt) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  LlamaContext ctx(model, paged(1));
  KvBatchScheduler sched(ctx, {64, 16});
  const int a = sched.submit({prompt(8, 1), 10});
  const int b = sched.submit({prompt(8, 2), 10});
  sched.run();
  EXPECT_EQ(sched.stats().preemptions, 0);
  EXPECT_LT(sched.result(a).last_step, sched.result(b).first_step);  // first come, first served
}

TEST(KvBatchScheduler, PrefixCacheSharesBlocksAndKeepsOutputsExact) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  LlamaContext ctx(model, paged(4));
  KvBatchOptions o{64, 16};
  o.max_running = 2;
  o.prefix_cache = true;
  KvBatchScheduler sched(ctx, o);
  const std::vector<int32_t> system = prompt(40, 21);
  auto with = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> p = system;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const int first = sched.submit({with(prompt(5, 22)), 6});
  sched.run();
  EXPECT_EQ(sched.cached_sequences(), 1);
  // A follow-up turn: the whole first conversation plus a new message.
  std::vector<int32_t> turn2 = with(prompt(5, 22));
  turn2.insert(turn2.end(), sched.result(first).tokens.begin(), sched.result(first).tokens.end());
  const std::vector<int32_t> user2 = prompt(7, 23);
  turn2.insert(turn2.end(), user2.begin(), user2.end());
  const int second = sched.submit({turn2, 5});
  const int other = sched.submit({with(prompt(9, 24)), 5});  // shares only the system prompt
  sched.run();
  EXPECT_EQ(sched.result(second).tokens, alone(model, turn2, 5));
  EXPECT_EQ(sched.result(other).tokens, alone(model, with(prompt(9, 24)), 5));
  // The follow-up prefilled only what follows the first conversation's KV (45 prompt + 5
  // of its 6 tokens: the last one was never fed back); the other reused the system prompt.
  EXPECT_EQ(sched.result(second).reused_tokens, 45 + 5);
  EXPECT_EQ(sched.result(other).reused_tokens, 40);
  EXPECT_EQ(sched.stats().reused_tokens, 50 + 40);
  EXPECT_EQ(sched.stats().prompt_tokens, 45 + int64_t(turn2.size()) + 49);
  sched.clear_prefix_cache();
  EXPECT_EQ(ctx.kv_cache().pool().used_blocks(), 0);
}

TEST(KvBatchScheduler, AFollowUpSharesItsConversationInAPoolForOneContext) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  // One running slot, one cache slot and blocks for one full context (6 per stream): the
  // follow-up's worst case fills the pool, so it keeps the blocks it shares and the cached
  // conversation itself goes.
  LlamaContext ctx(model, paged(2, 24 * 4096));
  KvBatchOptions o{64, 64};
  o.max_running = 1;
  o.prefix_cache = true;
  KvBatchScheduler sched(ctx, o);
  const int first = sched.submit({prompt(40, 51), 8});
  sched.run();
  std::vector<int32_t> turn2 = prompt(40, 51);
  turn2.insert(turn2.end(), sched.result(first).tokens.begin(), sched.result(first).tokens.end());
  const std::vector<int32_t> user2 = prompt(10, 52);
  turn2.insert(turn2.end(), user2.begin(), user2.end());
  const int second = sched.submit({turn2, 96 - int(turn2.size())});
  sched.run();
  EXPECT_EQ(sched.result(second).reused_tokens, 40 + 7);
  EXPECT_EQ(sched.result(second).tokens, alone(model, turn2, 96 - int(turn2.size())));
  sched.clear_prefix_cache();
  EXPECT_EQ(ctx.kv_cache().pool().used_blocks(), 0);
}

TEST(KvBatchScheduler, CachedPrefixesAreEvictedWhenRunningSequencesNeedTheRoom) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  // 8 blocks: one 32-token request at a time; a cached prefix must make way for the next.
  LlamaContext ctx(model, paged(3, 8 * 4096));
  KvBatchOptions o{64, 64};
  o.max_running = 1;
  o.prefix_cache = true;
  KvBatchScheduler sched(ctx, o);
  for (uint32_t i = 0; i < 4; ++i) sched.submit({prompt(20, 30 + i), 10});
  sched.run();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(sched.result(i).tokens, alone(model, prompt(20, 30 + uint32_t(i)), 10));
  EXPECT_LE(sched.cached_sequences(), 2);
}

TEST(KvBatchScheduler, CallbacksStopAndCancelledRequestsFreeTheirBlocks) {
  auto model = LlamaModel::load(testing::fixture("llama_f32.gguf"));
  LlamaContext ctx(model, paged(3));
  KvBatchScheduler sched(ctx, {64, 16});
  std::vector<KvBatchResult> finished;
  KvBatchRequest stopper{prompt(12, 41), 20};
  int n = 0;
  stopper.on_token = [&](int32_t, const float*) { return ++n < 3; };
  stopper.on_finish = [&](const KvBatchResult& r) { finished.push_back(r); };
  sched.submit(stopper);
  KvBatchRequest doomed{prompt(30, 42), 20};
  doomed.on_finish = stopper.on_finish;
  const int d = sched.submit(doomed);
  KvBatchRequest waiting{prompt(30, 43), 20};
  waiting.on_finish = stopper.on_finish;
  const int w = sched.submit(waiting);
  sched.step();
  sched.step();
  sched.cancel(d);
  sched.cancel(w);
  sched.run();
  ASSERT_EQ(finished.size(), 3u);
  int stopped = 0, cancelled = 0;
  for (const KvBatchResult& r : finished) {
    stopped += r.finish == KvFinish::stopped;
    cancelled += r.finish == KvFinish::cancelled;
  }
  EXPECT_EQ(stopped, 1);
  EXPECT_EQ(cancelled, 2);
  EXPECT_THROW(sched.result(d), Error);  // results with a callback are not kept
  EXPECT_EQ(ctx.kv_cache().pool().used_blocks(), 0);
  EXPECT_EQ(sched.running() + sched.waiting(), 0);
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
