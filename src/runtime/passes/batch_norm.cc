// fold_batch_norm: in inference, BatchNormalization is a per-channel affine map
// y = s * (x - mean) + beta with s = scale / sqrt(var + eps), so after a Conv or Gemm it
// folds into that node's weights (scaled per output channel) and bias. A Mul by a
// constant that varies only along the channels (PaddleOCR's learnable scales) is the
// same map with beta 0 and folds the same way. After a ConvTranspose, which the fusion
// pass does not cover, a per-channel constant Add (its bias, exported separately) folds
// too: the map with scale 1.
#include <cmath>

#include "runtime/passes/pass_util.h"

namespace slim {

using namespace passes;

namespace {

// Per-channel s and t of y = s * x + t, in double (the ref kernel computes in double).
struct Affine {
  std::vector<double> s, t;
};

std::optional<std::vector<double>> f32_vector(const PassGraph& g, const std::string& name,
                                              int64_t n) {
  const Tensor* t = name.empty() ? nullptr : g.constant(name);
  if (!t || t->dtype() != DType::f32 || t->rank() != 1 || t->numel() != n) return std::nullopt;
  const Tensor c = t->contiguous();
  return std::vector<double>(c.data<float>(), c.data<float>() + n);
}

std::optional<Affine> inference_affine(const PassGraph& g, const Node& bn, int64_t channels) {
  const auto it = g.opsets.find("");
  const int64_t opset = it == g.opsets.end() ? 0 : it->second;
  if (opset < 7) return std::nullopt;  // is_test / consumed_inputs semantics; too old to bother
  if (bn.attr_int("training_mode", 0) != 0 || bn.attr_int("spatial", 1) != 1) return std::nullopt;
  if (bn.inputs.size() != 5) return std::nullopt;
  for (size_t o = 1; o < bn.outputs.size(); ++o)
    if (!bn.outputs[o].empty()) return std::nullopt;
  const auto scale = f32_vector(g, bn.inputs[1], channels);
  const auto beta = f32_vector(g, bn.inputs[2], channels);
  const auto mean = f32_vector(g, bn.inputs[3], channels);
  const auto var = f32_vector(g, bn.inputs[4], channels);
  if (!scale || !beta || !mean || !var) return std::nullopt;
  const double eps = bn.attr_float("epsilon", 1e-5f);
  Affine a;
  for (int64_t c = 0; c < channels; ++c) {
    const double s = (*scale)[size_t(c)] / std::sqrt((*var)[size_t(c)] + eps);
    if (!std::isfinite(s)) return std::nullopt;  // keep whatever the unfolded model does
    a.s.push_back(s);
    a.t.push_back((*beta)[size_t(c)] - s * (*mean)[size_t(c)]);
  }
  return a;
}

// The per-channel map of a Mul's constant operand c: s = c, t = 0, when c broadcasts
// along the channel axis of an output of rank `rank` only (and never widens it).
std::optional<Affine> mul_affine(const Tensor& c, int64_t channels, int64_t rank, int64_t channel_axis) {
  if (c.dtype() != DType::f32 || c.rank() > rank) return std::nullopt;
  for (int k = 0; k < c.rank(); ++k) {
    const int64_t axis = rank - c.rank() + k, d = c.shape()[size_t(k)];
    if (axis == channel_axis ? (d != channels && d != 1) : d != 1) return std::nullopt;
  }
  const Tensor v = c.contiguous();
  Affine a;
  for (int64_t m = 0; m < channels; ++m) {
    a.s.push_back(v.data<float>()[v.numel() == 1 ? 0 : m]);
    a.t.push_back(0.0);
  }
  return a;
}

// What follows the Conv, ConvTranspose or Gemm: a BatchNormalization, or a Mul or Add
// by constant `operand`.
struct Follower {
  const Node& node;
  const Tensor* operand = nullptr;
  bool add = false;
  // The affine map for an output with `channels` along `channel_axis` of `rank` dims.
  std::optional<Affine> affine(const PassGraph& g, int64_t channels, int64_t rank, int64_t channel_axis) const {
    if (!operand) return inference_affine(g, node, channels);
    auto a = mul_affine(*operand, channels, rank, channel_axis);
    if (a && add) {
      a->t = a->s;
      a->s.assign(a->t.size(), 1.0);
    }
    return a;
  }
};

// Conv: W [M, C/g, k...] scaled per output channel m; B' = s * B + t.
bool fold_into_conv(PassGraph& g, Node& conv, const Follower& bn, Node* fused) {
  const Tensor* w = conv.inputs.size() > 1 ? g.constant(conv.inputs[1]) : nullptr;
  if (!w || w->dtype() != DType::f32 || w->rank() < 3) return false;
  const int64_t m = w->shape()[0];
  const std::string b_name = conv.inputs.size() > 2 ? conv.inputs[2] : "";
  std::optional<std::vector<double>> b;
  if (!b_name.empty() && !(b = f32_vector(g, b_name, m))) return false;
  const auto affine = bn.affine(g, m, w->rank(), 1);
  if (!affine) return false;
  const Tensor wc = w->contiguous();
  Tensor w2(DType::f32, w->shape());
  const int64_t per = m ? w->numel() / m : 0;
  for (int64_t o = 0; o < m; ++o)
    for (int64_t k = 0; k < per; ++k)
      w2.data<float>()[o * per + k] =
          float(double(wc.data<float>()[o * per + k]) * affine->s[size_t(o)]);
  Tensor b2(DType::f32, {m});
  for (int64_t o = 0; o < m; ++o)
    b2.data<float>()[o] =
        float(affine->s[size_t(o)] * (b ? (*b)[size_t(o)] : 0.0) + affine->t[size_t(o)]);
  *fused = conv;
  fused->inputs.resize(3);
  fused->inputs[1] = g.add_constant(conv.inputs[1] + "/bn_folded", std::move(w2));
  fused->inputs[2] =
      g.add_constant((b_name.empty() ? conv.name + "/bias" : b_name) + "/bn_folded", std::move(b2));
  return true;
}

// ConvTranspose: W [C, O/g, k...]; output channel o of group q is W[q * C/g + c, o - q * O/g].
bool fold_into_conv_transpose(PassGraph& g, Node& conv, const Follower& bn, Node* fused) {
  const Tensor* w = conv.inputs.size() > 1 ? g.constant(conv.inputs[1]) : nullptr;
  if (!w || w->dtype() != DType::f32 || w->rank() < 3) return false;
  const int64_t group = conv.attr_int("group", 1), c = w->shape()[0], og = w->shape()[1];
  if (group < 1 || c % group != 0) return false;
  const int64_t m = og * group, per = shape_numel(Shape(w->shape().begin() + 2, w->shape().end()));
  const std::string b_name = conv.inputs.size() > 2 ? conv.inputs[2] : "";
  std::optional<std::vector<double>> b;
  if (!b_name.empty() && !(b = f32_vector(g, b_name, m))) return false;
  const auto affine = bn.affine(g, m, w->rank(), 1);
  if (!affine) return false;
  const Tensor wc = w->contiguous();
  Tensor w2(DType::f32, w->shape());
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < og; ++j) {
      const double s = affine->s[size_t(i / (c / group) * og + j)];
      for (int64_t k = 0; k < per; ++k) {
        const int64_t at = (i * og + j) * per + k;
        w2.data<float>()[at] = float(double(wc.data<float>()[at]) * s);
      }
    }
  Tensor b2(DType::f32, {m});
  for (int64_t o = 0; o < m; ++o)
    b2.data<float>()[o] = float(affine->s[size_t(o)] * (b ? (*b)[size_t(o)] : 0.0) + affine->t[size_t(o)]);
  *fused = conv;
  fused->inputs.resize(3);
  fused->inputs[1] = g.add_constant(conv.inputs[1] + "/bn_folded", std::move(w2));
  fused->inputs[2] =
      g.add_constant((b_name.empty() ? conv.name + "/bias" : b_name) + "/bn_folded", std::move(b2));
  return true;
}

// Gemm: Y = alpha * A op(B) + beta * C, BN over Y's columns n.
// Y' = alpha * A (op(B) * s[n]) + (s[n] * beta * C[n] + t[n]), so C' is a vector and beta 1.
bool fold_into_gemm(PassGraph& g, Node& gemm, const Follower& bn, Node* fused) {
  const Tensor* bw = gemm.inputs.size() > 1 ? g.constant(gemm.inputs[1]) : nullptr;
  if (!bw || bw->dtype() != DType::f32 || bw->rank() != 2) return false;
  const bool trans_b = gemm.attr_int("transB", 0) != 0;
  const int64_t n = trans_b ? bw->shape()[0] : bw->shape()[1];
  const int64_t k = trans_b ? bw->shape()[1] : bw->shape()[0];
  const std::string c_name = gemm.inputs.size() > 2 ? gemm.inputs[2] : "";
  std::vector<double> c(size_t(n), 0.0);
  if (!c_name.empty()) {
    const Tensor* ct = g.constant(c_name);
    if (!ct || ct->dtype() != DType::f32) return false;
    const Tensor cc = ct->contiguous();
    // Only C that varies along columns alone can become a per-column vector.
    const bool scalar = ct->numel() == 1;
    const bool row = ct->numel() == n && ct->shape().back() == n;
    if (!scalar && !row) return false;
    for (int64_t j = 0; j < n; ++j) c[size_t(j)] = cc.data<float>()[scalar ? 0 : j];
  }
  const auto affine = bn.affine(g, n, 2, 1);
  if (!affine) return false;
  const double beta = gemm.attr_float("beta", 1.0f);
  const Tensor bc = bw->contiguous();
  Tensor b2(DType::f32, bw->shape());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) {
      const int64_t at = trans_b ? j * k + t : t * n + j;
      b2.data<float>()[at] = float(double(bc.data<float>()[at]) * affine->s[size_t(j)]);
    }
  Tensor c2(DType::f32, {n});
  for (int64_t j = 0; j < n; ++j)
    c2.data<float>()[j] = float(affine->s[size_t(j)] * beta * c[size_t(j)] + affine->t[size_t(j)]);
  *fused = gemm;
  fused->inputs.resize(3);
  fused->inputs[1] = g.add_constant(gemm.inputs[1] + "/bn_folded", std::move(b2));
  fused->inputs[2] =
      g.add_constant((c_name.empty() ? gemm.name + "/bias" : c_name) + "/bn_folded", std::move(c2));
  Attribute one;
  one.kind = Attribute::Kind::f;
  one.f = 1.0f;
  fused->attrs["beta"] = one;
  return true;
}

}  // namespace

int64_t fold_batch_norm(PassGraph& g) {
  UseIndex index(g);
  auto pos = positions(g);
  std::unordered_map<std::string, Node*> producers;
  for (const auto& n : g.nodes)
    for (const auto& o : n->outputs)
      if (!o.empty()) producers[o] = n.get();
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* bn = g.nodes[i].get();
    if (!bn || !bn->domain.empty() || bn->inputs.empty()) continue;
    std::string x = bn->inputs[0];
    const Tensor* operand = nullptr;
    const bool add = bn->op_type == "Add";
    if (bn->op_type == "Mul" || add) {
      const auto it = g.opsets.find("");
      if (it == g.opsets.end() || it->second < 7) continue;  // the legacy broadcast attribute
      if (bn->inputs.size() != 2 || bn->outputs.size() != 1) continue;
      // The constant operand may come first (Paddle writes Mul(scale, x)).
      if ((operand = g.constant(bn->inputs[0]))) x = bn->inputs[1];
      else operand = g.constant(bn->inputs[1]);
      if (!operand) continue;
    } else if (bn->op_type != "BatchNormalization") {
      continue;
    }
    if (g.constants.count(x) || index.sole_reader(x) != bn) continue;
    // The producer of x: the node before the BatchNormalization that outputs it.
    auto prod_it = producers.find(x);
    if (prod_it == producers.end() || !pos.count(prod_it->second)) continue;
    Node* producer = prod_it->second;
    const size_t producer_pos = pos.at(producer);
    if (producer_pos >= i || !producer->domain.empty() || producer->outputs.size() != 1) continue;
    auto fused = std::make_unique<Node>();
    bool ok = false;
    const Follower follower{*bn, operand, add};
    if (producer->op_type == "ConvTranspose") ok = fold_into_conv_transpose(g, *producer, follower, fused.get());
    else if (add) ok = false;  // the fusion pass merges a constant Add into a Conv or Gemm bias
    else if (producer->op_type == "Conv") ok = fold_into_conv(g, *producer, follower, fused.get());
    else if (producer->op_type == "Gemm") ok = fold_into_gemm(g, *producer, follower, fused.get());
    if (!ok) continue;
    fused->outputs = {bn->outputs[0]};
    fused->name = producer->name;
    index.remove(producer);
    index.remove(bn);
    index.add(fused.get());
    // The folded node takes the BatchNormalization's place: its readers come after it.
    remove_at(g, producer_pos);
    pos.erase(producer);
    pos.erase(bn);
    g.removed.push_back(std::move(g.nodes[i]));
    pos[fused.get()] = i;
    producers[fused->outputs[0]] = fused.get();
    g.nodes[i] = std::move(fused);
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
