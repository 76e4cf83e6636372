// Forest compression: k-bit threshold quantization (at most 2^k - 1 distinct thresholds
// per feature, snapped to calibration quantiles) and pruning (weak splits merged into
// leaves, negligible trees dropped), plus the metrics that measure what they cost.
// Lossless compression needs no transform: the compact .slimf encoding (slimf.h) stores
// every threshold as its rank in a per-feature table.
#pragma once

#include <cstdint>
#include <vector>

#include "slim/forest/forest.h"

namespace slim::forest {

struct QuantizeStats {
  uint32_t features_changed = 0;   // features that had more thresholds than 2^k - 1
  uint64_t thresholds_before = 0;  // distinct (feature, threshold) pairs
  uint64_t thresholds_after = 0;
};

// Returns a copy whose numeric thresholds take at most 2^bits - 1 distinct values per
// feature. Representatives are the model's own thresholds nearest to evenly spaced
// quantiles of the calibration column (calib: rows x num_features floats, NaN ignored;
// null or 0 rows: the thresholds' own distribution); each threshold moves to the
// representative that re-routes the fewest calibration values.
Forest quantize_thresholds(const Forest& forest, int bits, const float* calib, int64_t rows,
                           QuantizeStats* stats = nullptr);

struct PruneOptions {
  double min_gain = 0;          // merge a split whose children are leaves and gain < this
  double min_tree_effect = 0;   // drop a tree whose largest |leaf| is below this
};

struct PruneStats {
  uint64_t splits_merged = 0;
  uint64_t trees_dropped = 0;
  uint64_t nodes_before = 0, nodes_after = 0;
};

// Merged leaves take the cover-weighted mean of their children (plain mean without cover).
Forest prune_forest(const Forest& forest, const PruneOptions& options, PruneStats* stats = nullptr);

// Tree-level pruning on calibration data. Dropping a tree and folding its mean leaf value
// over the rows into the base margin changes each row's margin by the tree's deviation
// from that mean; trees go one at a time, each time the one that makes the squared margin
// change over the rows (all trees dropped so far together) grow least, so trees that
// cancel each other go together and a tree that only adds a near-constant costs nothing.
// Drops go on while the budget asks for them, and never past max_margin_change on any row
// (in any group). At most kDropRows rows, evenly spread, are used.
inline constexpr int64_t kDropRows = 4096;
struct TreeDropOptions {
  double keep_nodes = 1;          // keep at most this fraction of the nodes (1: no budget)
  double max_margin_change = 0;   // largest margin change allowed on a calibration row (0: none)
};

struct TreeDropStats {
  uint64_t trees_dropped = 0;
  uint64_t nodes_before = 0, nodes_after = 0;
  double max_margin_change = 0;  // on the calibration rows, after folding the means
  bool budget_met = true;        // false when max_margin_change stopped drops short of keep_nodes
};

// calib: rows x num_features floats (at least one row). A 0 < keep_nodes <= 1 budget, a
// max_margin_change >= 0; with neither limiting (keep_nodes 1 and no margin limit) nothing
// is dropped. The last tree always stays.
Forest drop_trees(const Forest& forest, const float* calib, int64_t rows, const TreeDropOptions& options,
                  TreeDropStats* stats = nullptr);

// Area under the ROC curve of scores against 0/1 labels (ties get half credit).
double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels);
// Mean binary log loss of probabilities (clamped to [1e-15, 1 - 1e-15]).
double log_loss(const std::vector<float>& probs, const std::vector<float>& labels);

}  // namespace slim::forest
