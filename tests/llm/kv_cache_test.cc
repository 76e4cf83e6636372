// Paged KV cache: block pool accounting, quantized round trips, compaction, prefix
// sharing, attention against a direct computation, and end to end: a paged cache that
// keeps everything gives exactly the contiguous cache's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/core/half.h"
#include "slim/llm/kv_attention.h"
#include "slim/llm/kv_cache.h"
#include "slim/llm/kv_policy.h"
#include "slim/llm/model.h"

namespace slim::llm {
namespace {

using testing::fixture;

template <typename F>
std::string error_of(F&& f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(KvBlockPool, AllocatesSharesFreesAndRefusesWhenFull) {
  KvBlockPool pool(100, 1000);  // blocks round up to 128 bytes: 7 fit
  EXPECT_EQ(pool.block_bytes(), 128);
  ASSERT_EQ(pool.capacity(), 7);
  std::vector<int32_t> b;
  for (int i = 0; i < 7; ++i) b.push_back(pool.allocate());
  EXPECT_EQ(pool.free_blocks(), 0);
  EXPECT_EQ(pool.peak_used(), 7);
  ErrorCode code{};
  const std::string msg = error_of([&] { pool.allocate(); }, &code);
  EXPECT_EQ(code, ErrorCode::resource_exhausted);
  EXPECT_NE(msg.find("all 7 blocks"), std::string::npos) << msg;
  pool.retain(b[2]);
  EXPECT_EQ(pool.refcount(b[2]), 2);
  pool.release(b[2]);
  EXPECT_EQ(pool.free_blocks(), 0);  // still owned once
  pool.release(b[2]);
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_EQ(pool.allocate(), b[2]);  // the freed block comes back
  EXPECT_EQ(pool.allocations(), 8);
  EXPECT_EQ(pool.shared_refs(), 1);
  EXPECT_DOUBLE_EQ(pool.reuse_rate(), 1.0 / 9.0);
  EXPECT_EQ(error_of([&] { pool.release(99); }, &code).empty(), false);
  EXPECT_EQ(code, ErrorCode::internal);
  EXPECT_NE(error_of([&] { KvBlockPool tiny(4096, 100); }, &code).find("holds no block"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::resource_exhausted);
}

KvLayout layout(KvType k, KvType v, int layers = 1, int heads = 2, int hd = 64) {
  KvLayout L;
  L.n_layer = layers;
  L.n_head_kv = heads;
  L.head_dim = hd;
  L.k_type.assign(size_t(layers), k);
  L.v_type.assign(size_t(layers), v);
  return L;
}

// Random keys with a few outlier channels (as real keys have) and plain random values.
struct Tokens {
  std::vector<float> k, v;  // [n][heads * hd]
};
Tokens random_tokens(int n, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Tokens t;
  t.k.resize(size_t(n) * width);
  t.v.resize(size_t(n) * width);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < width; ++c) {
      t.k[size_t(i) * width + c] = nd(rng) * (c % 16 == 3 ? 8.f : 1.f) + (c % 16 == 5 ? 4.f : 0.f);
      t.v[size_t(i) * width + c] = nd(rng);
    }
  return t;
}

TEST(KvCache, StatsCountBlocksAndUnusedSlots) {
  KvCache cache(layout(KvType::f16, KvType::f16, 2, 2), 2, 64, 0);
  const int s = cache.add_sequence();
  Tokens t = random_tokens(20, 128, 1);
  for (int i = 0; i < 20; ++i)
    for (int l = 0; l < 2; ++l) cache.append(s, l, i, &t.k[size_t(i) * 128], &t.v[size_t(i) * 128]);
  KvCacheStats st = cache.stats();
  EXPECT_EQ(st.blocks_used, 8);  // 2 layers x 2 heads x 2 blocks
  EXPECT_EQ(st.tokens, 80);
  EXPECT_EQ(st.unused_slots, 4 * 12);
  EXPECT_DOUBLE_EQ(st.fragmentation, 48.0 / 128.0);
  EXPECT_EQ(st.block_bytes, 2 * 16 * 64 * 2);
  EXPECT_EQ(cache.sequence_bytes(s), 8 * st.block_bytes);
  cache.remove_sequence(s);
  EXPECT_EQ(cache.stats().blocks_used, 0);
  EXPECT_EQ(cache.stats().peak_blocks, 8);
}

// A structurally pruned model's layers have their own KV head counts: each layer holds
// streams and blocks for its heads only, reads only those from the appended row, and the
// pool is sized by their sum.
TEST(KvCache, LayersWithFewerHeadsHoldOnlyTheirOwn) {
  KvLayout L = layout(KvType::f32, KvType::f32, 3, 2);
  L.layer_heads = {2, 1, 2};
  KvCache cache(L, 1, 32, 0);
  EXPECT_EQ(L.total_heads(), 5);
  EXPECT_EQ(cache.pool().capacity(), 5 * 2);  // 5 streams x 2 blocks of 16 tokens
  const int s = cache.add_sequence();
  Tokens t = random_tokens(20, 128, 2);
  for (int i = 0; i < 20; ++i)
    for (int l = 0; l < 3; ++l) cache.append(s, l, i, &t.k[size_t(i) * 128], &t.v[size_t(i) * 128]);
  EXPECT_EQ(cache.stats().blocks_used, 10);
  EXPECT_EQ(cache.stats().tokens, 100);
  std::vector<float> k(64), v(64);
  for (int i : {0, 17}) {
    cache.read_token(s, 1, 0, i, k.data(), v.data());  // layer 1's one head: the row's first
    EXPECT_EQ(0, std::memcmp(k.data(), &t.k[size_t(i) * 128], 64 * 4));
    cache.read_token(s, 2, 1, i, k.data(), v.data());  // layer 2's second head
    EXPECT_EQ(0, std::memcmp(v.data(), &t.v[size_t(i) * 128 + 64], 64 * 4));
  }
  cache.truncate(s, 5);
  EXPECT_EQ(cache.stats().tokens, 25);
  L.layer_heads = {2, 3, 2};
  EXPECT_EQ(error_of([&] { KvCache bad(L, 1, 32, 0); }), "KV cache: layer 1 has 3 KV heads (1..2)");
  L.layer_heads = {2, 1};
  EXPECT_EQ(error_of([&] { KvCache bad(L, 1, 32, 0); }), "KV cache: 2 per-layer head counts for 3 layers");
}

struct RoundTrip {
  KvType k, v;
  double k_tol, v_tol;  // max error relative to the row's (or channel's) range
};

class KvRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

// Quantization error bounds: f16 rounds to 2^-11 of the value; q8 to half a step of
// absmax/127; q4 to half a step of range/15 (per channel over a block for keys, per
// token for values), plus the f16 rounding of scale and minimum.
TEST_P(KvRoundTrip, ValuesComeBackWithinTheFormatsError) {
  const RoundTrip p = GetParam();
  const int n = 53, hd = 64, heads = 2, width = heads * hd;
  KvCache cache(layout(p.k, p.v, 1, heads, hd), 1, 64, 0);
  const int s = cache.add_sequence();
  Tokens t = random_tokens(n, width, 7);
  for (int i = 0; i < n; ++i) cache.append(s, 0, i, &t.k[size_t(i) * width], &t.v[size_t(i) * width]);
  std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
  double worst_k = 0, worst_v = 0;
  for (int h = 0; h < heads; ++h) {
    const KvStream& st = cache.stream(s, 0, h);
    ASSERT_EQ(st.n, n);
    // Per-channel ranges over each block of 16 tokens (the q4 key grid) and per-row ranges.
    for (int i = 0; i < n; ++i) {
      cache.read_token(s, 0, h, i, k.data(), v.data());
      const float* kr = &t.k[size_t(i) * width + size_t(h) * hd];
      const float* vr = &t.v[size_t(i) * width + size_t(h) * hd];
      float kmax = 0, vlo = vr[0], vhi = vr[0];
      for (int c = 0; c < hd; ++c) kmax = std::max(kmax, std::fabs(kr[c])), vlo = std::min(vlo, vr[c]), vhi = std::max(vhi, vr[c]);
      for (int c = 0; c < hd; ++c) {
        float klo = 1e30f, khi = -1e30f;
        const int b0 = i / 16 * 16;
        for (int j = b0; j < std::min(n, b0 + 16); ++j) {
          klo = std::min(klo, t.k[size_t(j) * width + size_t(h) * hd + c]);
          khi = std::max(khi, t.k[size_t(j) * width + size_t(h) * hd + c]);
        }
        const double kscale = p.k == KvType::q4 ? double(khi - klo) : double(kmax);
        worst_k = std::max(worst_k, std::fabs(double(k[size_t(c)]) - kr[c]) / kscale);
        const double vscale = p.v == KvType::q4 ? double(vhi - vlo) : double(std::max(std::fabs(vlo), std::fabs(vhi)));
        worst_v = std::max(worst_v, std::fabs(double(v[size_t(c)]) - vr[c]) / vscale);
      }
    }
  }
  EXPECT_LE(worst_k, p.k_tol) << kv_type_name(p.k);
  EXPECT_LE(worst_v, p.v_tol) << kv_type_name(p.v);
  if (p.k == KvType::f32 && p.v == KvType::f32) {
    EXPECT_EQ(worst_k, 0.0);
    EXPECT_EQ(worst_v, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, KvRoundTrip,
                         ::testing::Values(RoundTrip{KvType::f32, KvType::f32, 0, 0},
                                           RoundTrip{KvType::f16, KvType::f16, 5e-4, 5e-4},
                                           RoundTrip{KvType::q8, KvType::q8, 0.5 / 127 + 1e-6, 0.5 / 127 + 1e-6},
                                           RoundTrip{KvType::q4, KvType::q4, 0.5 / 15 + 2e-3, 0.5 / 15 + 2e-3},
                                           RoundTrip{KvType::q4, KvType::f16, 0.5 / 15 + 2e-3, 5e-4},
                                           // q4 values put the keys through the f16 window too
                                           RoundTrip{KvType::q8, KvType::q4, 0.5 / 127 + 5e-4, 0.5 / 15 + 2e-3}),
                         [](const auto& info) {
                           return std::string(kv_type_name(info.param.k)) + "_" + kv_type_name(info.param.v);
                         });

TEST(KvCache, Q4KeepsTheRecentWindowInF16) {
  KvLayout L = layout(KvType::q4, KvType::q4, 1, 1, 64);
  L.q4_recent_blocks = 2;
  KvCache cache(L, 1, 128, 0);
  const int s = cache.add_sequence();
  Tokens t = random_tokens(70, 64, 3);
  for (int i = 0; i < 70; ++i) cache.append(s, 0, i, &t.k[size_t(i) * 64], &t.v[size_t(i) * 64]);
  const KvStream& st = cache.stream(s, 0, 0);
  // 70 tokens: the newest 22 (at most two blocks' worth) wait in f16, 48 are quantized.
  EXPECT_EQ(st.n_staged, 22);
  EXPECT_EQ(st.blocks.size(), 3u);
  EXPECT_EQ(cache.stats().staged_tokens, 22);
  float k[64], v[64];
  for (int i = 48; i < 70; ++i) {
    cache.read_token(s, 0, 0, i, k, v);
    for (int c = 0; c < 64; ++c) {
      EXPECT_NEAR(k[c], t.k[size_t(i) * 64 + c], std::fabs(t.k[size_t(i) * 64 + c]) * 1e-3 + 1e-6);
      EXPECT_NEAR(v[c], t.v[size_t(i) * 64 + c], std::fabs(t.v[size_t(i) * 64 + c]) * 1e-3 + 1e-6);
    }
  }
}

TEST(KvCache, Q8CanKeepTheRecentWindowInF16) {
  KvLayout L = layout(KvType::q8, KvType::q8, 1, 1, 64);
  L.q8_recent = true;
  L.q4_recent_blocks = 1;
  KvCache cache(L, 1, 64, 0);
  const int s = cache.add_sequence();
  Tokens t = random_tokens(40, 64, 13);
  for (int i = 0; i < 40; ++i) cache.append(s, 0, i, &t.k[size_t(i) * 64], &t.v[size_t(i) * 64]);
  EXPECT_EQ(cache.stream(s, 0, 0).n_staged, 8);  // 40 = two q8 blocks + 8 in f16
  float k[64], v[64];
  for (int i : {0, 31, 32, 39}) {
    cache.read_token(s, 0, 0, i, k, v);
    float amax = 0, err = 0;
    for (int c = 0; c < 64; ++c) {
      amax = std::max(amax, std::fabs(t.k[size_t(i) * 64 + c]));
      err = std::max(err, std::fabs(k[c] - t.k[size_t(i) * 64 + c]));
    }
    if (i < 32) {
      EXPECT_LE(err, amax * (0.5f / 127 + 5e-4f)) << i;
      EXPECT_GT(err, amax * 1e-3f) << i;  // really quantized
    } else {
      EXPECT_LE(err, amax * 5e-4f) << i;  // f16
    }
  }
}

// Attention straight from the stored tokens (decoded to f32) in double precision.
void reference_attention(const KvCache& cache, int s, int h, const float* q, int len, float scale, std::vector<double>& out) {
  const int hd = cache.layout().head_dim;
  std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
  std::vector<double> sc(static_cast<size_t>(len));
  double mx = -1e300;
  for (int i = 0; i < len; ++i) {
    cache.read_token(s, 0, h, i, k.data(), v.data());
    double d = 0;
    for (int c = 0; c < hd; ++c) d += double(q[c]) * k[size_t(c)];
    sc[size_t(i)] = d * scale;
    mx = std::max(mx, sc[size_t(i)]);
  }
  double sum = 0;
  for (double& x : sc) sum += (x = std::exp(x - mx));
  out.assign(size_t(hd), 0.0);
  for (int i = 0; i < len; ++i) {
    cache.read_token(s, 0, h, i, k.data(), v.data());
    for (int c = 0; c < hd; ++c) out[size_t(c)] += sc[size_t(i)] / sum * v[size_t(c)];
  }
}

class KvAttention : public ::testing::TestWithParam<KvType> {};

TEST_P(KvAttention, MatchesDirectComputationOverStoredValues) {
  const KvType type = GetParam();
  const int n = 45, hd = 64, heads = 2, width = heads * hd;
  KvCache cache(layout(type, type, 1, heads, hd), 1, 64, 0);
  const int s = cache.add_sequence();
  Tokens t = random_tokens(n, width, 11);
  for (int i = 0; i < n; ++i) cache.append(s, 0, i, &t.k[size_t(i) * width], &t.v[size_t(i) * width]);
  const int visible[3] = {45, 17, 1};
  const uint8_t observe[3] = {1, 0, 1};
  // Three rows of a group of two query heads (queries head_dim apart, rows 2 * head_dim apart).
  const int G = 2;
  Tokens q = random_tokens(3 * G, hd, 12);
  std::vector<float> out(3 * G * size_t(hd)), scratch(size_t(cache.scratch_floats(G)));
  const float scale = 0.125f;
  for (int h = 0; h < heads; ++h) {
    cache.attend(s, 0, h, q.k.data(), G * hd, 3, G, visible, observe, KvObserver{true, true}, scale, out.data(), G * hd,
                 scratch.data());
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < G; ++j) {
        std::vector<double> ref;
        reference_attention(cache, s, h, &q.k[size_t(r * G + j) * hd], visible[r], scale, ref);
        double err = 0, mag = 0;
        for (int c = 0; c < hd; ++c) {
          err = std::max(err, std::fabs(out[size_t(r * G + j) * hd + c] - ref[size_t(c)]));
          mag = std::max(mag, std::fabs(ref[size_t(c)]));
        }
        // Stored values are used exactly: only float32 summation order differs.
        EXPECT_LT(err / mag, 2e-5) << kv_type_name(type) << " row " << r << " query " << j;
      }
    // Observed rows 0 and 2 each add one probability distribution per query head.
    const KvStream& st = cache.stream(s, 0, h);
    double total = 0;
    for (float x : st.score) total += x;
    EXPECT_NEAR(total, 2.0 * G, 1e-5);
    // Row 2 sees one token, which gets its whole mass.
    EXPECT_GE(st.score[0], G - 1e-6);
    EXPECT_EQ(st.entropy_count, 2 * G);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, KvAttention, ::testing::Values(KvType::f32, KvType::f16, KvType::q8, KvType::q4),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

TEST(KvAttentionKernels, VectorKernelsMatchScalar) {
  const KvAttentionKernels& best = kv_attention_kernels();
  const KvAttentionKernels& ref = kv_attention_kernels_scalar();
  std::printf("attention kernels: %s\n", best.isa);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int hd : {64, 128, 40, 6})
    for (int n : {1, 7, 16, 19}) {
      const int64_t stride = hd + 8;  // rows of a wider matrix, as in the contiguous cache
      std::vector<uint16_t> k(size_t(n) * stride), v(size_t(n) * stride);
      // q8 rows as in the paged cache: blocks of kKvBlockTokens rows' codes, then their
      // scales, the blocks in pool order 0, 1, ...
      const int nblk = (n + kKvBlockTokens - 1) / kKvBlockTokens;
      const int64_t q8_block = (int64_t(kKvBlockTokens) * hd + kKvBlockTokens * 4 + 63) / 64 * 64;
      std::vector<float> q8_store(size_t(nblk * q8_block / 4));
      int8_t* q8_base = reinterpret_cast<int8_t*>(q8_store.data());
      std::vector<int32_t> q8_ids(static_cast<size_t>(nblk));
      for (int b = 0; b < nblk; ++b) q8_ids[size_t(b)] = b;
      const KvQ8Rows xr{q8_base, q8_ids.data(), q8_block, kKvBlockTokens, hd};
      for (int i = 0; i < n; ++i) {
        int8_t* row = q8_base + (i / kKvBlockTokens) * q8_block + (i % kKvBlockTokens) * hd;
        for (int c = 0; c < hd; ++c) row[c] = int8_t(int(rng() % 255) - 127);
        float* scales = reinterpret_cast<float*>(q8_base + (i / kKvBlockTokens) * q8_block + kKvBlockTokens * hd);
        scales[i % kKvBlockTokens] = std::fabs(nd(rng)) * 0.01f;
      }
      for (auto& e : k) e = f32_to_f16(nd(rng));
      for (auto& e : v) e = f32_to_f16(nd(rng));
      std::vector<uint8_t> x4(size_t(n) * hd / 2);
      std::vector<uint16_t> dmk(2 * size_t(hd)), dmv(2 * size_t(kKvBlockTokens));
      for (auto& e : x4) e = uint8_t(rng() & 0xFF);
      for (auto* dm : {&dmk, &dmv})
        for (size_t i = 0; i < dm->size(); ++i) (*dm)[i] = f32_to_f16(i < dm->size() / 2 ? std::fabs(nd(rng)) * 0.1f : nd(rng));
      for (int g : {1, 3, 4, 8}) {
        // g queries, scores n apart (ldo = n + 1), probabilities likewise.
        const int64_t ld = n + 1;
        std::vector<float> qg(size_t(g) * hd), pg(size_t(g) * ld);
        for (auto& e : qg) e = nd(rng);
        for (auto& e : pg) e = std::fabs(nd(rng));
        std::vector<float> a(size_t(g) * ld), b(size_t(g) * ld), one(static_cast<size_t>(n));
        const KvF16Rows kr = KvF16Rows::contiguous(k.data(), stride), vr = KvF16Rows::contiguous(v.data(), stride);
        best.scores_f16(kr, n, qg.data(), g, hd, a.data(), ld);
        ref.scores_f16(kr, n, qg.data(), g, hd, b.data(), ld);
        for (int j = 0; j < g; ++j) {
          // A query's scores do not depend on how many queries share the call.
          best.scores_f16(kr, n, qg.data() + j * hd, 1, hd, one.data(), 0);
          for (int i = 0; i < n; ++i) {
            EXPECT_NEAR(a[size_t(j * ld + i)], b[size_t(j * ld + i)], 1e-4 * std::sqrt(double(hd))) << hd << " " << n;
            EXPECT_EQ(a[size_t(j * ld + i)], one[size_t(i)]);
          }
        }
        best.scores_q8(xr, n, qg.data(), g, hd, a.data(), ld);
        ref.scores_q8(xr, n, qg.data(), g, hd, b.data(), ld);
        for (int j = 0; j < g; ++j)
          for (int i = 0; i < n; ++i)
            EXPECT_NEAR(a[size_t(j * ld + i)], b[size_t(j * ld + i)], 1e-3 * std::fabs(b[size_t(j * ld + i)]) + 1e-4);
        std::vector<float> oa(size_t(g) * hd, 0.5f), ob(size_t(g) * hd, 0.5f), o1(static_cast<size_t>(hd), 0.5f);
        best.accumulate_f16(vr, n, pg.data(), ld, g, hd, oa.data());
        ref.accumulate_f16(vr, n, pg.data(), ld, g, hd, ob.data());
        best.accumulate_f16(vr, n, pg.data() + (g - 1) * ld, 0, 1, hd, o1.data());
        for (int c = 0; c < g * hd; ++c) EXPECT_NEAR(oa[size_t(c)], ob[size_t(c)], 1e-4 * n) << hd;
        for (int c = 0; c < hd; ++c) EXPECT_EQ(oa[size_t((g - 1) * hd + c)], o1[size_t(c)]);
        best.accumulate_q8(xr, n, pg.data(), ld, g, hd, oa.data());
        ref.accumulate_q8(xr, n, pg.data(), ld, g, hd, ob.data());
        for (int c = 0; c < g * hd; ++c) EXPECT_NEAR(oa[size_t(c)], ob[size_t(c)], 1e-3 * n) << hd;
        // 4-bit keys (per-channel scale and minimum) and values (per row, at most a block).
        best.scores_q4(x4.data(), dmk.data(), n, qg.data(), g, hd, a.data(), ld);
        ref.scores_q4(x4.data(), dmk.data(), n, qg.data(), g, hd, b.data(), ld);
        for (int j = 0; j < g; ++j) {
          best.scores_q4(x4.data(), dmk.data(), n, qg.data() + j * hd, 1, hd, one.data(), 0);
          for (int i = 0; i < n; ++i) {
            EXPECT_NEAR(a[size_t(j * ld + i)], b[size_t(j * ld + i)], 1e-4 * std::sqrt(double(hd))) << "q4 " << hd << " " << n;
            EXPECT_EQ(a[size_t(j * ld + i)], one[size_t(i)]);
          }
        }
        const int nv = std::min(n, kKvBlockTokens);
        best.accumulate_q4(x4.data(), dmv.data(), nv, pg.data(), ld, g, hd, oa.data());
        ref.accumulate_q4(x4.data(), dmv.data(), nv, pg.data(), ld, g, hd, ob.data());
        for (int c = 0; c < g * hd; ++c) EXPECT_NEAR(oa[size_t(c)], ob[size_t(c)], 1e-3 * n) << "q4 " << hd;
      }
    }
}

// Rows spread over blocks of a pool in any order (a paged stream) give exactly the sums
// of the same rows in one run, f16 and q8, for every kernel set: each row's score is
// computed alone, and each output adds its rows in order whatever the runs.
TEST(KvAttentionKernels, BlockRunsMatchOneRun) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const KvAttentionKernels* ak : {&kv_attention_kernels(), &kv_attention_kernels_scalar()})
    for (int hd : {64, 128, 40})
      for (int n : {1, 16, 17, 100, 300}) {
        const int nblk = (n + kKvBlockTokens - 1) / kKvBlockTokens;
        std::vector<int32_t> ids(static_cast<size_t>(nblk));
        for (int b = 0; b < nblk; ++b) ids[size_t(b)] = 2 * (nblk - 1 - b) + 1;  // reversed, gaps between
        // f16 blocks (elements), q8 blocks (bytes: codes, then the rows' scales), padded.
        const int64_t block = int64_t(kKvBlockTokens) * hd + 32, q8_block = int64_t(kKvBlockTokens) * (hd + 4) + 64;
        std::vector<uint16_t> pool(size_t(2 * nblk + 1) * size_t(block), 0x7e00);  // NaN where no row is
        std::vector<float> q8_pool(size_t((2 * nblk + 1) * q8_block / 4), NAN);
        std::vector<uint16_t> rows(size_t(n) * hd);
        std::vector<float> q8_one(size_t(n) * (hd + 4) / 4);  // n rows of codes, then n scales
        int8_t* q8p = reinterpret_cast<int8_t*>(q8_pool.data());
        int8_t* q8o = reinterpret_cast<int8_t*>(q8_one.data());
        for (int i = 0; i < n; ++i) {
          const int64_t at = ids[size_t(i / kKvBlockTokens)], slot = i % kKvBlockTokens;
          for (int c = 0; c < hd; ++c) {
            const uint16_t h = f32_to_f16(nd(rng));
            rows[size_t(i) * hd + c] = h;
            pool[size_t(at * block + slot * hd + c)] = h;
            q8o[int64_t(i) * hd + c] = q8p[at * q8_block + slot * hd + c] = int8_t(int(rng() % 255) - 127);
          }
          const float d = std::fabs(nd(rng)) * 0.01f;
          reinterpret_cast<float*>(q8o + int64_t(n) * hd)[i] = d;
          reinterpret_cast<float*>(q8p + at * q8_block + kKvBlockTokens * hd)[slot] = d;
        }
        const KvF16Rows one = KvF16Rows::contiguous(rows.data(), hd), runs{pool.data(), ids.data(), block, kKvBlockTokens, hd};
        const KvQ8Rows q8_1 = KvQ8Rows::contiguous(q8o, hd, n), q8_runs{q8p, ids.data(), q8_block, kKvBlockTokens, hd};
        for (int g : {1, 3, 5}) {
          std::vector<float> q(size_t(g) * hd), p(size_t(g) * n);
          for (auto& e : q) e = nd(rng);
          for (auto& e : p) e = std::fabs(nd(rng));
          // The same rows in one run and in block runs: scores, then value sums.
          auto same = [&](auto scores, auto accumulate, const auto& one_run, const auto& block_runs, const char* type) {
            std::vector<float> a(size_t(g) * n), b(size_t(g) * n), oa(size_t(g) * hd, 0.25f), ob = oa;
            (ak->*scores)(one_run, n, q.data(), g, hd, a.data(), n);
            (ak->*scores)(block_runs, n, q.data(), g, hd, b.data(), n);
            EXPECT_EQ(a, b) << ak->isa << " " << type << " hd " << hd << " n " << n << " g " << g;
            (ak->*accumulate)(one_run, n, p.data(), n, g, hd, oa.data());
            (ak->*accumulate)(block_runs, n, p.data(), n, g, hd, ob.data());
            EXPECT_EQ(oa, ob) << ak->isa << " " << type << " hd " << hd << " n " << n << " g " << g;
          };
          same(&KvAttentionKernels::scores_f16, &KvAttentionKernels::accumulate_f16, one, runs, "f16");
          same(&KvAttentionKernels::scores_q8, &KvAttentionKernels::accumulate_q8, q8_1, q8_runs, "q8");
        }
      }
}

// The attention softmax against the scalar one (std::exp, double sum): every length
// around the vector width, scores spread far enough that some underflow, a row of equal
// scores, and a single score.
TEST(KvAttentionKernels, SoftmaxMatchesScalar) {
  const KvAttentionKernels& best = kv_attention_kernels();
  const KvAttentionKernels& ref = kv_attention_kernels_scalar();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int n : {1, 5, 16, 17, 33, 100, 2048})
    for (float spread : {0.f, 1.f, 40.f}) {
      std::vector<float> a(static_cast<size_t>(n)), b;
      for (auto& e : a) e = spread * nd(rng);
      b = a;
      best.softmax(a.data(), n, 0.125f);
      ref.softmax(b.data(), n, 0.125f);
      double total = 0;
      for (int i = 0; i < n; ++i) {
        EXPECT_NEAR(a[size_t(i)], b[size_t(i)], 1e-6 * b[size_t(i)] + 1e-30) << n << " " << spread << " " << i;
        EXPECT_GE(a[size_t(i)], 0.f);
        total += a[size_t(i)];
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << n << " " << spread;
      if (spread == 0.f) {
        EXPECT_FLOAT_EQ(a[0], 1.f / float(n));
      }
    }
}

// Positions, scores and value norms follow the kept tokens in every format (q4 streams
// are rebuilt and quantized again, the others compacted in place).
TEST(KvCache, KeepCarriesTokenBookkeeping) {
  for (KvType type : {KvType::f32, KvType::f16, KvType::q8, KvType::q4}) {
    KvCache cache(layout(type, type, 1, 1, 64), 1, 128, 0);
    const int s = cache.add_sequence();
    Tokens t = random_tokens(70, 64, 6);
    for (int i = 0; i < 70; ++i) cache.append(s, 0, 100 + i, &t.k[size_t(i) * 64], &t.v[size_t(i) * 64]);
    KvStream& st = cache.stream(s, 0, 0);
    for (int i = 0; i < 70; ++i) st.score[size_t(i)] = float(i) * 0.5f;
    const std::vector<float> norms = st.value_norm;
    const std::vector<int32_t> keep = {0, 3, 17, 20, 33, 40, 52, 66, 69};
    cache.keep(s, 0, 0, keep);
    ASSERT_EQ(st.n, 9);
    for (size_t j = 0; j < keep.size(); ++j) {
      EXPECT_EQ(st.pos[j], 100 + keep[j]) << kv_type_name(type);
      EXPECT_EQ(st.score[j], float(keep[j]) * 0.5f) << kv_type_name(type);
      EXPECT_EQ(st.value_norm[j], norms[size_t(keep[j])]) << kv_type_name(type);
    }
  }
}

TEST(KvCache, KeepCompactsExactlyAndFreesBlocks) {
  for (KvType type : {KvType::f16, KvType::q8}) {
    KvCache cache(layout(type, type, 1, 1, 64), 1, 64, 0);
    const int s = cache.add_sequence();
    Tokens t = random_tokens(40, 64, 5);
    for (int i = 0; i < 40; ++i) cache.append(s, 0, i, &t.k[size_t(i) * 64], &t.v[size_t(i) * 64]);
    std::vector<std::vector<float>> before(40, std::vector<float>(128));
    for (int i = 0; i < 40; ++i) cache.read_token(s, 0, 0, i, before[size_t(i)].data(), before[size_t(i)].data() + 64);
    const std::vector<int32_t> keep = {0, 1, 2, 3, 17, 20, 33, 38, 39};
    cache.keep(s, 0, 0, keep);
    const KvStream& st = cache.stream(s, 0, 0);
    EXPECT_EQ(st.n, 9);
    EXPECT_EQ(st.blocks.size(), 1u);
    EXPECT_EQ(cache.pool().used_blocks(), 1);
    std::vector<float> kv(128);
    for (size_t j = 0; j < keep.size(); ++j) {
      cache.read_token(s, 0, 0, int(j), kv.data(), kv.data() + 64);
      EXPECT_EQ(kv, before[size_t(keep[j])]) << kv_type_name(type) << " token " << j;
      EXPECT_EQ(st.pos[j], keep[j]);
    }
    ErrorCode code{};
    const std::string msg = error_of([&] { cache.keep(s, 0, 0, std::vector<int32_t>{3, 2}); }, &code);
    EXPECT_EQ(code, ErrorCode::invalid_argument);
    EXPECT_NE(msg.find("not ascending"), std::string::npos) << msg;
  }
}

TEST(KvCache, ForkSharesWholeBlocksAndCopiesOnWrite) {
  KvCache cache(layout(KvType::f16, KvType::f16, 1, 1, 64), 3, 64, 0);
  const int a = cache.add_sequence();
  Tokens t = random_tokens(40, 64, 9);
  for (int i = 0; i < 40; ++i) cache.append(a, 0, i, &t.k[size_t(i) * 64], &t.v[size_t(i) * 64]);
  cache.set_n_past(a, 40);
  const int b = cache.fork_sequence(a, 37);  // two whole blocks shared, 5 tokens copied
  EXPECT_EQ(cache.n_past(b), 37);
  const KvStream& sa = cache.stream(a, 0, 0);
  const KvStream& sb = cache.stream(b, 0, 0);
  ASSERT_EQ(sb.n, 37);
  EXPECT_EQ(sb.blocks[0], sa.blocks[0]);
  EXPECT_EQ(sb.blocks[1], sa.blocks[1]);
  EXPECT_NE(sb.blocks[2], sa.blocks[2]);
  EXPECT_EQ(cache.pool().refcount(sa.blocks[0]), 2);
  EXPECT_EQ(cache.pool().used_blocks(), 4);
  EXPECT_GT(cache.stats().reuse_rate, 0.0);
  // Each token's value norm (sum of |v| as appended) comes along.
  ASSERT_EQ(sa.value_norm.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    float norm = 0;
    for (int c = 0; c < 64; ++c) norm += std::fabs(t.v[size_t(i) * 64 + c]);
    EXPECT_EQ(sa.value_norm[size_t(i)], norm) << i;
  }
  EXPECT_EQ(sb.value_norm, std::vector<float>(sa.value_norm.begin(), sa.value_norm.begin() + 37));
  std::vector<float> x(128), y(128);
  for (int i = 0; i < 37; ++i) {
    cache.read_token(a, 0, 0, i, x.data(), x.data() + 64);
    cache.read_token(b, 0, 0, i, y.data(), y.data() + 64);
    EXPECT_EQ(x, y);
  }
  // Evicting from the child must not touch the parent's shared blocks.
  std::vector<int32_t> keep = {0, 5, 36};
  cache.keep(b, 0, 0, keep);
  EXPECT_EQ(sb.value_norm, (std::vector<float>{sa.value_norm[0], sa.value_norm[5], sa.value_norm[36]}));
  for (int i = 0; i < 40; ++i) {
    cache.read_token(a, 0, 0, i, x.data(), x.data() + 64);
    for (int c = 0; c < 64; ++c) ASSERT_NEAR(x[size_t(c)], t.k[size_t(i) * 64 + c], std::fabs(t.k[size_t(i) * 64 + c]) * 1e-3);
  }
  EXPECT_EQ(cache.pool().refcount(sa.blocks[0]), 1);
  cache.remove_sequence(a);
  cache.remove_sequence(b);
  EXPECT_EQ(cache.pool().used_blocks(), 0);
}

TEST(KvCache, RefusesAppendsThatDoNotFit) {
  // Room for 3 blocks: one 16-token block per (layer, head) of a 1x2 layout, plus one.
  KvCache cache(layout(KvType::f16, KvType::f16, 1, 2, 64), 2, 64, 3 * 4096);
  const int s = cache.add_sequence();
  EXPECT_EQ(cache.blocks_needed(s, 16), 2);
  EXPECT_EQ(cache.blocks_needed(s, 17), 4);
  ErrorCode code{};
  const std::string msg = error_of([&] { cache.check_append(s, 17); }, &code);
  EXPECT_EQ(code, ErrorCode::resource_exhausted);
  EXPECT_NE(msg.find("need 4 blocks, 3 of 3 are free"), std::string::npos) << msg;
  EXPECT_NO_THROW(cache.check_append(s, 16));
  EXPECT_NE(error_of([&] { cache.check_append(s, 65); }, &code).find("exceeds the context of 64"), std::string::npos);
  cache.add_sequence();
  EXPECT_NE(error_of([&] { cache.add_sequence(); }, &code).find("sequence slots"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::resource_exhausted);
}

// ---------------------------------------------------------------- end to end

std::vector<int32_t> prompt_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % 290) + 3;
  return t;
}

ContextOptions options(bool paged, KvType type) {
  ContextOptions o;
  o.n_ctx = 96;
  o.n_threads = 2;
  o.all_logits = true;
  o.f16_kv = type == KvType::f16;
  o.kv.paged = paged;
  o.kv.k_type = o.kv.v_type = type;
  return o;
}

std::vector<float> all_logits(LlamaContext& ctx, int n) {
  const int nv = ctx.model().config().n_vocab;
  std::vector<float> out(size_t(n) * nv);
  for (int i = 0; i < n; ++i) std::memcpy(&out[size_t(i) * nv], ctx.logits(i), size_t(nv) * 4);
  return out;
}

TEST(KvEndToEnd, FullPagedCacheGivesExactlyTheContiguousLogits) {
  for (const char* name : {"llama_f16", "qwen2_q4_k", "llama_mha_f32", "llama_varwidth_f32"})
    for (KvType type : {KvType::f16, KvType::f32})
      for (bool with_policy : {false, true}) {
        auto model = LlamaModel::load(fixture(std::string(name) + ".gguf"));
        const std::vector<int32_t> toks = prompt_tokens(70, 21);
        LlamaContext plain(model, options(false, type));
        ContextOptions po = options(true, type);
        if (with_policy) po.kv.policy = make_full_policy();
        LlamaContext paged(model, po);
        // A 37-token prefill crossing block boundaries, then single tokens.
        plain.eval(std::span<const int32_t>(toks.data(), 37));
        paged.eval(std::span<const int32_t>(toks.data(), 37));
        EXPECT_EQ(all_logits(plain, 37), all_logits(paged, 37)) << name << " " << kv_type_name(type);
        for (size_t i = 37; i < toks.size(); ++i) {
          plain.eval(std::span<const int32_t>(&toks[i], 1));
          paged.eval(std::span<const int32_t>(&toks[i], 1));
          ASSERT_EQ(all_logits(plain, 1), all_logits(paged, 1)) << name << " token " << i;
        }
        EXPECT_EQ(paged.n_past(), 70);
        EXPECT_EQ(paged.evicted_tokens(), 0);
        // Truncation then replay, as the generator does for a shared prompt prefix.
        plain.truncate(20);
        paged.truncate(20);
        plain.eval(std::span<const int32_t>(toks.data() + 20, 9));
        paged.eval(std::span<const int32_t>(toks.data() + 20, 9));
        EXPECT_EQ(all_logits(plain, 9), all_logits(paged, 9)) << name;
      }
}

// Batched passes give each sequence the bits of its own run, whichever thread computes
// which rows and attention items (1 and 3 threads; the work split varies from run to run).
TEST(KvEndToEnd, BatchedSequencesMatchSeparateRuns) {
  for (const char* name : {"llama_q8_0", "llama_f16"}) {
    auto model = LlamaModel::load(fixture(std::string(name) + ".gguf"));
    ContextOptions o = options(true, KvType::f16);
    o.all_logits = false;
    o.kv.max_seqs = 6;
    const int nv = model->config().n_vocab;
    std::vector<std::vector<int32_t>> prompts = {prompt_tokens(21, 1), prompt_tokens(5, 2), prompt_tokens(33, 3),
                                                 prompt_tokens(8, 4), prompt_tokens(2, 5)};
    const int np = int(prompts.size());
    // Reference: each sequence alone, its prompt then two tokens one at a time.
    std::vector<std::vector<float>> ref;
    o.n_threads = 1;
    for (const auto& p : prompts) {
      LlamaContext one(model, o);
      one.eval(p);
      one.eval(std::span<const int32_t>(&p[0], 1));
      one.eval(std::span<const int32_t>(&p[1], 1));
      ref.emplace_back(one.logits(), one.logits() + nv);
    }
    for (int threads : {1, 3}) {
      o.n_threads = threads;
      LlamaContext many(model, o);
      std::vector<int> seqs = {0};
      for (int i = 1; i < np; ++i) seqs.push_back(many.add_sequence());
      std::vector<LlamaContext::SeqTokens> batch;
      for (int i = 0; i < np; ++i) batch.push_back({seqs[size_t(i)], prompts[size_t(i)]});
      many.eval_sequences(batch);  // all prompts in one pass
      for (int step = 0; step < 2; ++step) {
        batch.clear();
        for (int i = 0; i < np; ++i)
          batch.push_back({seqs[size_t(i)], std::span<const int32_t>(&prompts[size_t(i)][size_t(step)], 1)});
        many.eval_sequences(batch);
      }
      for (int i = 0; i < np; ++i)
        EXPECT_EQ(0, std::memcmp(many.sequence_logits(i), ref[size_t(i)].data(), size_t(nv) * 4))
            << name << ", " << threads << " threads, sequence " << i;
      // A fork shares the first prompt's blocks and continues exactly like the original.
      const int f = many.fork_sequence(0, 21);
      EXPECT_GT(many.kv_cache().pool().shared_refs(), 0);
      many.remove_sequence(f);
    }
  }
}

TEST(KvEndToEnd, PoolExhaustionIsAnErrorAndChangesNothing) {
  auto model = LlamaModel::load(fixture("llama_f32.gguf"));
  ContextOptions o = options(true, KvType::f16);
  // 2 layers x 2 KV heads: 4 blocks hold 16 tokens.
  o.kv.pool_bytes = 4 * 4096;
  LlamaContext ctx(model, o);
  const std::vector<int32_t> toks = prompt_tokens(17, 4);
  ErrorCode code{};
  const std::string msg = error_of([&] { ctx.eval(toks); }, &code);
  EXPECT_EQ(code, ErrorCode::resource_exhausted);
  EXPECT_NE(msg.find("KV pool exhausted"), std::string::npos) << msg;
  EXPECT_EQ(ctx.n_past(), 0);
  EXPECT_NO_THROW(ctx.eval(std::span<const int32_t>(toks.data(), 16)));
  EXPECT_EQ(ctx.kv_cache().stats().blocks_free, 0);
}

TEST(KvEndToEnd, QuantizedCachesStayCloseToF32) {
  auto model = LlamaModel::load(fixture("llama_f32.gguf"));
  const std::vector<int32_t> toks = prompt_tokens(60, 8);
  LlamaContext base(model, options(true, KvType::f32));
  base.eval(toks);
  const std::vector<float> ref = all_logits(base, 60);
  float mag = 0;
  for (float x : ref) mag = std::max(mag, std::fabs(x));
  double prev = 0;
  for (KvType type : {KvType::f16, KvType::q8, KvType::q4}) {
    LlamaContext q(model, options(true, type));
    q.eval(toks);
    const std::vector<float> got = all_logits(q, 60);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - ref[i])));
    // Measured: q8 3e-3, q4 4e-2 of the logit scale on this random model.
    // Measured against f32: f16 1.1e-3, q8 2.1e-2, q4 0.26 of the logit scale (this random
    // model's attention is sharp, which magnifies key errors); each format must be worse
    // than the finer one and within about twice its measured error.
    const double bound = type == KvType::f16 ? 3e-3 : type == KvType::q8 ? 4e-2 : 0.5;
    EXPECT_LT(err / mag, bound) << kv_type_name(type);
    EXPECT_GT(err / mag, prev) << kv_type_name(type);
    prev = err / mag;
  }
}

}  // namespace
}  // namespace slim::llm
