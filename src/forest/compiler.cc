// ForestCompiler: lays a loaded forest out as the flat tables of CompiledForest, and the
// checks that make a payload (fresh or read from a file) safe to walk.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/tensor.h"
#include "forest/walk.h"
#include "slim/forest/compiled_forest.h"

namespace slim::forest {
namespace {

uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t(63); }

// Computes section offsets for the header's counts; returns the payload size.
uint64_t plan_sections(CompiledHeader& h) {
  uint64_t off = align64(sizeof(CompiledHeader));
  auto take = [&](uint64_t& field, uint64_t bytes) {
    field = off;
    off = align64(off + bytes);
  };
  const bool ranked = h.flags & kRanked;
  take(h.off_base_margin, uint64_t(h.num_groups) * 8);
  take(h.off_tree_root, uint64_t(h.num_trees) * 4);
  take(h.off_tree_group, uint64_t(h.num_trees) * 4);
  take(h.off_tree_depth, uint64_t(h.num_trees) * 4);
  take(h.off_threshold, ranked ? 0 : uint64_t(h.num_nodes) * 4);
  take(h.off_packed, uint64_t(h.num_nodes) * 4);
  take(h.off_left, uint64_t(h.num_nodes) * 4);
  take(h.off_leaf, uint64_t(h.num_leaves) * (h.accumulate_double ? 8 : 4));
  take(h.off_category_offsets, uint64_t(h.num_category_sets + 1) * 4);
  take(h.off_category_words, uint64_t(h.num_category_words) * 4);
  take(h.off_bin_offsets, ranked ? uint64_t(h.num_features + 1) * 4 : 0);
  take(h.off_bin_values, uint64_t(h.num_bin_values) * 4);
  h.payload_size = off;
  return off;
}

// Per feature, the sorted distinct thresholds of its numeric splits (-0 and +0 are one
// value: they route every input alike).
std::vector<std::vector<float>> threshold_tables(const Forest& f) {
  std::vector<std::vector<float>> tables(f.num_features);
  for (const Tree& tree : f.trees)
    for (const TreeNode& n : tree.nodes)
      if (!n.is_leaf && n.category_set < 0) tables[n.feature].push_back(n.threshold);
  for (auto& t : tables) {
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
  }
  return tables;
}

}  // namespace

std::string ranked_layout_blocker(const Forest& f) {
  if (f.num_features > kRankedFeatureMask + 1)
    return std::to_string(f.num_features) + " features (the ranked layout holds at most " +
           std::to_string(kRankedFeatureMask + 1) + ")";
  for (const Tree& tree : f.trees)
    for (const TreeNode& n : tree.nodes) {
      if (n.is_leaf) continue;
      if (n.category_set >= 0) return "categorical splits";
      if (n.zero_missing) return "zero-as-missing splits";
    }
  const auto tables = threshold_tables(f);
  for (size_t i = 0; i < tables.size(); ++i)
    if (tables[i].size() > kRankMask)
      return "feature " + std::to_string(i) + " has " + std::to_string(tables[i].size()) +
             " distinct thresholds (at most " + std::to_string(kRankMask) + ")";
  return {};
}

CompiledForest compile_forest(const Forest& f, bool ranked) {
  f.validate("compile");
  slim::check(f.num_nodes() < (size_t(1) << 31), ErrorCode::resource_exhausted,
              "compile: more than 2^31 nodes");
  if (ranked) {
    const std::string why = ranked_layout_blocker(f);
    slim::check(why.empty(), ErrorCode::unsupported,
                "compile: lossless threshold ranks need numeric splits only; this model has " + why);
  }
  const auto tables = ranked ? threshold_tables(f) : std::vector<std::vector<float>>{};
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
  slim::check(leaves <= kNodeFeatureMask, ErrorCode::resource_exhausted, "compile: more than 2^28 leaves");
  if (ranked) {
    h.flags |= kRanked;
    uint64_t values = 0;
    for (const auto& t : tables) values += t.size();
    h.num_bin_values = uint32_t(values);
  } else if (!f.accumulate_double) {
    h.flags |= kLeafInThreshold;
  }
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
  if (ranked) {
    uint32_t* bin_off = reinterpret_cast<uint32_t*>(at(h.off_bin_offsets));
    float* bin_val = reinterpret_cast<float*>(at(h.off_bin_values));
    uint32_t v = 0;
    for (uint32_t feat = 0; feat < f.num_features; ++feat) {
      bin_off[feat] = v;
      for (float t : tables[feat]) bin_val[v++] = t;
    }
    bin_off[f.num_features] = v;
  }

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
        const uint32_t li = next_leaf++;
        packed[id] = kNodeLeaf | li;
        left[id] = int32_t(id);
        if (f.accumulate_double) leaf_d[li] = node.leaf_value;
        else leaf_f[li] = float(node.leaf_value);
        // See kLeafInThreshold; with double leaves the slot is unused and zero.
        if (!ranked) thr[id] = f.accumulate_double ? 0.f : leaf_f[li];
        continue;
      }
      uint32_t p = node.feature;
      if (node.default_left) p |= kNodeDefaultLeft;
      if (node.zero_missing) {
        p |= kNodeZeroMissing;
        h.flags |= kHasZeroMissing;
      }
      if (ranked) {
        const auto& t = tables[node.feature];
        const uint32_t rank = uint32_t(std::lower_bound(t.begin(), t.end(), node.threshold) - t.begin()) + 1;
        p |= rank << kRankShift;
      } else if (node.category_set >= 0) {
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

namespace {

// What both node checks read: the node tables, and which packed bits a split may set.
struct NodeTables {
  explicit NodeTables(const CompiledForest& cf)
      : h(cf.header()),
        ranked(h.flags & kRanked),
        root(cf.tree_root()),
        depth(cf.tree_depth()),
        packed(cf.packed()),
        left(cf.left()),
        thr_bits(reinterpret_cast<const uint32_t*>(cf.threshold())),
        leaf_bits((h.flags & kLeafInThreshold) ? static_cast<const uint32_t*>(cf.leaf_values()) : nullptr),
        feat_mask(ranked ? kRankedFeatureMask : kNodeFeatureMask),
        split_bits(ranked ? (kNodeDefaultLeft | feat_mask | (kRankMask << kRankShift))
                          : (kNodeDefaultLeft | kNodeCategorical | kNodeZeroMissing | feat_mask)) {}
  const CompiledHeader& h;
  bool ranked;
  const uint32_t *root, *depth, *packed;
  const int32_t* left;
  const uint32_t* thr_bits;
  const uint32_t* leaf_bits;  // float leaves whose copies sit in the threshold slots, else null
  uint32_t feat_mask, split_bits;
};

// Every walk must end at a leaf of its own tree within tree_depth steps. compile_forest
// lays each tree out breadth-first with the children of the k-th split of a tree in
// slots 1 + 2k and 2 + 2k, and a payload is accepted only in exactly that canonical
// form: then children always lie after their parent inside the tree, levels are
// contiguous ranges (so the depth is counted without a per-node depth table), and the
// check is a few counters and compares per node. Leaves point to themselves; splits
// name a valid feature and a valid category set or threshold rank. The first pass only
// accumulates one flag (1,000 trees load well under a millisecond); when it fails, the
// second pass (explain) finds the first bad node and throws.
template <bool kExplain>
bool check_nodes(const CompiledForest& cf, const std::string& where) {
  auto fail = [&](const std::string& what) {
    if constexpr (kExplain) throw Error(ErrorCode::invalid_model, where + ": " + what);
  };
  const NodeTables nt(cf);
  const auto& [h, ranked, root, depth, packed, left, thr_bits, leaf_bits, feat_mask, split_bits] = nt;
  const uint32_t* bin_off = ranked ? cf.bin_offsets() : nullptr;
  uint32_t max_depth = 0;
  uint32_t bad = 0;
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    const uint32_t begin = root[t];
    const uint32_t end = t + 1 < h.num_trees ? root[t + 1] : h.num_nodes;
    if (begin >= end || end > h.num_nodes || (t == 0 && begin != 0) || cf.tree_group()[t] >= h.num_groups) {
      fail("tree " + std::to_string(t) + " has a bad node range or group");
      return false;
    }
    uint32_t next_child = begin + 1;  // slot of the next split's left child
    uint32_t level_end = begin + 1, levels = 0;
    for (uint32_t i = begin; i < end; ++i) {
      if (i == level_end) {  // the previous level's splits placed their children up to here
        level_end = next_child;
        ++levels;
      }
      // One arithmetic fault word per node, no branches on data in the fast pass:
      // leaves must point to themselves with an in-range leaf index, splits to the
      // next canonical child slot (after them) with an in-range feature and threshold.
      // (Selections by mask: compilers turn `leaf ? a : b` into a branch that
      // mispredicts on every other node, which cost more than all the checks.)
      const uint32_t p = packed[i];
      const uint32_t leaf = (p >> 30) & 1u;
      const uint32_t lm = 0u - leaf;  // all ones on a leaf
      auto pick = [lm](uint32_t on_leaf, uint32_t on_split) { return (on_leaf & lm) | (on_split & ~lm); };
      const uint32_t expect_left = pick(i, next_child);
      const uint32_t index = p & pick(kNodeFeatureMask, feat_mask);
      const uint32_t limit = pick(h.num_leaves, h.num_features);
      const uint32_t allowed = pick(kNodeLeaf | kNodeFeatureMask, split_bits);
      uint32_t fault = (uint32_t(left[i]) ^ expect_left) | uint32_t(index >= limit) | (p & ~allowed) |
                       (~lm & uint32_t(next_child <= i));
      if (ranked) {
        const uint32_t ff = index & kRankedFeatureMask & ~lm;  // < 4,096 entries exist; checked above
        const uint32_t top = ff + 1 <= h.num_features ? ff : 0;
        const uint32_t r = (p >> kRankShift) & kRankMask;
        fault |= ~lm & uint32_t(r - 1u >= bin_off[top + 1] - bin_off[top]);
      } else if (__builtin_expect(!leaf & bool(p & kNodeCategorical), 0)) {
        fault |= uint32_t(thr_bits[i] >= h.num_category_sets);
      }
      if (leaf_bits) {  // a leaf's threshold slot holds its value (kLeafInThreshold)
        const uint32_t li = index < h.num_leaves ? index : 0;  // a bad index already faulted
        fault |= lm & (thr_bits[i] ^ leaf_bits[li]);
      }
      if constexpr (kExplain) {
        if (fault) {
          const std::string node = "node " + std::to_string(i) + ": ";
          if (leaf && index < limit && leaf_bits && thr_bits[i] != leaf_bits[index])
            fail(node + "leaf value copy differs from the leaf table");
          if (leaf) fail(node + "malformed leaf");
          if (index >= limit) fail(node + "feature out of range");
          if (uint32_t(left[i]) != next_child || next_child <= i) fail(node + "child outside its tree");
          if (p & ~split_bits) fail(node + "unknown flag bits");
          fail(node + (ranked ? "threshold rank out of range" : "category set out of range"));
        }
      }
      bad |= fault;
      next_child += 2 & ~lm;
    }
    // All slots filled by exactly the children the splits placed (a split whose children
    // would lie past the tree overshoots); the depth is the number of levels below the root.
    if (next_child != end || levels != depth[t] || levels >= 4096) {
      fail("tree " + std::to_string(t) + ": node count, shape or stored depth is wrong");
      return false;
    }
    max_depth = std::max(max_depth, levels);
  }
  if (max_depth != h.max_depth) {
    fail("max depth is wrong");
    return false;
  }
  return bad == 0;
}

// check_nodes<false> with AVX-512, 16 nodes per step: the canonical child slots come
// from an in-register prefix count of the splits, and level boundaries from the split
// mask. It accepts exactly what the scalar pass accepts (tests compare the two on
// damaged payloads).
// GCC 12 warns falsely about the intrinsics' internal undefined source operands.
#if defined(__x86_64__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) bool check_nodes_avx512(const CompiledForest& cf) {
  const NodeTables nt(cf);
  const auto& [h, ranked, root, depth, packed, left, thr_bits, leaf_bits, feat_mask, split_bits] = nt;
  std::vector<uint32_t> rank_limit;
  if (ranked) {
    const uint32_t* off = cf.bin_offsets();
    for (uint32_t f = 0; f < h.num_features; ++f) rank_limit.push_back(off[f + 1] - off[f]);
  }
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  const __m512i leaf_bit = _mm512_set1_epi32(int32_t(kNodeLeaf));
  const __m512i leaf_extra = _mm512_set1_epi32(int32_t(~(kNodeLeaf | kNodeFeatureMask)));
  const __m512i split_extra = _mm512_set1_epi32(int32_t(~split_bits));
  const __m512i leaf_index_mask = _mm512_set1_epi32(int32_t(kNodeFeatureMask));
  const __m512i feat_mask_v = _mm512_set1_epi32(int32_t(feat_mask));
  const __m512i num_leaves = _mm512_set1_epi32(int32_t(h.num_leaves));
  const __m512i last_leaf = _mm512_set1_epi32(int32_t(h.num_leaves ? h.num_leaves - 1 : 0));
  const __m512i num_features = _mm512_set1_epi32(int32_t(h.num_features));
  const __m512i last_feature = _mm512_set1_epi32(int32_t(h.num_features - 1));
  const __m512i cat_bit = _mm512_set1_epi32(int32_t(kNodeCategorical));
  const __m512i num_sets = _mm512_set1_epi32(int32_t(h.num_category_sets));
  const __m512i rank_mask = _mm512_set1_epi32(int32_t(kRankMask));
  __mmask16 fault = 0;
  uint32_t max_depth = 0;
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    const uint32_t begin = root[t];
    const uint32_t end = t + 1 < h.num_trees ? root[t + 1] : h.num_nodes;
    if (begin >= end || end > h.num_nodes || (t == 0 && begin != 0) || cf.tree_group()[t] >= h.num_groups)
      return false;
    uint32_t next_child = begin + 1, level_end = begin + 1, levels = 0;
    for (uint32_t i0 = begin; i0 < end; i0 += 16) {
      const uint32_t cnt = std::min<uint32_t>(16, end - i0);
      const __mmask16 valid = __mmask16(cnt == 16 ? 0xffffu : (1u << cnt) - 1);
      const __m512i p = _mm512_maskz_loadu_epi32(valid, packed + i0);
      const __m512i l = _mm512_maskz_loadu_epi32(valid, left + i0);
      const __m512i iv = _mm512_add_epi32(_mm512_set1_epi32(int32_t(i0)), lane);
      const __mmask16 leaf = _mm512_mask_test_epi32_mask(valid, p, leaf_bit);
      const __mmask16 split = __mmask16(~leaf & valid);
      // Exclusive prefix count of the splits before each lane.
      const __m512i s = _mm512_maskz_mov_epi32(split, one);
      __m512i incl = _mm512_add_epi32(s, _mm512_alignr_epi32(s, zero, 15));
      incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 14));
      incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 12));
      incl = _mm512_add_epi32(incl, _mm512_alignr_epi32(incl, zero, 8));
      const __m512i child = _mm512_add_epi32(_mm512_set1_epi32(int32_t(next_child)),
                                             _mm512_slli_epi32(_mm512_sub_epi32(incl, s), 1));
      __mmask16 bad = _mm512_mask_cmpneq_epi32_mask(valid, l, _mm512_mask_blend_epi32(leaf, child, iv));
      bad |= _mm512_mask_cmpge_epu32_mask(leaf, _mm512_and_si512(p, leaf_index_mask), num_leaves);
      bad |= _mm512_mask_test_epi32_mask(leaf, p, leaf_extra);
      const __m512i f = _mm512_and_si512(p, feat_mask_v);
      bad |= _mm512_mask_cmpge_epu32_mask(split, f, num_features);
      bad |= _mm512_mask_test_epi32_mask(split, p, split_extra);
      bad |= _mm512_mask_cmple_epu32_mask(split, child, iv);
      if (ranked) {
        const __m512i r = _mm512_and_si512(_mm512_srli_epi32(p, kRankShift), rank_mask);
        const __m512i lim = _mm512_mask_i32gather_epi32(zero, split, _mm512_min_epu32(f, last_feature),
                                                        rank_limit.data(), 4);
        bad |= _mm512_mask_cmpge_epu32_mask(split, _mm512_sub_epi32(r, one), lim);
      } else {
        const __mmask16 cat = _mm512_mask_test_epi32_mask(split, p, cat_bit);
        if (cat) bad |= _mm512_mask_cmpge_epu32_mask(cat, _mm512_maskz_loadu_epi32(cat, thr_bits + i0), num_sets);
        if (leaf_bits) {
          const __m512i li = _mm512_min_epu32(_mm512_and_si512(p, leaf_index_mask), last_leaf);
          const __m512i copy = _mm512_mask_i32gather_epi32(zero, leaf, li, leaf_bits, 4);
          bad |= _mm512_mask_cmpneq_epi32_mask(leaf, copy, _mm512_maskz_loadu_epi32(valid, thr_bits + i0));
        }
      }
      fault |= bad;
      // Level boundaries inside this chunk: the next level ends where the splits before
      // its first node have placed their children.
      while (level_end < i0 + cnt) {
        const uint32_t before = uint32_t(split) & ((1u << (level_end - i0)) - 1u);
        const uint32_t nc = next_child + 2 * uint32_t(__builtin_popcount(before));
        if (nc <= level_end) return false;  // a node no split placed
        level_end = nc;
        ++levels;
      }
      next_child += 2 * uint32_t(__builtin_popcount(uint32_t(split)));
    }
    if (next_child != end || levels != depth[t] || levels >= 4096) return false;
    max_depth = std::max(max_depth, levels);
  }
  return fault == 0 && max_depth == h.max_depth;
}
#pragma GCC diagnostic pop
#endif  // defined(__x86_64__)

// The per-feature search trees of CompiledForest::BinTree, from the (checked) sorted
// threshold tables. At most 65,535 thresholds per feature make at most 4 levels.
std::shared_ptr<const CompiledForest::BinTree> build_bin_tree(const CompiledForest& cf) {
  auto tree = std::make_shared<CompiledForest::BinTree>();
  const uint32_t F = cf.num_features();
  const uint32_t* off = cf.bin_offsets();
  const float* val = cf.bin_values();
  tree->features.resize(F);
  std::vector<uint32_t> own_levels(F, 0);
  std::vector<float> keys;
  for (uint32_t f = 0; f < F; ++f) {
    std::vector<std::vector<float>> levels{std::vector<float>(val + off[f], val + off[f + 1])};
    while (levels.back().size() > 16) {
      const auto& below = levels.back();
      std::vector<float> up;
      for (size_t j = 16; j < below.size(); j += 16) up.push_back(below[j]);
      levels.push_back(std::move(up));
    }
    auto& feat = tree->features[f];
    own_levels[f] = levels.front().empty() ? 0 : uint32_t(levels.size());
    for (uint32_t k = 0; k < own_levels[f]; ++k) {
      const auto& lv = levels[levels.size() - 1 - k];  // top first
      feat.level_start[k] = uint32_t(keys.size());
      keys.insert(keys.end(), lv.begin(), lv.end());
      keys.resize(keys.size() + (16 - lv.size() % 16) % 16, std::nanf(""));
    }
  }
  // Every feature gets the same number of levels (a fixed-length descent has no
  // mispredicted loop exits): shallower ones start with all-NaN blocks, in which no key
  // is <= x, so the descent stays at block 0 until their own top level.
  const uint32_t depth = *std::max_element(own_levels.begin(), own_levels.end());
  const uint32_t nan_block = uint32_t(keys.size());
  keys.resize(keys.size() + 16, std::nanf(""));
  for (uint32_t f = 0; f < F; ++f) {
    auto& feat = tree->features[f];
    const uint32_t pad = depth - own_levels[f];
    for (uint32_t k = own_levels[f]; k-- > 0;) feat.level_start[k + pad] = feat.level_start[k];
    for (uint32_t k = 0; k < pad; ++k) feat.level_start[k] = nan_block;
  }
  tree->depth = depth;
  tree->keys = std::move(keys);
  return tree;
}

}  // namespace

CompiledForest CompiledForest::from_payload(const uint8_t* data, size_t size,
                                            std::shared_ptr<const void> owner,
                                            const std::string& where, SimdLevel check_level) {
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

  const bool ranked = h.flags & kRanked;
  if (ranked) {
    if (h.flags & (kHasCategorical | kHasZeroMissing) || h.num_features > kRankedFeatureMask + 1)
      throw bad("ranked layout with categorical or zero-missing splits or too many features");
    const uint32_t* off = cf.bin_offsets();
    const float* val = cf.bin_values();
    if (off[0] != 0 || off[h.num_features] != h.num_bin_values) throw bad("bin offsets do not span the values");
    for (uint32_t f = 0; f < h.num_features; ++f) {
      if (off[f] > off[f + 1] || off[f + 1] - off[f] > kRankMask)
        throw bad("feature " + std::to_string(f) + ": bad threshold table range");
      for (uint32_t k = off[f]; k < off[f + 1]; ++k)
        if (std::isnan(val[k]) || (k > off[f] && !(val[k - 1] < val[k])))
          throw bad("feature " + std::to_string(f) + ": thresholds are not sorted distinct numbers");
    }
  } else if (h.num_bin_values != 0) {
    throw bad("threshold tables without the ranked layout");
  }
  if ((h.flags & kLeafInThreshold) && (ranked || h.accumulate_double))
    throw bad("leaf values in threshold slots need the plain layout with float leaves");
  if (h.flags & ~(kHasCategorical | kHasZeroMissing | kRanked | kLeafInThreshold)) throw bad("unknown layout flags");
#if defined(__x86_64__)
  const bool fast_ok = check_level == SimdLevel::avx512 && detected_simd_level() == SimdLevel::avx512
                           ? check_nodes_avx512(cf)
                           : check_nodes<false>(cf, where);
#else
  const bool fast_ok = check_nodes<false>(cf, where);
#endif
  if (!fast_ok) {
    check_nodes<true>(cf, where);
    throw bad("inconsistent node tables");
  }
  if (ranked) cf.bin_tree_ = build_bin_tree(cf);
#if defined(__x86_64__)
  cf.walk_cache_ = detail::new_walk_cache();  // the AVX2 walk's tables (predict_simd.cc)
#endif
  cf.simd_ = detected_simd_level();
  return cf;
}

int CompiledForest::output_width() const {
  return (transform() == Transform::argmax) ? 1 : int(num_groups());
}

}  // namespace slim::forest
