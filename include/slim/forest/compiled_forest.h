// The compiled forest (step 2 and 3 of load -> compile -> run): all trees in flat
// structure-of-arrays node tables, siblings adjacent in breadth-first order, leaf values
// apart. The same bytes are the payload of a .slimf file, so a saved forest is used in
// place from a memory map.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slim/core/thread_pool.h"
#include "slim/forest/forest.h"

namespace slim::forest {

// Bits of CompiledForest::packed (one per node). Leaves point to themselves (left == i)
// and keep their leaf index in the low 28 bits, so a batch walk can step every lane a
// fixed number of times without branching.
inline constexpr uint32_t kNodeDefaultLeft = 1u << 31;
inline constexpr uint32_t kNodeLeaf = 1u << 30;
inline constexpr uint32_t kNodeCategorical = 1u << 29;
inline constexpr uint32_t kNodeZeroMissing = 1u << 28;
inline constexpr uint32_t kNodeFeatureMask = (1u << 28) - 1;  // also the leaf index

// The ranked layout (lossless threshold quantization): no threshold table at all. A
// split's packed word holds its feature (12 bits) and the rank r of its threshold among
// the feature's sorted distinct thresholds t[0..m) (16 bits, r = j + 1 for t[j]). An
// input is binned once per row to b = #{t <= x} (kNanBin for NaN), and `x < t[j]` is
// exactly `b < r`, so predictions are identical while a node shrinks from 12 to 8 bytes.
inline constexpr uint32_t kRankShift = 12;
inline constexpr uint32_t kRankedFeatureMask = (1u << kRankShift) - 1;
inline constexpr uint32_t kRankMask = 0xffffu;
inline constexpr int32_t kNanBin = 1 << 16;  // above every rank: NaN goes right unless default-left

// Fixed-size description at the start of the compiled payload; offsets are in bytes from
// the payload start, each section 64-byte aligned.
struct CompiledHeader {
  uint32_t num_features, num_groups, num_trees, num_nodes, num_leaves;
  uint32_t num_category_sets, num_category_words, max_depth;
  uint8_t source, transform, accumulate_double, truncate_category_first;
  uint32_t flags;  // kHasCategorical | kHasZeroMissing | kRanked | kLeafInThreshold
  uint32_t num_bin_values;  // ranked: all features' threshold tables together
  double sigmoid_scale, average_divisor;
  uint64_t off_base_margin, off_tree_root, off_tree_group, off_tree_depth;
  uint64_t off_threshold, off_packed, off_left, off_leaf;
  uint64_t off_category_offsets, off_category_words;
  uint64_t off_bin_offsets, off_bin_values, payload_size;
};
inline constexpr uint32_t kHasCategorical = 1;
inline constexpr uint32_t kHasZeroMissing = 2;
inline constexpr uint32_t kRanked = 4;
// Plain layout with float32 leaves: a leaf's threshold slot holds its value too (equal to
// leaf_values()[its leaf index], checked on load), so a SIMD walk reads a lane's leaf
// value with one gather by node instead of two (leaf index, then value). Files without
// the flag (older ones) keep zero there and take the two-gather path.
inline constexpr uint32_t kLeafInThreshold = 8;

enum class SimdLevel { scalar, avx2, avx512, neon };
// The walk's level at core's active_isa() (the CPU's, lowered by SLIM_ISA / --isa).
SimdLevel detected_simd_level();
const char* simd_level_name(SimdLevel level);

class CompiledForest {
 public:
  CompiledForest() = default;
  // Adopts a payload (owned bytes or a mapped file kept alive by `owner`) after checking
  // every offset, index and link in it; throws invalid_model naming `where`.
  // `check_level` picks the node check's implementation (tests compare them).
  static CompiledForest from_payload(const uint8_t* data, size_t size,
                                     std::shared_ptr<const void> owner, const std::string& where,
                                     SimdLevel check_level = detected_simd_level());

  uint32_t num_features() const { return h_->num_features; }
  uint32_t num_groups() const { return h_->num_groups; }
  uint32_t num_trees() const { return h_->num_trees; }
  uint32_t num_nodes() const { return h_->num_nodes; }
  uint32_t num_leaves() const { return h_->num_leaves; }
  uint32_t max_depth() const { return h_->max_depth; }
  Transform transform() const { return Transform(h_->transform); }
  SourceKind source() const { return SourceKind(h_->source); }
  int output_width() const;  // columns of predict()'s transformed output
  const CompiledHeader& header() const { return *h_; }
  const uint8_t* payload() const { return base_; }
  size_t payload_size() const { return size_; }
  bool defined() const { return h_ != nullptr; }
  bool ranked() const { return h_->flags & kRanked; }
  // Bytes the walks touch per node (packed + left, plus the threshold when not ranked).
  int node_bytes() const { return ranked() ? 8 : 12; }

  // Batch prediction of n contiguous rows of num_features() floats. out gets
  // n * output_width() values (or n * num_groups() margins when `margin`). Splits rows
  // over `pool` when given and the batch is large enough.
  void predict(const float* x, int64_t n, float* out, bool margin = false,
               ThreadPool* pool = nullptr) const;
  // Exact margins (float32 sums for XGBoost models, double for LightGBM), n * num_groups.
  void predict_margin(const float* x, int64_t n, double* out, ThreadPool* pool = nullptr) const;
  // One row on the calling thread, no allocation (for up to 64 groups).
  void predict_row(const float* x, float* out, bool margin = false) const;
  // Forces a SIMD level (tests compare every level against the scalar walk).
  void set_simd_level(SimdLevel level) { simd_ = level; }
  SimdLevel simd_level() const { return simd_; }

  // Raw tables, for the writer, the benchmark and tests.
  const double* base_margin() const { return reinterpret_cast<const double*>(base_ + h_->off_base_margin); }
  const uint32_t* tree_root() const { return u32(h_->off_tree_root); }
  const uint32_t* tree_group() const { return u32(h_->off_tree_group); }
  const uint32_t* tree_depth() const { return u32(h_->off_tree_depth); }
  const float* threshold() const { return reinterpret_cast<const float*>(base_ + h_->off_threshold); }
  const uint32_t* packed() const { return u32(h_->off_packed); }
  const int32_t* left() const { return reinterpret_cast<const int32_t*>(base_ + h_->off_left); }
  const void* leaf_values() const { return base_ + h_->off_leaf; }
  const uint32_t* category_offsets() const { return u32(h_->off_category_offsets); }
  const uint32_t* category_words() const { return u32(h_->off_category_words); }
  // Ranked layout: feature f's sorted distinct thresholds are
  // bin_values()[bin_offsets()[f] .. bin_offsets()[f + 1]).
  const uint32_t* bin_offsets() const { return u32(h_->off_bin_offsets); }
  const float* bin_values() const { return reinterpret_cast<const float*>(base_ + h_->off_bin_values); }
  // Ranked layout: bins of n rows (row-major n x num_features, kNanBin for NaN).
  void bin_rows(const float* x, int64_t n, int32_t* bins) const;

  // Ranked layout: each feature's thresholds as a static search tree of 16-key blocks
  // (built on load from the threshold tables; the AVX-512 binning compares a value with
  // a whole block at once). Level 0 is the single top block, the last level holds every
  // threshold in order, NaN-padded; the keys of a level are the first keys of the blocks
  // of the level below, except the first block's. Descending, a block's count of keys
  // <= x picks the block below (b = 16 b + count), and at the last level b is the bin.
  struct BinTree {
    std::vector<float> keys;  // all blocks of all features
    struct Feature {
      uint32_t level_start[4] = {0, 0, 0, 0};  // first key of each level, in `keys`
    };
    std::vector<Feature> features;
    uint32_t depth = 0;  // levels of every feature (shallower ones are padded at the top)
  };
  const BinTree* bin_tree() const { return bin_tree_.get(); }

  // The AVX2 batch walk's per-tree tables (src/forest/predict_simd.cc), built on its
  // first use and shared by copies of this forest.
  struct WalkCache;
  WalkCache* walk_cache() const { return walk_cache_.get(); }

 private:
  const uint32_t* u32(uint64_t off) const { return reinterpret_cast<const uint32_t*>(base_ + off); }
  void margin_block(const float* x, int64_t n, double* out) const;

  std::shared_ptr<const void> owner_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  const CompiledHeader* h_ = nullptr;
  SimdLevel simd_ = SimdLevel::scalar;
  std::shared_ptr<const BinTree> bin_tree_;  // ranked layout only
  std::shared_ptr<WalkCache> walk_cache_;
};

// Lays the loaded forest out as a compiled payload (breadth-first per tree). `ranked`
// picks the ranked layout (see kRankShift); it needs numeric splits only (no categorical
// or zero-as-missing nodes), at most 4,096 features and 65,535 distinct thresholds per
// feature, and is `unsupported` otherwise (ranked_layout_blocker says why up front).
CompiledForest compile_forest(const Forest& forest, bool ranked = false);
// Why `forest` cannot take the ranked layout; empty when it can.
std::string ranked_layout_blocker(const Forest& forest);

}  // namespace slim::forest
