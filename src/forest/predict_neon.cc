// NEON batch walk (aarch64 only; x86-64 has predict_simd.cc): 4 rows per vector and 4
// vectors interleaved step through one tree together, so 16 independent walks overlap
// their loads. NEON has no gather: each lane fetches its node with a scalar load, and the
// split tests and child steps run on the vectors. Leaves point to themselves, so every
// lane takes exactly tree_depth steps; the leaves are added per row in tree order, as the
// scalar walk adds them, so sums are bit-identical.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <type_traits>

#include "forest/walk.h"

namespace slim::forest::detail {
namespace {

constexpr int kInterleave = 4;

template <typename T, int V, bool R>
void neon_rows(const CompiledForest& cf, const int32_t* x, int64_t n, int64_t r0, T* acc) {
  const int64_t F = cf.num_features();
  const uint32_t* packed = cf.packed();
  const float* thr = cf.threshold();
  const int32_t* left = cf.left();
  const T* leaves = static_cast<const T*>(cf.leaf_values());
  const uint32_t feat_mask = R ? kRankedFeatureMask : kNodeFeatureMask;
  const uint32x4_t leaf_bit = vdupq_n_u32(kNodeLeaf), dl_bit = vdupq_n_u32(kNodeDefaultLeft), one = vdupq_n_u32(1);
  const int32_t* xr[V * 4];
  for (int k = 0; k < V * 4; ++k) xr[k] = x + (r0 + k) * F;
  for (uint32_t t = 0; t < cf.num_trees(); ++t) {
    alignas(16) uint32_t idx[V * 4];
    for (uint32_t& i : idx) i = cf.tree_root()[t];
    const uint32_t depth = cf.tree_depth()[t];
    for (uint32_t d = 0; d < depth; ++d) {
      for (int v = 0; v < V; ++v) {
        alignas(16) uint32_t pa[4], la[4];
        alignas(16) int32_t xa[4];
        alignas(16) float ta[4];
        for (int l = 0; l < 4; ++l) {
          const uint32_t i = idx[4 * v + l], p = packed[i];
          pa[l] = p;
          la[l] = uint32_t(left[i]);
          if constexpr (!R) ta[l] = thr[i];
          // A leaf's feature field holds its leaf index: its lane reads no input.
          xa[l] = (p & kNodeLeaf) ? 0 : xr[4 * v + l][p & feat_mask];
        }
        const uint32x4_t p = vld1q_u32(pa);
        const int32x4_t xv = vld1q_s32(xa);
        const uint32x4_t leaf = vtstq_u32(p, leaf_bit), dl = vtstq_u32(p, dl_bit);
        uint32x4_t lt, nan;
        if constexpr (R) {
          const int32x4_t rank = vreinterpretq_s32_u32(vandq_u32(vshrq_n_u32(p, kRankShift), vdupq_n_u32(kRankMask)));
          lt = vcgtq_s32(rank, xv);
          nan = vceqq_s32(xv, vdupq_n_s32(kNanBin));
        } else {
          const float32x4_t xf = vreinterpretq_f32_s32(xv);
          lt = vcltq_f32(xf, vld1q_f32(ta));
          nan = vmvnq_u32(vceqq_f32(xf, xf));
        }
        const uint32x4_t stay = vorrq_u32(vorrq_u32(lt, leaf), vandq_u32(nan, dl));
        vst1q_u32(idx + 4 * v, vaddq_u32(vld1q_u32(la), vbicq_u32(one, stay)));
      }
    }
    T* a = acc + int64_t(cf.tree_group()[t]) * n + r0;
    for (int k = 0; k < V * 4; ++k) a[k] += leaves[packed[idx[k]] & kNodeFeatureMask];
  }
}

template <typename T, bool R>
int64_t neon_walk(const CompiledForest& cf, const int32_t* x, int64_t n, T* acc) {
  int64_t r = 0;
  for (; r + 4 * kInterleave <= n; r += 4 * kInterleave) neon_rows<T, kInterleave, R>(cf, x, n, r, acc);
  for (; r + 4 <= n; r += 4) neon_rows<T, 1, R>(cf, x, n, r, acc);
  return r;
}

template <typename T>
int64_t dispatch_walk(const CompiledForest& cf, const void* x, int64_t n, T* acc) {
  return cf.ranked() ? neon_walk<T, true>(cf, static_cast<const int32_t*>(x), n, acc)
                     : neon_walk<T, false>(cf, static_cast<const int32_t*>(x), n, acc);
}

}  // namespace

int64_t walk_neon_f32(const CompiledForest& cf, const void* x, int64_t n, float* acc) {
  return dispatch_walk(cf, x, n, acc);
}
int64_t walk_neon_f64(const CompiledForest& cf, const void* x, int64_t n, double* acc) {
  return dispatch_walk(cf, x, n, acc);
}

}  // namespace slim::forest::detail

#endif  // defined(__aarch64__)
