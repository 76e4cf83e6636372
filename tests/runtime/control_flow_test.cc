// Control flow in Session: If branches and Loop/Scan bodies compiled once into plans of
// their own, values captured from outer scopes, carried shapes that change per
// iteration, If folded when its condition is known, and the errors of bad conditions.
#include <gtest/gtest.h>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

Attribute attr_graph(const ModelBuilder& body) {
  Attribute a;
  a.kind = Attribute::Kind::g;
  a.g = std::make_shared<Graph>(body.build().graph);
  return a;
}

SessionOptions with_providers(std::vector<std::string> providers) {
  SessionOptions o;
  o.num_threads = 1;
  o.providers = std::move(providers);
  return o;
}

Tensor boolean(bool v) { return Tensor::scalar<bool>(v); }

// y = cond ? x + c : x * s, where c is an outer initializer and s = x - 1 an outer value.
Model if_model(bool constant_cond, bool cond_value = true) {
  ModelBuilder then_b(17, "then"), else_b(17, "else");
  then_b.output("t_out").node("Add", {"x", "c"}, {"t_out"}, "then_add");
  else_b.output("e_out").node("Mul", {"x", "s"}, {"e_out"}, "else_mul");
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<DimSpec>{2, 3}).output("y");
  if (constant_cond)
    b.initializer("cond", boolean(cond_value));
  else
    b.input("cond", DType::boolean, std::vector<DimSpec>{});
  b.initializer("c", f32({3}, {10, 20, 30})).initializer("one", f32({}, {1}));
  b.node("Sub", {"x", "one"}, {"s"});
  Node& n = b.node("If", {"cond"}, {"y"}, "if");
  n.attrs["then_branch"] = attr_graph(then_b);
  n.attrs["else_branch"] = attr_graph(else_b);
  return b.build();
}

const Tensor kX = f32({2, 3}, {1, 2, 3, 4, 5, 6});

}  // namespace

TEST(ControlFlow, IfBranchesReadCapturedOuterValues) {
  for (const auto& providers : {std::vector<std::string>{"ref"}, {"cpu", "ref"}}) {
    auto s = Session::compile(if_model(false), with_providers(providers));
    EXPECT_EQ(s->stats().subgraph_plans, 2);
    EXPECT_EQ(values_of(s->run({{"x", kX}, {"cond", boolean(true)}}).at("y")),
              (std::vector<double>{11, 22, 33, 14, 25, 36}));
    EXPECT_EQ(values_of(s->run({{"x", kX}, {"cond", boolean(false)}}).at("y")),
              (std::vector<double>{0, 2, 6, 12, 20, 30}));
    // Both branches give f32[2,3]: the If's output shape is static.
    EXPECT_EQ(s->static_shape("y"), (Shape{2, 3}));
  }
}

TEST(ControlFlow, IfWithAKnownConditionIsInlined) {
  for (bool cond : {true, false}) {
    Model m = if_model(true, cond);
    // The branch not taken is never compiled: an op nobody has does not matter there.
    Graph& untaken = *m.graph.nodes.back().attrs[cond ? "else_branch" : "then_branch"].g;
    untaken.nodes[0].op_type = "NoSuchOp";
    auto s = Session::compile(m, with_providers({"cpu", "ref"}));
    EXPECT_EQ(s->stats().subgraph_plans, 0);
    for (const auto& n : s->compiled_graph().nodes) EXPECT_NE(n.op_type, "If");
    EXPECT_EQ(values_of(s->run({{"x", kX}}).at("y")),
              cond ? (std::vector<double>{11, 22, 33, 14, 25, 36})
                   : (std::vector<double>{0, 2, 6, 12, 20, 30}));
    EXPECT_EQ(s->compiled_graph().nodes.back().name, cond ? "if/then_add" : "if/else_mul");
    // s = x - 1 is read only by the else branch.
    EXPECT_EQ(s->compiled_graph().nodes.size(), cond ? 1u : 2u);
  }
}

TEST(ControlFlow, IfConditionMustBeOneBool) {
  Model m = if_model(false);
  m.graph.inputs[1].dtype = DType::f32;
  auto s = Session::compile(m, with_providers({"ref"}));
  ErrorCode code{};
  EXPECT_EQ(error_of([&] { s->run({{"x", kX}, {"cond", f32({}, {1})}}); }, &code),
            "If node 'if': the condition must be a bool scalar, got f32[]");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
}

namespace {

Tensor i64_scalar(int64_t v) { return Tensor::scalar<int64_t>(v); }

// Loop(M, cond, v) whose body appends the iteration number to v (a shape that grows by
// one each time) and scans out i * 10.
Model growing_loop() {
  ModelBuilder body(17, "body");
  body.input("i", DType::i64, std::vector<DimSpec>{})
      .input("c_in", DType::boolean, std::vector<DimSpec>{})
      .input("v_in", DType::i64, std::vector<DimSpec>{"n"})
      .output("c_out")
      .output("v_out")
      .output("scan");
  body.initializer("axes", i64({1}, {0})).initializer("ten", i64({}, {10}));
  body.node("Identity", {"c_in"}, {"c_out"});
  body.node("Unsqueeze", {"i", "axes"}, {"i1"});
  body.node("Concat", {"v_in", "i1"}, {"v_out"}).attrs["axis"] = attr_int(0);
  body.node("Mul", {"i", "ten"}, {"scan"});
  ModelBuilder b;
  b.input("m", DType::i64, std::vector<DimSpec>{})
      .input("v0", DType::i64, std::vector<DimSpec>{1})
      .output("v")
      .output("scans");
  b.initializer("yes", boolean(true));
  b.node("Loop", {"m", "yes", "v0"}, {"v", "scans"}, "loop").attrs["body"] = attr_graph(body);
  return b.build();
}

}  // namespace

TEST(ControlFlow, LoopCarriedShapeGrowsEachIteration) {
  auto s = Session::compile(growing_loop(), with_providers({"cpu", "ref"}));
  for (int64_t m : {3, 5, 3}) {
    auto out = s->run({{"m", i64_scalar(m)}, {"v0", i64({1}, {-1})}});
    std::vector<double> v = {-1}, scans;
    for (int64_t i = 0; i < m; ++i) {
      v.push_back(double(i));
      scans.push_back(double(i * 10));
    }
    EXPECT_EQ(out.at("v").shape(), (Shape{m + 1}));
    EXPECT_EQ(values_of(out.at("v")), v);
    EXPECT_EQ(out.at("scans").shape(), (Shape{m}));
    EXPECT_EQ(values_of(out.at("scans")), scans);
  }
  // An empty loop returns the initial value and empty scan outputs.
  auto out = s->run({{"m", i64_scalar(0)}, {"v0", i64({1}, {7})}});
  EXPECT_EQ(values_of(out.at("v")), (std::vector<double>{7}));
  EXPECT_EQ(out.at("scans").shape(), (Shape{0}));
}

TEST(ControlFlow, LoopConditionMustBeOneBool) {
  Model m = growing_loop();
  m.graph.inputs.push_back({"cond", DType::f32, std::vector<Dim>{}, ""});
  m.graph.nodes[0].inputs[1] = "cond";
  m.graph.initializers.erase("yes");
  auto s = Session::compile(m, with_providers({"ref"}));
  ErrorCode code{};
  EXPECT_EQ(error_of([&] { s->run({{"m", i64_scalar(2)}, {"v0", i64({1}, {0})}, {"cond", f32({}, {1})}}); }, &code),
            "Loop node 'loop': the condition (input 1) must be a bool scalar, got f32[]");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  // The body's condition output too.
  Model m2 = growing_loop();
  Graph& body = *m2.graph.nodes[0].attrs["body"].g;
  body.nodes[0] = body.nodes[3];  // c_out = i * 10, an int64
  body.nodes[0].outputs = {"c_out"};
  s = Session::compile(m2, with_providers({"ref"}));
  EXPECT_EQ(error_of([&] { s->run({{"m", i64_scalar(2)}, {"v0", i64({1}, {0})}}); }),
            "Loop node 'loop': the body's condition must be a bool scalar, got i64[]");
}

TEST(ControlFlow, LoopBodyIsCompiledOnceAndRunsOnCpu) {
  // acc = acc @ W + b for M iterations; W and b are outer initializers, so the body's
  // plan packs W for oneDNN once; acc keeps its shape, so that plan serves every iteration.
  ModelBuilder body(17, "body");
  body.input("i", DType::i64, std::vector<DimSpec>{})
      .input("c_in", DType::boolean, std::vector<DimSpec>{})
      .input("acc_in", DType::f32, std::vector<DimSpec>{"r", "k"})
      .output("c_in")
      .output("acc_out");
  body.node("MatMul", {"acc_in", "w"}, {"prod"}, "body_matmul");
  body.node("Add", {"prod", "b"}, {"acc_out"}, "body_add");
  ModelBuilder b;
  b.input("m", DType::i64, std::vector<DimSpec>{}).input("x", DType::f32, std::vector<DimSpec>{1, 2}).output("y");
  b.initializer("w", f32({2, 2}, {0, 1, 1, 0})).initializer("b", f32({2}, {1, 0}));
  b.node("Loop", {"m", "", "x"}, {"y"}, "loop").attrs["body"] = attr_graph(body);
  auto s = Session::compile(b.build(), with_providers({"cpu", "ref"}));
  EXPECT_EQ(s->stats().subgraph_plans, 1);
  EXPECT_EQ(s->static_shape("y"), (Shape{1, 2}));
  std::map<std::string, int> ran;  // "node provider" -> runs
  s->set_profiler([&](const Node& n, const std::string& provider, auto, auto) {
    ++ran[n.name + " " + provider];
  });
  for (int run = 0; run < 2; ++run) {
    // [1,2] -> swap and add [1,0]: [3,1] -> [2,3] -> [4,2]
    EXPECT_EQ(values_of(s->run({{"m", i64_scalar(3)}, {"x", f32({1, 2}, {1, 2})}}).at("y")),
              (std::vector<double>{4, 2}));
  }
  // Every iteration ran the body's one plan: MatMul with the Add fused, on oneDNN. The
  // Loop itself is timed through its body's nodes.
  EXPECT_EQ(ran, (std::map<std::string, int>{{"body_matmul cpu", 6}}));
  EXPECT_EQ(s->stats().subgraph_plans, 1);
}

TEST(ControlFlow, IfNestedInLoopReadsValuesTwoScopesOut) {
  // for i < 4: acc = i even ? acc + x : acc * x, with x a graph input read by the If's
  // branches inside the Loop's body.
  ModelBuilder then_b(17, "then"), else_b(17, "else");
  then_b.output("t").node("Add", {"acc_in", "x"}, {"t"});
  else_b.output("e").node("Mul", {"acc_in", "x"}, {"e"});
  ModelBuilder body(17, "body");
  body.input("i", DType::i64, std::vector<DimSpec>{})
      .input("c_in", DType::boolean, std::vector<DimSpec>{})
      .input("acc_in", DType::f32, std::vector<DimSpec>{2})
      .output("c_in")
      .output("acc_out");
  body.initializer("two", i64({}, {2})).initializer("zero", i64({}, {0}));
  body.node("Mod", {"i", "two"}, {"parity"});
  body.node("Equal", {"parity", "zero"}, {"even"});
  Node& n = body.node("If", {"even"}, {"acc_out"}, "inner_if");
  n.attrs["then_branch"] = attr_graph(then_b);
  n.attrs["else_branch"] = attr_graph(else_b);
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<DimSpec>{2}).output("y");
  b.initializer("m", i64({}, {4})).initializer("acc0", f32({2}, {1, 1}));
  b.node("Loop", {"m", "", "acc0"}, {"y"}, "loop").attrs["body"] = attr_graph(body);
  for (const auto& providers : {std::vector<std::string>{"ref"}, {"cpu", "ref"}}) {
    auto s = Session::compile(b.build(), with_providers(providers));
    EXPECT_EQ(s->stats().subgraph_plans, 3);  // the body and, inside it, two branches
    // [1,1] -> +x [3,4] -> *x [6,12] -> +x [8,15] -> *x [16,45]
    EXPECT_EQ(values_of(s->run({{"x", f32({2}, {2, 3})}}).at("y")), (std::vector<double>{16, 45}));
  }
}

TEST(ControlFlow, ScanWalksAndFillsInEitherDirectionAlongAnyAxis) {
  // s += x[:, t] over the columns of x, last column first; the running sums stacked
  // along axis 1, first to last or last to first.
  ModelBuilder body(17, "body");
  body.input("s_in", DType::f32, std::vector<DimSpec>{2})
      .input("col", DType::f32, std::vector<DimSpec>{2})
      .output("s_out")
      .output("part");
  body.node("Add", {"s_in", "col"}, {"s_out"});
  body.node("Identity", {"s_out"}, {"part"});
  for (int64_t out_dir : {0, 1}) {
    ModelBuilder b(17);
    b.input("s0", DType::f32, std::vector<DimSpec>{2})
        .input("x", DType::f32, std::vector<DimSpec>{2, 3})
        .output("s")
        .output("y");
    Node& n = b.node("Scan", {"s0", "x"}, {"s", "y"}, "scan");
    n.attrs["body"] = attr_graph(body);
    n.attrs["num_scan_inputs"] = attr_int(1);
    n.attrs["scan_input_axes"] = attr_ints({1});
    n.attrs["scan_input_directions"] = attr_ints({1});
    n.attrs["scan_output_axes"] = attr_ints({-1});
    n.attrs["scan_output_directions"] = attr_ints({out_dir});
    auto s = Session::compile(b.build(), with_providers({"cpu", "ref"}));
    EXPECT_EQ(s->static_shape("y"), (Shape{2, 3}));
    auto out = s->run({{"s0", f32({2}, {0, 0})}, {"x", f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
    EXPECT_EQ(values_of(out.at("s")), (std::vector<double>{6, 15}));
    EXPECT_EQ(values_of(out.at("y")), out_dir ? (std::vector<double>{6, 5, 3, 15, 11, 6})
                                              : (std::vector<double>{3, 5, 6, 6, 11, 15}));
  }
}

TEST(ControlFlow, IfOnAShapeIsInlinedInTheShapesSpecialization) {
  // y = size(x) == 4 ? x + 1 : x * 2 with x of symbolic length: the general plan keeps
  // the If; the plan specialized for a length knows the condition and inlines a branch.
  ModelBuilder then_b(17, "then"), else_b(17, "else");
  then_b.output("t").node("Add", {"x", "one"}, {"t"});
  else_b.output("e").node("Mul", {"x", "two"}, {"e"});
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<DimSpec>{"n"}).output("y");
  b.initializer("one", f32({}, {1})).initializer("two", f32({}, {2})).initializer("four", i64({}, {4}));
  b.node("Size", {"x"}, {"n"});
  b.node("Equal", {"n", "four"}, {"is4"});
  Node& n = b.node("If", {"is4"}, {"y"}, "if");
  n.attrs["then_branch"] = attr_graph(then_b);
  n.attrs["else_branch"] = attr_graph(else_b);
  auto s = Session::compile(b.build(), with_providers({"cpu", "ref"}));
  EXPECT_EQ(s->stats().subgraph_plans, 2);
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(values_of(s->run({{"x", f32({4}, {1, 2, 3, 4})}}).at("y")), (std::vector<double>{2, 3, 4, 5}));
    EXPECT_EQ(values_of(s->run({{"x", f32({2}, {1, 2})}}).at("y")), (std::vector<double>{2, 4}));
  }
  EXPECT_EQ(s->num_specializations(), 2);
  EXPECT_EQ(s->last_run_stats().subgraph_plans, 0);
  EXPECT_EQ(s->last_run_stats().nodes_out, 1);  // x * 2 alone
}
