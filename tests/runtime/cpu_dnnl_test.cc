// The cpu provider's oneDNN kernels against ref: Conv (groups, dilation, padding,
// auto_pad, strides, 1-3 spatial dims), ConvTranspose, MatMul/Gemm, pooling, the fused
// ops against their unfused chains, and the partition (claims and decline reasons).
#include <gtest/gtest.h>

#include "runtime/cpu_test_util.h"
#include "slim/runtime/fused_ops.h"
#include "slim/core/cpu_features.h"
#include "slim/runtime/provider.h"

namespace slim {
namespace {

using cpu_test::expect_matches_ref;
using cpu_test::random_f32;
using cpu_test::spec;
using testing::attr_float;
using testing::attr_floats;
using testing::attr_int;
using testing::attr_ints;
using testing::attr_string;
using testing::ModelBuilder;

struct ConvCase {
  Shape x, w;
  int64_t group = 1;
  Shape strides = {}, dilations = {}, pads = {};
  std::string auto_pad = {};
  bool bias = true;
};

void check_conv(const ConvCase& c, uint64_t seed, bool transposed = false) {
  ModelBuilder b;
  b.input("x", DType::f32, spec(c.x)).output("y");
  b.initializer("w", random_f32(c.w, seed + 1));
  std::vector<std::string> ins = {"x", "w"};
  if (c.bias) {
    const int64_t m = transposed ? c.w[1] * c.group : c.w[0];
    b.initializer("b", random_f32({m}, seed + 2));
    ins.push_back("b");
  }
  Node& n = b.node(transposed ? "ConvTranspose" : "Conv", ins, {"y"}, "conv");
  if (c.group != 1) n.attrs["group"] = attr_int(c.group);
  if (!c.strides.empty()) n.attrs["strides"] = attr_ints(c.strides);
  if (!c.dilations.empty()) n.attrs["dilations"] = attr_ints(c.dilations);
  if (!c.pads.empty()) n.attrs["pads"] = attr_ints(c.pads);
  if (!c.auto_pad.empty()) n.attrs["auto_pad"] = attr_string(c.auto_pad);
  expect_matches_ref(b.build(), {{"x", random_f32(c.x, seed)}}, "conv");
}

TEST(CpuDnnl, ConvMatchesRefOnOddShapes) {
  const std::vector<ConvCase> cases = {
      {{1, 3, 7, 9}, {5, 3, 3, 3}},
      {{2, 4, 11, 6}, {6, 2, 3, 2}, 2, {2, 1}, {}, {1, 0, 2, 1}},
      {{1, 8, 9, 9}, {8, 1, 3, 3}, 8, {1, 1}, {2, 2}, {2, 2, 2, 2}},  // depthwise, dilated
      {{1, 6, 10, 10}, {9, 2, 5, 3}, 3, {3, 2}, {1, 2}, {}, "SAME_UPPER"},
      {{1, 5, 8, 7}, {4, 5, 2, 2}, 1, {2, 2}, {}, {}, "SAME_LOWER", false},
      {{3, 2, 6, 5}, {7, 2, 1, 1}, 1, {}, {}, {}, "VALID"},
      {{2, 3, 17}, {4, 3, 4}, 1, {3}, {2}, {1, 2}},             // 1-D (oneDNN: 2-D of height 1)
      {{1, 258, 8}, {258, 1, 5}, 258, {}, {}, {2, 2}},          // 1-D depthwise (Silero v4)
      {{2, 24, 13}, {12, 4, 3}, 6, {2}, {2}, {}, "SAME_LOWER"},  // 1-D grouped
      {{1, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, 1, {1, 2, 1}, {}, {}},  // 3-D
      // 8+ input channels per group: oneDNN's preferred layout with reorders around it.
      {{2, 16, 9, 8}, {24, 16, 3, 3}, 1, {1, 1}, {}, {1, 1, 1, 1}},
      {{1, 32, 7, 7}, {32, 16, 3, 3}, 2, {2, 2}, {}, {}, "SAME_UPPER"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_conv(cases[i], 100 + i);
  }
}

TEST(CpuDnnl, ConvTransposeMatchesRef) {
  const std::vector<ConvCase> cases = {
      {{1, 4, 5, 6}, {4, 3, 3, 3}},
      {{2, 4, 7, 5}, {4, 2, 3, 2}, 2, {2, 2}, {}, {1, 0, 1, 1}},
      {{1, 3, 4, 4}, {3, 5, 2, 3}, 1, {2, 3}, {2, 1}, {}},
      {{1, 2, 9}, {2, 3, 4}, 1, {3}, {}, {1, 1}},
      {{2, 8, 6}, {8, 1, 3}, 8, {2}, {}, {1, 0}},  // 1-D depthwise
      // Kernel = stride: one matrix product and a scatter (a 1-channel map, a batch of 2;
      // a non-square patch without bias).
      {{2, 24, 5, 7}, {24, 1, 2, 2}, 1, {2, 2}},
      {{1, 5, 4, 3}, {5, 6, 3, 2}, 1, {3, 2}, {}, {}, {}, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_conv(cases[i], 200 + i, true);
  }
}

TEST(CpuDnnl, ConvTransposeOutputPaddingAndShape) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({1, 2, 5, 5})).output("y");
  b.initializer("w", random_f32({2, 3, 3, 3}, 7));
  Node& n = b.node("ConvTranspose", {"x", "w"}, {"y"}, "deconv");
  n.attrs["strides"] = attr_ints({2, 2});
  n.attrs["output_shape"] = attr_ints({10, 11});
  expect_matches_ref(b.build(), {{"x", random_f32({1, 2, 5, 5}, 8)}}, "deconv");
}

TEST(CpuDnnl, ConvTakesWeightsFromInputsAndDeclinesOtherDtypes) {
  ModelBuilder b;  // weights fed at run time are packed at each run
  b.input("x", DType::f32, spec({1, 4, 5, 5})).input("w", DType::f32, spec({6, 2, 3, 3})).output("y");
  b.node("Conv", {"x", "w"}, {"y"}, "conv").attrs["group"] = attr_int(2);
  for (uint64_t seed : {1, 2})
    expect_matches_ref(b.build(), {{"x", random_f32({1, 4, 5, 5}, seed)}, {"w", random_f32({6, 2, 3, 3}, seed + 5)}},
                       "conv");

  ModelBuilder d;
  d.input("x", DType::f64, spec({1, 2, 5, 5})).output("y");
  d.initializer("w", Tensor(DType::f64, {3, 2, 3, 3}));
  d.node("Conv", {"x", "w"}, {"y"}, "conv");
  EXPECT_EQ(cpu_test::cpu_decline_reason(d.build(), "conv"), "input 0 is f64, only f32 is implemented");

  ModelBuilder s;  // symbolic batch: the shape is not static until specialized
  s.input("x", DType::f32, std::vector<testing::DimSpec>{"n", 2, 5, 5}).output("y");
  s.initializer("w", random_f32({3, 2, 3, 3}, 3));
  s.node("Conv", {"x", "w"}, {"y"}, "conv");
  EXPECT_EQ(cpu_test::cpu_decline_reason(s.build(), "conv"), "shape of input 0 is dynamic");
}

TEST(CpuDnnl, MatMulBroadcastsBatchAndPromotesVectors) {
  struct Case {
    Shape a, b;
    bool b_const;
  };
  const std::vector<Case> cases = {
      {{5, 7}, {7, 3}, true},         {{2, 5, 7}, {7, 3}, true},     {{2, 1, 5, 7}, {3, 7, 4}, false},
      {{7}, {7, 3}, true},            {{4, 7}, {7}, false},          {{6, 9, 17}, {6, 17, 5}, false},
      {{1, 33, 65}, {65, 31}, true},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Case& c = cases[i];
    ModelBuilder b;
    b.input("a", DType::f32, spec(c.a)).output("y");
    TensorMap in{{"a", random_f32(c.a, 10 + i)}};
    if (c.b_const) {
      b.initializer("b", random_f32(c.b, 20 + i));
    } else {
      b.input("b", DType::f32, spec(c.b));
      in["b"] = random_f32(c.b, 20 + i);
    }
    b.node("MatMul", {"a", "b"}, {"y"}, "mm");
    expect_matches_ref(b.build(), in, "mm");
  }
}

TEST(CpuDnnl, GemmTransposesAlphaBetaAndBroadcastC) {
  struct Case {
    bool ta, tb;
    float alpha, beta;
    Shape c;
    bool c_const;
  };
  const std::vector<Case> cases = {
      {false, false, 1.f, 1.f, {6}, true},     {true, false, 0.5f, 2.f, {5, 6}, true},
      {false, true, 1.f, -1.f, {5, 1}, true},  {true, true, 2.f, 0.25f, {}, true},
      {false, true, 1.f, 1.f, {5, 6}, false},  {false, false, 1.5f, 1.f, {}, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Case& c = cases[i];
    const Shape a = c.ta ? Shape{9, 5} : Shape{5, 9};
    const Shape bs = c.tb ? Shape{6, 9} : Shape{9, 6};
    ModelBuilder b;
    b.input("a", DType::f32, spec(a)).output("y");
    b.initializer("b", random_f32(bs, 30 + i));
    TensorMap in{{"a", random_f32(a, 40 + i)}};
    std::vector<std::string> ins = {"a", "b"};
    if (!c.c.empty()) {
      if (c.c_const) {
        b.initializer("c", random_f32(c.c, 50 + i));
      } else {
        b.input("c", DType::f32, spec(c.c));
        in["c"] = random_f32(c.c, 50 + i);
      }
      ins.push_back("c");
    }
    Node& n = b.node("Gemm", ins, {"y"}, "gemm");
    n.attrs["transA"] = attr_int(c.ta);
    n.attrs["transB"] = attr_int(c.tb);
    n.attrs["alpha"] = attr_float(c.alpha);
    n.attrs["beta"] = attr_float(c.beta);
    expect_matches_ref(b.build(), in, "gemm");
  }
}

TEST(CpuDnnl, PoolingMatchesRef) {
  struct Case {
    std::string op;
    Shape x, k, strides = {}, pads = {}, dilations = {};
    int64_t ceil = 0, include_pad = 0;
    std::string auto_pad = {};
  };
  const std::vector<Case> cases = {
      {"MaxPool", {1, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}},
      {"MaxPool", {2, 2, 10, 7}, {2, 3}, {2, 2}, {}, {}, 1},
      {"MaxPool", {1, 2, 11, 11}, {3, 3}, {1, 1}, {}, {2, 2}},
      {"AveragePool", {1, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}},
      {"AveragePool", {1, 3, 9, 8}, {3, 2}, {2, 1}, {1, 0, 1, 1}, {}, 0, 1},
      {"AveragePool", {2, 2, 10, 7}, {3, 3}, {2, 2}, {}, {}, 1},
      {"MaxPool", {1, 2, 7, 6}, {3, 2}, {2, 2}, {}, {}, 0, 0, "SAME_UPPER"},
      {"AveragePool", {1, 2, 13}, {4}, {3}, {1, 2}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Case& c = cases[i];
    ModelBuilder b(c.dilations.empty() ? 17 : 18);
    b.input("x", DType::f32, spec(c.x)).output("y");
    Node& n = b.node(c.op, {"x"}, {"y"}, "pool");
    n.attrs["kernel_shape"] = attr_ints(c.k);
    if (!c.strides.empty()) n.attrs["strides"] = attr_ints(c.strides);
    if (!c.pads.empty()) n.attrs["pads"] = attr_ints(c.pads);
    if (!c.dilations.empty()) n.attrs["dilations"] = attr_ints(c.dilations);
    if (c.ceil) n.attrs["ceil_mode"] = attr_int(1);
    if (c.include_pad) n.attrs["count_include_pad"] = attr_int(1);
    if (!c.auto_pad.empty()) n.attrs["auto_pad"] = attr_string(c.auto_pad);
    expect_matches_ref(b.build(), {{"x", random_f32(c.x, 60 + i)}}, "pool");
  }
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    ModelBuilder b;
    b.input("x", DType::f32, spec({2, 5, 7, 3})).output("y");
    b.node(op, {"x"}, {"y"}, "pool");
    expect_matches_ref(b.build(), {{"x", random_f32({2, 5, 7, 3}, 70)}}, "pool");
  }
}

TEST(CpuDnnl, MaxPoolWithIndicesFallsBackToRef) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({1, 1, 4, 4})).output("y").output("i");
  b.node("MaxPool", {"x"}, {"y", "i"}, "pool").attrs["kernel_shape"] = attr_ints({2, 2});
  EXPECT_EQ(cpu_test::cpu_decline_reason(b.build(), "pool"), "the Indices output is not implemented");
}

// Runs the cpu kernel of a fused node directly (graph files cannot contain the slim
// domain; passes create these nodes) and compares it with ref running the unfused chain.
Tensor run_cpu_fused(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                     bool expect_claim = true) {
  KernelBuildInfo info{node, kFusedOpset, {}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    NodeInputInfo in;
    in.present = inputs[i].defined();
    if (in.present) {
      in.dtype = inputs[i].dtype();
      in.shape = inputs[i].shape();
      if (constant[i]) in.constant = &inputs[i];
    }
    info.inputs.push_back(in);
  }
  const KernelDef* def = cpu_kernel_registry().find(node.op_type, kFusedDomain, kFusedOpset);
  EXPECT_NE(def, nullptr);
  const Claim claim = def->claim(info);
  EXPECT_EQ(claim.taken, expect_claim) << claim.reason;
  if (!claim.taken) return Tensor();
  auto kernel = build_kernel(*def, info);
  std::vector<const Tensor*> ins;
  for (const auto& t : inputs) ins.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outs(1);
  KernelContext ctx(node, ins, &outs, nullptr, nullptr);
  kernel->compute(ctx);
  return outs[0];
}

Node fused_node(const std::string& op, int num_inputs, const std::string& act, std::vector<float> params) {
  Node n;
  n.name = "fused";
  n.op_type = op;
  n.domain = kFusedDomain;
  for (int i = 0; i < num_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"y"};
  if (!act.empty()) n.attrs["activation"] = attr_string(act);
  if (!params.empty()) n.attrs["activation_params"] = attr_floats(params);
  return n;
}

// Appends the unfused activation after `from`, writing `to`.
void add_activation(ModelBuilder& b, const std::string& act, const std::vector<float>& p,
                    const std::string& from, const std::string& to) {
  if (act.empty()) {
    b.node("Identity", {from}, {to});
  } else if (act == "SiLU") {
    b.node("Sigmoid", {from}, {from + "_sig"});
    b.node("Mul", {from, from + "_sig"}, {to});
  } else if (act == "GeluTanh") {
    b.node("Gelu", {from}, {to}).attrs["approximate"] = attr_string("tanh");
  } else if (act == "Clip") {
    b.initializer("lo", Tensor::scalar<float>(p[0]));
    b.initializer("hi", Tensor::scalar<float>(p[1]));
    b.node("Clip", {from, "lo", "hi"}, {to});
  } else {
    Node& n = b.node(act, {from}, {to});
    if (act == "LeakyRelu") n.attrs["alpha"] = attr_float(p[0]);
  }
}

TensorMap run_ref(const Model& m, const TensorMap& in) {
  SessionOptions o;
  o.providers = {"ref"};
  return Session::compile(m, o)->run(in);
}

struct Act {
  std::string name;
  std::vector<float> params;
};
const std::vector<Act> kActs = {{"", {}},          {"Relu", {}},    {"Clip", {0.f, 0.5f}}, {"Sigmoid", {}},
                                {"HardSwish", {}}, {"SiLU", {}},    {"Gelu", {}},          {"GeluTanh", {}},
                                {"LeakyRelu", {0.1f}}, {"Tanh", {}}};

TEST(CpuDnnl, FusedConvEqualsConvAddActivation) {
  // Few input channels (plain layout) and many (oneDNN's layout, residual reordered in).
  for (int64_t c : {4, 32})
  for (size_t i = 0; i < kActs.size(); ++i) {
    const Shape xs{1, c, 9, 7}, ws{6, c / 2, 3, 3}, ys{1, 6, 5, 3};
    const Act& a = kActs[i];
    SCOPED_TRACE("activation " + a.name + ", channels " + std::to_string(c));
    const bool residual = i % 2 == 0;
    const Tensor x = random_f32(xs, 1 + i, -2, 2), w = random_f32(ws, 2 + i), bias = random_f32({6}, 3 + i);
    const Tensor z = random_f32(ys, 4 + i, -2, 2);
    Node n = fused_node("FusedConv", residual ? 4 : 3, a.name, a.params);
    n.attrs["group"] = attr_int(2);
    n.attrs["strides"] = attr_ints({2, 2});
    n.attrs["pads"] = attr_ints({1, 1, 1, 0});
    std::vector<Tensor> ins = {x, w, bias};
    if (residual) ins.push_back(z);
    const Tensor got = run_cpu_fused(n, ins, {false, true, true, false});

    ModelBuilder b(20);
    b.input("x", DType::f32, spec(xs)).input("z", DType::f32, spec(ys)).output("y");
    b.initializer("w", w).initializer("b", bias);
    Node& c = b.node("Conv", {"x", "w", "b"}, {"c"});
    c.attrs = n.attrs;
    c.attrs.erase("activation");
    c.attrs.erase("activation_params");
    if (residual) b.node("Add", {"c", "z"}, {"s"});
    add_activation(b, a.name, a.params, residual ? "s" : "c", "y");
    const Tensor want = run_ref(b.build(), {{"x", x}, {"z", z}}).at("y");
    EXPECT_LE(cpu_test::worst_error(got, want, 1e-5, 1e-4), 1.0);
  }
}

TEST(CpuDnnl, SignalConvolutionsRunAsFrameMatmulsAndMatchRef) {
  // One input channel, long filters: an STFT written as Conv (Silero's front end), a
  // batch with windows overhanging the padding at both ends, SAME padding, no bias.
  const std::vector<ConvCase> cases = {
      {{1, 1, 640}, {258, 1, 256}, 1, {128}},
      {{3, 1, 1000}, {37, 1, 100}, 1, {45}, {}, {60, 130}},
      {{2, 1, 333}, {5, 1, 64}, 1, {7}, {}, {}, "SAME_UPPER", false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    check_conv(cases[i], 300 + i);
  }
  // With a fused activation and bias, as the fusion pass writes it.
  for (const char* act : {"Relu", "Tanh"}) {
    SCOPED_TRACE(act);
    const Tensor x = random_f32({2, 1, 500}, 7, -2, 2), w = random_f32({16, 1, 96}, 8), bias = random_f32({16}, 9);
    Node n = fused_node("FusedConv", 3, act, {});
    n.attrs["strides"] = attr_ints({32});
    n.attrs["pads"] = attr_ints({48, 48});
    const Tensor got = run_cpu_fused(n, {x, w, bias}, {false, true, true});
    ModelBuilder b(20);
    b.input("x", DType::f32, spec(x.shape())).output("y");
    b.initializer("w", w).initializer("b", bias);
    b.node("Conv", {"x", "w", "b"}, {"c"}).attrs = n.attrs;
    b.model().graph.nodes.back().attrs.erase("activation");
    add_activation(b, act, {}, "c", "y");
    EXPECT_LE(cpu_test::worst_error(got, run_ref(b.build(), {{"x", x}}).at("y"), 1e-5, 1e-4), 1.0);
  }
}

TEST(CpuDnnl, FusedGemmAndFusedMatMulEqualTheirChains) {
  for (size_t i = 0; i < kActs.size(); ++i) {
    const Act& a = kActs[i];
    SCOPED_TRACE("activation " + a.name);
    const Tensor A = random_f32({7, 10}, 11 + i), B = random_f32({12, 10}, 12 + i);
    const Tensor C = random_f32({12}, 13 + i), Z = random_f32({7, 12}, 14 + i);
    Node g = fused_node("FusedGemm", 4, a.name, a.params);
    g.attrs["transB"] = attr_int(1);
    g.attrs["alpha"] = attr_float(0.5f);
    g.attrs["beta"] = attr_float(2.f);
    const Tensor got = run_cpu_fused(g, {A, B, C, Z}, {false, true, true, false});
    ModelBuilder b(20);
    b.input("a", DType::f32, spec({7, 10})).input("z", DType::f32, spec({7, 12})).output("y");
    b.initializer("b", B).initializer("c", C);
    Node& n = b.node("Gemm", {"a", "b", "c"}, {"g"});
    n.attrs["transB"] = attr_int(1);
    n.attrs["alpha"] = attr_float(0.5f);
    n.attrs["beta"] = attr_float(2.f);
    b.node("Add", {"g", "z"}, {"s"});
    add_activation(b, a.name, a.params, "s", "y");
    EXPECT_LE(cpu_test::worst_error(got, run_ref(b.build(), {{"a", A}, {"z", Z}}).at("y"), 1e-5, 1e-4), 1.0);

    const Tensor X = random_f32({2, 3, 5, 10}, 15 + i), W = random_f32({10, 12}, 16 + i);
    const Tensor R = random_f32({2, 3, 5, 12}, 17 + i);
    Node m = fused_node("FusedMatMul", 4, a.name, a.params);
    const Tensor got_mm = run_cpu_fused(m, {X, W, C, R}, {false, true, true, false});
    ModelBuilder mb(20);
    mb.input("x", DType::f32, spec({2, 3, 5, 10})).input("r", DType::f32, spec({2, 3, 5, 12})).output("y");
    mb.initializer("w", W).initializer("c", C);
    mb.node("MatMul", {"x", "w"}, {"p"});
    mb.node("Add", {"p", "c"}, {"q"});
    mb.node("Add", {"q", "r"}, {"s"});
    add_activation(mb, a.name, a.params, "s", "y");
    EXPECT_LE(cpu_test::worst_error(got_mm, run_ref(mb.build(), {{"x", X}, {"r", R}}).at("y"), 1e-5, 1e-4), 1.0);
  }
}

TEST(CpuDnnl, FusedConvOutputScaleShiftAndClampEqualTheChain) {
  const Shape xs{1, 32, 9, 7}, ws{16, 32, 3, 3}, ys{1, 16, 9, 7};
  const Tensor x = random_f32(xs, 60, -2, 2), w = random_f32(ws, 61), bias = random_f32({16}, 62);
  for (const Act& a : {Act{"HardSwish", {}}, Act{"Relu", {}}}) {
    SCOPED_TRACE(a.name);
    Node n = fused_node("FusedConv", 3, a.name, a.params);
    n.attrs["pads"] = attr_ints({1, 1, 1, 1});
    n.attrs["output_scale"] = attr_float(0.625f);
    n.attrs["output_shift"] = attr_float(-1.25f);
    n.attrs["output_min"] = attr_float(-1.f);
    n.attrs["output_max"] = attr_float(2.5f);
    const Tensor got = run_cpu_fused(n, {x, w, bias}, {false, true, true});
    ModelBuilder b(20);
    b.input("x", DType::f32, spec(xs)).output("y");
    b.initializer("w", w).initializer("b", bias);
    b.initializer("scale", Tensor::scalar<float>(0.625f)).initializer("shift", Tensor::scalar<float>(-1.25f));
    b.initializer("lo", Tensor::scalar<float>(-1.f)).initializer("hi", Tensor::scalar<float>(2.5f));
    b.node("Conv", {"x", "w", "b"}, {"c"}).attrs["pads"] = attr_ints({1, 1, 1, 1});
    add_activation(b, a.name, a.params, "c", "act");
    b.node("Mul", {"act", "scale"}, {"m"});
    b.node("Add", {"m", "shift"}, {"s"});
    b.node("Max", {"s", "lo"}, {"t"});
    b.node("Min", {"t", "hi"}, {"y"});
    EXPECT_LE(cpu_test::worst_error(got, run_ref(b.build(), {{"x", x}}).at("y"), 1e-5, 1e-4), 1.0);
  }
}

TEST(CpuDnnl, FusedOpWithUnknownActivationIsDeclined) {
  Node n = fused_node("FusedMatMul", 2, "Swish2", {});
  run_cpu_fused(n, {random_f32({2, 3}, 1), random_f32({3, 4}, 2)}, {false, true}, false);
}

TEST(CpuPartition, ProvidersListRestrictsAndRecordsReasons) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({1, 2, 6, 6})).output("y");
  b.initializer("w", random_f32({4, 2, 3, 3}, 1));
  b.node("Conv", {"x", "w"}, {"c"}, "conv");
  b.node("Cos", {"c"}, {"y"}, "cos");
  SessionOptions o;
  auto s = Session::compile(b.build(), o);  // default providers: cpu, ref
  ASSERT_EQ(s->partition().size(), 2u);
  EXPECT_EQ(s->partition()[0].provider, "cpu");
  EXPECT_TRUE(s->partition()[0].declined.empty());
  EXPECT_EQ(s->partition()[1].provider, "ref");
  ASSERT_EQ(s->partition()[1].declined.size(), 1u);
  EXPECT_EQ(s->partition()[1].declined[0], "cpu: op not implemented");
  EXPECT_EQ(s->node_providers(), (std::vector<std::string>{"cpu", "ref"}));

  o.providers = {"ref"};
  auto r = Session::compile(b.build(), o);
  EXPECT_EQ(r->partition()[0].provider, "ref");

  o.providers = {"cpu"};
  ErrorCode code{};
  const std::string msg = testing::error_of([&] { Session::compile(b.build(), o); }, &code);
  EXPECT_EQ(code, ErrorCode::unsupported);
  EXPECT_NE(msg.find("Cos"), std::string::npos) << msg;
}

TEST(CpuPartition, SymbolicModelRunsOnCpuOnceSpecialized) {
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<testing::DimSpec>{"n", 2, 5, 5}).output("y");
  b.initializer("w", random_f32({3, 2, 3, 3}, 3));
  b.node("Conv", {"x", "w"}, {"y"}, "conv");
  auto s = Session::compile(b.build());
  EXPECT_EQ(s->partition()[0].provider, "ref");
  const Tensor x = random_f32({2, 2, 5, 5}, 4);
  const Tensor first = s->run({{"x", x}}).at("y");
  const Tensor second = s->run({{"x", x}}).at("y");  // now on a specialization with cpu
  EXPECT_EQ(s->num_specializations(), 1);
  EXPECT_LE(cpu_test::worst_error(second, first, 1e-5, 1e-4), 1.0);
}

}  // namespace
}  // namespace slim

namespace slim {
namespace {

// Consecutive convolutions keep oneDNN's layout between them (negotiated at compile time);
// values that are graph outputs or read by ref kernels stay plain. Either way the
// results must equal ref's.
TEST(CpuDnnl, ConvChainsKeepTheirLayoutAndMatchRef) {
  for (bool expose_middle : {false, true}) {
    SCOPED_TRACE(expose_middle ? "middle value is also a graph output" : "chain only");
    ModelBuilder b;
    b.input("x", DType::f32, spec({2, 16, 10, 10})).output("y");
    if (expose_middle) b.output("r1");
    b.initializer("w1", random_f32({32, 16, 3, 3}, 1)).initializer("b1", random_f32({32}, 2));
    b.initializer("w2", random_f32({32, 32, 3, 3}, 3)).initializer("b2", random_f32({32}, 4));
    b.initializer("w3", random_f32({16, 32, 1, 1}, 5));
    b.initializer("w4", random_f32({16, 1, 3, 3}, 6));
    b.node("Conv", {"x", "w1", "b1"}, {"c1"}, "conv1").attrs["pads"] = attr_ints({1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r1"}, "relu1");
    b.node("Conv", {"r1", "w2", "b2"}, {"c2"}, "conv2").attrs["pads"] = attr_ints({1, 1, 1, 1});
    b.node("Add", {"c2", "r1"}, {"s2"}, "add2");
    b.node("Relu", {"s2"}, {"r2"}, "relu2");
    b.node("Conv", {"r2", "w3"}, {"c3"}, "conv3");
    Node& dw = b.node("Conv", {"c3", "w4"}, {"c4"}, "conv4");  // depthwise
    dw.attrs["group"] = attr_int(16);
    dw.attrs["pads"] = attr_ints({1, 1, 1, 1});
    b.node("Sigmoid", {"c4"}, {"y"}, "sig");
    expect_matches_ref(b.build(), {{"x", random_f32({2, 16, 10, 10}, 7)}}, "conv4", "cpu", 1e-5, 1e-4);
  }
}

// 1-D convolutions (described to oneDNN as 2-D of height 1) pass their layout on to one
// another, the residual included (Silero v4's encoder blocks).
TEST(CpuDnnl, OneDimensionalConvChainsMatchRef) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({1, 64, 9})).output("y");
  b.initializer("w1", random_f32({64, 1, 5}, 1)).initializer("b1", random_f32({64}, 2));
  b.initializer("w2", random_f32({32, 64, 1}, 3)).initializer("b2", random_f32({32}, 4));
  b.initializer("w3", random_f32({32, 1, 5}, 5));
  Node& dw = b.node("Conv", {"x", "w1", "b1"}, {"c1"}, "dw1");
  dw.attrs["group"] = attr_int(64);
  dw.attrs["pads"] = attr_ints({2, 2});
  b.node("Relu", {"c1"}, {"r1"});
  b.node("Conv", {"r1", "w2", "b2"}, {"c2"}, "pw");
  b.node("Relu", {"c2"}, {"r2"});
  Node& dw2 = b.node("Conv", {"r2", "w3"}, {"c3"}, "dw2");
  dw2.attrs["group"] = attr_int(32);
  dw2.attrs["pads"] = attr_ints({2, 2});
  b.node("Add", {"c3", "r2"}, {"s"});
  b.node("Relu", {"s"}, {"y"});
  expect_matches_ref(b.build(), {{"x", random_f32({1, 64, 9}, 6)}}, "dw2", "cpu", 1e-5, 1e-4);
}

// Elementwise nodes between convolutions (a Max by a scalar, Abs) read the convolution's
// channels-last or blocked output as it is and pass it on (openWakeWord's embedding
// encoder: Conv, LeakyRelu, Max(x, -0.4), Conv); where their output has a reader that
// takes plain only (Softmax), they reorder their result into it.
TEST(CpuDnnl, ElementwiseNodesPassTheConvolutionsLayoutOn) {
  for (int64_t c : {24, 32}) {
    for (bool plain_reader : {false, true}) {
      SCOPED_TRACE("channels " + std::to_string(c) + (plain_reader ? ", a plain reader too" : ""));
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({2, 8, 9, 7})).output("y");
      if (plain_reader) b.output("s");
      b.initializer("w1", random_f32({c, 8, 3, 1}, 1)).initializer("w2", random_f32({c, c, 1, 3}, 2));
      b.initializer("w3", random_f32({8, c, 1, 1}, 3)).initializer("floor", Tensor::from_vector<float>({1, 1, 1, 1}, {-0.4f}));
      b.initializer("lo", Tensor::scalar<float>(-0.5f)).initializer("hi", Tensor::scalar<float>(0.75f));
      b.node("Conv", {"x", "w1"}, {"c1"}, "conv1").attrs["pads"] = attr_ints({1, 0, 1, 0});
      b.node("Max", {"c1", "floor"}, {"m1"}, "max1");
      b.node("Abs", {"m1"}, {"a1"}, "abs1");
      b.node("Conv", {"a1", "w2"}, {"c2"}, "conv2").attrs["pads"] = attr_ints({0, 1, 0, 1});
      b.node("Clip", {"c2", "lo", "hi"}, {"k2"}, "clip2");
      b.node("Conv", {"k2", "w3"}, {"y"}, "conv3");
      if (plain_reader) b.node("Softmax", {"a1"}, {"s"}, "sm");
      const TensorMap in = {{"x", random_f32({2, 8, 9, 7}, 4)}};
      for (const char* node : {"max1", "abs1", "conv3"}) expect_matches_ref(b.build(), in, node, "cpu", 1e-5, 1e-4);
    }
  }
}

// MobileNetV2's stem: a convolution of 3 input channels (run from plain NCHW, writing
// oneDNN's blocked layout) feeds a depthwise convolution that runs channels-last; the
// stem converts its output once, into the depthwise convolution's layout, instead of to
// plain and back. Either way the result matches ref.
TEST(CpuDnnl, StemWritesTheLayoutItsReaderWantsAndMatchesRef) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({2, 3, 24, 24})).output("y");
  b.initializer("w0", random_f32({32, 3, 3, 3}, 1)).initializer("w1", random_f32({32, 1, 3, 3}, 2));
  b.initializer("w2", random_f32({16, 32, 1, 1}, 3));
  Node& stem = b.node("Conv", {"x", "w0"}, {"c0"}, "stem");
  stem.attrs["strides"] = attr_ints({2, 2});
  stem.attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Clip", {"c0"}, {"r0"}, "relu6");  // no min/max: identity, kept as a node
  Node& dw = b.node("Conv", {"r0", "w1"}, {"c1"}, "depthwise");
  dw.attrs["group"] = attr_int(32);
  dw.attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Conv", {"c1", "w2"}, {"y"}, "project");
  expect_matches_ref(b.build(), {{"x", random_f32({2, 3, 24, 24}, 4)}}, "depthwise", "cpu", 1e-5, 1e-4);
}

// SqueezeNet's fire modules: the convolutions' outputs reach Concat and MaxPool in
// oneDNN's layout (channels-last, or nChw16c), which they copy or pool in place; the
// first pool, run in the stem's nChw16c, writes the channels-last its squeeze convolution
// reads with one reorder; where a value is also a graph output, or a Concat input comes
// from elsewhere, the kernels reorder to plain instead. With a batch of 1 in nChw16c,
// each expand convolution writes straight into its part of the Concat's output, which
// then copies nothing. Every variant matches ref.
TEST(CpuDnnl, FireModulesConcatAndPoolInPrivateLayoutsMatchRef) {
  for (const int64_t n : {1, 2})
  for (const int64_t e : {16, 24}) {
    for (const bool expose : {false, true}) {
      SCOPED_TRACE("batch " + std::to_string(n) + ", expand channels " + std::to_string(e) +
                   (expose ? ", concat also a graph output" : ""));
      ModelBuilder b;
      b.input("x", DType::f32, spec({n, 3, 33, 33})).input("side", DType::f32, spec({n, 8, 4, 4})).output("y");
      if (expose) b.output("cat1");
      b.initializer("w0", random_f32({32, 3, 3, 3}, 1)).initializer("b0", random_f32({32}, 2));
      b.node("Conv", {"x", "w0", "b0"}, {"c0"}, "conv0").attrs["strides"] = attr_ints({2, 2});
      b.node("Relu", {"c0"}, {"r0"}, "relu0");
      Node& mp = b.node("MaxPool", {"r0"}, {"p0"}, "pool0");
      mp.attrs["kernel_shape"] = attr_ints({3, 3});
      mp.attrs["strides"] = attr_ints({2, 2});
      mp.attrs["ceil_mode"] = attr_int(1);
      std::string in = "p0";
      int64_t c = 32;
      for (int f = 1; f <= 2; ++f) {
        const std::string k = std::to_string(f);
        b.initializer("ws" + k, random_f32({16, c, 1, 1}, 10 * f));
        b.initializer("we1" + k, random_f32({e, 16, 1, 1}, 10 * f + 1));
        b.initializer("we3" + k, random_f32({e, 16, 3, 3}, 10 * f + 2));
        b.node("Conv", {in, "ws" + k}, {"s" + k}, "squeeze" + k);
        b.node("Relu", {"s" + k}, {"sr" + k}, "squeeze_relu" + k);
        b.node("Conv", {"sr" + k, "we1" + k}, {"e1" + k}, "expand1_" + k);
        b.node("Conv", {"sr" + k, "we3" + k}, {"e3" + k}, "expand3_" + k).attrs["pads"] = attr_ints({1, 1, 1, 1});
        b.node("Relu", {"e1" + k}, {"er1" + k}, "relu_e1_" + k);
        b.node("Relu", {"e3" + k}, {"er3" + k}, "relu_e3_" + k);
        b.node("Concat", {"er1" + k, "er3" + k}, {"cat" + k}, "concat" + k).attrs["axis"] = attr_int(1);
        in = "cat" + k;
        c = 2 * e;
      }
      Node& mp2 = b.node("MaxPool", {in}, {"p2"}, "pool2");
      mp2.attrs["kernel_shape"] = attr_ints({2, 2});
      mp2.attrs["strides"] = attr_ints({2, 2});
      // A concat of a convolution's output and a graph input: mixed layouts.
      b.initializer("wm", random_f32({8, c, 1, 1}, 40));
      b.node("Conv", {"p2", "wm"}, {"m"}, "conv_mixed");
      b.node("Concat", {"m", "side"}, {"mixed"}, "concat_mixed").attrs["axis"] = attr_int(1);
      b.node("GlobalAveragePool", {"mixed"}, {"y"}, "gap");
      const Model m = b.build();
#if defined(__aarch64__)
      // oneDNN's aarch64 build (Debian's, no Arm Compute Library) sums the 3x3 expand
      // convolutions in another order than its x86 kernels: up to 1.2e-5 from ref's sums.
      constexpr double kAtol = 3e-5;
#else
      constexpr double kAtol = 1e-5;
#endif
      expect_matches_ref(m, {{"x", random_f32({n, 3, 33, 33}, 7)}, {"side", random_f32({n, 8, 4, 4}, 8)}}, "gap",
                         "cpu", kAtol, 1e-4);
      // The cpu kernels of this graph know their output shapes: compile runs none of them
      // on probe inputs; ref's kernels are probed.
      SessionOptions o;
      o.providers = {"cpu", "ref"};
      const auto cpu = Session::compile(m, o);
      EXPECT_EQ(cpu->stats().probed_nodes, 0);
      // Both fire modules' Concats in place with AVX-512's nChw16c; never with two images.
      if (n == 2) {
        EXPECT_EQ(cpu->stats().memory.in_place_values, 0);
      }
      if (n == 1 && e == 16 && !expose && active_isa() == Isa::avx512) {
        EXPECT_EQ(cpu->stats().memory.in_place_values, 4);
      }
      // ref infers its convolutions' shapes too; its elementwise kernels are probed.
      o.providers = {"ref"};
      EXPECT_GT(Session::compile(m, o)->stats().probed_nodes, 0);
    }
  }
}

}  // namespace
}  // namespace slim

namespace slim {
namespace {

// ResNet-style layers: 3x3 convolutions of 16+ channels (and enough output positions) run Winograd's algorithm (in
// nChw16c), and the 1x1 convolutions reading their outputs rebuild themselves in nChw16c
// instead of reordering (their packed weights move to the new primitive's layout). The
// results match ref within rounding with Winograd on and off, and differ from each other
// in the last bits where oneDNN has a Winograd kernel (AVX-512).
TEST(CpuDnnl, WinogradConvolutionsAndTheirBlockedNeighboursMatchRef) {
  ModelBuilder b;
  b.input("x", DType::f32, spec({2, 16, 40, 40})).output("y");
  b.initializer("w0", random_f32({32, 16, 3, 3}, 1, -0.3f, 0.3f)).initializer("b0", random_f32({32}, 2));
  b.initializer("w1", random_f32({32, 32, 1, 1}, 3, -0.3f, 0.3f));
  b.initializer("w2", random_f32({32, 32, 3, 3}, 4, -0.2f, 0.2f)).initializer("b2", random_f32({32}, 5));
  b.initializer("w3", random_f32({48, 32, 1, 1}, 6, -0.3f, 0.3f));
  b.node("Conv", {"x", "w0", "b0"}, {"c0"}, "wino0").attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Relu", {"c0"}, {"r0"}, "relu0");
  b.node("Conv", {"r0", "w1"}, {"c1"}, "pointwise1");
  b.node("Conv", {"c1", "w2", "b2"}, {"c2"}, "wino2").attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Add", {"c2", "c1"}, {"s2"}, "residual2");
  b.node("Relu", {"s2"}, {"r2"}, "relu2");
  b.node("Conv", {"r2", "w3"}, {"y"}, "pointwise3").attrs["strides"] = attr_ints({2, 2});
  const Model m = b.build();
  const TensorMap in = {{"x", random_f32({2, 16, 40, 40}, 7)}};
  expect_matches_ref(m, in, "wino2", "cpu", 1e-5, 1e-4);
  auto run = [&](bool winograd) {
    SessionOptions o;
    o.winograd = winograd;
    return Session::compile(m, o)->run(in).at("y");
  };
  const Tensor wino = run(true), direct = run(false);
  EXPECT_LT(cpu_test::worst_error(wino, direct, 1e-5, 1e-4), 1.0);
  if (active_isa() == Isa::avx512) {
    EXPECT_NE(std::memcmp(wino.raw_data(), direct.raw_data(), wino.nbytes()), 0) << "Winograd did not run";
  }
}

}  // namespace
}  // namespace slim

namespace slim {
namespace {

// MobileNetV2's inverted residual with 24 channels: the projection's residual (24 output
// channels, not a multiple of 16) is a binary-add post-op that reads the block's input
// in place in the channels-last layout the convolutions share, or reordered from plain
// when that input is a graph input. Either way the block matches ref.
TEST(CpuDnnl, InvertedResidualWithOddChannelCountMatchesRef) {
  for (const bool stem : {false, true}) {
    SCOPED_TRACE(stem ? "block input from a convolution" : "block input is the graph input");
    ModelBuilder b;
    b.input("x", DType::f32, spec({2, 24, 14, 14})).output("y");
    b.initializer("w0", random_f32({24, 24, 1, 1}, 1, -0.3f, 0.3f));
    b.initializer("w1", random_f32({144, 24, 1, 1}, 2, -0.3f, 0.3f)).initializer("b1", random_f32({144}, 3));
    b.initializer("w2", random_f32({144, 1, 3, 3}, 4, -0.3f, 0.3f));
    b.initializer("w3", random_f32({24, 144, 1, 1}, 5, -0.2f, 0.2f)).initializer("b3", random_f32({24}, 6));
    std::string in = "x";
    if (stem) {
      b.node("Conv", {"x", "w0"}, {"s"}, "stem");
      in = "s";
    }
    b.node("Conv", {in, "w1", "b1"}, {"e"}, "expand");
    b.node("Relu", {"e"}, {"er"}, "expand_relu");
    Node& dw = b.node("Conv", {"er", "w2"}, {"d"}, "depthwise");
    dw.attrs["group"] = attr_int(144);
    dw.attrs["pads"] = attr_ints({1, 1, 1, 1});
    b.node("Relu", {"d"}, {"dr"}, "depthwise_relu");
    b.node("Conv", {"dr", "w3", "b3"}, {"p"}, "project");
    b.node("Add", {"p", in}, {"y"}, "residual");
    expect_matches_ref(b.build(), {{"x", random_f32({2, 24, 14, 14}, 7)}}, "project", "cpu", 1e-5, 1e-4);
  }
}

}  // namespace
}  // namespace slim
