// Structured pruning (llm/prune.h): a pruned file computes what the original computes with
// the removed units' outputs zeroed, per-layer widths round-trip through GGUF, the
// least-squares refit restores the output exactly when the kept units span the removed
// ones, deci files (variable width for llama.cpp) compute what their llama source does,
// MoE experts drop with their router rows, and bad plans and options are clear errors.
#include <gtest/gtest.h>

#include <random>

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

// llama_f32 with every removed unit a copy of a kept one: FFN units 256..511 repeat units
// 0..255 (their gate and up rows), and KV group 1 repeats group 0 (query, key and value
// rows), while attn_output and ffn_down keep their own, different columns.
std::string duplicated() {
  auto g = GgufFile::open(fixture("llama_f32.gguf"));
  GgufWriter w;
  for (const auto& k : g->metadata_order()) w.copy_value(k, *g, g->metadata().at(k));
  for (const auto& t : g->tensors()) {
    const float* p = reinterpret_cast<const float*>(g->tensor_data(t));
    std::vector<float> v(p, p + t.elements());
    const int64_t n = t.dims[0], rows = t.rows(), half = rows / 2;
    const bool copy = t.name.find("ffn_gate") != std::string::npos || t.name.find("ffn_up") != std::string::npos ||
                      t.name.find("attn_q") != std::string::npos || t.name.find("attn_k") != std::string::npos ||
                      t.name.find("attn_v") != std::string::npos;
    if (copy) std::copy(v.begin(), v.begin() + half * n, v.begin() + half * n);
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    w.add_tensor(t.name, t.type(), t.dims, std::vector<uint8_t>(b, b + v.size() * 4));
  }
  const std::string out = tmp_dir() + "/llm_prune_duplicated.gguf";
  w.write(out);
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    num = std::max(num, double(std::fabs(a[i] - b[i]))), den = std::max(den, double(std::fabs(b[i])));
  return num / den;
}

TEST(Prune, RefitIsExactWhenKeptUnitsSpanTheRemoved) {
  const std::string src = duplicated();
  auto g = GgufFile::open(src);
  // Calibration: 8 chunks of 64 random tokens (512 > the 256 kept units of each projection).
  std::mt19937 rng(7);
  std::vector<int32_t> calib(512);
  for (int32_t& t : calib) t = int32_t(rng() % 300);
  const CalibrationStats st = calibrate(src, calib, 64, 2);
  EXPECT_EQ(st.tokens, 512);
  ASSERT_EQ(st.ffn_dim, (std::vector<int>{512, 512}));
  ASSERT_EQ(st.attn_dim, (std::vector<int>{256, 256}));
  std::vector<LayerKeep> keep(2);
  for (auto& k : keep) {
    k.kv_heads = {0};
    for (int j = 0; j < 256; ++j) k.neurons.push_back(j);
  }
  const Reference ref = load_reference("llama_f32");  // tokens the refit never saw
  const std::vector<float> orig = logits_of(src, ref.tokens);
  const std::string out = tmp_dir() + "/llm_prune_refit.gguf";
  write_pruned(*g, keep, out);
  const double plain = max_rel_diff(logits_of(out, ref.tokens), orig);
  refit_outputs(*g, st, keep, 1e-10);
  for (const auto& k : keep) {
    EXPECT_EQ(k.ffn_down.size(), size_t(256 * 256));
    EXPECT_EQ(k.attn_output.size(), size_t(256 * 128));
  }
  write_pruned(*g, keep, out);
  const double refit = max_rel_diff(logits_of(out, ref.tokens), orig);
  EXPECT_GT(plain, 0.05);  // without the refit the removed units' outputs are missing
  EXPECT_LT(refit, 1e-4) << "without the refit: " << plain;
  // The refit of a layer that loses nothing is its own columns: no new matrices.
  std::vector<LayerKeep> none = {{{0, 1}, all(512), {}}, {{0, 1}, all(512), {}}};
  refit_outputs(*g, st, none, 1e-3);
  EXPECT_TRUE(none[0].ffn_down.empty() && none[0].attn_output.empty());
}

TEST(Prune, DeciFileComputesWhatItsLlamaSourceDoes) {
  // The variable-width fixture and a pruned llama_f32 written as llama and as deci.
  const Reference ref = load_reference("llama_f32");
  std::vector<LayerKeep> keep = {{{1}, {}, {}}, {{0, 1}, {}, {}}};
  for (int j = 0; j < 512; j += 2) keep[0].neurons.push_back(j);
  for (int j = 0; j < 96; ++j) keep[1].neurons.push_back(j * 5);
  auto g = GgufFile::open(fixture("llama_f32.gguf"));
  const std::string as_llama = tmp_dir() + "/llm_prune_as_llama.gguf", as_deci = tmp_dir() + "/llm_prune_as_deci.gguf";
  write_pruned(*g, keep, as_llama);
  write_pruned(*g, keep, as_deci, "deci");
  auto d = GgufFile::open(as_deci);
  EXPECT_EQ(d->get_string("general.architecture"), "deci");
  EXPECT_FALSE(d->find("llama.block_count"));
  EXPECT_EQ(d->get_int("deci.block_count"), 2);
  EXPECT_EQ(d->get_int("deci.embedding_length"), 256);
  for (const char* key : {"deci.attention.head_count", "deci.attention.head_count_kv", "deci.feed_forward_length"}) {
    const GgufValue* v = d->find(key);
    ASSERT_TRUE(v) << key;
    EXPECT_EQ(v->type, GgufValueType::array) << key;
  }
  EXPECT_EQ(d->find("deci.attention.head_count")->integers, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(d->find("deci.attention.head_count_kv")->integers, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(d->find("deci.feed_forward_length")->integers, (std::vector<int64_t>{256, 96}));
  auto m = LlamaModel::load(as_deci);
  EXPECT_EQ(m->config().arch, "deci");
  EXPECT_EQ(m->layer(0).n_ff, 256);
  EXPECT_EQ(m->layer(1).n_head_kv, 2);
  EXPECT_EQ(max_rel_diff(logits_of(as_deci, ref.tokens), logits_of(as_llama, ref.tokens)), 0.0);
  // A variable-width llama source loads with the same widths and outputs as deci.
  const std::string vw = tmp_dir() + "/llm_prune_varwidth_deci.gguf";
  std::vector<LayerKeep> vkeep = {{{0, 1}, all(512), {}}, {{0}, all(96), {}}, {{0}, all(512), {}}};
  auto vm = LlamaModel::load(fixture("llama_varwidth_f32.gguf"));
  for (int l = 0; l < 3; ++l) vkeep[size_t(l)] = {all(vm->layer(l).n_head_kv), all(vm->layer(l).n_ff), {}};
  write_pruned(*GgufFile::open(fixture("llama_varwidth_f32.gguf")), vkeep, vw, "deci");
  const Reference vref = load_reference("llama_varwidth_f32");
  EXPECT_EQ(max_rel_diff(logits_of(vw, vref.tokens), logits_of(fixture("llama_varwidth_f32.gguf"), vref.tokens)), 0.0);
  // deci is written from dense llama models only.
  EXPECT_THROW(write_pruned(*GgufFile::open(fixture("mixtral_f32.gguf")), {{{0, 1}, {}, {0, 1, 2, 3}}, {{0, 1}, {}, {0, 1, 2, 3}}},
                            as_deci, "deci"),
               Error);
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

void expect_error(const PruneOptions& o, const std::string& text, const std::string& message,
                  const std::string& model = "llama_f32.gguf") {
  try {
    prune_model(model.find('/') == std::string::npos ? fixture(model) : model, tmp_dir() + "/llm_prune_bad.gguf", text, o);
    FAIL() << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(Prune, BadOptionsAreClearErrors) {
  PruneOptions o;
  for (double t : {0.0, -0.5, 1.5, std::nan("")}) {
    o.target_params = t;
    expect_error(o, "text", "--target-params must be in (0, 1]");
  }
  // A budget no plan reaches: every layer keeps a KV group and a block of FFN units. The
  // fixtures' tokens become printable characters (byte-level BPE without merges: one token
  // each), so a text has tokens.
  auto with_chars = [](const std::string& name) {
    return rewrite_fixture(name, name + "_chars", [](GgufWriter& w) {
      std::vector<std::string> toks;
      for (int i = 0; i < 300; ++i) toks.push_back(i >= 3 && i < 97 ? std::string(1, char(30 + i)) : "<tok" + std::to_string(i) + ">");
      w.set_string_array("tokenizer.ggml.tokens", toks);
    });
  };
  const std::string llama = with_chars("llama_f32"), mixtral = with_chars("mixtral_f32");
  std::string text;
  for (int i = 0; i < 400; ++i) text += char(33 + (i * 7) % 94);
  o.target_params = 0.05;
  o.n_ctx = 16;
  o.calib_chunks = 2;
  expect_error(o, text, "is out of reach", llama);
  o.target_params = 0.9;
  expect_error(o, "abc", "fewer than one chunk", llama);
  o.arch = "qwen2";
  expect_error(o, text, "cannot write a llama model as 'qwen2'", llama);
  o.arch = "deci";
  expect_error(o, text, "cannot write a llama MoE model as 'deci'", mixtral);
  o.arch = "";
  o.target_params = 0.01;
  expect_error(o, text, "would leave fewer experts", mixtral);
  o.ridge = -1;
  expect_error(o, text, "ridge", llama);
  std::vector<LayerKeep> keep = {{{}, all(512), {}}, {{0}, all(512), {}}};
  EXPECT_THROW(write_pruned(*GgufFile::open(fixture("llama_f32.gguf")), keep, tmp_dir() + "/llm_prune_bad.gguf"), Error);
}

}  // namespace
}  // namespace slim::llm::testing
