// Graph optimization passes: each test checks the rewritten graph and that the optimized
// session computes what the unoptimized one does (bit for bit where the fused chain
// rounds exactly like the unfused one, else within a few ulps).
#include "slim/runtime/passes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/test_graphs.h"
#include "slim/core/convert.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/fused_ops.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

Tensor random_f32(const Shape& shape, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

SessionOptions ref_options(bool optimize) {
  SessionOptions o;
  o.providers = {"ref"};
  o.num_threads = 1;
  o.optimize = optimize;
  return o;
}

std::vector<std::string> op_types(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes) ops.push_back((n.domain.empty() ? "" : n.domain + ":") + n.op_type);
  return ops;
}

std::vector<std::string> op_types(const PassGraph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes)
    ops.push_back((n->domain.empty() ? "" : n->domain + ":") + n->op_type);
  return ops;
}

// Runs the model with and without passes; returns the optimized session. max_ulps 0
// demands identical bits.
std::unique_ptr<Session> expect_same_outputs(const Model& model, const TensorMap& inputs,
                                             double rel_tol = 0) {
  auto plain = Session::compile(model, ref_options(false));
  auto opt = Session::compile(model, ref_options(true));
  const TensorMap want = plain->run(inputs);
  const TensorMap got = opt->run(inputs);
  EXPECT_EQ(want.size(), got.size());
  for (const auto& [name, w] : want) {
    const Tensor& g = got.at(name);
    EXPECT_EQ(g.shape(), w.shape()) << name;
    if (g.shape() != w.shape()) continue;
    const auto a = values_of(w), b = values_of(g);
    int bad = 0;
    for (size_t i = 0; i < a.size() && bad < 5; ++i) {
      const double tol = rel_tol * std::max(1.0, std::fabs(a[i]));
      if (rel_tol == 0 ? a[i] != b[i] : std::fabs(a[i] - b[i]) > tol) {
        ADD_FAILURE() << name << "[" << i << "]: unoptimized " << a[i] << ", optimized " << b[i];
        ++bad;
      }
    }
  }
  return opt;
}

const Node& only_node(const Session& s) {
  EXPECT_EQ(s.compiled_graph().nodes.size(), 1u)
      << ::testing::PrintToString(op_types(s.compiled_graph()));
  return s.compiled_graph().nodes.at(0);
}

// X [2,3,6,6] -> Conv(W [4,3,3,3], B [4], pads 1) -> y
ModelBuilder conv_model(bool with_bias = true) {
  ModelBuilder b(17);
  b.input("x", DType::f32, {{2, 3, 6, 6}});
  b.initializer("w", random_f32({4, 3, 3, 3}, 1, -0.5f, 0.5f));
  if (with_bias) b.initializer("b", random_f32({4}, 2));
  Node& conv = b.node(
      "Conv",
      with_bias ? std::vector<std::string>{"x", "w", "b"} : std::vector<std::string>{"x", "w"},
      {"c"}, "conv");
  conv.attrs["pads"] = attr_ints({1, 1, 1, 1});
  return b;
}

void add_batch_norm(ModelBuilder& b, const std::string& in, const std::string& out, int64_t c) {
  b.initializer("bn_scale", random_f32({c}, 11, 0.5f, 1.5f));
  b.initializer("bn_bias", random_f32({c}, 12));
  b.initializer("bn_mean", random_f32({c}, 13));
  b.initializer("bn_var", random_f32({c}, 14, 0.1f, 2.f));
  b.node("BatchNormalization", {in, "bn_scale", "bn_bias", "bn_mean", "bn_var"}, {out}, "bn")
      .attrs["epsilon"] = attr_float(1e-3f);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// fold_batch_norm

TEST(Passes, FoldBatchNormIntoConvWeights) {
  ModelBuilder b = conv_model();
  add_batch_norm(b, "c", "y", 4);
  b.output("y");
  b.initializer("w/bn_folded", f32({1}, {0}));  // the name the pass would pick first
  PassGraph g = pass_graph_from_model(b.build());
  EXPECT_EQ(fold_batch_norm(g), 1);
  ASSERT_EQ(op_types(g), std::vector<std::string>{"Conv"});
  const Node& conv = *g.nodes[0];
  EXPECT_EQ(conv.outputs, std::vector<std::string>{"y"});
  EXPECT_EQ(conv.inputs[1], "w/bn_folded_1");
  EXPECT_EQ(conv.inputs[2], "b/bn_folded");
  // W'[m] = W[m] * scale / sqrt(var + eps), B' = (B - mean) * s + bias, rounded once.
  const Model m = b.build();
  auto vec = [&](const char* n) { return values_of(m.graph.initializers.at(n)); };
  const auto w = vec("w"), bias = vec("b"), sc = vec("bn_scale"), bb = vec("bn_bias"),
             mean = vec("bn_mean"), var = vec("bn_var");
  const auto w2 = values_of(g.constants.at(conv.inputs[1]));
  const auto b2 = values_of(g.constants.at(conv.inputs[2]));
  for (int o = 0; o < 4; ++o) {
    const double s = sc[size_t(o)] / std::sqrt(var[size_t(o)] + double(1e-3f));
    for (int k = 0; k < 27; ++k)
      EXPECT_EQ(w2[size_t(o * 27 + k)], double(float(w[size_t(o * 27 + k)] * s)));
    EXPECT_EQ(b2[size_t(o)],
              double(float(s * bias[size_t(o)] + bb[size_t(o)] - s * mean[size_t(o)])));
  }
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 3)}}, 1e-5);
  EXPECT_EQ(only_node(*s).op_type, "Conv");
}

TEST(Passes, FoldBatchNormIntoGemm) {
  for (int trans_b = 0; trans_b < 2; ++trans_b) {
    ModelBuilder b(17);
    b.input("x", DType::f32, {{3, 5}});
    b.initializer("w", random_f32(trans_b ? Shape{4, 5} : Shape{5, 4}, 4));
    b.initializer("cb", random_f32({4}, 5));
    Node& gemm = b.node("Gemm", {"x", "w", "cb"}, {"c"}, "gemm");
    gemm.attrs["transB"] = attr_int(trans_b);
    gemm.attrs["beta"] = attr_float(0.5f);
    gemm.attrs["alpha"] = attr_float(1.5f);
    add_batch_norm(b, "c", "y", 4);
    b.output("y");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({3, 5}, 6)}}, 1e-5);
    EXPECT_EQ(only_node(*s).op_type, "Gemm");
    EXPECT_EQ(only_node(*s).attr_float("beta", 0), 1.0f);
  }
}

TEST(Passes, BatchNormStaysWhenConvOutputIsNeededElsewhere) {
  {
    ModelBuilder b = conv_model();
    add_batch_norm(b, "c", "y", 4);
    b.output("y").output("c");  // the Conv output itself is a graph output
    PassGraph g = pass_graph_from_model(b.build());
    EXPECT_EQ(fold_batch_norm(g), 0);
  }
  {
    ModelBuilder b = conv_model();
    add_batch_norm(b, "c", "y", 4);
    b.node("Relu", {"c"}, {"r"});  // a second reader
    b.output("y").output("r");
    PassGraph g = pass_graph_from_model(b.build());
    EXPECT_EQ(fold_batch_norm(g), 0);
  }
  {
    // Training mode computes batch statistics: not an affine map of constants.
    ModelBuilder b = conv_model();
    add_batch_norm(b, "c", "y", 4);
    b.model().graph.nodes.back().attrs["training_mode"] = attr_int(1);
    b.output("y");
    PassGraph g = pass_graph_from_model(b.build());
    EXPECT_EQ(fold_batch_norm(g), 0);
  }
}

TEST(Passes, FoldConstantMulIntoConvAndGemm) {
  // Per-channel [4,1,1] (written first, as Paddle does) and scalar scales fold into Conv.
  for (const Shape& cs : std::vector<Shape>{{4, 1, 1}, {1}, {}}) {
    SCOPED_TRACE(shape_str(cs));
    ModelBuilder b = conv_model();
    b.initializer("scale", random_f32(cs, 40, 0.5f, 2.f));
    b.node("Mul", {"scale", "c"}, {"y"});
    b.output("y");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 41)}}, 1e-5);
    EXPECT_EQ(only_node(*s).op_type, "Conv");
  }
  {
    ModelBuilder b = conv_model();  // [4] broadcasts along the width, not the channels
    b.initializer("scale", random_f32({4}, 42));
    b.node("Mul", {"c", "scale"}, {"y"});
    b.output("y");
    PassGraph g = pass_graph_from_model(b.build());
    EXPECT_EQ(fold_batch_norm(g), 0);
  }
  ModelBuilder b(17);
  b.input("x", DType::f32, {{3, 5}});
  b.initializer("w", random_f32({5, 4}, 43)).initializer("c", random_f32({4}, 44));
  b.initializer("scale", random_f32({1, 4}, 45));
  b.node("Gemm", {"x", "w", "c"}, {"g"});
  b.node("Mul", {"g", "scale"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({3, 5}, 46)}}, 1e-5);
  EXPECT_EQ(only_node(*s).op_type, "Gemm");
}

TEST(Passes, FoldBiasAddAndBatchNormIntoConvTranspose) {
  // The detector head's ConvTranspose -> Add(bias) -> BatchNormalization, grouped here.
  ModelBuilder b(17);
  b.input("x", DType::f32, {{1, 4, 5, 6}});
  b.initializer("w", random_f32({4, 3, 2, 2}, 60, -0.5f, 0.5f));
  b.initializer("bias", random_f32({1, 6, 1, 1}, 61));
  Node& ct = b.node("ConvTranspose", {"x", "w"}, {"ct"}, "ct");
  ct.attrs["strides"] = attr_ints({2, 2});
  ct.attrs["group"] = attr_int(2);
  b.node("Add", {"ct", "bias"}, {"c"});
  add_batch_norm(b, "c", "y", 6);
  b.output("y");
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({1, 4, 5, 6}, 62)}}, 1e-5);
  EXPECT_EQ(only_node(*s).op_type, "ConvTranspose");
  EXPECT_EQ(only_node(*s).inputs.size(), 3u);
}

// ---------------------------------------------------------------------------------------
// fuse_bias_activation

TEST(Passes, ConvBiasAddAndReluBecomeOneFusedConv) {
  ModelBuilder b = conv_model(/*with_bias=*/false);
  b.initializer("bias", random_f32({1, 4, 1, 1}, 7));
  b.node("Add", {"bias", "c"}, {"a"});
  b.node("Relu", {"a"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 8)}}, 1e-6);
  const Node& n = only_node(*s);
  EXPECT_EQ(n.domain, kFusedDomain);
  EXPECT_EQ(n.op_type, "FusedConv");
  EXPECT_EQ(n.attr_string("activation", ""), "Relu");
  ASSERT_EQ(n.inputs.size(), 3u);
  EXPECT_EQ(s->compiled_graph().initializers.at(n.inputs[2]).shape(), Shape{4});
  EXPECT_EQ(n.attr_ints("pads"), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(s->model().opset(kFusedDomain), kFusedOpset);
  EXPECT_GT(s->stats().pass_rewrites, 0);
}

TEST(Passes, ConvBatchNormResidualReluAsInResNet) {
  ModelBuilder b = conv_model();
  add_batch_norm(b, "c", "n", 4);
  b.input("skip", DType::f32, {{2, 4, 6, 6}});
  b.node("Add", {"n", "skip"}, {"a"});
  b.node("Relu", {"a"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(
      b.build(), {{"x", random_f32({2, 3, 6, 6}, 9)}, {"skip", random_f32({2, 4, 6, 6}, 10)}},
      1e-5);
  const Node& n = only_node(*s);
  EXPECT_EQ(n.op_type, "FusedConv");
  ASSERT_EQ(n.inputs.size(), 4u);
  EXPECT_EQ(n.inputs[3], "skip");
  EXPECT_EQ(n.attr_string("activation", ""), "Relu");
}

TEST(Passes, ResidualThatBroadcastsIsNotFused) {
  ModelBuilder b = conv_model();
  b.input("z", DType::f32, {{1, 4, 1, 1}});  // broadcasts: not Y's shape
  b.node("Add", {"c", "z"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(
      b.build(), {{"x", random_f32({2, 3, 6, 6}, 15)}, {"z", random_f32({1, 4, 1, 1}, 16)}});
  EXPECT_EQ(op_types(s->compiled_graph()), (std::vector<std::string>{"Conv", "Add"}));
}

TEST(Passes, NeverFusesAnIntermediateThatIsAGraphOutputOrHasOtherReaders) {
  {
    ModelBuilder b = conv_model();
    b.node("Relu", {"c"}, {"y"});
    b.output("y").output("c");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 17)}});
    EXPECT_EQ(op_types(s->compiled_graph()), (std::vector<std::string>{"Conv", "Relu"}));
  }
  {
    ModelBuilder b = conv_model();
    b.node("Relu", {"c"}, {"y"});
    b.node("Sigmoid", {"c"}, {"z"});
    b.output("y").output("z");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 18)}});
    EXPECT_EQ(s->compiled_graph().nodes.size(), 3u);
    EXPECT_EQ(s->stats().pass_rewrites, 0);
  }
  {
    // SiLU's Sigmoid output is also a graph output: the pattern is not private.
    ModelBuilder b = conv_model();
    b.node("Sigmoid", {"c"}, {"sg"});
    b.node("Mul", {"c", "sg"}, {"y"});
    b.output("y").output("sg");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 19)}});
    EXPECT_EQ(s->compiled_graph().nodes.size(), 3u);
  }
}

namespace {

// MatMul(x [2,5,8], w [8,6]) + bias [6], then the activation `add_act` appends from "a"
// to "y". FusedMatMul rounds like the chain, so outputs are bit-identical unless the
// pattern is torch's erf GELU (which the fused op computes as one exact Gelu).
struct ActivationCase {
  const char* name;
  const char* expected;  // activation attribute
  std::function<void(ModelBuilder&)> add_act;
  double rel_tol = 0;
  int64_t opset = 17;
};

std::vector<ActivationCase> activation_cases() {
  auto unary = [](const char* op) { return [op](ModelBuilder& b) { b.node(op, {"a"}, {"y"}); }; };
  std::vector<ActivationCase> cases = {
      {"Relu", "Relu", unary("Relu")},
      {"Sigmoid", "Sigmoid", unary("Sigmoid")},
      {"Tanh", "Tanh", unary("Tanh")},
      {"HardSwish", "HardSwish", unary("HardSwish")},
      {"LeakyRelu", "LeakyRelu",
       [](ModelBuilder& b) {
         b.node("LeakyRelu", {"a"}, {"y"}).attrs["alpha"] = attr_float(0.1f);
       }},
      {"Clip", "Clip",
       [](ModelBuilder& b) {
         b.initializer("lo", Tensor::scalar<float>(0.f))
             .initializer("hi", Tensor::scalar<float>(6.f));
         b.node("Clip", {"a", "lo", "hi"}, {"y"});
       }},
      {"ClipMinOnly", "Clip",
       [](ModelBuilder& b) {
         b.initializer("lo", Tensor::scalar<float>(-0.5f));
         b.node("Clip", {"a", "lo"}, {"y"});
       }},
      {"SiLU", "SiLU",
       [](ModelBuilder& b) {
         b.node("Sigmoid", {"a"}, {"s"});
         b.node("Mul", {"s", "a"}, {"y"});
       }},
      {"GeluOp", "Gelu", unary("Gelu"), 0, 20},
      {"GeluTanhOp", "GeluTanh",
       [](ModelBuilder& b) {
         b.node("Gelu", {"a"}, {"y"}).attrs["approximate"] = attr_string("tanh");
       },
       0, 20},
      {"TorchErfGelu", "Gelu",
       [](ModelBuilder& b) {
         b.initializer("sqrt2", Tensor::scalar<float>(1.4142135f));
         b.initializer("one", Tensor::scalar<float>(1.f));
         b.initializer("half", Tensor::scalar<float>(0.5f));
         b.node("Div", {"a", "sqrt2"}, {"d"});
         b.node("Erf", {"d"}, {"e"});
         b.node("Add", {"e", "one"}, {"p"});
         b.node("Mul", {"a", "p"}, {"m"});
         b.node("Mul", {"m", "half"}, {"y"});
       },
       1e-6},
      {"ErfGeluHalfFirst", "Gelu",
       [](ModelBuilder& b) {
         b.initializer("rsqrt2", Tensor::scalar<float>(0.70710677f));
         b.initializer("one", Tensor::scalar<float>(1.f));
         b.initializer("half", Tensor::scalar<float>(0.5f));
         b.node("Mul", {"rsqrt2", "a"}, {"d"});
         b.node("Erf", {"d"}, {"e"});
         b.node("Add", {"one", "e"}, {"p"});
         b.node("Mul", {"a", "half"}, {"h"});
         b.node("Mul", {"h", "p"}, {"y"});
       },
       1e-6},
      {"ErfGeluHalfOfSum", "Gelu",
       [](ModelBuilder& b) {
         b.initializer("sqrt2", Tensor::scalar<float>(1.4142135f));
         b.initializer("one", Tensor::scalar<float>(1.f));
         b.initializer("half", Tensor::scalar<float>(0.5f));
         b.node("Div", {"a", "sqrt2"}, {"d"});
         b.node("Erf", {"d"}, {"e"});
         b.node("Add", {"e", "one"}, {"p"});
         b.node("Mul", {"p", "half"}, {"h"});
         b.node("Mul", {"a", "h"}, {"y"});
       },
       1e-6},
  };
  return cases;
}

}  // namespace

TEST(Passes, MatMulBiasActivationFusesEveryActivation) {
  for (const auto& c : activation_cases()) {
    SCOPED_TRACE(c.name);
    ModelBuilder b(c.opset);
    b.input("x", DType::f32, {{2, 5, 8}});
    b.initializer("w", random_f32({8, 6}, 20));
    b.initializer("bias", random_f32({6}, 21));
    b.node("MatMul", {"x", "w"}, {"mm"});
    b.node("Add", {"mm", "bias"}, {"a"});
    c.add_act(b);
    b.output("y");
    auto s =
        expect_same_outputs(b.build(), {{"x", random_f32({2, 5, 8}, 22, -4.f, 4.f)}}, c.rel_tol);
    const Node& n = only_node(*s);
    EXPECT_EQ(n.op_type, "FusedMatMul");
    EXPECT_EQ(n.attr_string("activation", ""), c.expected);
    EXPECT_EQ(n.inputs.size(), 3u);
  }
}

namespace {

// Conv, then x * Clip(x + 3, 0, 6) / 6 written out as the opset-11 exports do.
void add_hard_swish(ModelBuilder& b, const std::string& in, const std::string& out, bool by_sixth = false) {
  b.initializer("three", Tensor::scalar<float>(3.f)).initializer("zero", Tensor::scalar<float>(0.f));
  b.initializer("six", Tensor::scalar<float>(6.f)).initializer("sixth", Tensor::scalar<float>(1.f / 6));
  b.node("Add", {in, "three"}, {in + "_p3"});
  b.node("Clip", {in + "_p3", "zero", "six"}, {in + "_clip"});
  b.node("Mul", {in + "_clip", in}, {in + "_m"});
  b.node(by_sixth ? "Mul" : "Div", {in + "_m", by_sixth ? "sixth" : "six"}, {out});
}

}  // namespace

TEST(Passes, HardSwishWrittenOutFusesIntoConv) {
  for (bool by_sixth : {false, true}) {
    ModelBuilder b = conv_model();
    b.model().opsets[""] = 11;
    add_hard_swish(b, "c", "y", by_sixth);
    b.output("y");
    auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 50, -4, 4)}}, 1e-6);
    const Node& n = only_node(*s);
    EXPECT_EQ(n.op_type, "FusedConv");
    EXPECT_EQ(n.attr_string("activation", ""), "HardSwish");
  }
  // Other constants are not HardSwish.
  ModelBuilder b = conv_model();
  b.model().opsets[""] = 11;
  add_hard_swish(b, "c", "y");
  b.model().graph.initializers["six"] = Tensor::scalar<float>(5.f);
  b.output("y");
  PassGraph g = pass_graph_from_model(b.build());
  fuse_bias_activation(g);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Conv", "Add", "Clip", "Mul", "Div"}));
}

TEST(Passes, ScalarMulAndAddAfterTheActivationFuse) {
  // PaddleOCR's learnable affine blocks around a written-out HardSwish: one FusedConv.
  ModelBuilder b = conv_model();
  b.model().opsets[""] = 11;
  b.initializer("s1", f32({1}, {0.75f})).initializer("b1", f32({1}, {0.25f}));
  b.initializer("s2", f32({1}, {1.5f})).initializer("b2", f32({1}, {-0.5f}));
  b.node("Mul", {"s1", "c"}, {"m1"});
  b.node("Add", {"m1", "b1"}, {"a1"});
  add_hard_swish(b, "a1", "h");
  b.node("Mul", {"s2", "h"}, {"m2"});
  b.node("Add", {"m2", "b2"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 6, 6}, 51, -4, 4)}}, 1e-6);
  const Node& n = only_node(*s);
  EXPECT_EQ(n.attr_string("activation", ""), "HardSwish");
  EXPECT_EQ(n.attr_float("output_scale", 0), 1.5f);
  EXPECT_EQ(n.attr_float("output_shift", 0), -0.5f);
  // The affine follows an activation only; an Add then a Mul keeps the Mul (the scale
  // would have to apply to the shift too).
  ModelBuilder r = conv_model();
  r.initializer("d", Tensor::scalar<float>(0.5f)).initializer("e", Tensor::scalar<float>(3.f));
  r.node("Relu", {"c"}, {"relu"});
  r.node("Add", {"relu", "d"}, {"a"});
  r.node("Mul", {"a", "e"}, {"y"});
  r.output("y");
  auto sr = expect_same_outputs(r.build(), {{"x", random_f32({2, 3, 6, 6}, 52)}});
  EXPECT_EQ(op_types(sr->compiled_graph()), (std::vector<std::string>{"slim:FusedConv", "Mul"}));
  EXPECT_EQ(sr->compiled_graph().nodes[0].attr_float("output_shift", 0), 0.5f);
  // TensorFlow's LeakyRelu then tf.maximum(x, -0.4) (and a Min after it): the clamp.
  ModelBuilder t = conv_model();
  t.initializer("floor", f32({1, 1, 1, 1}, {-0.4f})).initializer("ceil", Tensor::scalar<float>(1.5f));
  t.node("LeakyRelu", {"c"}, {"l"}).attrs["alpha"] = attr_float(0.2f);
  t.node("Max", {"floor", "l"}, {"m"});
  t.node("Min", {"m", "ceil"}, {"y"});
  t.output("y");
  auto st = expect_same_outputs(t.build(), {{"x", random_f32({2, 3, 6, 6}, 53, -4, 4)}});
  const Node& tn = only_node(*st);
  EXPECT_EQ(tn.attr_float("output_min", 0), -0.4f);
  EXPECT_EQ(tn.attr_float("output_max", 0), 1.5f);
}

TEST(Passes, MatMulResidualFusesAfterShapesAreKnown) {
  // BERT's attention output: MatMul + bias + residual, no activation.
  ModelBuilder b(17);
  b.input("x", DType::f32, {{2, 5, 8}});
  b.input("res", DType::f32, {{2, 5, 6}});
  b.initializer("w", random_f32({8, 6}, 23));
  b.initializer("bias", random_f32({6}, 24));
  b.node("MatMul", {"x", "w"}, {"mm"});
  b.node("Add", {"mm", "bias"}, {"a"});
  b.node("Add", {"res", "a"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(
      b.build(), {{"x", random_f32({2, 5, 8}, 25)}, {"res", random_f32({2, 5, 6}, 26)}});
  const Node& n = only_node(*s);
  EXPECT_EQ(n.op_type, "FusedMatMul");
  ASSERT_EQ(n.inputs.size(), 4u);
  EXPECT_EQ(n.inputs[3], "res");
  EXPECT_EQ(n.attr_string("activation", ""), "");
}

TEST(Passes, GemmWithActivation) {
  ModelBuilder b(17);
  b.input("x", DType::f32, {{3, 5}});
  b.initializer("w", random_f32({4, 5}, 27));
  b.initializer("c", random_f32({4}, 28));
  Node& gemm = b.node("Gemm", {"x", "w", "c"}, {"g"});
  gemm.attrs["transB"] = attr_int(1);
  b.node("Sigmoid", {"g"}, {"y"});
  b.output("y");
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({3, 5}, 29)}});
  EXPECT_EQ(only_node(*s).op_type, "FusedGemm");
  EXPECT_EQ(only_node(*s).attr_int("transB", 0), 1);
}

TEST(Passes, NoFusionWhenTheProviderOfTheBaseOpLacksTheFusedOp) {
  ModelBuilder b = conv_model();
  b.node("Relu", {"c"}, {"y"});
  b.output("y");
  PassGraph g = pass_graph_from_model(b.build());
  g.can_fuse = [](const std::string&, const std::string&) { return false; };
  EXPECT_EQ(fuse_bias_activation(g), 0);
  g.can_fuse = nullptr;
  EXPECT_EQ(fuse_bias_activation(g), 1);
  EXPECT_EQ(op_types(g), std::vector<std::string>{"slim:FusedConv"});
  EXPECT_EQ(g.opsets.at(kFusedDomain), kFusedOpset);
}

TEST(Passes, CompiledGraphWithFusedNodesCompilesAgain) {
  // The slim domain is internal: a model built in memory may carry it (with its opset
  // import), and compiling the compiled graph gives the same outputs.
  ModelBuilder b = conv_model();
  add_batch_norm(b, "c", "n", 4);
  b.node("HardSwish", {"n"}, {"y"});
  b.output("y");
  const TensorMap in = {{"x", random_f32({2, 3, 6, 6}, 30)}};
  auto s = Session::compile(b.build(), ref_options(true));
  ASSERT_EQ(only_node(*s).op_type, "FusedConv");
  Model again = s->model();
  again.graph = s->compiled_graph();
  auto s2 = Session::compile(again, ref_options(false));
  EXPECT_EQ(values_of(s2->run(in).at("y")), values_of(s->run(in).at("y")));
}

namespace {

// Protobuf wire format, enough to hand-write a tiny ModelProto.
std::string varint(uint64_t v) {
  std::string out;
  do {
    out += char((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return out;
}
std::string field(int number, const std::string& bytes) {
  return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes;
}
std::string field_int(int number, uint64_t v) {
  return varint(uint64_t(number) << 3) + varint(v);
}

}  // namespace

TEST(Passes, ImporterRefusesTheInternalDomainFromFiles) {
  // y = slim:FusedMatMul(x, x) with an opset import for "slim": still refused, because
  // only passes may create these nodes.
  const std::string node = field(1, "x") + field(1, "x") + field(2, "y") + field(3, "fm") +
                           field(4, "FusedMatMul") + field(7, "slim");
  const std::string graph =
      field(1, node) + field(2, "g") + field(11, field(1, "x")) + field(12, field(1, "y"));
  const std::string model = field_int(1, 8) + field(7, graph) +
                            field(8, field(1, "") + field_int(2, 17)) +
                            field(8, field(1, "slim") + field_int(2, 1));
  ErrorCode code{};
  const std::string msg = error_of(
      [&] { OnnxImporter::load_bytes(model.data(), model.size(), "fused.onnx", ""); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_model);
  EXPECT_NE(msg.find("fused.onnx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("slim"), std::string::npos) << msg;
}

TEST(Passes, FusedKernelRejectsUnknownActivation) {
  ModelBuilder b(17);
  b.opset(kFusedDomain, kFusedOpset);
  b.input("x", DType::f32, {{2, 3}});
  b.initializer("w", random_f32({3, 3}, 31));
  b.node("FusedMatMul", {"x", "w"}, {"y"}, "fm", kFusedDomain).attrs["activation"] =
      attr_string("Swoosh");
  b.output("y");
  ErrorCode code{};
  const std::string msg = error_of([&] { Session::compile(b.build(), ref_options(false)); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_model);
  EXPECT_NE(msg.find("FusedMatMul node 'fm'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Swoosh"), std::string::npos) << msg;
}

TEST(Passes, ApplyActivationMatchesRefKernelsBitForBit) {
  // The scalar definition providers test against equals the unfused ref ops exactly.
  const Tensor x = random_f32({4096}, 32, -9.f, 9.f);
  struct Op {
    const char* op;
    Activation kind;
  };
  for (const Op& op : {Op{"Relu", Activation::relu}, Op{"Sigmoid", Activation::sigmoid},
                       Op{"HardSwish", Activation::hard_swish}, Op{"Tanh", Activation::tanh},
                       Op{"Gelu", Activation::gelu}}) {
    ModelBuilder b(20);
    b.input("x", DType::f32, {{4096}});
    b.node(op.op, {"x"}, {"y"});
    b.output("y");
    const Tensor y = Session::compile(b.build(), ref_options(false))->run({{"x", x}}).at("y");
    ActivationSpec spec;
    spec.kind = op.kind;
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_EQ(apply_activation(spec, x.data<float>()[i]), y.data<float>()[i])
          << op.op << " at x = " << x.data<float>()[i];
  }
}

// ---------------------------------------------------------------------------------------
// remove_noop_nodes

TEST(Passes, DropsIdentityDropoutAndNoopCastAndReshape) {
  ModelBuilder b(17);
  b.input("x", DType::f32, {{2, 3}});
  b.initializer("shape", i64({2}, {2, 3}));
  b.node("Identity", {"x"}, {"i"});
  b.node("Dropout", {"i"}, {"d"});
  Node& cast = b.node("Cast", {"d"}, {"c"});
  cast.attrs["to"] = attr_int(1);  // FLOAT: already f32
  b.node("Reshape", {"c", "shape"}, {"r"});
  b.node("Relu", {"r"}, {"y"});
  b.output("y");
  const TensorMap in = {{"x", random_f32({2, 3}, 33)}};
  auto s = expect_same_outputs(b.build(), in);
  EXPECT_EQ(op_types(s->compiled_graph()), std::vector<std::string>{"Relu"});
  EXPECT_EQ(s->compiled_graph().nodes[0].inputs[0], "x");

  // Before shape inference the Reshape's output shape is unknown: only the others go.
  PassGraph g = pass_graph_from_model(b.build());
  EXPECT_EQ(remove_noop_nodes(g), 3);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Reshape", "Relu"}));
}

TEST(Passes, KeepsNoopsWhoseOutputIsNeeded) {
  ModelBuilder b(17);
  b.input("x", DType::f32, {{2, 3}});
  b.node("Identity", {"x"}, {"y"});         // a graph output keeps its name
  b.node("Dropout", {"x"}, {"d", "mask"});  // the mask is read
  b.node("Cast", {"mask"}, {"m"}).attrs["to"] = attr_int(1);
  b.node("Cast", {"x"}, {"h"}).attrs["to"] = attr_int(7);  // INT64: real work
  b.output("y").output("d").output("m").output("h");
  PassGraph g = pass_graph_from_model(b.build());
  EXPECT_EQ(remove_noop_nodes(g), 0);
  expect_same_outputs(b.build(), {{"x", random_f32({2, 3}, 34)}});
}

// ---------------------------------------------------------------------------------------
// fold_shape_subgraphs

TEST(Passes, FoldsShapeArithmeticToConstants) {
  // The flatten torch exports: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])).
  ModelBuilder b(17);
  b.input("x", DType::f32, {{2, 3, 4}});
  b.initializer("zero", Tensor::scalar<int64_t>(0));
  b.initializer("axes", i64({1}, {0}));
  b.initializer("minus1", i64({1}, {-1}));
  b.node("Shape", {"x"}, {"s"});
  b.node("Gather", {"s", "zero"}, {"n"});
  b.node("Unsqueeze", {"n", "axes"}, {"nu"});
  b.node("Concat", {"nu", "minus1"}, {"target"}).attrs["axis"] = attr_int(0);
  b.node("Reshape", {"x", "target"}, {"y"});
  b.output("y");
  PassGraph g = pass_graph_from_model(b.build());
  EXPECT_EQ(fold_shape_subgraphs(g), 4);
  EXPECT_EQ(op_types(g), std::vector<std::string>{"Reshape"});
  EXPECT_EQ(values_of(g.constants.at("target")), (std::vector<double>{2, -1}));
  auto s = expect_same_outputs(b.build(), {{"x", random_f32({2, 3, 4}, 35)}});
  EXPECT_EQ(s->run({{"x", random_f32({2, 3, 4}, 35)}}).at("y").shape(), (Shape{2, 12}));

  // A symbolic dim is not a fact: nothing folds.
  ModelBuilder d = b;
  d.model().graph.inputs[0].shape = dims({"batch", 3, 4});
  PassGraph gd = pass_graph_from_model(d.build());
  EXPECT_EQ(fold_shape_subgraphs(gd), 0);
}

// ---------------------------------------------------------------------------------------
// The profiling hook that `slim bench --profile` uses.

TEST(Passes, ProfilerSeesEveryNodeOfARun) {
  ModelBuilder b = conv_model();
  b.node("Relu", {"c"}, {"r"});
  b.node("Sigmoid", {"c"}, {"q"});
  b.output("r").output("q");
  auto s = Session::compile(b.build(), ref_options(true));
  std::vector<std::string> seen;
  s->set_profiler([&](const Node& n, const std::string& provider,
                      std::chrono::steady_clock::time_point t0,
                      std::chrono::steady_clock::time_point t1) {
    seen.push_back(n.op_type + "@" + provider);
    EXPECT_LE(t0, t1);
  });
  s->run({{"x", random_f32({2, 3, 6, 6}, 36)}});
  EXPECT_EQ(seen, (std::vector<std::string>{"Conv@ref", "Relu@ref", "Sigmoid@ref"}));
  s->set_profiler(nullptr);
  s->run({{"x", random_f32({2, 3, 6, 6}, 36)}});
  EXPECT_EQ(seen.size(), 3u);
}

// ---------------------------------------------------------------------------------------
// run_float16_in_float32

namespace {

Tensor to_f16(const Tensor& t) { return convert_dtype(t, DType::f16); }

// An exporter's float16 graph (onnxconverter-common's, as in @imgly's ISNet): the input
// cast to f16, Conv -> Relu in f16, a Resize kept in f32 between the model's own Casts, a
// Concat of that with a Relu output (fed by a model Cast: ORT keeps it in f16), a Concat
// of two Relu outputs (only converted nodes around it: ORT runs it in f32), f32 outputs
// cast back, and one f16 output.
ModelBuilder float16_model() {
  ModelBuilder b(15);
  b.input("x", DType::f32, {{1, 2, 6, 6}});
  b.initializer("w1", to_f16(random_f32({4, 2, 3, 3}, 61, -0.7f, 0.7f)));
  b.initializer("b1", to_f16(random_f32({4}, 62)));
  b.initializer("w2", to_f16(random_f32({4, 4, 3, 3}, 63, -0.4f, 0.4f)));
  b.initializer("w3", to_f16(random_f32({3, 8, 1, 1}, 64, -0.4f, 0.4f)));
  b.initializer("sizes", i64({4}, {1, 4, 6, 6}));
  b.node("Cast", {"x"}, {"x16"}, "in_cast").attrs["to"] = attr_int(10);
  b.node("Conv", {"x16", "w1", "b1"}, {"c1"}, "conv1").attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Relu", {"c1"}, {"r1"}, "relu1");
  b.node("Conv", {"r1", "w2"}, {"c2"}, "conv2").attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("Relu", {"c2"}, {"r2"}, "relu2");
  b.node("Concat", {"r1", "r2"}, {"cat_a"}, "cat_isolated").attrs["axis"] = attr_int(1);
  b.node("Conv", {"cat_a", "w3"}, {"c3"}, "conv3");
  b.node("Cast", {"r2"}, {"r2_32"}, "resize_in").attrs["to"] = attr_int(1);
  Node& rs = b.node("Resize", {"r2_32", "", "", "sizes"}, {"rs32"}, "resize");
  rs.attrs["mode"] = attr_string("linear");
  b.node("Cast", {"rs32"}, {"rs16"}, "resize_out").attrs["to"] = attr_int(10);
  b.node("Concat", {"rs16", "r1"}, {"cat_b"}, "cat_f16").attrs["axis"] = attr_int(1);
  b.node("Conv", {"cat_b", "w3"}, {"c4"}, "conv4");
  b.node("Cast", {"c3"}, {"y3"}, "out3").attrs["to"] = attr_int(1);
  b.node("Cast", {"c4"}, {"y4"}, "out4").attrs["to"] = attr_int(1);
  b.node("Cast", {"r2"}, {"yr"}, "out_r").attrs["to"] = attr_int(1);
  b.output("y3").output("y4").output("yr").output("c4");
  return b;
}

const Node* node_named(const PassGraph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    if (n->name == name) return n.get();
  return nullptr;
}

}  // namespace

TEST(Passes, Float16NodesRunInFloat32WhereOnnxRuntimeRunsThem) {
  PassGraph g = pass_graph_from_model(float16_model().build());
  EXPECT_EQ(run_float16_in_float32(g), 0) << "only for a provider that computes in f32";
  g.float16_in_float32 = true;
  // conv1..4, relu1, relu2, resize... the Resize reads f32 already; the isolated Concat.
  EXPECT_EQ(run_float16_in_float32(g), 7);
  // The input cast and its inserted inverse are gone: conv1 reads x, with f32 weights.
  const Node* conv1 = node_named(g, "conv1");
  ASSERT_NE(conv1, nullptr);
  EXPECT_EQ(conv1->inputs[0], "x");
  EXPECT_EQ(g.constant(conv1->inputs[1])->dtype(), DType::f32);
  EXPECT_EQ(node_named(g, "in_cast"), nullptr);
  // Values between converted nodes stay f32 under their names; the isolated Concat joins them in f32.
  EXPECT_EQ(g.dtype_of("r1"), DType::f32);
  EXPECT_EQ(node_named(g, "cat_isolated")->inputs, (std::vector<std::string>{"r1", "r2"}));
  EXPECT_EQ(g.dtype_of("cat_a"), DType::f32);
  // The Resize reads relu2's f32 output; the model's cast to f32 before it is gone.
  EXPECT_EQ(node_named(g, "resize_in"), nullptr);
  EXPECT_EQ(node_named(g, "resize")->inputs[0], "r2");
  // The Concat fed by the model's own Cast stays f16: relu1's output is rounded for it.
  const Node* cat_b = node_named(g, "cat_f16");
  EXPECT_EQ(cat_b->inputs[0], "rs16");
  EXPECT_EQ(g.dtype_of(cat_b->inputs[1]), DType::f16);
  EXPECT_EQ(g.dtype_of("cat_b"), DType::f16);
  // Graph outputs keep their names and types: y3's Cast now reads conv3's f32 output, c4
  // (f16) is computed in f32 and cast back.
  EXPECT_EQ(node_named(g, "out3")->inputs[0], "c3");
  EXPECT_EQ(g.dtype_of("c3"), DType::f32);
  EXPECT_EQ(g.dtype_of("c4"), DType::f16);
  EXPECT_EQ(node_named(g, "out_r")->inputs[0], "r2");
  // A second run finds nothing to do.
  EXPECT_EQ(run_float16_in_float32(g), 0);
}

TEST(Passes, Float16ModelOnCpuMatchesOnnxRuntimesRounding) {
  const Model m = float16_model().build();
  const TensorMap in = {{"x", random_f32({1, 2, 6, 6}, 65)}};
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  auto fast = Session::compile(m, o);
  for (const auto& a : fast->partition()) EXPECT_EQ(a.provider, "cpu") << a.node;
  const TensorMap got = fast->run(in);
  // ORT's numerics written out in f32: x unrounded, everything f32 except that the
  // inputs of the f16 Concat are rounded to f16, and c4, an f16 graph output.
  ModelBuilder e(15);
  e.input("x", DType::f32, {{1, 2, 6, 6}});
  auto f32_of = [&](const char* name, Tensor t) { e.initializer(name, convert_dtype(t, DType::f32)); };
  const Model src = float16_model().build();
  for (const char* w : {"w1", "b1", "w2", "w3"}) f32_of(w, src.graph.initializers.at(w));
  e.initializer("sizes", i64({4}, {1, 4, 6, 6}));
  e.node("Conv", {"x", "w1", "b1"}, {"c1"}).attrs["pads"] = attr_ints({1, 1, 1, 1});
  e.node("Relu", {"c1"}, {"r1"});
  e.node("Conv", {"r1", "w2"}, {"c2"}).attrs["pads"] = attr_ints({1, 1, 1, 1});
  e.node("Relu", {"c2"}, {"r2"});
  e.node("Concat", {"r1", "r2"}, {"cat_a"}).attrs["axis"] = attr_int(1);
  e.node("Conv", {"cat_a", "w3"}, {"y3"});
  e.node("Resize", {"r2", "", "", "sizes"}, {"rs"}).attrs["mode"] = attr_string("linear");
  for (const char* v : {"rs", "r1"}) {
    e.node("Cast", {v}, {std::string(v) + "_16"}).attrs["to"] = attr_int(10);
    e.node("Cast", {std::string(v) + "_16"}, {std::string(v) + "_r"}).attrs["to"] = attr_int(1);
  }
  e.node("Concat", {"rs_r", "r1_r"}, {"cat_b"}).attrs["axis"] = attr_int(1);
  // c4 is an f16 graph output: its Cast stays, and y4 reads the rounded value.
  e.node("Conv", {"cat_b", "w3"}, {"c4_32"});
  e.node("Cast", {"c4_32"}, {"c4"}).attrs["to"] = attr_int(10);
  e.node("Cast", {"c4"}, {"y4"}).attrs["to"] = attr_int(1);
  e.output("y3").output("y4").output("c4");
  e.node("Identity", {"r2"}, {"yr"});
  e.output("yr");
  SessionOptions ro;
  ro.providers = {"ref"};
  ro.optimize = false;
  const TensorMap want = Session::compile(e.build(), ro)->run(in);
  // Within f32 rounding: cpu's convolutions sum in another order than ref's.
  for (const char* name : {"y3", "y4", "yr"}) {
    const auto a = values_of(got.at(name)), b = values_of(want.at(name));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << name << "[" << i << "]";
  }
  EXPECT_EQ(got.at("c4").dtype(), DType::f16);
  // ref alone computes in f16 throughout: the same results within f16's precision.
  const TensorMap ref = Session::compile(m, ro)->run(in);
  const auto a = values_of(got.at("y4")), b = values_of(ref.at("y4"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-2 * std::max(1.0, std::fabs(b[i])));
}
