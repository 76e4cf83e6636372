// `--energy` on `slim bench` (the digits classifier of the demo) and `slim energy`: the
// numbers' bookkeeping in text and JSON, and bad carbon options. `slim report energy` on a
// fixed /metrics scrape (exact tables), on a bench JSON, its chart and its refusals. The source is whatever
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
  int runs = 0;
  for (const auto& w : e["windows"]) runs += w["runs"].get<int>();
  EXPECT_EQ(runs, 40);  // metered in windows of 10 ms or more
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
    double windows = 0;
    for (const auto& w : e["windows"]) windows += w["j"].get<double>();
    EXPECT_NEAR(windows, work, 1e-9 * work);  // the windows' readings add up to the whole
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

// A scrape of `slim serve --energy --region FRA` as a file (fixed numbers: 44.18 g/kWh).
const char* kScrape = R"(# HELP slim_energy_joules_total Energy above idle attributed to requests by their CPU time.
# TYPE slim_energy_joules_total counter
slim_energy_joules_total{model="digits",version="1",priority="1",source="estimated"} 0.5
slim_energy_joules_total{model="digits",version="1",priority="2",source="estimated"} 0.25
slim_energy_joules_total{model="digits",version="2",priority="1",source="estimated"} 1.25
slim_energy_joules_total{model="chat",version="1",priority="0",source="estimated"} 36
# TYPE slim_energy_requests_total counter
slim_energy_requests_total{model="digits",version="1",priority="1",source="estimated"} 100
slim_energy_requests_total{model="digits",version="1",priority="2",source="estimated"} 50
slim_energy_requests_total{model="digits",version="2",priority="1",source="estimated"} 150
slim_energy_requests_total{model="chat",version="1",priority="0",source="estimated"} 12
# TYPE slim_carbon_grams_total counter
slim_carbon_grams_total{model="digits",version="1",priority="1",source="estimated",region="FRA"} 6.136111111111111e-06
slim_carbon_grams_total{model="digits",version="1",priority="2",source="estimated",region="FRA"} 3.0680555555555557e-06
slim_carbon_grams_total{model="digits",version="2",priority="1",source="estimated",region="FRA"} 1.5340277777777778e-05
slim_carbon_grams_total{model="chat",version="1",priority="0",source="estimated",region="FRA"} 0.0004418
# TYPE slim_energy_idle_joules_total counter
slim_energy_idle_joules_total{source="estimated"} 360
# TYPE slim_energy_process_joules_total counter
slim_energy_process_joules_total{source="estimated"} 40
# TYPE slim_carbon_idle_grams_total counter
slim_carbon_idle_grams_total{region="FRA"} 0.004418
# TYPE slim_carbon_process_grams_total counter
slim_carbon_process_grams_total{region="FRA"} 0.0004908888888888889
# TYPE slim_carbon_pue gauge
slim_carbon_pue 1
process_cpu_seconds_total 12.5
)";

TEST_F(EnergyCli, ReportOnAScrapeIsATablePerModel) {
  const std::string dump = dir_ + "/scrape.prom", json = dir_ + "/report.json", png = dir_ + "/report.png";
  std::ofstream(dump) << kScrape;
  auto r = run_slim("report energy " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "model   region  count         energy  per unit  carbon       per unit     source\n"
            "chat    FRA     12 requests   36 J    3 J       442 ugCO2e   36.8 ugCO2e  estimated\n"
            "digits  FRA     300 requests  2 J     6.67 mJ   24.5 ugCO2e  81.8 ngCO2e  estimated\n"
            "idle:                360 J (4.42 mgCO2e), apart from the requests\n"
            "process above idle:  40 J (491 ugCO2e), of which requests 95.0%\n");
  r = run_slim("report energy " + dump + " --by version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "model   version  region  count         energy  per unit  carbon       per unit     source\n"
            "chat    1        FRA     12 requests   36 J    3 J       442 ugCO2e   36.8 ugCO2e  estimated\n"
            "digits  1        FRA     150 requests  750 mJ  5 mJ      9.2 ugCO2e   61.4 ngCO2e  estimated\n"
            "digits  2        FRA     150 requests  1.25 J  8.33 mJ   15.3 ugCO2e  102 ngCO2e   estimated\n"
            "idle:                360 J (4.42 mgCO2e), apart from the requests\n"
            "process above idle:  40 J (491 ugCO2e), of which requests 95.0%\n");
  // Priced again in Germany, by priority, as JSON and a chart.
  r = run_slim("report energy " + dump + " --by priority --region deu --json " + json + " --png " + png);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(read_file(json));
  const auto regions = run_slim("energy regions").out;
  const size_t at = regions.find("\nDEU ");
  ASSERT_NE(at, std::string::npos);
  const double deu = std::stod(regions.substr(at + 5));
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][1]["model"], "digits");
  EXPECT_EQ(j["rows"][1]["priority"], "1");
  EXPECT_EQ(j["rows"][1]["region"], "DEU");
  EXPECT_EQ(j["rows"][1]["count"], 250);
  EXPECT_EQ(j["rows"][1]["joules"], 1.75);
  EXPECT_DOUBLE_EQ(j["rows"][1]["gco2e"].get<double>(), 1.75 / 3.6e6 * deu);
  EXPECT_DOUBLE_EQ(j["rows"][1]["j_per_request"].get<double>(), 1.75 / 250);
  EXPECT_DOUBLE_EQ(j["idle_gco2e"].get<double>(), 360 / 3.6e6 * deu);
  // A PNG of the default size: signature, then IHDR's width and height (big-endian).
  const std::string p = read_file(png);
  ASSERT_GT(p.size(), 24u);
  EXPECT_EQ(p.substr(0, 8), "\x89PNG\r\n\x1a\n");
  auto be32 = [&](size_t i) {
    return (uint32_t(uint8_t(p[i])) << 24) | (uint32_t(uint8_t(p[i + 1])) << 16) | (uint32_t(uint8_t(p[i + 2])) << 8) |
           uint8_t(p[i + 3]);
  };
  EXPECT_EQ(be32(16), 900u);
  EXPECT_EQ(be32(20), 520u);
}

TEST_F(EnergyCli, ReportOnABenchJson) {
  const std::string bench = dir_ + "/report_bench.json", json = dir_ + "/report_bench_out.json";
  ASSERT_EQ(run_slim("bench " + model() + " --iters 10 --batch 3 --energy --region FRA --json " + bench).exit_code, 0);
  const auto r = run_slim("report energy " + bench + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("model            run  region  count          energy", 0), 0) << r.out;
  EXPECT_NE(r.out.find("\ndigits_mlp.onnx  run  FRA     30 inferences  "), std::string::npos) << r.out;
  const auto e = nlohmann::json::parse(read_file(bench))["energy"];
  const auto row = nlohmann::json::parse(read_file(json))["rows"][0];
  EXPECT_EQ(row["joules"], e["work_j"]);
  EXPECT_EQ(row["gco2e"], e["work_gco2e"]);
  EXPECT_EQ(row["count"], 30);
  EXPECT_EQ(row["unit"], "inference");
  EXPECT_EQ(row["source"], e["basis"]);
}

TEST_F(EnergyCli, ReportRefusalsNameTheProblem) {
  const std::string dump = dir_ + "/refusal.prom", bench = dir_ + "/refusal.json", other = dir_ + "/other.txt";
  std::ofstream(dump) << kScrape;
  std::ofstream(bench) << R"({"model":"m.onnx","energy":{"basis":"estimated","work_j":1,"inferences":2,"j_per_inference":0.5}})";
  std::ofstream(other) << "hello world\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dump + " --by layer", "--by: layer not in {model,version,priority,expert}"},
      {other, "slim: error [invalid_argument]: " + other +
                  " line 1 is not Prometheus text: give a /metrics scrape of `slim serve --energy` or a bench JSON "
                  "(`slim bench --energy --json`)"},
      {dump + " --by expert", "slim: error [invalid_argument]: --by expert: " + dump +
                                  " has no slim_llm_expert_* series (`slim serve` writes them for "
                                  "Mixture-of-Experts language models)"},
      {bench + " --by priority", "slim: error [invalid_argument]: --by priority needs a /metrics scrape of `slim "
                                 "serve --energy`; " + bench + " is a bench JSON"},
      {dump + " --region Atlantis", "slim: error [invalid_argument]: unknown region 'ATLANTIS'"},
      {dir_ + "/missing.prom", "slim: error [not_found]: cannot read " + dir_ + "/missing.prom"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_slim("report energy " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
  // Prometheus text without slim serve's energy series, and JSON without energy results.
  std::ofstream(other) << "process_cpu_seconds_total 12.5\n";
  auto r = run_slim("report energy " + other);
  EXPECT_NE(r.err.find(other + " has no slim_energy_joules_total series: save the /metrics of `slim serve "
                               "--energy`"),
            std::string::npos)
      << r.err;
  std::ofstream(bench) << R"({"model":"m.onnx","p50_ms":1})";
  r = run_slim("report energy " + bench);
  EXPECT_NE(r.err.find(bench + " has no energy results: write it with `slim bench|forest bench|generate|kv-bench "
                               "--energy --json`"),
            std::string::npos)
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
