// `slim quantize` on ONNX models: the digits classifier of the demo quantized with
// calibration data, evaluated against its float self, and the messages for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_helpers.h"
#include "slim/core/npy.h"

using namespace slim;
using namespace slim::test;

namespace {

class QuantCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = scratch_dir("quant_cli_" + std::to_string(::getpid())).string();
    const auto r = run_command(
        "/usr/bin/python3 " + source_dir() + "/examples/digits/make_digits_model.py " + dir_ +
        " && cd " + dir_ +
        " && mkdir -p calib held && /usr/bin/python3 -c \"import numpy as np; "
        "from sklearn.datasets import load_digits; d = load_digits(); "
        "x = d.data.astype(np.float32); np.save('calib/pixels.npy', x[:300]); "
        "np.save('held/pixels.npy', x[1300:1700]); np.save('labels.npy', d.target[1300:1700])\"");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static std::string model() { return dir_ + "/digits_mlp.onnx"; }
  static std::string dir_;
};
std::string QuantCli::dir_;

TEST_F(QuantCli, QuantizesEvaluatesAndRunsTheDigitsClassifier) {
  const std::string out = dir_ + "/digits.int8.onnx";
  const auto r = run_slim("quantize " + model() + " -o " + out + " --calib " + dir_ +
                          "/calib --eval " + dir_ + "/held --labels " + dir_ +
                          "/labels.npy --calibrator entropy --calib-cache " + dir_ + "/cache");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("calibration: 300 of 300 samples (npy folder " + dir_ +
                       "/calib); entropy, u8 asymmetric "
                       "activations, per-channel weights"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("quantized: 4 nodes (Gemm 3, Mul 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 Relu/Clip done by the QuantizeLinear of their output"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("eval: 400 held-out samples, quantized vs float"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("probabilities: cosine 0.99"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-1 agreement"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accuracy"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");  // no progress line when stderr is not a terminal

  const auto again =
      run_slim("quantize " + model() + " " + out + " --calib " + dir_ + "/calib --calib-cache " +
               dir_ + "/cache --calibrator percentile --json " + dir_ + "/report.json");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("statistics: from the calibration cache"), std::string::npos)
      << again.out;
  EXPECT_NE(read_file(dir_ + "/report.json").find("\"calibrator\": \"percentile\""),
            std::string::npos);

  const auto inspect = run_slim("inspect " + out);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("QuantizeLinear"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("unsupported ops: none"), std::string::npos) << inspect.out;
  const auto run = run_slim("run " + out + " -i pixels=" + dir_ + "/held/pixels.npy --argmax");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("probabilities  f32[400,10]"), std::string::npos) << run.out;
}

// --reduce-range: 7-bit weights, every int8 value in [-64, 64] (pair-safe for AVX2 CPUs
// without VNNI), recorded in the report and the plan; the QDQ file loads and runs. Without
// the flag the weights use the full [-127, 127].
TEST_F(QuantCli, ReduceRangeWritesSevenBitWeights) {
  const std::string calib = " --calib " + dir_ + "/calib --calib-cache " + dir_ + "/cache";
  const std::string out = dir_ + "/reduced.onnx", full = dir_ + "/full.onnx";
  const auto r = run_slim("quantize " + model() + " -o " + out + calib + " --reduce-range --json " +
                          dir_ + "/reduced.json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("per-channel weights (7-bit, reduce range)"), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir_ + "/reduced.json")).at("reduce_range"), true);
  const auto f = run_slim("quantize " + model() + " -o " + full + calib);
  ASSERT_EQ(f.exit_code, 0) << f.out << f.err;
  // The smallest and largest int8 weight of each file (the QuantizeLinear-free weights).
  const auto range = [&](const std::string& file) {
    const auto p = run_command(
        "/usr/bin/python3 -c \"import onnx, numpy as np; from onnx import numpy_helper as h; "
        "m = onnx.load('" +
        file +
        "'); v = np.concatenate([h.to_array(t).ravel().astype(np.int64) for t in "
        "m.graph.initializer if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("
        "'_quantized')]); print(v.min(), v.max())\"");
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return p.out;
  };
  EXPECT_EQ(range(out), "-64 64\n");
  const std::string wide = range(full);
  EXPECT_TRUE(wide.find("-127") != std::string::npos || wide.find(" 127") != std::string::npos)
      << wide;
  const auto run = run_slim("run " + out + " -i pixels=" + dir_ + "/held/pixels.npy --argmax");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("probabilities  f32[400,10]"), std::string::npos) << run.out;
  // A mixed-precision plan keeps the setting, and re-applied gives the same bytes.
  const std::string mixed = dir_ + "/reduced_mixed.onnx", plan = dir_ + "/reduced_plan.json";
  const auto m = run_slim("quantize " + model() + " -o " + mixed + calib +
                          " --reduce-range --threads 1 --latency-runs 3 --accuracy-budget 1 "
                          "--no-int4 --plan-out " +
                          plan);
  ASSERT_EQ(m.exit_code, 0) << m.out << m.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(plan)).at("quantizer").at("reduce_range"), true);
  const auto again = run_slim("quantize " + model() + " -o " + dir_ + "/reduced_again.onnx" +
                              calib + " --plan " + plan);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_EQ(read_file(mixed), read_file(dir_ + "/reduced_again.onnx"));
}

TEST_F(QuantCli, BadInputIsNamed) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"-o " + dir_ + "/x.onnx",
       "quantize: an ONNX model needs calibration data (--calib DIR|FILE.npz|IMAGES_DIR)"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/calib --type q8_0",
       "quantize: --type is for GGUF models"},
      {"--calib " + dir_ + "/calib", "quantize: give the output file (-o OUTPUT)"},
      {"-o " + model() + " --calib " + dir_ + "/calib",
       "quantize: the output would overwrite the input"},
      {"-o " + dir_ + "/x.onnx --calib " + model(), "not an .npz file"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/nothing",
       dir_ + "/nothing: no such file or folder"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/calib --calibrator kl",
       "unknown calibrator 'kl'"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/calib --ops Conv,Softmax",
       "cannot quantize op type 'Softmax'"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/calib --activations u16",
       "--activations is u8 or i8"},
      {"-o " + dir_ + "/x.onnx --calib " + dir_ + "/calib --smoothquant 1.5",
       "SmoothQuant's alpha must be in (0, 1)"},
  };
  for (const auto& c : cases) {
    const auto r = run_slim("quantize " + model() + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  const auto help = run_slim("quantize --help");
  ASSERT_EQ(help.exit_code, 0);
  for (const char* opt :
       {"--calib", "--calibrator", "--per-tensor", "--smoothquant", "--bias-correction", "--eval",
        "--labels", "--calib-cache", "--type", "--latency-budget-ms", "--accuracy-budget",
        "--plan-out", "--plan", "--pareto-png", "--measurements", "--sensitivity-samples",
        "--latency-runs", "--search-evaluations", "--int4-block", "--no-int4",
        "fp16 is not offered"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  EXPECT_NE(help.out.find("--reduce-range"), std::string::npos);
  EXPECT_NE(help.out.find("without VNNI"), std::string::npos);
}

TEST_F(QuantCli, MixedPrecisionWritesAPlanThatReappliesToTheSameBytes) {
  const std::string calib = " --calib " + dir_ + "/calib --calib-cache " + dir_ + "/cache";
  const std::string out = dir_ + "/mixed.onnx", plan = dir_ + "/plan.json",
                    png = dir_ + "/front.png";
  const auto r = run_slim("quantize " + model() + " -o " + out + calib +
                          " --threads 1 --latency-runs 3 --accuracy-budget 1 --plan-out " + plan +
                          " --pareto-png " + png + " --eval " + dir_ + "/held");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"(mixed precision QDQ)", "layers: 3", "Pareto front", "chosen: ",
                           "predicted: latency", "measured:  latency", "top-1 agreement",
                           "candidates (built; loss measured", "int4 weight-only"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_GT(std::filesystem::file_size(png), 1000u);
  const auto again =
      run_slim("quantize " + model() + " -o " + dir_ + "/again.onnx" + calib + " --plan " + plan);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_EQ(read_file(out), read_file(dir_ + "/again.onnx"));

  const std::string o = " -o " + dir_ + "/x.onnx" + calib;
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Measurements with set times (measured ones of a 3-layer MLP are a few µs, and their
      // noise can put the fastest prediction at or below zero).
      {o + " --measurements " + dir_ + "/timed.json --latency-budget-ms 0.0000001",
       "ms is below the fastest latency a plan reaches on this machine"},
      {o + " --plan " + plan + " --latency-budget-ms 5", "--plan re-applies a plan"},
      {o + " --plan " + plan + " --exclude fc1", "--plan and --exclude"},
      {o + " --plan-out " + plan, "need --latency-budget-ms or --accuracy-budget"},
      {o + " --plan " + dir_ + "/calib/pixels.npy", "not a JSON plan"},
      {o + " --plan " + dir_ + "/fp16.json", "has precision 'fp16'"},
  };
  {  // a plan edited to a precision slim does not offer
    nlohmann::json j = nlohmann::json::parse(read_file(plan));
    j["layers"][0]["precision"] = "fp16";
    std::ofstream(dir_ + "/fp16.json") << j.dump();
  }
  {  // its measurements with every layer 0.1 ms in fp32, 0.05 ms in int8 or int4, 1 ms in all
    nlohmann::json j = nlohmann::json::parse(read_file(plan));
    j["fp32_ms"] = 1.0;
    j["scale"] = 1.0;
    for (auto& l : j["layers"]) {
      l["fp32_ms"] = 0.1;
      l["int8_ms"] = l["int8_alone_ms"] = l["int4_ms"] = 0.05;
    }
    std::ofstream(dir_ + "/timed.json") << j.dump();
  }
  for (const auto& c : cases) {
    const auto e = run_slim("quantize " + model() + c.first);
    EXPECT_EQ(e.exit_code, 2) << c.first << "\n" << e.out << e.err;
    EXPECT_NE(e.err.find(c.second), std::string::npos) << c.first << "\n" << e.err;
  }
  const auto both =
      run_slim("quantize " + model() + o + " --latency-budget-ms 5 --accuracy-budget 0.1");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

}  // namespace
