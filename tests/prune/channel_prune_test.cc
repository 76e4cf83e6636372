// prune_channels on a CNN built here: Conv-BN-Relu, a depthwise Conv, a squeeze-excitation
// block, a residual Add, a Concat, an LRN the analysis does not know, a Flatten into a
// Gemm and a second graph output. The pruned model must run, and its outputs must equal
// those of the original with the removed channels' consumer weights zeroed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "slim/core/error.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/prune/channel_prune.h"
#include "slim/runtime/session.h"

using namespace slim;

namespace {

struct Builder {
  Model m;
  std::mt19937 rng{7};

  Builder() {
    m.ir_version = 8;
    m.opsets[""] = 13;
    m.graph.name = "fixture";
  }
  Tensor random(Shape s, float lo, float hi) {
    Tensor t(DType::f32, s);
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  }
  std::string init(const std::string& name, Tensor t) {
    m.graph.initializers[name] = std::move(t);
    return name;
  }
  Node& node(const std::string& op, const std::string& name, std::vector<std::string> in, std::vector<std::string> out) {
    Node n;
    n.op_type = op;
    n.name = name;
    n.inputs = std::move(in);
    n.outputs = std::move(out);
    m.graph.nodes.push_back(n);
    return m.graph.nodes.back();
  }
  static void ints(Node& n, const std::string& key, std::vector<int64_t> v) {
    Attribute a;
    a.kind = Attribute::Kind::ints;
    a.ints = std::move(v);
    n.attrs[key] = a;
  }
  static void integer(Node& n, const std::string& key, int64_t v) {
    Attribute a;
    a.kind = Attribute::Kind::i;
    a.i = v;
    n.attrs[key] = a;
  }
  std::string conv(const std::string& name, const std::string& x, int64_t cin, int64_t cout, int64_t k,
                   int64_t group = 1, bool bias = false) {
    std::vector<std::string> in = {x, init(name + ".w", random({cout, cin / group, k, k}, -0.5f, 0.5f))};
    if (bias) in.push_back(init(name + ".b", random({cout}, -0.2f, 0.2f)));
    Node& n = node("Conv", name, in, {name + ".out"});
    ints(n, "pads", {k / 2, k / 2, k / 2, k / 2});
    integer(n, "group", group);
    return name + ".out";
  }
  std::string bn(const std::string& name, const std::string& x, int64_t c) {
    node("BatchNormalization", name,
         {x, init(name + ".s", random({c}, 0.5f, 1.5f)), init(name + ".b", random({c}, -0.3f, 0.3f)),
          init(name + ".m", random({c}, -0.2f, 0.2f)), init(name + ".v", random({c}, 0.5f, 2.0f))},
         {name + ".out"});
    return name + ".out";
  }
  std::string unary(const std::string& op, const std::string& name, const std::string& x) {
    node(op, name, {x}, {name + ".out"});
    return name + ".out";
  }
};

// x[1,3,12,12] -> conv1(16)-bn-relu = a -> depthwise(16)-relu = b -> SE(16->8->16) * b = c
// -> conv3(16) + a = e; conv4(8) -> LRN = f; concat(e, f) = h (24) -> conv5(16)-relu = i;
// i -> GAP -> Flatten -> Gemm(10) = y; i -> conv6(4) = aux (a graph output).
Model fixture() {
  Builder b;
  ValueInfo x;
  x.name = "x";
  x.dtype = DType::f32;
  x.shape = std::vector<Dim>{{1, ""}, {3, ""}, {12, ""}, {12, ""}};
  b.m.graph.inputs.push_back(x);
  const auto a = b.unary("Relu", "relu1", b.bn("bn1", b.conv("conv1", "x", 3, 16, 3), 16));
  const auto bb = b.unary("Relu", "relu2", b.conv("dw", a, 16, 16, 3, 16, true));
  const auto gap = b.unary("GlobalAveragePool", "se_gap", bb);
  const auto s1 = b.unary("Relu", "se_relu", b.conv("se1", gap, 16, 8, 1, 1, true));
  const auto gate = b.unary("HardSigmoid", "se_gate", b.conv("se2", s1, 8, 16, 1, 1, true));
  b.node("Mul", "se_mul", {bb, gate}, {"c"});
  b.node("Add", "residual", {b.conv("conv3", "c", 16, 16, 1), a}, {"e"});
  const auto f = b.unary("LRN", "lrn", b.conv("conv4", "e", 16, 8, 3));
  Builder::integer(b.m.graph.nodes.back(), "size", 3);
  Builder::integer(b.node("Concat", "concat", {"e", f}, {"h"}), "axis", 1);
  const auto i = b.unary("Relu", "relu5", b.bn("bn5", b.conv("conv5", "h", 24, 16, 1), 16));
  const auto flat = b.unary("Flatten", "flatten", b.unary("GlobalAveragePool", "gap", i));
  Node& gemm = b.node("Gemm", "fc", {flat, b.init("fc.w", b.random({10, 16}, -0.5f, 0.5f)),
                                     b.init("fc.b", b.random({10}, -0.1f, 0.1f))}, {"y"});
  Builder::integer(gemm, "transB", 1);
  b.node("Conv", "conv6", {i, b.init("conv6.w", b.random({4, 16, 1, 1}, -0.5f, 0.5f))}, {"aux"});
  for (const char* name : {"y", "aux"}) {
    ValueInfo o;
    o.name = name;
    o.dtype = DType::f32;
    b.m.graph.outputs.push_back(o);
  }
  return b.m;
}

Tensor input() {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1);
  Tensor t(DType::f32, {1, 3, 12, 12});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

TensorMap run(const Model& m) {
  SessionOptions so;
  so.num_threads = 1;
  so.winograd = false;
  return Session::compile(m, so)->run({{"x", input()}});
}

const prune::ChannelGroup* group_with(const prune::ChannelPruneReport& r, const std::string& value) {
  for (const auto& g : r.groups)
    for (const auto& v : g.values)
      if (v == value) return &g;
  return nullptr;
}

TEST(ChannelPrune, RemovesCoupledChannelsAndMatchesTheZeroedOriginal) {
  Model m = fixture();
  const Model original = m;
  prune::ChannelPruneOptions o;
  o.target_flops = 0.6;
  o.channel_multiple = 1;
  o.criterion = prune::Criterion::l2;
  o.threads = 1;
  const auto r = prune::prune_channels(m, o);
  EXPECT_TRUE(r.target_reached);
  EXPECT_LE(double(r.macs_after), 0.6 * double(r.macs_before) + 1);
  EXPECT_LT(r.params_after, r.params_before);

  // The residual couples conv1, bn1, the depthwise conv, the SE gate and conv3's output.
  const auto* main = group_with(r, "relu1.out");
  ASSERT_NE(main, nullptr);
  for (const char* v : {"conv1.out", "dw.out", "se_gap.out", "se_gate.out", "c", "conv3.out", "e"})
    EXPECT_NE(std::find(main->values.begin(), main->values.end(), v), main->values.end()) << v;
  EXPECT_TRUE(main->prunable);
  EXPECT_LT(main->kept, 16);
  // Its channels sit at the front of the Concat: the depthwise conv's group follows.
  const Tensor& dw = m.graph.initializers.at("dw.w");
  EXPECT_EQ(dw.shape()[0], main->kept);
  for (const auto& n : m.graph.nodes)
    if (n.name == "dw") EXPECT_EQ(n.attr_int("group", 0), main->kept);
  EXPECT_EQ(m.graph.initializers.at("conv5.w").shape()[1], main->kept + 8);  // conv4's 8 behind the LRN stay
  EXPECT_EQ(m.graph.initializers.at("se2.w").shape()[0], main->kept);
  EXPECT_EQ(m.graph.initializers.at("bn1.v").shape()[0], main->kept);

  // The LRN stops the analysis, with the node named.
  const auto* lrn = group_with(r, "conv4.out");
  ASSERT_NE(lrn, nullptr);
  EXPECT_FALSE(lrn->prunable);
  EXPECT_NE(lrn->reason.find("LRN node 'lrn' is not understood"), std::string::npos) << lrn->reason;
  // conv6's output is a graph output: kept, and said so.
  const auto* aux = group_with(r, "aux");
  ASSERT_NE(aux, nullptr);
  EXPECT_FALSE(aux->prunable);
  EXPECT_NE(aux->reason.find("'aux' is a graph output"), std::string::npos) << aux->reason;
  EXPECT_EQ(m.graph.initializers.at("conv6.w").shape()[0], 4);

  // Exact reference: the original with the removed channels' consumer slices zeroed.
  Model zeroed = original;
  ASSERT_FALSE(r.consumer_slices.empty());
  for (const auto& s : r.consumer_slices) {
    Tensor w = zeroed.graph.initializers.at(s.tensor).clone();
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < s.axis; ++d) outer *= w.shape()[size_t(d)];
    for (int d = s.axis + 1; d < w.rank(); ++d) inner *= w.shape()[size_t(d)];
    const int64_t n = w.shape()[size_t(s.axis)];
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t j : s.indices)
        for (int64_t k = 0; k < inner; ++k) w.data<float>()[(a * n + j) * inner + k] = 0;
    zeroed.graph.initializers[s.tensor] = w;
  }
  const auto want = run(zeroed), got = run(m), before = run(original);
  for (const char* name : {"y", "aux"}) {
    const Tensor &a = want.at(name), &b = got.at(name), &c = before.at(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    double worst = 0, moved = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      worst = std::max(worst, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
      moved = std::max(moved, double(std::fabs(c.data<float>()[i] - b.data<float>()[i])));
    }
    EXPECT_LT(worst, 1e-4) << name;
    EXPECT_GT(moved, 1e-3) << name << ": pruning changed nothing";
  }

  // Written and read back, the file runs the same.
  const auto dir = std::filesystem::temp_directory_path() / ("slim_prune_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  OnnxExporter::save_file(m, (dir / "pruned.onnx").string());
  const auto again = run(OnnxImporter::load_file((dir / "pruned.onnx").string()));
  EXPECT_EQ(again.at("y").shape(), got.at("y").shape());
  for (int64_t i = 0; i < got.at("y").numel(); ++i)
    EXPECT_FLOAT_EQ(again.at("y").data<float>()[i], got.at("y").data<float>()[i]);
  std::filesystem::remove_all(dir);
}

TEST(ChannelPrune, MultiplesAndBiasCorrection) {
  Model m = fixture();
  prune::ChannelPruneOptions o;
  o.target_flops = 0.7;
  o.channel_multiple = 8;
  o.criterion = prune::Criterion::output;
  o.calibration = {{{"x", input()}}};
  o.threads = 1;
  const auto r = prune::prune_channels(m, o);
  for (const auto& g : r.groups)
    if (g.prunable && g.kept < g.channels) EXPECT_EQ(g.kept % 8, 0) << g.values[0];
  EXPECT_GT(r.bias_corrected, 0);
  const auto out = run(m);
  EXPECT_EQ(out.at("y").shape(), (Shape{1, 10}));
}

TEST(ChannelPrune, BadOptions) {
  prune::ChannelPruneOptions o;
  Model m = fixture();
  o.target_flops = 0;
  try {
    prune::prune_channels(m, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("--target-flops must be in (0, 1]"), std::string::npos) << e.what();
  }
  o.target_flops = 0.5;
  o.criterion = prune::Criterion::output;
  try {
    prune::prune_channels(m, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give --calib"), std::string::npos) << e.what();
  }
  EXPECT_THROW(prune::parse_criterion("taylor"), Error);
}

}  // namespace
