// fuse_qdq: a QDQ model's DequantizeLinear(x), DequantizeLinear(w) [, DequantizeLinear(bias)]
// -> Conv or MatMul -> QuantizeLinear(y) becomes QLinearConv / QLinearMatMul, the form
// ONNX Runtime's QDQ transformer gives it: the 8-bit source and weights go to an integer
// product and its int32 sums (plus the int32 bias) are requantized to y's scale once,
// instead of dequantizing both sides, multiplying in f32 and quantizing the result.
#include <cmath>

#include "runtime/passes/pass_util.h"

namespace slim {

using namespace passes;

namespace {

bool is_op(const Node* n, const char* op) {
  return n && n->domain.empty() && n->op_type == op;
}

bool is_8bit(const Tensor* t) {
  return t && (t->dtype() == DType::u8 || t->dtype() == DType::i8);
}

// A DequantizeLinear or QuantizeLinear whose scale is one constant f32 and whose zero
// point is one constant 8-bit value: the parameters of an activation.
bool per_tensor(const PassGraph& g, const Node* n) {
  if (!n || n->inputs.size() != 3 || n->attr_int("block_size", 0) != 0) return false;
  const Tensor* s = g.constant(n->inputs[1]);
  const Tensor* z = g.constant(n->inputs[2]);
  return s && s->dtype() == DType::f32 && s->numel() == 1 && is_8bit(z) && z->numel() == 1;
}

// A DequantizeLinear of constant 8-bit weights with one scale and zero point, or one per
// index of `axis` (`channels` of them).
bool weight_dq(const PassGraph& g, const Node* n, int64_t axis, int64_t channels) {
  if (!is_op(n, "DequantizeLinear") || n->inputs.size() != 3 || n->attr_int("block_size", 0) != 0)
    return false;
  const Tensor* w = g.constant(n->inputs[0]);
  const Tensor* s = g.constant(n->inputs[1]);
  const Tensor* z = g.constant(n->inputs[2]);
  if (!is_8bit(w) || !s || s->dtype() != DType::f32 || !z || z->dtype() != w->dtype() ||
      z->numel() != s->numel())
    return false;
  if (s->numel() == 1) return true;
  const int64_t a = n->attr_int("axis", 1);
  return s->rank() == 1 && s->numel() == channels && (a < 0 ? a + w->rank() : a) == axis;
}

// A DequantizeLinear of a constant int32 bias [channels] at scale x_scale * w_scale[c]
// with zero point 0: QLinearConv adds it to the sums as it is.
bool bias_dq(const PassGraph& g, const Node* n, int64_t channels, float x_scale, const Tensor& ws) {
  if (!is_op(n, "DequantizeLinear") || n->inputs.size() < 2) return false;
  const Tensor* b = g.constant(n->inputs[0]);
  const Tensor* s = g.constant(n->inputs[1]);
  const Tensor* z = n->inputs.size() > 2 ? g.constant(n->inputs[2]) : nullptr;
  if (!b || b->dtype() != DType::i32 || b->numel() != channels || !s ||
      s->dtype() != DType::f32 || (s->numel() != 1 && s->numel() != channels))
    return false;
  if (n->inputs.size() > 2 && (!z || z->dtype() != DType::i32)) return false;
  const Tensor sc = s->contiguous(), wc = ws.contiguous();
  for (int64_t c = 0; c < channels; ++c) {
    if (z && z->contiguous().data<int32_t>()[z->numel() == 1 ? 0 : c] != 0) return false;
    const double want = double(x_scale) * wc.data<float>()[wc.numel() == 1 ? 0 : c];
    const double have = sc.data<float>()[sc.numel() == 1 ? 0 : c];
    if (std::fabs(have - want) > 1e-6 * std::fabs(want)) return false;
  }
  return true;
}

}  // namespace

int64_t fuse_qdq(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  std::unordered_map<std::string, Node*> producer;
  for (const auto& n : g.nodes)
    if (n)
      for (const auto& o : n->outputs) producer[o] = n.get();
  auto made_by = [&](const std::string& v) -> Node* {
    auto it = producer.find(v);
    return it == producer.end() ? nullptr : it->second;
  };
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* op = g.nodes[i].get();
    const bool conv = is_op(op, "Conv");
    if (!(conv || is_op(op, "MatMul")) || op->outputs.size() != 1) continue;
    if (op->inputs.size() < 2 || op->inputs.size() > (conv ? 3u : 2u)) continue;
    Node* dx = made_by(op->inputs[0]);
    Node* dw = made_by(op->inputs[1]);
    Node* q = index.sole_reader(op->outputs[0]);
    if (!is_op(dx, "DequantizeLinear") || !per_tensor(g, dx) || !is_op(q, "QuantizeLinear") ||
        !per_tensor(g, q) || !dw)
      continue;
    const Tensor* w = g.constant(dw->inputs[0]);
    if (!w || w->rank() < 2 || (!conv && w->rank() != 2)) continue;
    // Conv weights [M, C/group, k...] scale along M; MatMul's B [K, N] along N.
    const int64_t axis = conv ? 0 : 1, channels = w->shape()[size_t(axis)];
    if (!weight_dq(g, dw, axis, channels)) continue;
    Node* db = conv && op->inputs.size() == 3 ? made_by(op->inputs[2]) : nullptr;
    if (conv && op->inputs.size() == 3 &&
        !bias_dq(g, db, channels, g.constant(dx->inputs[1])->data<float>()[0],
                 *g.constant(dw->inputs[1])))
      continue;
    auto fused = std::make_unique<Node>();
    fused->op_type = conv ? "QLinearConv" : "QLinearMatMul";
    fused->name = op->name;
    fused->attrs = op->attrs;
    fused->inputs = {dx->inputs[0], dx->inputs[1], dx->inputs[2], dw->inputs[0],
                     dw->inputs[1], dw->inputs[2], q->inputs[1],  q->inputs[2]};
    if (db) fused->inputs.push_back(db->inputs[0]);
    fused->outputs = q->outputs;
    // In the QuantizeLinear's place: the inputs are ready there and its readers follow.
    const size_t at = pos.at(q);
    index.remove(op);
    remove_at(g, pos.at(op));
    index.remove(q);
    g.removed.push_back(std::move(g.nodes[at]));
    for (Node* d : {dx, dw, db})
      if (d && index.readers(d->outputs[0]).empty() && !index.pinned(d->outputs[0])) {
        index.remove(d);
        remove_at(g, pos.at(d));
      }
    index.add(fused.get());
    pos[fused.get()] = at;
    g.nodes[at] = std::move(fused);
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
