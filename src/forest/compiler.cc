// ForestCompiler: lays a loaded forest out as the flat tables of CompiledForest, and the
// checks that make a payload (fresh or read from a file) safe to walk.
#include <cmath>
#include <cstring>
#include <deque>

#include "slim/core/error.h"
#include "slim/core/tensor.h"
#include "slim/forest/compiled_forest.h"

namespace slim::forest {
namespace {

uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t(63); }

struct Layout {
  CompiledHeader h{};
};

// Computes section offsets for the header's counts; returns the payload size.
uint64_t plan_sections(CompiledHeader& h) {
  uint64_t off = align64(sizeof(CompiledHeader));
  auto take = [&](uint64_t& field, uint64_t bytes) {
    field = off;
    off = align64(off + bytes);
  };
  take(h.off_base_margin, uint64_t(h.num_groups) * 8);
  take(h.off_tree_root, uint64_t(h.num_trees) * 4);
  take(h.off_tree_group, uint64_t(h.num_trees) * 4);
  take(h.off_tree_depth, uint64_t(h.num_trees) * 4);
  // The SIMD walk gathers one node past a tree's last leaf never, but pads keep every
  // section a whole number of cache lines.
  take(h.off_threshold, uint64_t(h.num_nodes) * 4);
  take(h.off_packed, uint64_t(h.num_nodes) * 4);
  take(h.off_left, uint64_t(h.num_nodes) * 4);
  take(h.off_leaf, uint64_t(h.num_leaves) * (h.accumulate_double ? 8 : 4));
  take(h.off_category_offsets, uint64_t(h.num_category_sets + 1) * 4);
  take(h.off_category_words, uint64_t(h.num_category_words) * 4);
  h.payload_size = off;
  return off;
}

}  // namespace

CompiledForest compile_forest(const Forest& f) {
  f.validate("compile");
  slim::check(f.num_nodes() < (size_t(1) << 31), ErrorCode::resource_exhausted,
              "compile: more than 2^31 nodes");
  CompiledHeader h{};
  h.num_features = f.num_features;
  h.num_groups = f.num_groups;
  h.num_trees = uint32_t(f.trees.size());
  h.num_category_sets = uint32_t(f.category_sets.size());
  uint64_t words = 0;
  for (const auto& s : f.category_sets) words += s.words.size();
  h.num_category_words = uint32_t(words);
  h.source = uint8_t(f.source);
  h.transform = uint8_t(f.transform);
  h.accumulate_double = f.accumulate_double;
  h.truncate_category_first = f.truncate_category_first;
  h.sigmoid_scale = f.sigmoid_scale;
  h.average_divisor = f.average_divisor;

  // Breadth-first order per tree; a node's two children get consecutive slots.
  std::vector<std::vector<int32_t>> orders(f.trees.size());
  uint64_t nodes = 0, leaves = 0;
  for (size_t t = 0; t < f.trees.size(); ++t) {
    const Tree& tree = f.trees[t];
    auto& order = orders[t];
    order.push_back(0);
    for (size_t k = 0; k < order.size(); ++k) {
      const TreeNode& node = tree.nodes[size_t(order[k])];
      if (!node.is_leaf) {
        order.push_back(node.left);
        order.push_back(node.right);
      } else {
        ++leaves;
      }
    }
    nodes += order.size();
  }
  h.num_nodes = uint32_t(nodes);
  h.num_leaves = uint32_t(leaves);
  const uint64_t size = plan_sections(h);

  auto storage = Storage::allocate(size);
  uint8_t* base = static_cast<uint8_t*>(storage->data());
  auto at = [&](uint64_t off) { return base + off; };
  double* base_margin = reinterpret_cast<double*>(at(h.off_base_margin));
  for (uint32_t g = 0; g < h.num_groups; ++g)
    base_margin[g] = f.accumulate_double ? f.base_margin[g] : double(float(f.base_margin[g]));
  uint32_t* root = reinterpret_cast<uint32_t*>(at(h.off_tree_root));
  uint32_t* group = reinterpret_cast<uint32_t*>(at(h.off_tree_group));
  uint32_t* depth = reinterpret_cast<uint32_t*>(at(h.off_tree_depth));
  float* thr = reinterpret_cast<float*>(at(h.off_threshold));
  uint32_t* packed = reinterpret_cast<uint32_t*>(at(h.off_packed));
  int32_t* left = reinterpret_cast<int32_t*>(at(h.off_left));
  float* leaf_f = reinterpret_cast<float*>(at(h.off_leaf));
  double* leaf_d = reinterpret_cast<double*>(at(h.off_leaf));
  uint32_t* cat_off = reinterpret_cast<uint32_t*>(at(h.off_category_offsets));
  uint32_t* cat_words = reinterpret_cast<uint32_t*>(at(h.off_category_words));

  uint32_t w = 0;
  for (size_t c = 0; c < f.category_sets.size(); ++c) {
    cat_off[c] = w;
    for (uint32_t word : f.category_sets[c].words) cat_words[w++] = word;
  }
  cat_off[f.category_sets.size()] = w;

  uint32_t next = 0, next_leaf = 0;
  for (size_t t = 0; t < f.trees.size(); ++t) {
    const Tree& tree = f.trees[t];
    const auto& order = orders[t];
    const uint32_t start = next;
    root[t] = start;
    group[t] = tree.group;
    std::vector<uint32_t> node_depth(order.size(), 0);
    uint32_t child_slot = start + 1, tree_depth = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      const TreeNode& node = tree.nodes[size_t(order[k])];
      const uint32_t id = start + uint32_t(k);
      tree_depth = std::max(tree_depth, node_depth[k]);
      if (node.is_leaf) {
        packed[id] = kNodeLeaf;
        left[id] = int32_t(id);
        uint32_t li = next_leaf++;
        std::memcpy(&thr[id], &li, 4);
        if (f.accumulate_double) leaf_d[li] = node.leaf_value;
        else leaf_f[li] = float(node.leaf_value);
        continue;
      }
      uint32_t p = node.feature;
      if (node.default_left) p |= kNodeDefaultLeft;
      if (node.zero_missing) {
        p |= kNodeZeroMissing;
        h.flags |= kHasZeroMissing;
      }
      if (node.category_set >= 0) {
        p |= kNodeCategorical;
        h.flags |= kHasCategorical;
        const uint32_t cs = uint32_t(node.category_set);
        std::memcpy(&thr[id], &cs, 4);
      } else {
        thr[id] = node.threshold;
      }
      packed[id] = p;
      left[id] = int32_t(child_slot);
      const size_t ck = child_slot - start;
      node_depth[ck] = node_depth[ck + 1] = node_depth[k] + 1;
      child_slot += 2;
    }
    depth[t] = tree_depth;
    h.max_depth = std::max(h.max_depth, tree_depth);
    next += uint32_t(order.size());
  }
  std::memcpy(base, &h, sizeof(h));
  return CompiledForest::from_payload(base, size, storage, "compile");
}

CompiledForest CompiledForest::from_payload(const uint8_t* data, size_t size,
                                            std::shared_ptr<const void> owner,
                                            const std::string& where) {
  auto bad = [&](const std::string& what) { return Error(ErrorCode::invalid_model, where + ": " + what); };
  if (size < sizeof(CompiledHeader)) throw bad("payload smaller than its header");
  if (reinterpret_cast<uintptr_t>(data) % 64 != 0) throw bad("payload is not 64-byte aligned");
  CompiledHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.num_features == 0 || h.num_features > kNodeFeatureMask) throw bad("num_features out of range");
  if (h.num_groups == 0 || h.num_groups > 100000) throw bad("num_groups out of range");
  if (h.num_nodes >= (1u << 31) || h.num_leaves > h.num_nodes) throw bad("node counts out of range");
  if (h.num_trees > h.num_nodes || (h.num_trees == 0) != (h.num_nodes == 0)) throw bad("tree count out of range");
  if (h.source > uint8_t(SourceKind::lightgbm)) throw bad("unknown source kind");
  if (h.transform > uint8_t(Transform::argmax)) throw bad("unknown transform");
  if (h.accumulate_double > 1 || h.truncate_category_first > 1) throw bad("bad flag byte");
  if (!(std::isfinite(h.sigmoid_scale) && h.sigmoid_scale > 0)) throw bad("bad sigmoid scale");
  if (!(std::isfinite(h.average_divisor) && h.average_divisor > 0)) throw bad("bad average divisor");
  CompiledHeader expect = h;
  if (plan_sections(expect) != size || std::memcmp(&expect, &h, sizeof(h)) != 0)
    throw bad("section offsets do not match the counts (truncated or corrupt payload)");

  CompiledForest cf;
  cf.owner_ = std::move(owner);
  cf.base_ = data;
  cf.size_ = size;
  cf.h_ = reinterpret_cast<const CompiledHeader*>(data);

  const double* bm = cf.base_margin();
  for (uint32_t g = 0; g < h.num_groups; ++g)
    if (!std::isfinite(bm[g])) throw bad("base margin " + std::to_string(g) + " is not finite");
  const uint32_t* coff = cf.category_offsets();
  if (coff[0] != 0 || coff[h.num_category_sets] != h.num_category_words) throw bad("category offsets do not span the words");
  for (uint32_t c = 0; c < h.num_category_sets; ++c)
    if (coff[c] > coff[c + 1]) throw bad("category offsets are not increasing");
  if (h.accumulate_double) {
    const double* lv = static_cast<const double*>(cf.leaf_values());
    for (uint32_t i = 0; i < h.num_leaves; ++i)
      if (!std::isfinite(lv[i])) throw bad("leaf " + std::to_string(i) + " is not finite");
  } else {
    const float* lv = static_cast<const float*>(cf.leaf_values());
    for (uint32_t i = 0; i < h.num_leaves; ++i)
      if (!std::isfinite(lv[i])) throw bad("leaf " + std::to_string(i) + " is not finite");
  }

  // Every walk must end at a leaf of its own tree within tree_depth steps: children lie
  // after their parent inside the tree, leaves point to themselves, and the stored depth
  // is the real one (the batch walk steps exactly that many times).
  const uint32_t* root = cf.tree_root();
  const uint32_t* group = cf.tree_group();
  const uint32_t* depth = cf.tree_depth();
  const uint32_t* packed = cf.packed();
  const int32_t* left = cf.left();
  const float* thr = cf.threshold();
  std::vector<uint16_t> node_depth(h.num_nodes, 0);
  uint32_t max_depth = 0;
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    const uint32_t begin = root[t];
    const uint32_t end = t + 1 < h.num_trees ? root[t + 1] : h.num_nodes;
    if (begin >= end || end > h.num_nodes || (t == 0 && begin != 0))
      throw bad("tree " + std::to_string(t) + " has a bad node range");
    if (group[t] >= h.num_groups) throw bad("tree " + std::to_string(t) + " group out of range");
    uint32_t deepest = 0;
    for (uint32_t i = begin; i < end; ++i) {
      const uint32_t p = packed[i];
      uint32_t v;
      std::memcpy(&v, &thr[i], 4);
      if (p & kNodeLeaf) {
        if (p != kNodeLeaf || left[i] != int32_t(i) || v >= h.num_leaves)
          throw bad("node " + std::to_string(i) + ": malformed leaf");
        deepest = std::max<uint32_t>(deepest, node_depth[i]);
        continue;
      }
      if ((p & kNodeFeatureMask) >= h.num_features)
        throw bad("node " + std::to_string(i) + ": feature out of range");
      if ((p & kNodeCategorical) && v >= h.num_category_sets)
        throw bad("node " + std::to_string(i) + ": category set out of range");
      const int64_t l = left[i];
      if (l <= int64_t(i) || l + 1 >= int64_t(end))
        throw bad("node " + std::to_string(i) + ": child outside its tree");
      if (node_depth[i] >= 4096) throw bad("node " + std::to_string(i) + ": tree deeper than 4096");
      node_depth[size_t(l)] = node_depth[size_t(l) + 1] = uint16_t(node_depth[i] + 1);
    }
    if (deepest != depth[t]) throw bad("tree " + std::to_string(t) + ": stored depth is wrong");
    max_depth = std::max(max_depth, deepest);
  }
  if (max_depth != h.max_depth) throw bad("max depth is wrong");
  cf.simd_ = detected_simd_level();
  return cf;
}

int CompiledForest::output_width() const {
  return (transform() == Transform::argmax) ? 1 : int(num_groups());
}

}  // namespace slim::forest
