// fuse_dynamic_quantize_conv: the chain ONNX Runtime's dynamic quantizer writes for every
// Conv, DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(x_scale * w_scale) ->
// Add(bias) -> Relu, becomes one slim:DynamicQuantizeConv (fused_ops.h): a provider then
// quantizes, convolves and dequantizes in one node instead of writing the 8-bit source,
// the int32 sums and three f32 tensors between nodes.
#include "runtime/passes/pass_util.h"
#include "slim/runtime/fused_ops.h"

namespace slim {

using namespace passes;

namespace {

bool is_op(const Node* n, const char* op) {
  return n && n->domain.empty() && n->op_type == op;
}

// The input of a two-input node that is not `x`; "" unless the node reads x exactly once.
std::string other_input(const Node& n, const std::string& x) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == x && n.inputs[1] != x) return n.inputs[1];
  if (n.inputs[1] == x && n.inputs[0] != x) return n.inputs[0];
  return "";
}

// A constant f32 that broadcasts against a rank-`rank` convolution output as one value,
// or as one value per output channel (its dims aligned to the channel axis): returned as
// a vector of 1 or `channels` values.
std::optional<std::vector<float>> channel_values(const PassGraph& g, const std::string& name,
                                                 size_t rank, int64_t channels) {
  const Tensor* t = g.constant(name);
  if (!t || t->dtype() != DType::f32 || t->rank() > int64_t(rank)) return std::nullopt;
  const Tensor c = t->contiguous();
  if (c.numel() == 1) return std::vector<float>{c.data<float>()[0]};
  // Right-aligned against [N, C, spatial...], the channel dim sits rank - 1 dims from the end.
  const Shape& s = c.shape();
  for (size_t i = 0; i < s.size(); ++i) {
    const bool channel_axis = s.size() - i == rank - 1;
    if (s[i] != (channel_axis ? channels : 1)) return std::nullopt;
  }
  return std::vector<float>(c.data<float>(), c.data<float>() + channels);
}

// Extends a slim:DynamicQuantizeConv node over the Add of a per-channel constant (its
// bias) and the Relu that follow it, where it has neither yet. In the first round of
// passes the bias is often not a constant yet (exporters Reshape it at run time), so the
// second round, after constant folding, finishes the chain.
int64_t absorb_bias_and_relu(PassGraph& g, UseIndex& index,
                             std::unordered_map<const Node*, size_t>& pos, Node* fused) {
  const Tensor* w = fused->inputs.size() > 1 ? g.constant(fused->inputs[1]) : nullptr;
  if (!w || fused->outputs.size() != 1 || !fused->attr_string("activation", "").empty()) return 0;
  const size_t rank = size_t(w->rank());
  const int64_t channels = w->shape()[0];
  std::vector<Node*> absorbed;
  std::string y = fused->outputs[0];
  Node* next = index.sole_reader(y);
  std::string bias;
  if (fused->inputs.size() == 4 && is_op(next, "Add")) {
    if (auto b = channel_values(g, other_input(*next, y), rank, channels)) {
      if (b->size() == 1) b->assign(size_t(channels), (*b)[0]);
      bias = g.add_constant(fused->name + "_bias", Tensor::from_vector<float>({channels}, *b));
      absorbed.push_back(next);
      y = next->outputs[0];
      next = index.sole_reader(y);
    }
  }
  const bool relu = is_op(next, "Relu") && next->inputs.size() == 1;
  if (relu) {
    absorbed.push_back(next);
    y = next->outputs[0];
  }
  if (absorbed.empty()) return 0;
  index.remove(fused);
  for (Node* n : absorbed) {
    index.remove(n);
    remove_at(g, pos.at(n));
    pos.erase(n);
  }
  if (!bias.empty()) fused->inputs.push_back(bias);
  if (relu) {
    Attribute a;
    a.kind = Attribute::Kind::s;
    a.s = "Relu";
    fused->attrs["activation"] = a;
  }
  // Readers of y come after the absorbed nodes, which came after the fused node.
  fused->outputs = {y};
  index.add(fused);
  return 1;
}

}  // namespace

int64_t fuse_dynamic_quantize_conv(PassGraph& g) {
  if (g.can_fuse && !g.can_fuse("ConvInteger", "DynamicQuantizeConv")) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* dq = g.nodes[i].get();
    if (dq && dq->domain == kFusedDomain && dq->op_type == "DynamicQuantizeConv") {
      rewrites += absorb_bias_and_relu(g, index, pos, dq);
      continue;
    }
    if (!is_op(dq, "DynamicQuantizeLinear") || dq->inputs.size() != 1 || dq->outputs.size() != 3)
      continue;
    const std::string &q = dq->outputs[0], &x_scale = dq->outputs[1], &x_zp = dq->outputs[2];
    // q and its zero point go to one ConvInteger, the scale to one Mul by w_scale.
    Node* conv = index.sole_reader(q);
    if (!is_op(conv, "ConvInteger") || conv->inputs.size() < 3 || conv->inputs[0] != q ||
        conv->inputs[2] != x_zp || index.sole_reader(x_zp) != conv || conv->outputs.size() != 1)
      continue;
    const Tensor* w = g.constant(conv->inputs[1]);
    const std::string w_zp = conv->inputs.size() > 3 ? conv->inputs[3] : "";
    if (!w || (w->dtype() != DType::u8 && w->dtype() != DType::i8) || w->rank() < 3) continue;
    if (!w_zp.empty() && (!g.constant(w_zp) || g.constant(w_zp)->dtype() != w->dtype())) continue;
    const size_t rank = size_t(w->rank());
    const int64_t channels = w->shape()[0];
    Node* cast = index.sole_reader(conv->outputs[0]);
    if (!is_op(cast, "Cast") || cast->attr_int("to", 0) != 1) continue;
    Node* scale_mul = index.sole_reader(x_scale);
    if (!is_op(scale_mul, "Mul")) continue;
    const auto w_scale = channel_values(g, other_input(*scale_mul, x_scale), rank, channels);
    if (!w_scale) continue;
    Node* mul = index.sole_reader(cast->outputs[0]);
    if (!is_op(mul, "Mul") || other_input(*mul, cast->outputs[0]) != scale_mul->outputs[0] ||
        index.sole_reader(scale_mul->outputs[0]) != mul)
      continue;
    std::vector<Node*> chain = {dq, scale_mul, conv, cast, mul};
    auto fused = std::make_unique<Node>();
    fused->op_type = "DynamicQuantizeConv";
    fused->domain = kFusedDomain;
    fused->name = conv->name;
    fused->attrs = conv->attrs;
    fused->inputs = {
        dq->inputs[0], conv->inputs[1], w_zp,
        g.add_constant(conv->name + "_w_scale",
                       Tensor::from_vector<float>({int64_t(w_scale->size())}, *w_scale))};
    fused->outputs = {mul->outputs[0]};
    // The fused node goes where the chain's last node was: x is ready there, and every
    // reader of y comes later.
    size_t last = 0;
    for (Node* n : chain) last = std::max(last, pos.at(n));
    for (Node* n : chain) {
      index.remove(n);
      const size_t p = pos.at(n);
      pos.erase(n);
      if (p != last) remove_at(g, p);
    }
    g.removed.push_back(std::move(g.nodes[last]));
    index.add(fused.get());
    pos[fused.get()] = last;
    g.nodes[last] = std::move(fused);
    g.opsets[kFusedDomain] = kFusedOpset;
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
