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
  if (kind != "forest")
    throw Error(ErrorCode::unsupported, a.model + ": pruning " + (kind == "gguf" ? "GGUF language" : "ONNX") +
                                            " models is not available yet; slim prune takes tree ensembles");
  prune_forest_model(a);
}

}  // namespace

SLIM_COMMAND(45, [](CLI::App& app) {
  auto* c = app.add_subcommand(
      "prune", "Structured pruning: make a model smaller and faster, and report what it costs (tree ensembles: "
               "weak splits merged, trees dropped by their contribution on calibration data)");
  auto a = std::make_shared<PruneArgs>();
  c->add_option("MODEL", a->model, "XGBoost .json/.ubj, LightGBM .txt or .slimf")->required()->check(CLI::ExistingFile);
  c->add_option("-o,--output", a->output, "Pruned model (.slimf for tree ensembles)")->required();
  c->add_option("--calib", a->calib, "CSV of calibration rows: tree contributions are measured on them")
      ->check(CLI::ExistingFile);
  c->add_option("--eval", a->eval, "CSV of held-out rows for the report (default: the calibration rows)")
      ->check(CLI::ExistingFile);
  c->add_option("--label-column", a->label, "Name or index of the label column in the CSVs (AUC when binary)");
  c->add_option("--target-params", a->target_params,
                "Keep at most this fraction of the parameters (tree nodes): lowest-contribution trees go first")
      ->check(CLI::Range(0.0, 1.0).description("in (0, 1]"));
  c->add_option("--max-margin-change", a->max_margin_change,
                "Never drop a tree that would move a calibration row's margin by more than this")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--prune-gain", a->prune_gain, "Merge splits whose gain is below this into leaves (source models)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--json", a->json, "Also write the report as JSON to this file");
  add_threads_option(c, &a->threads);
  c->callback([a] { prune_cmd(*a); });
});

}  // namespace slim::cli
