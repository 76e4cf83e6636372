#include "slim/llm/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "slim/llm/ggml_blocks.h"
#include "slim/core/error.h"
#include "slim/core/half.h"

namespace slim::llm {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

struct KnownType {
  uint32_t id;
  GgmlTypeInfo info;
};

constexpr KnownType kKnownTypes[] = {
    {0, {"F32", 1, 4, true}},        {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},     {3, {"Q4_1", 32, 20, false}},
    {6, {"Q5_0", 32, 22, false}},    {7, {"Q5_1", 32, 24, false}},
    {8, {"Q8_0", 32, 34, true}},     {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", 256, 84, false}},  {11, {"Q3_K", 256, 110, false}},
    {12, {"Q4_K", 256, 144, true}},  {13, {"Q5_K", 256, 176, false}},
    {14, {"Q6_K", 256, 210, true}},  {15, {"Q8_K", 256, 292, false}},
    {30, {"BF16", 1, 2, true}},
};

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = d != 0 ? 1.f / d : 0.f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) y[i].qs[j] = int8_t(std::roundf(x[j] * id));
  }
}

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    // The signed value of largest magnitude maps to -8, so the full range [-8, 7] is used.
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.f;
    const float id = d != 0 ? 1.f / d : 0.f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < 16; ++j) {
      const uint8_t a = uint8_t(std::min(15, int(int8_t(x[j] * id + 8.5f))));
      const uint8_t b = uint8_t(std::min(15, int(int8_t(x[j + 16] * id + 8.5f))));
      y[i].qs[j] = uint8_t(a | (b << 4));
    }
  }
}

// Weighted least-squares fit of scale and min for an unsigned nmax-level quantization,
// searching nstep candidate inverse scales around the naive one (ggml's make_qkx2_quants).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_mad = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * L[i] + min - x[i];
    best_mad += weights[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float mad = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        mad += weights[i] * diff * diff;
      }
      if (mad < best_mad) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_mad = mad;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric signed quantization to [-nmax, nmax-1] with an x^2-weighted refinement of
// the scale over 18 candidates (ggml's make_qx_quants with rmse_type 1).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_q4_k(const float* x, BlockQ4K* y, int64_t nb) {
  uint8_t L[256], Laux[32];
  float weights[32], mins[8], scales[8];
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                   -1.f, 0.1f, 20);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = uint8_t(std::min(63, nearest_int(inv_scale * scales[j])));
      const uint8_t lm = uint8_t(std::min(63, nearest_int(inv_min * mins[j])));
      if (j < 4) {
        y[i].scales[j] = ls;
        y[i].scales[j + 4] = lm;
      } else {
        y[i].scales[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
        y[i].scales[j - 4] |= uint8_t((ls >> 4) << 6);
        y[i].scales[j] |= uint8_t((lm >> 4) << 6);
      }
    }
    y[i].d = f32_to_f16(max_scale / 63.f);
    y[i].dmin = f32_to_f16(max_min / 63.f);
    // Requantize against the rounded 6-bit scales so the stored codes fit what decodes.
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4k_scale_min(j, y[i].scales, &sc, &m);
      const float d = f16_to_f32(y[i].d) * sc;
      if (d == 0) continue;
      const float dm = f16_to_f32(y[i].dmin) * m;
      for (int ii = 0; ii < 32; ++ii) {
        const int l = nearest_int((x[32 * j + ii] + dm) / d);
        L[32 * j + ii] = uint8_t(std::max(0, std::min(15, l)));
      }
    }
    uint8_t* q = y[i].qs;
    for (int j = 0; j < 256; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quantize_q6_k(const float* x, BlockQ6K* y, int64_t nb) {
  int8_t L[256];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_f32(y[i].d) * y[i].scales[j];
      if (d == 0) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = int8_t(l + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = uint8_t(q1 | (q3 << 4));
        ql[l + 32] = uint8_t(q2 | (q4 << 4));
        qh[l] = uint8_t((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                        ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_q4_k(const BlockQ4K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      q4k_scale_min(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4k_scale_min(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void dequantize_q6_k(const BlockQ6K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type_id) {
  for (const auto& t : kKnownTypes)
    if (t.id == type_id) return &t.info;
  return nullptr;
}

std::string ggml_type_name(uint32_t type_id) {
  const GgmlTypeInfo* info = ggml_type_info(type_id);
  return info ? std::string(info->name) : "type " + std::to_string(type_id);
}

int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(type));
  if (!info) throw Error(ErrorCode::internal, "ggml_row_bytes: unknown type");
  return n / info->block_elems * info->block_bytes;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(type));
  if (!info || !info->computable)
    throw Error(ErrorCode::unsupported, "dequantize: type " + ggml_type_name(uint32_t(type)) + " is not supported");
  if (n % info->block_elems != 0)
    throw Error(ErrorCode::invalid_argument, "dequantize: row length not a multiple of the block size");
  const int64_t nb = n / info->block_elems;
  switch (type) {
    case GgmlType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case GgmlType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case GgmlType::q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = b[i].qs[j] * d;
      }
      return;
    }
    case GgmlType::q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[i * 32 + j] = float(int(b[i].qs[j] & 0xF) - 8) * d;
          dst[i * 32 + j + 16] = float(int(b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case GgmlType::q4_k: dequantize_q4_k(static_cast<const BlockQ4K*>(src), dst, nb); return;
    case GgmlType::q6_k: dequantize_q6_k(static_cast<const BlockQ6K*>(src), dst, nb); return;
    default: break;
  }
  throw Error(ErrorCode::internal, "dequantize: unhandled type");
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(type));
  if (!info || !info->computable)
    throw Error(ErrorCode::unsupported, "quantize: type " + ggml_type_name(uint32_t(type)) + " is not supported");
  if (n % info->block_elems != 0)
    throw Error(ErrorCode::invalid_argument,
                "quantize: row length " + std::to_string(n) + " is not a multiple of the " +
                    std::string(info->name) + " block size " + std::to_string(info->block_elems));
  const int64_t nb = n / info->block_elems;
  switch (type) {
    case GgmlType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case GgmlType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case GgmlType::q8_0: quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); return;
    case GgmlType::q4_0: quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return;
    case GgmlType::q4_k: quantize_q4_k(src, static_cast<BlockQ4K*>(dst), nb); return;
    case GgmlType::q6_k: quantize_q6_k(src, static_cast<BlockQ6K*>(dst), nb); return;
    default: break;
  }
  throw Error(ErrorCode::internal, "quantize: unhandled type");
}

}  // namespace slim::llm
