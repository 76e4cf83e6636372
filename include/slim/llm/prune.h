// Structured pruning of GGUF language models (`slim prune model.gguf`): whole KV groups of
// attention heads (a KV head with the query heads that share it) and FFN hidden units of
// dense layers, least-routed experts of MoE layers. The result is a smaller GGUF whose
// per-layer widths are arrays (`{arch}.attention.head_count`, `head_count_kv`,
// `feed_forward_length`), as llama.cpp reads variable-width models; LlamaModel loads it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "slim/llm/gguf.h"

namespace slim::llm {

// How a unit's importance is measured. activation: the mean squared norm of what it adds
// to the residual stream on the calibration text (a KV group's heads through their columns
// of attn_output, a hidden unit's activation times its ffn_down column). magnitude: no
// data, the product of the Frobenius norms of the unit's input and output weights.
enum class PruneCriterion { activation, magnitude };

struct PruneOptions {
  double target_params = 0.75;  // keep at most this fraction of the model's parameters
  PruneCriterion criterion = PruneCriterion::activation;
  int n_ctx = 256, calib_chunks = 8;  // calibration: chunks of n_ctx tokens of the text
  int width_multiple = 32;            // FFN widths are kept multiples of this (kernel tiles, quant blocks)
  int expert_seed = -1;               // MoE: drop random experts with this seed instead of the least routed
  int threads = 0;
  std::function<void(const std::string& stage, int done, int total)> progress;
};

// What stays of each layer: indices (ascending) of KV heads, FFN hidden units and experts.
struct LayerKeep {
  std::vector<int> kv_heads, neurons, experts;
};

struct PruneResult {
  int64_t params_before = 0, params_after = 0;
  std::vector<LayerKeep> keep;
  // Dense models: the calibration NLL per token added by each layer's probe (its least
  // important KV group removed; target-fraction of its FFN units removed).
  std::vector<double> attn_sensitivity, ffn_sensitivity;
  double base_nll = 0;  // calibration NLL per token of the unpruned model
};

// Plans the pruning of `in_path` on the calibration text and writes the pruned model.
// Errors: invalid_argument for a target outside (0, 1], a text shorter than one chunk, or a
// target the model cannot reach (every layer keeps one KV group, width_multiple units and
// the routed expert count).
PruneResult prune_model(const std::string& in_path, const std::string& out_path, const std::string& calib_text,
                        const PruneOptions& options);

// Writes `src` with only the units in `keep` (one entry per layer). Rows are copied as
// they are; a matrix losing columns (attn_output, ffn_down) is decoded and re-encoded in
// its type, or as F32 when the new row length does not fit the type's blocks.
void write_pruned(const GgufFile& src, const std::vector<LayerKeep>& keep, const std::string& out_path);

}  // namespace slim::llm
