// View-only nodes (Reshape, Squeeze, Unsqueeze, Flatten, Identity, inference Dropout):
// compile turns them into views, no kernel runs, and what they return is right and owned
// by the caller, with the cpu provider and with ref alone.
#include <gtest/gtest.h>

#include <set>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

SessionOptions with(std::vector<std::string> providers) {
  SessionOptions o;
  o.providers = std::move(providers);
  o.num_threads = 1;
  return o;
}

const std::vector<std::vector<std::string>> kProviderSets = {{"cpu", "ref"}, {"ref"}};

std::string providers_name(const std::vector<std::string>& p) {
  std::string s;
  for (const auto& x : p) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The ops the profiler saw in one run.
std::multiset<std::string> ops_run(Session& s, const TensorMap& in) {
  std::multiset<std::string> ops;
  s.set_profiler([&](const Node& n, const std::string&, auto, auto) { ops.insert(n.op_type); });
  s.run(in);
  s.set_profiler(nullptr);
  return ops;
}

}  // namespace

TEST(SessionViews, ViewNodesRunNoKernelAndKeepWhatTheyViewAlive) {
  for (const auto& providers : kProviderSets) {
    SCOPED_TRACE(providers_name(providers));
    // r is planned; v views it through four view nodes and is read last, after several
    // more values of r's size were written: r's bytes must stay reserved until then.
    ModelBuilder b;
    b.input("x", DType::f32, {{2, 3}}).output("y");
    b.initializer("axes", i64({1}, {0}));
    b.initializer("shape", i64({2}, {3, 2}));
    b.node("Relu", {"x"}, {"r"});
    b.node("Unsqueeze", {"r", "axes"}, {"u"});
    b.node("Flatten", {"u"}, {"f"}).attrs["axis"] = attr_int(2);
    b.node("Identity", {"f"}, {"i"});
    b.node("Reshape", {"i", "shape"}, {"v"});
    b.node("Add", {"x", "x"}, {"a1"});
    b.node("Add", {"a1", "x"}, {"a2"});
    b.node("Reshape", {"a2", "shape"}, {"a3"});
    b.node("Add", {"a3", "v"}, {"y"});
    auto s = Session::compile(b.build(), with(providers));
    EXPECT_GT(s->stats().memory.planned_values, 0);
    for (const auto& a : s->partition())
      if (a.op != "Add" && a.op != "Relu") EXPECT_EQ(a.provider, providers[0]) << a.node;
    for (float sign : {1.f, -1.f}) {
      const TensorMap in{{"x", f32({2, 3}, {sign * 1, -2, 3, -4, 5, sign * -6})}};
      const std::vector<double> want = {sign > 0 ? 4.0 : -3.0, -6, 12, -12, 20, sign > 0 ? -18.0 : 24.0};
      EXPECT_EQ(values_of(s->run(in).at("y")), want);
      EXPECT_EQ(s->run(in).at("y").shape(), (Shape{3, 2}));
      EXPECT_EQ(ops_run(*s, in), (std::multiset<std::string>{"Relu", "Add", "Add", "Add"}));
    }
  }
}

TEST(SessionViews, ViewsOfOutputsInputsAndConstantsReturnOwnedTensors) {
  for (const auto& providers : kProviderSets) {
    SCOPED_TRACE(providers_name(providers));
    ModelBuilder b;
    b.input("x", DType::f32, {{4}}).output("r").output("v").output("i").output("k").output("d");
    b.initializer("w", f32({4}, {1, 2, 3, 4}));
    b.initializer("shape", i64({2}, {2, 2}));
    b.node("Relu", {"x"}, {"r"});
    b.node("Reshape", {"r", "shape"}, {"v"});  // a view of another graph output
    b.node("Identity", {"x"}, {"i"});          // of the caller's input
    b.node("Reshape", {"w", "shape"}, {"k"});  // of a constant
    b.node("Dropout", {"r"}, {"d"});           // inference: the same elements
    SessionOptions o = with(providers);
    o.fold_constants = false;  // keep the Reshape of the initializer a node
    o.optimize = false;        // and the Dropout
    auto s = Session::compile(b.build(), o);
    EXPECT_EQ(ops_run(*s, {{"x", f32({4}, {1, 1, 1, 1})}}), (std::multiset<std::string>{"Relu"}));

    const Tensor x = f32({4}, {1, -2, 3, -4});
    TensorMap first = s->run({{"x", x}});
    EXPECT_EQ(values_of(first.at("r")), (std::vector<double>{1, 0, 3, 0}));
    EXPECT_EQ(values_of(first.at("v")), (std::vector<double>{1, 0, 3, 0}));
    EXPECT_EQ(first.at("v").shape(), (Shape{2, 2}));
    EXPECT_EQ(values_of(first.at("i")), (std::vector<double>{1, -2, 3, -4}));
    EXPECT_EQ(values_of(first.at("k")), (std::vector<double>{1, 2, 3, 4}));
    EXPECT_EQ(values_of(first.at("d")), (std::vector<double>{1, 0, 3, 0}));
    // No two outputs share memory, nor any output the input's or the constant's.
    std::set<const void*> seen{x.raw_data()};
    for (const auto& [name, t] : first) EXPECT_TRUE(seen.insert(t.raw_data()).second) << name;
    for (auto& [name, t] : first) t.data<float>()[0] = 100;
    EXPECT_EQ(x.data<float>()[0], 1);

    const TensorMap second = s->run({{"x", f32({4}, {5, 6, -7, 8})}});
    EXPECT_EQ(values_of(second.at("v")), (std::vector<double>{5, 6, 0, 8}));
    EXPECT_EQ(values_of(second.at("k")), (std::vector<double>{1, 2, 3, 4}));
    EXPECT_EQ(values_of(first.at("r")), (std::vector<double>{100, 0, 3, 0}));
  }
}

TEST(SessionViews, IdentityOfADynamicShapeIsAView) {
  for (const auto& providers : kProviderSets) {
    SCOPED_TRACE(providers_name(providers));
    ModelBuilder b;
    b.input("x", DType::f32, {{"n", 2}}).output("y").output("z");
    // i is read after r's last reader: it keeps r alive.
    b.node("Relu", {"x"}, {"r"});
    b.node("Identity", {"r"}, {"i"});
    b.node("Relu", {"x"}, {"r2"});
    b.node("Add", {"i", "r2"}, {"y"});
    b.node("Identity", {"i"}, {"z"});
    SessionOptions o = with(providers);
    o.shape_specializations = 0;  // run the plan with the symbolic dim
    o.optimize = false;           // keep the Identity that is no graph output
    auto s = Session::compile(b.build(), o);
    for (int64_t n : {1, 3}) {
      std::vector<float> v;
      for (int64_t k = 0; k < 2 * n; ++k) v.push_back(float(k % 2 ? k : -k));
      const TensorMap in{{"x", f32({n, 2}, v)}};
      const TensorMap out = s->run(in);
      std::vector<double> r;
      for (float e : v) r.push_back(std::max(e, 0.f));
      std::vector<double> twice = r;
      for (double& e : twice) e *= 2;
      EXPECT_EQ(values_of(out.at("y")), twice);
      EXPECT_EQ(values_of(out.at("z")), r);
      EXPECT_EQ(out.at("z").shape(), (Shape{n, 2}));
      EXPECT_EQ(ops_run(*s, in), (std::multiset<std::string>{"Relu", "Relu", "Add"}));
    }
  }
}
