// Weight-only int4 (QuantizeOptions::int4_nodes, src/quant/nbits.cc): a MatMul and a Gemm
// (transB, bias) built here are written as com.microsoft MatMulNBits in ONNX Runtime's
// layout; the codes, scales and zero points are read back from the file, each weight is
// within half a step of the float one, and slim's cpu and ref kernels give x · W' (W' the
// weights as the file stores them), computed here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "forest/forest_fixtures.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/quant/quantizer.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::quant;
using slim::forest::testing::env_or;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kIn = 40, kHidden = 24, kOut = 8;  // K = 40: a full block of 32 and a part

fs::path scratch() {
  return slim::forest::testing::scratch_dir("quant_int4_");
}

Tensor random(Shape shape, std::mt19937& rng, float sd) {
  std::normal_distribution<float> g(0.0f, sd);
  Tensor t(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = g(rng);
  return t;
}

// x [n, 40] -> MatMul "mm" (W [40, 24]) -> Gemm "gemm" (transB, W [8, 24], C [8]) -> y.
std::string write_model(const fs::path& dir) {
  std::mt19937 rng(7);
  Model m;
  m.ir_version = 8;
  m.opsets[""] = 13;
  Graph& g = m.graph;
  g.inputs.push_back(
      ValueInfo{"x", DType::f32, std::vector<Dim>{Dim{-1, "n"}, Dim{kIn, ""}}, "float"});
  Tensor w1 = random({kIn, kHidden}, rng, 0.3f);
  for (int64_t c = 0; c < kHidden; ++c) w1.data<float>()[c] = std::fabs(w1.data<float>()[c]) + 1;
  g.initializers["w1"] = w1;  // row 0 > 0: blocks whose minimum is above 0
  g.initializers["w2"] = random({kOut, kHidden}, rng, 0.3f);
  g.initializers["c2"] = random({kOut}, rng, 1.0f);
  g.nodes.push_back(Node{"mm", "MatMul", "", {"x", "w1"}, {"h"}, {}});
  Node gemm{"gemm", "Gemm", "", {"h", "w2", "c2"}, {"y"}, {}};
  Attribute t;
  t.kind = Attribute::Kind::i;
  t.i = 1;
  gemm.attrs["transB"] = t;
  g.nodes.push_back(gemm);
  g.outputs.push_back(
      ValueInfo{"y", DType::f32, std::vector<Dim>{Dim{-1, "n"}, Dim{kOut, ""}}, "float"});
  const std::string path = (dir / "mlp.onnx").string();
  OnnxExporter::save_file(m, path);
  return path;
}

// The (N, K) weights a MatMulNBits node stores: (code − zero point) · scale.
std::vector<double> stored_weights(const Model& m, const Node& n) {
  const int64_t k = n.attr_int("K", 0), cols = n.attr_int("N", 0), block = n.attr_int("block_size", 0);
  const int64_t k_blocks = (k + block - 1) / block;
  const Tensor& b = m.graph.initializers.at(n.inputs[1]);
  const Tensor& s = m.graph.initializers.at(n.inputs[2]);
  const Tensor& z = m.graph.initializers.at(n.inputs[3]);
  EXPECT_EQ(b.dtype(), DType::u8);
  EXPECT_EQ(b.shape(), (Shape{cols, k_blocks, block / 2}));
  EXPECT_EQ(s.numel(), cols * k_blocks);
  EXPECT_EQ(z.numel(), cols * ((k_blocks + 1) / 2));
  std::vector<double> w(size_t(cols * k));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t p = 0; p < k; ++p) {
      const int64_t kb = p / block, i = p % block;
      const uint8_t byte = b.data<uint8_t>()[(j * k_blocks + kb) * (block / 2) + i / 2];
      const uint8_t zb = z.data<uint8_t>()[j * ((k_blocks + 1) / 2) + kb / 2];
      const int q = i % 2 ? byte >> 4 : byte & 15, zp = kb % 2 ? zb >> 4 : zb & 15;
      w[size_t(j * k + p)] = (q - zp) * double(s.data<float>()[j * k_blocks + kb]);
    }
  return w;
}

}  // namespace

TEST(Int4, WritesMatMulNBitsThatSlimRunsAsStored) {
  const fs::path d = scratch();
  const std::string model = write_model(d);
  std::mt19937 rng(3);
  fs::create_directories(d / "calib");
  const Tensor x = random({16, kIn}, rng, 1.0f);
  write_npy((d / "calib" / "x.npy").string(), x);
  const Model probe = OnnxImporter::load_file(model);
  const SampleSet calib = SampleSet::open((d / "calib").string(), probe.graph.inputs);
  QuantizeOptions o;
  o.int4_nodes = {"mm", "gemm"};
  const std::string out = (d / "int4.onnx").string();
  const QuantizeReport rep = quantize_model(model, out, calib, o);
  EXPECT_EQ(rep.int4_weights, 2);
  EXPECT_EQ(rep.weights_quantized, 0);  // nothing in int8

  const Model q = OnnxImporter::load_file(out);
  ASSERT_EQ(q.graph.nodes.size(), 3u);
  const Node& mm = q.graph.nodes[0];
  const Node& gemm = q.graph.nodes[1];
  EXPECT_EQ(mm.name, "mm");
  EXPECT_EQ(mm.op_type, "MatMulNBits");
  EXPECT_EQ(mm.domain, "com.microsoft");
  EXPECT_EQ(mm.attr_int("K", 0), kIn);
  EXPECT_EQ(mm.attr_int("N", 0), kHidden);
  EXPECT_EQ(mm.attr_int("bits", 0), 4);
  EXPECT_EQ(mm.attr_int("block_size", 0), 32);
  EXPECT_EQ(gemm.op_type, "MatMulNBits");
  EXPECT_EQ(gemm.attr_int("K", 0), kHidden);
  EXPECT_EQ(gemm.attr_int("N", 0), kOut);
  EXPECT_EQ(q.graph.nodes[2].op_type, "Add");  // the Gemm's C
  EXPECT_EQ(q.graph.nodes[2].outputs[0], "y");
  EXPECT_EQ(q.opset("com.microsoft"), 1);
  EXPECT_EQ(q.graph.initializers.count("w1"), 0u);
  EXPECT_EQ(q.graph.initializers.count("w2"), 0u);

  // Every stored weight is within half a step of the float one.
  const std::vector<double> w1 = stored_weights(q, mm), w2 = stored_weights(q, gemm);
  const Tensor& f1 = probe.graph.initializers.at("w1");
  const Tensor& f2 = probe.graph.initializers.at("w2");
  const Tensor& s1 = q.graph.initializers.at(mm.inputs[2]);
  for (int64_t j = 0; j < kHidden; ++j)
    for (int64_t p = 0; p < kIn; ++p) {
      const double step = s1.data<float>()[j * 2 + p / 32];
      EXPECT_LE(std::fabs(w1[size_t(j * kIn + p)] - f1.data<float>()[p * kHidden + j]),
                0.5 * step + 1e-6)
          << j << " " << p;
    }
  for (int64_t j = 0; j < kOut; ++j)
    for (int64_t p = 0; p < kHidden; ++p)
      EXPECT_NEAR(w2[size_t(j * kHidden + p)], f2.data<float>()[j * kHidden + p], 0.1);

  // x · W1' then · W2'ᵀ + C, in double, against slim's kernels.
  const Tensor& c2 = probe.graph.initializers.at("c2");
  std::vector<double> want(size_t(16 * kOut));
  for (int64_t r = 0; r < 16; ++r) {
    std::vector<double> h(size_t(kHidden), 0.0);
    for (int64_t j = 0; j < kHidden; ++j)
      for (int64_t p = 0; p < kIn; ++p)
        h[size_t(j)] += double(x.data<float>()[r * kIn + p]) * w1[size_t(j * kIn + p)];
    for (int64_t j = 0; j < kOut; ++j) {
      double acc = c2.data<float>()[j];
      for (int64_t p = 0; p < kHidden; ++p) acc += h[size_t(p)] * w2[size_t(j * kHidden + p)];
      want[size_t(r * kOut + j)] = acc;
    }
  }
  for (const std::vector<std::string>& providers :
       {std::vector<std::string>{"cpu", "ref"}, std::vector<std::string>{"ref"}}) {
    SessionOptions so;
    so.providers = providers;
    const Tensor y = Session::compile(q, so)->run({{"x", x}}).at("y").contiguous();
    ASSERT_EQ(y.shape(), (Shape{16, kOut}));
    for (int64_t i = 0; i < y.numel(); ++i)
      EXPECT_NEAR(y.data<float>()[i], want[size_t(i)], 1e-4 * (1 + std::fabs(want[size_t(i)])))
          << providers[0] << " " << i;
  }
}

TEST(Int4, RefusesWhatHasNoKernel) {
  const fs::path d = scratch();
  const std::string model = write_model(d);
  std::mt19937 rng(3);
  fs::create_directories(d / "calib");
  write_npy((d / "calib" / "x.npy").string(), random({4, kIn}, rng, 1.0f));
  const SampleSet calib =
      SampleSet::open((d / "calib").string(), OnnxImporter::load_file(model).graph.inputs);
  const auto message = [&](QuantizeOptions o) -> std::string {
    try {
      quantize_model(model, (d / "bad.onnx").string(), calib, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  QuantizeOptions o;
  o.int4_nodes = {"nope"};
  EXPECT_NE(message(o).find("no node 'nope' to make int4"), std::string::npos) << message(o);
  o.int4_nodes = {"mm"};
  o.int4_block = 24;
  EXPECT_NE(message(o).find("power of two"), std::string::npos) << message(o);
}
