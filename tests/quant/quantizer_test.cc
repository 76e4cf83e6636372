// quantize_model end to end on the fixture models: the QDQ graph it writes (weights,
// biases, shared scales, dropped activations, everything else of the file kept), the
// calibration cache, SmoothQuant, bias correction, and the quantized model's accuracy.
#include "slim/quant/quantizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"
#include "slim/onnx/importer.h"
#include "slim/quant/evaluate.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::quant;
using slim::forest::testing::env_or;
using slim::forest::testing::fixture_dir;
using slim::forest::testing::read_text;
namespace fs = std::filesystem;

namespace {

std::string models() {
  return fixture_dir("quant_fixtures.py") + "/models/";
}

fs::path scratch(const std::string& name) {
  return slim::forest::testing::scratch_dir("quantizer_" + name);
}

SampleSet samples(const std::string& model, const std::string& part) {
  const Model m = OnnxImporter::load_file(models() + model + ".onnx");
  return SampleSet::open(models() + model + "_" + part, m.graph.inputs);
}

const Node* producer(const Graph& g, const std::string& value) {
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == value) return &n;
  return nullptr;
}

const Node* node(const Graph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    if (n.name == name) return &n;
  return nullptr;
}

// The scale initializer of the QuantizeLinear that quantizes `value`.
std::string scale_of(const Graph& g, const std::string& value) {
  for (const auto& n : g.nodes)
    if (n.op_type == "QuantizeLinear" && n.inputs[0] == value) return n.inputs[1];
  return "";
}

}  // namespace

TEST(Quantizer, WritesOnnxRuntimesQdqLayout) {
  const fs::path d = scratch("qdq");
  QuantizeOptions o;
  o.cache_dir = (d / "cache").string();
  const std::string out = (d / "cnn.int8.onnx").string();
  const QuantizeReport rep = quantize_model(models() + "cnn.onnx", out, samples("cnn", "calib"), o);
  EXPECT_EQ(rep.opset_from, 11);
  EXPECT_EQ(rep.opset_to, 13);
  EXPECT_EQ(rep.batch_norms_folded, 1);
  // relu1 and relu4; clip2 stays, as its output shares the Concat's scale with conv3's
  // negative outputs, which the QuantizeLinear must not clamp at 0.
  EXPECT_EQ(rep.activations_removed, 2);
  EXPECT_EQ(rep.weights_quantized, 6);
  EXPECT_EQ(rep.biases_quantized, 3);  // conv1 (its BatchNorm's), conv2, fc
  EXPECT_EQ(rep.nodes_quantized.at("Conv"), 5);
  EXPECT_EQ(rep.nodes_quantized.at("Concat"), 1);
  EXPECT_FALSE(rep.stats_from_cache);

  const Model q = OnnxImporter::load_file(out);
  const Graph& g = q.graph;
  EXPECT_EQ(q.opset(""), 13);
  EXPECT_GE(q.ir_version, 7);
  for (const char* gone : {"bn1", "relu1", "relu4"}) EXPECT_EQ(node(g, gone), nullptr) << gone;
  EXPECT_NE(node(g, "clip2"), nullptr);
  // Weights: int8 per output channel behind a DequantizeLinear with axis 0 (Conv) / 1 (Gemm).
  for (const char* name : {"conv1", "conv2", "conv3", "conv4", "conv5", "fc"}) {
    const Node* n = node(g, name);
    ASSERT_NE(n, nullptr) << name;
    const Node* dq = producer(g, n->inputs[1]);
    ASSERT_NE(dq, nullptr) << name;
    EXPECT_EQ(dq->op_type, "DequantizeLinear");
    EXPECT_EQ(g.initializers.at(dq->inputs[0]).dtype(), DType::i8) << name;
    EXPECT_EQ(dq->attr_int("axis", -9), std::string(name) == "fc" ? 1 : 0) << name;
    const Node* x = producer(g, n->inputs[0]);
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->op_type, "DequantizeLinear") << name;
    EXPECT_EQ(g.initializers.at(x->inputs[2]).dtype(), DType::u8) << name;
  }
  const Node* bias = producer(g, node(g, "conv2")->inputs[2]);
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(g.initializers.at(bias->inputs[0]).dtype(), DType::i32);
  // Concat, MaxPool and Flatten keep the 8-bit values: inputs and outputs share a scale.
  EXPECT_EQ(scale_of(g, "p"), scale_of(g, "cat"));
  EXPECT_EQ(scale_of(g, "c3"), scale_of(g, "cat"));
  EXPECT_EQ(scale_of(g, "r2"), scale_of(g, "p"));
  EXPECT_EQ(scale_of(g, "gap"), scale_of(g, "flat"));
  EXPECT_NE(scale_of(g, "res"), scale_of(g, "cat"));
  EXPECT_EQ(scale_of(g, "probs"), "");  // the graph output stays in float
  EXPECT_EQ(producer(g, "probs")->op_type, "Softmax");
  // The rest of the file: doc strings, metadata, value_info and the symbolic batch dim.
  const std::string bytes = read_text(out);
  for (const char* kept :
       {"a small CNN for the quantization tests", "slim tests", "classification", "kept"})
    EXPECT_NE(bytes.find(kept), std::string::npos) << kept;
  EXPECT_EQ(g.inputs[0].describe(), "f32[n,3,16,16]");
  EXPECT_EQ(g.value_info.size(), 1u);

  // Accuracy: the quantized classifier agrees with the float one on held-out inputs.
  EvalOptions eo;
  const EvalReport ev =
      evaluate_quantized(models() + "cnn.onnx", out, samples("cnn", "held"), Tensor(), eo);
  ASSERT_EQ(ev.outputs.size(), 1u);
  EXPECT_TRUE(ev.outputs[0].classifier);
  EXPECT_EQ(ev.outputs[0].rows, 40);
  EXPECT_GE(ev.outputs[0].top1_agree, 38);
  EXPECT_GT(ev.outputs[0].cosine, 0.99);
  EXPECT_LT(ev.outputs[0].kl_mean, 0.01);
}

TEST(Quantizer, SecondRunReadsTheCalibrationCache) {
  const fs::path d = scratch("cache");
  QuantizeOptions o;
  o.cache_dir = (d / "cache").string();
  const SampleSet calib = samples("cnn", "calib");
  const auto first = quantize_model(models() + "cnn.onnx", (d / "a.onnx").string(), calib, o);
  EXPECT_FALSE(first.stats_from_cache);
  ASSERT_EQ(first.cache_files.size(), 1u);
  EXPECT_TRUE(fs::exists(first.cache_files[0]));
  o.calibrator.method = CalibrationMethod::entropy;
  o.per_channel = false;
  const auto second = quantize_model(models() + "cnn.onnx", (d / "b.onnx").string(), calib, o);
  EXPECT_TRUE(second.stats_from_cache);
  EXPECT_EQ(second.calibration_seconds, 0);
  // Same settings from the cache: the same file, byte for byte.
  o.calibrator.method = CalibrationMethod::minmax;
  o.per_channel = true;
  quantize_model(models() + "cnn.onnx", (d / "c.onnx").string(), calib, o);
  EXPECT_EQ(read_text((d / "a.onnx").string()), read_text((d / "c.onnx").string()));
  // Fewer samples are other statistics; a damaged cache file is collected again.
  o.max_samples = 16;
  EXPECT_FALSE(
      quantize_model(models() + "cnn.onnx", (d / "d.onnx").string(), calib, o).stats_from_cache);
  o.max_samples = 0;
  std::ofstream(first.cache_files[0]) << "garbage";
  EXPECT_FALSE(
      quantize_model(models() + "cnn.onnx", (d / "e.onnx").string(), calib, o).stats_from_cache);
  EXPECT_EQ(read_text((d / "a.onnx").string()), read_text((d / "e.onnx").string()));
}

TEST(Quantizer, SmoothQuantMovesOutliersIntoWeights) {
  const fs::path d = scratch("smooth");
  const SampleSet calib = samples("encoder", "calib"), held = samples("encoder", "held");
  QuantizeOptions o;
  o.op_types = {"MatMul"};
  const std::string plain = (d / "plain.onnx").string(), smooth = (d / "smooth.onnx").string();
  quantize_model(models() + "encoder.onnx", plain, calib, o);
  o.smoothquant_alpha = 0.5;
  const auto rep = quantize_model(models() + "encoder.onnx", smooth, calib, o);
  EXPECT_EQ(rep.smoothed, 6);  // q, k, v (one factor through ln1), o, ffn1 (ln2), ffn2 (a Mul)
  const Model m = OnnxImporter::load_file(smooth);
  EXPECT_EQ(node(m.graph, "ln1")->inputs[1], "ln1_g_smoothed");
  EXPECT_NE(node(m.graph, "f1r_smooth"), nullptr);
  EvalOptions eo;
  const auto a = evaluate_quantized(models() + "encoder.onnx", plain, held, Tensor(), eo);
  const auto b = evaluate_quantized(models() + "encoder.onnx", smooth, held, Tensor(), eo);
  // The LayerNorm's outlier channels set ln1's per-tensor range; smoothed, they do not.
  EXPECT_LT(1 - b.outputs[0].cosine, 0.8 * (1 - a.outputs[0].cosine))
      << "cosine " << a.outputs[0].cosine << " -> " << b.outputs[0].cosine;
}

TEST(Quantizer, BiasCorrectionCancelsTheMeanShiftOfRoundedWeights) {
  const fs::path d = scratch("bias");
  const Model f = OnnxImporter::load_file(models() + "gemm.onnx");
  const Tensor w = f.graph.initializers.at("w"), b = f.graph.initializers.at("b");
  const Tensor x = read_npy(models() + "gemm_calib/x.npy");
  std::vector<double> mean(16, 0.0);
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t k = 0; k < 16; ++k) mean[size_t(k)] += x.data<float>()[r * 16 + k] / 64.0;
  QuantizeOptions o;
  o.per_channel = false;
  o.bias_correction = true;
  const std::string out = (d / "gemm.onnx").string();
  const auto rep = quantize_model(models() + "gemm.onnx", out, samples("gemm", "calib"), o);
  EXPECT_EQ(rep.bias_corrected, 1);
  const Model q = OnnxImporter::load_file(out);
  const Graph& g = q.graph;
  const Node* fc = node(g, "fc");
  const Node* wdq = producer(g, fc->inputs[1]);
  const Node* bdq = producer(g, fc->inputs[2]);
  const Tensor& wq = g.initializers.at(wdq->inputs[0]);
  const float ws = g.initializers.at(wdq->inputs[1]).data<float>()[0];
  const Tensor& bq = g.initializers.at(bdq->inputs[0]);
  const float bs = g.initializers.at(bdq->inputs[1]).data<float>()[0];
  for (int64_t n = 0; n < 8; ++n) {
    double shift = 0;
    for (int64_t k = 0; k < 16; ++k)
      shift += (double(wq.data<int8_t>()[k * 8 + n]) * ws - w.data<float>()[k * 8 + n]) *
               mean[size_t(k)];
    EXPECT_NEAR(bq.data<int32_t>()[n] * double(bs), b.data<float>()[n] - shift, 0.51 * bs) << n;
    EXPECT_GT(std::fabs(shift), 0.0);
  }
}

TEST(Quantizer, BiasesFitInt32) {
  // Channel 1's weights are ~1e-9: at s_x·s_w its bias of 2 would be ~1e9·2^... steps, past
  // int32; its weight scale grows until the bias fits in 2^30 steps.
  const fs::path d = scratch("tiny");
  const std::string out = (d / "tiny.onnx").string();
  quantize_model(models() + "tiny.onnx", out, samples("tiny", "calib"), QuantizeOptions{});
  const Model q = OnnxImporter::load_file(out);
  const Node* conv = node(q.graph, "conv");
  const Node* bdq = producer(q.graph, conv->inputs[2]);
  const Tensor& bq = q.graph.initializers.at(bdq->inputs[0]);
  const Tensor& bs = q.graph.initializers.at(bdq->inputs[1]);
  const float want[] = {0.5f, 2.0f, -1.0f};
  for (int c = 0; c < 3; ++c) {
    EXPECT_LE(std::abs(int64_t(bq.data<int32_t>()[c])), int64_t(1) << 30) << c;
    EXPECT_NEAR(bq.data<int32_t>()[c] * double(bs.data<float>()[c]), want[c], bs.data<float>()[c]) << c;
  }
  const Node* wdq = producer(q.graph, conv->inputs[1]);
  EXPECT_GT(q.graph.initializers.at(wdq->inputs[1]).data<float>()[1], 1e-9f / 127);
}

TEST(Quantizer, RefusesBadOptions) {
  const fs::path d = scratch("bad");
  QuantizeOptions o;
  o.op_types = {"Conv", "Softmax"};
  const SampleSet calib = samples("cnn", "calib");
  try {
    quantize_model(models() + "cnn.onnx", (d / "x.onnx").string(), calib, o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("cannot quantize op type 'Softmax'"), std::string::npos)
        << e.what();
  }
  o.op_types.clear();
  o.exclude_nodes = {"conv9"};
  try {
    quantize_model(models() + "cnn.onnx", (d / "x.onnx").string(), calib, o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), models() + "cnn.onnx: --exclude names no node 'conv9'");
  }
}
