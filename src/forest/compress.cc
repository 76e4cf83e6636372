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

Forest drop_trees(const Forest& forest, const float* calib, int64_t rows, const TreeDropOptions& opt,
                  TreeDropStats* stats) {
  slim::check(opt.keep_nodes > 0 && opt.keep_nodes <= 1, ErrorCode::invalid_argument,
              "prune: the kept fraction of nodes must be in (0, 1]");
  slim::check(opt.max_margin_change >= 0, ErrorCode::invalid_argument,
              "prune: the largest margin change must be non-negative");
  slim::check(rows > 0, ErrorCode::invalid_argument, "prune: tree contributions need calibration rows");
  const size_t nt = forest.trees.size(), n = size_t(std::min<int64_t>(rows, kDropRows));
  const size_t step = size_t(rows) / n;  // evenly spread rows when there are more
  // Each tree's leaf values on the rows minus their mean (what dropping it changes, once
  // the mean is in the base margin), and the products of those deviations.
  std::vector<double> dev(nt * n), mean(nt, 0);
  for (size_t t = 0; t < nt; ++t) {
    double* d = dev.data() + t * n;
    for (size_t r = 0; r < n; ++r)
      mean[t] += d[r] = tree_leaf_value(forest, forest.trees[t], calib + r * step * forest.num_features);
    mean[t] /= double(n);
    for (size_t r = 0; r < n; ++r) d[r] -= mean[t];
  }
  auto dot = [&](size_t a, size_t b) {
    if (forest.trees[a].group != forest.trees[b].group) return 0.0;
    double s = 0;
    for (size_t r = 0; r < n; ++r) s += dev[a * n + r] * dev[b * n + r];
    return s;
  };
  // cross[t] = (change so far) . dev[t]: dropping t makes the squared change grow by
  // 2 cross[t] + dev[t] . dev[t].
  std::vector<double> cross(nt, 0), self(nt);
  for (size_t t = 0; t < nt; ++t) self[t] = dot(t, t);

  TreeDropStats st;
  st.nodes_before = forest.num_nodes();
  const double budget = opt.keep_nodes * double(st.nodes_before);
  const bool limited = opt.max_margin_change > 0, budgeted = opt.keep_nodes < 1;
  std::vector<double> change(size_t(forest.num_groups) * n, 0);  // per (group, row)
  std::vector<bool> drop(nt, false), blocked(nt, false);
  double nodes = double(st.nodes_before);
  for (size_t left = nt; left > 1 && (budgeted ? nodes > budget : limited);) {
    size_t best = nt;
    for (size_t t = 0; t < nt; ++t)
      if (!drop[t] && !blocked[t] && (best == nt || 2 * cross[t] + self[t] < 2 * cross[best] + self[best]))
        best = t;
    if (best == nt) break;
    double* c = change.data() + size_t(forest.trees[best].group) * n;
    const double* d = dev.data() + best * n;
    bool fits = true;
    for (size_t r = 0; r < n && fits; ++r)
      fits = !limited || std::fabs(c[r] + d[r]) / forest.average_divisor <= opt.max_margin_change;
    if (!fits) {
      blocked[best] = true;  // the change only grows
      continue;
    }
    for (size_t r = 0; r < n; ++r) c[r] += d[r];
    for (size_t t = 0; t < nt; ++t)
      if (!drop[t]) cross[t] += dot(best, t);
    drop[best] = true;
    --left;
    nodes -= double(forest.trees[best].nodes.size());
  }
  st.budget_met = nodes <= budget;
  Forest out = forest;
  out.trees.clear();
  for (size_t t = 0; t < nt; ++t) {
    if (!drop[t]) {
      out.trees.push_back(forest.trees[t]);
      continue;
    }
    out.base_margin[forest.trees[t].group] += mean[t];
    ++st.trees_dropped;
  }
  for (double c : change) st.max_margin_change = std::max(st.max_margin_change, std::fabs(c) / forest.average_divisor);
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
