// fold_shape_subgraphs: exporters compute Reshape targets at run time from Shape ->
// Gather -> Unsqueeze -> Concat chains. With static shapes those are constants; folding
// them lets later passes (and the memory planner) see fixed shapes.
#include <algorithm>
#include <unordered_set>

#include "runtime/passes/pass_util.h"
#include "slim/core/error.h"
#include "slim/core/thread_pool.h"
#include "slim/runtime/kernel.h"

namespace slim {

using namespace passes;

namespace {

// Folded outputs larger than this stay nodes: a shape subgraph produces small tensors,
// and a large one (ConstantOfShape of an activation's shape) is cheaper to compute than
// to keep as a constant.
constexpr int64_t kMaxFoldedElements = 1 << 16;

bool is_nondeterministic(const Node& n) {
  static const std::unordered_set<std::string> kOps = {"RandomNormal",     "RandomUniform",
                                                       "RandomNormalLike", "RandomUniformLike",
                                                       "Multinomial",      "Bernoulli"};
  return n.domain.empty() && kOps.count(n.op_type) != 0;
}

// Shape (with opset 15's start/end) or Size of a statically shaped input.
std::optional<Tensor> shape_value(const PassGraph& g, const Node& n) {
  if (!n.domain.empty() || n.inputs.size() != 1 || n.outputs.size() != 1) return std::nullopt;
  if (n.op_type != "Shape" && n.op_type != "Size") return std::nullopt;
  const auto shape = g.shape_of(n.inputs[0]);
  if (!shape) return std::nullopt;
  if (n.op_type == "Size") return Tensor::scalar<int64_t>(shape_numel(*shape));
  const int64_t rank = int64_t(shape->size());
  auto clamp = [&](int64_t v) {
    if (v < 0) v += rank;
    return std::clamp<int64_t>(v, 0, rank);
  };
  const int64_t start = clamp(n.attr_int("start", 0));
  const int64_t end = clamp(n.attr_int("end", rank));
  std::vector<int64_t> dims;
  for (int64_t d = start; d < end; ++d) dims.push_back((*shape)[size_t(d)]);
  return Tensor::from_vector<int64_t>({int64_t(dims.size())}, dims);
}

}  // namespace

int64_t fold_shape_subgraphs(PassGraph& g) {
  int64_t rewrites = 0;
  // Values this pass made constant: a node is folded only when it reads one of them, so
  // weight-only arithmetic stays for the Session's own constant folding.
  std::unordered_set<std::string> folded;
  const KernelRegistry& ref = ref_kernel_registry();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* n = g.nodes[i].get();
    if (!n) continue;
    if (auto v = shape_value(g, *n)) {
      g.constants[n->outputs[0]] = *v;
      folded.insert(n->outputs[0]);
      remove_at(g, i);
      ++rewrites;
      continue;
    }
    if (folded.empty() || has_subgraph(*n) || is_nondeterministic(*n)) continue;
    bool reads_folded = false, all_constant = true;
    for (const auto& in : n->inputs) {
      if (in.empty()) continue;
      if (!g.constant(in)) all_constant = false;
      if (folded.count(in)) reads_folded = true;
    }
    if (!reads_folded || !all_constant) continue;
    const auto opset_it = g.opsets.find(n->domain);
    if (opset_it == g.opsets.end()) continue;
    const KernelDef* def = ref.find(n->op_type, n->domain, opset_it->second);
    if (!def) continue;
    std::vector<const Tensor*> ins;
    for (const auto& in : n->inputs) ins.push_back(in.empty() ? nullptr : g.constant(in));
    std::vector<Tensor> outs(n->outputs.size());
    try {
      auto kernel = def->factory(*n, opset_it->second);
      KernelContext ctx(*n, ins, &outs, nullptr, &default_thread_pool());
      kernel->compute(ctx);
    } catch (const Error&) {
      // The Session folds the same node again and reports the error with its context.
      continue;
    }
    bool ok = true;
    for (size_t o = 0; o < outs.size(); ++o)
      if (!n->outputs[o].empty() && (!outs[o].defined() || outs[o].numel() > kMaxFoldedElements))
        ok = false;
    if (!ok) continue;
    for (size_t o = 0; o < outs.size(); ++o) {
      if (n->outputs[o].empty()) continue;
      // A view of an input would share its storage; constants own theirs.
      g.constants[n->outputs[o]] = outs[o].clone();
      folded.insert(n->outputs[o]);
    }
    remove_at(g, i);
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
