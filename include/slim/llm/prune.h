// Structured pruning of GGUF language models (`slim prune model.gguf`): whole KV groups of
// attention heads (a KV head with the query heads that share it) and FFN hidden units of
// dense layers, least-routed experts of MoE layers. The result is a smaller GGUF whose
// per-layer widths are arrays (`{arch}.attention.head_count`, `head_count_kv`,
// `feed_forward_length`), as llama.cpp reads variable-width models; LlamaModel loads it.
// llama.cpp builds every layer of its `llama` architecture with layer 0's widths, so a
// variable-width llama model is written as `deci` (Nemotron-NAS: llama's math, per-layer
// widths), which both engines run.
//
// After removal the output projections (attn_output over the kept heads, ffn_down over the
// kept hidden units) are refitted by least squares on the calibration activations, so the
// kept units take over what the removed ones contributed where they can.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "slim/llm/gguf.h"

namespace slim::llm {

// How a unit's importance is measured. activation: the mean squared norm of what it adds
// to the residual stream on the calibration text (a KV group's heads through their columns
// of attn_output, a hidden unit's activation times its ffn_down column). wanda: Wanda's
// |W| * ||x|| summed over the unit's output-projection weights (x: the projection's input
// on the calibration text). magnitude: no data, the product of the Frobenius norms of the
// unit's input and output weights.
enum class PruneCriterion { activation, wanda, magnitude };

struct PruneOptions {
  double target_params = 0.75;  // keep at most this fraction of the model's parameters
  PruneCriterion criterion = PruneCriterion::activation;
  bool uniform = false;  // every layer loses the same share of FFN units, no heads (instead of the sensitivity scan)
  // Every layer keeps at least this share of its FFN units while the budget allows (lowered
  // in eighths when it does not).
  double min_ffn_share = 0.5;
  bool refit = true;    // least-squares refit of attn_output / ffn_down over the kept units
  double ridge = 1e-3;  // the refit's regularization, relative to the kept units' mean activation energy
  // Architecture written: "" (auto: `deci` for a llama model whose widths differ between
  // layers, else the model's own), or the model's own, or "deci" (from llama).
  std::string arch;
  // Calibration: chunks of n_ctx tokens of the text. Dense models: the importances and the
  // refit come from at most refit_chunks chunks of its first half, the sensitivity probes
  // measure on calib_chunks chunks of its second half (one text serves both when too short).
  int n_ctx = 256, calib_chunks = 8, refit_chunks = 32;
  int width_multiple = 32;            // FFN widths are kept multiples of this (kernel tiles, quant blocks)
  int expert_seed = -1;               // MoE: drop random experts with this seed instead of the least routed
  int threads = 0;
  std::function<void(const std::string& stage, int done, int total)> progress;
};

// What stays of each layer: indices (ascending) of KV heads, FFN hidden units and experts;
// optionally new output-projection columns for the kept units (n_embd rows of the kept
// width, row-major, as refit_outputs computes them); empty: the original columns.
struct LayerKeep {
  std::vector<int> kv_heads, neurons, experts;
  std::vector<float> attn_output = {}, ffn_down = {};
};

// Calibration statistics of a dense model: per layer, the Gram matrices (sums over the
// calibration tokens of x x^T, in double) of attn_output's input (the heads' concatenated
// outputs) and of ffn_down's input (the SwiGLU hidden units).
struct CalibrationStats {
  std::vector<std::vector<double>> attn_gram, ffn_gram;
  std::vector<int> attn_dim, ffn_dim;
  int64_t tokens = 0;
};

// Runs the model over `tokens` in chunks of n_ctx (a shorter tail is dropped) and sums the Grams.
CalibrationStats calibrate(const std::string& model_path, std::span<const int32_t> tokens, int n_ctx, int threads);

// The least-squares refit: for every layer of `keep` that loses heads or hidden units, the
// kept units' columns W' of attn_output / ffn_down minimizing
//   ||X W^T - X_K W'^T||^2 + lambda ||W' - W_K||^2   (X: the calibration activations,
//   K: the kept units, lambda = ridge * the mean of X_K's squared column norms),
// solved in double with a Cholesky factorization: W' = W_K + R^T (G_KK + lambda I)^-1 G_KR^T
// with G = X^T X and R the removed units. Exact (ridge 0) when the kept units' activations
// span the removed ones'.
void refit_outputs(const GgufFile& model, const CalibrationStats& stats, std::vector<LayerKeep>& keep, double ridge);

struct PruneResult {
  int64_t params_before = 0, params_after = 0;
  std::vector<LayerKeep> keep;
  // Dense models: the calibration NLL per token added by each layer's probes (its least
  // important KV group removed; a quarter, half, three quarters of its FFN units removed:
  // ffn_probes, ffn_sensitivity the half), measured on the calibration text's second half.
  std::vector<double> attn_sensitivity, ffn_sensitivity;
  std::vector<std::vector<double>> ffn_probes;
  double base_nll = 0;  // calibration NLL per token of the unpruned model
  std::string arch;     // the architecture written
};

// Plans the pruning of `in_path` on the calibration text and writes the pruned model.
// Errors: invalid_argument for a target outside (0, 1], a text shorter than one chunk, a
// target the model cannot reach (every layer keeps one KV group, width_multiple units and
// the routed expert count), or an architecture it cannot be written as.
PruneResult prune_model(const std::string& in_path, const std::string& out_path, const std::string& calib_text,
                        const PruneOptions& options);

// Writes `src` with only the units in `keep` (one entry per layer). Rows are copied as
// they are; a matrix losing columns (attn_output, ffn_down) is decoded and re-encoded in
// its type, or as F32 when the new row length does not fit the type's blocks. `arch`: the
// architecture written ("" or the source's: unchanged; "deci" from llama: every
// `llama.` key renamed, per-layer widths always arrays).
void write_pruned(const GgufFile& src, const std::vector<LayerKeep>& keep, const std::string& out_path,
                  const std::string& arch = "");

}  // namespace slim::llm
