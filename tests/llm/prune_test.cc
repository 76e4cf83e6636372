// Structured pruning (llm/prune.h): a pruned file computes what the original computes with
// the removed units' outputs zeroed, per-layer widths round-trip through GGUF, MoE experts
// drop with their router rows, and bad plans and options are clear errors.
#include <gtest/gtest.h>

#include "llm/llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/prune.h"

namespace slim::llm::testing {
namespace {

std::vector<float> logits_of(const std::string& path, const std::vector<int32_t>& tokens) {
  auto model = LlamaModel::load(path);
  ContextOptions o = exact_options();
  o.all_logits = true;
  LlamaContext ctx(model, o);
  ctx.eval(tokens);
  const int nv = model->config().n_vocab;
  std::vector<float> out(tokens.size() * size_t(nv));
  for (size_t i = 0; i < tokens.size(); ++i) std::memcpy(&out[i * nv], ctx.logits(int(i)), size_t(nv) * 4);
  return out;
}

std::vector<int> all(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// The F32 fixture llama_f32 (2 layers, 4 heads in 2 KV groups of 64, FFN 512) with the
// columns of attn_output / ffn_down that feed on removed units set to zero: the reference
// the pruned file must reproduce.
std::string masked(const std::vector<LayerKeep>& keep) {
  auto g = GgufFile::open(fixture("llama_f32.gguf"));
  GgufWriter w;
  for (const auto& k : g->metadata_order()) w.copy_value(k, *g, g->metadata().at(k));
  for (const auto& t : g->tensors()) {
    const float* p = reinterpret_cast<const float*>(g->tensor_data(t));
    std::vector<float> v(p, p + t.elements());
    const int l = t.name.rfind("blk.", 0) == 0 ? t.name[4] - '0' : -1;
    auto zero_cols = [&](const std::vector<int>& kept, int width) {
      for (int64_t c = 0; c < t.dims[0]; ++c)
        if (std::find(kept.begin(), kept.end(), int(c / width)) == kept.end())
          for (int64_t r = 0; r < t.dims[1]; ++r) v[size_t(r * t.dims[0] + c)] = 0;
    };
    if (l >= 0 && t.name.find("attn_output") != std::string::npos) zero_cols(keep[size_t(l)].kv_heads, 2 * 64);
    if (l >= 0 && t.name.find("ffn_down") != std::string::npos) zero_cols(keep[size_t(l)].neurons, 1);
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    w.add_tensor(t.name, t.type(), t.dims, std::vector<uint8_t>(b, b + v.size() * 4));
  }
  const std::string out = tmp_dir() + "/llm_prune_masked.gguf";
  w.write(out);
  return out;
}

TEST(Prune, PrunedModelEqualsMaskedOriginal) {
  std::vector<LayerKeep> keep(2);
  keep[0] = {{1}, {}, {}};
  keep[1] = {{0, 1}, {}, {}};
  for (int j = 0; j < 512; j += 3) keep[0].neurons.push_back(j);  // 171 units: not a multiple of anything
  for (int j = 100; j < 196; ++j) keep[1].neurons.push_back(j);
  const std::string out = tmp_dir() + "/llm_prune_small.gguf";
  write_pruned(*GgufFile::open(fixture("llama_f32.gguf")), keep, out);
  auto m = LlamaModel::load(out);
  EXPECT_EQ(m->layer(0).n_head_kv, 1);
  EXPECT_EQ(m->layer(1).n_head_kv, 2);
  EXPECT_EQ(m->layer(0).n_ff, 171);
  EXPECT_EQ(m->layer(1).n_ff, 96);
  EXPECT_EQ(m->config().n_head, 4);  // the widest layer's
  const int64_t removed = 2 * 128 * 256 + 2 * 64 * 256 + 3 * int64_t(512 - 171 + 512 - 96) * 256;
  EXPECT_EQ(m->n_params(), LlamaModel::load(fixture("llama_f32.gguf"))->n_params() - removed);
  const Reference ref = load_reference("llama_f32");
  const std::vector<float> a = logits_of(out, ref.tokens), b = logits_of(masked(keep), ref.tokens);
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num = std::max(num, double(std::fabs(a[i] - b[i]))), den = std::max(den, double(std::fabs(b[i])));
  EXPECT_LT(num / den, 1e-5);
}

TEST(Prune, PerLayerWidthsRoundTripAsGgufArrays) {
  // The generated variable-width fixture loads with its widths (its logits are checked
  // against NumPy in ForwardTest); pruning it again writes arrays a reader gets back.
  auto g = GgufFile::open(fixture("llama_varwidth_f32.gguf"));
  auto m = LlamaModel::load(fixture("llama_varwidth_f32.gguf"));
  EXPECT_EQ(m->layer(0).n_head_kv, 2);
  EXPECT_EQ(m->layer(2).n_head_kv, 1);
  EXPECT_EQ(m->layer(1).n_ff, 96);
  EXPECT_EQ(m->config().n_ff, 512);
  std::vector<LayerKeep> keep = {{{1}, all(512), {}}, {{0}, all(64), {}}, {{0}, all(32), {}}};
  const std::string out = tmp_dir() + "/llm_prune_roundtrip.gguf";
  write_pruned(*g, keep, out);
  auto p = GgufFile::open(out);
  const GgufValue* heads = p->find("llama.attention.head_count");
  const GgufValue* ff = p->find("llama.feed_forward_length");
  ASSERT_TRUE(heads && ff);
  EXPECT_EQ(heads->type, GgufValueType::u32);  // every layer has one group: a number
  EXPECT_EQ(heads->integer, 2);
  ASSERT_EQ(ff->type, GgufValueType::array);
  EXPECT_EQ(ff->integers, (std::vector<int64_t>{512, 64, 32}));
  auto pm = LlamaModel::load(out);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(pm->layer(l).n_ff, int(keep[size_t(l)].neurons.size()));
}

TEST(Prune, MoeExpertsDropWithTheirRouterRows) {
  auto g = GgufFile::open(fixture("mixtral_f32.gguf"));
  auto m = LlamaModel::load(fixture("mixtral_f32.gguf"));
  std::vector<LayerKeep> keep = {{{0, 1}, {}, {0, 2, 3}}, {{0, 1}, {}, {1, 2, 3}}};
  const std::string out = tmp_dir() + "/llm_prune_moe.gguf";
  write_pruned(*g, keep, out);
  auto p = LlamaModel::load(out);
  EXPECT_EQ(p->config().n_expert, 3);
  EXPECT_EQ(p->config().n_expert_used, 2);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 3; ++e) {
      const int src = keep[size_t(l)].experts[size_t(e)];
      EXPECT_EQ(0, std::memcmp(p->layer(l).router.data + e * p->layer(l).router.row_bytes,
                               m->layer(l).router.data + src * m->layer(l).router.row_bytes,
                               size_t(m->layer(l).router.row_bytes)));
      const WeightMatrix &a = p->layer(l).down_exps[size_t(e)], &b = m->layer(l).down_exps[size_t(src)];
      EXPECT_EQ(0, std::memcmp(a.data, b.data, size_t(a.rows * a.row_bytes)));
    }
  EXPECT_EQ(p->n_params(), m->n_params() - 2 * (3 * 256 * 256 + 256));
  const Reference ref = load_reference("mixtral_f32");
  for (float x : logits_of(out, ref.tokens)) ASSERT_TRUE(std::isfinite(x));
  keep[1].experts = {1, 2};
  EXPECT_THROW(write_pruned(*g, keep, out), Error);  // one expert count for every layer
}

TEST(Prune, BadOptionsAreClearErrors) {
  PruneOptions o;
  o.target_params = 0;
  try {
    prune_model(fixture("llama_f32.gguf"), tmp_dir() + "/llm_prune_bad.gguf", "text", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("--target-params must be in (0, 1]"), std::string::npos) << e.what();
  }
  std::vector<LayerKeep> keep = {{{}, all(512), {}}, {{0}, all(512), {}}};
  EXPECT_THROW(write_pruned(*GgufFile::open(fixture("llama_f32.gguf")), keep, tmp_dir() + "/llm_prune_bad.gguf"), Error);
}

}  // namespace
}  // namespace slim::llm::testing
