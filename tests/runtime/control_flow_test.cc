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
