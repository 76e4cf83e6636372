// End-to-end tests of `slim generate` on Mixture-of-Experts models: the per-expert
// statistics (--expert-stats table, --json), their share of the energy, and refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_helpers.h"

using namespace slim::test;

namespace {

class LlmCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = scratch_dir("llm_cli_" + std::to_string(::getpid())).string();
    const std::string py =
        "import sys; sys.path.insert(0, '" + source_dir() +
        "/tests/fixtures'); import make_gguf as m; "
        "m.make_model('" +
        dir_ +
        "', 'moe', 'qwen2moe', 'Q8_0', 2, False, 5, n_ff=256, "
        "moe=dict(n_expert=4, k=2, n_ff_sh=128), tokenizer=m.spm_tokenizer(300), reference=False); "
        "m.make_model('" +
        dir_ + "', 'dense', 'llama', 'F32', 2, False, 6, reference=False)";
    const auto r = run_command("/usr/bin/python3 -c \"" + py + "\"");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static std::string dir_;
};
std::string LlmCli::dir_;

TEST_F(LlmCli, ExpertStatsPerRequestAndCumulative) {
  const std::string json = dir_ + "/stats.json";
  const auto r = run_slim("generate " + dir_ +
                          "/moe.gguf --tokens 5,6,7 -n 4 --temp 0 --ignore-eos --threads 1 "
                          "--expert-stats --json " +
                          json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 3 prompt tokens and 3 of the 4 generated ones pass the model (the last is not fed back).
  EXPECT_NE(r.err.find("experts, request 1: 6 tokens, 2 layers x 4 experts, 2 per token\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("\n  shared "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n  total "), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(j["moe"]["arch"], "qwen2moe");
  EXPECT_EQ(j["moe"]["n_expert"], 4);
  EXPECT_EQ(j["prompt_tokens"], 3);
  EXPECT_EQ(j["generated_tokens"], 4);
  const auto& req = j["experts"];
  EXPECT_EQ(req["evaluated_tokens"], 6);
  double expert_flops = 0;
  for (const auto& layer : req["routed"]) {
    int routed = 0;
    for (const auto& n : layer) routed += n.get<int>();
    EXPECT_EQ(routed, 6 * 2);  // every token to k experts in every layer
  }
  for (const auto& f : req["expert_flops"]) expert_flops += f.get<double>();
  // Per routed token: gate, up and down of an expert, 2 x 3 x 256 x 256 FLOPs.
  EXPECT_DOUBLE_EQ(expert_flops, 2 * 6 * 2 * 6.0 * 256 * 256);
  EXPECT_DOUBLE_EQ(req["shared_flops"].get<double>(), 6 * 2 * (6.0 * 256 * 128 + 2 * 256));
  EXPECT_DOUBLE_EQ(
      req["total_flops"].get<double>(),
      expert_flops + req["shared_flops"].get<double>() + req["other_flops"].get<double>());
  EXPECT_EQ(j["moe"]["cumulative"]["routed"], req["routed"]);
  EXPECT_FALSE(req.contains("expert_j"));  // no --energy
}

TEST_F(LlmCli, ExpertStatsAddUpOverRequests) {
  const std::string json = dir_ + "/two.json";
  const auto r = run_slim("generate " + dir_ +
                          "/moe.gguf -p 'one two' -p 'three' -n 3 --temp 0 --ignore-eos "
                          "--threads 1 --expert-stats --json " +
                          json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("experts, request 2: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("experts, all requests: "), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(read_file(json));
  ASSERT_EQ(j["requests"].size(), 2u);
  const auto &a = j["requests"][0]["experts"], &b = j["requests"][1]["experts"],
             &c = j["moe"]["cumulative"];
  EXPECT_EQ(c["evaluated_tokens"].get<int>(),
            a["evaluated_tokens"].get<int>() + b["evaluated_tokens"].get<int>());
  for (size_t l = 0; l < 2; ++l)
    for (size_t e = 0; e < 4; ++e)
      EXPECT_EQ(c["routed"][l][e].get<int>(),
                a["routed"][l][e].get<int>() + b["routed"][l][e].get<int>());
  EXPECT_DOUBLE_EQ(c["other_flops"].get<double>(),
                   a["other_flops"].get<double>() + b["other_flops"].get<double>());
}

// With --energy (estimated on most machines, measured where counters are readable) each
// expert gets the request's work energy and carbon in proportion to its FLOPs.
TEST_F(LlmCli, ExpertStatsShareTheEnergyByFlops) {
  const std::string json = dir_ + "/energy.json";
  const auto r = run_slim("generate " + dir_ +
                          "/moe.gguf --tokens 5,6,7 -n 4 --temp 0 --ignore-eos --threads 1 "
                          "--expert-stats --energy --region FRA --json " +
                          json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The energy column says whether the request's energy was measured or estimated.
  EXPECT_NE(r.err.find("ed  routed per layer"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(read_file(json));
  const auto& x = j["experts"];
  ASSERT_TRUE(x.contains("expert_j")) << x.dump();
  EXPECT_EQ(x["energy_basis"], j["energy"]["prefill"]["basis"]);
  const double work = j["energy"]["prefill"]["work_j"].get<double>() +
                      j["energy"]["decode"]["work_j"].get<double>();
  double joules = x["shared_j"].get<double>() + x["other_j"].get<double>(), flops = 0;
  for (size_t e = 0; e < 4; ++e) {
    joules += x["expert_j"][e].get<double>();
    flops += x["expert_flops"][e].get<double>();
    EXPECT_NEAR(x["expert_j"][e].get<double>() / std::max(work, 1e-300),
                x["expert_flops"][e].get<double>() / x["total_flops"].get<double>(), 1e-9);
  }
  // The parts add up to the request's work energy (one window over prefill and decode).
  EXPECT_NEAR(joules, work, 1e-6 * std::max(work, 1e-12));
  EXPECT_GT(flops, 0);
}

TEST_F(LlmCli, ExpertStatsNeedAMoeModel) {
  const auto r = run_slim("generate " + dir_ + "/dense.gguf --tokens 5,6 -n 2 --expert-stats");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--expert-stats needs a Mixture-of-Experts model; " + dir_ +
                       "/dense.gguf is dense"),
            std::string::npos)
      << r.err;
}


// The decode-latency budget of `slim prune`: one budget at a time, and a target the model
// already meets is nothing to do (the measured path is in bench/llm_prune, not timed here).
TEST_F(LlmCli, PruneLatencyBudgetErrors) {
  const std::string model = dir_ + "/dense.gguf", text = dir_ + "/calib.txt", out = dir_ + "/p.gguf";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "one two three four five six seven. ";
  }
  auto r = run_slim("prune " + model + " -o " + out + " --calib " + text + " --target-params 0.5 --target-latency 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("give one budget: --target-params below 1 or --target-latency"), std::string::npos) << r.err;
  r = run_slim("prune " + model + " -o " + out + " --calib " + text + " --target-latency 1e9 --ctx 16 --threads 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nothing to do: " + model + " decodes at "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("within --target-latency 1e+09 ms"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
