// The cpu provider's contrib-op kernels against ref on every instruction set the CPU runs.
// MatMulNBits: block sizes 16-128, K not a multiple of the block, N not a multiple of 16,
// zero points packed, as floats or absent, bias, 1-9 rows of A, float and int8
// (accuracy_level 4) forms. The Gelu variants and Skip(Simplified)LayerNormalization: row
// lengths with and without vector tails, skips with fewer leading dims, every output.
// ContribOps (contrib_ops_test.cc) holds both providers to ONNX Runtime's outputs.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/cpu_test_util.h"
#include "slim/core/cpu_features.h"

namespace slim {
namespace {

using cpu_test::cpu_decline_reason;
using cpu_test::expect_matches_ref;
using cpu_test::for_each_isa;
using cpu_test::random_f32;
using cpu_test::spec;
using testing::attr_float;
using testing::attr_int;
using testing::ModelBuilder;

Tensor random_bytes(const Shape& shape, uint64_t seed) {
  Tensor t(DType::u8, shape);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = uint8_t(rng());
  return t;
}

enum class Zp { none, packed, floats };

struct NBitsCase {
  Shape a;  // (..., K)
  int64_t n, block;
  Zp zp = Zp::none;
  bool bias = false;
  int64_t accuracy = 0;
  int64_t bits = 4;
};

Model nbits_model(const NBitsCase& c, bool constant_b = true) {
  const int64_t k = c.a.back(), k_blocks = (k + c.block - 1) / c.block;
  ModelBuilder b;
  b.opset("com.microsoft", 1).input("A", DType::f32, spec(c.a)).output("Y");
  const Tensor w = random_bytes({c.n, k_blocks, c.block * c.bits / 8}, uint64_t(k * 31 + c.n));
  if (constant_b) b.initializer("B", w);
  else b.input("B", DType::u8, spec(w.shape()));
  b.initializer("scales", random_f32({c.n * k_blocks}, 7, 0.01f, 0.1f));
  std::vector<std::string> in = {"A", "B", "scales", ""};
  if (c.zp == Zp::packed) b.initializer("zp", random_bytes({c.n, (k_blocks + 1) / 2}, 11));
  if (c.zp == Zp::floats) b.initializer("zp", random_f32({c.n * k_blocks}, 13, 0.f, 15.f));
  if (c.zp != Zp::none) in[3] = "zp";
  if (c.bias) {
    b.initializer("bias", random_f32({c.n}, 17));
    in.insert(in.end(), {"", "bias"});
  }
  while (in.back().empty()) in.pop_back();
  Node& node = b.node("MatMulNBits", in, {"Y"}, "nbits", "com.microsoft");
  node.attrs["K"] = attr_int(k);
  node.attrs["N"] = attr_int(c.n);
  node.attrs["block_size"] = attr_int(c.block);
  node.attrs["bits"] = attr_int(c.bits);
  if (c.accuracy) node.attrs["accuracy_level"] = attr_int(c.accuracy);
  return b.build();
}

const std::vector<NBitsCase> kCases = {
    {{1, 64}, 16, 32},
    {{3, 64}, 24, 32, Zp::packed},
    {{5, 100}, 33, 32, Zp::packed, true},
    {{2, 70}, 17, 16, Zp::floats},
    {{9, 192}, 40, 64, Zp::packed, true},
    {{2, 3, 300}, 48, 128},
    {{4, 256}, 64, 32, Zp::packed},
};

TEST(CpuKernels, MatMulNBitsFloatFormMatchesRef) {
  for_each_isa([] {
    for (const NBitsCase& c : kCases) {
      SCOPED_TRACE("A " + shape_str(c.a) + " N " + std::to_string(c.n) + " block " + std::to_string(c.block));
      expect_matches_ref(nbits_model(c), {{"A", random_f32(c.a, 3)}}, "nbits");
    }
  });
}

TEST(CpuKernels, MatMulNBitsInt8FormMatchesRef) {
  for_each_isa([] {
    for (NBitsCase c : kCases) {
      c.accuracy = 4;
      SCOPED_TRACE("A " + shape_str(c.a) + " N " + std::to_string(c.n) + " block " + std::to_string(c.block));
      expect_matches_ref(nbits_model(c), {{"A", random_f32(c.a, 5, -3.f, 3.f)}}, "nbits");
    }
  });
}

TEST(CpuKernels, MatMulNBitsDeclinesWhatItDoesNotImplement) {
  NBitsCase c{{2, 64}, 16, 32};
  c.bits = 8;
  EXPECT_EQ(cpu_decline_reason(nbits_model(c), "nbits"), "only 4-bit weights are implemented");
  EXPECT_EQ(cpu_decline_reason(nbits_model({{2, 64}, 16, 32}, false), "nbits"), "input 1 is not a constant");
}


Model contrib_model(const std::string& op, const std::vector<std::pair<std::string, Shape>>& inputs,
                    const std::vector<std::string>& outputs, std::map<std::string, Attribute> attrs = {}) {
  ModelBuilder b;
  b.opset("com.microsoft", 1);
  std::vector<std::string> names;
  for (const auto& [name, shape] : inputs) {
    if (!name.empty()) b.input(name, DType::f32, spec(shape));
    names.push_back(name);
  }
  for (const std::string& o : outputs)
    if (!o.empty()) b.output(o);
  b.node(op, names, outputs, "n", "com.microsoft").attrs = std::move(attrs);
  return b.build();
}

// expect_matches_ref with the tensors of `all` the model takes as inputs.
void check(const Model& m, const TensorMap& all) {
  TensorMap in;
  for (const ValueInfo& v : m.graph.inputs) in[v.name] = all.at(v.name);
  expect_matches_ref(m, in, "n");
}

TEST(CpuKernels, ContribActivationsMatchRef) {
  for_each_isa([] {
    for (int64_t h : {1, 7, 16, 33, 100}) {
      SCOPED_TRACE("last dim " + std::to_string(h));
      const Shape x{3, h};
      const TensorMap in = {{"x", random_f32(x, uint64_t(h), -4.f, 4.f)}, {"b", random_f32({h}, 9)}};
      check(contrib_model("Gelu", {{"x", x}}, {"y"}), in);
      check(contrib_model("BiasGelu", {{"x", x}, {"b", {h}}}, {"y"}), in);
      check(contrib_model("FastGelu", {{"x", x}}, {"y"}), in);
      check(contrib_model("FastGelu", {{"x", x}, {"b", {h}}}, {"y"}), in);
      check(contrib_model("QuickGelu", {{"x", x}}, {"y"}, {{"alpha", attr_float(1.3f)}}), in);
    }
  });
}

TEST(CpuKernels, ContribSkipNormsMatchRef) {
  for_each_isa([] {
    for (int64_t h : {1, 5, 16, 40}) {
      SCOPED_TRACE("hidden " + std::to_string(h));
      const Shape x{2, 3, h};
      TensorMap in = {{"x", random_f32(x, 1, -2.f, 2.f)}, {"s", random_f32(x, 2)}, {"s2", random_f32({3, h}, 3)},
                      {"g", random_f32({h}, 4)}, {"be", random_f32({h}, 5)}, {"bi", random_f32({h}, 6)}};
      const std::map<std::string, Attribute> eps = {{"epsilon", attr_float(1e-5f)}};
      check(contrib_model("SkipLayerNormalization", {{"x", x}, {"s", x}, {"g", {h}}, {"be", {h}}, {"bi", {h}}},
                                       {"y", "mean", "inv", "sum"}, eps), in);
      check(contrib_model("SkipLayerNormalization", {{"x", x}, {"s2", {3, h}}, {"g", {h}}}, {"y"}, eps), in);
      check(contrib_model("SkipSimplifiedLayerNormalization", {{"x", x}, {"s", x}, {"g", {h}}, {"bi", {h}}},
                                       {"y", "", "inv", "sum"}, eps), in);
    }
  });
}

}  // namespace
}  // namespace slim
