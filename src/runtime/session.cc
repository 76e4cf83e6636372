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

// Every value a node reads: its inputs, then what its subgraphs read from outside (their
// kernel needs those alive, so they count as uses of the node that owns the subgraph).
std::vector<std::string> node_uses(const Node& node) {
  std::vector<std::string> uses;
  for (const auto& i : node.inputs)
    if (!i.empty()) uses.push_back(i);
  if (has_subgraph(node)) {
    const auto captures = node_captures(node);
    uses.insert(uses.end(), captures.begin(), captures.end());
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

// t is the planned tensor `place` (KernelContext::output handed it out).
bool is_place(const Tensor& t, const Tensor& place) {
  return place.defined() && t.storage() == place.storage() && t.raw_data() == place.raw_data() &&
         t.dtype() == place.dtype() && t.shape() == place.shape();
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
  std::vector<int> captures;  // what its subgraphs read from this scope (node_captures)
  bool subgraphs = false;     // the node has subgraphs (If, Loop, Scan, SequenceMap)
  std::vector<int> outputs;  // value ids, -1 for an omitted output
  std::vector<Tensor> planned;
  // What the kernel wrote (KernelContext's outputs). An output written in its planned
  // place stays here between runs, so the next run hands the kernel the same tensor
  // without copying it; the others move on to the run's values.
  std::vector<Tensor> outs;
  std::vector<int> release;  // values whose last reader is this step
  // A view (OpKernel::view_input): its one output is this value's elements under the
  // output's shape, and the kernel does not run. `same_shape`: the output is the value
  // itself; else `view` is the output over the arena place of the value it looks into,
  // when that has one.
  int view_of = -1;
  bool same_shape = false;
  Tensor view;
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
  std::vector<int> input_ids;  // graph.inputs, then graph.overridable_inputs
  std::unordered_map<std::string, size_t> input_positions;  // name -> index in input_ids
  size_t max_step_inputs = 0, max_step_outputs = 0;
  std::vector<int> output_ids;
  std::vector<int> constant_ids;  // values a run reads from the plan
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
  bool is_specialization = false;
  std::list<Specialization> specializations;  // most recently used first
  int64_t num_specialized = 0;
  const Impl* last_used = nullptr;
  NodeProfiler profiler_fn;  // Session::set_profiler
  Impl* specialization_for(const std::vector<Value>& feeds);

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

  // Running. Feeds are the input values in input_ids order; an undefined one leaves an
  // overridable input at its initializer.
  template <typename Map>
  std::vector<Value> feeds_from(const Map& inputs) const;
  void check_feeds(const std::vector<Value>& feeds) const;
  std::vector<int> output_positions(const std::vector<std::string>& names) const;
  // The plan to run these feeds with: this one or a shape specialization of it.
  Impl* plan_for(const std::vector<Value>& feeds);
  // Runs the steps and returns the outputs at `wanted` (positions in graph.outputs);
  // `partial` skips steps none of them needs. Outputs never share memory with the arena
  // or a constant; a top-level run also copies those that share the caller's inputs.
  std::vector<Value> execute(std::vector<Value> feeds, const std::vector<int>& wanted,
                             bool partial, bool top_level);
  const NodeProfiler* profiler = nullptr;  // set by Session::run when profiling
  // execute()'s working vectors, kept between runs so that the iterations of a loop body
  // do not allocate them again. Runs of one plan never overlap: a session serializes its
  // runs, and a subgraph's plan never runs inside itself.
  struct RunState {
    std::vector<char> skip;
    std::vector<Value> held;
    std::vector<const Tensor*> ref, ins;
    std::vector<const Value*> value_ins;
    std::vector<Value> value_outs, captured;
  } run_state;
  // Session::run: picks the plan (a specialization or this one) and executes it.
  std::vector<Value> run_feeds(std::vector<Value> feeds, const std::vector<int>& wanted, bool partial) {
    Impl* target = plan_for(feeds);
    last_used = target;
    target->profiler = profiler_fn ? &profiler_fn : nullptr;
    return target->execute(std::move(feeds), wanted, partial, true);
  }

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
  int64_t inlined_ifs = 0;  // Ifs replaced by their taken branch
  std::vector<std::unique_ptr<Node>> retired_nodes;  // addresses reusable_kernels keys on
  std::unique_ptr<OpKernel> take_reusable_kernel(const Node& node, const std::string& provider);
  void fold_and_infer(const std::vector<const KernelRegistry*>& regs);
  // The nodes of an If's taken branch, renamed into this scope, to replace the If.
  std::vector<std::unique_ptr<Node>> inline_branch(const Node& if_node, const Graph& branch);
  std::unique_ptr<SubgraphPlan> compile_subgraph(const Node& node, const std::string& attr,
                                                 const std::vector<NodeInputInfo>& formal);
  void build_steps();
  // Marks a step whose kernel only views an input (OpKernel::view_input) and whose
  // shapes are static as a view; plan_views gives it its arena place once planned.
  void resolve_view(Step& step);
  void negotiate_private_layouts();
  void plan_arena();
  void plan_views();
  bool in_arena(const Tensor& t) const;
  bool inside(const Tensor& t, const Tensor& region) const;
  bool overlaps(const Tensor& a, const Tensor& b) const;
};

void Session::Impl::compile() {
  if (context.empty())  // subgraph plans come with their place in the model
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
  // What only an inlined If's other branch read is dead now.
  if (inlined_ifs) eliminate_dead_nodes();

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
    if (it == model.graph.initializers.end()) continue;
    graph.initializers[vi.name] = it->second;
    constant_storages.insert(it->second.storage().get());
  }

  build_steps();
  negotiate_private_layouts();
  for (const auto& node : node_store) graph.nodes.push_back(*node);
  node_providers.clear();
  for (const auto& s : steps) node_providers.push_back(s.provider);
  stats.nodes_out = int64_t(graph.nodes.size());
  if (options.plan_memory) plan_arena();
  plan_views();
  int64_t dynamic = 0;
  for (const auto& v : values)
    if (v.kind == ValueKind::produced && v.producer_step >= 0 && !v.graph_output && !v.shape)
      ++dynamic;
  stats.memory.dynamic_values = dynamic;
  // Inputs a specialization could fix: tensors (or untyped values) without a static shape.
  for (const auto* list : {&graph.inputs, &graph.overridable_inputs})
    for (const auto& vi : *list) {
      input_positions.emplace(vi.name, input_ids.size());
      input_ids.push_back(value_id(vi.name));
      const bool tensor_like = vi.dtype || vi.onnx_type.empty();
      has_symbolic_inputs |= tensor_like && !vi.static_shape().has_value();
    }
}

Session::Impl* Session::Impl::specialization_for(const std::vector<Value>& feeds) {
  std::vector<std::optional<Shape>> key;
  for (const auto& f : feeds)
    key.push_back(f.defined() && f.is_tensor() ? std::optional<Shape>(f.tensor().shape()) : std::nullopt);
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
    size_t k = 0;
    for (auto* list : {&m.graph.inputs, &m.graph.overridable_inputs})
      for (auto& vi : *list) {
        const Value& f = feeds[k++];
        const Tensor* t = f.defined() && f.is_tensor() ? &f.tensor() : nullptr;
        auto init = m.graph.initializers.find(vi.name);
        if (!t && !vi.static_shape() && init != m.graph.initializers.end()) t = &init->second;
        if (!t || (!vi.dtype && !vi.onnx_type.empty())) continue;  // a sequence or optional
        std::vector<Dim> dims(t->shape().size());
        for (size_t d = 0; d < dims.size(); ++d) dims[d].value = t->shape()[d];
        vi.shape = std::move(dims);
        vi.dtype = t->dtype();
      }
    auto spec = std::make_unique<Impl>();
    spec->options = options;
    spec->is_specialization = true;
    spec->context = context;
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

Session::Impl* Session::Impl::plan_for(const std::vector<Value>& feeds) {
  if (!has_symbolic_inputs || is_specialization || options.shape_specializations <= 0 ||
      !(options.fold_constants || options.plan_memory))
    return this;
  return specialization_for(feeds);
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
  // Once kernels are chosen, their steps and assignments go with their nodes.
  const bool built = steps.size() == node_store.size();
  std::vector<std::unique_ptr<Node>> kept;
  std::vector<Step> kept_steps;
  std::vector<NodeAssignment> kept_assignments;
  kept.reserve(node_store.size());
  for (size_t i = 0; i < node_store.size(); ++i) {
    if (!live[i]) {
      ++stats.dead_nodes;
      continue;
    }
    kept.push_back(std::move(node_store[i]));
    if (!built) continue;
    kept_steps.push_back(std::move(steps[i]));
    kept_assignments.push_back(std::move(assignments[i]));
  }
  node_store = std::move(kept);
  if (!built) return;
  steps = std::move(kept_steps);
  assignments = std::move(kept_assignments);
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
  for (size_t pos = 0; pos < node_store.size(); ++pos) {
    auto& node_ptr = node_store[pos];
    const Node& node = *node_ptr;
    const int64_t opset = model.opset(node.domain);
    // An If whose condition is known: only the taken branch is compiled, as nodes of
    // this plan (folded, claimed and memory-planned with the rest).
    if (options.fold_constants && node.op_type == "If" && node.domain.empty() &&
        !node.inputs.empty() && !node.inputs[0].empty()) {
      const ValueSlot& cond = values[size_t(value_id(node.inputs[0]))];
      if (cond.kind == ValueKind::constant) {
        check(cond.constant.dtype() == DType::boolean && cond.constant.numel() == 1,
              ErrorCode::invalid_model,
              node.describe() + ": the condition must be one bool, got " + cond.constant.describe());
        const char* taken = *static_cast<const bool*>(cond.constant.raw_data()) ? "then_branch" : "else_branch";
        const Attribute* a = node.attr(taken);
        check(a && a->kind == Attribute::Kind::g && a->g, ErrorCode::invalid_model,
              node.describe() + ": attribute '" + std::string(taken) + "' is missing or not a graph");
        auto inlined = inline_branch(node, *a->g);
        node_store.insert(node_store.begin() + std::ptrdiff_t(pos + 1),
                          std::make_move_iterator(inlined.begin()), std::make_move_iterator(inlined.end()));
        ++stats.folded_nodes;
        ++inlined_ifs;
        continue;
      }
    }
    // Partitioning: providers see what is known about the inputs by now (earlier nodes
    // were folded or probed in order) and claim or decline the node.
    KernelBuildInfo info{node, opset, {}};
    info.winograd = options.winograd;
    const bool subgraph = has_subgraph(node);
    if (subgraph)
      info.compile_subgraph = [this, &node](const std::string& attr, const std::vector<NodeInputInfo>& formal) {
        return compile_subgraph(node, attr, formal);
      };
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
    // Nodes with subgraphs are never run at compile (a Loop may be long), but their
    // kernels may know their output shapes from their subgraphs' plans.
    bool probe = !reused && all_known && shape_inputs_constant;
    if ((probe || (subgraph && !reused)) && !fold) {
      // Kernels that fixed their output shapes at build time need no probe run.
      // A node with subgraphs also keeps the outputs it knows when it does not know all.
      std::vector<std::pair<DType, Shape>> known(node.outputs.size());
      std::vector<char> has(node.outputs.size(), 0);
      bool all_static = true;
      for (size_t i = 0; i < node.outputs.size() && (all_static || subgraph); ++i) {
        has[i] = !node.outputs[i].empty() && kernel->static_output(int(i), &known[i].first, &known[i].second);
        all_static = all_static && (has[i] || node.outputs[i].empty());
      }
      if (all_static || subgraph) {
        for (size_t i = 0; i < node.outputs.size(); ++i) {
          if (!has[i]) continue;
          ValueSlot& v = values[size_t(value_id(node.outputs[i]))];
          v.dtype = known[i].first;
          v.shape = known[i].second;
        }
        probe = probe && !all_static;
      }
    }
    probe = probe && !subgraph;

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
      std::vector<Value> value_outs(node.outputs.size());
      bool ok = true;
      if (!fold) ++stats.probed_nodes;
      try {
        KernelContext ctx(node, ins, &outs, nullptr, &default_thread_pool());
        ctx.set_values(nullptr, &value_outs, nullptr);
        kernel->compute(ctx);
      } catch (const Error&) {
        // Folding real constants fails the same way at every run, so report it now. A
        // probe on made-up values may fail where real data would not (an index of 1
        // into an axis of size 1): then the shapes stay unknown until run time.
        if (fold && all_constant) throw;
        ok = false;
      }
      // Constants are tensors: a sequence or optional result stays a node.
      for (const auto& v : value_outs) ok = ok && !v.defined();
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

namespace {

// Renames, in a subgraph and the subgraphs inside it, the values it reads from the scopes
// around it; names it defines itself are its own and keep theirs. Graphs are shared
// between copies of a node, so each one renamed is copied first.
void rename_captures(std::shared_ptr<Graph>& g, const std::map<std::string, std::string>& rename) {
  std::map<std::string, std::string> outer = rename;
  for (const auto* list : {&g->inputs, &g->overridable_inputs})
    for (const auto& vi : *list) outer.erase(vi.name);
  for (const auto& [name, t] : g->initializers) outer.erase(name);
  for (const auto& n : g->nodes)
    for (const auto& o : n.outputs) outer.erase(o);
  if (outer.empty()) return;
  g = std::make_shared<Graph>(*g);
  auto apply = [&](std::string& name) {
    auto it = outer.find(name);
    if (it != outer.end()) name = it->second;
  };
  for (auto& n : g->nodes) {
    for (auto& in : n.inputs) apply(in);
    for (auto& [key, a] : n.attrs) {
      if (a.g) rename_captures(a.g, outer);
      for (auto& sub : a.graphs)
        if (sub) rename_captures(sub, outer);
    }
  }
  for (auto& vi : g->outputs) apply(vi.name);
}

// A subgraph compiled into a Session::Impl of its own: its inputs are the body's formal
// inputs, then the captured values that are not constants (constants became its
// initializers, so its plan folds them and kernels pack them).
class CompiledSubgraph final : public SubgraphPlan {
 public:
  CompiledSubgraph(std::unique_ptr<Session::Impl> plan, const Session::Impl* parent,
                   std::vector<int> capture_index, std::string attr, int num_formal)
      : plan_(std::move(plan)), parent_(parent), capture_index_(std::move(capture_index)),
        attr_(std::move(attr)), num_formal_(num_formal) {
    for (size_t k = 0; k < plan_->graph.outputs.size(); ++k) all_outputs_.push_back(int(k));
  }

  std::vector<Value> run(const KernelContext& ctx, std::vector<Value> inputs) override;
  int num_inputs() const override { return num_formal_; }
  int num_outputs() const override;
  std::optional<DType> output_dtype(int i) const override;
  std::optional<Shape> output_shape(int i) const override;

 private:
  std::unique_ptr<Session::Impl> plan_;
  const Session::Impl* parent_;
  std::vector<int> capture_index_;  // for each captured input, its index in ctx.captures()
  std::string attr_;                // the node's attribute that holds the subgraph
  int num_formal_;
  std::vector<int> all_outputs_;    // 0, 1, ... num_outputs() - 1
};

}  // namespace

std::vector<std::unique_ptr<Node>> Session::Impl::inline_branch(const Node& if_node, const Graph& branch) {
  check(branch.inputs.empty(), ErrorCode::invalid_model,
        if_node.describe() + ": an If branch takes no inputs, this one declares " +
            std::to_string(branch.inputs.size()));
  check(branch.outputs.size() == if_node.outputs.size(), ErrorCode::invalid_model,
        if_node.describe() + ": the branch has " + std::to_string(branch.outputs.size()) +
            " outputs, the node " + std::to_string(if_node.outputs.size()));
  std::map<std::string, std::string> rename;
  std::set<std::string> produced;
  for (const auto& n : branch.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) produced.insert(o);
  // A branch output its nodes produce takes the If output's name; the rest of the
  // branch's names stay, or get the If's name as a prefix where this scope has them.
  std::vector<bool> direct(if_node.outputs.size(), false);
  for (size_t j = 0; j < branch.outputs.size(); ++j) {
    const std::string& name = branch.outputs[j].name;
    if (if_node.outputs[j].empty() || !produced.count(name) || rename.count(name)) continue;
    rename[name] = if_node.outputs[j];
    direct[j] = true;
  }
  auto fresh = [&](const std::string& name) {
    std::string out = name;
    for (int k = 1; value_ids.count(out); ++k)
      out = if_node.name + "/" + name + (k > 1 ? "_" + std::to_string(k) : "");
    value_id(out);
    return out;
  };
  for (const auto& name : produced)
    if (!rename.count(name)) rename[name] = fresh(name);
  for (const auto& [name, t] : branch.initializers) {
    const std::string to = fresh(name);
    rename[name] = to;
    ValueSlot& v = values[size_t(value_id(to))];
    v.kind = ValueKind::constant;
    v.constant = t.contiguous();
    v.dtype = t.dtype();
    v.shape = t.shape();
  }
  auto renamed = [&](const std::string& name) {
    auto it = rename.find(name);
    return it == rename.end() ? name : it->second;
  };
  // The branch's nodes in an order its own values allow (what it captures is defined).
  Graph scope = branch;
  for (const auto& name : outer_scope_refs(branch)) scope.inputs.push_back(ValueInfo{name, {}, {}, {}});
  std::vector<std::unique_ptr<Node>> out;
  for (size_t bn : validate_graph(scope, context + ": " + if_node.describe())) {
    auto n = std::make_unique<Node>(branch.nodes[bn]);
    n->name = if_node.name + "/" + n->name;
    for (auto& in : n->inputs)
      if (!in.empty()) in = renamed(in);
    for (auto& o : n->outputs)
      if (!o.empty()) o = renamed(o);
    for (auto& [key, a] : n->attrs) {
      if (a.g) rename_captures(a.g, rename);
      for (auto& sub : a.graphs)
        if (sub) rename_captures(sub, rename);
    }
    out.push_back(std::move(n));
  }
  // Outputs that are outer values, initializers or repeated: an Identity gives them the
  // If output's name.
  for (size_t j = 0; j < branch.outputs.size(); ++j) {
    if (direct[j] || if_node.outputs[j].empty()) continue;
    auto n = std::make_unique<Node>();
    n->op_type = "Identity";
    n->name = if_node.name + "/" + if_node.outputs[j];
    n->inputs = {renamed(branch.outputs[j].name)};
    n->outputs = {if_node.outputs[j]};
    value_id(n->inputs[0]);
    out.push_back(std::move(n));
  }
  return out;
}

std::unique_ptr<SubgraphPlan> Session::Impl::compile_subgraph(const Node& node, const std::string& attr,
                                                              const std::vector<NodeInputInfo>& formal) {
  const Attribute* a = node.attr(attr);
  check(a && a->kind == Attribute::Kind::g && a->g, ErrorCode::invalid_model,
        node.describe() + ": attribute '" + attr + "' is missing or not a graph");
  const Graph& body = *a->g;
  auto sub = std::make_unique<Impl>();
  sub->options = options;
  sub->context = context + ": " + node.describe() + " " + attr;
  Model& m = sub->model;
  m.ir_version = model.ir_version;
  m.opsets = model.opsets;
  m.graph = body;
  for (size_t k = 0; k < formal.size() && k < m.graph.inputs.size(); ++k) {
    ValueInfo& vi = m.graph.inputs[k];
    if (formal[k].dtype) vi.dtype = formal[k].dtype;
    if (formal[k].shape) {
      std::vector<Dim> dims(formal[k].shape->size());
      for (size_t d = 0; d < dims.size(); ++d) dims[d].value = (*formal[k].shape)[d];
      vi.shape = std::move(dims);
    }
  }
  const int num_formal = int(m.graph.inputs.size());
  const std::vector<std::string> node_caps = node_captures(node);
  std::vector<int> capture_index;
  for (const auto& name : outer_scope_refs(body)) {
    const ValueSlot* v = find_value(name);
    check(v != nullptr, ErrorCode::internal, sub->context + ": captured value '" + name + "' is unknown");
    if (v->kind == ValueKind::constant && v->constant.defined()) {
      m.graph.initializers[name] = v->constant;
      continue;
    }
    ValueInfo vi;
    vi.name = name;
    vi.dtype = v->dtype;
    if (v->shape) {
      std::vector<Dim> dims(v->shape->size());
      for (size_t d = 0; d < dims.size(); ++d) dims[d].value = (*v->shape)[d];
      vi.shape = std::move(dims);
    }
    m.graph.inputs.push_back(std::move(vi));
    capture_index.push_back(int(std::find(node_caps.begin(), node_caps.end(), name) - node_caps.begin()));
  }
  sub->compile();
  stats.subgraph_plans += 1 + sub->stats.subgraph_plans;
  return std::make_unique<CompiledSubgraph>(std::move(sub), this, std::move(capture_index), attr,
                                            num_formal);
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
  g.float16_in_float32 = registries.front() == &cpu_kernel_registry();
  g.int8_kernels = g.float16_in_float32;
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
    resolve_view(step);
    if (has_subgraph(node)) {
      step.subgraphs = true;
      for (const auto& c : node_captures(node)) step.captures.push_back(value_id(c));
    }
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
    step.outs.resize(node.outputs.size());
    max_step_inputs = std::max(max_step_inputs, step.inputs.size());
    max_step_outputs = std::max(max_step_outputs, step.outputs.size());
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
  for (int id = 0; id < int(values.size()); ++id)
    if (values[size_t(id)].kind == ValueKind::constant && values[size_t(id)].constant.defined())
      constant_ids.push_back(id);
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

void Session::Impl::resolve_view(Step& step) {
  const Node& node = *step.node;
  bool same_shape = false;
  const int k = step.kernel ? step.kernel->view_input(0, &same_shape) : -1;
  if (k < 0 || size_t(k) >= step.inputs.size() || step.inputs[size_t(k)] < 0 || node.outputs.empty() ||
      node.outputs[0].empty())
    return;
  for (size_t o = 1; o < node.outputs.size(); ++o)
    if (!node.outputs[o].empty()) return;
  const int src = step.inputs[size_t(k)];
  ValueSlot& in = values[size_t(src)];
  ValueSlot& out = values[size_t(value_id(node.outputs[0]))];
  const bool fixed = in.dtype && in.shape && out.dtype && out.shape && *in.dtype == *out.dtype &&
                     shape_numel(*in.shape) == shape_numel(*out.shape);
  if (!fixed && !same_shape) return;
  step.view_of = src;
  step.same_shape = same_shape || *in.shape == *out.shape;
  out.alias_of = src;
}

void Session::Impl::plan_views() {
  for (Step& step : steps) {
    if (step.view_of < 0 || step.same_shape) continue;
    int root = step.view_of;
    while (values[size_t(root)].alias_of >= 0) root = values[size_t(root)].alias_of;
    const Tensor& place = values[size_t(root)].planned;
    const ValueSlot& out = values[size_t(step.outputs[0])];
    if (place.defined()) step.view = Tensor::borrow(*out.dtype, *out.shape, place.raw_data(), arena);
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

namespace {

// What a value's declared ONNX type says about its kind.
enum class DeclaredKind { any, tensor, sequence, optional };

DeclaredKind declared_kind(const ValueInfo& vi) {
  if (vi.onnx_type.rfind("seq(", 0) == 0) return DeclaredKind::sequence;
  if (vi.onnx_type.rfind("optional(", 0) == 0) return DeclaredKind::optional;
  return vi.dtype ? DeclaredKind::tensor : DeclaredKind::any;
}

// A value that contradicts its input's declared type is invalid_argument naming the input.
// An optional input also takes a plain tensor or sequence (what it would hold).
void check_declared(const ValueInfo& vi, const Value& v) {
  if (!v.defined())
    throw Error(ErrorCode::invalid_argument, "input '" + vi.name + "': tensor is undefined");
  bool ok = true;
  switch (declared_kind(vi)) {
    case DeclaredKind::any:
    case DeclaredKind::optional:
      break;
    case DeclaredKind::sequence:
      ok = v.is_sequence();
      break;
    case DeclaredKind::tensor:
      ok = v.is_tensor() && *vi.dtype == v.tensor().dtype();
      if (ok && vi.shape) {
        const Shape& shape = v.tensor().shape();
        ok = vi.shape->size() == shape.size();
        for (size_t d = 0; ok && d < shape.size(); ++d)
          if ((*vi.shape)[d].is_fixed() && (*vi.shape)[d].value != shape[d]) ok = false;
      }
      break;
  }
  if (!ok)
    throw Error(ErrorCode::invalid_argument,
                "input '" + vi.name + "': expected " + vi.describe() + ", got " + v.describe());
}

}  // namespace

template <typename Map>
std::vector<Value> Session::Impl::feeds_from(const Map& inputs) const {
  std::vector<Value> feeds(input_ids.size());
  for (const auto& [name, given] : inputs) {
    auto it = input_positions.find(name);
    if (it == input_positions.end()) {
      std::vector<std::string> names, optional;
      for (const auto& vi : graph.inputs) names.push_back(vi.name);
      for (const auto& vi : graph.overridable_inputs) optional.push_back(vi.name);
      throw Error(ErrorCode::invalid_argument,
                  "unknown input '" + name + "' (model inputs: " + join(names) +
                      (optional.empty() ? "" : "; overridable initializers: " + join(optional)) +
                      ")");
    }
    feeds[it->second] = Value(given);
    if (!feeds[it->second].defined())
      throw Error(ErrorCode::invalid_argument, "input '" + name + "': tensor is undefined");
  }
  for (size_t k = 0; k < graph.inputs.size(); ++k)
    if (!feeds[k].defined())
      throw Error(ErrorCode::invalid_argument, "missing input '" + graph.inputs[k].name +
                                                   "' (expected " + graph.inputs[k].describe() + ")");
  check_feeds(feeds);
  return feeds;
}

void Session::Impl::check_feeds(const std::vector<Value>& feeds) const {
  size_t k = 0;
  for (const auto* list : {&graph.inputs, &graph.overridable_inputs})
    for (const auto& vi : *list) {
      const Value& f = feeds[k++];
      if (f.defined() || list == &graph.inputs) check_declared(vi, f);
    }
}

std::vector<int> Session::Impl::output_positions(const std::vector<std::string>& names) const {
  std::vector<int> wanted;
  if (names.empty()) {
    for (size_t k = 0; k < graph.outputs.size(); ++k) wanted.push_back(int(k));
    return wanted;
  }
  for (const auto& name : names) {
    auto pos = std::find_if(graph.outputs.begin(), graph.outputs.end(),
                            [&](const ValueInfo& vi) { return vi.name == name; });
    if (pos == graph.outputs.end()) {
      std::vector<std::string> all;
      for (const auto& vi : graph.outputs) all.push_back(vi.name);
      throw Error(ErrorCode::invalid_argument,
                  "unknown output '" + name + "' (model outputs: " + join(all) + ")");
    }
    wanted.push_back(int(pos - graph.outputs.begin()));
  }
  return wanted;
}

std::vector<Value> Session::Impl::execute(std::vector<Value> feeds, const std::vector<int>& wanted,
                                          bool partial, bool top_level) {
  RunState& rs = run_state;
  // When only some outputs are wanted, skip the steps none of them depends on.
  std::vector<char>& skip = rs.skip;
  skip.assign(steps.size(), 0);
  if (partial) {
    std::vector<char> needed(values.size(), 0);
    for (int k : wanted) needed[size_t(output_ids[size_t(k)])] = 1;
    for (size_t s = steps.size(); s-- > 0;) {
      bool live = false;
      for (int id : steps[s].outputs) live = live || (id >= 0 && needed[size_t(id)]);
      skip[s] = !live;
      if (live)
        for (int id : steps[s].uses) needed[size_t(id)] = 1;
    }
  }

  // Per-run state: the values this run produced or was given, and the tensors among them
  // (constants are read straight from the plan).
  std::vector<Value>& held = rs.held;
  std::vector<const Tensor*>& ref = rs.ref;
  held.resize(values.size());  // all undefined: each run lets go of what it held
  ref.assign(values.size(), nullptr);
  // What the run still holds is let go when it ends, also when a kernel throws.
  struct Release {
    std::vector<Value>& held;
    ~Release() {
      for (auto& v : held)
        if (v.defined()) v = Value();
    }
  } release_at_end{held};
  std::vector<const Storage*> caller_storages;  // a few: searched only for the outputs
  for (int id : constant_ids) ref[size_t(id)] = &values[size_t(id)].constant;
  auto hold = [&](int id, Value value) {
    held[size_t(id)] = std::move(value);
    ref[size_t(id)] = held[size_t(id)].is_tensor() ? &held[size_t(id)].tensor() : nullptr;
  };
  auto release_values = [&](const Step& step) {
    for (int id : step.release) {
      ref[size_t(id)] = nullptr;
      if (held[size_t(id)].defined()) held[size_t(id)] = Value();
    }
  };
  for (size_t k = 0; k < feeds.size(); ++k) {
    const int id = input_ids[k];
    if (!feeds[k].defined()) {  // an overridable input left at its initializer
      auto it = model.graph.initializers.find(values[size_t(id)].name);
      if (it != model.graph.initializers.end()) hold(id, it->second.contiguous());
      continue;
    }
    if (top_level)
      feeds[k].map_tensors([&](const Tensor& t) {
        caller_storages.push_back(t.storage().get());
        return t;
      });
    if (feeds[k].is_tensor() && feeds[k].tensor().is_contiguous())
      hold(id, std::move(feeds[k]));
    else
      hold(id, feeds[k].map_tensors([](const Tensor& t) { return t.contiguous(); }));
  }

  ThreadPool& pool = default_thread_pool();
  std::vector<const Tensor*>& ins = rs.ins;
  // The non-tensor channel: entries are null (undefined) except while a step that has
  // such inputs (outputs) runs, so tensor steps do not touch them.
  std::vector<const Value*>& value_ins = rs.value_ins;
  std::vector<Value>& value_outs = rs.value_outs;
  std::vector<Value>& captured = rs.captured;
  value_ins.assign(max_step_inputs, nullptr);
  value_outs.assign(max_step_outputs, Value());
  for (size_t s = 0; s < steps.size(); ++s) {
    Step& step = steps[s];
    const Node& node = *step.node;
    if (skip[s]) {
      release_values(step);
      continue;
    }
    if (step.view_of >= 0) {  // no kernel runs (resolve_view)
      const Tensor* src = ref[size_t(step.view_of)];
      const int out = step.outputs[0];
      const ValueSlot& v = values[size_t(out)];
      if (!src) {
        // not a tensor: the kernel handles it or says why
      } else if (step.same_shape && !v.graph_output) {
        ref[size_t(out)] = src;  // the source's lifetime covers the view's
      } else if (step.same_shape) {
        hold(out, *src);  // the source may be released before the outputs are collected
      } else if (step.view.defined() && src->raw_data() == step.view.raw_data()) {
        ref[size_t(out)] = &step.view;
      } else if (src->numel() == shape_numel(*v.shape)) {
        hold(out, src->view(*v.shape, contiguous_strides(*v.shape), 0));
      } else {
        src = nullptr;
      }
      if (src) {
        release_values(step);
        continue;
      }
    }
    ins.assign(step.inputs.size(), nullptr);
    bool value_inputs = false;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int id = step.inputs[k];
      if (id < 0) continue;
      if (ref[size_t(id)] && ref[size_t(id)]->defined()) {
        ins[k] = ref[size_t(id)];
      } else if (held[size_t(id)].defined()) {
        value_ins[k] = &held[size_t(id)];
        value_inputs = true;
      } else {
        throw Error(ErrorCode::internal,
                    node.describe() + ": input '" + node.inputs[k] + "' has no value");
      }
    }
    if (step.subgraphs) {
      captured.clear();
      for (int id : step.captures)
        captured.push_back(ref[size_t(id)] ? Value(*ref[size_t(id)]) : held[size_t(id)]);
    }
    std::vector<Tensor>& outs = step.outs;
    try {
      KernelContext ctx(node, ins, &outs, &step.planned, &pool);
      ctx.set_values(&value_ins, &value_outs, &captured);
      // A node with subgraphs is timed through its subgraphs' nodes.
      if (profiler && !step.subgraphs) {
        const auto t0 = std::chrono::steady_clock::now();
        step.kernel->compute(ctx);
        (*profiler)(node, step.provider, t0, std::chrono::steady_clock::now());
      } else {
        step.kernel->compute(ctx);
      }
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::resource_exhausted, node.describe() + ": out of memory");
    }
    if (value_inputs) std::fill(value_ins.begin(), value_ins.begin() + std::ptrdiff_t(step.inputs.size()), nullptr);
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      const int id = step.outputs[o];
      if (value_outs[o].defined()) {
        // A sequence or optional outlives the step: it must not keep arena bytes that
        // later steps reuse.
        Value v = std::move(value_outs[o]);
        value_outs[o] = Value();
        if (id >= 0) hold(id, v.map_tensors([&](const Tensor& t) { return in_arena(t) ? t.clone() : t; }));
        continue;
      }
      Tensor& t = outs[o];
      const bool in_place = is_place(t, step.planned[o]);
      if (id < 0) {
        if (!in_place) t = Tensor();
        continue;
      }
      if (in_place) {  // nothing to check or move
        ref[size_t(id)] = &t;
        continue;
      }
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
      hold(id, std::move(t));
    }
    release_values(step);
  }

  std::vector<Value> result;
  result.reserve(wanted.size());
  std::vector<const Storage*> returned;  // a top-level run's outputs share no memory either
  for (int k : wanted) {
    const int id = output_ids[size_t(k)];
    const ValueSlot& v = values[size_t(id)];
    Value out = ref[size_t(id)] ? Value(*ref[size_t(id)]) : held[size_t(id)];
    if (!out.defined())
      throw Error(ErrorCode::internal, context + ": output '" + v.name + "' was not produced");
    // Outputs never share the arena or a constant, and the caller's get none of its
    // inputs' memory (nor of each other: views) either; a subgraph passes its inputs on
    // as they are.
    const bool input = v.kind == ValueKind::input;
    auto shared = [&](const Tensor& t) {
      const Storage* st = t.storage().get();
      return in_arena(t) || constant_storages.count(st) ||
             (top_level && (input || std::count(caller_storages.begin(), caller_storages.end(), st) ||
                            std::count(returned.begin(), returned.end(), st)));
    };
    auto own = [&](const Tensor& t) {
      Tensor o = shared(t) ? t.clone() : t;
      if (top_level) returned.push_back(o.storage().get());
      return o;
    };
    out = out.is_tensor() ? Value(own(out.tensor())) : out.map_tensors(own);
    result.push_back(std::move(out));
  }
  return result;
}

std::vector<Value> CompiledSubgraph::run(const KernelContext& ctx, std::vector<Value> inputs) {
  if (int(inputs.size()) != num_formal_)
    ctx.fail(ErrorCode::invalid_model, attr_ + " declares " + std::to_string(num_formal_) +
                                           " inputs, the node gives it " + std::to_string(inputs.size()));
  for (int k : capture_index_) inputs.push_back(ctx.captures()[size_t(k)]);
  try {
    plan_->check_feeds(inputs);
    Session::Impl* target = plan_->plan_for(inputs);
    target->profiler = parent_->profiler;
    return target->execute(std::move(inputs), all_outputs_, false, false);
  } catch (const Error& e) {
    throw Error(e.code(), ctx.node().describe() + " " + attr_ + ": " + e.what());
  }
}

int CompiledSubgraph::num_outputs() const { return int(plan_->graph.outputs.size()); }

std::optional<DType> CompiledSubgraph::output_dtype(int i) const {
  const ValueInfo& vi = plan_->graph.outputs[size_t(i)];
  const ValueSlot* v = plan_->find_value(vi.name);
  return v && v->dtype ? v->dtype : vi.dtype;
}

std::optional<Shape> CompiledSubgraph::output_shape(int i) const {
  const ValueSlot* v = plan_->find_value(plan_->graph.outputs[size_t(i)].name);
  return v ? v->shape : std::nullopt;
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
  const std::vector<int> wanted = impl_->output_positions(output_names);
  std::vector<Value> outs = impl_->run_feeds(impl_->feeds_from(inputs), wanted, !output_names.empty());
  TensorMap result;
  for (size_t k = 0; k < wanted.size(); ++k) {
    const std::string& name = impl_->graph.outputs[size_t(wanted[k])].name;
    if (!outs[k].is_tensor())
      throw Error(ErrorCode::invalid_argument, "output '" + name + "' is " + outs[k].describe() +
                                                   ", not a tensor: Session::run_values returns it");
    result[name] = std::move(outs[k].tensor());
  }
  return result;
}

ValueMap Session::run_values(const ValueMap& inputs, const std::vector<std::string>& output_names) {
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  const std::vector<int> wanted = impl_->output_positions(output_names);
  std::vector<Value> outs = impl_->run_feeds(impl_->feeds_from(inputs), wanted, !output_names.empty());
  ValueMap result;
  for (size_t k = 0; k < wanted.size(); ++k)
    result[impl_->graph.outputs[size_t(wanted[k])].name] = std::move(outs[k]);
  return result;
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
