#include "slim/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "slim/core/dispatch.h"
#include "slim/core/thread_pool.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/kernel.h"
#include "slim/runtime/memory_planner.h"
#include "slim/runtime/fused_ops.h"
#include "slim/runtime/passes.h"
#include "slim/runtime/provider.h"

namespace slim {

// ---------------------------------------------------------------------------------------
// Providers

namespace {

std::mutex g_providers_mu;

std::vector<const KernelRegistry*>& extra_providers() {
  static std::vector<const KernelRegistry*> providers;
  return providers;
}

std::string domain_label(const std::string& domain) {
  return domain.empty() ? "ai.onnx" : domain;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<const KernelRegistry*> resolve_providers(const std::vector<std::string>& names) {
  check(!names.empty(), ErrorCode::invalid_argument, "no providers given");
  std::vector<const KernelRegistry*> out;
  for (const auto& name : names) {
    const KernelRegistry* r = find_provider(name);
    if (!r) {
      std::vector<std::string> known = {"cpu", "ref"};
      {
        std::lock_guard<std::mutex> lock(g_providers_mu);
        for (const auto* p : extra_providers()) known.push_back(p->provider());
      }
      throw Error(ErrorCode::invalid_argument,
                  "unknown provider '" + name + "' (known: " + join(known) + ")");
    }
    out.push_back(r);
  }
  return out;
}

// The op handled by the compiler itself, with no kernel.
bool is_constant_op(const Node& node) { return node.op_type == "Constant" && node.domain.empty(); }

// Ops whose outputs differ from run to run: never folded at compile time.
bool is_nondeterministic(const Node& node) {
  static const std::set<std::string> kOps = {"RandomNormal",     "RandomUniform",
                                             "RandomNormalLike", "RandomUniformLike",
                                             "Multinomial",      "Bernoulli"};
  return node.domain.empty() && kOps.count(node.op_type) != 0;
}

bool has_subgraph(const Node& node) {
  for (const auto& [key, a] : node.attrs)
    if (a.kind == Attribute::Kind::g || a.kind == Attribute::Kind::graphs) return true;
  return false;
}

// Every value a node reads: its inputs, then what its subgraphs read from outside.
std::vector<std::string> node_uses(const Node& node) {
  std::vector<std::string> uses;
  for (const auto& i : node.inputs)
    if (!i.empty()) uses.push_back(i);
  if (has_subgraph(node)) {
    std::set<std::string> outer;
    // Values a subgraph reads from enclosing scopes: its kernel needs them alive, so
    // they count as uses of the node that owns the subgraph.
    auto add = [&](const Graph& sub) {
      const auto refs = outer_scope_refs(sub);
      outer.insert(refs.begin(), refs.end());
    };
    for (const auto& [key, a] : node.attrs) {
      if (a.kind == Attribute::Kind::g && a.g) add(*a.g);
      if (a.kind == Attribute::Kind::graphs)
        for (const auto& sg : a.graphs)
          if (sg) add(*sg);
    }
    uses.insert(uses.end(), outer.begin(), outer.end());
  }
  return uses;
}

// The value of a Constant node as a tensor.
Tensor constant_node_value(const Node& node) {
  check(node.outputs.size() == 1 && !node.outputs[0].empty(), ErrorCode::invalid_model,
        node.describe() + ": a Constant has exactly one output");
  check(node.attrs.size() == 1, ErrorCode::invalid_model,
        node.describe() + ": a Constant needs exactly one value attribute, it has " +
            std::to_string(node.attrs.size()));
  const auto& [key, a] = *node.attrs.begin();
  auto expect = [&](Attribute::Kind kind) {
    const Attribute* got = node.attr(key);
    if (got->kind != kind)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": attribute '" + key + "' has the wrong kind");
  };
  if (key == "value") {
    expect(Attribute::Kind::t);
    check(a.t.defined(), ErrorCode::invalid_model, node.describe() + ": empty 'value' tensor");
    return a.t;
  }
  if (key == "value_float") {
    expect(Attribute::Kind::f);
    return Tensor::scalar<float>(a.f);
  }
  if (key == "value_floats") {
    expect(Attribute::Kind::floats);
    return Tensor::from_vector<float>({int64_t(a.floats.size())}, a.floats);
  }
  if (key == "value_int") {
    expect(Attribute::Kind::i);
    return Tensor::scalar<int64_t>(a.i);
  }
  if (key == "value_ints") {
    expect(Attribute::Kind::ints);
    return Tensor::from_vector<int64_t>({int64_t(a.ints.size())}, a.ints);
  }
  if (key == "value_string" || key == "value_strings")
    throw Error(ErrorCode::unsupported, node.describe() + ": string constants are not supported");
  if (key == "sparse_value")
    throw Error(ErrorCode::unsupported, node.describe() + ": sparse constants are not supported");
  throw Error(ErrorCode::invalid_model,
              node.describe() + ": unknown Constant attribute '" + key + "'");
}

// A tensor of ones. Probe runs use ones rather than zeros: an integer Div or Mod by a
// zero-filled divisor is undefined behaviour in C++, while ones are valid for almost
// every op (and index 1 past a size-1 axis merely makes the probe fail, not crash).
Tensor probe_tensor(DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    const T one = T(1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = one;
  });
  return t;
}

bool same_storage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage();
}

}  // namespace

void register_provider(const KernelRegistry* registry) {
  check(registry != nullptr, ErrorCode::invalid_argument, "register_provider: null registry");
  check(registry->provider() != "ref" && registry->provider() != "cpu",
        ErrorCode::invalid_argument,
        "register_provider: '" + registry->provider() + "' is built in and cannot be replaced");
  std::lock_guard<std::mutex> lock(g_providers_mu);
  for (auto& p : extra_providers())
    if (p->provider() == registry->provider()) {
      p = registry;
      return;
    }
  extra_providers().push_back(registry);
}

const KernelRegistry* find_provider(const std::string& name) {
  if (name == "ref") return &ref_kernel_registry();
  if (name == "cpu") return &cpu_kernel_registry();
  std::lock_guard<std::mutex> lock(g_providers_mu);
  for (const auto* p : extra_providers())
    if (p->provider() == name) return p;
  return nullptr;
}

namespace {

// Every registered provider, the built-in ones first.
std::vector<const KernelRegistry*> all_providers() {
  std::vector<const KernelRegistry*> out = {&cpu_kernel_registry(), &ref_kernel_registry()};
  std::lock_guard<std::mutex> lock(g_providers_mu);
  for (const auto* p : extra_providers()) out.push_back(p);
  return out;
}

// Why no selected provider runs an op at `opset`: they have it for other opsets only,
// only providers left out of the selection have it, or none has it.
std::string missing_reason(const std::string& op, const std::string& domain, int64_t opset,
                           const std::vector<const KernelRegistry*>& selected) {
  std::vector<std::string> ranges;
  for (const auto* r : selected) {
    std::vector<std::pair<int64_t, int64_t>> spans;  // opset ranges, adjacent ones merged
    for (const auto& d : r->defs())
      if (d.op_type == op && d.domain == domain) spans.emplace_back(d.since_version, d.until_version);
    if (spans.empty()) continue;
    std::sort(spans.begin(), spans.end());
    std::string versions;
    for (size_t i = 0; i < spans.size(); ++i) {
      const int64_t lo = spans[i].first;
      while (i + 1 < spans.size() && spans[i].second != INT_MAX && spans[i + 1].first == spans[i].second + 1) ++i;
      const int64_t hi = spans[i].second;
      versions += (versions.empty() ? "" : ", ") + std::to_string(lo) +
                  (hi == INT_MAX ? "+" : hi == lo ? "" : "-" + std::to_string(hi));
    }
    ranges.push_back(r->provider() + " has opset" + (versions.find_first_of(",-+") == std::string::npos ? " " : "s ") +
                     versions);
  }
  if (!ranges.empty()) {
    std::string list;
    for (const auto& x : ranges) list += (list.empty() ? "" : "; ") + x;
    return "no kernel for opset " + std::to_string(opset) + " (" + list + ")";
  }
  std::vector<std::string> others;
  for (const auto* r : all_providers())
    if (std::find(selected.begin(), selected.end(), r) == selected.end() && r->has_op(op, domain))
      others.push_back(r->provider());
  if (others.size() == 1) return "only provider " + others[0] + " implements it, and it is not selected";
  if (!others.empty()) return "only providers " + join(others) + " implement it, and they are not selected";
  return "slim does not implement it";
}

void collect_unsupported(const Graph& g, const Model& model,
                         const std::vector<const KernelRegistry*>& registries,
                         std::map<std::string, UnsupportedOp>& out) {
  // Live nodes: those a graph output depends on, found walking back from the outputs.
  std::unordered_set<std::string> needed;
  for (const auto& vi : g.outputs) needed.insert(vi.name);
  std::vector<bool> live(g.nodes.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = g.nodes.size(); i-- > 0;) {
      if (live[i]) continue;
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty() && needed.count(o)) live[i] = true;
      if (!live[i]) continue;
      changed = true;
      for (const auto& u : node_uses(g.nodes[i])) needed.insert(u);
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (!live[i]) continue;
    for (const auto& [key, a] : node.attrs) {
      if (a.kind == Attribute::Kind::g && a.g) collect_unsupported(*a.g, model, registries, out);
      if (a.kind == Attribute::Kind::graphs)
        for (const auto& sg : a.graphs)
          if (sg) collect_unsupported(*sg, model, registries, out);
    }
    if (is_constant_op(node)) continue;
    const int64_t opset = model.opset(node.domain);
    bool found = false;
    for (const auto* r : registries)
      if (r->find(node.op_type, node.domain, opset)) {
        found = true;
        break;
      }
    if (found) continue;
    const std::string op = domain_label(node.domain) + ":" + node.op_type + " (opset " + std::to_string(opset) + ")";
    UnsupportedOp& u = out[op];
    if (u.op.empty()) u = {op, missing_reason(node.op_type, node.domain, opset, registries), {}};
    u.nodes.push_back(node.name);
  }
}

}  // namespace

std::vector<UnsupportedOp> unsupported_op_report(const Model& model, const std::vector<std::string>& providers) {
  const auto registries = resolve_providers(providers);
  std::map<std::string, UnsupportedOp> out;
  collect_unsupported(model.graph, model, registries, out);
  std::vector<UnsupportedOp> list;
  for (auto& [op, u] : out) list.push_back(std::move(u));
  return list;
}

std::vector<std::string> unsupported_ops(const Model& model, const std::vector<std::string>& providers) {
  std::vector<std::string> out;
  for (const auto& u : unsupported_op_report(model, providers)) out.push_back(u.op);
  return out;
}

// ---------------------------------------------------------------------------------------
// The compiled plan

namespace {

enum class ValueKind { constant, input, produced };

struct ValueSlot {
  std::string name;
  ValueKind kind = ValueKind::produced;
  std::optional<DType> dtype;  // known at compile time
  std::optional<Shape> shape;  // static shape, when known
  Tensor constant;             // kind == constant
  bool graph_output = false;
  int producer_step = -1;
  int last_step = -1;      // last step that reads it (num_steps for graph outputs)
  int alias_of = -1;       // value whose storage a view-producing kernel reused
  Tensor planned;          // its place in the arena, when planned
};

struct Step {
  const Node* node = nullptr;
  std::string provider;
  std::unique_ptr<OpKernel> kernel;
  std::vector<int> inputs;   // value ids, -1 for an omitted input
  std::vector<int> uses;     // every value read, subgraph captures included
  std::vector<int> outputs;  // value ids, -1 for an omitted output
  std::vector<Tensor> planned;
  std::vector<int> release;  // values whose last reader is this step
};

}  // namespace

struct Session::Impl {
  SessionOptions options;
  Model model;
  Graph graph;  // compiled
  std::vector<std::string> node_providers;
  std::vector<NodeAssignment> assignments;  // index for index with graph.nodes
  CompileStats stats;
  std::string context;

  std::vector<ValueSlot> values;
  std::unordered_map<std::string, int> value_ids;
  std::vector<Step> steps;
  // The nodes the steps run. Kernels may keep a reference to their node, so each node
  // gets an address that never changes; graph.nodes is a copy for inspection.
  std::vector<std::unique_ptr<Node>> node_store;
  std::vector<int> output_ids;
  std::shared_ptr<Storage> arena;
  std::unordered_set<const Storage*> constant_storages;
  std::mutex run_mu;

  // Plans compiled for concrete input shapes of a model with symbolic input dims.
  struct Specialization {
    std::vector<std::optional<Shape>> key;  // graph inputs, then overridable inputs
    int64_t seen = 0;
    bool failed = false;
    std::unique_ptr<Impl> impl;
  };
  bool has_symbolic_inputs = false;
  std::list<Specialization> specializations;  // most recently used first
  int64_t num_specialized = 0;
  const Impl* last_used = nullptr;
  NodeProfiler profiler_fn;  // Session::set_profiler
  Impl* specialization_for(const TensorMap& inputs);

  int value_id(const std::string& name) {
    auto it = value_ids.find(name);
    if (it != value_ids.end()) return it->second;
    ValueSlot v;
    v.name = name;
    values.push_back(std::move(v));
    value_ids.emplace(name, int(values.size() - 1));
    return int(values.size() - 1);
  }
  const ValueSlot* find_value(const std::string& name) const {
    auto it = value_ids.find(name);
    return it == value_ids.end() ? nullptr : &values[size_t(it->second)];
  }

  void compile();
  void validate_inputs(const TensorMap& inputs) const;
  TensorMap run(const TensorMap& inputs, const std::vector<std::string>& output_names);
  const NodeProfiler* profiler = nullptr;  // set by Session::run when profiling

 private:
  void eliminate_dead_nodes();
  // Graph passes (SessionOptions::optimize): once before kernel selection, so providers
  // see fused nodes, and once after shape inference for the rewrites that need static
  // shapes; kernels of nodes the second round left alone are reused, not rebuilt.
  void optimize(const std::vector<const KernelRegistry*>& regs, bool after_inference);
  struct ReusableKernel {
    std::string provider;
    std::vector<std::string> inputs;
    std::unique_ptr<OpKernel> kernel;
  };
  std::unordered_map<const Node*, ReusableKernel> reusable_kernels;
  std::vector<std::unique_ptr<Node>> retired_nodes;  // addresses reusable_kernels keys on
  std::unique_ptr<OpKernel> take_reusable_kernel(const Node& node, const std::string& provider);
  void fold_and_infer(const std::vector<const KernelRegistry*>& regs);
  void build_steps();
  void negotiate_private_layouts();
  void plan_arena();
  bool in_arena(const Tensor& t) const;
  bool inside(const Tensor& t, const Tensor& region) const;
  bool overlaps(const Tensor& a, const Tensor& b) const;
};

void Session::Impl::compile() {
  context = model.path.empty() ? (model.graph.name.empty() ? "model" : "model '" + model.graph.name + "'")
                               : model.path;
  set_num_threads(options.num_threads);
  const auto registries = resolve_providers(options.providers);
  stats.nodes_in = int64_t(model.graph.nodes.size());

  const std::vector<size_t> order = validate_graph(model.graph, context);
  check(order.size() == model.graph.nodes.size(), ErrorCode::internal,
        context + ": validate_graph ordered " + std::to_string(order.size()) + " of " +
            std::to_string(model.graph.nodes.size()) + " nodes");

  graph.name = model.graph.name;
  graph.inputs = model.graph.inputs;
  graph.outputs = model.graph.outputs;
  graph.value_info = model.graph.value_info;
  graph.overridable_inputs = model.graph.overridable_inputs;
  node_store.reserve(order.size());
  for (size_t i : order) {
    check(i < model.graph.nodes.size(), ErrorCode::internal,
          context + ": validate_graph returned node index " + std::to_string(i));
    node_store.push_back(std::make_unique<Node>(model.graph.nodes[i]));
  }

  // Values the graph starts with.
  std::set<std::string> overridable;
  for (const auto& vi : model.graph.overridable_inputs) overridable.insert(vi.name);
  auto declare_input = [&](const ValueInfo& vi) {
    ValueSlot& v = values[size_t(value_id(vi.name))];
    v.kind = ValueKind::input;
    v.dtype = vi.dtype;
    if (vi.dtype) v.shape = vi.static_shape();
  };
  for (const auto& vi : model.graph.inputs) declare_input(vi);
  for (const auto& vi : model.graph.overridable_inputs) declare_input(vi);
  for (const auto& [name, t] : model.graph.initializers) {
    if (overridable.count(name)) continue;
    check(t.defined(), ErrorCode::invalid_model, context + ": initializer '" + name + "' is empty");
    ValueSlot& v = values[size_t(value_id(name))];
    v.kind = ValueKind::constant;
    v.constant = t.contiguous();
    v.dtype = t.dtype();
    v.shape = t.shape();
  }
  for (const auto& vi : model.graph.outputs) values[size_t(value_id(vi.name))].graph_output = true;
  // Every name gets its slot now, so later passes can hold references into `values`.
  for (const auto& node : node_store) {
    for (const auto& u : node_uses(*node)) value_id(u);
    for (const auto& o : node->outputs)
      if (!o.empty()) value_id(o);
  }

  eliminate_dead_nodes();

  // Constant nodes are values, not work.
  std::vector<std::unique_ptr<Node>> remaining;
  remaining.reserve(node_store.size());
  for (auto& node : node_store) {
    if (!is_constant_op(*node)) {
      remaining.push_back(std::move(node));
      continue;
    }
    Tensor t = constant_node_value(*node).contiguous();
    ValueSlot& v = values[size_t(value_id(node->outputs[0]))];
    v.kind = ValueKind::constant;
    v.constant = t;
    v.dtype = t.dtype();
    v.shape = t.shape();
    ++stats.folded_nodes;
  }
  node_store = std::move(remaining);
  if (options.optimize) optimize(registries, false);
  fold_and_infer(registries);
  if (options.optimize) optimize(registries, true);

  // Folding leaves constants nobody reads; drop them so their memory goes.
  std::unordered_set<std::string> used;
  for (const auto& node : node_store)
    for (const auto& u : node_uses(*node)) used.insert(u);
  for (const auto& vi : graph.outputs) used.insert(vi.name);
  for (auto& v : values) {
    if (v.kind != ValueKind::constant) continue;
    if (!used.count(v.name)) {
      v.constant = Tensor();
      continue;
    }
    graph.initializers[v.name] = v.constant;
    constant_storages.insert(v.constant.storage().get());
  }
  for (const auto& vi : graph.overridable_inputs) {
    auto it = model.graph.initializers.find(vi.name);
    if (it != model.graph.initializers.end()) graph.initializers[vi.name] = it->second;
  }

  build_steps();
  negotiate_private_layouts();
  for (const auto& node : node_store) graph.nodes.push_back(*node);
  node_providers.clear();
  for (const auto& s : steps) node_providers.push_back(s.provider);
  stats.nodes_out = int64_t(graph.nodes.size());
  if (options.plan_memory) plan_arena();
  int64_t dynamic = 0;
  for (const auto& v : values)
    if (v.kind == ValueKind::produced && v.producer_step >= 0 && !v.graph_output && !v.shape)
      ++dynamic;
  stats.memory.dynamic_values = dynamic;
  for (const auto& vi : graph.inputs) has_symbolic_inputs |= !vi.static_shape().has_value();
  for (const auto& vi : graph.overridable_inputs)
    has_symbolic_inputs |= !vi.static_shape().has_value();
}

Session::Impl* Session::Impl::specialization_for(const TensorMap& inputs) {
  std::vector<std::optional<Shape>> key;
  for (const auto& vi : graph.inputs) key.push_back(inputs.at(vi.name).shape());
  for (const auto& vi : graph.overridable_inputs) {
    auto it = inputs.find(vi.name);
    key.push_back(it == inputs.end() ? std::nullopt : std::optional<Shape>(it->second.shape()));
  }
  auto it = std::find_if(specializations.begin(), specializations.end(),
                         [&](const Specialization& sp) { return sp.key == key; });
  if (it == specializations.end()) {
    specializations.push_front(Specialization{std::move(key), 0, false, nullptr});
  } else {
    specializations.splice(specializations.begin(), specializations, it);
  }
  Specialization& sp = specializations.front();
  ++sp.seen;
  // Specialize on the second sighting: a one-off run would pay for the compile (which
  // probes every node once) without gaining anything from the plan.
  if (!sp.impl && !sp.failed && sp.seen >= 2) {
    Model m = model;
    auto fix = [](ValueInfo& vi, const Shape& shape) {
      std::vector<Dim> dims(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) dims[d].value = shape[d];
      vi.shape = std::move(dims);
    };
    for (auto& vi : m.graph.inputs) fix(vi, inputs.at(vi.name).shape());
    for (auto& vi : m.graph.overridable_inputs) {
      auto given = inputs.find(vi.name);
      auto init = m.graph.initializers.find(vi.name);
      if (given != inputs.end())
        fix(vi, given->second.shape());
      else if (!vi.static_shape() && init != m.graph.initializers.end())
        fix(vi, init->second.shape());
    }
    auto spec = std::make_unique<Impl>();
    spec->options = options;
    spec->options.shape_specializations = 0;
    spec->model = std::move(m);
    try {
      spec->compile();
      sp.impl = std::move(spec);
      ++num_specialized;
    } catch (const Error&) {
      // Shapes the model cannot take: the general plan reports the problem when it runs.
      sp.failed = true;
    }
  }
  Impl* target = sp.impl ? sp.impl.get() : this;
  while (specializations.size() > size_t(std::max(options.shape_specializations, 1)))
    specializations.pop_back();
  return target;
}

void Session::Impl::eliminate_dead_nodes() {
  std::unordered_set<std::string> needed;
  for (const auto& vi : graph.outputs) needed.insert(vi.name);
  std::vector<bool> live(node_store.size(), false);
  for (size_t i = node_store.size(); i-- > 0;) {
    for (const auto& o : node_store[i]->outputs)
      if (!o.empty() && needed.count(o)) live[i] = true;
    if (!live[i]) continue;
    for (const auto& u : node_uses(*node_store[i])) needed.insert(u);
  }
  std::vector<std::unique_ptr<Node>> kept;
  kept.reserve(node_store.size());
  for (size_t i = 0; i < node_store.size(); ++i) {
    if (live[i])
      kept.push_back(std::move(node_store[i]));
    else
      ++stats.dead_nodes;
  }
  node_store = std::move(kept);
}

void Session::Impl::fold_and_infer(const std::vector<const KernelRegistry*>& registries) {
  struct Missing {
    std::string op, node;
  };
  std::vector<Missing> missing;
  std::vector<std::unique_ptr<Node>> kept;
  std::vector<Step> built;
  std::vector<NodeAssignment> assigned;
  kept.reserve(node_store.size());
  for (auto& node_ptr : node_store) {
    const Node& node = *node_ptr;
    const int64_t opset = model.opset(node.domain);
    // Partitioning: providers see what is known about the inputs by now (earlier nodes
    // were folded or probed in order) and claim or decline the node.
    KernelBuildInfo info{node, opset, {}};
    info.winograd = options.winograd;
    info.inputs.resize(node.inputs.size());
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (node.inputs[k].empty()) continue;
      const ValueSlot& v = values[size_t(value_id(node.inputs[k]))];
      NodeInputInfo& in = info.inputs[k];
      in.present = true;
      in.dtype = v.dtype;
      in.shape = v.shape;
      if (v.kind == ValueKind::constant) in.constant = &v.constant;
    }
    ProviderChoice choice = choose_provider(registries, info);
    const KernelDef* def = choice.def;
    const std::string provider = choice.provider;
    NodeAssignment assignment{node.name,
                              node.domain.empty() ? node.op_type : node.domain + ":" + node.op_type,
                              provider, std::move(choice.declined)};
    if (!def) {
      missing.push_back({domain_label(node.domain) + ":" + node.op_type + " (opset " +
                             std::to_string(opset) + ")",
                         node.describe()});
      kept.push_back(std::move(node_ptr));
      built.emplace_back();
      assigned.push_back(std::move(assignment));
      continue;
    }
    std::unique_ptr<OpKernel> kernel = take_reusable_kernel(node, provider);
    const bool reused = kernel != nullptr;  // its output shapes are known already
    if (!reused) kernel = build_kernel(*def, info);
    check(kernel != nullptr, ErrorCode::internal,
          node.describe() + ": provider '" + provider + "' returned no kernel");

    const bool subgraph = has_subgraph(node);
    bool all_constant = true, all_known = true;
    for (const auto& in : node.inputs) {
      if (in.empty()) continue;
      const ValueSlot& v = values[size_t(value_id(in))];
      if (v.kind != ValueKind::constant) all_constant = false;
      if (!v.shape || !v.dtype) all_known = false;
    }
    bool shape_inputs_constant = true;
    for (int idx : def->shape_inputs) {
      if (idx < 0 || size_t(idx) >= node.inputs.size() || node.inputs[size_t(idx)].empty())
        continue;
      if (values[size_t(value_id(node.inputs[size_t(idx)]))].kind != ValueKind::constant)
        shape_inputs_constant = false;
    }
    // Shape and Size read only their input's shape, so a static shape is as good as a
    // constant value for them.
    const bool shape_only = node.domain.empty() && (node.op_type == "Shape" || node.op_type == "Size");
    const bool fold = options.fold_constants && !subgraph && !is_nondeterministic(node) &&
                      (all_constant || (shape_only && all_known));
    bool probe = !reused && !subgraph && all_known && shape_inputs_constant;
    if (probe && !fold) {
      // Kernels that fixed their output shapes at build time need no probe run.
      std::vector<std::pair<DType, Shape>> known(node.outputs.size());
      bool all_static = true;
      for (size_t i = 0; i < node.outputs.size() && all_static; ++i)
        all_static = node.outputs[i].empty() || kernel->static_output(int(i), &known[i].first, &known[i].second);
      if (all_static) {
        for (size_t i = 0; i < node.outputs.size(); ++i) {
          if (node.outputs[i].empty()) continue;
          ValueSlot& v = values[size_t(value_id(node.outputs[i]))];
          v.dtype = known[i].first;
          v.shape = known[i].second;
        }
        probe = false;
      }
    }

    if (fold || probe) {
      std::vector<Tensor> probe_inputs;
      std::vector<const Tensor*> ins;
      probe_inputs.reserve(node.inputs.size());
      for (const auto& in : node.inputs) {
        if (in.empty()) {
          probe_inputs.emplace_back();
          continue;
        }
        const ValueSlot& v = values[size_t(value_id(in))];
        probe_inputs.push_back(v.kind == ValueKind::constant ? v.constant
                                                             : probe_tensor(*v.dtype, *v.shape));
      }
      for (const auto& t : probe_inputs) ins.push_back(t.defined() ? &t : nullptr);
      std::vector<Tensor> outs(node.outputs.size());
      bool ok = true;
      if (!fold) ++stats.probed_nodes;
      try {
        KernelContext ctx(node, ins, &outs, nullptr, &default_thread_pool());
        kernel->compute(ctx);
      } catch (const Error&) {
        // Folding real constants fails the same way at every run, so report it now. A
        // probe on made-up values may fail where real data would not (an index of 1
        // into an axis of size 1): then the shapes stay unknown until run time.
        if (fold && all_constant) throw;
        ok = false;
      }
      if (ok && fold) {
        for (size_t i = 0; i < node.outputs.size(); ++i) {
          if (node.outputs[i].empty()) continue;
          check(outs[i].defined(), ErrorCode::internal,
                node.describe() + ": kernel produced no output " + std::to_string(i));
          ValueSlot& v = values[size_t(value_id(node.outputs[i]))];
          // A view of a probe tensor would keep a throwaway buffer alive; copy instead.
          bool views_probe = false;
          for (size_t k = 0; k < probe_inputs.size(); ++k)
            if (same_storage(outs[i], probe_inputs[k]) &&
                values[size_t(value_id(node.inputs[k]))].kind != ValueKind::constant)
              views_probe = true;
          v.kind = ValueKind::constant;
          v.constant = (views_probe || !outs[i].is_contiguous()) ? outs[i].clone() : outs[i];
          v.dtype = v.constant.dtype();
          v.shape = v.constant.shape();
        }
        ++stats.folded_nodes;
        continue;
      }
      if (ok) {
        for (size_t i = 0; i < node.outputs.size(); ++i) {
          if (node.outputs[i].empty() || !outs[i].defined()) continue;
          ValueSlot& v = values[size_t(value_id(node.outputs[i]))];
          v.dtype = outs[i].dtype();
          v.shape = outs[i].shape();
          for (size_t k = 0; k < probe_inputs.size(); ++k)
            if (same_storage(outs[i], probe_inputs[k])) v.alias_of = value_id(node.inputs[k]);
        }
      }
    }
    Step step;
    step.node = node_ptr.get();
    step.provider = provider;
    step.kernel = std::move(kernel);
    built.push_back(std::move(step));
    kept.push_back(std::move(node_ptr));
    assigned.push_back(std::move(assignment));
  }
  if (!missing.empty()) {
    std::string msg = context + ": no kernel in providers [" + join(options.providers) +
                      "] for " + missing[0].op + ", needed by " + missing[0].node;
    std::set<std::string> others;
    for (size_t i = 1; i < missing.size(); ++i)
      if (missing[i].op != missing[0].op) others.insert(missing[i].op);
    if (!others.empty())
      msg += "; also unsupported: " + join(std::vector<std::string>(others.begin(), others.end()));
    throw Error(ErrorCode::unsupported, msg);
  }
  node_store = std::move(kept);
  steps = std::move(built);
  assignments = std::move(assigned);
}

void Session::Impl::optimize(const std::vector<const KernelRegistry*>& registries,
                             bool after_inference) {
  PassGraph g;
  g.context = context;
  for (const auto& v : values) {
    g.reserved_names.insert(v.name);
    if (v.kind == ValueKind::constant && v.constant.defined()) {
      g.constants[v.name] = v.constant;
      continue;
    }
    if (v.dtype) g.dtypes[v.name] = *v.dtype;
    if (v.shape) g.shapes[v.name] = *v.shape;
  }
  for (const auto& vi : graph.outputs) g.graph_outputs.insert(vi.name);
  g.opsets = model.opsets;
  // Fuse only where the provider that would run the base op also runs the fused one.
  g.can_fuse = [&](const std::string& base, const std::string& fused) {
    for (const auto* r : registries)
      if (r->find(base, "", model.opset(""))) return r->find(fused, kFusedDomain, kFusedOpset) != nullptr;
    return false;
  };
  // Passes edit inputs in place: remember them to tell which kernels still fit.
  if (after_inference)
    for (auto& step : steps)
      if (step.node) reusable_kernels[step.node] = {step.provider, step.node->inputs, nullptr};
  g.nodes = std::move(node_store);
  const PassStats pass_stats = optimize_graph(g);
  const int64_t rewrites = pass_stats.total();
  // Shape subgraphs the passes evaluated are folded nodes like those fold_and_infer folds.
  stats.folded_nodes += pass_stats.rewrites.count("fold_shape_subgraphs")
                            ? pass_stats.rewrites.at("fold_shape_subgraphs")
                            : 0;
  node_store = std::move(g.nodes);
  if (rewrites == 0) {
    reusable_kernels.clear();
    return;
  }
  stats.pass_rewrites += rewrites;
  for (auto& n : g.removed) retired_nodes.push_back(std::move(n));
  for (const auto& [name, t] : g.constants) {
    ValueSlot& v = values[size_t(value_id(name))];
    if (v.kind == ValueKind::constant && v.constant.defined()) continue;
    v.kind = ValueKind::constant;
    v.constant = t.contiguous();
    v.dtype = t.dtype();
    v.shape = t.shape();
  }
  model.opsets = g.opsets;  // fused nodes import slim:1
  for (const auto& node : node_store)
    for (const auto& o : node->outputs)
      if (!o.empty()) value_id(o);
  if (!after_inference) return;
  for (auto& step : steps)
    if (step.node) reusable_kernels[step.node].kernel = std::move(step.kernel);
  fold_and_infer(registries);
  reusable_kernels.clear();
  retired_nodes.clear();
}

std::unique_ptr<OpKernel> Session::Impl::take_reusable_kernel(const Node& node,
                                                              const std::string& provider) {
  auto it = reusable_kernels.find(&node);
  if (it == reusable_kernels.end() || !it->second.kernel || it->second.provider != provider ||
      it->second.inputs != node.inputs)
    return nullptr;
  return std::move(it->second.kernel);
}

// A value may stay in its producer's private layout (OpKernel::private_output_layout)
// when it is not a graph output, no subgraph captures it, and every step reading it
// accepts that layout on the input it reads it through.
void Session::Impl::negotiate_private_layouts() {
  std::vector<std::vector<std::pair<int, int>>> readers(values.size());
  std::vector<char> plain_only(values.size(), 0);
  for (int s = 0; s < int(steps.size()); ++s) {
    const Step& step = steps[size_t(s)];
    if (!step.kernel) continue;
    for (int k = 0; k < int(step.inputs.size()); ++k)
      if (step.inputs[size_t(k)] >= 0) readers[size_t(step.inputs[size_t(k)])].push_back({s, k});
    for (int id : step.uses)
      if (std::find(step.inputs.begin(), step.inputs.end(), id) == step.inputs.end())
        plain_only[size_t(id)] = 1;
  }
  for (auto& step : steps) {
    if (!step.kernel) continue;
    for (int o = 0; o < int(step.outputs.size()); ++o) {
      const int id = step.outputs[size_t(o)];
      if (id < 0 || values[size_t(id)].graph_output || plain_only[size_t(id)] ||
          readers[size_t(id)].empty() || values[size_t(id)].alias_of >= 0)
        continue;
      uint64_t layout = step.kernel->private_output_layout(o);
      bool all = layout != 0;
      for (const auto& [s, k] : readers[size_t(id)])
        all = all && steps[size_t(s)].kernel->accepts_private_input(k, layout);
      if (!all) {
        // The readers' own layout, when they all want the same one and it can be written.
        layout = 0;
        for (const auto& [s, k] : readers[size_t(id)]) {
          const uint64_t want = steps[size_t(s)].kernel->wanted_input_layout(k);
          if (!want || (layout && want != layout)) {
            layout = 0;
            break;
          }
          layout = want;
        }
        if (!layout || !step.kernel->can_write_output_in(o, layout)) continue;
        for (const auto& [s, k] : readers[size_t(id)])
          if (!steps[size_t(s)].kernel->accepts_private_input(k, layout)) layout = 0;
        if (!layout) continue;
      }
      step.kernel->use_private_output(o, layout);
      for (const auto& [s, k] : readers[size_t(id)]) steps[size_t(s)].kernel->use_private_input(k, layout);
    }
  }
}

void Session::Impl::build_steps() {
  const int num_steps = int(node_store.size());
  for (int s = 0; s < num_steps; ++s) {
    const Node& node = *node_store[size_t(s)];
    Step& step = steps[size_t(s)];
    for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : value_id(in));
    for (const auto& u : node_uses(node)) {
      const int id = value_id(u);
      step.uses.push_back(id);
      ValueSlot& v = values[size_t(id)];
      v.last_step = std::max(v.last_step, s);
    }
    for (const auto& out : node.outputs) {
      if (out.empty()) {
        step.outputs.push_back(-1);
        continue;
      }
      const int id = value_id(out);
      ValueSlot& v = values[size_t(id)];
      v.producer_step = s;
      v.last_step = std::max(v.last_step, s);
      step.outputs.push_back(id);
    }
    step.planned.resize(node.outputs.size());
  }
  for (auto& v : values)
    if (v.graph_output) v.last_step = num_steps;
  // A view keeps the buffer it looks into alive for as long as the view itself.
  for (int s = 0; s < num_steps; ++s)
    for (int id : steps[size_t(s)].outputs) {
      if (id < 0) continue;
      int root = values[size_t(id)].alias_of;
      while (root >= 0) {
        ValueSlot& r = values[size_t(root)];
        r.last_step = std::max(r.last_step, values[size_t(id)].last_step);
        root = r.alias_of;
      }
    }
  for (int id = 0; id < int(values.size()); ++id) {
    const ValueSlot& v = values[size_t(id)];
    if (v.kind != ValueKind::produced || v.producer_step < 0 || v.graph_output) continue;
    steps[size_t(std::min(v.last_step, num_steps - 1))].release.push_back(id);
  }
  for (const auto& vi : graph.outputs) output_ids.push_back(value_id(vi.name));
}

void Session::Impl::plan_arena() {
  auto plannable = [&](int id) {
    const ValueSlot& v = values[size_t(id)];
    return v.kind == ValueKind::produced && v.producer_step >= 0 && !v.graph_output && v.shape &&
           v.dtype && v.alias_of < 0;
  };
  auto bytes_of = [&](int id) {
    const ValueSlot& v = values[size_t(id)];
    return shape_numel(*v.shape) * int64_t(dtype_size(*v.dtype));
  };
  std::vector<char> aliased(values.size(), 0);
  for (const auto& v : values)
    if (v.alias_of >= 0) aliased[size_t(v.alias_of)] = 1;
  // Inputs read as one run of the reader's output (OpKernel::input_within_output) are
  // placed there: the output's buffer then lives from the first such producer on. Only a
  // value read last by that step, never viewed by another value, and not itself holding
  // others; one at an aligned offset, so every planned buffer stays aligned.
  struct Within {
    int host = -1;
    int64_t offset = 0;
  };
  std::vector<Within> within(values.size());
  std::vector<int> first_step(values.size(), -1);
  std::vector<char> hosts(values.size(), 0);
  for (int s = 0; s < int(steps.size()); ++s) {
    const Step& step = steps[size_t(s)];
    if (!step.kernel || step.outputs.empty() || step.outputs[0] < 0 || !plannable(step.outputs[0])) continue;
    const int host = step.outputs[0];
    for (int k = 0; k < int(step.inputs.size()); ++k) {
      const int id = step.inputs[size_t(k)];
      int64_t offset = 0;
      if (id < 0 || !plannable(id) || aliased[size_t(id)] || hosts[size_t(id)] ||
          values[size_t(id)].last_step != s ||
          std::count(step.inputs.begin(), step.inputs.end(), id) != 1 ||
          std::count(step.uses.begin(), step.uses.end(), id) != 1 ||
          !step.kernel->input_within_output(k, &offset) || offset % kArenaAlignment != 0)
        continue;
      within[size_t(id)] = {host, offset};
      hosts[size_t(host)] = 1;
      const int p = values[size_t(id)].producer_step;
      first_step[size_t(host)] = first_step[size_t(host)] < 0 ? p : std::min(first_step[size_t(host)], p);
    }
  }
  std::vector<int> ids;
  std::vector<BufferRequest> requests;
  std::vector<int64_t> offset_of(values.size(), -1);
  for (int id = 0; id < int(values.size()); ++id) {
    if (!plannable(id) || within[size_t(id)].host >= 0) continue;
    const ValueSlot& v = values[size_t(id)];
    const int first = first_step[size_t(id)] < 0 ? v.producer_step : std::min(first_step[size_t(id)], v.producer_step);
    ids.push_back(id);
    requests.push_back({bytes_of(id), first, v.last_step});
  }
  const MemoryPlan plan = plan_memory(requests);
  int64_t in_place = 0, in_place_bytes = 0;
  for (int id = 0; id < int(values.size()); ++id) {
    if (within[size_t(id)].host < 0) continue;
    ++in_place;
    in_place_bytes += bytes_of(id);
  }
  stats.memory.intermediate_bytes = plan.requested_bytes + in_place_bytes;
  stats.memory.planned_bytes = plan.arena_bytes;
  stats.memory.planned_values = int64_t(ids.size()) + in_place;
  stats.memory.in_place_values = in_place;
  if (ids.empty()) return;
  arena = Storage::allocate(size_t(plan.arena_bytes));
  char* base = static_cast<char*>(arena->data());
  for (size_t k = 0; k < ids.size(); ++k) offset_of[size_t(ids[k])] = plan.offsets[k];
  for (int id = 0; id < int(values.size()); ++id) {
    if (!plannable(id)) continue;
    ValueSlot& v = values[size_t(id)];
    const Within& w = within[size_t(id)];
    const int64_t offset = w.host >= 0 ? offset_of[size_t(w.host)] + w.offset : offset_of[size_t(id)];
    v.planned = Tensor::borrow(*v.dtype, *v.shape, base + offset, arena);
    Step& step = steps[size_t(v.producer_step)];
    for (size_t o = 0; o < step.outputs.size(); ++o)
      if (step.outputs[o] == id) step.planned[o] = v.planned;
  }
}

bool Session::Impl::in_arena(const Tensor& t) const {
  if (!arena || !t.defined()) return false;
  const char* p = static_cast<const char*>(t.raw_data());
  const char* base = static_cast<const char*>(arena->data());
  return p >= base && p < base + arena->bytes();
}

bool Session::Impl::inside(const Tensor& t, const Tensor& region) const {
  if (!region.defined()) return false;
  const char* p = static_cast<const char*>(t.raw_data());
  const char* r = static_cast<const char*>(region.raw_data());
  return p >= r && p + t.nbytes() <= r + region.nbytes();
}

bool Session::Impl::overlaps(const Tensor& a, const Tensor& b) const {
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

void Session::Impl::validate_inputs(const TensorMap& inputs) const {
  auto describe_expected = [](const ValueInfo& vi) { return vi.describe(); };
  std::unordered_map<std::string, const ValueInfo*> declared;
  for (const auto& vi : graph.inputs) declared[vi.name] = &vi;
  for (const auto& vi : graph.overridable_inputs) declared[vi.name] = &vi;
  for (const auto& [name, t] : inputs) {
    auto it = declared.find(name);
    if (it == declared.end()) {
      std::vector<std::string> names, optional;
      for (const auto& vi : graph.inputs) names.push_back(vi.name);
      for (const auto& vi : graph.overridable_inputs) optional.push_back(vi.name);
      throw Error(ErrorCode::invalid_argument,
                  "unknown input '" + name + "' (model inputs: " + join(names) +
                      (optional.empty() ? "" : "; overridable initializers: " + join(optional)) +
                      ")");
    }
    const ValueInfo& vi = *it->second;
    if (!t.defined())
      throw Error(ErrorCode::invalid_argument, "input '" + name + "': tensor is undefined");
    bool ok = !vi.dtype || *vi.dtype == t.dtype();
    if (ok && vi.shape) {
      ok = vi.shape->size() == t.shape().size();
      for (size_t d = 0; ok && d < vi.shape->size(); ++d)
        if ((*vi.shape)[d].is_fixed() && (*vi.shape)[d].value != t.shape()[d]) ok = false;
    }
    if (!ok)
      throw Error(ErrorCode::invalid_argument, "input '" + name + "': expected " +
                                                   describe_expected(vi) + ", got " + t.describe());
  }
  for (const auto& vi : graph.inputs)
    if (!inputs.count(vi.name))
      throw Error(ErrorCode::invalid_argument,
                  "missing input '" + vi.name + "' (expected " + describe_expected(vi) + ")");
}

TensorMap Session::Impl::run(const TensorMap& inputs, const std::vector<std::string>& output_names) {
  std::vector<int> wanted;
  if (output_names.empty()) {
    wanted = output_ids;
  } else {
    for (const auto& name : output_names) {
      auto pos = std::find_if(graph.outputs.begin(), graph.outputs.end(),
                              [&](const ValueInfo& vi) { return vi.name == name; });
      if (pos == graph.outputs.end()) {
        std::vector<std::string> names;
        for (const auto& vi : graph.outputs) names.push_back(vi.name);
        throw Error(ErrorCode::invalid_argument,
                    "unknown output '" + name + "' (model outputs: " + join(names) + ")");
      }
      wanted.push_back(output_ids[size_t(pos - graph.outputs.begin())]);
    }
  }
  validate_inputs(inputs);

  // When only some outputs are wanted, skip the steps none of them depends on.
  std::vector<char> skip(steps.size(), 0);
  if (!output_names.empty()) {
    std::vector<char> needed(values.size(), 0);
    for (int id : wanted) needed[size_t(id)] = 1;
    for (size_t s = steps.size(); s-- > 0;) {
      bool live = false;
      for (int id : steps[s].outputs) live = live || (id >= 0 && needed[size_t(id)]);
      skip[s] = !live;
      if (live)
        for (int id : steps[s].uses) needed[size_t(id)] = 1;
    }
  }

  // Per-run state: the tensors this run produced or was given. Constants are read
  // straight from the plan.
  std::vector<Tensor> held(values.size());
  std::vector<const Tensor*> ref(values.size(), nullptr);
  std::unordered_set<const Storage*> caller_storages;
  for (size_t id = 0; id < values.size(); ++id) {
    const ValueSlot& v = values[id];
    if (v.kind == ValueKind::constant && v.constant.defined()) ref[id] = &v.constant;
  }
  for (const auto& vi : graph.overridable_inputs) {
    auto it = model.graph.initializers.find(vi.name);
    if (it == model.graph.initializers.end()) continue;
    const int id = value_ids.at(vi.name);
    held[size_t(id)] = it->second.contiguous();
    ref[size_t(id)] = &held[size_t(id)];
  }
  for (const auto& [name, t] : inputs) {
    const int id = value_ids.at(name);
    held[size_t(id)] = t.contiguous();
    caller_storages.insert(t.storage().get());
    ref[size_t(id)] = &held[size_t(id)];
  }

  ThreadPool& pool = default_thread_pool();
  std::vector<const Tensor*> ins;
  std::vector<Tensor> outs;
  for (size_t s = 0; s < steps.size(); ++s) {
    Step& step = steps[s];
    const Node& node = *step.node;
    if (skip[s]) {
      for (int id : step.release) {
        held[size_t(id)] = Tensor();
        ref[size_t(id)] = nullptr;
      }
      continue;
    }
    ins.assign(step.inputs.size(), nullptr);
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int id = step.inputs[k];
      if (id < 0) continue;
      if (!ref[size_t(id)] || !ref[size_t(id)]->defined())
        throw Error(ErrorCode::internal,
                    node.describe() + ": input '" + node.inputs[k] + "' has no value");
      ins[k] = ref[size_t(id)];
    }
    outs.assign(step.outputs.size(), Tensor());
    try {
      KernelContext ctx(node, ins, &outs, &step.planned, &pool);
      if (profiler) {
        const auto t0 = std::chrono::steady_clock::now();
        step.kernel->compute(ctx);
        (*profiler)(node, step.provider, t0, std::chrono::steady_clock::now());
      } else {
        step.kernel->compute(ctx);
      }
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::resource_exhausted, node.describe() + ": out of memory");
    }
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      const int id = step.outputs[o];
      if (id < 0) continue;
      Tensor& t = outs[o];
      if (!t.defined())
        throw Error(ErrorCode::internal,
                    node.describe() + ": kernel produced no output '" + node.outputs[o] + "'");
      if (!t.is_contiguous()) t = t.contiguous();
      const ValueSlot& v = values[size_t(id)];
      // A kernel may hand back a view of its input. When that input lives in the arena,
      // the view is only safe if compile saw the alias and kept the input's bytes
      // reserved; otherwise move the data to the value's own place.
      if (in_arena(t) && !inside(t, v.planned)) {
        bool reserved = false;
        for (int root = v.alias_of; root >= 0 && !reserved; root = values[size_t(root)].alias_of)
          reserved = inside(t, values[size_t(root)].planned);
        if (!reserved) {
          if (v.planned.defined() && v.planned.dtype() == t.dtype() &&
              v.planned.shape() == t.shape() && !overlaps(t, v.planned)) {
            Tensor dst = v.planned;
            dst.copy_from(t);
            t = dst;
          } else {
            t = t.clone();
          }
        }
      }
      held[size_t(id)] = std::move(t);
      ref[size_t(id)] = &held[size_t(id)];
    }
    for (int id : step.release) {
      held[size_t(id)] = Tensor();
      ref[size_t(id)] = nullptr;
    }
  }

  TensorMap result;
  for (int id : wanted) {
    const ValueSlot& v = values[size_t(id)];
    const Tensor* t = ref[size_t(id)];
    if (!t || !t->defined())
      throw Error(ErrorCode::internal, context + ": output '" + v.name + "' was not produced");
    // Outputs belong to the caller: never hand out the arena, a constant or an input.
    const bool shared = v.kind != ValueKind::produced || in_arena(*t) ||
                        constant_storages.count(t->storage().get()) ||
                        caller_storages.count(t->storage().get());
    result[v.name] = shared ? t->clone() : *t;
  }
  return result;
}

// ---------------------------------------------------------------------------------------
// Session

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

std::unique_ptr<Session> Session::load(const std::string& path, SessionOptions options) {
  return compile(OnnxImporter::load_file(path), std::move(options));
}

std::unique_ptr<Session> Session::compile(Model model, SessionOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->model = std::move(model);
  impl->compile();
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

TensorMap Session::run(const TensorMap& inputs, const std::vector<std::string>& output_names) {
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  Impl* target = impl_.get();
  const SessionOptions& o = impl_->options;
  if (impl_->has_symbolic_inputs && o.shape_specializations > 0 &&
      (o.fold_constants || o.plan_memory)) {
    impl_->validate_inputs(inputs);  // errors name the model's symbolic dims
    target = impl_->specialization_for(inputs);
  }
  impl_->last_used = target;
  target->profiler = impl_->profiler_fn ? &impl_->profiler_fn : nullptr;
  return target->run(inputs, output_names);
}

void Session::set_profiler(NodeProfiler profiler) {
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  impl_->profiler_fn = std::move(profiler);
}

int64_t Session::num_specializations() const {
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  return impl_->num_specialized;
}

CompileStats Session::last_run_stats() const {
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  return impl_->last_used ? impl_->last_used->stats : impl_->stats;
}

const Model& Session::model() const { return impl_->model; }
const std::vector<ValueInfo>& Session::inputs() const { return impl_->graph.inputs; }
const std::vector<ValueInfo>& Session::outputs() const { return impl_->graph.outputs; }
const CompileStats& Session::stats() const { return impl_->stats; }
const Graph& Session::compiled_graph() const { return impl_->graph; }
const std::vector<std::string>& Session::node_providers() const { return impl_->node_providers; }
const std::vector<NodeAssignment>& Session::partition() const { return impl_->assignments; }

std::optional<Shape> Session::static_shape(const std::string& value) const {
  const ValueSlot* v = impl_->find_value(value);
  return v ? v->shape : std::nullopt;
}

std::optional<DType> Session::static_dtype(const std::string& value) const {
  const ValueSlot* v = impl_->find_value(value);
  return v ? v->dtype : std::nullopt;
}

}  // namespace slim
