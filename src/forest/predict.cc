// Prediction entry points: blocks of rows walked tree by tree (the block's rows and
// accumulators stay in L1 while a tree's nodes stream through), split over threads.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "forest/walk.h"
#include "slim/core/cpu_features.h"
#include "slim/core/error.h"
#include "slim/forest/compiled_forest.h"

namespace slim::forest {

namespace {
constexpr int64_t kBlockRows = 256;
}

SimdLevel detected_simd_level() {
#if defined(__x86_64__)
  if (isa_enabled(Isa::avx512)) return SimdLevel::avx512;
  if (isa_enabled(Isa::avx2)) return SimdLevel::avx2;
#endif
#if defined(__aarch64__)
  if (isa_enabled(Isa::neon)) return SimdLevel::neon;
#endif
  return SimdLevel::scalar;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::neon: return "neon";
    default: return "scalar";
  }
}

namespace {

// Bin of one value among a sorted threshold table t[0..m): #{t <= x}, by a branch-free
// binary search (the compares become conditional moves).
inline int32_t bin_of(const float* t, uint32_t m, float x) {
  if (std::isnan(x)) return kNanBin;
  uint32_t lo = 0;
  for (uint32_t step = std::bit_floor(m); step; step >>= 1) {
    const uint32_t c = lo + step;
    const float v = t[std::min(c, m) - 1];
    lo = (c <= m && v <= x) ? c : lo;
  }
  return int32_t(lo);
}

template <typename T>
void block_margins(const CompiledForest& cf, SimdLevel simd, const float* x, int64_t n, T* acc) {
  const uint32_t G = cf.num_groups();
  const uint32_t F = cf.num_features();
  const double* bm = cf.base_margin();
  for (uint32_t g = 0; g < G; ++g) std::fill(acc + g * n, acc + (g + 1) * n, T(bm[g]));
  const bool ranked = cf.ranked();
  const bool simd_ok = !(cf.header().flags & (kHasCategorical | kHasZeroMissing)) &&
                       uint64_t(F) * 16 < (uint64_t(1) << 31);
  int64_t done = 0;
#if defined(__x86_64__)
  // The AVX2 walk of a shallow ranked forest compares floats with the thresholds its
  // tables hold, so only the rows it leaves to the scalar walk need bins.
  if (ranked && simd_ok && simd == SimdLevel::avx2) {
    if constexpr (std::is_same_v<T, float>) done = detail::walk_avx2_ranked_floats_f32(cf, x, n, acc);
    else done = detail::walk_avx2_ranked_floats_f64(cf, x, n, acc);
  }
#endif
  const void* rows = x;
  if (ranked) {
    thread_local std::vector<int32_t> bins;
    bins.resize(size_t(n) * F);
    cf.bin_rows(x + done * F, n - done, bins.data() + done * F);
    rows = bins.data();
  }
#if defined(__x86_64__)
  if (done == 0 && simd_ok && (simd == SimdLevel::avx512 || simd == SimdLevel::avx2)) {
    if constexpr (std::is_same_v<T, float>) {
      done = simd == SimdLevel::avx512 ? detail::walk_avx512_f32(cf, rows, n, acc)
                                       : detail::walk_avx2_f32(cf, rows, n, acc);
    } else {
      done = simd == SimdLevel::avx512 ? detail::walk_avx512_f64(cf, rows, n, acc)
                                       : detail::walk_avx2_f64(cf, rows, n, acc);
    }
  }
#endif
#if defined(__aarch64__)
  if (simd_ok && simd == SimdLevel::neon) {
    if constexpr (std::is_same_v<T, float>) {
      done = detail::walk_neon_f32(cf, rows, n, acc);
    } else {
      done = detail::walk_neon_f64(cf, rows, n, acc);
    }
  }
#endif
  if (done < n) {
    // The tail rows keep their own group-major slices of acc.
    const int64_t rest = n - done;
    const auto* row0 = static_cast<const uint8_t*>(rows) + size_t(done) * F * 4;
    const T* leaves = static_cast<const T*>(cf.leaf_values());
    for (uint32_t t = 0; t < cf.num_trees(); ++t) {
      const uint32_t root = cf.tree_root()[t];
      T* a = acc + int64_t(cf.tree_group()[t]) * n + done;
      for (int64_t r = 0; r < rest; ++r)
        a[r] += leaves[detail::walk_any(cf, ranked, root, row0 + size_t(r) * F * 4)];
    }
  }
}

// Margins of up to kBlockRows rows into out (row-major n x G, double).
void margins_rows(const CompiledForest& cf, SimdLevel simd, const float* x, int64_t n, double* out) {
  const uint32_t G = cf.num_groups();
  const double div = cf.header().average_divisor;
  if (cf.header().accumulate_double) {
    thread_local std::vector<double> acc;
    acc.resize(size_t(n) * G);
    block_margins<double>(cf, simd, x, n, acc.data());
    for (int64_t r = 0; r < n; ++r)
      for (uint32_t g = 0; g < G; ++g) out[r * G + g] = acc[g * n + r] / div;
  } else {
    thread_local std::vector<float> acc;
    acc.resize(size_t(n) * G);
    block_margins<float>(cf, simd, x, n, acc.data());
    for (int64_t r = 0; r < n; ++r)
      for (uint32_t g = 0; g < G; ++g) out[r * G + g] = double(acc[g * n + r]) / div;
  }
}

template <typename Body>
void over_blocks(int64_t n, ThreadPool* pool, Body&& body) {
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kBlockRows;
      body(r0, std::min(n, r0 + kBlockRows) - r0);
    }
  };
  if (pool && pool->num_threads() > 1 && blocks > 1) {
    pool->parallel_for(blocks, run, 1);
  } else {
    run(0, blocks);
  }
}

}  // namespace

void CompiledForest::predict_margin(const float* x, int64_t n, double* out, ThreadPool* pool) const {
  slim::check(n >= 0, ErrorCode::invalid_argument, "predict: negative row count");
  const uint32_t G = num_groups(), F = num_features();
  const SimdLevel simd = simd_;
  over_blocks(n, pool, [&](int64_t r0, int64_t rows) {
    margins_rows(*this, simd, x + r0 * F, rows, out + r0 * G);
  });
}

void CompiledForest::predict(const float* x, int64_t n, float* out, bool margin, ThreadPool* pool) const {
  slim::check(n >= 0, ErrorCode::invalid_argument, "predict: negative row count");
  const uint32_t G = num_groups(), F = num_features();
  const int W = margin ? int(G) : output_width();
  const SimdLevel simd = simd_;
  const CompiledHeader& h = *h_;
  over_blocks(n, pool, [&](int64_t r0, int64_t rows) {
    thread_local std::vector<double> m;
    m.resize(size_t(rows) * G);
    margins_rows(*this, simd, x + r0 * F, rows, m.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + (r0 + r) * W;
      if (margin) {
        for (uint32_t g = 0; g < G; ++g) o[g] = float(m[r * G + g]);
      } else {
        transform_margins(Transform(h.transform), h.accumulate_double, h.sigmoid_scale, G,
                          m.data() + r * G, o);
      }
    }
  });
}

void CompiledForest::bin_rows(const float* x, int64_t n, int32_t* bins) const {
  slim::check(ranked(), ErrorCode::internal, "bin_rows: the forest is not in the ranked layout");
  const uint32_t F = num_features();
  const uint32_t* off = bin_offsets();
  const float* val = bin_values();
  int64_t done = 0;
#if defined(__x86_64__)
  done = simd_ == SimdLevel::avx512 ? detail::bin_rows_avx512(*this, x, n, bins)
         : simd_ == SimdLevel::avx2 ? detail::bin_rows_avx2(*this, x, n, bins)
                                    : 0;
#endif
  for (int64_t r = done; r < n; ++r)
    for (uint32_t f = 0; f < F; ++f)
      bins[r * F + f] = bin_of(val + off[f], off[f + 1] - off[f], x[r * F + f]);
}

void CompiledForest::predict_row(const float* x_in, float* out, bool margin) const {
  const uint32_t G = num_groups();
  // Ranked layout: the walks read the row's bins (at most 4,096 features: 16 KiB).
  int32_t bins[kRankedFeatureMask + 1];
  const bool is_ranked = ranked();
  const void* x = x_in;
  if (is_ranked) {
    bin_rows(x_in, 1, bins);
    x = bins;
  }
  constexpr uint32_t kStackGroups = 64;
  double stack_m[kStackGroups];
  thread_local std::vector<double> heap_m;
  double* m = stack_m;
  if (G > kStackGroups) {
    heap_m.resize(G);
    m = heap_m.data();
  }
  const CompiledHeader& h = *h_;
  const uint32_t* root = tree_root();
  const uint32_t* group = tree_group();
  const uint32_t T = h.num_trees;
  // The single-row SIMD walks are x86-64's (AVX-512, AVX2); elsewhere rows walk one tree at a time.
  SimdLevel row_simd = (h.flags & (kHasCategorical | kHasZeroMissing)) ? SimdLevel::scalar : simd_;
  if (row_simd != SimdLevel::avx512 && row_simd != SimdLevel::avx2) row_simd = SimdLevel::scalar;
  if (h.accumulate_double) {
    const double* leaves = static_cast<const double*>(leaf_values());
    for (uint32_t g = 0; g < G; ++g) m[g] = base_margin()[g];
#if defined(__x86_64__)
    if (row_simd == SimdLevel::avx512) detail::row_avx512_f64(*this, x, m);
    else if (row_simd == SimdLevel::avx2) detail::row_avx2_f64(*this, x, m);
    else
#endif
      for (uint32_t t = 0; t < T; ++t) m[group[t]] += leaves[detail::walk_any(*this, is_ranked, root[t], x)];
    for (uint32_t g = 0; g < G; ++g) m[g] /= h.average_divisor;
  } else {
    const float* leaves = static_cast<const float*>(leaf_values());
    if (row_simd != SimdLevel::scalar && G <= kStackGroups) {
      float acc[kStackGroups];
      for (uint32_t g = 0; g < G; ++g) acc[g] = float(base_margin()[g]);
#if defined(__x86_64__)
      if (row_simd == SimdLevel::avx512) detail::row_avx512_f32(*this, x, acc);
      else detail::row_avx2_f32(*this, x, acc);
#endif
      for (uint32_t g = 0; g < G; ++g) m[g] = acc[g];
    } else if (G == 1) {
      float acc = float(base_margin()[0]);
      for (uint32_t t = 0; t < T; ++t) acc += leaves[detail::walk_any(*this, is_ranked, root[t], x)];
      m[0] = acc;
    } else {
      float acc[kStackGroups];
      thread_local std::vector<float> heap_acc;
      float* a = acc;
      if (G > kStackGroups) {
        heap_acc.resize(G);
        a = heap_acc.data();
      }
      for (uint32_t g = 0; g < G; ++g) a[g] = float(base_margin()[g]);
      for (uint32_t t = 0; t < T; ++t) a[group[t]] += leaves[detail::walk_any(*this, is_ranked, root[t], x)];
      for (uint32_t g = 0; g < G; ++g) m[g] = a[g];
    }
    if (h.average_divisor != 1.0)
      for (uint32_t g = 0; g < G; ++g) m[g] /= h.average_divisor;
  }
  if (margin) {
    for (uint32_t g = 0; g < G; ++g) out[g] = float(m[g]);
  } else {
    transform_margins(Transform(h.transform), h.accumulate_double, h.sigmoid_scale, G, m, out);
  }
}

}  // namespace slim::forest
