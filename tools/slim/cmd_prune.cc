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
  if (kind == "onnx")
    throw Error(ErrorCode::unsupported,
                a.model + ": pruning ONNX models is not available yet; slim prune takes tree ensembles and GGUF");
  if (kind == "gguf") return prune_llm_model(a);
  prune_forest_model(a);
}

}  // namespace

SLIM_COMMAND(45, [](CLI::App& app) {
  auto* c = app.add_subcommand(
      "prune", "Structured pruning: make a model smaller and faster, and report what it costs (tree ensembles: "
               "weak splits merged, trees dropped by their contribution on calibration data; GGUF language "
               "models: attention KV groups and FFN units by calibration activations, MoE experts by routing)");
  auto a = std::make_shared<PruneArgs>();
  c->add_option("MODEL", a->model, "XGBoost .json/.ubj, LightGBM .txt, .slimf or GGUF")->required()->check(CLI::ExistingFile);
  c->add_option("-o,--output", a->output, "Pruned model (.slimf for tree ensembles, .gguf for GGUF)")->required();
  c->add_option("--calib", a->calib, "Calibration data: CSV rows for trees, a text file for GGUF")
      ->check(CLI::ExistingFile);
  c->add_option("--eval", a->eval, "Held-out rows (CSV) or text (GGUF) for the report (default: the calibration data)")
      ->check(CLI::ExistingFile);
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
                "GGUF: unit importance, activation (calibration), wanda (|W| x calibration input norm) or magnitude "
                "(weights)")
      ->check(CLI::IsMember({"activation", "wanda", "magnitude"}));
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
