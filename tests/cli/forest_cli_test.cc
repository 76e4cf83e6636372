// `slim forest` end to end: compile (plain, lossless ranked, compact, 6-bit), predict
// from the source model and from each .slimf, inspect, `slim prune` on a forest, and the
// errors of bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_helpers.h"
#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"

namespace slim::test {
namespace {

class ForestCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(slim::forest::testing::fixture_dir("forest_xgb_fixtures.py"));
    out_ = new std::string(scratch_dir("forest_cli_" + std::to_string(::getpid())).string());
    // The fixture's rows (with NaNs) as CSV, and xgboost's own outputs.
    Tensor x = read_npy(*dir_ + "/xgb_binary_nan.x.npy");
    Tensor pred = read_npy(*dir_ + "/xgb_binary_nan.pred.npy");
    std::ofstream csv(*out_ + "/rows.csv");
    char buf[32];
    for (int64_t r = 0; r < x.dim(0); ++r) {
      for (int64_t c = 0; c < x.dim(1); ++c) {
        std::snprintf(buf, sizeof buf, "%.9g", double(x.data<float>()[r * x.dim(1) + c]));
        csv << (c ? "," : "") << buf;
      }
      csv << "\n";
      expected_.push_back(pred.data<float>()[r]);
    }
  }
  static std::string model() { return *dir_ + "/xgb_binary_nan.json"; }
  static std::string out(const std::string& name) { return *out_ + "/" + name; }
  // Predictions the CLI wrote (header line skipped).
  static std::vector<float> read_predictions(const std::string& path) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, "prediction");
    std::vector<float> v;
    while (std::getline(f, line)) v.push_back(std::strtof(line.c_str(), nullptr));
    return v;
  }
  static std::string* dir_;
  static std::string* out_;
  static std::vector<float> expected_;
};
std::string* ForestCli::dir_ = nullptr;
std::string* ForestCli::out_ = nullptr;
std::vector<float> ForestCli::expected_;

TEST_F(ForestCli, EveryLosslessFormPredictsExactlyWhatXGBoostDoes) {
  struct Variant {
    std::string file, args, layout;
  };
  const std::vector<Variant> variants = {
      {"plain.slimf", "", "plain"},
      {"ranked.slimf", "--quantize lossless", "ranked"},
      {"compact.slimf", "--quantize lossless --encoding compact", "ranked"},
  };
  // The source model itself first.
  auto r = run_slim("forest predict " + model() + " --csv " + out("rows.csv") + " --output " + out("src.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_predictions(out("src.csv")), expected_);
  for (const auto& v : variants) {
    SCOPED_TRACE(v.file);
    r = run_slim("forest compile " + model() + " -o " + out(v.file) + " " + v.args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(v.layout + " layout"), std::string::npos) << r.out;
    r = run_slim("forest predict " + out(v.file) + " --csv " + out("rows.csv") + " --output " + out("p.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_predictions(out("p.csv")), expected_);
    r = run_slim("forest inspect " + out(v.file));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("layout:     " + v.layout), std::string::npos) << r.out;
  }
}

TEST_F(ForestCli, SixBitQuantizationWritesARankedModel) {
  auto r = run_slim("forest compile " + model() + " -o " + out("q6.slimf") + " --quantize 6bit --calib " +
                    out("rows.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("quantized to 6 bits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ranked layout: 8 bytes per node"), std::string::npos) << r.out;
  r = run_slim("forest predict " + out("q6.slimf") + " --csv " + out("rows.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ForestCli, CategoricalModelKeepsThePlainLayoutAndSaysWhy) {
  auto r = run_slim("forest compile " + *dir_ + "/xgb_categorical.json -o " + out("cat.slimf") +
                    " --quantize lossless");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kept the plain node layout"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("categorical splits"), std::string::npos) << r.err;
}

TEST_F(ForestCli, PruneDropsTreesToTheBudgetAndReports) {
  auto r = run_slim("prune " + model() + " -o " + out("p.slimf") + " --calib " + out("rows.csv") +
                    " --target-params 0.5 --json " + out("p.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(read_file(out("p.json")));
  EXPECT_EQ(j["kind"], "forest");
  EXPECT_GT(j["trees_dropped"].get<int>(), 0);
  EXPECT_LE(j["after"]["nodes"].get<double>(), 0.5 * j["before"]["nodes"].get<double>());
  EXPECT_EQ(j["eval"]["rows"].get<size_t>(), expected_.size());
  // The report's differences are those of the two models' own predictions.
  ASSERT_EQ(run_slim("forest predict " + out("p.slimf") + " --csv " + out("rows.csv") + " --output " +
                     out("p.csv")).exit_code, 0);
  const std::vector<float> pruned = read_predictions(out("p.csv"));
  ASSERT_EQ(pruned.size(), expected_.size());
  double max_diff = 0;
  for (size_t i = 0; i < pruned.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(pruned[i]) - expected_[i]));
  EXPECT_NEAR(j["eval"]["max_abs_diff"].get<double>(), max_diff, 1e-6);
  // Errors: nothing to do, a budget without calibration rows, gains from a .slimf, a GGUF.
  r = run_slim("prune " + model() + " -o " + out("x.slimf"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nothing to do"), std::string::npos) << r.err;
  r = run_slim("prune " + model() + " -o " + out("x.slimf") + " --target-params 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("need --calib"), std::string::npos) << r.err;
  r = run_slim("prune " + out("p.slimf") + " -o " + out("x.slimf") + " --prune-gain 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs the source model"), std::string::npos) << r.err;
  std::ofstream(out("m.gguf"), std::ios::binary) << "GGUF....";
  r = run_slim("prune " + out("m.gguf") + " -o " + out("x.gguf") + " --target-params 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("a GGUF model needs --calib TEXT"), std::string::npos) << r.err;
  std::ofstream(out("m.onnx"), std::ios::binary) << "onnx";
  r = run_slim("prune " + out("m.onnx") + " -o " + out("x.onnx") + " --target-params 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot parse as an ONNX model"), std::string::npos) << r.err;  // ONNX is pruned now
}

TEST_F(ForestCli, BadOptionsAndInputsAreClearErrors) {
  auto r = run_slim("forest compile " + model() + " -o " + out("x.slimf") + " --quantize 3bit");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--quantize must be"), std::string::npos) << r.err;
  r = run_slim("forest compile " + model() + " -o " + out("x.slimf") + " --encoding zip");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--encoding must be plain or compact"), std::string::npos) << r.err;
  // Wrong column count.
  std::ofstream(out("narrow.csv")) << "1,2\n3,4\n";
  r = run_slim("forest predict " + model() + " --csv " + out("narrow.csv"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("feature columns, the model expects"), std::string::npos) << r.err;
  // A damaged .slimf is an integrity error (exit 3).
  run_slim("forest compile " + model() + " -o " + out("d.slimf") + " --quantize lossless");
  std::string bytes = read_file(out("d.slimf"));
  bytes[bytes.size() / 2] ^= 0x20;
  std::ofstream(out("d.slimf"), std::ios::binary | std::ios::trunc) << bytes;
  r = run_slim("forest inspect " + out("d.slimf"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace slim::test
