// Tree-walking kernels shared by the prediction entry points. Each adds the leaves of
// every tree to acc, laid out group-major (acc[g * n + r]) and pre-filled with the base
// margins, visiting trees in order so float32 sums round exactly as XGBoost's do.
#pragma once

#include <cmath>
#include <cstring>

#include "slim/forest/compiled_forest.h"

namespace slim::forest::detail {

// The slow rule for categorical and LightGBM zero-as-missing nodes.
inline bool special_goes_left(const CompiledForest& cf, uint32_t p, float thr_bits_as_float, float x) {
  const bool dl = p & kNodeDefaultLeft;
  if (std::isnan(x)) return dl;
  if (p & kNodeCategorical) {
    uint32_t set;
    std::memcpy(&set, &thr_bits_as_float, 4);
    const uint32_t* off = cf.category_offsets();
    const uint32_t words = off[set + 1] - off[set];
    if (cf.header().truncate_category_first ? x <= -1.0f : x < 0.0f) return dl;
    if (x >= float(words) * 32.0f) return dl;
    const uint32_t c = uint32_t(int32_t(x));
    return (cf.category_words()[off[set] + c / 32] >> (c % 32)) & 1u;
  }
  if (std::fabs(x) <= 1e-35f) return dl;  // zero-as-missing
  return x < thr_bits_as_float;
}

// Index of the leaf a row reaches in the tree rooted at `root` (plain layout).
inline uint32_t walk_one(const CompiledForest& cf, uint32_t root, const float* row) {
  const uint32_t* packed = cf.packed();
  const float* thr = cf.threshold();
  const int32_t* left = cf.left();
  uint32_t i = root;
  for (;;) {
    const uint32_t p = packed[i];
    if (p & kNodeLeaf) return p & kNodeFeatureMask;
    const float x = row[p & kNodeFeatureMask];
    bool go_left;
    if (__builtin_expect(p & (kNodeCategorical | kNodeZeroMissing), 0)) {
      go_left = special_goes_left(cf, p, thr[i], x);
    } else {
      go_left = (x < thr[i]) | (std::isnan(x) & bool(p & kNodeDefaultLeft));
    }
    i = uint32_t(left[i]) + (go_left ? 0u : 1u);
  }
}

// The same for the ranked layout, on the row's bins (CompiledForest::bin_rows).
inline uint32_t walk_one_ranked(const CompiledForest& cf, uint32_t root, const int32_t* bins) {
  const uint32_t* packed = cf.packed();
  const int32_t* left = cf.left();
  uint32_t i = root;
  for (;;) {
    const uint32_t p = packed[i];
    if (p & kNodeLeaf) return p & kNodeFeatureMask;
    const int32_t b = bins[p & kRankedFeatureMask];
    const bool go_left = (b < int32_t((p >> kRankShift) & kRankMask)) | ((b == kNanBin) & bool(p & kNodeDefaultLeft));
    i = uint32_t(left[i]) + (go_left ? 0u : 1u);
  }
}

// Leaf of one row: `row` is floats for the plain layout, bins for the ranked one.
inline uint32_t walk_any(const CompiledForest& cf, bool ranked, uint32_t root, const void* row) {
  return ranked ? walk_one_ranked(cf, root, static_cast<const int32_t*>(row))
                : walk_one(cf, root, static_cast<const float*>(row));
}

// SIMD kernels (predict_simd.cc); they handle whole vectors of rows and return how many
// rows they did, leaving the tail to the scalar walk. Numeric-only forests. `x` holds
// n rows of num_features floats (plain layout) or bins (ranked layout).
int64_t walk_avx512_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc);
int64_t walk_avx512_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc);
int64_t walk_avx2_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc);
int64_t walk_avx2_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc);
// Ranked forests no deeper than 6 on float rows, without binning (0 rows otherwise).
int64_t walk_avx2_ranked_floats_f32(const CompiledForest& cf, const float* x, int64_t n, float* acc);
int64_t walk_avx2_ranked_floats_f64(const CompiledForest& cf, const float* x, int64_t n, double* acc);
// An empty CompiledForest::WalkCache (filled by the first AVX2 batch walk).
std::shared_ptr<CompiledForest::WalkCache> new_walk_cache();
// One row through every tree, several trees per vector; adds the leaves to acc[group]
// in tree order.
void row_avx512_f32(const CompiledForest& cf, const void* row, float* acc);
void row_avx512_f64(const CompiledForest& cf, const void* row, double* acc);
void row_avx2_f32(const CompiledForest& cf, const void* row, float* acc);
void row_avx2_f64(const CompiledForest& cf, const void* row, double* acc);
// Bins of n rows for the ranked layout (a descent of CompiledForest::BinTree per value);
// returns rows done.
int64_t bin_rows_avx512(const CompiledForest& cf, const float* x, int64_t n, int32_t* bins);
int64_t bin_rows_avx2(const CompiledForest& cf, const float* x, int64_t n, int32_t* bins);
// aarch64 (predict_neon.cc): 4 rows per vector, several vectors interleaved; the same
// contract as the AVX2 walks.
int64_t walk_neon_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc);
int64_t walk_neon_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc);

}  // namespace slim::forest::detail
