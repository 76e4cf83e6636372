// Sessions over the ref provider's kernels: small real networks against a direct
// evaluation in this file, and the shape-computation pattern exporters emit
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), which folds away when shapes are static.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

SessionOptions ref_options() {
  SessionOptions o;
  o.num_threads = 1;
  return o;
}

std::vector<std::string> op_types(const Session& s) {
  std::vector<std::string> ops;
  for (const auto& n : s.compiled_graph().nodes) ops.push_back(n.op_type);
  return ops;
}

}  // namespace

TEST(SessionRef, MlpMatchesDirectEvaluation) {
  std::mt19937 rng(7);
  const int64_t batch = 3, in = 5, hidden = 8, out = 4;
  const auto w1 = random_floats(rng, size_t(in * hidden)), b1 = random_floats(rng, size_t(hidden));
  const auto w2 = random_floats(rng, size_t(hidden * out)), b2 = random_floats(rng, size_t(out));
  const auto x = random_floats(rng, size_t(batch * in));

  ModelBuilder b(13);
  b.input("x", DType::f32, {{"batch", in}}).output("p");
  b.initializer("w1", f32({in, hidden}, w1)).initializer("b1", f32({hidden}, b1));
  b.initializer("w2", f32({hidden, out}, w2)).initializer("b2", f32({out}, b2));
  b.node("MatMul", {"x", "w1"}, {"h0"});
  b.node("Add", {"h0", "b1"}, {"h1"});
  b.node("Relu", {"h1"}, {"h"});
  b.node("MatMul", {"h", "w2"}, {"l0"});
  b.node("Add", {"l0", "b2"}, {"logits"});
  b.node("Softmax", {"logits"}, {"p"}).attrs["axis"] = attr_int(-1);
  auto s = Session::compile(b.build(), ref_options());
  const Tensor p = s->run({{"x", f32({batch, in}, x)}}).at("p");
  ASSERT_EQ(p.shape(), (Shape{batch, out}));

  for (int64_t r = 0; r < batch; ++r) {
    std::vector<double> h(static_cast<size_t>(hidden)), logits(static_cast<size_t>(out));
    for (int64_t j = 0; j < hidden; ++j) {
      double acc = b1[size_t(j)];
      for (int64_t k = 0; k < in; ++k) acc += double(x[size_t(r * in + k)]) * w1[size_t(k * hidden + j)];
      h[size_t(j)] = std::max(0.0, acc);
    }
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j < out; ++j) {
      double acc = b2[size_t(j)];
      for (int64_t k = 0; k < hidden; ++k) acc += h[size_t(k)] * w2[size_t(k * out + j)];
      logits[size_t(j)] = acc;
      mx = std::max(mx, acc);
    }
    for (auto& l : logits) sum += std::exp(l - mx);
    for (int64_t j = 0; j < out; ++j)
      EXPECT_NEAR(p.data<float>()[r * out + j], std::exp(logits[size_t(j)] - mx) / sum, 1e-5)
          << "row " << r << " col " << j;
  }
}

TEST(SessionRef, ExporterShapeArithmeticFoldsWhenStatic) {
  // y = Reshape(Relu(x), [N, 12]) with N read from x's shape, as torch.onnx writes
  // x.view(x.size(0), -1).
  auto build = [](bool symbolic) {
    ModelBuilder b(13);
    if (symbolic)
      b.input("x", DType::f32, {{"n", 3, 4}});
    else
      b.input("x", DType::f32, {{2, 3, 4}});
    b.output("y");
    b.initializer("zero", Tensor::scalar<int64_t>(0));
    b.initializer("axes", i64({1}, {0}));
    b.initializer("rest", i64({1}, {12}));
    b.node("Shape", {"x"}, {"s"});
    b.node("Gather", {"s", "zero"}, {"n"}).attrs["axis"] = attr_int(0);
    b.node("Unsqueeze", {"n", "axes"}, {"n1"});
    b.node("Concat", {"n1", "rest"}, {"target"}).attrs["axis"] = attr_int(0);
    b.node("Relu", {"x"}, {"r"});
    b.node("Reshape", {"r", "target"}, {"y"});
    return b.build();
  };

  auto fixed = Session::compile(build(false), ref_options());
  EXPECT_EQ(op_types(*fixed), (std::vector<std::string>{"Relu", "Reshape"}));
  EXPECT_EQ(fixed->stats().folded_nodes, 4);
  EXPECT_EQ(fixed->static_shape("y"), (Shape{2, 12}));
  ASSERT_TRUE(fixed->compiled_graph().initializers.count("target"));
  EXPECT_EQ(values_of(fixed->compiled_graph().initializers.at("target")),
            (std::vector<double>{2, 12}));

  auto dynamic = Session::compile(build(true), ref_options());
  EXPECT_EQ(dynamic->stats().nodes_out, 6);
  EXPECT_FALSE(dynamic->static_shape("y").has_value());

  std::mt19937 rng(3);
  for (int64_t n : {2, 5}) {
    const auto xs = random_floats(rng, size_t(n * 12));
    const Tensor x = f32({n, 3, 4}, xs);
    const Tensor y = dynamic->run({{"x", x}}).at("y");
    ASSERT_EQ(y.shape(), (Shape{n, 12}));
    for (int64_t i = 0; i < n * 12; ++i) EXPECT_EQ(y.data<float>()[i], std::max(0.f, xs[size_t(i)]));
    if (n == 2) {
      const Tensor yf = fixed->run({{"x", x}}).at("y");
      EXPECT_EQ(values_of(yf), values_of(y));
    }
  }
}

TEST(SessionRef, SmallCnnMatchesDirectEvaluationAndReusesMemory) {
  std::mt19937 rng(11);
  const auto w = random_floats(rng, 2 * 1 * 3 * 3), bias = random_floats(rng, 2);
  const auto gw = random_floats(rng, 3 * 18), gb = random_floats(rng, 3);
  const auto x = random_floats(rng, 36);

  ModelBuilder b(13);
  b.input("x", DType::f32, {{1, 1, 6, 6}}).output("y");
  b.initializer("w", f32({2, 1, 3, 3}, w)).initializer("b", f32({2}, bias));
  b.initializer("gw", f32({3, 18}, gw)).initializer("gb", f32({3}, gb));
  Node& conv = b.node("Conv", {"x", "w", "b"}, {"c"});
  conv.attrs["pads"] = attr_ints({1, 1, 1, 1});
  conv.attrs["kernel_shape"] = attr_ints({3, 3});
  b.node("Relu", {"c"}, {"r"});
  Node& pool = b.node("MaxPool", {"r"}, {"m"});
  pool.attrs["kernel_shape"] = attr_ints({2, 2});
  pool.attrs["strides"] = attr_ints({2, 2});
  b.node("Flatten", {"m"}, {"f"});
  b.node("Gemm", {"f", "gw", "gb"}, {"y"}).attrs["transB"] = attr_int(1);
  // Unfused, so that Conv and Relu outputs are separate values the planner can overlap
  // (fused, the two remaining intermediates are alive together and nothing is reused).
  SessionOptions unfused = ref_options();
  unfused.optimize = false;
  auto s = Session::compile(b.build(), unfused);
  EXPECT_EQ(s->static_shape("m"), (Shape{1, 2, 3, 3}));
  EXPECT_EQ(s->static_shape("y"), (Shape{1, 3}));
  EXPECT_GT(s->stats().memory.reuse_rate(), 0.0);
  EXPECT_EQ(s->stats().memory.dynamic_values, 0);

  // Direct evaluation.
  std::vector<double> r(2 * 36), m(18);
  for (int oc = 0; oc < 2; ++oc)
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j) {
        double acc = bias[size_t(oc)];
        for (int ki = 0; ki < 3; ++ki)
          for (int kj = 0; kj < 3; ++kj) {
            const int yi = i + ki - 1, xj = j + kj - 1;
            if (yi < 0 || yi >= 6 || xj < 0 || xj >= 6) continue;
            acc += double(x[size_t(yi * 6 + xj)]) * w[size_t(oc * 9 + ki * 3 + kj)];
          }
        r[size_t(oc * 36 + i * 6 + j)] = std::max(0.0, acc);
      }
  for (int oc = 0; oc < 2; ++oc)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        double mx = -1e30;
        for (int di = 0; di < 2; ++di)
          for (int dj = 0; dj < 2; ++dj)
            mx = std::max(mx, r[size_t(oc * 36 + (2 * i + di) * 6 + 2 * j + dj)]);
        m[size_t(oc * 9 + i * 3 + j)] = mx;
      }
  for (int rep = 0; rep < 2; ++rep) {
    const Tensor y = s->run({{"x", f32({1, 1, 6, 6}, x)}}).at("y");
    ASSERT_EQ(y.shape(), (Shape{1, 3}));
    for (int o = 0; o < 3; ++o) {
      double acc = gb[size_t(o)];
      for (int k = 0; k < 18; ++k) acc += m[size_t(k)] * gw[size_t(o * 18 + k)];
      EXPECT_NEAR(y.data<float>()[o], acc, 1e-5) << "output " << o;
    }
  }
}
