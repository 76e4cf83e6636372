// Lossy threshold quantization and pruning on the loaded form.
#include "slim/forest/compress.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "slim/core/error.h"

namespace slim::forest {

Forest quantize_thresholds(const Forest& forest, int bits, const float* calib, int64_t rows,
                           QuantizeStats* stats) {
  slim::check(bits >= 1 && bits <= 16, ErrorCode::invalid_argument,
              "quantize: bits must be in [1, 16], got " + std::to_string(bits));
  const size_t limit = (size_t(1) << bits) - 1;
  const uint32_t F = forest.num_features;
  std::vector<std::vector<float>> thresholds(F);
  for (const auto& tree : forest.trees)
    for (const auto& node : tree.nodes)
      if (!node.is_leaf && node.category_set < 0) thresholds[node.feature].push_back(node.threshold);
  QuantizeStats st;
  std::vector<std::map<float, float>> snap(F);
  for (uint32_t f = 0; f < F; ++f) {
    auto& t = thresholds[f];
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    st.thresholds_before += t.size();
    if (t.size() <= limit) {
      st.thresholds_after += t.size();
      continue;
    }
    ++st.features_changed;
    // The distribution to quantize against: calibration values, else the thresholds.
    std::vector<float> v;
    if (calib && rows > 0) {
      for (int64_t r = 0; r < rows; ++r) {
        const float x = calib[r * F + f];
        if (!std::isnan(x)) v.push_back(x);
      }
    }
    if (v.size() < 2) v = t;
    std::sort(v.begin(), v.end());
    // rank(t): how many calibration values fall below t, i.e. go left at a split on t.
    auto rank = [&](float x) { return double(std::lower_bound(v.begin(), v.end(), x) - v.begin()); };
    std::vector<double> t_rank(t.size());
    for (size_t i = 0; i < t.size(); ++i) t_rank[i] = rank(t[i]);
    std::vector<size_t> reps;
    for (size_t j = 1; j <= limit; ++j) {
      const double q = double(v.size()) * double(j) / double(limit + 1);
      const size_t k = size_t(std::lower_bound(t_rank.begin(), t_rank.end(), q) - t_rank.begin());
      size_t best = std::min(k, t.size() - 1);
      if (k > 0 && std::fabs(t_rank[k - 1] - q) <= std::fabs(t_rank[best] - q)) best = k - 1;
      reps.push_back(best);
    }
    std::sort(reps.begin(), reps.end());
    reps.erase(std::unique(reps.begin(), reps.end()), reps.end());
    st.thresholds_after += reps.size();
    for (size_t i = 0; i < t.size(); ++i) {
      // Nearest representative in rank (fewest re-routed values), then in value.
      size_t best = reps[0];
      for (size_t r : reps) {
        const double d = std::fabs(t_rank[r] - t_rank[i]), db = std::fabs(t_rank[best] - t_rank[i]);
        if (d < db || (d == db && std::fabs(t[r] - t[i]) < std::fabs(t[best] - t[i]))) best = r;
      }
      snap[f][t[i]] = t[best];
    }
  }
  Forest out = forest;
  for (auto& tree : out.trees)
    for (auto& node : tree.nodes)
      if (!node.is_leaf && node.category_set < 0 && !snap[node.feature].empty())
        node.threshold = snap[node.feature].at(node.threshold);
  if (stats) *stats = st;
  return out;
}

namespace {

// Copies the subtree at `id` into `out`, merging weak splits bottom-up; returns its index.
int32_t prune_copy(const Forest& f, const Tree& tree, int32_t id, const PruneOptions& opt,
                   std::vector<TreeNode>& out, PruneStats& st) {
  const TreeNode& node = tree.nodes[size_t(id)];
  const int32_t me = int32_t(out.size());
  out.push_back(node);
  if (node.is_leaf) return me;
  const int32_t l = prune_copy(f, tree, node.left, opt, out, st);
  const int32_t r = prune_copy(f, tree, node.right, opt, out, st);
  out[size_t(me)].left = l;
  out[size_t(me)].right = r;
  const TreeNode& a = out[size_t(l)];
  const TreeNode& b = out[size_t(r)];
  if (a.is_leaf && b.is_leaf && double(node.gain) < opt.min_gain) {
    const double ca = std::max(0.0f, a.cover), cb = std::max(0.0f, b.cover);
    double v = (ca + cb > 0) ? (ca * a.leaf_value + cb * b.leaf_value) / (ca + cb)
                             : 0.5 * (a.leaf_value + b.leaf_value);
    if (!f.accumulate_double) v = float(v);  // XGBoost leaves are float32
    TreeNode leaf;
    leaf.is_leaf = true;
    leaf.leaf_value = v;
    leaf.cover = float(ca + cb);
    out.resize(size_t(me));
    out.push_back(leaf);
    ++st.splits_merged;
  }
  return me;
}

}  // namespace

Forest prune_forest(const Forest& forest, const PruneOptions& opt, PruneStats* stats) {
  slim::check(opt.min_gain >= 0 && opt.min_tree_effect >= 0, ErrorCode::invalid_argument,
              "prune: thresholds must be non-negative");
  PruneStats st;
  st.nodes_before = forest.num_nodes();
  Forest out = forest;
  out.trees.clear();
  for (const Tree& tree : forest.trees) {
    Tree t;
    t.group = tree.group;
    prune_copy(forest, tree, 0, opt, t.nodes, st);
    double effect = 0;
    for (const auto& n : t.nodes)
      if (n.is_leaf) effect = std::max(effect, std::fabs(n.leaf_value));
    if (opt.min_tree_effect > 0 && effect < opt.min_tree_effect) {
      ++st.trees_dropped;
      continue;
    }
    out.trees.push_back(std::move(t));
  }
  st.nodes_after = out.num_nodes();
  out.validate("prune");
  if (stats) *stats = st;
  return out;
}

double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  slim::check(scores.size() == labels.size() && !scores.empty(), ErrorCode::invalid_argument,
              "auc: scores and labels differ in length or are empty");
  std::vector<size_t> idx(scores.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double pos = 0, neg = 0, rank_sum = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && scores[idx[j]] == scores[idx[i]]) ++j;
    const double avg_rank = 0.5 * double(i + j + 1);  // 1-based average rank of the tie
    for (size_t k = i; k < j; ++k)
      if (labels[idx[k]] > 0.5f) rank_sum += avg_rank;
    i = j;
  }
  for (float l : labels) (l > 0.5f ? pos : neg) += 1;
  slim::check(pos > 0 && neg > 0, ErrorCode::invalid_argument, "auc: needs both classes");
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

double log_loss(const std::vector<float>& probs, const std::vector<float>& labels) {
  slim::check(probs.size() == labels.size() && !probs.empty(), ErrorCode::invalid_argument,
              "logloss: probabilities and labels differ in length or are empty");
  double s = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(double(probs[i]), 1e-15, 1 - 1e-15);
    s -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return s / double(probs.size());
}

}  // namespace slim::forest
