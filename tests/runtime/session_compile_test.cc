// Compile passes of Session: Constant nodes, constant folding, dead-node elimination,
// static shape inference by probe runs, kernel selection, and the memory plan.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

std::vector<std::string> op_types(const Session& s) {
  std::vector<std::string> ops;
  for (const auto& n : s.compiled_graph().nodes) ops.push_back(n.op_type);
  return ops;
}

}  // namespace

TEST(SessionCompile, ConstantNodesBecomeInitializers) {
  ModelBuilder b;
  b.input("x", DType::f32, {{3}}).output("y");
  b.node("Constant", {}, {"c"}).attrs["value_floats"] = attr_floats({1, 2, 3});
  b.node("Add", {"x", "c"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), std::vector<std::string>{"Add"});
  ASSERT_TRUE(s->compiled_graph().initializers.count("c"));
  EXPECT_EQ(values_of(s->compiled_graph().initializers.at("c")), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(s->stats().nodes_in, 2);
  EXPECT_EQ(s->stats().nodes_out, 1);
  EXPECT_EQ(s->stats().folded_nodes, 1);
  auto out = s->run({{"x", f32({3}, {10, 20, 30})}});
  EXPECT_EQ(values_of(out.at("y")), (std::vector<double>{11, 22, 33}));
}

TEST(SessionCompile, ConstantNodeKinds) {
  ModelBuilder b;
  b.output("a").output("b").output("c");
  b.node("Constant", {}, {"a"}).attrs["value_int"] = attr_int(7);
  b.node("Constant", {}, {"b"}).attrs["value_ints"] = attr_ints({4, 5});
  b.node("Constant", {}, {"c"}).attrs["value"] = attr_tensor(f32({2, 1}, {0.5f, -1}));
  auto s = Session::compile(b.build(), test_options());
  EXPECT_TRUE(s->compiled_graph().nodes.empty());
  auto out = s->run({});
  EXPECT_EQ(out.at("a").dtype(), DType::i64);
  EXPECT_EQ(out.at("a").shape(), Shape{});
  EXPECT_EQ(values_of(out.at("a")), std::vector<double>{7});
  EXPECT_EQ(values_of(out.at("b")), (std::vector<double>{4, 5}));
  EXPECT_EQ(out.at("c").shape(), (Shape{2, 1}));
  EXPECT_EQ(values_of(out.at("c")), (std::vector<double>{0.5, -1}));

  ModelBuilder bad;
  bad.output("a");
  Node& n = bad.node("Constant", {}, {"a"}, "k");
  n.attrs["value_int"] = attr_int(1);
  n.attrs["value_float"] = attr_float(1);
  ErrorCode code{};
  const std::string msg = error_of([&] { Session::compile(bad.build(), test_options()); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_model);
  EXPECT_NE(msg.find("Constant node 'k'"), std::string::npos) << msg;
}

TEST(SessionCompile, FoldsNodesWhoseInputsAreConstant) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("y");
  b.initializer("a", f32({2}, {1, 2})).initializer("b", f32({2}, {10, 20}));
  b.node("Add", {"a", "b"}, {"t"});
  b.node("Relu", {"t"}, {"u"});
  b.node("Mul", {"u", "x"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), std::vector<std::string>{"Mul"});
  EXPECT_EQ(s->stats().folded_nodes, 2);
  ASSERT_TRUE(s->compiled_graph().initializers.count("u"));
  // The inputs of folded nodes are no longer needed by anything.
  EXPECT_FALSE(s->compiled_graph().initializers.count("a"));
  EXPECT_FALSE(s->compiled_graph().initializers.count("t"));

  const int64_t before = test_kernel_calls();
  auto out = s->run({{"x", f32({2}, {2, 3})}});
  EXPECT_EQ(test_kernel_calls() - before, 1) << "folded nodes ran again";
  EXPECT_EQ(values_of(out.at("y")), (std::vector<double>{22, 66}));

  SessionOptions no_fold = test_options();
  no_fold.fold_constants = false;
  auto s2 = Session::compile(b.build(), no_fold);
  EXPECT_EQ(op_types(*s2), (std::vector<std::string>{"Add", "Relu", "Mul"}));
  EXPECT_EQ(values_of(s2->run({{"x", f32({2}, {2, 3})}}).at("y")),
            (std::vector<double>{22, 66}));
}

TEST(SessionCompile, FoldingErrorsSurfaceAtCompile) {
  ModelBuilder b;
  b.output("y");
  b.initializer("a", f32({2}, {1, 2})).initializer("b", f32({3}, {1, 2, 3}));
  b.node("Add", {"a", "b"}, {"y"}, "bad_add");
  ErrorCode code{};
  const std::string msg = error_of([&] { Session::compile(b.build(), test_options()); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(msg.find("Add node 'bad_add'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot broadcast [2] with [3]"), std::string::npos) << msg;
}

TEST(SessionCompile, DeadNodesAreRemoved) {
  ModelBuilder b;
  b.input("x", DType::f32, {{4}}).output("y");
  b.node("Relu", {"x"}, {"y"});
  b.node("Tick", {"x"}, {"unused1"});
  b.node("Relu", {"unused1"}, {"unused2"});
  // A dead node no provider supports must not stop the compile.
  b.node("Frobnicate", {"x"}, {"unused3"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), std::vector<std::string>{"Relu"});
  EXPECT_EQ(s->stats().dead_nodes, 3);
  EXPECT_EQ(s->stats().nodes_out, 1);
  const int64_t before = test_kernel_calls();
  auto out = s->run({{"x", f32({4}, {-1, 2, -3, 4})}});
  EXPECT_EQ(test_kernel_calls() - before, 1);
  EXPECT_EQ(values_of(out.at("y")), (std::vector<double>{0, 2, 0, 4}));
}

TEST(SessionCompile, ShapeOfStaticValueIsFoldedAndFeedsStaticShapes) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2, 3, 4}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  b.node("Shape", {"r"}, {"s"});
  b.initializer("flat", i64({2}, {6, 4}));
  b.node("Reshape", {"r", "flat"}, {"f"});
  b.node("Relu", {"f"}, {"g"});
  b.node("Reshape", {"g", "s"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), (std::vector<std::string>{"Relu", "Reshape", "Relu", "Reshape"}));
  ASSERT_TRUE(s->compiled_graph().initializers.count("s"));
  EXPECT_EQ(values_of(s->compiled_graph().initializers.at("s")), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(s->static_shape("f"), (Shape{6, 4}));
  EXPECT_EQ(s->static_shape("y"), (Shape{2, 3, 4}));
  EXPECT_EQ(s->static_dtype("y"), DType::f32);
  EXPECT_EQ(s->stats().memory.dynamic_values, 0);

  std::vector<float> xs(24);
  for (int i = 0; i < 24; ++i) xs[size_t(i)] = float(i % 5) - 2;
  auto out = s->run({{"x", f32({2, 3, 4}, xs)}});
  ASSERT_EQ(out.at("y").shape(), (Shape{2, 3, 4}));
  const auto ys = values_of(out.at("y"));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(ys[size_t(i)], std::max(0.f, xs[size_t(i)]));
}

TEST(SessionCompile, SymbolicInputsMakeConsumersDynamic) {
  ModelBuilder b;
  b.input("x", DType::f32, {{"batch", 4}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  b.node("Shape", {"r"}, {"s"});
  b.node("Relu", {"r"}, {"r2"});
  b.node("Reshape", {"r2", "s"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), (std::vector<std::string>{"Relu", "Shape", "Relu", "Reshape"}));
  EXPECT_FALSE(s->static_shape("r").has_value());
  EXPECT_FALSE(s->static_shape("s").has_value());
  EXPECT_FALSE(s->static_shape("y").has_value());
  EXPECT_EQ(s->stats().memory.planned_values, 0);
  EXPECT_EQ(s->stats().memory.dynamic_values, 3);  // r, s, r2

  for (int64_t batch : {1, 3}) {
    std::vector<float> xs(size_t(batch * 4), -1.f);
    xs[0] = 5;
    auto out = s->run({{"x", f32({batch, 4}, xs)}});
    EXPECT_EQ(out.at("y").shape(), (Shape{batch, 4}));
    EXPECT_EQ(values_of(out.at("y"))[0], 5);
  }
}

TEST(SessionCompile, ValueDependentShapesNeedConstantShapeInputs) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2, 3}}).output("nz").output("nzc");
  b.initializer("c", f32({2, 2}, {0, 1, 1, 0}));
  b.node("NonZero", {"x"}, {"nz"});
  b.node("NonZero", {"c"}, {"nzc"});
  auto s = Session::compile(b.build(), test_options());
  // NonZero's output shape depends on its input's values: static x is not enough,
  // a constant input folds.
  EXPECT_EQ(op_types(*s), std::vector<std::string>{"NonZero"});
  EXPECT_FALSE(s->static_shape("nz").has_value());
  EXPECT_EQ(s->static_shape("nzc"), (Shape{2, 2}));
  auto out = s->run({{"x", f32({2, 3}, {0, 0, 7, 0, 0, 0})}});
  EXPECT_EQ(out.at("nz").shape(), (Shape{2, 1}));
  EXPECT_EQ(values_of(out.at("nz")), (std::vector<double>{0, 2}));
  EXPECT_EQ(values_of(out.at("nzc")), (std::vector<double>{0, 1, 1, 0}));
}

TEST(SessionCompile, FailedProbeLeavesShapeUnknown) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("y");
  b.node("Flaky", {"x"}, {"f"});
  b.node("Relu", {"f"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_FALSE(s->static_shape("f").has_value());
  EXPECT_EQ(values_of(s->run({{"x", f32({2}, {-1, 3})}}).at("y")), (std::vector<double>{0, 3}));
  // Real data can still trip the kernel: that is a run-time error naming the node.
  ErrorCode code{};
  const std::string msg = error_of([&] { s->run({{"x", f32({2}, {1, 1})}}); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(msg.find("Flaky node 'Flaky_0': all inputs are one"), std::string::npos) << msg;
}

TEST(SessionCompile, IntegerDivisionProbeDoesNotDivideByZero) {
  ModelBuilder b;
  b.input("a", DType::i64, {{3}}).input("d", DType::i64, {{3}}).output("q");
  b.node("Div", {"a", "d"}, {"q"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(s->static_shape("q"), (Shape{3}));
  auto out = s->run({{"a", i64({3}, {7, 9, -8})}, {"d", i64({3}, {2, 3, 4})}});
  EXPECT_EQ(values_of(out.at("q")), (std::vector<double>{3, 3, -2}));
}

TEST(SessionCompile, UnsupportedOpNamesOpDomainOpsetAndNode) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("y");
  b.node("Frobnicate", {"x"}, {"t"}, "frob");
  b.node("Relu", {"t"}, {"y"});
  ErrorCode code{};
  const std::string msg = error_of([&] { Session::compile(b.build(), test_options()); }, &code);
  EXPECT_EQ(code, ErrorCode::unsupported);
  EXPECT_NE(msg.find("ai.onnx:Frobnicate (opset 17)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Frobnicate node 'frob'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[test]"), std::string::npos) << msg;

  EXPECT_EQ(unsupported_ops(b.build(), {"test"}),
            std::vector<std::string>{"ai.onnx:Frobnicate (opset 17)"});
  const std::string unknown = error_of([&] { unsupported_ops(b.build(), {"nope"}); }, &code);
  EXPECT_NE(unknown.find("unknown provider 'nope' (known: cpu, ref, test"), std::string::npos)
      << unknown;
  EXPECT_EQ(code, ErrorCode::invalid_argument);
}

TEST(SessionCompile, UnsupportedOpReportSaysWhyAndWhere) {
  // Softmax: only cpu and ref have it; Reshape: the test provider has it from opset 5;
  // Frobnicate: nobody; Gizmo: only in a dead node, which compile drops.
  ModelBuilder b(4);
  b.input("x", DType::f32, {{2}}).output("y").output("z");
  b.initializer("s", i64({1}, {2}));
  b.node("Softmax", {"x"}, {"a"}, "sm");
  b.node("Frobnicate", {"a"}, {"y"}, "frob1");
  b.node("Frobnicate", {"x"}, {"f"}, "frob2");
  b.node("Reshape", {"f", "s"}, {"z"}, "rs");
  b.node("Gizmo", {"x"}, {"dead"}, "gizmo");
  const auto report = unsupported_op_report(b.build(), test_options().providers);
  ASSERT_EQ(report.size(), 3u);
  EXPECT_EQ(report[0].op, "ai.onnx:Frobnicate (opset 4)");
  EXPECT_EQ(report[0].reason, "slim does not implement it");
  EXPECT_EQ(report[0].nodes, (std::vector<std::string>{"frob1", "frob2"}));
  EXPECT_EQ(report[1].op, "ai.onnx:Reshape (opset 4)");
  EXPECT_EQ(report[1].reason, "no kernel for opset 4 (test has opsets 5+)");
  EXPECT_EQ(report[2].op, "ai.onnx:Softmax (opset 4)");
  EXPECT_EQ(report[2].reason, "only providers cpu, ref implement it, and they are not selected");
  EXPECT_EQ(report[2].nodes, std::vector<std::string>{"sm"});
}

TEST(SessionCompile, KernelsAreChosenByOpset) {
  ModelBuilder b(4);  // the test Reshape exists from opset 5 on
  b.input("x", DType::f32, {{4}}).output("y");
  b.initializer("s", i64({2}, {2, 2}));
  b.node("Reshape", {"x", "s"}, {"y"});
  ErrorCode code{};
  const std::string msg = error_of([&] { Session::compile(b.build(), test_options()); }, &code);
  EXPECT_EQ(code, ErrorCode::unsupported);
  EXPECT_NE(msg.find("ai.onnx:Reshape (opset 4)"), std::string::npos) << msg;

  b.model().opsets[""] = 13;
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(s->node_providers(), std::vector<std::string>{"test"});
  EXPECT_EQ(s->static_shape("y"), (Shape{2, 2}));
}

TEST(SessionCompile, ProvidersAreTriedInOrder) {
  // A second provider that only has Relu, as a fast provider would: it wins for Relu,
  // the test provider runs the rest.
  static KernelRegistry fast("fast_test");
  static bool once = [] {
    fast.add({"Relu", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
                const Tensor& x = ctx.required_input(0);
                Tensor& y = ctx.output(0, DType::f32, x.shape());
                for (int64_t i = 0; i < x.numel(); ++i)
                  y.data<float>()[i] = x.data<float>()[i] > 0 ? x.data<float>()[i] : 0.f;
              }), {}});
    register_provider(&fast);
    return true;
  }();
  (void)once;
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  b.node("Add", {"r", "x"}, {"y"});
  SessionOptions o = test_options();
  o.providers = {"fast_test", "test"};
  auto s = Session::compile(b.build(), o);
  EXPECT_EQ(s->node_providers(), (std::vector<std::string>{"fast_test", "test"}));
  EXPECT_EQ(values_of(s->run({{"x", f32({2}, {-2, 3})}}).at("y")), (std::vector<double>{-2, 6}));
}

TEST(SessionCompile, ChainReusesArenaMemory) {
  ModelBuilder b;
  b.input("x", DType::f32, {{64, 64}}).output("y");
  std::string prev = "x";
  for (int i = 0; i < 8; ++i) {
    const std::string next = i == 7 ? "y" : "v" + std::to_string(i);
    b.node("Relu", {prev}, {next});
    prev = next;
  }
  auto s = Session::compile(b.build(), test_options());
  const MemoryPlanStats& m = s->stats().memory;
  EXPECT_EQ(m.planned_values, 7);
  EXPECT_EQ(m.intermediate_bytes, 7 * 64 * 64 * 4);
  EXPECT_EQ(m.planned_bytes, 2 * 64 * 64 * 4);
  EXPECT_NEAR(m.reuse_rate(), 1.0 - 2.0 / 7.0, 1e-12);
  EXPECT_EQ(m.dynamic_values, 0);

  SessionOptions no_plan = test_options();
  no_plan.plan_memory = false;
  auto s2 = Session::compile(b.build(), no_plan);
  EXPECT_EQ(s2->stats().memory.planned_values, 0);
  EXPECT_EQ(s2->stats().memory.planned_bytes, 0);
}

TEST(SessionCompile, GraphOutputsAreNotPlanned) {
  ModelBuilder b;
  b.input("x", DType::f32, {{16}}).output("a").output("y");
  b.node("Relu", {"x"}, {"a"});
  b.node("Relu", {"a"}, {"t"});
  b.node("Relu", {"t"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(s->stats().memory.planned_values, 1);  // only t
  EXPECT_EQ(s->stats().memory.intermediate_bytes, 64);
}

TEST(SessionCompile, ValuesReadBySubgraphsStayAlive) {
  // r is read only inside WithBody's subgraph: dead-node elimination must keep its
  // producer, and folding must leave the subgraph node alone.
  ModelBuilder b;
  b.input("x", DType::f32, {{4}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Node inner;
  inner.op_type = "Relu";
  inner.name = "inner";
  inner.inputs = {"r"};
  inner.outputs = {"body_out"};
  body->nodes.push_back(inner);
  ValueInfo out;
  out.name = "body_out";
  body->outputs.push_back(out);
  Attribute a;
  a.kind = Attribute::Kind::g;
  a.g = body;
  b.node("WithBody", {"x"}, {"y"}).attrs["body"] = a;
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(op_types(*s), (std::vector<std::string>{"Relu", "WithBody"}));
  EXPECT_EQ(s->stats().dead_nodes, 0);
  EXPECT_EQ(values_of(s->run({{"x", f32({4}, {1, -2, 3, -4})}}).at("y")),
            (std::vector<double>{1, -2, 3, -4}));
}

// The ref convolutions and matrix products infer their output shapes instead of being
// probed: a probe is a full scalar run of the node at the model's real size.
TEST(SessionCompile, RefConvolutionsAndMatrixProductsAreNotProbed) {
  ModelBuilder b;
  b.input("x", DType::f32, {{1, 2, 7, 6}}).input("q", DType::u8, {{1, 2, 7, 6}}).input("a", DType::f32, {{3, 5}});
  b.output("y").output("yi").output("yf").output("m").output("g").output("mi");
  b.initializer("w", f32({4, 2, 3, 3}, std::vector<float>(72, 0.5f)));
  b.initializer("wq", Tensor::from_vector<uint8_t>({4, 2, 3, 3}, std::vector<uint8_t>(72, 3)));
  b.initializer("bm", f32({5, 4}, std::vector<float>(20, 1.f)));
  b.initializer("aq", Tensor::from_vector<int8_t>({3, 5}, std::vector<int8_t>(15, -2)));
  b.initializer("bq", Tensor::from_vector<int8_t>({2, 5, 4}, std::vector<int8_t>(40, 3)));
  Node& conv = b.node("Conv", {"x", "w"}, {"y"});
  conv.attrs["strides"] = attr_ints({2, 2});
  conv.attrs["pads"] = attr_ints({1, 1, 1, 1});
  b.node("ConvInteger", {"q", "wq"}, {"yi"}).attrs["dilations"] = attr_ints({2, 1});
  b.node("FusedConv", {"x", "w"}, {"yf"}, "", "slim").attrs["activation"] = attr_string("Relu");
  b.node("MatMul", {"a", "bm"}, {"m"});
  b.node("Gemm", {"a", "bm"}, {"g"});
  b.node("MatMulInteger", {"aq", "bq"}, {"mi"});
  b.opset("slim", 1);
  SessionOptions o;
  o.providers = {"ref"};
  auto s = Session::compile(b.build(), o);
  EXPECT_EQ(s->stats().probed_nodes, 0);
  EXPECT_EQ(s->static_shape("y"), (Shape{1, 4, 4, 3}));
  EXPECT_EQ(s->static_shape("yi"), (Shape{1, 4, 3, 4}));
  EXPECT_EQ(s->static_shape("yf"), (Shape{1, 4, 5, 4}));
  EXPECT_EQ(s->static_shape("m"), (Shape{3, 4}));
  EXPECT_EQ(s->static_shape("g"), (Shape{3, 4}));
  EXPECT_EQ(s->static_shape("mi"), (Shape{2, 3, 4}));
  const auto out = s->run({{"x", Tensor::from_vector<float>({1, 2, 7, 6}, std::vector<float>(84, 1.f))},
                           {"q", Tensor::from_vector<uint8_t>({1, 2, 7, 6}, std::vector<uint8_t>(84, 2))},
                           {"a", Tensor::from_vector<float>({3, 5}, std::vector<float>(15, 2.f))}});
  EXPECT_EQ(out.at("y").shape(), (Shape{1, 4, 4, 3}));
  EXPECT_EQ(out.at("yi").data<int32_t>()[0], 2 * 3 * 18);
  EXPECT_EQ(values_of(out.at("yf"))[0], 9);
  EXPECT_EQ(out.at("mi").data<int32_t>()[0], -2 * 3 * 5);
}
