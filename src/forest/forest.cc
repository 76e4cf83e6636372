// Validation and the reference evaluator of the loaded form.
#include "slim/forest/forest.h"

#include <algorithm>
#include <cmath>

#include "slim/core/error.h"

namespace slim::forest {

void Forest::validate(const std::string& where) const {
  slim::check(num_features >= 1, ErrorCode::invalid_model, where + ": no features");
  slim::check(num_groups >= 1, ErrorCode::invalid_model, where + ": no output groups");
  slim::check(base_margin.size() == num_groups, ErrorCode::invalid_model,
              where + ": " + std::to_string(base_margin.size()) + " base margins for " +
                  std::to_string(num_groups) + " groups");
  slim::check(std::isfinite(average_divisor) && average_divisor > 0, ErrorCode::invalid_model,
              where + ": bad averaging divisor");
  for (size_t t = 0; t < trees.size(); ++t) {
    const Tree& tree = trees[t];
    const std::string tw = where + ": tree " + std::to_string(t);
    slim::check(!tree.nodes.empty(), ErrorCode::invalid_model, tw + " has no nodes");
    slim::check(tree.group < num_groups, ErrorCode::invalid_model,
                tw + ": group " + std::to_string(tree.group) + " out of range");
    const size_t n = tree.nodes.size();
    // Every node must be reached exactly once from the root: no cycles, no sharing.
    std::vector<uint8_t> seen(n, 0);
    std::vector<std::pair<int32_t, int>> stack{{0, 0}};
    seen[0] = 1;
    while (!stack.empty()) {
      auto [id, depth] = stack.back();
      stack.pop_back();
      const TreeNode& node = tree.nodes[size_t(id)];
      const std::string nw = tw + " node " + std::to_string(id);
      slim::check(depth <= 4096, ErrorCode::invalid_model, nw + ": tree deeper than 4096");
      if (node.is_leaf) {
        slim::check(std::isfinite(node.leaf_value), ErrorCode::invalid_model,
                    nw + ": leaf value is not finite");
        continue;
      }
      slim::check(node.feature < num_features, ErrorCode::invalid_model,
                  nw + ": feature " + std::to_string(node.feature) + " is not below " +
                      std::to_string(num_features));
      slim::check(node.category_set < int32_t(category_sets.size()), ErrorCode::invalid_model,
                  nw + ": category set index out of range");
      for (int32_t c : {node.left, node.right}) {
        slim::check(c >= 0 && size_t(c) < n, ErrorCode::invalid_model,
                    nw + ": child " + std::to_string(c) + " out of range");
        slim::check(!seen[size_t(c)], ErrorCode::invalid_model,
                    nw + ": child " + std::to_string(c) + " is reached twice (cycle or shared node)");
        seen[size_t(c)] = 1;
        stack.push_back({c, depth + 1});
      }
    }
  }
}

size_t Forest::num_nodes() const {
  size_t n = 0;
  for (const auto& t : trees) n += t.nodes.size();
  return n;
}

size_t Forest::num_leaves() const {
  size_t n = 0;
  for (const auto& t : trees)
    for (const auto& node : t.nodes) n += node.is_leaf;
  return n;
}

int Forest::max_depth() const {
  int best = 0;
  for (const auto& tree : trees) {
    std::vector<std::pair<int32_t, int>> stack{{0, 0}};
    while (!stack.empty()) {
      auto [id, d] = stack.back();
      stack.pop_back();
      const TreeNode& node = tree.nodes[size_t(id)];
      best = std::max(best, d);
      if (!node.is_leaf) {
        stack.push_back({node.left, d + 1});
        stack.push_back({node.right, d + 1});
      }
    }
  }
  return best;
}

namespace {

bool goes_left(const Forest& f, const TreeNode& node, float x) {
  if (std::isnan(x)) return node.default_left;
  if (node.category_set >= 0) {
    const CategorySet& set = f.category_sets[size_t(node.category_set)];
    const float size = float(set.words.size() * 32);
    if (f.truncate_category_first ? x <= -1.0f : x < 0.0f) return node.default_left;
    if (x >= size) return node.default_left;
    const uint32_t c = uint32_t(int32_t(x));
    return (set.words[c / 32] >> (c % 32)) & 1u;
  }
  if (node.zero_missing && std::fabs(x) <= 1e-35f) return node.default_left;
  return x < node.threshold;
}

}  // namespace

double tree_leaf_value(const Forest& forest, const Tree& tree, const float* row) {
  int32_t id = 0;
  while (!tree.nodes[size_t(id)].is_leaf) {
    const TreeNode& node = tree.nodes[size_t(id)];
    id = goes_left(forest, node, row[node.feature]) ? node.left : node.right;
  }
  return tree.nodes[size_t(id)].leaf_value;
}

void reference_margin(const Forest& forest, const float* row, double* out) {
  if (forest.accumulate_double) {
    for (uint32_t g = 0; g < forest.num_groups; ++g) out[g] = forest.base_margin[g];
  } else {
    // Kept in float32 between additions, as XGBoost's prediction buffer is.
    for (uint32_t g = 0; g < forest.num_groups; ++g) out[g] = float(forest.base_margin[g]);
  }
  for (const Tree& tree : forest.trees) {
    const double leaf = tree_leaf_value(forest, tree, row);
    double& acc = out[tree.group];
    acc = forest.accumulate_double ? acc + leaf : double(float(acc) + float(leaf));
  }
  if (forest.average_divisor != 1.0)
    for (uint32_t g = 0; g < forest.num_groups; ++g) out[g] /= forest.average_divisor;
}

int output_width(const Forest& forest) {
  return forest.transform == Transform::argmax ? 1 : int(forest.num_groups);
}

void apply_transform(const Forest& f, const double* margin, float* out) {
  transform_margins(f.transform, f.accumulate_double, f.sigmoid_scale, f.num_groups, margin, out);
}

void transform_margins(Transform transform, bool dbl, double sigmoid_scale, uint32_t k,
                       const double* margin, float* out) {
  switch (transform) {
    case Transform::identity:
      for (uint32_t g = 0; g < k; ++g) out[g] = float(margin[g]);
      return;
    case Transform::sigmoid:
      for (uint32_t g = 0; g < k; ++g)
        out[g] = dbl ? float(1.0 / (1.0 + std::exp(-sigmoid_scale * margin[g])))
                     : 1.0f / (1.0f + expf(-float(margin[g])));
      return;
    case Transform::exp:
      for (uint32_t g = 0; g < k; ++g)
        out[g] = dbl ? float(std::exp(margin[g])) : expf(float(margin[g]));
      return;
    case Transform::softmax: {
      if (dbl) {
        double wmax = margin[0];
        for (uint32_t g = 1; g < k; ++g) wmax = std::max(wmax, margin[g]);
        double sum = 0;
        for (uint32_t g = 0; g < k; ++g) sum += std::exp(margin[g] - wmax);
        for (uint32_t g = 0; g < k; ++g) out[g] = float(std::exp(margin[g] - wmax) / sum);
      } else {
        // XGBoost: float32 exponentials summed in double, divided in float32.
        float wmax = float(margin[0]);
        for (uint32_t g = 1; g < k; ++g) wmax = fmaxf(float(margin[g]), wmax);
        double sum = 0;
        for (uint32_t g = 0; g < k; ++g) {
          out[g] = expf(float(margin[g]) - wmax);
          sum += out[g];
        }
        for (uint32_t g = 0; g < k; ++g) out[g] /= float(sum);
      }
      return;
    }
    case Transform::argmax: {
      uint32_t best = 0;
      for (uint32_t g = 1; g < k; ++g)
        if (margin[g] > margin[best]) best = g;
      out[0] = float(best);
      return;
    }
  }
}

}  // namespace slim::forest
