// Model-local functions (IR version 8) are inlined at load.
#include "onnx/onnx_test_util.h"

using namespace slim;
using namespace slim::test;
using AP = onnx::AttributeProto;

namespace {

// com.example.ScaledRelu(X, B) -> (Y, T): T = Add(X, B); Y = LeakyRelu(T, alpha=@alpha).
onnx::FunctionProto* add_scaled_relu(onnx::ModelProto& m) {
  auto* f = m.add_functions();
  f->set_domain("com.example");
  f->set_name("ScaledRelu");
  f->add_input("X");
  f->add_input("B");
  f->add_output("Y");
  f->add_output("T");
  f->add_attribute("alpha");
  auto* op = f->add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* add = f->add_node();
  add->set_op_type("Add");
  add->add_input("X");
  add->add_input("B");
  add->add_output("T");
  auto* relu = f->add_node();
  relu->set_op_type("LeakyRelu");
  relu->set_name("act");
  relu->add_input("T");
  relu->add_output("Y");
  auto* alpha = relu->add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(AP::FLOAT);
  alpha->set_ref_attr_name("alpha");
  auto* dom = m.add_opset_import();
  dom->set_domain("com.example");
  dom->set_version(1);
  return f;
}

onnx::NodeProto* call(onnx::GraphProto* g, const std::string& name, std::vector<std::string> in,
                      std::vector<std::string> out, std::optional<float> alpha) {
  auto* n = add_node(g, "ScaledRelu", in, out, name);
  n->set_domain("com.example");
  if (alpha) {
    auto* a = n->add_attribute();
    a->set_name("alpha");
    a->set_type(AP::FLOAT);
    a->set_f(*alpha);
  }
  return n;
}

}  // namespace

TEST(OnnxFunctions, CallsAreInlinedWithFreshNamesAndCallerAttributes) {
  auto m = make_model();
  add_scaled_relu(m);
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_initializer(g, "b", {2}, {1, 2});
  call(g, "first", {"x", "b"}, {"h"}, 0.5f);
  call(g, "second", {"h", "b"}, {"y", "t2"}, std::nullopt);
  add_output(g, "y");
  add_output(g, "t2");
  Model model = load(m);
  ASSERT_EQ(model.graph.nodes.size(), 4u);
  const auto& n = model.graph.nodes;
  EXPECT_EQ(n[0].op_type, "Add");
  EXPECT_EQ(n[0].name, "first/Add_0");
  EXPECT_EQ(n[0].inputs, (std::vector<std::string>{"x", "b"}));
  EXPECT_EQ(n[0].outputs, std::vector<std::string>{"first/T"});  // unused output: fresh name
  EXPECT_EQ(n[1].op_type, "LeakyRelu");
  EXPECT_EQ(n[1].name, "first/act");
  EXPECT_EQ(n[1].inputs, std::vector<std::string>{"first/T"});
  EXPECT_EQ(n[1].outputs, std::vector<std::string>{"h"});
  EXPECT_EQ(n[1].attr_float("alpha", -1), 0.5f);
  EXPECT_EQ(n[2].inputs, (std::vector<std::string>{"h", "b"}));
  EXPECT_EQ(n[2].outputs, std::vector<std::string>{"t2"});
  EXPECT_EQ(n[3].inputs, std::vector<std::string>{"t2"});
  EXPECT_EQ(n[3].outputs, std::vector<std::string>{"y"});
  // The second call sets no alpha: the attribute stays unset (LeakyRelu's default).
  EXPECT_FALSE(n[3].has_attr("alpha"));
  EXPECT_EQ(model.opset("com.example"), 1);
}

TEST(OnnxFunctions, NestedCallsAndCallsInsideSubgraphs) {
  auto m = make_model();
  add_scaled_relu(m);
  // com.example.Twice(A) -> Z: two ScaledRelu calls with A as both inputs.
  auto* f = m.add_functions();
  f->set_domain("com.example");
  f->set_name("Twice");
  f->add_input("A");
  f->add_output("Z");
  for (auto [in, out] : {std::pair{"A", "M"}, {"M", "Z"}}) {
    auto* n = f->add_node();
    n->set_op_type("ScaledRelu");
    n->set_domain("com.example");
    n->add_input(in);
    n->add_input(in);
    n->add_output(out);
  }
  auto* g = m.mutable_graph();
  add_input(g, "cond", {}, onnx::TensorProto::BOOL);
  add_input(g, "x");
  auto* tw = add_node(g, "Twice", {"x"}, {"y"}, "tw");
  tw->set_domain("com.example");
  auto* iff = add_node(g, "If", {"cond"}, {"z"}, "if");
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* a = iff->add_attribute();
    a->set_name(branch);
    a->set_type(AP::GRAPH);
    auto* sub = a->mutable_g();
    call(sub, std::string(branch) + "_call", {"y", "x"}, {std::string(branch) + "_out"}, 0.1f);
    add_output(sub, std::string(branch) + "_out");
  }
  add_output(g, "z");
  Model model = load(m);
  // Twice -> 2 calls -> 4 nodes, then the If.
  ASSERT_EQ(model.graph.nodes.size(), 5u);
  EXPECT_EQ(model.graph.nodes[0].op_type, "Add");
  EXPECT_EQ(model.graph.nodes[0].inputs, (std::vector<std::string>{"x", "x"}));
  EXPECT_EQ(model.graph.nodes[3].outputs, std::vector<std::string>{"y"});
  const Graph& then_g = *model.graph.nodes[4].attr("then_branch")->g;
  ASSERT_EQ(then_g.nodes.size(), 2u);
  EXPECT_EQ(then_g.nodes[0].inputs, (std::vector<std::string>{"y", "x"}));
  EXPECT_EQ(then_g.nodes[1].outputs, std::vector<std::string>{"then_branch_out"});
  EXPECT_EQ(then_g.nodes[1].attr_float("alpha", 0), 0.1f);
}

TEST(OnnxFunctions, BadFunctionsAreInvalid) {
  {
    auto m = make_model();
    auto* f = m.add_functions();
    f->set_domain("com.example");
    f->set_name("Loop");
    f->add_input("A");
    f->add_output("B");
    auto* n = f->add_node();
    n->set_op_type("Loop");
    n->set_domain("com.example");
    n->add_input("A");
    n->add_output("B");
    auto* g = m.mutable_graph();
    add_input(g, "x");
    add_node(g, "Loop", {"x"}, {"y"}, "l")->set_domain("com.example");
    add_output(g, "y");
    expect_load_error(m, ErrorCode::invalid_model, {"test.onnx", "function 'com.example.Loop' calls itself"});
  }
  {
    auto m = make_model();
    add_scaled_relu(m)->mutable_node(0)->set_input(1, "outer");
    auto* g = m.mutable_graph();
    add_input(g, "x");
    add_input(g, "outer");
    call(g, "c", {"x", "x"}, {"y"}, 1.f);
    add_output(g, "y");
    expect_load_error(m, ErrorCode::invalid_model,
                      {"node 'c'", "reads 'outer'", "neither a function input nor produced"});
  }
  {
    auto m = make_model();
    add_scaled_relu(m);
    auto* g = m.mutable_graph();
    add_input(g, "x");
    call(g, "c", {"x", "x", "x"}, {"y"}, 1.f);
    add_output(g, "y");
    expect_load_error(m, ErrorCode::invalid_model, {"node 'c'", "passes 3 inputs, the function takes 2"});
  }
  {
    auto m = make_model();
    add_scaled_relu(m)->mutable_opset_import(0)->set_version(18);
    auto* g = m.mutable_graph();
    add_input(g, "x");
    call(g, "c", {"x", "x"}, {"y"}, 1.f);
    add_output(g, "y");
    expect_load_error(m, ErrorCode::unsupported, {"function 'ScaledRelu' imports opset 18", "model opset 17"});
  }
  {
    auto m = make_model();
    add_scaled_relu(m);
    add_scaled_relu(m);
    m.mutable_opset_import()->RemoveLast();
    expect_load_error(m, ErrorCode::invalid_model, {"'com.example.ScaledRelu' is defined twice"});
  }
}

TEST(OnnxFunctions, ExponentialExpansionIsRefused) {
  // F0 calls F1 twice, F1 calls F2 twice, ...: 2^40 nodes if expanded.
  auto m = make_model();
  auto* dom = m.add_opset_import();
  dom->set_domain("com.example");
  dom->set_version(1);
  constexpr int kLevels = 40;
  for (int level = 0; level < kLevels; ++level) {
    auto* f = m.add_functions();
    f->set_domain("com.example");
    f->set_name("F" + std::to_string(level));
    f->add_input("A");
    f->add_output("C");
    for (auto [in, out] : {std::pair{"A", "B"}, {"B", "C"}}) {
      auto* n = f->add_node();
      n->set_op_type(level + 1 < kLevels ? "F" + std::to_string(level + 1) : "Relu");
      n->set_domain(level + 1 < kLevels ? "com.example" : "");
      n->add_input(in);
      n->add_output(out);
    }
  }
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "F0", {"x"}, {"y"}, "root")->set_domain("com.example");
  add_output(g, "y");
  expect_load_error(m, ErrorCode::resource_exhausted, {"test.onnx", "would create more than"});
}
