// PassGraph facts, the shared use index and the pass pipeline.
#include <algorithm>

#include "runtime/passes/pass_util.h"
#include "slim/core/convert.h"
#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim {

std::optional<Shape> PassGraph::shape_of(const std::string& value) const {
  auto c = constants.find(value);
  if (c != constants.end()) return c->second.shape();
  auto s = shapes.find(value);
  if (s != shapes.end()) return s->second;
  return std::nullopt;
}

std::optional<DType> PassGraph::dtype_of(const std::string& value) const {
  auto c = constants.find(value);
  if (c != constants.end()) return c->second.dtype();
  auto d = dtypes.find(value);
  if (d != dtypes.end()) return d->second;
  return std::nullopt;
}

const Tensor* PassGraph::constant(const std::string& value) const {
  auto c = constants.find(value);
  return c == constants.end() ? nullptr : &c->second;
}

std::string PassGraph::fresh_name(const std::string& base) {
  // reserved_names holds every name of the graph (see passes.h), so no scan of the nodes
  // is needed: a pass that fuses thousands of nodes stays linear.
  auto taken = [&](const std::string& name) {
    return reserved_names.count(name) || constants.count(name) || shapes.count(name) ||
           dtypes.count(name) || graph_outputs.count(name);
  };
  std::string name = base;
  for (int64_t k = 1; taken(name); ++k) name = base + "_" + std::to_string(k);
  reserved_names.insert(name);
  return name;
}

std::string PassGraph::add_constant(const std::string& base, Tensor value) {
  std::string name = fresh_name(base);
  constants[name] = std::move(value);
  return name;
}

PassGraph pass_graph_from_model(const Model& model) {
  PassGraph g;
  g.context = model.path.empty() ? "model '" + model.graph.name + "'" : model.path;
  const std::vector<size_t> order = validate_graph(model.graph, g.context);
  for (size_t i : order) g.nodes.push_back(std::make_unique<Node>(model.graph.nodes[i]));
  std::set<std::string> overridable;
  for (const auto& vi : model.graph.overridable_inputs) {
    overridable.insert(vi.name);
    g.reserved_names.insert(vi.name);
  }
  for (const auto& [name, t] : model.graph.initializers)
    if (!overridable.count(name)) g.constants[name] = t.contiguous();
  auto learn = [&](const ValueInfo& vi) {
    g.reserved_names.insert(vi.name);
    if (vi.dtype) g.dtypes[vi.name] = *vi.dtype;
    if (auto s = vi.static_shape()) g.shapes[vi.name] = *s;
  };
  for (const auto& vi : model.graph.inputs) learn(vi);
  for (const auto& vi : model.graph.value_info) learn(vi);
  for (const auto& vi : model.graph.outputs) g.graph_outputs.insert(vi.name);
  for (const auto& n : g.nodes) {
    g.reserved_names.insert(n->inputs.begin(), n->inputs.end());
    g.reserved_names.insert(n->outputs.begin(), n->outputs.end());
  }
  for (const auto& [name, t] : model.graph.initializers) g.reserved_names.insert(name);
  g.opsets = model.opsets;
  return g;
}

int64_t PassStats::total() const {
  int64_t n = 0;
  for (const auto& [name, k] : rewrites) n += k;
  return n;
}

PassStats optimize_graph(PassGraph& g) {
  PassStats stats;
  // One rewrite can enable another (a dropped Identity between Conv and Relu); a few
  // rounds reach the fixed point for every pattern these passes know.
  for (int round = 0; round < 4; ++round) {
    int64_t changed = 0;
    auto run = [&](const char* name, int64_t (*pass)(PassGraph&)) {
      const int64_t k = pass(g);
      stats.rewrites[name] += k;
      changed += k;
    };
    run("run_float16_in_float32", run_float16_in_float32);
    run("remove_noop_nodes", remove_noop_nodes);
    run("fold_shape_subgraphs", fold_shape_subgraphs);
    run("fold_batch_norm", fold_batch_norm);
    run("fuse_bias_activation", fuse_bias_activation);
    run("fuse_dynamic_quantize_conv", fuse_dynamic_quantize_conv);
    run("fuse_qdq", fuse_qdq);
    run("fuse_qdq_elementwise", fuse_qdq_elementwise);
    run("fuse_qdq_movement", fuse_qdq_movement);
    if (changed == 0) break;
  }
  // After the rounds: the elementwise pass composes the tables of a chain first.
  stats.rewrites["fuse_qlinear_conv_lookup"] += fuse_qlinear_conv_lookup(g);
  stats.rewrites["fuse_residual_qlinear_add"] += fuse_residual_qlinear_add(g);
  return stats;
}

namespace passes {

UseIndex::UseIndex(const PassGraph& g) {
  for (const auto& n : g.nodes)
    if (n) add(n.get());
  for (const auto& o : g.graph_outputs) pinned_.insert(o);
}

bool has_subgraph(const Node& node) {
  for (const auto& [key, a] : node.attrs)
    if (a.kind == Attribute::Kind::g || a.kind == Attribute::Kind::graphs) return true;
  return false;
}

void UseIndex::add(Node* node) {
  for (const auto& in : node->inputs)
    if (!in.empty()) readers_[in].push_back(node);
  if (!has_subgraph(*node)) return;
  for (const auto& [key, a] : node->attrs) {
    if (a.kind == Attribute::Kind::g && a.g)
      for (const auto& r : outer_scope_refs(*a.g)) pinned_.insert(r);
    if (a.kind == Attribute::Kind::graphs)
      for (const auto& sg : a.graphs)
        if (sg)
          for (const auto& r : outer_scope_refs(*sg)) pinned_.insert(r);
  }
}

void UseIndex::remove(Node* node) {
  for (const auto& in : node->inputs) {
    if (in.empty()) continue;
    auto it = readers_.find(in);
    if (it == readers_.end()) continue;
    auto pos = std::find(it->second.begin(), it->second.end(), node);
    if (pos != it->second.end()) it->second.erase(pos);
  }
}

const std::vector<Node*>& UseIndex::readers(const std::string& value) const {
  auto it = readers_.find(value);
  return it == readers_.end() ? none_ : it->second;
}

Node* UseIndex::sole_reader(const std::string& value) const {
  if (pinned(value)) return nullptr;
  const auto& r = readers(value);
  return r.size() == 1 ? r[0] : nullptr;
}

std::unordered_map<const Node*, size_t> positions(const PassGraph& g) {
  std::unordered_map<const Node*, size_t> pos;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i]) pos[g.nodes[i].get()] = i;
  return pos;
}

void remove_at(PassGraph& g, size_t pos) {
  if (g.nodes[pos]) g.removed.push_back(std::move(g.nodes[pos]));
  g.nodes[pos] = nullptr;
}

void compact(PassGraph& g) {
  g.nodes.erase(std::remove(g.nodes.begin(), g.nodes.end(), nullptr), g.nodes.end());
}

std::optional<double> scalar_constant(const PassGraph& g, const std::string& value) {
  const Tensor* t = g.constant(value);
  if (!t || t->numel() != 1) return std::nullopt;
  if (t->dtype() == DType::f32) return double(t->contiguous().data<float>()[0]);
  if (t->dtype() == DType::f64) return t->contiguous().data<double>()[0];
  return std::nullopt;
}

void rename_reads(UseIndex& index, const std::string& from, const std::string& to) {
  const std::vector<Node*> readers = index.readers(from);
  for (Node* n : readers) {
    index.remove(n);
    for (auto& in : n->inputs)
      if (in == from) in = to;
    index.add(n);
  }
}

}  // namespace passes
}  // namespace slim
