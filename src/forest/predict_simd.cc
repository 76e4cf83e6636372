// SIMD batch walks: 16 (AVX-512) or 8 (AVX2) rows step through one tree together, each
// lane gathering its node, its feature value and its child. Leaves point to themselves,
// so every lane takes exactly tree_depth steps with no per-lane branching. Several row
// vectors are walked interleaved so their gathers overlap.
// GCC 12 warns falsely about the gather intrinsics' internal undefined source operand.
// x86-64 only (aarch64 has predict_neon.cc).
#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "forest/walk.h"

namespace slim::forest::detail {
namespace {

constexpr int kInterleave = 4;

// Rows come column-major in blocks of kColRows (xt[f * kColRows + r]), so the first two
// levels, where every lane tests one of at most two features, read a feature with plain
// vector loads instead of a gather.
constexpr int kColRows = 256;
constexpr uint32_t kColShift = 8;  // log2(kColRows)

// The calling thread's buffer for a column block, at least n values. Compiled for no
// particular ISA and never inlined: a thread_local built inside a target function would
// run that ISA's code wherever it is constructed (tests/isa/check_target_regions.py).
__attribute__((noinline)) int32_t* column_buffer(size_t n) {
  thread_local std::vector<int32_t> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Streams tree t + 1's node tables into the cache while tree t is walked: a large forest
// does not fit in L2, and each block of rows visits every tree once. (_mm_prefetch is
// baseline SSE, so the AVX-512 and AVX2 walks both inline this.)
template <bool R>
inline void prefetch_next_tree(const CompiledForest& cf, uint32_t t) {
  if (t + 2 >= cf.num_trees()) return;
  const uint32_t nb = cf.tree_root()[t + 1], ne = cf.tree_root()[t + 2];
  for (uint32_t i = nb; i < ne; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(cf.packed() + i), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(cf.left() + i), _MM_HINT_T0);
    if constexpr (!R) _mm_prefetch(reinterpret_cast<const char*>(cf.threshold() + i), _MM_HINT_T0);
  }
}

// Levels whose inputs are blended from whole columns instead of gathered.
constexpr uint32_t kBlendLevels = 3;

// Lanes standing on a split (not a leaf). A leaf's packed word holds its leaf index where
// a split has its feature, so input gathers skip leaf lanes (masked gathers read nothing
// for those lanes).
__attribute__((target("avx512f"))) inline __mmask16 split_lanes512(__m512i p) {
  return _mm512_testn_epi32_mask(p, _mm512_set1_epi32(int32_t(kNodeLeaf)));
}
__attribute__((target("avx2"))) inline __m256i leaf_lanes256(__m256i p) {
  const __m256i leaf_bit = _mm256_set1_epi32(int32_t(kNodeLeaf));
  return _mm256_cmpeq_epi32(_mm256_and_si256(p, leaf_bit), leaf_bit);
}

// The split test of one vector of lanes: `xv` holds the lanes' inputs (floats, or bins
// for the ranked layout R), `p` their packed words, `th` their thresholds (plain only),
// `split` the lanes on a split. Returns the lanes that go right; leaves never do (they
// point to themselves). Everything stays in mask registers: the masks that depend only
// on the node are ready before the input arrives, so the input's path to the result is
// one or two compares.
template <bool R>
__attribute__((target("avx512f"))) inline __mmask16 right_mask512(__m512i xv, __m512i p, __m512 th, __mmask16 split) {
  const __m512i dl_bit = _mm512_set1_epi32(int32_t(kNodeDefaultLeft));
  if constexpr (R) {
    // Right when bin >= rank, except NaN (the bin above every rank) at default-left nodes.
    const __m512i rank = _mm512_and_si512(_mm512_srli_epi32(p, kRankShift), _mm512_set1_epi32(int32_t(kRankMask)));
    const __mmask16 dl = _mm512_mask_test_epi32_mask(split, p, dl_bit);
    const __mmask16 ge = _mm512_mask_cmpge_epi32_mask(split, xv, rank);
    return _kandn_mask16(_mm512_mask_cmpeq_epi32_mask(dl, xv, _mm512_set1_epi32(kNanBin)), ge);
  } else {
    // Right when !(x < t); NaN is unordered, so it goes right unless default-left, where
    // the ordered x >= t sends it left.
    const __mmask16 dl = _mm512_mask_test_epi32_mask(split, p, dl_bit);
    const __mmask16 ndl = _mm512_mask_testn_epi32_mask(split, p, dl_bit);
    const __m512 xf = _mm512_castsi512_ps(xv);
    return _kor_mask16(_mm512_mask_cmp_ps_mask(dl, xf, th, _CMP_GE_OQ), _mm512_mask_cmp_ps_mask(ndl, xf, th, _CMP_NLT_UQ));
  }
}

template <bool R>
__attribute__((target("avx2"))) inline __m256i stay_mask256(__m256i xv, __m256i p, __m256 th, __m256i leaf) {
  const __m256i dl_bit = _mm256_set1_epi32(int32_t(kNodeDefaultLeft));
  const __m256i dl = _mm256_cmpeq_epi32(_mm256_and_si256(p, dl_bit), dl_bit);
  __m256i lt, nan;
  if constexpr (R) {
    const __m256i rank = _mm256_and_si256(_mm256_srli_epi32(p, kRankShift), _mm256_set1_epi32(int32_t(kRankMask)));
    lt = _mm256_cmpgt_epi32(rank, xv);
    nan = _mm256_cmpeq_epi32(xv, _mm256_set1_epi32(kNanBin));
  } else {
    const __m256 xf = _mm256_castsi256_ps(xv);
    lt = _mm256_castps_si256(_mm256_cmp_ps(xf, th, _CMP_LT_OQ));
    nan = _mm256_castps_si256(_mm256_cmp_ps(xf, xf, _CMP_UNORD_Q));
  }
  return _mm256_or_si256(_mm256_or_si256(lt, leaf), _mm256_and_si256(nan, dl));
}

constexpr uint32_t feature_mask(bool ranked) { return ranked ? kRankedFeatureMask : kNodeFeatureMask; }

// One block of rows (a multiple of 16, at most kColRows, transposed into xt) through
// every tree. Trees are the outer loop, so a tree's set-up (its top nodes loaded into
// registers, the columns its top levels read) serves the whole block; the rows go
// through it in groups of 16 * kInterleave, then 16.
template <typename T, bool R>
__attribute__((target("avx512f"))) void avx512_block(const CompiledForest& cf, const int32_t* xt, int64_t rows,
                                                     int64_t n, int64_t r0, T* acc) {
  const uint32_t* packed = cf.packed();
  const float* thr = cf.threshold();
  const int32_t* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const bool leaf_in_thr = !R && (cf.header().flags & kLeafInThreshold);  // implies float leaves
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i feat_mask = _mm512_set1_epi32(int32_t(feature_mask(R)));
  const __m512i leaf_mask = _mm512_set1_epi32(int32_t(kNodeFeatureMask));
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bit5 = _mm512_set1_epi32(32);
  const uint32_t T_ = cf.num_trees();
  for (uint32_t t = 0; t < T_; ++t) {
    const uint32_t root = cf.tree_root()[t];
    const uint32_t depth = cf.tree_depth()[t];
    prefetch_next_tree<R>(cf, t);
    // The first 64 nodes of the tree (its top levels in breadth-first order) sit in
    // registers; while every lane is among them, permutes replace the node gathers.
    const uint32_t size = (t + 1 < T_ ? cf.tree_root()[t + 1] : cf.num_nodes()) - root;
    __m512i p_tab[4], l_tab[4];
    __m512 t_tab[4];
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = 16u * uint32_t(k);
      const __mmask16 m = __mmask16(size >= lo + 16 ? 0xffffu : size <= lo ? 0u : (1u << (size - lo)) - 1);
      p_tab[k] = _mm512_maskz_loadu_epi32(m, packed + root + lo);
      if constexpr (!R) t_tab[k] = _mm512_maskz_loadu_ps(m, thr + root + lo);
      l_tab[k] = _mm512_maskz_loadu_epi32(m, left + root + lo);
    }
    const __m512i root_v = _mm512_set1_epi32(int32_t(root));
    const __m512i in_regs = _mm512_set1_epi32(int32_t(std::min<uint32_t>(size, 64)));
    // At levels 0..kBlendLevels a lane stands on one of at most 2^d nodes, fixed by the
    // directions it took so far: its input is one of 2^d columns, loaded whole and
    // blended by those directions, which is shorter and cheaper than a gather.
    // cols[d][q] is the column of the node reached by path q (bit j: right at level j);
    // a lane standing on a leaf reads any column (its input is not used).
    auto column_of = [&](uint32_t i) {
      const uint32_t p = packed[i];
      return xt + size_t((p & kNodeLeaf) ? 0 : p & feature_mask(R)) * kColRows;
    };
    const uint32_t blend_levels = std::min<uint32_t>(kBlendLevels, depth ? depth - 1 : 0);
    uint32_t node_at[kBlendLevels + 1][1 << kBlendLevels];
    const int32_t* cols[kBlendLevels + 1][1 << kBlendLevels];
    node_at[0][0] = root;
    cols[0][0] = column_of(root);
    for (uint32_t d = 1; d <= blend_levels; ++d) {
      for (uint32_t q = 0; q < (1u << d); ++q) {
        const uint32_t parent = node_at[d - 1][q & ((1u << (d - 1)) - 1)];
        const uint32_t i = (packed[parent] & kNodeLeaf) ? parent : uint32_t(left[parent]) + ((q >> (d - 1)) & 1);
        node_at[d][q] = i;
        cols[d][q] = column_of(i);
      }
    }
    const uint32_t p0 = packed[root];
    const __m512i p0v = _mm512_set1_epi32(int32_t(p0));
    const __m512 th0 = R ? _mm512_setzero_ps() : _mm512_set1_ps(thr[root]);
    const __m512i l0 = _mm512_set1_epi32(left[root]);
    T* a = acc + int64_t(cf.tree_group()[t]) * n + r0;

    // V vectors of 16 rows starting at row k of the block, walked interleaved so their
    // loads overlap.
    auto group = [&]<int V>(int64_t k) __attribute__((target("avx512f"), always_inline)) {
      __m512i idx[V];
      __mmask16 path[kBlendLevels][V];
      if (depth == 0) {
        for (int v = 0; v < V; ++v) idx[v] = root_v;
      } else {
        for (int v = 0; v < V; ++v) {  // level 0: every lane is at the root
          path[0][v] = right_mask512<R>(_mm512_loadu_si512(cols[0][0] + k + 16 * v), p0v, th0, 0xffff);
          idx[v] = _mm512_mask_add_epi32(l0, path[0][v], l0, one);
        }
      }
      // One level for every vector; D > 0 blends the input from 2^D columns, D == 0
      // gathers it.
      auto level = [&]<uint32_t D>() __attribute__((target("avx512f"), always_inline)) {
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m512i rel = _mm512_sub_epi32(idx[v], root_v);
          __m512i p, l;
          __m512 th = _mm512_setzero_ps();
          if (_mm512_cmplt_epu32_mask(rel, in_regs) == 0xffff) {
            const __mmask16 upper = _mm512_test_epi32_mask(rel, bit5);
            p = _mm512_mask_blend_epi32(upper, _mm512_permutex2var_epi32(p_tab[0], rel, p_tab[1]),
                                        _mm512_permutex2var_epi32(p_tab[2], rel, p_tab[3]));
            if constexpr (!R)
              th = _mm512_mask_blend_ps(upper, _mm512_permutex2var_ps(t_tab[0], rel, t_tab[1]),
                                        _mm512_permutex2var_ps(t_tab[2], rel, t_tab[3]));
            l = _mm512_mask_blend_epi32(upper, _mm512_permutex2var_epi32(l_tab[0], rel, l_tab[1]),
                                        _mm512_permutex2var_epi32(l_tab[2], rel, l_tab[3]));
          } else {
            p = _mm512_i32gather_epi32(idx[v], packed, 4);
            if constexpr (!R) th = _mm512_i32gather_ps(idx[v], thr, 4);
            l = _mm512_i32gather_epi32(idx[v], left, 4);
          }
          const __mmask16 split = split_lanes512(p);
          __m512i xv;
          if constexpr (D > 0) {
            __m512i c[1 << D];
            for (uint32_t q = 0; q < (1u << D); ++q) c[q] = _mm512_loadu_si512(cols[D][q] + k + 16 * v);
            for (uint32_t j = 0; j < D; ++j)
              for (uint32_t q = 0; q < (1u << (D - j - 1)); ++q)
                c[q] = _mm512_mask_blend_epi32(path[j][v], c[2 * q], c[2 * q + 1]);
            xv = c[0];
          } else {
            const __m512i row = _mm512_add_epi32(lane, _mm512_set1_epi32(int32_t(k + 16 * v)));
            const __m512i xi = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(p, feat_mask), kColShift), row);
            xv = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), split, xi, xt, 4);
          }
          const __mmask16 right = right_mask512<R>(xv, p, th, split);
          if constexpr (D > 0 && D < kBlendLevels) path[D][v] = right;
          idx[v] = _mm512_mask_add_epi32(l, right, l, one);
        }
      };
      static_assert(kBlendLevels == 3);
      if (blend_levels >= 1) level.template operator()<1>();
      if (blend_levels >= 2) level.template operator()<2>();
      if (blend_levels >= 3) level.template operator()<3>();
      for (uint32_t d = blend_levels + 1; d < depth; ++d) level.template operator()<0>();
      for (int v = 0; v < V; ++v) {
        T* out = a + k + 16 * v;
        if constexpr (std::is_same_v<T, float>) {
          const __m512 lv = leaf_in_thr ? _mm512_i32gather_ps(idx[v], thr, 4)
                                        : _mm512_i32gather_ps(_mm512_and_si512(_mm512_i32gather_epi32(idx[v], packed, 4), leaf_mask), leaves, 4);
          _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), lv));
        } else {
          const __m512i li = _mm512_and_si512(_mm512_i32gather_epi32(idx[v], packed, 4), leaf_mask);
          const __m512d lo = _mm512_i32gather_pd(_mm512_castsi512_si256(li), leaves, 8);
          const __m512d hi = _mm512_i32gather_pd(_mm512_extracti64x4_epi64(li, 1), leaves, 8);
          _mm512_storeu_pd(out, _mm512_add_pd(_mm512_loadu_pd(out), lo));
          _mm512_storeu_pd(out + 8, _mm512_add_pd(_mm512_loadu_pd(out + 8), hi));
        }
      }
    };
    int64_t k = 0;
    for (; k + 16 * kInterleave <= rows; k += 16 * kInterleave) group.template operator()<kInterleave>(k);
    for (; k + 16 <= rows; k += 16) group.template operator()<1>(k);
  }
}

template <typename T, bool R>
__attribute__((target("avx512f"))) int64_t avx512_walk(const CompiledForest& cf, const int32_t* x,
                                                       int64_t n, T* acc) {
  const int64_t F = cf.num_features();
  // The column block must stay small (it lives in L1/L2 next to the tree); very wide
  // inputs take the scalar walk.
  if (F > 4096) return 0;
  int32_t* xt = column_buffer(size_t(F) * kColRows);
  int64_t r = 0;
  for (int64_t c0 = 0; c0 + 16 <= n; c0 += kColRows) {
    const int64_t rows = std::min<int64_t>(kColRows, n - c0) & ~int64_t(15);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t f = 0; f < F; ++f) xt[size_t(f * kColRows + i)] = x[(c0 + i) * F + f];
    avx512_block<T, R>(cf, xt, rows, n, c0, acc);
    r = c0 + rows;
  }
  return r;
}

// AVX2 walk, modelled on avx512_block: a block of rows transposed to columns, trees as
// the outer loop, 8 rows per vector and several vectors interleaved. At levels
// 0..kRegLevels2 a lane's node is fixed by the path it took so far (q: bit j set when it
// went right at level j), so the node's constants come from small per-tree tables
// indexed by q (vpermd; 16 and 32 entries take 2 or 4 and blends), built once per forest
// (path_tables), 8 paths at a time. Inputs of levels 0..kBlendX2 are blended from the 2^d
// columns those nodes read, deeper ones gathered from the column block at the table's
// column offset; only levels past kRegLevels2 gather nodes. Trees no deeper than
// kRegLevels2 + 1 read their leaf value from a table of the last level's children; ranked
// forests that shallow are walked on the float rows (thresholds from the per-feature
// tables, no binning), deeper ones read leaves from a per-node value table. The split
// test is folded into per-node constants:
// - ranked: right iff bin - rank (mod 2^32) < U (unsigned), U = kNanBin - rank (+1 when
//   NaN goes right), 0 on a leaf; with the sign bit flipped that is one signed compare,
//   cmpgt(B, bin + C), C = 2^31 - rank, B = U ^ 2^31. A block without NaN needs only
//   bin > rank - 1 (INT_MAX on a leaf).
// - plain: right iff x >= t (ordered) or (x is NaN and the node sends NaN right); a leaf
//   has t = NaN and sends nothing right, and a NaN threshold (x < NaN is false) becomes
//   -inf. A block without NaN needs only x >= t.
// Measured on 100x6 and 1000x8 XGBoost models (10,000 rows, forced AVX2): table levels
// 0-5 beat 0-3 and 0-4, gathering the input from level 3 on beats blending 8 columns,
// 8 interleaved vectors beat 2, 4 and 6, and 512-row blocks (columns past L1) lose to
// 256.
constexpr uint32_t kRegLevels2 = 5;  // levels whose node constants come from per-path tables
constexpr uint32_t kBlendX2 = 2;     // levels up to this blend their input from columns; deeper gather it
constexpr int kInterleave2 = 8;
constexpr uint32_t kColShift2 = 8;
constexpr int kColRows2 = 1 << kColShift2;
constexpr uint32_t kRegPaths2 = 1u << kRegLevels2;
constexpr uint32_t kTab2 = kRegPaths2 < 8 ? 8 : kRegPaths2;

template <bool R>
__attribute__((target("avx2"))) inline __m256i right_lanes256(__m256i xv, __m256i p, __m256 th) {
  const __m256i dl = _mm256_srai_epi32(p, 31);                        // kNodeDefaultLeft is bit 31
  const __m256i leaf = _mm256_srai_epi32(_mm256_slli_epi32(p, 1), 31);  // kNodeLeaf is bit 30
  static_assert(kNodeDefaultLeft == 1u << 31 && kNodeLeaf == 1u << 30);
  if constexpr (R) {
    const __m256i rank = _mm256_and_si256(_mm256_srli_epi32(p, kRankShift), _mm256_set1_epi32(int32_t(kRankMask)));
    const __m256i lt = _mm256_cmpgt_epi32(rank, xv);
    const __m256i nan = _mm256_cmpeq_epi32(xv, _mm256_set1_epi32(kNanBin));
    return _mm256_andnot_si256(_mm256_or_si256(_mm256_or_si256(lt, leaf), _mm256_and_si256(nan, dl)), _mm256_set1_epi32(-1));
  } else {
    const __m256 xf = _mm256_castsi256_ps(xv);
    const __m256i ge = _mm256_castps_si256(_mm256_cmp_ps(xf, th, _CMP_GE_OQ));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(xf, xf, _CMP_UNORD_Q));
    return _mm256_andnot_si256(leaf, _mm256_or_si256(ge, _mm256_andnot_si256(dl, nan)));
  }
}

// Entry q of a per-path table of 2^D entries (D <= 4): one vpermd, or two and a blend
// on bit 3 of q.
template <uint32_t D>
__attribute__((target("avx2"), always_inline)) inline __m256i path_lookup(const int32_t* tab, __m256i q) {
  const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab)), q);
  if constexpr (D <= 3) {
    return lo;
  } else if constexpr (D == 4) {
    const __m256i hi = _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab + 8)), q);
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi),
                                                _mm256_castsi256_ps(_mm256_slli_epi32(q, 28))));
  } else {
    static_assert(D == 5);
    const __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(q, 28));
    auto perm = [&](int o) __attribute__((target("avx2"), always_inline)) {
      return _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab + o)), q));
    };
    const __m256 l = _mm256_blendv_ps(perm(0), perm(8), b3);
    const __m256 h = _mm256_blendv_ps(perm(16), perm(24), b3);
    return _mm256_castps_si256(_mm256_blendv_ps(l, h, _mm256_castsi256_ps(_mm256_slli_epi32(q, 27))));
  }
}

// The tables of one tree (see avx2_block): per level d <= kRegLevels2 and path q, at
// kLevelOff2[d] + q, the column offset of the node's input (c), the NaN-free test's
// constant (nf: the plain threshold, or the ranked rank - 1), the full test's two (a, b);
// the left child at the last table level (l) and, for trees no deeper than
// kRegLevels2 + 1, the leaf values of that level's children (leaf: float or double).
constexpr uint32_t kLevelOff2[kRegLevels2 + 1] = {0, 8, 16, 24, 32, 48};
constexpr uint32_t kLevelEntries2 = 80;
static_assert(kRegLevels2 == 5);
struct alignas(64) PathTables {
  int32_t c[kLevelEntries2], nf[kLevelEntries2], l[kTab2];
  alignas(32) unsigned char leaf[2 * kTab2 * sizeof(double)];
  int32_t a[kLevelEntries2], b[kLevelEntries2];
};

// RN: the nodes are in the ranked layout; R: the walk compares bins (else floats, whose
// thresholds a ranked forest keeps in its per-feature tables: x < t[rank - 1] exactly when
// bin < rank).
template <typename T, bool RN, bool R>
__attribute__((target("avx2"))) void build_path_tables(const CompiledForest& cf, uint32_t t, PathTables& pt) {
  static_assert(RN || !R);
  const int* packed = reinterpret_cast<const int*>(cf.packed());
  const float* thr = cf.threshold();
  const int* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const bool leaf_in_thr = !RN && (cf.header().flags & kLeafInThreshold);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i leaf_mask = _mm256_set1_epi32(int32_t(kNodeFeatureMask));
  const uint32_t root = cf.tree_root()[t];
  const uint32_t depth = cf.tree_depth()[t];
  const uint32_t reg_levels = std::min<uint32_t>(kRegLevels2, depth ? depth - 1 : 0);
  std::memset(&pt, 0, sizeof pt);
    // Built 8 paths per vector: every level's arrays hold at least 8 entries (a level of
    // 2^d < 8 paths repeats them), so the parents of paths 8j..8j+7 of level d are
    // entries 8j mod max(8, 2^(d-1)) onward of level d - 1, read with plain loads.
    // nf serves blocks without NaN: ranked, right iff bin > nf (rank - 1, INT_MAX on a
    // leaf); plain, right iff x >= nf (= a, the threshold).
    alignas(32) int32_t node_at[kRegLevels2 + 1][kTab2], node_p[kRegLevels2 + 1][kTab2], node_l[kRegLevels2 + 1][kTab2];
    {
      const __m256i fmask = _mm256_set1_epi32(int32_t(feature_mask(RN)));
      for (uint32_t d = 0; d <= reg_levels; ++d) {
        const uint32_t entries = std::max<uint32_t>(8, 1u << d);  // kLevelOff2[d + 1] - kLevelOff2[d]
        for (uint32_t j = 0; j < entries; j += 8) {
          __m256i i;
          if (d == 0) {
            i = _mm256_set1_epi32(int32_t(root));
          } else {
            const uint32_t po = j % std::max<uint32_t>(8, 1u << (d - 1));
            const __m256i q = _mm256_add_epi32(lane, _mm256_set1_epi32(int32_t(j)));
            const __m256i parent = _mm256_load_si256(reinterpret_cast<const __m256i*>(node_at[d - 1] + po));
            const __m256i pp = _mm256_load_si256(reinterpret_cast<const __m256i*>(node_p[d - 1] + po));
            const __m256i pl = _mm256_load_si256(reinterpret_cast<const __m256i*>(node_l[d - 1] + po));
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi32(q, int(d - 1)), _mm256_set1_epi32(1));
            i = _mm256_blendv_epi8(_mm256_add_epi32(pl, bit), parent, _mm256_srai_epi32(_mm256_slli_epi32(pp, 1), 31));
          }
          const __m256i p = _mm256_i32gather_epi32(packed, i, 4);
          const __m256i leaf = _mm256_srai_epi32(_mm256_slli_epi32(p, 1), 31);
          const __m256i dl = _mm256_srai_epi32(p, 31);
          _mm256_store_si256(reinterpret_cast<__m256i*>(node_at[d] + j), i);
          _mm256_store_si256(reinterpret_cast<__m256i*>(node_p[d] + j), p);
          _mm256_store_si256(reinterpret_cast<__m256i*>(node_l[d] + j), _mm256_i32gather_epi32(left, i, 4));
          _mm256_store_si256(reinterpret_cast<__m256i*>(pt.c + kLevelOff2[d] + j),
                             _mm256_andnot_si256(leaf, _mm256_slli_epi32(_mm256_and_si256(p, fmask), kColShift2)));
          __m256i ta, tb;
          if constexpr (R) {
            const __m256i rank = _mm256_and_si256(_mm256_srli_epi32(p, kRankShift), _mm256_set1_epi32(int32_t(kRankMask)));
            // u = kNanBin - rank + (NaN goes right), 0 on a leaf
            const __m256i u = _mm256_andnot_si256(
                leaf, _mm256_sub_epi32(_mm256_sub_epi32(_mm256_set1_epi32(kNanBin + 1), rank), _mm256_srli_epi32(p, 31)));
            ta = _mm256_sub_epi32(_mm256_set1_epi32(int32_t(0x80000000u)), rank);
            tb = _mm256_xor_si256(u, _mm256_set1_epi32(int32_t(0x80000000u)));
            _mm256_store_si256(reinterpret_cast<__m256i*>(pt.nf + kLevelOff2[d] + j),
                               _mm256_blendv_epi8(_mm256_sub_epi32(rank, _mm256_set1_epi32(1)), _mm256_set1_epi32(INT32_MAX), leaf));
          } else {
            __m256 th;
            if constexpr (RN) {
              const __m256i rank = _mm256_and_si256(_mm256_srli_epi32(p, kRankShift), _mm256_set1_epi32(int32_t(kRankMask)));
              const __m256i split = _mm256_xor_si256(leaf, _mm256_set1_epi32(-1));
              const __m256i off = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(cf.bin_offsets()),
                                                              _mm256_and_si256(p, fmask), split, 4);
              th = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), cf.bin_values(),
                                            _mm256_sub_epi32(_mm256_add_epi32(off, rank), _mm256_set1_epi32(1)),
                                            _mm256_castsi256_ps(split), 4);
            } else {
              th = _mm256_i32gather_ps(thr, i, 4);
            }
            th = _mm256_blendv_ps(th, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _mm256_cmp_ps(th, th, _CMP_UNORD_Q));
            th = _mm256_blendv_ps(th, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), _mm256_castsi256_ps(leaf));
            ta = _mm256_castps_si256(th);
            tb = _mm256_andnot_si256(_mm256_or_si256(leaf, dl), _mm256_set1_epi32(-1));
          }
          if constexpr (!R) _mm256_store_si256(reinterpret_cast<__m256i*>(pt.nf + kLevelOff2[d] + j), ta);
          _mm256_store_si256(reinterpret_cast<__m256i*>(pt.a + kLevelOff2[d] + j), ta);
          _mm256_store_si256(reinterpret_cast<__m256i*>(pt.b + kLevelOff2[d] + j), tb);
        }
      }
    }
    std::memcpy(pt.l, node_l[reg_levels], sizeof pt.l);
    // When the last table level is the tree's last split level (depth <= kRegLevels2 + 1),
    // its children are all leaves: their values go into a table too, the left child's of
    // path q at q and the right child's at q + P, and a lane reads its leaf value with one
    // gather from that small table instead of a gather by node (two in the ranked layout).
    const bool leaf_tab = reg_levels >= 1 && depth == reg_levels + 1;
    const uint32_t leaf_half = std::max<uint32_t>(8, 1u << reg_levels);  // P
    T* tab_v = reinterpret_cast<T*>(pt.leaf);
    if (leaf_tab) {
      for (uint32_t j = 0; j < leaf_half; j += 8) {
        const __m256i l = _mm256_load_si256(reinterpret_cast<const __m256i*>(node_l[reg_levels] + j));
        const __m256i p = _mm256_load_si256(reinterpret_cast<const __m256i*>(node_p[reg_levels] + j));
        // A leaf at this level points to itself and never goes right: its "right child"
        // slot repeats it (l + 1 could be past the last node).
        const __m256i r = _mm256_sub_epi32(l, _mm256_xor_si256(_mm256_srai_epi32(_mm256_slli_epi32(p, 1), 31), _mm256_set1_epi32(-1)));
        for (int side = 0; side < 2; ++side) {
          const __m256i c = side ? r : l;
          T* dst = tab_v + side * leaf_half + j;
          if constexpr (std::is_same_v<T, float>) {
            const __m256 lv = leaf_in_thr ? _mm256_i32gather_ps(thr, c, 4)
                                          : _mm256_i32gather_ps(leaves, _mm256_and_si256(_mm256_i32gather_epi32(packed, c, 4), leaf_mask), 4);
            _mm256_store_ps(dst, lv);
          } else {
            const __m256i li = _mm256_and_si256(_mm256_i32gather_epi32(packed, c, 4), leaf_mask);
            _mm256_store_pd(dst, _mm256_i32gather_pd(leaves, _mm256_castsi256_si128(li), 8));
            _mm256_store_pd(dst + 4, _mm256_i32gather_pd(leaves, _mm256_extracti128_si256(li, 1), 8));
          }
        }
      }
    }
}

// Built on the first AVX2 batch walk of a forest (by whichever thread gets there first).
}  // namespace
}  // namespace slim::forest::detail
namespace slim::forest {
struct CompiledForest::WalkCache {
  std::once_flag once;
  int mode = -1;  // which tables (RN * 2 + R) were built
  std::vector<detail::PathTables> trees;
  // Ranked forests: each node's leaf value (0 on splits), float or double as the sums,
  // so a lane reads its leaf with one gather by node instead of two (index, then value).
  std::vector<unsigned char> node_values;
};
}  // namespace slim::forest
namespace slim::forest::detail {
namespace {

// A forest's tables serve one kind of walk (the entry points pick it from the forest, so
// it never changes); another kind gets none and falls back.
template <typename T, bool RN, bool R>
__attribute__((target("avx2"))) const PathTables* path_tables(const CompiledForest& cf) {
  CompiledForest::WalkCache* cache = cf.walk_cache();
  if (!cache) return nullptr;
  std::call_once(cache->once, [&] {
    cache->trees.resize(cf.num_trees());
    for (uint32_t t = 0; t < cf.num_trees(); ++t) build_path_tables<T, RN, R>(cf, t, cache->trees[t]);
    if (RN) {
      cache->node_values.assign(size_t(cf.num_nodes()) * sizeof(T), 0);
      T* nv = reinterpret_cast<T*>(cache->node_values.data());
      const T* leaves = static_cast<const T*>(cf.leaf_values());
      for (uint32_t i = 0; i < cf.num_nodes(); ++i)
        if (cf.packed()[i] & kNodeLeaf) nv[i] = leaves[cf.packed()[i] & kNodeFeatureMask];
    }
    cache->mode = int(RN) * 2 + int(R);
  });
  return cache->mode == int(RN) * 2 + int(R) ? cache->trees.data() : nullptr;
}

template <typename T, bool R>
__attribute__((target("avx2"))) void avx2_block(const CompiledForest& cf, const PathTables* tables, const T* node_val, const int32_t* xt,
                                                int64_t rows, bool nan_free, int64_t n, int64_t r0, T* acc) {
  const int* packed = reinterpret_cast<const int*>(cf.packed());
  const float* thr = cf.threshold();
  const int* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const bool leaf_in_thr = !R && (cf.header().flags & kLeafInThreshold);  // implies float leaves
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i feat_mask = _mm256_set1_epi32(int32_t(feature_mask(R)));
  const __m256i leaf_mask = _mm256_set1_epi32(int32_t(kNodeFeatureMask));
  const __m256i leaf_bit = _mm256_set1_epi32(int32_t(kNodeLeaf));
  const uint32_t T_ = cf.num_trees();
  for (uint32_t t = 0; t < T_; ++t) {
    const uint32_t root = cf.tree_root()[t];
    const uint32_t depth = cf.tree_depth()[t];
    prefetch_next_tree<R>(cf, t);
    const uint32_t reg_levels = std::min<uint32_t>(kRegLevels2, depth ? depth - 1 : 0);
    const PathTables& pt = tables[t];
    if (t + 1 < T_)
      for (size_t o = 0; o < sizeof(PathTables); o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(&tables[t + 1]) + o, _MM_HINT_T0);
    const int32_t* cols[kBlendX2 + 1][1 << kBlendX2];
    for (uint32_t d = 0; d <= std::min(reg_levels, kBlendX2); ++d)
      for (uint32_t q = 0; q < (1u << d); ++q) cols[d][q] = xt + pt.c[kLevelOff2[d] + q];
    const int32_t* tab_l = pt.l;
    const bool leaf_tab = reg_levels >= 1 && depth == reg_levels + 1;
    const uint32_t leaf_half = std::max<uint32_t>(8, 1u << reg_levels);  // P
    const T* tab_v = reinterpret_cast<const T*>(pt.leaf);
    T* a = acc + int64_t(cf.tree_group()[t]) * n + r0;

    auto test = [&](__m256i xv, __m256i ta, __m256i tb) __attribute__((target("avx2"), always_inline)) {
      if constexpr (R) {
        return _mm256_cmpgt_epi32(tb, _mm256_add_epi32(xv, ta));
      } else {
        const __m256 xf = _mm256_castsi256_ps(xv);
        const __m256i ge = _mm256_castps_si256(_mm256_cmp_ps(xf, _mm256_castsi256_ps(ta), _CMP_GE_OQ));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(xf, xf, _CMP_UNORD_Q));
        return _mm256_or_si256(ge, _mm256_and_si256(nan, tb));
      }
    };
    // The test of a NaN-free block: one table per level instead of two.
    auto test_nf = [&](__m256i xv, __m256i tn) __attribute__((target("avx2"), always_inline)) {
      if constexpr (R) return _mm256_cmpgt_epi32(xv, tn);
      else return _mm256_castps_si256(_mm256_cmp_ps(_mm256_castsi256_ps(xv), _mm256_castsi256_ps(tn), _CMP_GE_OQ));
    };
    auto group = [&]<int V, bool N>(int64_t k) __attribute__((target("avx2"), always_inline)) {
      __m256i idx[V], q[V];
      if (depth == 0) {
        for (int v = 0; v < V; ++v) idx[v] = _mm256_set1_epi32(int32_t(root));
      } else {
        const __m256i a0 = _mm256_set1_epi32(pt.a[0]), b0 = _mm256_set1_epi32(pt.b[0]);
        const __m256i n0 = _mm256_set1_epi32(pt.nf[0]);
        for (int v = 0; v < V; ++v) {
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols[0][0] + k + 8 * v));
          const __m256i right = N ? test(x0, a0, b0) : test_nf(x0, n0);
          if (reg_levels == 0) idx[v] = _mm256_sub_epi32(_mm256_set1_epi32(pt.l[0]), right);
          else q[v] = _mm256_srli_epi32(right, 31);
        }
      }
      auto reg_level = [&]<uint32_t D>() __attribute__((target("avx2"), always_inline)) {
        for (int v = 0; v < V; ++v) {
          __m256i xv;
          if constexpr (D <= kBlendX2) {
            __m256i c[1 << D];
            for (uint32_t j = 0; j < (1u << D); ++j) c[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols[D][j] + k + 8 * v));
            for (uint32_t j = 0; j < D; ++j) {
              const __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(q[v], int(31 - j)));
              for (uint32_t m = 0; m < (1u << (D - j - 1)); ++m)
                c[m] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(c[2 * m]), _mm256_castsi256_ps(c[2 * m + 1]), sel));
            }
            xv = c[0];
          } else {
            const __m256i row = _mm256_add_epi32(lane, _mm256_set1_epi32(int32_t(k + 8 * v)));
            xv = _mm256_i32gather_epi32(xt, _mm256_add_epi32(path_lookup<D>(pt.c + kLevelOff2[D], q[v]), row), 4);
          }
          const __m256i right = N ? test(xv, path_lookup<D>(pt.a + kLevelOff2[D], q[v]), path_lookup<D>(pt.b + kLevelOff2[D], q[v]))
                                  : test_nf(xv, path_lookup<D>(pt.nf + kLevelOff2[D], q[v]));
          if (D == reg_levels && leaf_tab) {
            const __m256i li = _mm256_or_si256(q[v], _mm256_and_si256(right, _mm256_set1_epi32(int32_t(leaf_half))));
            T* out = a + k + 8 * v;
            if constexpr (std::is_same_v<T, float>) {
              _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), _mm256_i32gather_ps(tab_v, li, 4)));
            } else {
              const __m256d lo = _mm256_i32gather_pd(tab_v, _mm256_castsi256_si128(li), 8);
              const __m256d hi = _mm256_i32gather_pd(tab_v, _mm256_extracti128_si256(li, 1), 8);
              _mm256_storeu_pd(out, _mm256_add_pd(_mm256_loadu_pd(out), lo));
              _mm256_storeu_pd(out + 4, _mm256_add_pd(_mm256_loadu_pd(out + 4), hi));
            }
          } else if (D == reg_levels)
            idx[v] = _mm256_sub_epi32(path_lookup<D>(tab_l, q[v]), right);
          else
            q[v] = _mm256_or_si256(q[v], _mm256_and_si256(right, _mm256_set1_epi32(1 << D)));
        }
      };
      auto gather_level = [&]() __attribute__((target("avx2"), always_inline)) {
        for (int v = 0; v < V; ++v) {
          const __m256i p = _mm256_i32gather_epi32(packed, idx[v], 4);
          const __m256 th = R ? _mm256_setzero_ps() : _mm256_i32gather_ps(thr, idx[v], 4);
          const __m256i l = _mm256_i32gather_epi32(left, idx[v], 4);
          const __m256i split = _mm256_cmpeq_epi32(_mm256_and_si256(p, leaf_bit), _mm256_setzero_si256());
          const __m256i row = _mm256_add_epi32(lane, _mm256_set1_epi32(int32_t(k + 8 * v)));
          const __m256i xi = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(p, feat_mask), kColShift2), row);
          const __m256i xv = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), xt, xi, split, 4);
          __m256i right;
          if constexpr (N) {
            right = right_lanes256<R>(xv, p, th);
          } else if constexpr (R) {  // no NaN bin: right iff bin >= rank, on a split
            const __m256i rank = _mm256_and_si256(_mm256_srli_epi32(p, kRankShift), _mm256_set1_epi32(int32_t(kRankMask)));
            right = _mm256_andnot_si256(_mm256_cmpgt_epi32(rank, xv), split);
          } else {  // no NaN input: right iff x >= t, on a split
            right = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(_mm256_castsi256_ps(xv), th, _CMP_GE_OQ)), split);
          }
          idx[v] = _mm256_sub_epi32(l, right);
        }
      };
      if constexpr (kRegLevels2 >= 1) if (reg_levels >= 1) reg_level.template operator()<1>();
      if constexpr (kRegLevels2 >= 2) if (reg_levels >= 2) reg_level.template operator()<2>();
      if constexpr (kRegLevels2 >= 3) if (reg_levels >= 3) reg_level.template operator()<3>();
      if constexpr (kRegLevels2 >= 4) if (reg_levels >= 4) reg_level.template operator()<4>();
      if constexpr (kRegLevels2 >= 5) if (reg_levels >= 5) reg_level.template operator()<5>();
      static_assert(kRegLevels2 <= 5);
      if (leaf_tab) return;
      for (uint32_t d = reg_levels + 1; d < depth; ++d) gather_level();
      for (int v = 0; v < V; ++v) {
        T* out = a + k + 8 * v;
        if constexpr (std::is_same_v<T, float>) {
          const __m256 lv = leaf_in_thr ? _mm256_i32gather_ps(thr, idx[v], 4)
                            : node_val  ? _mm256_i32gather_ps(node_val, idx[v], 4)
                                        : _mm256_i32gather_ps(leaves, _mm256_and_si256(_mm256_i32gather_epi32(packed, idx[v], 4), leaf_mask), 4);
          _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), lv));
        } else if (node_val) {
          const __m256d lo = _mm256_i32gather_pd(node_val, _mm256_castsi256_si128(idx[v]), 8);
          const __m256d hi = _mm256_i32gather_pd(node_val, _mm256_extracti128_si256(idx[v], 1), 8);
          _mm256_storeu_pd(out, _mm256_add_pd(_mm256_loadu_pd(out), lo));
          _mm256_storeu_pd(out + 4, _mm256_add_pd(_mm256_loadu_pd(out + 4), hi));
        } else {
          const __m256i li = _mm256_and_si256(_mm256_i32gather_epi32(packed, idx[v], 4), leaf_mask);
          const __m256d lo = _mm256_i32gather_pd(leaves, _mm256_castsi256_si128(li), 8);
          const __m256d hi = _mm256_i32gather_pd(leaves, _mm256_extracti128_si256(li, 1), 8);
          _mm256_storeu_pd(out, _mm256_add_pd(_mm256_loadu_pd(out), lo));
          _mm256_storeu_pd(out + 4, _mm256_add_pd(_mm256_loadu_pd(out + 4), hi));
        }
      }
    };
    int64_t k = 0;
    if (nan_free) {
      for (; k + 8 * kInterleave2 <= rows; k += 8 * kInterleave2) group.template operator()<kInterleave2, false>(k);
      for (; k + 8 <= rows; k += 8) group.template operator()<1, false>(k);
    } else {
      for (; k + 8 * kInterleave2 <= rows; k += 8 * kInterleave2) group.template operator()<kInterleave2, true>(k);
      for (; k + 8 <= rows; k += 8) group.template operator()<1, true>(k);
    }
  }
}

// RN && !R: a ranked forest walked on float rows, its thresholds taken from the
// per-feature tables (no binning); only for forests whose every level is in the path
// tables (max depth <= kRegLevels2 + 1), as the node-gathering levels read thresholds
// from the plain layout's table.
template <typename T, bool R, bool RN = R>
__attribute__((target("avx2"))) int64_t avx2_walk(const CompiledForest& cf, const int32_t* x,
                                                  int64_t n, T* acc) {
  const int64_t F = cf.num_features();
  if (F > 4096) return 0;
  if (RN && !R && cf.max_depth() > kRegLevels2 + 1) return 0;
  const PathTables* tables = path_tables<T, RN, R>(cf);
  if (!tables) return 0;
  const T* node_val = RN ? reinterpret_cast<const T*>(cf.walk_cache()->node_values.data()) : nullptr;
  int32_t* xt = column_buffer(size_t(F) * kColRows2);
  int64_t r = 0;
  for (int64_t c0 = 0; c0 + 8 <= n; c0 += kColRows2) {
    const int64_t rows = std::min<int64_t>(kColRows2, n - c0) & ~int64_t(7);
    // NaN inputs (kNanBin in the ranked layout) are rare: a block without any takes the
    // shorter split test.
    bool nan_any = false;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t f = 0; f < F; ++f) {
        const int32_t v = x[(c0 + i) * F + f];
        nan_any |= R ? v == kNanBin : (v & 0x7fffffff) > 0x7f800000;
        xt[size_t(f * kColRows2 + i)] = v;
      }
    avx2_block<T, R>(cf, tables, node_val, xt, rows, !nan_any, n, c0, acc);
    r = c0 + rows;
  }
  return r;
}

// One row, 16 trees at a time (lanes are trees): the 16 walks are independent, so their
// loads overlap instead of forming one long chain of dependent loads. Leaf values come
// back in tree order so the caller adds them in the same order as the scalar walk.
template <typename T, bool R>
__attribute__((target("avx512f"))) void avx512_row(const CompiledForest& cf, const int32_t* row, T* acc) {
  const uint32_t* packed = cf.packed();
  const float* thr = cf.threshold();
  const int32_t* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const bool leaf_in_thr = !R && (cf.header().flags & kLeafInThreshold);  // implies float leaves
  const uint32_t* roots = cf.tree_root();
  const uint32_t* depths = cf.tree_depth();
  const uint32_t* groups = cf.tree_group();
  const bool one_group = cf.num_groups() == 1;
  const __m512i feat_mask = _mm512_set1_epi32(int32_t(feature_mask(R)));
  const __m512i leaf_mask = _mm512_set1_epi32(int32_t(kNodeFeatureMask));
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bit5 = _mm512_set1_epi32(32);
  const uint32_t T_ = cf.num_trees();
  // Rows of up to 64 inputs are held in four registers (a lane on a leaf permutes some
  // input it does not use).
  const uint32_t F = cf.num_features();
  __m512i row_tab[4];
  for (uint32_t k = 0; k < 4; ++k) {
    const uint32_t lo = 16 * k;
    row_tab[k] = _mm512_maskz_loadu_epi32(__mmask16(F >= lo + 16 ? 0xffffu : F <= lo ? 0u : (1u << (F - lo)) - 1), row + lo);
  }
  // Two vectors (32 trees) per pass: the walks are chains of dependent loads, and more
  // independent chains in flight hide more of the cache-miss latency of large forests.
  constexpr int kVecs = 2;
  alignas(64) T vals[16 * kVecs];
  for (uint32_t t0 = 0; t0 < T_; t0 += 16 * kVecs) {
    const uint32_t cnt = std::min<uint32_t>(16 * kVecs, T_ - t0);
    __mmask16 live[kVecs];
    __m512i idx[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      const uint32_t lo = 16u * uint32_t(v);
      live[v] = __mmask16(cnt >= lo + 16 ? 0xffffu : cnt <= lo ? 0u : (1u << (cnt - lo)) - 1);
      idx[v] = _mm512_maskz_loadu_epi32(live[v], roots + t0 + lo);
    }
    uint32_t depth = 0;
    for (uint32_t k = 0; k < cnt; ++k) depth = std::max(depth, depths[t0 + k]);
    for (uint32_t d = 0; d < depth; ++d) {
      for (int v = 0; v < kVecs; ++v) {
        const __m512i p = _mm512_i32gather_epi32(idx[v], packed, 4);
        const __m512 th = R ? _mm512_setzero_ps() : _mm512_i32gather_ps(idx[v], thr, 4);
        const __m512i l = _mm512_i32gather_epi32(idx[v], left, 4);
        const __mmask16 split = split_lanes512(p);
        const __m512i f = _mm512_and_si512(p, feat_mask);
        __m512i xv;
        if (F <= 64) {  // the row sits in registers: permutes replace the input gather
          xv = _mm512_permutex2var_epi32(row_tab[0], f, row_tab[1]);
          if (F > 32)
            xv = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(f, bit5), xv,
                                         _mm512_permutex2var_epi32(row_tab[2], f, row_tab[3]));
        } else {
          xv = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), split, f, row, 4);
        }
        idx[v] = _mm512_mask_add_epi32(l, right_mask512<R>(xv, p, th, split), l, one);
      }
    }
    for (int v = 0; v < kVecs; ++v) {
      // Lanes past the last tree walked tree 0 for a depth that is not its own, so they
      // may not stand on a leaf: they read leaf 0 instead of an arbitrary index.
      T* out = vals + 16 * v;
      if constexpr (std::is_same_v<T, float>) {
        if (leaf_in_thr) {
          _mm512_store_ps(out, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live[v], idx[v], thr, 4));
          continue;
        }
      }
      const __m512i li = _mm512_and_si512(
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[v], idx[v], packed, 4), leaf_mask);
      if constexpr (std::is_same_v<T, float>) {
        _mm512_store_ps(out, _mm512_i32gather_ps(li, leaves, 4));
      } else {
        _mm512_store_pd(out, _mm512_i32gather_pd(_mm512_castsi512_si256(li), leaves, 8));
        _mm512_store_pd(out + 8, _mm512_i32gather_pd(_mm512_extracti64x4_epi64(li, 1), leaves, 8));
      }
    }
    if (one_group) {
      T a = acc[0];
      for (uint32_t k = 0; k < cnt; ++k) a += vals[k];
      acc[0] = a;
    } else {
      for (uint32_t k = 0; k < cnt; ++k) acc[groups[t0 + k]] += vals[k];
    }
  }
}

template <typename T, bool R, int K>
__attribute__((target("avx2"))) void avx2_row_k(const CompiledForest& cf, const int32_t* row, T* acc) {
  const int* packed = reinterpret_cast<const int*>(cf.packed());
  const float* thr = cf.threshold();
  const int* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const bool leaf_in_thr = !R && (cf.header().flags & kLeafInThreshold);  // implies float leaves
  const uint32_t* roots = cf.tree_root();
  const uint32_t* depths = cf.tree_depth();
  const uint32_t* groups = cf.tree_group();
  const __m256i feat_mask = _mm256_set1_epi32(int32_t(feature_mask(R)));
  const __m256i leaf_mask = _mm256_set1_epi32(int32_t(kNodeFeatureMask));
  const __m256i one = _mm256_set1_epi32(1);
  const uint32_t T_ = cf.num_trees();
  // K vectors (8 trees each) per pass: the walks are chains of dependent loads, and more
  // independent chains in flight hide more of their latency.
  alignas(32) int32_t lidx[8 * K];
  for (uint32_t t0 = 0; t0 < T_; t0 += 8 * K) {
    const uint32_t cnt = std::min<uint32_t>(8 * K, T_ - t0);
    alignas(32) int32_t start[8 * K] = {};
    uint32_t depth = 0;
    for (uint32_t k = 0; k < cnt; ++k) {
      start[k] = int32_t(roots[t0 + k]);
      depth = std::max(depth, depths[t0 + k]);
    }
    __m256i idx[K];
    for (int v = 0; v < K; ++v) idx[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(start + 8 * v));
    for (uint32_t d = 0; d < depth; ++d) {
      for (int v = 0; v < K; ++v) {
        const __m256i p = _mm256_i32gather_epi32(packed, idx[v], 4);
        const __m256 th = R ? _mm256_setzero_ps() : _mm256_i32gather_ps(thr, idx[v], 4);
        const __m256i l = _mm256_i32gather_epi32(left, idx[v], 4);
        const __m256i leaf = leaf_lanes256(p);
        const __m256i xv = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), row, _mm256_and_si256(p, feat_mask),
                                                       _mm256_xor_si256(leaf, _mm256_set1_epi32(-1)), 4);
        idx[v] = _mm256_add_epi32(l, _mm256_andnot_si256(stay_mask256<R>(xv, p, th, leaf), one));
      }
    }
    // Lanes past the last tree walked tree 0 for a depth that is not its own and may stand
    // on an internal node: what they read is never added.
    if (leaf_in_thr) {
      alignas(32) float lv[8 * K];
      for (int v = 0; v < K; ++v) _mm256_store_ps(lv + 8 * v, _mm256_i32gather_ps(thr, idx[v], 4));
      for (uint32_t k = 0; k < cnt; ++k) acc[groups[t0 + k]] += lv[k];
      continue;
    }
    for (int v = 0; v < K; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(lidx + 8 * v),
                         _mm256_and_si256(_mm256_i32gather_epi32(packed, idx[v], 4), leaf_mask));
    for (uint32_t k = 0; k < cnt; ++k) acc[groups[t0 + k]] += leaves[lidx[k]];
  }
}

// 16 trees per pass, 32 for large forests: against 8, single-row time (forced AVX2) went
// 2.92 -> 1.82 (16) or 2.08 us (32) on 100 trees of depth 6 and 49.7 -> 27.2 or 23.1 us
// on 1,000 trees of depth 8.
template <typename T, bool R>
__attribute__((target("avx2"))) void avx2_row(const CompiledForest& cf, const int32_t* row, T* acc) {
  if (cf.num_trees() >= 512) avx2_row_k<T, R, 4>(cf, row, acc);
  else avx2_row_k<T, R, 2>(cf, row, acc);
}

// Bins for the ranked layout: per value, a descent of the feature's search tree
// (CompiledForest::BinTree) that compares the value with a whole 16-key block per level,
// so a value takes one or two block compares for up to 272 thresholds.
template <uint32_t L>
__attribute__((target("avx512f,popcnt"))) void bin_rows_t(const CompiledForest::BinTree& bt, int64_t F,
                                                          const float* x, int64_t n, int32_t* bins) {
  const float* keys = bt.keys.data();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * F;
    int32_t* out = bins + r * F;
    for (int64_t f = 0; f < F; ++f) {
      const float v = row[f];
      const auto& feat = bt.features[size_t(f)];
      const __m512 xv = _mm512_set1_ps(v);
      uint32_t b = 0;
      for (uint32_t k = 0; k < L; ++k) {
        const __m512 blk = _mm512_loadu_ps(keys + feat.level_start[k] + 16 * b);
        b = 16 * b + uint32_t(__builtin_popcount(_mm512_cmp_ps_mask(blk, xv, _CMP_LE_OQ)));
      }
      out[f] = std::isnan(v) ? kNanBin : int32_t(b);  // NaN compares false: b is 0 there
    }
  }
}

// The same descent with AVX2: a 16-key block is two 8-key compares.
template <uint32_t L>
__attribute__((target("avx2,popcnt"))) void bin_rows_avx2_t(const CompiledForest::BinTree& bt, int64_t F,
                                                            const float* x, int64_t n, int32_t* bins) {
  const float* keys = bt.keys.data();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * F;
    int32_t* out = bins + r * F;
    for (int64_t f = 0; f < F; ++f) {
      const float v = row[f];
      const auto& feat = bt.features[size_t(f)];
      const __m256 xv = _mm256_set1_ps(v);
      uint32_t b = 0;
      for (uint32_t k = 0; k < L; ++k) {
        const float* blk = keys + feat.level_start[k] + 16 * b;
        const uint32_t m = uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(blk), xv, _CMP_LE_OQ))) |
                           uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(blk + 8), xv, _CMP_LE_OQ))) << 8;
        b = 16 * b + uint32_t(__builtin_popcount(m));
      }
      out[f] = std::isnan(v) ? kNanBin : int32_t(b);
    }
  }
}

int64_t bin_rows_impl(bool avx512, const CompiledForest& cf, const float* x, int64_t n, int32_t* bins) {
  const CompiledForest::BinTree* bt = cf.bin_tree();
  if (!bt) return 0;
  const int64_t F = cf.num_features();
  switch (bt->depth) {
    case 0:  // no feature has a threshold
      for (int64_t i = 0; i < n * F; ++i) bins[i] = std::isnan(x[i]) ? kNanBin : 0;
      return n;
    case 1: (avx512 ? bin_rows_t<1> : bin_rows_avx2_t<1>)(*bt, F, x, n, bins); return n;
    case 2: (avx512 ? bin_rows_t<2> : bin_rows_avx2_t<2>)(*bt, F, x, n, bins); return n;
    case 3: (avx512 ? bin_rows_t<3> : bin_rows_avx2_t<3>)(*bt, F, x, n, bins); return n;
    case 4: (avx512 ? bin_rows_t<4> : bin_rows_avx2_t<4>)(*bt, F, x, n, bins); return n;
    default: return 0;
  }
}

// Picks the ranked or plain instance; both read the row data as 32-bit lanes.
template <auto Ranked, auto Plain, typename T>
void dispatch_row(const CompiledForest& cf, const void* row, T* acc) {
  (cf.ranked() ? Ranked : Plain)(cf, static_cast<const int32_t*>(row), acc);
}
template <auto Ranked, auto Plain, typename T>
int64_t dispatch_walk(const CompiledForest& cf, const void* x, int64_t n, T* acc) {
  return (cf.ranked() ? Ranked : Plain)(cf, static_cast<const int32_t*>(x), n, acc);
}

}  // namespace

void row_avx512_f32(const CompiledForest& cf, const void* row, float* acc) { dispatch_row<avx512_row<float, true>, avx512_row<float, false>>(cf, row, acc); }
void row_avx512_f64(const CompiledForest& cf, const void* row, double* acc) { dispatch_row<avx512_row<double, true>, avx512_row<double, false>>(cf, row, acc); }
void row_avx2_f32(const CompiledForest& cf, const void* row, float* acc) { dispatch_row<avx2_row<float, true>, avx2_row<float, false>>(cf, row, acc); }
void row_avx2_f64(const CompiledForest& cf, const void* row, double* acc) { dispatch_row<avx2_row<double, true>, avx2_row<double, false>>(cf, row, acc); }

int64_t walk_avx512_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc) {
  return dispatch_walk<avx512_walk<float, true>, avx512_walk<float, false>>(cf, x, n, acc);
}
int64_t walk_avx512_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc) {
  return dispatch_walk<avx512_walk<double, true>, avx512_walk<double, false>>(cf, x, n, acc);
}
int64_t walk_avx2_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc) {
  return dispatch_walk<avx2_walk<float, true>, avx2_walk<float, false>>(cf, x, n, acc);
}
int64_t walk_avx2_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc) {
  return dispatch_walk<avx2_walk<double, true>, avx2_walk<double, false>>(cf, x, n, acc);
}
int64_t walk_avx2_ranked_floats_f32(const CompiledForest& cf, const float* x, int64_t n, float* acc) {
  return cf.ranked() ? avx2_walk<float, false, true>(cf, reinterpret_cast<const int32_t*>(x), n, acc) : 0;
}
int64_t walk_avx2_ranked_floats_f64(const CompiledForest& cf, const float* x, int64_t n, double* acc) {
  return cf.ranked() ? avx2_walk<double, false, true>(cf, reinterpret_cast<const int32_t*>(x), n, acc) : 0;
}
std::shared_ptr<CompiledForest::WalkCache> new_walk_cache() { return std::make_shared<CompiledForest::WalkCache>(); }
int64_t bin_rows_avx512(const CompiledForest& cf, const float* x, int64_t n, int32_t* bins) {
  return bin_rows_impl(true, cf, x, n, bins);
}
int64_t bin_rows_avx2(const CompiledForest& cf, const float* x, int64_t n, int32_t* bins) {
  return bin_rows_impl(false, cf, x, n, bins);
}

}  // namespace slim::forest::detail

#endif  // defined(__x86_64__)
