// fuse_qdq: a QDQ model's DequantizeLinear(x), DequantizeLinear(w) [, DequantizeLinear(bias)]
// -> Conv or MatMul -> QuantizeLinear(y) becomes QLinearConv / QLinearMatMul, the form
// ONNX Runtime's QDQ transformer gives it: the 8-bit source and weights go to an integer
// product and its int32 sums (plus the int32 bias) are requantized to y's scale once,
// instead of dequantizing both sides, multiplying in f32 and quantizing the result.
// Then the elementwise ops between them stay on bytes: DequantizeLinear -> op ->
// QuantizeLinear whose dequantized inputs all derive from one 8-bit tensor becomes a
// 256-entry slim:QLookup (HardSwish written out as Add, Clip, Mul, Div collapses into
// one), an Add or Mul of two quantized tensors becomes slim:QLinearAdd/QLinearMul, and a
// GlobalAveragePool slim:QLinearGlobalAveragePool (ONNX Runtime's QDQ transformer's).
// Resize, Concat and MaxPool move bytes (fuse_qdq_movement), and a QLinearConv takes the
// activation table (fuse_qlinear_conv_lookup) and, as slim:QLinearMul does, the residual
// Add (fuse_residual_qlinear_add) after it into its epilogue.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "runtime/passes/pass_util.h"
#include "slim/core/thread_pool.h"
#include "slim/runtime/fused_ops.h"
#include "slim/runtime/kernel.h"

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

// Elementwise ops whose output has the shape of their one non-scalar input: on per-tensor
// quantized bytes each is a function of the byte alone.
bool elementwise_op(const Node* n) {
  static const char* const kOps[] = {"Add",  "Sub",         "Mul",       "Div",     "Max",
                                     "Min",  "Relu",        "Clip",      "LeakyRelu", "HardSigmoid",
                                     "HardSwish", "Sigmoid", "Tanh",     "Neg",     "Abs"};
  if (!n || !n->domain.empty() || n->outputs.size() != 1) return false;
  for (const char* op : kOps)
    if (n->op_type == op) return true;
  return false;
}

// Runs one node on ref's kernel (the oracle every fused kernel equals).
Tensor run_ref(const PassGraph& g, const Node& n, const std::vector<const Tensor*>& ins) {
  const auto opset = g.opsets.find(n.domain);
  const KernelDef* def =
      opset == g.opsets.end() ? nullptr : ref_kernel_registry().find(n.op_type, n.domain, opset->second);
  if (!def) throw Error(ErrorCode::unsupported, n.describe() + ": no ref kernel");
  std::vector<Tensor> outs(n.outputs.size());
  KernelContext ctx(n, ins, &outs, nullptr, &default_thread_pool());
  def->factory(n, opset->second)->compute(ctx);
  return outs[0];
}

// 256 bytes of `t` (u8 or i8): the table index is the byte's bit pattern.
Tensor byte_values(DType t, const uint8_t* bytes) {
  Tensor v(t, {256});
  std::memcpy(v.raw_data(), bytes, 256);
  return v;
}

// The node that makes each value (null for graph inputs and initializers).
struct Producers {
  explicit Producers(const PassGraph& g) {
    for (const auto& n : g.nodes)
      if (n)
        for (const auto& o : n->outputs) of[o] = n.get();
  }
  Node* operator()(const std::string& v) const {
    auto it = of.find(v);
    return it == of.end() ? nullptr : it->second;
  }
  std::unordered_map<std::string, Node*> of;
};

// Whether n is slim's fused op `op` (kFusedDomain).
bool is_fused(const Node* n, const char* op) {
  return n && n->domain == kFusedDomain && n->op_type == op;
}
bool is_lookup(const Node* n) {
  return is_fused(n, "QLookup");
}

// `fused` (a kFusedDomain op) replaces `first` and `last`, the later one, in `last`'s place:
// the inputs are ready there and its readers follow.
void fuse_pair(PassGraph& g, UseIndex& index, std::unordered_map<const Node*, size_t>& pos,
               Producers& made_by, Node* first, Node* last, std::unique_ptr<Node> fused) {
  const size_t at = pos.at(last);
  index.remove(first);
  remove_at(g, pos.at(first));
  index.remove(last);
  g.removed.push_back(std::move(g.nodes[at]));
  index.add(fused.get());
  pos[fused.get()] = at;
  made_by.of[fused->outputs[0]] = fused.get();
  g.nodes[at] = std::move(fused);
  g.opsets[kFusedDomain] = kFusedOpset;
}

}  // namespace

int64_t fuse_qdq_elementwise(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  Producers made_by(g);
  auto drop = [&](Node* n) {
    index.remove(n);
    remove_at(g, pos.at(n));
  };
  // The dtype of each root: its DequantizeLinear's zero point's (the first one reads it).
  std::unordered_map<std::string, DType> byte_type;
  for (const auto& n : g.nodes)
    if (is_op(n.get(), "DequantizeLinear") && per_tensor(g, n.get()))
      byte_type[n->inputs[0]] = g.constant(n->inputs[2])->dtype();
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* q = g.nodes[i].get();
    if (!is_op(q, "QuantizeLinear") || !per_tensor(g, q)) continue;
    Node* op = made_by(q->inputs[0]);
    if (!op || index.sole_reader(op->outputs[0]) != q) continue;
    std::vector<Node*> dqs;
    auto fused = std::make_unique<Node>();
    fused->domain = kFusedDomain;
    fused->name = op->name;
    fused->outputs = q->outputs;
    if (is_op(op, "GlobalAveragePool")) {
      // ONNX Runtime's QLinearGlobalAveragePool: the sums of the bytes requantized once.
      Node* dq = made_by(op->inputs[0]);
      if (!is_op(dq, "DequantizeLinear") || !per_tensor(g, dq)) continue;
      dqs = {dq};
      fused->op_type = "QLinearGlobalAveragePool";
      fused->inputs = {dq->inputs[0], dq->inputs[1], dq->inputs[2], q->inputs[1], q->inputs[2]};
    } else {
      if (!elementwise_op(op)) continue;
      // Each input: a scalar constant, or a per-tensor DequantizeLinear of bytes that are a
      // table of a root tensor (the bytes themselves, or a QLookup's source).
      std::string root;
      bool one_root = true, ok = true, ranked_constant = false;
      for (const auto& in : op->inputs) {
        if (in.empty()) continue;
        if (const Tensor* c = g.constant(in)) {
          ok = ok && c->numel() == 1;
          ranked_constant = ranked_constant || c->rank() > 0;
          continue;
        }
        Node* dq = made_by(in);
        if (!is_op(dq, "DequantizeLinear") || !per_tensor(g, dq)) {
          ok = false;
          break;
        }
        dqs.push_back(dq);
        Node* l = made_by(dq->inputs[0]);
        const std::string& r = is_lookup(l) ? l->inputs[0] : dq->inputs[0];
        one_root = one_root && (root.empty() || r == root);
        root = r;
      }
      if (!ok || dqs.empty()) continue;
      if (one_root) {
        // The table: the ref kernels of DequantizeLinear, op and QuantizeLinear over every
        // byte value of the root, through the tables of QLookups on the way.
        // (A one-element constant of higher rank than the root would broadcast its shape.)
        const auto rs = g.shape_of(root), ys = g.shape_of(q->outputs[0]);
        if (ranked_constant && (!rs || !ys || *rs != *ys)) continue;
        const auto bt = byte_type.find(root);
        const auto rt = bt != byte_type.end() ? std::optional<DType>(bt->second) : g.dtype_of(root);
        if (!rt) continue;
        std::array<uint8_t, 256> all;
        for (int b = 0; b < 256; ++b) all[size_t(b)] = uint8_t(b);
        std::unordered_map<std::string, Tensor> floats;
        try {
          for (Node* dq : dqs) {
            Node* l = made_by(dq->inputs[0]);
            Tensor bytes = byte_values(*rt, all.data());
            if (is_lookup(l)) {
              const Tensor& t = *g.constant(l->inputs[1]);
              std::array<uint8_t, 256> mapped;
              for (int b = 0; b < 256; ++b)
                mapped[size_t(b)] = static_cast<const uint8_t*>(t.raw_data())[b];
              bytes = byte_values(t.dtype(), mapped.data());
            }
            floats[dq->outputs[0]] =
                run_ref(g, *dq, {&bytes, g.constant(dq->inputs[1]), g.constant(dq->inputs[2])});

          }
          std::vector<const Tensor*> ins;
          for (const auto& in : op->inputs)
            ins.push_back(in.empty() ? nullptr : floats.count(in) ? &floats[in] : g.constant(in));
          const Tensor y = run_ref(g, *op, ins);
          if (y.numel() != 256) continue;
          const Tensor t = run_ref(g, *q, {&y, g.constant(q->inputs[1]), g.constant(q->inputs[2])});
          fused->op_type = "QLookup";
          fused->inputs = {root, g.add_constant(q->outputs[0] + "_table", t.clone())};
        } catch (const Error&) {
          continue;  // the node fails at run time too, with its own message
        }
      } else if ((op->op_type == "Add" || op->op_type == "Mul") && dqs.size() == 2 &&
                 op->inputs.size() == 2) {
        fused->op_type = "QLinear" + op->op_type;
        fused->inputs = {dqs[0]->inputs[0], dqs[0]->inputs[1], dqs[0]->inputs[2],
                         dqs[1]->inputs[0], dqs[1]->inputs[1], dqs[1]->inputs[2],
                         q->inputs[1],      q->inputs[2]};
      } else {
        continue;
      }
    }
    const size_t at = pos.at(q);
    drop(op);
    index.remove(q);
    g.removed.push_back(std::move(g.nodes[at]));
    index.add(fused.get());
    pos[fused.get()] = at;
    made_by.of[fused->outputs[0]] = fused.get();
    g.nodes[at] = std::move(fused);
    // The DequantizeLinear nodes, and QLookups that only fed them, when nothing else reads them.
    for (Node* dq : dqs) {
      if (!pos.count(dq) || !g.nodes[pos.at(dq)] || !index.readers(dq->outputs[0]).empty() ||
          index.pinned(dq->outputs[0]))
        continue;
      Node* l = made_by(dq->inputs[0]);
      drop(dq);
      if (is_lookup(l) && g.nodes[pos.at(l)] && index.readers(l->outputs[0]).empty() &&
          !index.pinned(l->outputs[0]))
        drop(l);
    }
    g.opsets[kFusedDomain] = kFusedOpset;
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

namespace {

Attribute ints_attr(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::ints;
  a.ints = std::move(v);
  return a;
}

// DequantizeLinear(x), DequantizeLinear(w) [, DequantizeLinear(int32 bias)] ->
// ConvTranspose -> QuantizeLinear(y) whose kernel equals its stride (no padding, no
// overlap: each input pixel makes its own kh x kw block of output pixels, as the
// upsampling ConvTransposes of PP-OCR's DB head) becomes a 1x1 QLinearConv to
// kh * kw * M channels (weights [C, M, kh, kw] laid out [(a * kw + b) * M + m, C, 1, 1],
// scales, zero points and bias repeated per block offset) and a DCR DepthToSpace of its
// bytes: the same int32 sums and requantization as a QLinearConvTranspose. 1 on success.
int64_t fuse_qdq_conv_transpose(PassGraph& g, Node* op, UseIndex& index,
                                std::unordered_map<const Node*, size_t>& pos,
                                std::unordered_map<std::string, Node*>& made_by) {
  auto producer = [&](const std::string& v) -> Node* {
    auto it = made_by.find(v);
    return it == made_by.end() ? nullptr : it->second;
  };
  if (op->outputs.size() != 1 || op->inputs.size() < 2 || op->inputs.size() > 3) return 0;
  const auto opset = g.opsets.find("");
  if (opset == g.opsets.end() || opset->second < 11) return 0;  // DepthToSpace's DCR mode
  if (op->attr_int("group", 1) != 1 || op->has_attr("output_shape") ||
      op->attr_string("auto_pad", "NOTSET") != "NOTSET")
    return 0;
  for (int64_t v : op->attr_ints("output_padding"))
    if (v != 0) return 0;
  for (int64_t v : op->attr_ints("pads"))
    if (v != 0) return 0;
  for (int64_t v : op->attr_ints("dilations"))
    if (v != 1) return 0;
  Node* dx = producer(op->inputs[0]);
  Node* dw = producer(op->inputs[1]);
  Node* q = index.sole_reader(op->outputs[0]);
  if (!is_op(dx, "DequantizeLinear") || !per_tensor(g, dx) || !is_op(q, "QuantizeLinear") ||
      !per_tensor(g, q) || !dw)
    return 0;
  const Tensor* w = g.constant(dw->inputs[0]);
  if (!w || w->rank() != 4) return 0;
  const int64_t c = w->shape()[0], m = w->shape()[1], kh = w->shape()[2], kw = w->shape()[3];
  const auto strides = op->attr_ints("strides", {1, 1});
  const auto kernel = op->attr_ints("kernel_shape", {kh, kw});
  if (kh != kw || strides.size() != 2 || strides[0] != kh || strides[1] != kw ||
      kernel.size() != 2 || kernel[0] != kh || kernel[1] != kw || kh < 1)
    return 0;
  if (!weight_dq(g, dw, 1, m)) return 0;
  Node* db = op->inputs.size() == 3 ? producer(op->inputs[2]) : nullptr;
  const float x_scale = g.constant(dx->inputs[1])->contiguous().data<float>()[0];
  if (op->inputs.size() == 3 && !bias_dq(g, db, m, x_scale, *g.constant(dw->inputs[1]))) return 0;
  const int64_t area = kh * kw, oc = area * m;
  // Weights [(a * kw + b) * M + m, C, 1, 1] of w[c, m, a, b].
  const Tensor wc = w->contiguous();
  Tensor w2(wc.dtype(), {oc, c, 1, 1});
  const auto* src = static_cast<const uint8_t*>(wc.raw_data());
  auto* dst = static_cast<uint8_t*>(w2.raw_data());
  for (int64_t k = 0; k < c; ++k)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t ab = 0; ab < area; ++ab)
        dst[(ab * m + o) * c + k] = src[(k * m + o) * area + ab];
  // Per-channel parameters (and the bias) once per block offset.
  auto repeat = [&](const Tensor& t, bool always = false) {
    const Tensor tc = t.contiguous();
    if (tc.numel() == 1 && !always) return tc;
    const size_t e = dtype_size(tc.dtype());
    Tensor r(tc.dtype(), {oc});
    for (int64_t ab = 0; ab < area; ++ab)
      std::memcpy(static_cast<uint8_t*>(r.raw_data()) + size_t(ab * m) * e, tc.raw_data(),
                  size_t(m) * e);
    return r;
  };
  const std::string base = op->name.empty() ? op->outputs[0] : op->name;
  auto conv = std::make_unique<Node>();
  conv->op_type = "QLinearConv";
  conv->name = base + "_blocks";
  conv->inputs = {dx->inputs[0],
                  dx->inputs[1],
                  dx->inputs[2],
                  g.add_constant(base + "_w_blocks", w2),
                  g.add_constant(base + "_ws_blocks", repeat(*g.constant(dw->inputs[1]))),
                  g.add_constant(base + "_wz_blocks", repeat(*g.constant(dw->inputs[2]))),
                  q->inputs[1],
                  q->inputs[2]};
  if (db)
    conv->inputs.push_back(
        g.add_constant(base + "_b_blocks", repeat(*g.constant(db->inputs[0]), true)));
  conv->outputs = {g.fresh_name(q->outputs[0] + "_blocks")};
  conv->attrs["kernel_shape"] = ints_attr({1, 1});
  auto d2s = std::make_unique<Node>();
  d2s->op_type = "DepthToSpace";
  d2s->name = op->name;
  d2s->inputs = {conv->outputs[0]};
  d2s->outputs = q->outputs;
  Attribute bs;
  bs.kind = Attribute::Kind::i;
  bs.i = kh;
  d2s->attrs["blocksize"] = bs;
  Attribute mode;
  mode.kind = Attribute::Kind::s;
  mode.s = "DCR";
  d2s->attrs["mode"] = mode;
  const size_t op_at = pos.at(op), q_at = pos.at(q);
  index.remove(op);
  index.remove(q);
  g.removed.push_back(std::move(g.nodes[op_at]));
  g.removed.push_back(std::move(g.nodes[q_at]));
  pos.erase(op);
  pos.erase(q);
  for (Node* d : {dx, dw, db})
    if (d && index.readers(d->outputs[0]).empty() && !index.pinned(d->outputs[0])) {
      index.remove(d);
      remove_at(g, pos.at(d));
    }
  made_by[conv->outputs[0]] = conv.get();
  made_by[d2s->outputs[0]] = d2s.get();
  index.add(conv.get());
  index.add(d2s.get());
  pos[conv.get()] = op_at;
  pos[d2s.get()] = q_at;
  g.nodes[op_at] = std::move(conv);
  g.nodes[q_at] = std::move(d2s);
  return 1;
}

}  // namespace

int64_t fuse_qdq_movement(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  Producers made_by(g);
  // The bytes Q(DQ(v)) for every byte value v: a requantizing table, or null when it is
  // the identity (same type, same values).
  auto requantize = [&](const Node* dq, const Node* q, DType from,
                        bool* identity) -> std::optional<Tensor> {
    std::array<uint8_t, 256> all;
    for (int b = 0; b < 256; ++b) all[size_t(b)] = uint8_t(b);
    try {
      const Tensor bytes = byte_values(from, all.data());
      const Tensor f =
          run_ref(g, *dq, {&bytes, g.constant(dq->inputs[1]), g.constant(dq->inputs[2])});
      Tensor t = run_ref(g, *q, {&f, g.constant(q->inputs[1]), g.constant(q->inputs[2])});
      if (t.numel() != 256) return std::nullopt;
      *identity = t.dtype() == from && std::memcmp(t.raw_data(), all.data(), 256) == 0;
      return t;
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  auto free_slot = [&](Node* n) {
    index.remove(n);
    const size_t at = pos.at(n);
    pos.erase(n);
    g.removed.push_back(std::move(g.nodes[at]));
    return at;
  };
  auto place = [&](std::unique_ptr<Node> n, size_t at) {
    index.add(n.get());
    pos[n.get()] = at;
    for (const auto& o : n->outputs) made_by.of[o] = n.get();
    g.nodes[at] = std::move(n);
  };
  auto lookup_node = [&](const std::string& name, const std::string& x, const std::string& y,
                         Tensor table) {
    auto l = std::make_unique<Node>();
    l->domain = kFusedDomain;
    l->op_type = "QLookup";
    l->name = name;
    l->inputs = {x, g.add_constant(y + "_table", std::move(table))};
    l->outputs = {y};
    return l;
  };
  // A QLookup's table followed by `then` (its output's type may differ: the QLookup's
  // output takes it).
  auto compose_into = [&](Node* l, const Tensor& then) {
    const auto* lb = static_cast<const uint8_t*>(g.constant(l->inputs[1])->raw_data());
    const auto* cb = static_cast<const uint8_t*>(then.raw_data());
    std::array<uint8_t, 256> both;
    for (int b = 0; b < 256; ++b) both[size_t(b)] = cb[lb[b]];
    index.remove(l);
    l->inputs[1] = g.add_constant(l->outputs[0] + "_table", byte_values(then.dtype(), both.data()));
    index.add(l);
  };
  // Whether table t (of bytes of type `from`) never decreases: max commutes with it.
  auto monotonic = [](const Tensor& t, DType from) {
    const auto* v = static_cast<const uint8_t*>(t.raw_data());
    auto value = [](DType d, uint8_t b) { return d == DType::i8 ? int(int8_t(b)) : int(b); };
    int last = -1000;
    for (int k = 0; k < 256; ++k) {
      // The byte values of `from` in increasing order.
      const uint8_t b = from == DType::i8 ? uint8_t(k ^ 0x80) : uint8_t(k);
      const int y = value(t.dtype(), v[b]);
      if (y < last) return false;
      last = y;
    }
    return true;
  };
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* q = g.nodes[i].get();
    if (!is_op(q, "QuantizeLinear") || !per_tensor(g, q)) continue;
    Node* op = made_by(q->inputs[0]);
    if (!op || op->outputs.size() != 1 || index.sole_reader(op->outputs[0]) != q) continue;
    const bool pool = is_op(op, "MaxPool");
    if (is_op(op, "Resize") || pool) {
      // Nearest resizing copies values: Q(Resize(DQ(x))) = Resize(T[x]), T = Q(DQ(v)),
      // the table applied before the resize (on the smaller tensor) or not at all.
      // MaxPool (one output, no Indices) picks values: with T monotonic (DequantizeLinear
      // and QuantizeLinear both are, for positive scales) Q(MaxPool(DQ(x))) =
      // MaxPool(T[x]) = T[MaxPool(x)], the maximum taken over the bytes; the table goes
      // after the pool (fewer bytes), or before it into a QLookup or QLinearConv that only
      // feeds it (folded there, by fuse_qlinear_conv_lookup for the convolution).
      if (!pool &&
          (op->attr_string("mode", "nearest") != "nearest" || op->attr_int("antialias", 0) != 0 ||
           op->attr_string("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"))
        continue;
      // (Pools of 4-D tensors: what the cpu provider's byte MaxPool covers; ref's is slower
      // than the f32 one.)
      const auto xs = g.shape_of(op->inputs[0]);
      if (pool && (!xs || xs->size() != 4 || op->attr_int("storage_order", 0) != 0)) continue;
      bool constant_rest = true;
      for (size_t k = 1; k < op->inputs.size(); ++k)
        constant_rest = constant_rest && (op->inputs[k].empty() || g.constant(op->inputs[k]));
      Node* dq = made_by(op->inputs[0]);
      if (!constant_rest || !is_op(dq, "DequantizeLinear") || !per_tensor(g, dq)) continue;
      const DType from = g.constant(dq->inputs[2])->dtype();
      bool identity = false;
      auto t = requantize(dq, q, from, &identity);
      if (!t || (pool && !monotonic(*t, from))) continue;
      const std::string x = dq->inputs[0];
      Node* before = made_by(x);
      const bool only_feeds = index.readers(x).size() == 1 && !index.pinned(x) &&
                              index.readers(dq->outputs[0]).size() == 1;
      auto r = std::make_unique<Node>(*op);
      r->inputs[0] = x;
      r->outputs = q->outputs;
      const size_t op_at = free_slot(op), q_at = free_slot(q);
      size_t r_at = q_at;
      if (!identity && pool && only_feeds && is_lookup(before)) {
        compose_into(before, *t);
      } else if (!identity && pool && !(only_feeds && is_op(before, "QLinearConv"))) {
        r->outputs = {g.fresh_name(q->outputs[0] + "_max")};
        place(lookup_node(r->name + "_requantize", r->outputs[0], q->outputs[0], std::move(*t)),
              q_at);
        r_at = op_at;
      } else if (!identity) {
        r->inputs[0] = g.fresh_name(q->outputs[0] + "_requantized");
        place(lookup_node(r->name + "_requantize", x, r->inputs[0], std::move(*t)), op_at);
      }
      place(std::move(r), r_at);
      if (index.readers(dq->outputs[0]).empty() && !index.pinned(dq->outputs[0])) {
        index.remove(dq);
        remove_at(g, pos.at(dq));
      }
    } else if (is_op(op, "Concat")) {
      // Q(Concat(DQ_i(x_i))) = Concat(T_i[x_i]): each input requantized by its table (folded
      // into the table of a QLookup -> Resize that only feeds it), or as it is.
      std::vector<Node*> dqs;
      bool ok = !op->inputs.empty();
      for (const auto& in : op->inputs) {
        Node* dq = in.empty() ? nullptr : made_by(in);
        ok = ok && is_op(dq, "DequantizeLinear") && per_tensor(g, dq) &&
             index.readers(dq->outputs[0]).size() == 1 && !index.pinned(dq->outputs[0]) &&
             std::find(dqs.begin(), dqs.end(), dq) == dqs.end();
        if (!ok) break;
        dqs.push_back(dq);
      }
      if (!ok) continue;
      std::vector<std::optional<Tensor>> tables;
      std::vector<char> same;
      for (Node* dq : dqs) {
        bool identity = false;
        tables.push_back(requantize(dq, q, g.constant(dq->inputs[2])->dtype(), &identity));
        same.push_back(identity);
        ok = ok && tables.back().has_value();
      }
      if (!ok) continue;
      auto c = std::make_unique<Node>(*op);
      c->outputs = q->outputs;
      free_slot(op);
      const size_t q_at = free_slot(q);
      for (size_t k = 0; k < dqs.size(); ++k) {
        Node* dq = dqs[k];
        const std::string x = dq->inputs[0];
        const size_t dq_at = free_slot(dq);
        c->inputs[k] = x;
        if (same[k]) continue;
        // A Resize of a QLookup, each the other's only reader: the table goes into that one.
        Node* r = made_by(x);
        Node* l = is_op(r, "Resize") ? made_by(r->inputs[0]) : nullptr;
        if (is_lookup(l) && index.readers(x).size() == 0 && !index.pinned(x) &&
            index.readers(l->outputs[0]).size() == 1 && !index.pinned(l->outputs[0])) {
          compose_into(l, *tables[k]);
          continue;
        }
        c->inputs[k] = g.fresh_name(x + "_requantized");
        place(lookup_node(dq->name + "_requantize", x, c->inputs[k], std::move(*tables[k])), dq_at);
      }
      place(std::move(c), q_at);
    } else {
      continue;
    }
    g.opsets[kFusedDomain] = kFusedOpset;
    ++rewrites;
  }
  // A slim:QLookup read only by another (an activation, then PP-LCNetV3's learnable
  // x * a + b, each quantized): one table, the first's followed by the second's.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* second = g.nodes[i].get();
    if (!is_lookup(second) || second->inputs.size() != 2 || !g.constant(second->inputs[1]))
      continue;
    Node* first = made_by(second->inputs[0]);
    if (!is_lookup(first) || first->inputs.size() != 2 || !g.constant(first->inputs[1]) ||
        index.sole_reader(first->outputs[0]) != second || index.pinned(first->outputs[0]))
      continue;
    compose_into(first, *g.constant(second->inputs[1]));
    index.remove(first);
    first->outputs = second->outputs;
    index.add(first);
    made_by.of[first->outputs[0]] = first;
    free_slot(second);
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

int64_t fuse_qlinear_conv_lookup(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  Producers made_by(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* l = g.nodes[i].get();
    if (!is_lookup(l) || l->inputs.size() != 2) continue;
    Node* c = made_by(l->inputs[0]);
    if (!is_op(c, "QLinearConv") || c->outputs.size() != 1 || c->inputs.size() < 8 ||
        index.sole_reader(c->outputs[0]) != l || index.pinned(c->outputs[0]) ||
        !g.constant(l->inputs[1]))
      continue;
    auto fused = std::make_unique<Node>(*c);
    fused->domain = kFusedDomain;
    fused->op_type = "QLinearConvLookup";
    fused->inputs.resize(9);
    fused->inputs.push_back(l->inputs[1]);
    fused->outputs = l->outputs;
    fuse_pair(g, index, pos, made_by, c, l, std::move(fused));
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

int64_t fuse_residual_qlinear_add(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  Producers made_by(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* a = g.nodes[i].get();
    if (!is_fused(a, "QLinearAdd") || a->inputs.size() != 8 || a->outputs.size() != 1 ||
        a->inputs[0] == a->inputs[3])
      continue;
    // A residual of the output's shape (no broadcast).
    const auto sa = g.shape_of(a->inputs[0]), sb = g.shape_of(a->inputs[3]);
    if (!sa || !sb || *sa != *sb) continue;
    // The convolution or product: an input's producer that only feeds the Add (the later
    // one of two).
    Node* c = nullptr;
    int side = 0;
    for (int k : {0, 1}) {
      Node* p = made_by(a->inputs[size_t(3 * k)]);
      const bool mul = is_fused(p, "QLinearMul") && p->inputs.size() == 8;
      if ((is_op(p, "QLinearConv") || is_fused(p, "QLinearConvLookup") || mul) &&
          p->outputs.size() == 1 && index.sole_reader(p->outputs[0]) == a &&
          !index.pinned(p->outputs[0]) && (!c || pos.at(p) > pos.at(c))) {
        c = p;
        side = k;
      }
    }
    if (!c) continue;
    const size_t ai = size_t(3 * side), bi = size_t(3 * (1 - side));
    auto fused = std::make_unique<Node>(*c);
    fused->domain = kFusedDomain;
    const bool mul = c->op_type == "QLinearMul";
    fused->op_type = mul ? "QLinearMulAdd" : "QLinearConvAdd";
    if (!mul) fused->inputs.resize(10);  // the bias and the table may be ""
    for (size_t k : {ai + 1, ai + 2, bi, bi + 1, bi + 2, size_t(6), size_t(7)})
      fused->inputs.push_back(a->inputs[k]);
    fused->outputs = a->outputs;
    fuse_pair(g, index, pos, made_by, c, a, std::move(fused));  // where the residual is ready
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

int64_t fuse_qdq(PassGraph& g) {
  if (!g.int8_kernels) return 0;
  UseIndex index(g);
  auto pos = positions(g);
  Producers made_by(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* op = g.nodes[i].get();
    if (is_op(op, "ConvTranspose")) {
      rewrites += fuse_qdq_conv_transpose(g, op, index, pos, made_by.of);
      continue;
    }
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
