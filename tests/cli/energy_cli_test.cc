// `--energy` on `slim bench` (the digits classifier of the demo) and `slim energy`: the
// numbers' bookkeeping in text and JSON, and bad carbon options. The source is whatever
// this machine has (measured or estimated); the estimate's own arithmetic is checked
// against Cloud Carbon Footprint by tests/energy/test_vs_ccf.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/cli_helpers.h"

using namespace slim::test;

namespace {

class EnergyCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = scratch_dir("energy_cli_" + std::to_string(::getpid())).string();
    const auto r = run_command("/usr/bin/python3 " + source_dir() +
                               "/examples/digits/make_digits_model.py " + dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static std::string model() { return dir_ + "/digits_mlp.onnx"; }
  static std::string dir_;
};
std::string EnergyCli::dir_;

TEST_F(EnergyCli, BenchReportsWorkIdleAndCarbonPerInference) {
  const std::string json = dir_ + "/bench.json";
  const auto r = run_slim("bench " + model() +
                          " --iters 40 --batch 2 --energy --region fra --pue 1.1 --cpu-model "
                          "'Cascade Lake' --json " +
                          json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line :
       {"\nenergy:       ", "\nidle power:   ", "\ngrid:         FRA 44.18 g/kWh (Ember annual",
        "\nwork energy:  ", " per inference (", " TOPS/W (", "\ncarbon:       "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  const auto e = nlohmann::json::parse(read_file(json))["energy"];
  EXPECT_EQ(e["region"], "FRA");
  EXPECT_EQ(e["g_per_kwh"], 44.18);
  EXPECT_EQ(e["pue"], 1.1);
  EXPECT_EQ(e["inferences"], 80);  // 40 runs of batch 2
  ASSERT_EQ(e["runs_j"].size(), 40u);
  const double work = e["work_j"], idle = e["idle_j"];
  EXPECT_GT(work, 0);
  EXPECT_GT(idle, 0);
  EXPECT_DOUBLE_EQ(e["j_per_inference"].get<double>(), work / 80);
  EXPECT_NEAR(e["work_gco2e"].get<double>(), work / 3.6e6 * 44.18 * 1.1, 1e-15);
  // 2 x (64x64 + 64x32 + 32x10) multiply-adds of the Gemms plus their biases and activations,
  // batch 2.
  EXPECT_GT(e["flops_per_run"].get<double>(), 2 * 2 * (64 * 64 + 64 * 32 + 32 * 10));
  EXPECT_DOUBLE_EQ(e["tops_per_w"].get<double>(),
                   e["flops_per_run"].get<double>() * 40 / work / 1e12);
  if (e["basis"] == "estimated") {
    double runs = 0;
    for (double j : e["runs_j"]) runs += j;
    EXPECT_NEAR(runs, work, 1e-9 * work);  // the runs' readings add up to the window
    EXPECT_NE(e["source"].get<std::string>().find("Cascade Lake 0.64-3.97 W per vCPU"),
              std::string::npos)
        << e["source"];
    EXPECT_FALSE(e["notes"].empty());  // why nothing was measured
  } else {
    EXPECT_EQ(e["basis"], "measured");
  }
}

TEST_F(EnergyCli, GridSeriesPricesTheWindow) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string series = dir_ + "/grid.csv", json = dir_ + "/series.json";
  std::ofstream(series) << "timestamp,g_per_kwh\n"
                        << int64_t(now) - 3600 << ",300\n"
                        << int64_t(now) + 60 << ",300\n";
  const auto r = run_slim("bench " + model() + " --iters 5 --energy --grid-series " + series +
                          " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("grid:         WORLD grid intensity series " + series + ", PUE 1"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(nlohmann::json::parse(read_file(json))["energy"]["g_per_kwh"], 300);
}

TEST_F(EnergyCli, BadCarbonOptionsAreUsageErrors) {
  auto r = run_slim("bench " + model() + " --region FRA");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--region requires --energy"), std::string::npos) << r.err;
  r = run_slim("bench " + model() + " --energy --region Atlantis");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find(
          "slim: error [invalid_argument]: unknown region 'ATLANTIS': give an ISO 3166 alpha-3"),
      std::string::npos)
      << r.err;
  r = run_slim("bench " + model() + " --energy --pue 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("PUE must be a number >= 1"), std::string::npos) << r.err;
  r = run_slim("bench " + model() + " --energy --cpu-model Pentium");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("slim: error [not_found]: no CPU power coefficients for 'Pentium'"),
            std::string::npos)
      << r.err;
  r = run_slim("bench " + model() + " --energy --grid-series " + dir_ + "/missing.csv");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("missing.csv: cannot open the grid intensity series"), std::string::npos)
      << r.err;
}

TEST(EnergyCommand, EstimateIsCloudCarbonFootprintsFormula) {
  const auto r = run_slim(
      "energy estimate --seconds 10 --cpu-seconds 12.5 --vcpus 4 --memory-gb 2 --cpu-model "
      "'cascade lake' --region FRA --pue 1.2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 4 x 0.64 W x 10 s idle, (3.97 - 0.64) W x 12.5 CPU s, 0.392 W/GB x 2 GB x 10 s.
  EXPECT_NE(r.out.find("energy:    estimated 75.1 J: idle 25.6 J + CPU 41.6 J + memory 7.84 J "
                       "(2.08514e-05 kWh)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("carbon:    1.11 mgCO2e; FRA 44.18 g/kWh"), std::string::npos) << r.out;
  const auto bad = run_slim("energy estimate --seconds 1 --cpu-seconds 3 --vcpus 2");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--cpu-seconds exceeds --seconds x vCPUs (2)"), std::string::npos)
      << bad.err;
}

TEST(EnergyCommand, StatusSaysWhatIsMeasured) {
  const auto r = run_slim("energy status --idle 0.1 --gpus --region world");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.rfind("energy: measured\n", 0) == 0 ||
              r.out.rfind("energy: estimated\n", 0) == 0)
      << r.out;
  EXPECT_NE(r.out.find("\ncarbon: WORLD 472.94 g/kWh"), std::string::npos) << r.out;
  // No GPU driver here, or a GPU: either way NVML says which.
  EXPECT_TRUE(r.out.find("NVML") != std::string::npos) << r.out;
}

}  // namespace
