// End-to-end tests of `slim inspect` and `slim run` on a real trained model (the digits
// classifier of the demo, generated here) and on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include "cli/cli_helpers.h"
#include "slim/core/npy.h"

using namespace slim;
using namespace slim::test;

namespace {

class OnnxCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // ctest runs each test in its own process, in parallel: one folder per process.
    dir_ = scratch_dir("onnx_cli_" + std::to_string(::getpid())).string();
    const auto r = run_command("/usr/bin/python3 " + source_dir() +
                               "/examples/digits/make_digits_model.py " + dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static std::string model() { return dir_ + "/digits_mlp.onnx"; }
  static std::string dir_;
};
std::string OnnxCli::dir_;

TEST_F(OnnxCli, InspectReportsModel) {
  const auto r = run_slim("inspect " + model());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pixels  f32[batch,64]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("probabilities  f32[batch,10]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Gemm 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ai.onnx 13"), std::string::npos) << r.out;
  // 64*64+64 + 64*32+32 + 32*10+10 weights and biases + the scale constant.
  EXPECT_NE(r.out.find("parameters: 6571 in 7 initializers"), std::string::npos) << r.out;
  // 2*(64*64 + 64*32 + 32*10) multiply-adds + bias adds + elementwise ops, batch 1.
  EXPECT_NE(r.out.find("unsupported ops: none"), std::string::npos) << r.out;
}

TEST_F(OnnxCli, UnsupportedOpsAreListedAllAtOnce) {
  // Three ops without kernels, for three reasons; `run` names them all and fails before
  // compile (whose folding of a broken Reshape would fail otherwise), with exit code 2.
  const auto gen = run_command("/usr/bin/python3 " + source_dir() + "/tests/fixtures/make_unsupported_model.py " + dir_);
  ASSERT_EQ(gen.exit_code, 0) << gen.out << gen.err;
  const std::string m = dir_ + "/unsupported.onnx";
  const std::string lines[] = {
      "ai.onnx.preview.training:Adagrad (opset 1): slim does not implement it (node 'adagrad')",
      "ai.onnx:Upsample (opset 13): no kernel for opset 13 (cpu has opsets 7-10; ref has opsets 7-10) (node "
      "'upsample')",
      "com.microsoft:WordConvEmbedding (opset 1): slim does not implement it (nodes 'embed_a', 'embed_b')",
  };
  const auto inspect = run_slim("inspect " + m);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("unsupported ops: 3 (providers cpu,ref cannot run this model)"), std::string::npos)
      << inspect.out;
  for (const auto& line : lines) EXPECT_NE(inspect.out.find("  " + line + "\n"), std::string::npos) << inspect.out;
  const std::string listed = inspect.out.substr(inspect.out.find("unsupported ops:"));
  EXPECT_EQ(listed.find("Adam"), std::string::npos) << "a dead node's op is listed:\n" << listed;

  const auto run = run_slim("run " + m);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("slim: error [unsupported]: " + m + ": 3 ops with no kernel in providers cpu,ref:"),
            std::string::npos)
      << run.err;
  for (const auto& line : lines) EXPECT_NE(run.err.find("\n  " + line), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("Reshape"), std::string::npos) << run.err;
  EXPECT_EQ(run.out, "");
  const auto bench = run_slim("bench " + m);  // bench checks the same way
  EXPECT_EQ(bench.exit_code, 2);
  EXPECT_NE(bench.err.find(": 3 ops with no kernel in providers cpu,ref:\n  " + lines[0]), std::string::npos)
      << bench.err;
}

TEST_F(OnnxCli, RunClassifiesLikeSklearn) {
  const std::string out = dir_ + "/out";
  const auto r = run_slim("run " + model() + " --input pixels=" + dir_ + "/digits.npy --argmax --output-dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor probs = read_npy(out + "/probabilities.npy");
  const Tensor ref = read_npy(dir_ + "/sklearn_pred.npy");
  ASSERT_EQ(probs.shape(), (Shape{ref.numel(), 10}));
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const float* row = probs.data<float>() + i * 10;
    int best = 0;
    float sum = 0;
    for (int c = 0; c < 10; ++c) {
      sum += row[c];
      if (row[c] > row[best]) best = c;
    }
    EXPECT_NEAR(sum, 1.0f, 1e-5);
    EXPECT_EQ(best, ref.data<int64_t>()[i]) << "digit " << i;
  }
  EXPECT_NE(r.out.find("argmax per row:"), std::string::npos);
}

TEST_F(OnnxCli, RunWithRandomInputsIsSeeded) {
  const auto a = run_slim("run " + model() + " --seed 7");
  const auto b = run_slim("run " + model() + " --seed 7");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto strip_time = [](std::string s) { return s.substr(0, s.find("run: ")); };
  EXPECT_EQ(strip_time(a.out), strip_time(b.out));
  EXPECT_NE(a.out.find("random f32[1,64]"), std::string::npos) << a.out;
}

TEST_F(OnnxCli, BadInputsAreClearErrors) {
  const auto garbage = scratch_dir("onnx_cli_bad") / "garbage.onnx";
  { std::ofstream(garbage) << "this is not a protobuf model at all \x01\x02\x03"; }
  auto r = run_slim("inspect " + garbage.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("garbage.onnx"), std::string::npos) << r.err;

  r = run_slim("inspect /nonexistent/model.onnx");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/model.onnx"), std::string::npos) << r.err;

  // Wrong dtype.
  const auto bad_npy = scratch_dir("onnx_cli_npy") / "ints.npy";
  write_npy(bad_npy.string(), Tensor(DType::i64, {2, 64}));
  r = run_slim("run " + model() + " --input pixels=" + bad_npy.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("pixels"), std::string::npos) << r.err;

  // Wrong shape.
  const auto bad_shape = scratch_dir("onnx_cli_shape") / "short.npy";
  write_npy(bad_shape.string(), Tensor(DType::f32, {2, 63}));
  r = run_slim("run " + model() + " --input pixels=" + bad_shape.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("pixels"), std::string::npos) << r.err;

  // An input name the model lacks.
  r = run_slim("run " + model() + " --input nosuch=" + bad_shape.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nosuch"), std::string::npos) << r.err;

  // Malformed option value and unknown option.
  r = run_slim("run " + model() + " --input pixels");
  EXPECT_EQ(r.exit_code, 2);
  r = run_slim("run " + model() + " --no-such-option");
  EXPECT_EQ(r.exit_code, 2);
}

// The kernel level: reported by inspect, lowered by --isa or SLIM_ISA, and a name that is
// no level, or a level this CPU cannot run, is a usage error before any output.
TEST_F(OnnxCli, KernelLevelIsReportedAndOnlyLowered) {
  auto r = run_slim("inspect " + model());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kernels:   "), std::string::npos) << r.out;
  r = run_slim("inspect " + model() + " --isa scalar");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kernels:   scalar"), std::string::npos) << r.out;
  r = run_slim("inspect " + model() + " --isa sse9");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'sse9' is no instruction set"), std::string::npos) << r.err;
  r = run_command("SLIM_ISA=sse9 " + slim_runner_prefix() + slim_binary() + " inspect " + model());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("SLIM_ISA: 'sse9'"), std::string::npos) << r.err;
#if defined(__aarch64__)
  const std::string foreign = "avx2";
#else
  const std::string foreign = "neon";
#endif
  r = run_slim("run " + model() + " --isa " + foreign);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("this CPU cannot run " + foreign), std::string::npos) << r.err;
}

TEST(Cli, EveryCommandHasHelp) {
  const auto top = run_slim("--help");
  ASSERT_EQ(top.exit_code, 0);
  // Subcommand names are listed under "Subcommands:" as the first word of each line.
  const auto pos = top.out.find("Subcommands:");
  ASSERT_NE(pos, std::string::npos) << top.out;
  std::istringstream lines(top.out.substr(pos));
  std::string line;
  std::getline(lines, line);
  int checked = 0;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    if (!(words >> name)) continue;
    const auto r = run_slim(name + " --help");
    EXPECT_EQ(r.exit_code, 0) << name;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << name << ": " << r.out;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

}  // namespace
