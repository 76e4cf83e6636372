// The float graph as quantization sees it: value producers and readers, which ops are
// quantized and how, and the preparation that runs before calibration.
#include <algorithm>

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/onnx/importer.h"
#include "slim/onnx/opset_upgrade.h"
#include "slim/runtime/passes.h"

namespace slim::quant::detail {

namespace {

void collect_names(const Graph& g, std::set<std::string>& names) {
  for (const auto& [name, t] : g.initializers) names.insert(name);
  for (const auto* list : {&g.inputs, &g.outputs, &g.value_info, &g.overridable_inputs})
    for (const auto& v : *list) names.insert(v.name);
  for (const auto& n : g.nodes) {
    names.insert(n.name);
    names.insert(n.inputs.begin(), n.inputs.end());
    names.insert(n.outputs.begin(), n.outputs.end());
    for (const auto& [key, a] : n.attrs) {
      if (a.g) collect_names(*a.g, names);
      for (const auto& sub : a.graphs) collect_names(*sub, names);
    }
  }
}

const std::set<std::string> kWeighted = {"Conv", "ConvTranspose", "MatMul", "Gemm"};
const std::set<std::string> kShared = {"Concat",    "MaxPool", "Reshape",   "Flatten",
                                       "Transpose", "Squeeze", "Unsqueeze", "Slice",
                                       "Gather",    "Split",   "Resize"};

// Constant nodes become initializers, so weights are found in one place.
void constants_to_initializers(Graph& g) {
  std::vector<Node> kept;
  for (auto& n : g.nodes) {
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1) {
      Tensor t;
      if (const Tensor* v = n.attr_tensor("value"))
        t = *v;
      else if (n.has_attr("value_float"))
        t = Tensor::scalar<float>(n.attr_float("value_float", 0));
      else if (n.has_attr("value_int"))
        t = Tensor::scalar<int64_t>(n.attr_int("value_int", 0));
      else if (n.has_attr("value_floats")) {
        const auto v = n.attr_floats("value_floats");
        t = Tensor::from_vector<float>({int64_t(v.size())}, v);
      } else if (n.has_attr("value_ints")) {
        const auto v = n.attr_ints("value_ints");
        t = Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
      }
      if (t.defined()) {
        g.initializers[n.outputs[0]] = t;
        continue;
      }
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

}  // namespace

NameSet::NameSet(const Graph& g) {
  collect_names(g, names_);
}

std::string NameSet::fresh(const std::string& base) {
  std::string name = base;
  for (int k = 1; names_.count(name); ++k) name = base + "_" + std::to_string(k);
  names_.insert(name);
  return name;
}

GraphIndex::GraphIndex(const Graph& g) {
  captured = outer_scope_refs(g);
  for (const auto& v : g.outputs) graph_outputs.insert(v.name);
  for (const auto& v : g.inputs) graph_inputs.insert(v.name);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (const auto& o : n.outputs)
      if (!o.empty()) producer[o] = i;
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      auto& c = consumers[in];
      if (c.empty() || c.back() != i) c.push_back(i);
    }
    // Values a node's subgraphs read from this scope are read by that node.
    for (const auto& [key, a] : n.attrs) {
      std::set<std::string> refs;
      if (a.g) refs = outer_scope_refs(*a.g);
      for (const auto& sub : a.graphs) {
        auto r = outer_scope_refs(*sub);
        refs.insert(r.begin(), r.end());
      }
      for (const auto& r : refs) {
        captured.insert(r);
        auto& c = consumers[r];
        if (c.empty() || c.back() != i) c.push_back(i);
      }
    }
  }
}

void erase_unread_initializers(Graph& g, const GraphIndex& index,
                               const std::set<std::string>& replaced) {
  std::set<std::string> used;
  for (const auto& n : g.nodes) used.insert(n.inputs.begin(), n.inputs.end());
  for (const auto& v : g.outputs) used.insert(v.name);
  for (const auto& name : replaced)
    if (!used.count(name) && !index.captured.count(name)) g.initializers.erase(name);
}

const Tensor* GraphIndex::constant(const Graph& g, const std::string& name) const {
  if (name.empty()) return nullptr;
  auto it = g.initializers.find(name);
  if (it == g.initializers.end()) return nullptr;
  for (const auto& v : g.overridable_inputs)
    if (v.name == name) return nullptr;
  return &it->second;
}

bool is_quantizable_op(const std::string& op) {
  return default_op_types().count(op) != 0;
}
bool shares_input_scale(const std::string& op) {
  return kShared.count(op) != 0;
}

int weight_input(const Graph& g, const GraphIndex& index, const Node& n) {
  if (!n.domain.empty() || !kWeighted.count(n.op_type) || n.inputs.size() < 2) return -1;
  const Tensor* w = index.constant(g, n.inputs[1]);
  if (!w || w->dtype() != DType::f32 || w->rank() < 2) return -1;
  if (n.op_type == "Gemm" && w->rank() != 2) return -1;
  return 1;
}

int weight_channel_axis(const Graph& g, const Node& n) {
  const int rank = g.initializers.at(n.inputs[1]).rank();
  if (n.op_type == "Conv") return 0;
  if (n.op_type == "ConvTranspose") return n.attr_int("group", 1) == 1 ? 1 : -1;
  if (n.op_type == "Gemm") return n.attr_int("transB", 0) ? 0 : 1;
  return rank - 1;  // MatMul: the N axis of [..., K, N]
}

std::vector<size_t> activation_inputs(const Graph& g, const GraphIndex& index, const Node& n) {
  std::vector<size_t> out;
  const int w = weight_input(g, index, n);
  size_t count = n.inputs.size();
  if (kWeighted.count(n.op_type))
    count = std::min<size_t>(count, 2);  // no bias, no zero points
  else if (n.op_type != "Concat" && n.op_type != "Add" && n.op_type != "Mul")
    count = std::min<size_t>(count, 1);
  for (size_t i = 0; i < count; ++i)
    if (int(i) != w && !n.inputs[i].empty() && !index.constant(g, n.inputs[i])) out.push_back(i);
  return out;
}

void prepare_float_model(Model& model, QuantizeReport& report) {
  report.opset_from = model.opset("");
  upgrade_opset(model, 13);
  report.opset_to = model.opset("");
  constants_to_initializers(model.graph);
  PassGraph pg = pass_graph_from_model(model);
  report.batch_norms_folded = fold_batch_norm(pg);
  if (!report.batch_norms_folded) return;
  Graph& g = model.graph;
  g.nodes.clear();
  std::set<std::string> used;
  for (const auto& n : pg.nodes) {
    g.nodes.push_back(*n);
    used.insert(n->inputs.begin(), n->inputs.end());
  }
  for (const auto& v : g.outputs) used.insert(v.name);
  for (auto& [name, t] : pg.constants)
    if (used.count(name)) g.initializers[name] = t;
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    bool overridable = false;
    for (const auto& v : g.overridable_inputs) overridable |= v.name == it->first;
    it = used.count(it->first) || overridable ? std::next(it) : g.initializers.erase(it);
  }
}

ObservePlan observe_plan(const Model& model) {
  const Graph& g = model.graph;
  GraphIndex index(g);
  ObservePlan plan;
  for (const auto& n : g.nodes) {
    if (!n.domain.empty() || !is_quantizable_op(n.op_type)) continue;
    for (size_t i : activation_inputs(g, index, n)) plan[n.inputs[i]];
    for (const auto& o : n.outputs)
      if (!o.empty()) plan[o];
    if (weight_input(g, index, n) < 0 || n.op_type == "ConvTranspose") continue;
    // The weighted op's input: channel means (bias correction) and, for matrix products,
    // channel maxima and histograms (SmoothQuant).
    ObserveSpec& s = plan[n.inputs[0]];
    s.channels = true;
    if (n.op_type == "Conv") {
      s.axis = 1;
    } else {
      s.axis = n.op_type == "Gemm" && n.attr_int("transA", 0) ? 0 : -1;
      s.histograms = true;
    }
  }
  return plan;
}

}  // namespace slim::quant::detail
