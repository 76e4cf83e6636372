// `slim prune`: what every model kind's pruning takes and reports. cmd_prune.cc parses the
// command line and picks the kind from the model file; each kind's cmd_*.cc implements it.
#pragma once

#include <string>

namespace slim::cli {

struct PruneArgs {
  std::string model, output, calib, eval, label, json;
  double target_params = 1;  // keep at most this fraction of the parameters (1: no budget)
  double target_latency_ms = 0;  // GGUF: decode milliseconds per token to reach (0: none)
  // Forests: merge splits with gain below this, and the largest margin change a
  // calibration row may see from dropped trees.
  double prune_gain = 0, max_margin_change = 0;
  int threads = 0;
  // GGUF: importance criterion ("activation", "wanda" or "magnitude"), calibration/evaluation
  // chunk length and count, a seed to drop random experts instead of the least routed (MoE),
  // the least-squares refit of the output projections (off with --no-refit) and its ridge,
  // and the architecture written ("auto", "llama", "deci", ...).
  std::string criterion = "activation", arch = "auto", allocation = "sensitivity";
  int ctx = 256, chunks = 8, random_experts = -1, refit_chunks = 32;
  bool no_refit = false, no_speed = false;
  double ridge = 1e-3, min_ffn_share = 0.5;
  // ONNX: keep at most this fraction of the Conv/Gemm/MatMul MACs; channel importance
  // (criterion: l1, l2, bn, output; "activation" means output, "magnitude" l2); kept
  // channels per group a multiple of this; held-out labels (.npy); calibration samples
  // used; bias correction off; latency rounds.
  double target_flops = 1, cost_weight = 0;
  std::string labels;
  int channel_multiple = 8, calib_samples = 64, latency_rounds = 5;
  bool no_bias_correction = false, no_recalibration = false;
};

// Forest pruning (cmd_forest.cc): tree nodes are the parameters.
void prune_forest_model(const PruneArgs& args);
// Language-model pruning (cmd_llm.cc): KV groups, FFN units, MoE experts (llm/prune.h).
void prune_llm_model(const PruneArgs& args);
// ONNX channel pruning (cmd_prune_onnx.cc): coupled Conv/Gemm channels (prune/channel_prune.h).
void prune_onnx_model(const PruneArgs& args);

}  // namespace slim::cli
