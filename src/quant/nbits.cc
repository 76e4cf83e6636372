// Weight-only 4-bit MatMul: a MatMul or Gemm with a constant float weight becomes
// com.microsoft MatMulNBits (bits 4) in ONNX Runtime's layout, which slim's cpu provider
// (src/runtime/cpu/matmul_nbits.cc) and ref kernel run: B is (N, k_blocks, block/2) bytes,
// column n's codes along K, two per byte, the first in the low nibble; one f32 scale per
// (n, block) and one 4-bit zero point per (n, block), packed two per byte the same way.
// Per block, asymmetric over [min(0, w), max(0, w)]: scale = (hi − lo) / 15,
// zero point = round(−lo / scale), code = clamp(round(w / scale) + zero point, 0, 15).
#include <algorithm>
#include <cmath>

#include "quant/quant_internal.h"
#include "slim/core/error.h"

namespace slim::quant::detail {

std::optional<std::string> int4_refusal(const Graph& g, const GraphIndex& index, const Node& n) {
  if (n.op_type != "MatMul" && n.op_type != "Gemm")
    return n.op_type + " (only MatMul and Gemm have a 4-bit kernel)";
  if (weight_input(g, index, n) < 0 || index.constant(g, n.inputs[1])->rank() != 2)
    return std::string("its weight is not a constant 2-D float tensor");
  if (n.op_type == "Gemm") {
    if (n.attr_int("transA", 0)) return std::string("Gemm with transA");
    if (n.attr_float("alpha", 1.0f) != 1.0f) return std::string("Gemm with alpha ≠ 1");
    if (n.inputs.size() > 2 && !n.inputs[2].empty() && n.attr_float("beta", 1.0f) != 1.0f)
      return std::string("Gemm with beta ≠ 1");
  }
  return std::nullopt;
}

void insert_matmul_nbits(Model& model, const QuantizeOptions& o, QuantizeReport& rep) {
  if (o.int4_nodes.empty()) return;
  const int64_t block = o.int4_block;
  check(block >= 16 && (block & (block - 1)) == 0, ErrorCode::invalid_argument,
        "quantize: the int4 block size must be a power of two ≥ 16, got " + std::to_string(block));
  Graph& g = model.graph;
  const GraphIndex index(g);
  NameSet names(g);
  std::set<std::string> found, replaced;
  std::vector<Node> nodes;
  for (auto& n : g.nodes) {
    if (!o.int4_nodes.count(n.name)) {
      nodes.push_back(std::move(n));
      continue;
    }
    found.insert(n.name);
    if (auto why = int4_refusal(g, index, n))
      throw Error(ErrorCode::invalid_argument,
                  "quantize: node '" + n.name + "' cannot be int4 weight-only: " + *why);
    const Tensor w = index.constant(g, n.inputs[1])->contiguous();
    const bool trans = n.op_type == "Gemm" && n.attr_int("transB", 0);
    const int64_t k = trans ? w.shape()[1] : w.shape()[0], cols = trans ? w.shape()[0] : w.shape()[1];
    const int64_t k_blocks = (k + block - 1) / block, blob = block / 2, zrow = (k_blocks + 1) / 2;
    Tensor codes(DType::u8, {cols, k_blocks, blob});
    Tensor scales(DType::f32, {cols * k_blocks});
    Tensor zps(DType::u8, {cols * zrow});
    uint8_t* c = codes.data<uint8_t>();
    uint8_t* z = zps.data<uint8_t>();
    const float* wf = w.data<float>();
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * block, k1 = std::min(k, k0 + block);
        const auto at = [&](int64_t p) { return wf[trans ? j * k + p : p * cols + j]; };
        float lo = 0, hi = 0;
        for (int64_t p = k0; p < k1; ++p) {
          lo = std::min(lo, at(p));
          hi = std::max(hi, at(p));
        }
        const float scale = hi > lo ? (hi - lo) / 15.0f : 1.0f;
        const int zp = int(std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f));
        scales.data<float>()[j * k_blocks + kb] = scale;
        z[j * zrow + kb / 2] |= uint8_t(zp << (4 * (kb % 2)));
        for (int64_t p = k0; p < k0 + block; ++p) {  // past K: the zero point (weight 0)
          const int q =
              p < k1 ? int(std::clamp(std::nearbyint(at(p) / scale) + float(zp), 0.0f, 15.0f)) : zp;
          c[(j * k_blocks + kb) * blob + (p - k0) / 2] |= uint8_t(q << (4 * ((p - k0) % 2)));
        }
      }
    const std::string base = n.inputs[1];
    const std::string bn = names.fresh(base + "_int4"), sn = names.fresh(base + "_int4_scale"),
                      zn = names.fresh(base + "_int4_zero_point");
    g.initializers[bn] = codes;
    g.initializers[sn] = scales;
    g.initializers[zn] = zps;
    replaced.insert(base);
    rep.int4_weights++;
    rep.weight_bytes_float += int64_t(w.nbytes());
    rep.weight_bytes_quantized += int64_t(codes.nbytes() + scales.nbytes() + zps.nbytes());
    // The node keeps its name (the layer it is); a Gemm's bias C becomes an Add after it.
    const bool bias = n.op_type == "Gemm" && n.inputs.size() > 2 && !n.inputs[2].empty();
    const std::string out = bias ? names.fresh(n.outputs[0] + "_int4") : n.outputs[0];
    Node nb{n.name, "MatMulNBits", "com.microsoft", {n.inputs[0], bn, sn, zn}, {out}, {}};
    nb.attrs["K"] = int_attr(k);
    nb.attrs["N"] = int_attr(cols);
    nb.attrs["bits"] = int_attr(4);
    nb.attrs["block_size"] = int_attr(block);
    nodes.push_back(std::move(nb));
    if (bias)
      nodes.push_back(
          Node{names.fresh(n.name + "_bias"), "Add", "", {out, n.inputs[2]}, {n.outputs[0]}, {}});
  }
  for (const auto& name : o.int4_nodes)
    check(found.count(name) != 0, ErrorCode::invalid_argument,
          "quantize: no node '" + name + "' to make int4 weight-only");
  g.nodes = std::move(nodes);
  if (!model.opsets.count("com.microsoft")) model.opsets["com.microsoft"] = 1;
  erase_unread_initializers(g, index, replaced);
}

}  // namespace slim::quant::detail
