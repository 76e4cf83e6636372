// `slim prune model.onnx`: the demo's digits classifier (an MLP: Gemm hidden units are the
// channels) pruned to 70 % of its multiply-adds with calibration data, its report, the
// pruned file run by `slim run`, and the messages for bad options.
#include <gtest/gtest.h>
#include <unistd.h>

#include "cli/cli_helpers.h"

using namespace slim::test;

namespace {

class PruneOnnxCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = scratch_dir("prune_onnx_cli_" + std::to_string(::getpid())).string();
    const auto r = run_command(
        "/usr/bin/python3 " + source_dir() + "/examples/digits/make_digits_model.py " + dir_ + " && cd " + dir_ +
        " && mkdir -p calib held && /usr/bin/python3 -c \"import numpy as np; "
        "from sklearn.datasets import load_digits; d = load_digits(); "
        "x = d.data.astype(np.float32); np.save('calib/pixels.npy', x[:300]); "
        "np.save('held/pixels.npy', x[1300:1700]); np.save('labels.npy', d.target[1300:1700])\"");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static std::string model() { return dir_ + "/digits_mlp.onnx"; }
  static std::string dir_;
};
std::string PruneOnnxCli::dir_;

TEST_F(PruneOnnxCli, PrunesReportsAndRuns) {
  const std::string out = dir_ + "/pruned.onnx";
  const auto r = run_slim("prune " + model() + " -o " + out + " --target-flops 0.7 --calib " + dir_ + "/calib --eval " +
                          dir_ + "/held --labels " + dir_ + "/labels.npy --latency-rounds 1 --threads 1 --json " + dir_ +
                          "/report.json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("criterion output, channels in multiples of 8, bias correction and recalibration, at pixels: [1,64]"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MACs                       6464"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("groups: 4 (2 prunable, 2 pruned)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kept: 1 group: 'pixels' is a graph input"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-1 agreement"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accuracy"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");  // no progress line when stderr is not a terminal
  const std::string js = read_file(dir_ + "/report.json");
  EXPECT_NE(js.find("\"kind\": \"onnx\""), std::string::npos);
  EXPECT_NE(js.find("\"macs\": 6464"), std::string::npos);
  const auto run = run_slim("run " + out + " --input pixels=" + dir_ + "/held/pixels.npy --argmax --output-dir " + dir_ +
                            "/run");
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

TEST_F(PruneOnnxCli, BadOptionsAreClearErrors) {
  const std::string out = dir_ + "/bad.onnx";
  auto r = run_slim("prune " + model() + " -o " + out + " --target-flops 1.5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--target-flops: Value 1.5 not in range"), std::string::npos) << r.err;
  r = run_slim("prune " + model() + " -o " + out + " --target-flops 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--target-flops and --target-params must be above 0"), std::string::npos) << r.err;
  r = run_slim("prune " + model() + " -o " + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nothing to do: give --target-flops"), std::string::npos) << r.err;
  r = run_slim("prune " + model() + " -o " + out + " --target-flops 0.5 --criterion output");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("give --calib"), std::string::npos) << r.err;
  r = run_slim("prune " + dir_ + "/labels.npy -o " + out + " --target-flops 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--target-flops is for ONNX models"), std::string::npos) << r.err;
  r = run_slim("prune " + dir_ + "/labels.npy -o " + out + " --criterion l2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--criterion l2 is for ONNX models"), std::string::npos) << r.err;
  r = run_slim("prune " + model() + " -o " + dir_ + "/pruned.slimf --target-flops 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the output of an ONNX model is an .onnx file"), std::string::npos) << r.err;
}

}  // namespace
