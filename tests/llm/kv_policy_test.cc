// Eviction policies on hand-made attention patterns: which tokens each keeps, per-layer
// and per-head budgets, budget parsing, and policies running inside a model.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/kv_policy.h"
#include "slim/llm/model.h"

namespace slim::llm {
namespace {

// A cache of `layers` x `heads` streams of n tokens (tiny head_dim: only the bookkeeping
// matters here), with per-token scores set by the test.
struct Fixture {
  std::unique_ptr<KvCache> cache;
  int seq = 0;
  Fixture(int n, int layers = 1, int heads = 1) {
    KvLayout L;
    L.n_layer = layers;
    L.n_head_kv = heads;
    L.head_dim = 4;
    L.k_type.assign(size_t(layers), KvType::f32);
    L.v_type.assign(size_t(layers), KvType::f32);
    cache = std::make_unique<KvCache>(L, 1, 256, 0);
    seq = cache->add_sequence();
    for (int i = 0; i < n; ++i) {
      std::vector<float> k(size_t(heads) * 4, float(i)), v(size_t(heads) * 4, float(-i));
      for (int l = 0; l < layers; ++l) cache->append(seq, l, i, k.data(), v.data());
    }
    cache->set_n_past(seq, n);
  }
  KvStream& stream(int l = 0, int h = 0) { return cache->stream(seq, l, h); }
  std::vector<int32_t> kept_positions(int l = 0, int h = 0) {
    return std::vector<int32_t>(stream(l, h).pos.begin(), stream(l, h).pos.end());
  }
};

std::vector<int32_t> range(int b, int e) {
  std::vector<int32_t> v(size_t(e - b));
  std::iota(v.begin(), v.end(), b);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KvBudget, ParsesRatiosPercentagesAndCounts) {
  EXPECT_DOUBLE_EQ(KvBudget::parse("0.25").ratio, 0.25);
  EXPECT_DOUBLE_EQ(KvBudget::parse("25%").ratio, 0.25);
  EXPECT_EQ(KvBudget::parse("512").tokens, 512);
  EXPECT_EQ(KvBudget::parse("0.25").for_length(100), 25);
  EXPECT_EQ(KvBudget::parse("0.25").for_length(101), 26);
  EXPECT_EQ(KvBudget::parse("512").for_length(100), 100);
  EXPECT_EQ(KvBudget::parse("512").for_length(1000), 512);
  for (const char* bad : {"", "abc", "-1", "0", "150%", "12.5x", "2.5"}) {
    try {
      KvBudget::parse(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("KV budget"), std::string::npos);
    }
  }
}

TEST(KvPolicy, FullKeepsEverything) {
  Fixture f(40);
  EXPECT_EQ(make_full_policy()->apply(*f.cache, f.seq), 0);
  EXPECT_EQ(f.stream().n, 40);
}

TEST(KvPolicy, StreamingKeepsSinksAndRecent) {
  Fixture f(40);
  auto p = make_streaming_policy(KvBudget::parse("12"), 4);
  EXPECT_EQ(p->apply(*f.cache, f.seq), 28);
  EXPECT_EQ(f.kept_positions(), concat(range(0, 4), range(32, 40)));
  // The kept keys are those tokens' keys (token i was stored as i).
  float k[4], v[4];
  f.cache->read_token(f.seq, 0, 0, 5, k, v);
  EXPECT_EQ(k[0], 33.f);
  EXPECT_EQ(v[0], -33.f);
}

TEST(KvPolicy, H2oKeepsHeavyHittersAndRecent) {
  Fixture f(40);
  KvStream& s = f.stream();
  for (int i = 0; i < 40; ++i) s.score[size_t(i)] = 0.01f * float(i % 3);
  s.score[7] = 5;
  s.score[19] = 4;
  s.score[2] = 3;
  s.score[38] = 9;  // recent anyway
  auto p = make_h2o_policy(KvBudget::parse("8"), 0.5);
  EXPECT_EQ(p->observe_window(), -1);
  EXPECT_TRUE(p->observer().accumulate);
  p->apply(*f.cache, f.seq);
  // 4 recent (36..39) + the 4 highest-scoring of 0..35: 7, 19, 2, then the best 0.02 (the latest: 35).
  EXPECT_EQ(f.kept_positions(), (std::vector<int32_t>{2, 7, 19, 35, 36, 37, 38, 39}));
  // Scores move with their tokens.
  EXPECT_EQ(f.stream().score[1], 5.f);
}

TEST(KvPolicy, LayeredKeepsSinksRecentAndDecayedHeavyHittersWithDepthBudgets) {
  Fixture f(40, 3, 1);
  for (int l = 0; l < 3; ++l) {
    KvStream& s = f.stream(l);
    for (int i = 0; i < 40; ++i) s.score[size_t(i)] = 0.01f * float(i % 3);
    s.score[7] = 5;
    s.score[19] = 4;
    s.score[12] = 3;
    s.score[2] = 9;   // a sink anyway
    s.score[38] = 9;  // recent anyway
  }
  auto p = make_layered_policy(KvBudget::parse("12"), 0.5, 0.5, 4, 0.9, false);
  EXPECT_EQ(p->name(), "layered");
  EXPECT_EQ(p->observe_window(), -1);
  EXPECT_TRUE(p->observer().accumulate);
  EXPECT_FLOAT_EQ(p->observer().decay, 0.9f);
  // Budgets rise with depth: 0.5, 1 and 1.5 times 12 (same mean).
  KvSelectInput in{f.cache.get(), f.seq, 40};
  std::vector<int> b;
  p->budgets(in, b);
  EXPECT_EQ(b, (std::vector<int>{6, 12, 18}));
  p->apply(*f.cache, f.seq);
  // Layer 0: 4 sinks, then what is left of the 6-token recent window (its 2 latest tokens).
  EXPECT_EQ(f.kept_positions(0), (std::vector<int32_t>{0, 1, 2, 3, 38, 39}));
  // Layer 1: sinks, the 6 latest, and the two heaviest of 4..33 (7 and 19).
  EXPECT_EQ(f.kept_positions(1), (std::vector<int32_t>{0, 1, 2, 3, 7, 19, 34, 35, 36, 37, 38, 39}));
  // Layer 2: room for 8 heavy hitters: 7, 19, 12, then the five latest scoring 0.02.
  EXPECT_EQ(f.kept_positions(2), (std::vector<int32_t>{0, 1, 2, 3, 7, 12, 19, 20, 23, 26, 29, 32, 34, 35, 36, 37, 38, 39}));
}

// The value-weighted layered policy ranks heavy hitters by attention times the L1 norm of
// the token's value (token i's value is -i in each of 4 channels: norm 4i).
TEST(KvPolicy, LayeredWeightsAttentionByValueNorms) {
  for (bool weighted : {true, false}) {
    Fixture f(40);
    KvStream& s = f.stream();
    ASSERT_EQ(s.value_norm.size(), 40u);
    EXPECT_EQ(s.value_norm[5], 20.f);
    s.score[8] = 2.0f;   // x 32 = 64
    s.score[10] = 1.0f;  // x 40 = 40
    s.score[20] = 0.6f;  // x 80 = 48
    s.score[30] = 0.5f;  // x 120 = 60
    make_layered_policy(KvBudget::parse("12"), 0.5, 0.5, 4, 0.9, weighted)->apply(*f.cache, f.seq);
    // 4 sinks, the 6 latest, and the two heaviest of 4..33.
    const std::vector<int32_t> heavy = weighted ? std::vector<int32_t>{8, 30} : std::vector<int32_t>{8, 10};
    EXPECT_EQ(f.kept_positions(), concat(concat(range(0, 4), heavy), range(34, 40))) << weighted;
    // Norms move with their tokens.
    EXPECT_EQ(f.stream().value_norm[5], 4.f * float(heavy[1]));
  }
}

TEST(KvPolicy, SnapKvPoolsNeighboursOfObservedPeaks) {
  Fixture f(64);
  KvStream& s = f.stream();
  s.score[10] = 1.0f;
  s.score[40] = 0.5f;
  auto p = make_snapkv_policy(KvBudget::parse("12"), 6, 3);  // window 6, pooling over 3
  EXPECT_EQ(p->observe_window(), 6);
  p->apply(*f.cache, f.seq);
  // Window 58..63, then the pooled peaks: 9..11 (score 1) and 39..41 (0.5).
  EXPECT_EQ(f.kept_positions(), (std::vector<int32_t>{9, 10, 11, 39, 40, 41, 58, 59, 60, 61, 62, 63}));
}

// One policy object may serve contexts on several threads (a context's options hold a
// shared pointer to it): selection keeps no state in the policy. Two threads apply one
// SnapKV and one entropy policy (both pool scores) to caches of different lengths and
// scores at once; each cache must keep what it keeps when the policy runs alone.
TEST(KvPolicy, OnePolicyServesCachesOnSeveralThreads) {
  for (const char* name : {"snapkv", "entropy"}) {
    std::shared_ptr<const KvPolicy> p = make_kv_policy(name, KvBudget::parse("0.25"));
    auto fill = [](Fixture& f, int salt) {
      std::mt19937 rng{static_cast<uint32_t>(salt)};
      std::uniform_real_distribution<float> u(0.f, 1.f);
      for (float& x : f.stream().score) x = u(rng);
    };
    constexpr int kCaches = 40;
    std::vector<std::vector<int32_t>> want(kCaches);
    for (int c = 0; c < kCaches; ++c) {
      Fixture f(64 + 4 * c);
      fill(f, c);
      p->apply(*f.cache, f.seq);
      want[size_t(c)] = f.kept_positions();
    }
    std::vector<std::vector<int32_t>> got(kCaches);
    auto work = [&](int first) {
      for (int round = 0; round < 5; ++round)
        for (int c = first; c < kCaches; c += 2) {
          Fixture f(64 + 4 * c);
          fill(f, c);
          p->apply(*f.cache, f.seq);
          got[size_t(c)] = f.kept_positions();
          if (got[size_t(c)] != want[size_t(c)]) return;
        }
    };
    std::thread other(work, 1);
    work(0);
    other.join();
    for (int c = 0; c < kCaches; ++c) EXPECT_EQ(got[size_t(c)], want[size_t(c)]) << name << " cache " << c;
  }
}

TEST(KvPolicy, PyramidBudgetsFallWithDepth) {
  Fixture f(100, 3, 2);
  auto p = make_pyramid_policy(KvBudget::parse("0.2"), 0.5, 4, 1);
  std::vector<int> b;
  p->budgets({f.cache.get(), f.seq, 100}, b);
  EXPECT_EQ(b, (std::vector<int>{30, 30, 20, 20, 10, 10}));  // 1.5x, 1x, 0.5x of 20
  p->apply(*f.cache, f.seq);
  EXPECT_EQ(f.stream(0, 1).n, 30);
  EXPECT_EQ(f.stream(1, 0).n, 20);
  EXPECT_EQ(f.stream(2, 1).n, 10);
  EXPECT_EQ(f.kept_positions(2, 1).back(), 99);
}

TEST(KvPolicy, EntropyGivesFocusedHeadsFewerTokens) {
  Fixture f(100, 1, 2);
  // Head 0 attends to ~2 tokens (entropy ln 2), head 1 to ~32 (ln 32).
  f.stream(0, 0).entropy_sum = std::log(2.0) * 3;
  f.stream(0, 0).entropy_count = 3;
  f.stream(0, 1).entropy_sum = std::log(32.0);
  f.stream(0, 1).entropy_count = 1;
  auto p = make_entropy_policy(KvBudget::parse("20"), 0.25, 4, 1);
  std::vector<int> b;
  p->budgets({f.cache.get(), f.seq, 100}, b);
  // 40 tokens for the layer: 5 each as a floor, the other 30 split 2:32.
  EXPECT_EQ(b, (std::vector<int>{5 + int(30 * 2.0 / 34.0), 5 + int(30 * 32.0 / 34.0)}));
  p->apply(*f.cache, f.seq);
  EXPECT_EQ(f.stream(0, 0).n, b[0]);
  EXPECT_EQ(f.stream(0, 1).n, b[1]);
  // Without observations the heads share equally.
  Fixture g(100, 1, 2);
  p->budgets({g.cache.get(), g.seq, 100}, b);
  EXPECT_EQ(b, (std::vector<int>{20, 20}));
}

TEST(KvPolicy, SlackDefersEviction) {
  Fixture f(40);
  auto p = make_streaming_policy(KvBudget::parse("30"), 4);
  EXPECT_EQ(p->apply(*f.cache, f.seq, 16), 0);
  EXPECT_EQ(p->apply(*f.cache, f.seq, 8), 10);
  EXPECT_EQ(f.stream().n, 30);
}

TEST(KvPolicy, NamesAndErrors) {
  for (const std::string& n : kv_policy_names()) EXPECT_EQ(make_kv_policy(n, KvBudget::parse("0.5"))->name(), n);
  try {
    make_kv_policy("lru", KvBudget{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'lru'"), std::string::npos);
  }
}

// Inside a model: every policy holds its budget during prefill and decode, observes
// attention where it says so, and composes with quantized KV.
TEST(KvPolicyInModel, BudgetsHoldThroughPrefillAndDecode) {
  auto model = LlamaModel::load(testing::fixture("qwen2_q4_k.gguf"));
  std::mt19937 rng(5);
  std::vector<int32_t> toks(80);
  for (auto& t : toks) t = int32_t(rng() % 290) + 3;
  for (const std::string& name : kv_policy_names())
    for (KvType type : {KvType::f16, KvType::q8}) {
      ContextOptions o;
      o.n_ctx = 128;
      o.n_threads = 2;
      o.kv.paged = true;
      o.kv.k_type = o.kv.v_type = type;
      o.kv.policy = make_kv_policy(name, KvBudget::parse("0.25"));
      LlamaContext ctx(model, o);
      ctx.eval(std::span<const int32_t>(toks.data(), 60));
      for (int i = 60; i < 80; ++i) ctx.eval(std::span<const int32_t>(&toks[size_t(i)], 1));
      EXPECT_EQ(ctx.n_past(), 80);
      const KvCache& c = ctx.kv_cache();
      const int n0 = c.stream(0, 0, 0).n;
      if (name == "full") {
        EXPECT_EQ(n0, 80);
        EXPECT_EQ(ctx.evicted_tokens(), 0);
        continue;
      }
      int64_t kept = 0;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 2; ++h) {
          const KvStream& s = c.stream(0, l, h);
          kept += s.n;
          EXPECT_EQ(s.pos.back(), 79) << name;  // the newest token always stays
          if (name != "pyramid" && name != "entropy" && name != "layered") {
            EXPECT_EQ(s.n, 20) << name;
          }
          if (name == "h2o" || name == "snapkv" || name == "layered") {
            double sum = 0;
            for (float x : s.score) sum += x;
            EXPECT_GT(sum, 0.0) << name;
          }
        }
      EXPECT_LE(kept, 4 * 20 + 2) << name;  // budgets average 25% (rounding aside)
      EXPECT_GT(ctx.evicted_tokens(), 0) << name;
      for (int i = 0; i < model->config().n_vocab; ++i) ASSERT_TRUE(std::isfinite(ctx.logits()[i]));
    }
}

}  // namespace
}  // namespace slim::llm
