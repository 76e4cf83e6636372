#include "slim/runtime/model_summary.h"

#include <set>

namespace slim {

namespace {

double numel_d(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  return n;
}

// Ops that only move or reinterpret data: no arithmetic.
const std::set<std::string>& data_movement_ops() {
  static const std::set<std::string> ops = {
      "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
      "Scatter", "ScatterElements", "ScatterND", "Expand", "Tile", "Pad", "Squeeze", "Unsqueeze",
      "Flatten", "Shape", "Size", "ConstantOfShape", "Constant", "Identity", "Dropout", "Cast",
      "CastLike", "DepthToSpace", "SpaceToDepth", "NonZero", "Range", "OneHot", "Trilu", "EyeLike"};
  return ops;
}

void count_subgraph_ops(const Node& node, ModelSummary& s) {
  for (const auto& [key, a] : node.attrs) {
    std::vector<const Graph*> graphs;
    if (a.kind == Attribute::Kind::g && a.g) graphs.push_back(a.g.get());
    if (a.kind == Attribute::Kind::graphs)
      for (const auto& g : a.graphs)
        if (g) graphs.push_back(g.get());
    for (const Graph* g : graphs)
      for (const auto& n : g->nodes) {
        s.op_histogram[n.domain.empty() ? n.op_type : n.domain + ":" + n.op_type]++;
        ++s.subgraph_nodes;
        count_subgraph_ops(n, s);
      }
  }
}

}  // namespace

std::optional<double> estimate_node_flops(const Node& node, const ShapeLookup& shape_of) {
  auto in = [&](size_t i) -> std::optional<Shape> {
    if (i >= node.inputs.size() || node.inputs[i].empty()) return std::nullopt;
    return shape_of(node.inputs[i]);
  };
  auto out = [&](size_t i) -> std::optional<Shape> {
    if (i >= node.outputs.size() || node.outputs[i].empty()) return std::nullopt;
    return shape_of(node.outputs[i]);
  };
  const std::string& op = node.op_type;
  if (data_movement_ops().count(op)) return 0.0;
  // Control flow: its subgraphs' work depends on the data (ModelSummary::subgraph_nodes).
  for (const auto& [key, a] : node.attrs)
    if (a.kind == Attribute::Kind::g || a.kind == Attribute::Kind::graphs) return 0.0;
  if (op == "Conv" || op == "ConvInteger" || op == "QLinearConv") {
    const size_t w_idx = op == "QLinearConv" ? 3 : 1;
    auto w = in(w_idx);
    auto y = out(0);
    if (!w || !y || w->size() < 2) return std::nullopt;
    double k = double((*w)[1]);
    for (size_t i = 2; i < w->size(); ++i) k *= double((*w)[i]);
    return 2.0 * numel_d(*y) * k;
  }
  if (op == "ConvTranspose") {
    auto x = in(0), w = in(1);
    if (!x || !w || w->size() < 2) return std::nullopt;
    double k = double((*w)[1]);  // C_out / group
    for (size_t i = 2; i < w->size(); ++i) k *= double((*w)[i]);
    return 2.0 * numel_d(*x) * k;
  }
  if (op == "MatMul" || op == "MatMulInteger" || op == "QLinearMatMul" || op == "Gemm") {
    auto a = in(0), y = out(0);
    if (!a || !y || a->empty()) return std::nullopt;
    int64_t k = a->back();
    if (op == "Gemm" && node.attr_int("transA", 0) && a->size() == 2) k = (*a)[0];
    double f = 2.0 * numel_d(*y) * double(k);
    if (op == "Gemm" && in(2)) f += numel_d(*y);
    return f;
  }
  if (op == "LSTM" || op == "GRU" || op == "RNN") {
    // Each step and batch row multiplies every direction's W and R: 2 (I + H) per gate unit.
    auto x = in(0), w = in(1), r = in(2);
    if (!x || !w || !r || x->size() != 3 || w->size() != 3 || r->size() != 3 || x->back() < 1 || (*w)[2] < 1)
      return std::nullopt;
    return 2.0 * numel_d(*x) / double(x->back()) * numel_d(*w) / double((*w)[2]) * double((*w)[2] + (*r)[2]);
  }
  if (op == "MaxPool" || op == "AveragePool" || op == "LpPool") {
    auto y = out(0);
    if (!y) return std::nullopt;
    double k = 1;
    for (int64_t d : node.attr_ints("kernel_shape")) k *= double(d);
    return numel_d(*y) * k;
  }
  if (op.rfind("Global", 0) == 0 || op.rfind("Reduce", 0) == 0 || op == "ArgMax" ||
      op == "ArgMin" || op == "TopK" || op == "CumSum") {
    auto x = in(0);
    if (!x) return std::nullopt;
    return numel_d(*x);
  }
  if (op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization" ||
      op == "BatchNormalization" || op == "InstanceNormalization" || op == "GroupNormalization" ||
      op == "LRN" || op == "MeanVarianceNormalization") {
    auto x = in(0);
    if (!x) return std::nullopt;
    return 5.0 * numel_d(*x);
  }
  // Elementwise ops and activations: one operation per output element.
  auto y = out(0);
  if (!y) return std::nullopt;
  return numel_d(*y);
}

ModelSummary summarize_model(const Model& model, const ShapeLookup& shape_of) {
  ModelSummary s;
  const Graph& g = model.graph;
  s.num_nodes = int64_t(g.nodes.size());
  for (const auto& n : g.nodes) {
    const std::string key = n.domain.empty() ? n.op_type : n.domain + ":" + n.op_type;
    s.op_histogram[key]++;
    count_subgraph_ops(n, s);
    if (auto f = estimate_node_flops(n, shape_of)) {
      s.flops += *f;
      s.flops_by_op[key] += *f;
    } else {
      s.nodes_without_flops++;
    }
    // Constant nodes hold parameters too.
    if (n.op_type == "Constant") {
      if (const Tensor* t = n.attr_tensor("value")) {
        s.parameter_count += t->numel();
        s.parameter_bytes += int64_t(t->nbytes());
      }
    }
  }
  for (const auto& [name, t] : g.initializers) {
    s.num_initializers++;
    s.parameter_count += t.numel();
    s.parameter_bytes += int64_t(t.nbytes());
  }
  return s;
}

}  // namespace slim
