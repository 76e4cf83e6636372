// fuse_bias_activation: Conv / Gemm / MatMul followed by a constant bias Add, a residual
// Add, an activation and a scalar Mul, Add, Max and Min become one slim:Fused* node
// (include/slim/runtime/fused_ops.h),
// so a provider computes the epilogue while the output tile is still in cache instead of
// reading and writing the whole tensor once per elementwise node.
#include <cfloat>
#include <cmath>

#include "runtime/passes/pass_util.h"
#include "slim/runtime/fused_ops.h"

namespace slim {

using namespace passes;

namespace {

int64_t default_opset(const PassGraph& g) {
  auto it = g.opsets.find("");
  return it == g.opsets.end() ? 0 : it->second;
}

bool is_op(const Node* n, const char* op) {
  return n && n->domain.empty() && n->op_type == op;
}

// The input of a two-input node that is not `x`; "" when the node does not read x exactly once.
std::string other_input(const Node& n, const std::string& x) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == x && n.inputs[1] != x) return n.inputs[1];
  if (n.inputs[1] == x && n.inputs[0] != x) return n.inputs[0];
  return "";
}

bool near(std::optional<double> v, double want) {
  return v && std::fabs(*v - want) <= 1e-5 * std::fabs(want);
}

// An activation that reads `y` and what it covers: the nodes it replaces (in graph order)
// and the value it produces.
struct ActivationMatch {
  std::string name;
  std::vector<float> params;
  std::vector<Node*> nodes;
  std::string output;
};

// Single-node activations reading y as their only data input.
std::optional<ActivationMatch> single_node_activation(const PassGraph& g, Node* c,
                                                      const std::string& y) {
  if (!c->domain.empty() || c->outputs.size() != 1 || c->inputs.empty() || c->inputs[0] != y)
    return std::nullopt;
  ActivationMatch m;
  m.nodes = {c};
  m.output = c->outputs[0];
  const std::string& op = c->op_type;
  if (c->inputs.size() == 1 && (op == "Relu" || op == "Sigmoid" || op == "Tanh")) {
    m.name = op;
    return m;
  }
  if (c->inputs.size() == 1 && op == "HardSwish") {
    m.name = "HardSwish";
    return m;
  }
  if (c->inputs.size() == 1 && op == "LeakyRelu") {
    m.name = "LeakyRelu";
    m.params = {c->attr_float("alpha", 0.01f)};
    return m;
  }
  if (c->inputs.size() == 1 && op == "Gelu") {
    const std::string approx = c->attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") return std::nullopt;
    m.name = approx == "tanh" ? "GeluTanh" : "Gelu";
    return m;
  }
  if (op == "Clip") {
    float lo = -INFINITY, hi = INFINITY;
    if (default_opset(g) < 11) {
      if (default_opset(g) >= 6) lo = -FLT_MAX, hi = FLT_MAX;
      if (c->has_attr("min")) lo = c->attr_float("min", 0);
      if (c->has_attr("max")) hi = c->attr_float("max", 0);
      if (c->inputs.size() != 1) return std::nullopt;
    } else {
      if (c->inputs.size() > 3) return std::nullopt;
      for (size_t k = 1; k < c->inputs.size(); ++k) {
        if (c->inputs[k].empty()) continue;
        const Tensor* b = g.constant(c->inputs[k]);
        if (!b || b->dtype() != DType::f32 || b->numel() != 1) return std::nullopt;
        (k == 1 ? lo : hi) = b->contiguous().data<float>()[0];
      }
    }
    m.name = "Clip";
    m.params = {lo, hi};
    return m;
  }
  return std::nullopt;
}

// SiLU: Mul(y, Sigmoid(y)); y has exactly these two readers.
std::optional<ActivationMatch> silu(const UseIndex& index, const std::string& y) {
  const auto& r = index.readers(y);
  if (index.pinned(y) || r.size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    Node* s = r[size_t(k)];
    Node* mul = r[size_t(1 - k)];
    if (!is_op(s, "Sigmoid") || !is_op(mul, "Mul") || s->outputs.size() != 1) continue;
    if (index.sole_reader(s->outputs[0]) != mul || other_input(*mul, y) != s->outputs[0]) continue;
    return ActivationMatch{"SiLU", {}, {s, mul}, mul->outputs[0]};
  }
  return std::nullopt;
}

// torch's GELU export: d = y / sqrt2 (or y * 1/sqrt2), e = Erf(d), a = e + 1, then
// (y * a) * 0.5, (y * 0.5) * a or y * (a * 0.5).
std::optional<ActivationMatch> erf_gelu(const PassGraph& g, const UseIndex& index,
                                        const std::string& y) {
  const auto& r = index.readers(y);
  if (index.pinned(y) || r.size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    Node* d = r[size_t(k)];
    Node* other = r[size_t(1 - k)];
    if (!d->domain.empty() || d->outputs.size() != 1) continue;
    if (d->op_type == "Div") {
      if (d->inputs.size() != 2 || d->inputs[0] != y ||
          !near(scalar_constant(g, d->inputs[1]), std::sqrt(2.0)))
        continue;
    } else if (d->op_type == "Mul") {
      if (!near(scalar_constant(g, other_input(*d, y)), std::sqrt(0.5))) continue;
    } else {
      continue;
    }
    Node* e = index.sole_reader(d->outputs[0]);
    if (!is_op(e, "Erf") || e->outputs.size() != 1) continue;
    Node* a = index.sole_reader(e->outputs[0]);
    if (!is_op(a, "Add") || a->outputs.size() != 1 ||
        !near(scalar_constant(g, other_input(*a, e->outputs[0])), 1.0))
      continue;
    const std::string& av = a->outputs[0];
    if (!is_op(other, "Mul") || other->outputs.size() != 1) continue;
    const std::string ov = other_input(*other, y);
    if (ov == av) {
      // (y * a) * 0.5
      Node* half = index.sole_reader(other->outputs[0]);
      if (!is_op(half, "Mul") || half->outputs.size() != 1 ||
          !near(scalar_constant(g, other_input(*half, other->outputs[0])), 0.5))
        continue;
      if (index.sole_reader(av) != other) continue;
      return ActivationMatch{"Gelu", {}, {d, e, a, other, half}, half->outputs[0]};
    }
    if (near(scalar_constant(g, ov), 0.5)) {
      // (y * 0.5) * a
      Node* last = index.sole_reader(other->outputs[0]);
      if (!is_op(last, "Mul") || last->outputs.size() != 1 || index.sole_reader(av) != last ||
          other_input(*last, other->outputs[0]) != av)
        continue;
      return ActivationMatch{"Gelu", {}, {d, e, a, other, last}, last->outputs[0]};
    }
    // y * (a * 0.5)
    Node* half = index.sole_reader(av);
    if (!is_op(half, "Mul") || half->outputs.size() != 1 ||
        !near(scalar_constant(g, other_input(*half, av)), 0.5) || ov != half->outputs[0] ||
        index.sole_reader(half->outputs[0]) != other)
      continue;
    return ActivationMatch{"Gelu", {}, {d, e, a, half, other}, other->outputs[0]};
  }
  return std::nullopt;
}

// The value of a one-element f32 constant that does not widen an output of rank `rank`.
std::optional<float> f32_scalar(const PassGraph& g, const std::string& value, int64_t rank) {
  const Tensor* t = g.constant(value);
  if (!t || t->dtype() != DType::f32 || t->numel() != 1 || rank < 0 || t->rank() > rank) return std::nullopt;
  return t->contiguous().data<float>()[0];
}

// HardSwish written out, as exporters do before opset 14 (PyTorch, Paddle):
// x * Clip(x + 3, 0, 6) / 6 (or * 1/6); y has exactly the Add and the Mul as readers.
std::optional<ActivationMatch> hard_swish(const PassGraph& g, const UseIndex& index, const std::string& y,
                                          int64_t rank) {
  const auto& r = index.readers(y);
  if (index.pinned(y) || r.size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    Node* add = r[size_t(k)];
    Node* mul = r[size_t(1 - k)];
    if (!is_op(add, "Add") || add->outputs.size() != 1 || f32_scalar(g, other_input(*add, y), rank) != 3.f) continue;
    Node* clip = index.sole_reader(add->outputs[0]);
    if (!is_op(clip, "Clip")) continue;
    const auto bounds = single_node_activation(g, clip, add->outputs[0]);
    if (!bounds || bounds->params != std::vector<float>{0.f, 6.f}) continue;
    if (!is_op(mul, "Mul") || mul->outputs.size() != 1 || index.sole_reader(clip->outputs[0]) != mul ||
        other_input(*mul, y) != clip->outputs[0])
      continue;
    Node* div = index.sole_reader(mul->outputs[0]);
    if (!div || div->outputs.size() != 1) continue;
    const bool by_six = is_op(div, "Div") && div->inputs.size() == 2 && div->inputs[0] == mul->outputs[0] &&
                        f32_scalar(g, div->inputs[1], rank) == 6.f;
    const bool by_sixth = is_op(div, "Mul") && near(f32_scalar(g, other_input(*div, mul->outputs[0]), rank), 1.0 / 6);
    if (!by_six && !by_sixth) continue;
    return ActivationMatch{"HardSwish", {}, {add, clip, mul, div}, div->outputs[0]};
  }
  return std::nullopt;
}

// A node being grown into a fused one.
struct Chain {
  enum class Base { conv, gemm, matmul } base;
  Node fused;
  std::string output;  // value the chain produces so far
  bool has_bias = false, has_residual = false, has_activation = false;
  int epilogue = 0;  // the last epilogue step absorbed: 1 scale, 2 shift, 3 min (Max), 4 max (Min)
  int64_t channels = -1;        // Conv: M; Gemm/MatMul: N (bias length); -1 unknown
  int64_t out_rank = -1;        // -1 unknown
  std::vector<Node*> absorbed;  // nodes after the base that the fused node replaces
};

const char* fused_name(Chain::Base b) {
  switch (b) {
    case Chain::Base::conv:
      return "FusedConv";
    case Chain::Base::gemm:
      return "FusedGemm";
    case Chain::Base::matmul:
      return "FusedMatMul";
  }
  return "";
}
const char* base_name(Chain::Base b) {
  switch (b) {
    case Chain::Base::conv:
      return "Conv";
    case Chain::Base::gemm:
      return "Gemm";
    case Chain::Base::matmul:
      return "MatMul";
  }
  return "";
}

bool is_f32(const PassGraph& g, const std::string& v) {
  auto d = g.dtype_of(v);
  return d && *d == DType::f32;
}

// Starts a chain at a Conv, Gemm or MatMul (or a fused node that can still grow).
std::optional<Chain> start_chain(const PassGraph& g, const Node& n) {
  Chain c;
  if (n.outputs.size() != 1 || n.outputs[0].empty()) return std::nullopt;
  c.output = n.outputs[0];
  if (n.domain == kFusedDomain) {
    if (n.op_type == "FusedConv")
      c.base = Chain::Base::conv;
    else if (n.op_type == "FusedGemm")
      c.base = Chain::Base::gemm;
    else if (n.op_type == "FusedMatMul")
      c.base = Chain::Base::matmul;
    else
      return std::nullopt;
    c.fused = n;
    c.has_bias = n.inputs.size() > 2 && !n.inputs[2].empty();
    c.has_residual = n.inputs.size() > 3 && !n.inputs[3].empty();
    c.has_activation = !n.attr_string("activation", "").empty();
    const char* steps[] = {"output_scale", "output_shift", "output_min", "output_max"};
    for (int k = 0; k < 4; ++k)
      if (n.has_attr(steps[k])) c.epilogue = k + 1;
  } else if (n.domain.empty() &&
             (n.op_type == "Conv" || n.op_type == "Gemm" || n.op_type == "MatMul")) {
    c.base = n.op_type == "Conv" ? Chain::Base::conv
                                 : (n.op_type == "Gemm" ? Chain::Base::gemm : Chain::Base::matmul);
    if (n.op_type == "Gemm" && default_opset(g) < 7) return std::nullopt;  // legacy broadcast attr
    c.fused = n;
    c.fused.domain = kFusedDomain;
    c.fused.op_type = fused_name(c.base);
    c.has_bias = n.inputs.size() > 2 && !n.inputs[2].empty();
  } else {
    return std::nullopt;
  }
  if (n.inputs.size() < 2) return std::nullopt;
  // Fused ops are f32 only; the weights' dtype tells before shapes are inferred.
  if (!is_f32(g, n.inputs[0]) && !is_f32(g, n.inputs[1])) return std::nullopt;
  const auto w = g.shape_of(n.inputs[1]);
  const auto y = g.shape_of(c.output);
  if (c.base == Chain::Base::conv && w && w->size() >= 3) {
    c.channels = (*w)[0];
    c.out_rank = int64_t(w->size());
  }
  if (c.base == Chain::Base::gemm && w && w->size() == 2) {
    c.channels = n.attr_int("transB", 0) ? (*w)[0] : (*w)[1];
    c.out_rank = 2;
  }
  if (c.base == Chain::Base::matmul && w && w->size() >= 2) {
    c.channels = w->back();
    c.out_rank = int64_t(w->size());  // at least; more when A has more batch dims
  }
  if (y) c.out_rank = int64_t(y->size());
  return c;
}

// The per-channel bias vector a constant Add operand amounts to, when it broadcasts
// along the channel axis only (and never widens the output).
std::optional<std::vector<float>> as_bias(const Chain& c, const Tensor& t) {
  if (t.dtype() != DType::f32 || c.channels < 0 || c.out_rank < 0 || t.rank() > c.out_rank)
    return std::nullopt;
  // Axis of the channel in the output: 1 for Conv and Gemm, the last for MatMul.
  const int64_t channel_axis = c.base == Chain::Base::matmul ? c.out_rank - 1 : 1;
  for (int k = 0; k < t.rank(); ++k) {
    const int64_t axis = c.out_rank - t.rank() + k;
    const int64_t d = t.shape()[size_t(k)];
    if (axis == channel_axis ? (d != c.channels && d != 1) : d != 1) return std::nullopt;
  }
  const Tensor v = t.contiguous();
  std::vector<float> b(size_t(c.channels));
  for (int64_t m = 0; m < c.channels; ++m) b[size_t(m)] = v.data<float>()[v.numel() == 1 ? 0 : m];
  return b;
}

Attribute string_attr(const std::string& s) {
  Attribute a;
  a.kind = Attribute::Kind::s;
  a.s = s;
  return a;
}

Attribute float_attr(float f) {
  Attribute a;
  a.kind = Attribute::Kind::f;
  a.f = f;
  return a;
}

// After the activation, in this order: a Mul by a scalar, an Add of one, a Max and a Min
// with one (output_scale, output_shift, output_min, output_max).
bool absorb_epilogue(const PassGraph& g, const UseIndex& index, Chain& c) {
  if (!c.has_activation || index.pinned(c.output)) return false;
  Node* n = index.sole_reader(c.output);
  static const char* const kOps[] = {"Mul", "Add", "Max", "Min"};
  static const char* const kAttrs[] = {"output_scale", "output_shift", "output_min", "output_max"};
  int step = 0;
  while (step < 4 && !is_op(n, kOps[step])) ++step;
  if (step == 4 || step < c.epilogue || n->outputs.size() != 1) return false;
  const auto v = f32_scalar(g, other_input(*n, c.output), c.out_rank);
  if (!v) return false;
  c.fused.attrs[kAttrs[step]] = float_attr(*v);
  c.epilogue = step + 1;
  c.output = n->outputs[0];
  c.absorbed.push_back(n);
  return true;
}

// Tries to absorb the Add `add` (reading c.output) as bias or residual.
bool absorb_add(PassGraph& g, Chain& c, Node* add) {
  if (default_opset(g) < 7 || add->outputs.size() != 1) return false;
  const std::string other = other_input(*add, c.output);
  if (other.empty() || c.has_activation) return false;
  const Tensor* k = g.constant(other);
  if (k && !c.has_residual) {
    if (auto bias = as_bias(c, *k)) {
      const int bias_slot = 2;
      std::vector<float> merged = *bias;
      if (c.has_bias) {
        // The base's own bias (Conv B, Gemm C, an earlier FusedMatMul bias) must be a
        // constant vector of the same length to merge into.
        const Tensor* old = g.constant(c.fused.inputs[size_t(bias_slot)]);
        if (!old || old->dtype() != DType::f32 || old->numel() != c.channels || old->rank() != 1)
          return false;
        if (c.base == Chain::Base::gemm && c.fused.attr_float("beta", 1.0f) != 1.0f) return false;
        const Tensor oc = old->contiguous();
        for (int64_t m = 0; m < c.channels; ++m) merged[size_t(m)] += oc.data<float>()[m];
      }
      if (c.fused.inputs.size() < 3) c.fused.inputs.resize(3);
      c.fused.inputs[size_t(bias_slot)] = g.add_constant(
          c.fused.name + "/fused_bias", Tensor::from_vector<float>({c.channels}, merged));
      if (c.base == Chain::Base::gemm) {
        Attribute one;
        one.kind = Attribute::Kind::f;
        one.f = 1.0f;
        c.fused.attrs["beta"] = one;
      }
      c.has_bias = true;
      c.output = add->outputs[0];
      c.absorbed.push_back(add);
      return true;
    }
  }
  if (c.has_residual || !is_f32(g, other)) return false;
  const auto ys = g.shape_of(c.output), zs = g.shape_of(other), out = g.shape_of(add->outputs[0]);
  if (!ys || !zs || *ys != *zs || (out && *out != *ys)) return false;
  c.fused.inputs.resize(4);
  c.fused.inputs[3] = other;
  c.has_residual = true;
  c.output = add->outputs[0];
  c.absorbed.push_back(add);
  return true;
}

}  // namespace

int64_t fuse_bias_activation(PassGraph& g) {
  UseIndex index(g);
  auto pos = positions(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* n = g.nodes[i].get();
    if (!n) continue;
    auto chain = start_chain(g, *n);
    if (!chain || chain->epilogue == 4) continue;
    Chain& c = *chain;
    if (g.can_fuse && !g.can_fuse(base_name(c.base), fused_name(c.base))) continue;
    while (!c.has_activation) {
      const std::string y = c.output;
      if (index.pinned(y)) break;
      Node* reader = index.sole_reader(y);
      if (is_op(reader, "Add")) {
        if (absorb_add(g, c, reader)) continue;
        break;
      }
      std::optional<ActivationMatch> act;
      if (reader) act = single_node_activation(g, reader, y);
      if (!act) act = silu(index, y);
      if (!act) act = erf_gelu(g, index, y);
      if (!act) act = hard_swish(g, index, y, c.out_rank);
      if (!act) break;
      // Every intermediate of a multi-node pattern must be private to it.
      bool private_values = true;
      for (Node* p : act->nodes)
        if (p->outputs[0] != act->output && index.pinned(p->outputs[0])) private_values = false;
      if (!private_values) break;
      c.fused.attrs["activation"] = string_attr(act->name);
      if (!act->params.empty()) {
        Attribute a;
        a.kind = Attribute::Kind::floats;
        a.floats = act->params;
        c.fused.attrs["activation_params"] = a;
      }
      c.has_activation = true;
      c.output = act->output;
      c.absorbed.insert(c.absorbed.end(), act->nodes.begin(), act->nodes.end());
    }
    while (absorb_epilogue(g, index, c)) {
    }
    if (c.absorbed.empty()) continue;
    // The fused node goes where the last absorbed node was: every input (a residual may be
    // computed after the base) is ready there, and every reader of the output comes later.
    size_t last = i;
    for (Node* a : c.absorbed) last = std::max(last, pos.at(a));
    auto fused = std::make_unique<Node>(c.fused);
    fused->outputs = {c.output};
    index.remove(n);
    for (Node* a : c.absorbed) index.remove(a);
    index.add(fused.get());
    for (Node* a : c.absorbed) {
      const size_t p = pos.at(a);
      pos.erase(a);
      if (p != last) remove_at(g, p);
    }
    pos.erase(n);
    remove_at(g, i);
    if (g.nodes[last]) g.removed.push_back(std::move(g.nodes[last]));
    pos[fused.get()] = last;
    g.nodes[last] = std::move(fused);
    g.opsets[kFusedDomain] = kFusedOpset;
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
