// Mixture-of-Experts models (Mixtral's layout and qwen2moe): the forward pass against the
// NumPy reference of tests/fixtures/make_gguf.py (routing, renormalization, shared expert)
// is in model_test.cc's ForwardTest; here batching and grouping invariance, the routing
// counts and FLOPs of ExpertUsage, and load-time validation of expert metadata and tensors.
#include <gtest/gtest.h>

#include <cstring>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/kernels.h"
#include "slim/llm/model.h"

namespace slim::llm {
namespace {

using namespace testing;

const char* const kMoeModels[] = {"mixtral_f32",   "mixtral_q4_k", "mixtral_q4_0_top1",
                                  "mixtral_mixed", "qwen2moe_f32", "qwen2moe_q8_0"};

TEST(Moe, ConfigFromMetadata) {
  auto m = LlamaModel::load(fixture("qwen2moe_q8_0.gguf"));
  const LlamaConfig& c = m->config();
  EXPECT_EQ(c.arch, "qwen2moe");
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 3);
  EXPECT_EQ(c.n_ff_exp, 256);
  EXPECT_EQ(c.n_ff_shexp, 256);
  EXPECT_FALSE(c.expert_norm);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(m->layer(1).gate_exps.size(), 8u);
  EXPECT_EQ(m->layer(1).shexp_gate.rows, 1);
  // Parameters: 2 layers x 8 experts x 3 matrices of 256 x 256; 3 of 8 are active.
  const int64_t expert = 3 * 256 * 256;
  EXPECT_EQ(m->n_params() - m->n_active_params(), 2 * 5 * expert);

  auto x = LlamaModel::load(fixture("mixtral_f32.gguf"));
  EXPECT_EQ(x->config().arch, "llama");
  EXPECT_EQ(x->config().n_expert, 4);
  EXPECT_EQ(x->config().n_ff_exp, 256);
  EXPECT_EQ(x->config().n_ff_shexp, 0);
  EXPECT_TRUE(x->config().expert_norm);
  EXPECT_EQ(x->layer(0).w_gate.data, nullptr);
}

// Batched prefill groups the tokens by expert; one token at a time reads only its experts.
// A (row, token) pair gets the same bits whatever the group, so both agree exactly.
TEST(Moe, DecodeOneByOneEqualsBatchedPrefillExactly) {
  for (const char* name : kMoeModels) {
    Reference ref = load_reference(name);
    auto model = LlamaModel::load(fixture(std::string(name) + ".gguf"));
    std::vector<float> batched = run_all(name, ref.tokens, exact_options());
    LlamaContext ctx(model, exact_options());
    const int nv = model->config().n_vocab;
    ctx.eval(std::span<const int32_t>(ref.tokens.data(), 3));
    EXPECT_EQ(0, std::memcmp(ctx.logits(), &batched[2 * size_t(nv)], size_t(nv) * 4)) << name;
    for (size_t i = 3; i < ref.tokens.size(); ++i) {
      ctx.eval(std::span<const int32_t>(&ref.tokens[i], 1));
      EXPECT_EQ(0, std::memcmp(ctx.logits(), &batched[i * size_t(nv)], size_t(nv) * 4))
          << name << " token " << i;
    }
  }
}

TEST(Moe, ThreadCountAndLayoutDoNotChangeResults) {
  for (const char* name : {"mixtral_q4_k", "qwen2moe_q8_0"}) {
    Reference ref = load_reference(name);
    ContextOptions one = exact_options(), three = exact_options();
    one.n_threads = 1;
    three.n_threads = 3;
    EXPECT_EQ(run_all(name, ref.tokens, one), run_all(name, ref.tokens, three)) << name;
    // Expert tensors are repacked for the 16-row tiles like 2-D weights; mapped ones are not.
    auto resident = LlamaModel::load(fixture(std::string(name) + ".gguf"));
    auto mapped = LlamaModel::load(fixture(std::string(name) + ".gguf"), true);
    const bool repacks = tile16_fn(kernels(), resident->layer(0).gate_exps[0].type) != nullptr;
    EXPECT_EQ(resident->layer(0).down_exps[3].x16, repacks) << name;
    EXPECT_FALSE(mapped->layer(0).down_exps[3].x16) << name;
    ContextOptions o = exact_options();
    o.all_logits = true;
    LlamaContext a(resident, o), b(mapped, o);
    a.eval(ref.tokens);
    b.eval(ref.tokens);
    const int nv = resident->config().n_vocab;
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.tokens.size(); ++i)
      for (int v = 0; v < nv; ++v) {
        num = std::max(num, double(std::fabs(a.logits(int(i))[v] - b.logits(int(i))[v])));
        den = std::max(den, double(std::fabs(b.logits(int(i))[v])));
      }
    EXPECT_LT(num / den, 1e-2) << name;  // summation order only (see RepackedAndMappedLayoutsAgree)
  }
}

// Routing counts per layer and expert are the reference's; FLOPs follow from them.
TEST(Moe, UsageCountsTokensPerExpert) {
  for (const char* name : kMoeModels) {
    Reference ref = load_reference(name);
    Tensor routed = read_npy(fixture(std::string(name) + ".routed.npy"));
    auto model = LlamaModel::load(fixture(std::string(name) + ".gguf"));
    const LlamaConfig& c = model->config();
    LlamaContext ctx(model, exact_options());
    ctx.eval(std::span<const int32_t>(ref.tokens.data(), 4));
    for (size_t i = 4; i < ref.tokens.size(); ++i)
      ctx.eval(std::span<const int32_t>(&ref.tokens[i], 1));
    const ExpertUsage& u = ctx.expert_usage();
    ASSERT_EQ(u.n_layer, c.n_layer);
    ASSERT_EQ(u.n_expert, c.n_expert);
    EXPECT_EQ(u.tokens, int64_t(ref.tokens.size()));
    for (int l = 0; l < c.n_layer; ++l)
      for (int e = 0; e < c.n_expert; ++e) {
        EXPECT_EQ(u.count(l, e), routed.data<int64_t>()[l * c.n_expert + e])
            << name << " layer " << l << " expert " << e;
        EXPECT_DOUBLE_EQ(u.expert_flops(l, e), double(u.count(l, e)) * 6 * c.n_embd * c.n_ff_exp);
      }
    EXPECT_DOUBLE_EQ(
        u.shared_flops(),
        c.n_ff_shexp ? double(u.tokens) * c.n_layer * (6.0 * c.n_embd * c.n_ff_shexp + 2 * c.n_embd)
                     : 0);
    EXPECT_GT(u.other_flops, 0);
    EXPECT_EQ(ctx.expert_usage_total().routed, u.routed);
    ctx.clear_expert_usage();
    EXPECT_EQ(ctx.expert_usage().tokens, 0);
    EXPECT_EQ(ctx.expert_usage_total().tokens, int64_t(ref.tokens.size()));
  }
  auto dense = LlamaModel::load(fixture("llama_f32.gguf"));
  LlamaContext ctx(dense, exact_options());
  EXPECT_EQ(ctx.expert_usage().n_expert, 0);
}

// Several sequences in one pass: each expert runs once over the rows of all of them, the
// logits are each sequence's alone, and each sequence is charged its own routing.
TEST(Moe, SequencesShareExpertsInOnePass) {
  for (const char* name : {"mixtral_q4_k", "qwen2moe_f32"}) {
    Reference ref = load_reference(name);
    auto model = LlamaModel::load(fixture(std::string(name) + ".gguf"));
    const int nv = model->config().n_vocab;
    ContextOptions o = exact_options();
    o.kv.paged = true;
    o.kv.max_seqs = 2;
    o.kv.k_type = o.kv.v_type = KvType::f32;
    const std::vector<int32_t> a(ref.tokens.begin(), ref.tokens.begin() + 5),
        b(ref.tokens.begin() + 5, ref.tokens.end());
    std::vector<std::vector<float>> alone;
    std::vector<ExpertUsage> alone_usage;
    for (const auto* toks : {&a, &b}) {
      LlamaContext ctx(model, o);
      ctx.eval(*toks);
      alone.emplace_back(ctx.logits(), ctx.logits() + nv);
      alone_usage.push_back(ctx.expert_usage());
    }
    LlamaContext ctx(model, o);
    const int s1 = ctx.add_sequence();
    const LlamaContext::SeqTokens batch[] = {{0, a}, {s1, b}};
    ctx.eval_sequences(batch);
    EXPECT_EQ(0, std::memcmp(ctx.sequence_logits(0), alone[0].data(), size_t(nv) * 4)) << name;
    EXPECT_EQ(0, std::memcmp(ctx.sequence_logits(1), alone[1].data(), size_t(nv) * 4)) << name;
    EXPECT_EQ(ctx.expert_usage(0).routed, alone_usage[0].routed) << name;
    EXPECT_EQ(ctx.expert_usage(s1).routed, alone_usage[1].routed) << name;
    EXPECT_EQ(ctx.expert_usage(s1).tokens, int64_t(b.size()));
    ExpertUsage sum = alone_usage[0];
    sum.add(alone_usage[1]);
    EXPECT_EQ(ctx.expert_usage_total().routed, sum.routed);
  }
}

// bench/vs_llamacpp/make_moe_from_dense.py splits a dense model's feed-forward networks into
// experts; routed to all of them with equal weight, the MoE model computes the dense one
// (its down projections summed in parts: rounding only). The qwen2moe split also moves Q/K
// rows to its rotary layout (a partial one here) and adds a shared expert.
TEST(Moe, SplitDenseModelRoundTrips) {
  struct Split {
    const char* dense;
    const char* args;
  };
  for (const Split& sp :
       {Split{"llama_f32", "--experts 4"}, Split{"llama_rot32_f32", "--arch qwen2moe --experts 4"},
        Split{"llama_f16", "--arch qwen2moe --experts 2 --shared 256"}}) {
    const std::string out = tmp_dir() + "/llm_split_" + sp.dense + ".gguf";
    const std::string cmd =
        "/usr/bin/python3 '" + source_dir() + "/bench/vs_llamacpp/make_moe_from_dense.py' '" +
        fixture(std::string(sp.dense) + ".gguf") + "' '" + out + "' " + sp.args + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    Reference ref = load_reference(sp.dense);
    auto dense = run_all(sp.dense, ref.tokens, exact_options());
    auto moe = LlamaModel::load(out);
    EXPECT_GT(moe->config().n_expert, 1) << sp.dense;
    EXPECT_EQ(moe->config().n_expert_used, moe->config().n_expert) << sp.dense;
    ContextOptions o = exact_options();
    o.all_logits = true;
    LlamaContext ctx(moe, o);
    ctx.eval(ref.tokens);
    const int nv = moe->config().n_vocab;
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.tokens.size(); ++i)
      for (int v = 0; v < nv; ++v) {
        num = std::max(num, double(std::fabs(ctx.logits(int(i))[v] - dense[i * nv + v])));
        den = std::max(den, double(std::fabs(dense[i * nv + v])));
      }
    std::printf("%-16s split (%s): rel. error vs dense %.2e\n", sp.dense, sp.args, num / den);
    // F32: summation order (1e-6); F16: that can round an f16 activation the other way.
    EXPECT_LT(num / den, std::string(sp.dense) == "llama_f16" ? 2e-3 : 1e-5) << sp.dense;
  }
  // Fitted routers (on random tokens here): top 2 of 4 experts.
  const std::string ids = tmp_dir() + "/llm_split_ids.txt",
                    out = tmp_dir() + "/llm_split_top2.gguf";
  {
    std::ofstream f(ids);
    for (int i = 0; i < 256; ++i) f << (i * 37 + 11) % 300 << ' ';
  }
  const std::string cmd = "/usr/bin/python3 '" + source_dir() +
                          "/bench/vs_llamacpp/make_moe_from_dense.py' '" +
                          fixture("llama_f32.gguf") + "' '" + out +
                          "' --experts 4 --used 2 --calibration '" + ids + "' > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto moe = LlamaModel::load(out);
  EXPECT_EQ(moe->config().n_expert_used, 2);
  LlamaContext ctx(moe, exact_options());
  const Reference ref = load_reference("llama_f32");
  ctx.eval(ref.tokens);
  for (int v = 0; v < moe->config().n_vocab; ++v) ASSERT_TRUE(std::isfinite(ctx.logits()[v]));
  EXPECT_EQ(ctx.expert_usage().tokens, int64_t(ref.tokens.size()));
}

void expect_load_error(const std::string& path, ErrorCode code,
                       std::initializer_list<const char*> parts) {
  try {
    LlamaModel::load(path);
    ADD_FAILURE() << path << " loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Moe, BadExpertMetadataIsNamed) {
  expect_load_error(rewrite_fixture("mixtral_f32", "k_over_n",
                                    [](GgufWriter& w) { w.set_u32("llama.expert_used_count", 5); }),
                    ErrorCode::invalid_model, {"'llama.expert_used_count' = 5", "(1..4)"});
  expect_load_error(rewrite_fixture("mixtral_f32", "k_zero",
                                    [](GgufWriter& w) { w.set_u32("llama.expert_used_count", 0); }),
                    ErrorCode::invalid_model, {"'llama.expert_used_count' = 0"});
  expect_load_error(rewrite_fixture("mixtral_f32", "n_huge",
                                    [](GgufWriter& w) { w.set_u32("llama.expert_count", 5000); }),
                    ErrorCode::invalid_model, {"'llama.expert_count' = 5000", "(1..1024)"});
  expect_load_error(rewrite_fixture("mixtral_f32", "n_negative",
                                    [](GgufWriter& w) { w.set_i32("llama.expert_count", -2); }),
                    ErrorCode::invalid_model, {"'llama.expert_count' = -2"});
  expect_load_error(rewrite_fixture("qwen2moe_f32", "qwen_n_zero",
                                    [](GgufWriter& w) { w.set_u32("qwen2moe.expert_count", 0); }),
                    ErrorCode::invalid_model, {"'qwen2moe.expert_count' = 0"});
  expect_load_error(
      rewrite_fixture("qwen2moe_f32", "qwen_ff_zero",
                      [](GgufWriter& w) { w.set_u32("qwen2moe.expert_feed_forward_length", 0); }),
      ErrorCode::invalid_model, {"'qwen2moe.expert_feed_forward_length' = 0"});
  // A different expert width than the tensors have is a shape error naming the tensor.
  expect_load_error(
      rewrite_fixture("qwen2moe_f32", "qwen_ff_other",
                      [](GgufWriter& w) { w.set_u32("qwen2moe.expert_feed_forward_length", 128); }),
      ErrorCode::invalid_model, {"blk.0.ffn_gate_exps.weight", "expected [256, 128, 4]"});
}

TEST(Moe, MissingOrMisshapenExpertTensorsAreNamed) {
  expect_load_error(rewrite_without("mixtral_f32", "blk.1.ffn_up_exps.weight", false),
                    ErrorCode::not_found, {"blk.1.ffn_up_exps.weight"});
  expect_load_error(rewrite_without("mixtral_f32", "blk.0.ffn_gate_inp.weight", false),
                    ErrorCode::not_found, {"blk.0.ffn_gate_inp.weight"});
  expect_load_error(rewrite_without("qwen2moe_f32", "blk.1.ffn_gate_inp_shexp.weight", false),
                    ErrorCode::not_found, {"blk.1.ffn_gate_inp_shexp.weight"});
  expect_load_error(rewrite_without("qwen2moe_f32", "blk.0.ffn_down_shexp.weight", false),
                    ErrorCode::not_found, {"blk.0.ffn_down_shexp.weight"});
  // 256 experts of 4 rows instead of 4 experts of 256 rows.
  expect_load_error(
      rewrite_fixture("mixtral_f32", "down_exps_swapped", {}, "blk.0.ffn_down_exps.weight", {1, 2}),
      ErrorCode::invalid_model,
      {"blk.0.ffn_down_exps.weight", "has shape [256, 4, 256]", "expected [256, 256, 4]"});
  expect_load_error(rewrite_without("mixtral_f32", "blk.0.ffn_gate_inp.weight", true),
                    ErrorCode::invalid_model, {"blk.0.ffn_gate_inp.weight", "expected [256, 4]"});
  // A dense layout declared as MoE: the router is missing.
  expect_load_error(rewrite_fixture("llama_f32", "dense_as_moe",
                                    [](GgufWriter& w) {
                                      w.set_u32("llama.expert_count", 4);
                                      w.set_u32("llama.expert_used_count", 2);
                                    }),
                    ErrorCode::not_found, {"blk.0.ffn_gate_inp.weight"});
}

}  // namespace
}  // namespace slim::llm
