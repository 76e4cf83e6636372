// `slim prune MODEL -o OUT`: structured pruning with one command line and one report
// format for every model kind; the kind comes from the file.
#include <filesystem>
#include <fstream>
#include <memory>

#include "commands.h"
#include "prune.h"
#include "slim/core/error.h"
#include "slim/forest/slimf.h"

namespace slim::cli {
namespace {

std::string model_kind(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  if (std::string(magic, 4) == "GGUF") return "gguf";
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".onnx") return "onnx";
  return "forest";  // XGBoost JSON/UBJSON, LightGBM text or .slimf: the loaders check
}

void prune_cmd(const PruneArgs& a) {
  const std::string kind = model_kind(a.model);
  if (kind == "onnx") return prune_onnx_model(a);
  check(a.target_flops == 1, ErrorCode::invalid_argument,
        "prune: --target-flops is for ONNX models; " + a.model + " is not one (.onnx)");
  const bool gguf_criterion = a.criterion == "activation" || a.criterion == "magnitude" || a.criterion == "wanda";
  check(gguf_criterion, ErrorCode::invalid_argument,
        "prune: --criterion " + a.criterion + " is for ONNX models; " + a.model + " takes activation, wanda or magnitude");
  check(kind == "gguf" || a.criterion != "wanda", ErrorCode::invalid_argument,
        "prune: --criterion wanda is for GGUF models; " + a.model + " is a tree ensemble");
  check(kind == "gguf" || a.target_latency_ms == 0, ErrorCode::invalid_argument,
        "prune: --target-latency is for GGUF models; " + a.model + " is a tree ensemble");
  if (kind == "gguf") return prune_llm_model(a);
  prune_forest_model(a);
}

}  // namespace

SLIM_COMMAND(45, [](CLI::App& app) {
  auto* c = app.add_subcommand(
      "prune", "Structured pruning: make a model smaller and faster, and report what it costs (tree ensembles: "
               "weak splits merged, trees dropped by their contribution on calibration data; GGUF language "
               "models: attention KV groups and FFN units by calibration activations, MoE experts by routing; "
               "ONNX CNNs: coupled Conv/Gemm channels by weight norm, BN scale or measured output energy)");
  auto a = std::make_shared<PruneArgs>();
  c->add_option("MODEL", a->model, "XGBoost .json/.ubj, LightGBM .txt, .slimf, GGUF or ONNX")->required()->check(CLI::ExistingFile);
  c->add_option("-o,--output", a->output, "Pruned model (.slimf for tree ensembles, .gguf for GGUF, .onnx for ONNX)")->required();
  c->add_option("--calib", a->calib, "Calibration data: CSV rows for trees, a text file for GGUF, a folder of NAME.npy or an .npz for ONNX")
      ->check(CLI::ExistingPath);
  c->add_option("--eval", a->eval, "Held-out rows (CSV), text (GGUF) or samples (ONNX: .npy folder, .npz) for the report (default: the calibration data)")
      ->check(CLI::ExistingPath);
  c->add_option("--label-column", a->label, "Name or index of the label column in the CSVs (AUC when binary)");
  c->add_option("--target-params", a->target_params,
                "Keep at most this fraction of the parameters (tree nodes; GGUF weights): least important go first")
      ->check(CLI::Range(0.0, 1.0).description("in (0, 1]"));
  c->add_option("--max-margin-change", a->max_margin_change,
                "Never drop a tree that would move a calibration row's margin by more than this")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--prune-gain", a->prune_gain, "Merge splits whose gain is below this into leaves (source models)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--criterion", a->criterion,
                "Unit importance. GGUF: activation (calibration), wanda (|W| x calibration input norm) or "
                "magnitude (weights). ONNX: l1 or l2 (weight norms), bn (BatchNormalization scale), output (energy "
                "each channel gives the layers that read it, on --calib; 'activation' means output, 'magnitude' l2)")
      ->check(CLI::IsMember({"activation", "wanda", "magnitude", "l1", "l2", "bn", "output"}));
  c->add_option("--target-latency", a->target_latency_ms,
                "GGUF: decode milliseconds per token to reach, measured on this machine with --threads (instead of "
                "--target-params): pruned, measured beside the original, pruned further until it is met (4 tries)")
      ->check(CLI::PositiveNumber);
  c->add_option("--target-flops", a->target_flops,
                "ONNX: keep at most this fraction of the Conv/Gemm/MatMul multiply-adds")
      ->check(CLI::Range(0.0, 1.0).description("in (0, 1]"));
  c->add_option("--labels", a->labels, "ONNX: integer class per --eval sample (.npy), for accuracy")
      ->check(CLI::ExistingFile);
  c->add_option("--channel-multiple", a->channel_multiple,
                "ONNX: channels kept per group are a multiple of this (1: any count)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--cost-weight", a->cost_weight,
                "ONNX: rank channels by importance / (MACs they save)^W: 0 (default) importance only, 1 per MAC")
      ->check(CLI::Range(0.0, 4.0));
  c->add_option("--calib-samples", a->calib_samples, "ONNX: calibration samples used (first N)")
      ->check(CLI::PositiveNumber);
  c->add_flag("--no-bias-correction", a->no_bias_correction,
              "ONNX: do not fold removed channels' calibration mean into the biases of the layers reading them");
  c->add_flag("--no-recalibration", a->no_recalibration,
              "ONNX: do not match the mean and variance of each layer that lost inputs to the original's on --calib");
  c->add_option("--latency-rounds", a->latency_rounds, "ONNX: timing for the report: about 0.4 s of runs per round, the two models alternating run by run (0: none)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--no-refit", a->no_refit,
              "GGUF: keep the kept units' output-projection columns as they are (default: least-squares refit on "
              "the calibration activations)");
  c->add_option("--refit-chunks", a->refit_chunks,
                "GGUF: chunks of the calibration text's first half the importances and the refit are computed on")
      ->check(CLI::PositiveNumber);
  c->add_option("--allocation", a->allocation,
                "GGUF: per-layer widths from the sensitivity scan, or uniform (every layer loses the same share of "
                "its FFN units, for comparison)")
      ->check(CLI::IsMember({"sensitivity", "uniform"}));
  c->add_option("--min-ffn-share", a->min_ffn_share,
                "GGUF: every layer keeps at least this share of its FFN units while the budget allows")
      ->check(CLI::Range(0.0, 1.0));
  c->add_flag("--no-speed", a->no_speed, "GGUF: leave out the prefill and decode speed measurement");
  c->add_option("--ridge", a->ridge, "GGUF: the refit's regularization, relative to the mean activation energy")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--arch", a->arch,
                "GGUF: architecture written: auto (deci when a llama model's widths differ between layers, as "
                "llama.cpp needs), or the model's own, or deci");
  c->add_option("--ctx", a->ctx, "GGUF: tokens per calibration and evaluation chunk")->check(CLI::Range(8, 1 << 16));
  c->add_option("--chunks", a->chunks, "GGUF: chunks of calibration and of evaluation text used")
      ->check(CLI::PositiveNumber);
  c->add_option("--random-experts", a->random_experts,
                "GGUF MoE: drop random experts with this seed instead of the least routed (for comparison)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--json", a->json, "Also write the report as JSON to this file");
  add_threads_option(c, &a->threads);
  c->callback([a] { prune_cmd(*a); });
});

}  // namespace slim::cli
