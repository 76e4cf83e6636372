// `slim prune`: what every model kind's pruning takes and reports. cmd_prune.cc parses the
// command line and picks the kind from the model file; each kind's cmd_*.cc implements it.
#pragma once

#include <string>

namespace slim::cli {

struct PruneArgs {
  std::string model, output, calib, eval, label, json;
  double target_params = 1;  // keep at most this fraction of the parameters (1: no budget)
  // Forests: merge splits with gain below this, and the largest margin change a
  // calibration row may see from dropped trees.
  double prune_gain = 0, max_margin_change = 0;
  int threads = 0;
};

// Forest pruning (cmd_forest.cc): tree nodes are the parameters.
void prune_forest_model(const PruneArgs& args);

}  // namespace slim::cli
