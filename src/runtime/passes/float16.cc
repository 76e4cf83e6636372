// run_float16_in_float32: float16 models on a provider that computes in float32 only (the
// cpu provider), with ONNX Runtime's numerics. ORT's CPU provider has no float16 kernels
// for ops that compute (on x86), so its InsertCastTransformer runs each such node through
// its float32 kernel with Casts around it, runs a data-movement node that sits between
// such nodes in float32 too (its "isolated" nodes), then RemoveDuplicateCastTransformer
// drops the Cast pairs that now meet (float32 -> float16 -> float32), so values stay
// float32, unrounded, from one converted node to the next. They are rounded to float16
// only where a node that stays float16 (a Concat fed by a model's own Cast, say) reads
// them. This pass makes the same decisions, so slim rounds where ORT rounds.
#include "runtime/passes/pass_util.h"
#include "runtime/ref/math_common.h"
#include "slim/core/convert.h"

namespace slim {

using namespace passes;

namespace {

// Ops that ORT's CPU provider runs on float16 as they are: casts, shape queries and data
// movement (no arithmetic). Every other op with a float16 input is computed in float32.
bool runs_float16(const Node& n) {
  static const std::set<std::string> kOps = {
      "Cast",    "Concat", "Expand",    "Flatten", "Gather", "GatherElements", "GatherND", "Identity",
      "Reshape", "Shape",  "Size",      "Slice",   "Split",  "Squeeze",        "Tile",     "Transpose",
      "Unsqueeze"};
  return !n.domain.empty() || kOps.count(n.op_type) != 0;
}

// Ops whose outputs have their first input's element type: enough to follow float16 values
// through the graphs exporters write before any kernel has run.
bool keeps_input_dtype(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Abs", "Acos", "Acosh", "Add", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization",
      "Ceil", "Celu", "Clip", "Concat", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "Div",
      "Dropout", "Einsum", "Elu", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements",
      "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "GroupNormalization", "HardSigmoid",
      "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax",
      "LpNormalization", "LpPool", "LRN", "MatMul", "Max", "MaxPool", "Mean", "Min", "Mish", "Mod", "Mul", "Neg",
      "Pad", "Pow", "PRelu", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
      "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round",
      "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Slice", "Softmax", "Softplus", "Softsign",
      "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile",
      "Transpose", "Trilu", "Unsqueeze", "Upsample"};
  return kOps.count(op) != 0;
}

std::optional<DType> cast_target(const Node& n) {
  const Attribute* to = n.attr("to");
  DType t;
  if (!to || to->kind != Attribute::Kind::i || !ref::onnx_dtype_to_slim(to->i, &t)) return std::nullopt;
  return t;
}

bool is_cast(const Node* n) { return n && n->domain.empty() && n->op_type == "Cast" && n->outputs.size() == 1; }

// Fills in the element types of node outputs that follow from their inputs' (the session
// knows them only after kernels ran; this pass runs before).
void infer_dtypes(PassGraph& g) {
  for (const auto& n : g.nodes) {
    if (!n || !n->domain.empty()) continue;
    std::optional<DType> t;
    if (n->op_type == "Cast") t = cast_target(*n);
    else if (n->op_type == "Shape" || n->op_type == "Size") t = DType::i64;
    else if (n->op_type == "Constant" && n->attr("value") && n->attr("value")->kind == Attribute::Kind::t)
      t = n->attr("value")->t.dtype();
    else if (keeps_input_dtype(n->op_type) && !n->inputs.empty() && !n->inputs[0].empty())
      t = g.dtype_of(n->inputs[0]);
    if (!t) continue;
    // Split's outputs are all pieces of its input; the others' extra outputs (MaxPool's
    // indices, Dropout's mask) have types of their own.
    const size_t outputs = n->op_type == "Split" ? n->outputs.size() : 1;
    for (size_t i = 0; i < outputs && i < n->outputs.size(); ++i)
      if (!n->outputs[i].empty() && !g.dtype_of(n->outputs[i])) g.dtypes[n->outputs[i]] = *t;
  }
}

bool has_f16(const PassGraph& g, const std::vector<std::string>& values) {
  for (const auto& v : values)
    if (!v.empty() && g.dtype_of(v) == DType::f16) return true;
  return false;
}

// A node the pass may run in float32: every value it touches has a known float or
// integer type (a value of unknown type might be float16 and would then reach a float32
// kernel), no subgraph, and no attribute naming an output type.
bool convertible(const PassGraph& g, const Node& n) {
  if (!n.domain.empty() || has_subgraph(n) || n.has_attr("dtype") || n.has_attr("to") || n.has_attr("output_dtype"))
    return false;
  for (const auto* list : {&n.inputs, &n.outputs})
    for (const auto& v : *list)
      if (!v.empty() && !g.dtype_of(v)) return false;
  return true;
}

}  // namespace

int64_t run_float16_in_float32(PassGraph& g) {
  if (!g.float16_in_float32) return 0;
  infer_dtypes(g);
  UseIndex index(g);
  std::map<std::string, Node*> producer;
  for (const auto& n : g.nodes)
    if (n)
      for (const auto& o : n->outputs)
        if (!o.empty()) producer[o] = n.get();

  // Which nodes compute in float32: those with a float16 input whose op has no float16
  // kernel, then, in graph order as ORT decides them, the float16-capable nodes whose
  // float16 inputs all come from such nodes and whose float16 outputs all go to them.
  std::set<const Node*> to_f32;
  for (const auto& n : g.nodes)
    if (n && !runs_float16(*n) && has_f16(g, n->inputs) && convertible(g, *n)) to_f32.insert(n.get());
  for (const auto& n : g.nodes) {
    if (!n || to_f32.count(n.get()) || !has_f16(g, n->inputs) || !convertible(g, *n) || n->op_type == "Cast" ||
        n->op_type == "Shape" || n->op_type == "Size")
      continue;
    bool isolated = true, any_output = false;
    for (const auto& o : n->outputs) isolated = isolated && !g.graph_outputs.count(o);
    for (const auto& in : n->inputs) {
      if (in.empty() || g.dtype_of(in) != DType::f16) continue;
      auto p = producer.find(in);
      isolated = isolated && p != producer.end() && to_f32.count(p->second);
    }
    for (const auto& o : n->outputs) {
      if (o.empty() || g.dtype_of(o) != DType::f16) continue;
      isolated = isolated && !index.pinned(o);
      for (const Node* r : index.readers(o)) {
        any_output = true;
        isolated = isolated && to_f32.count(r);
      }
    }
    if (isolated && any_output) to_f32.insert(n.get());
  }
  if (to_f32.empty()) return 0;

  // Casts around each of them: a float16 input through one Cast to float32 per value (a
  // constant converted here, once). A float16 output becomes a float32 value of the same
  // name, and a Cast makes the float16 copy that other readers get under a new name; a
  // graph output (or a value a subgraph reads) keeps its name and type, so the node
  // computes a new float32 value and the Cast writes the old one.
  std::set<const Node*> inserted;
  std::map<std::string, std::string> as_f32, as_f16;  // float16 value -> its copies
  std::vector<std::unique_ptr<Node>> nodes;
  auto make_cast = [&](const std::string& from, const std::string& to, DType t) {
    auto c = std::make_unique<Node>();
    c->op_type = "Cast";
    c->name = g.fresh_name("InsertedCast_" + to);
    c->inputs = {from};
    c->outputs = {to};
    Attribute a;
    a.kind = Attribute::Kind::i;
    a.i = t == DType::f32 ? 1 : 10;
    c->attrs["to"] = a;
    g.dtypes[to] = t;
    inserted.insert(c.get());
    return c;
  };
  int64_t rewrites = 0;
  for (auto& n : g.nodes) {
    if (!n) continue;
    if (!to_f32.count(n.get())) {
      for (auto& in : n->inputs) {
        auto it = as_f16.find(in);
        if (it != as_f16.end()) in = it->second;
      }
      nodes.push_back(std::move(n));
      continue;
    }
    for (auto& in : n->inputs) {
      if (in.empty() || g.dtype_of(in) != DType::f16) continue;
      auto it = as_f32.find(in);
      if (it == as_f32.end()) {
        std::string f32_name;
        if (const Tensor* c = g.constant(in)) {
          f32_name = g.add_constant(in + "_f32", convert_dtype(*c, DType::f32).contiguous());
        } else {
          f32_name = g.fresh_name(in + "_f32");
          nodes.push_back(make_cast(in, f32_name, DType::f32));
        }
        it = as_f32.emplace(in, f32_name).first;
      }
      in = it->second;
    }
    std::vector<std::unique_ptr<Node>> after;
    for (auto& o : n->outputs) {
      if (o.empty() || g.dtype_of(o) != DType::f16) continue;
      if (index.pinned(o)) {
        const std::string f32_name = g.fresh_name(o + "_f32");
        after.push_back(make_cast(f32_name, o, DType::f16));
        as_f32[o] = f32_name;
        o = f32_name;
      } else {
        const std::string f16_name = g.fresh_name(o + "_f16");
        after.push_back(make_cast(o, f16_name, DType::f16));
        g.dtypes[o] = DType::f32;
        as_f32[o] = o;
        as_f16[o] = f16_name;
      }
    }
    nodes.push_back(std::move(n));
    for (auto& c : after) nodes.push_back(std::move(c));
    ++rewrites;
  }
  g.nodes = std::move(nodes);

  // Cast pairs that meet now, as ORT's RemoveDuplicateCastTransformer removes them, where
  // this pass made at least one of the two (a model's own pair of Casts is left alone):
  // A -> B -> A reads the first Cast's input instead, and a first Cast whose readers are
  // all Casts goes too, the Casts it keeps (graph outputs) reading its input directly.
  index = UseIndex(g);
  const auto pos = positions(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* c1 = g.nodes[i].get();
    if (!is_cast(c1)) continue;
    const std::string x = c1->inputs[0], y = c1->outputs[0];
    const auto a = g.dtype_of(x), b = g.dtype_of(y);
    if (!a || !b || !dtype_is_float(*a) || !dtype_is_float(*b)) continue;
    std::vector<Node*> kept;
    bool all_casts = true, removed = false;
    for (Node* c2 : std::vector<Node*>(index.readers(y))) {
      const bool cast = is_cast(c2) && g.dtype_of(c2->outputs[0]) && dtype_is_float(*g.dtype_of(c2->outputs[0]));
      all_casts = all_casts && cast;
      if (!cast || !(inserted.count(c1) || inserted.count(c2))) continue;
      const std::string z = c2->outputs[0];
      if (g.dtype_of(z) != a || index.pinned(z)) {
        kept.push_back(c2);
        continue;
      }
      index.remove(c2);
      rename_reads(index, z, x);
      remove_at(g, pos.at(c2));
      removed = true;
    }
    if (index.pinned(y)) continue;
    if (index.readers(y).empty() && removed) {
      index.remove(c1);
      remove_at(g, i);
    } else if (all_casts && inserted.count(c1) && index.readers(y).size() == kept.size()) {
      for (Node* c2 : kept) {
        index.remove(c2);
        c2->inputs[0] = x;
        index.add(c2);
      }
      index.remove(c1);
      remove_at(g, i);
    }
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
