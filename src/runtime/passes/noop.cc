// remove_noop_nodes: Identity, inference Dropout, Cast to the same dtype, Reshape to the
// same shape. Their readers read the input directly, which also removes a copy (or a
// view the memory planner must keep alive) per node.
#include "runtime/passes/pass_util.h"
#include "runtime/ref/math_common.h"

namespace slim {

using namespace passes;

namespace {

// The input a node passes through unchanged; "" when the node does real work.
std::string passthrough_input(const PassGraph& g, const UseIndex& index, const Node& n) {
  if (!n.domain.empty() || n.inputs.empty() || n.inputs[0].empty() || n.outputs.empty() ||
      n.outputs[0].empty())
    return "";
  const std::string& x = n.inputs[0];
  const std::string& y = n.outputs[0];
  const auto opset_it = g.opsets.find("");
  const int64_t opset = opset_it == g.opsets.end() ? 0 : opset_it->second;
  if (n.op_type == "Identity") return n.inputs.size() == 1 ? x : "";
  if (n.op_type == "Dropout") {
    // Before opset 7 Dropout ran in training mode unless is_test was set.
    if (opset < 7 && n.attr_int("is_test", 0) == 0) return "";
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Tensor* training = g.constant(n.inputs[2]);
      if (!training || training->dtype() != DType::boolean || training->numel() != 1 ||
          training->contiguous().data<bool>()[0])
        return "";
    }
    // The mask output is all true in inference; only drop the node when nobody reads it.
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty() &&
          (index.pinned(n.outputs[o]) || !index.readers(n.outputs[o]).empty()))
        return "";
    return x;
  }
  if (n.op_type == "Cast") {
    const Attribute* to = n.attr("to");
    if (!to || to->kind != Attribute::Kind::i || n.outputs.size() != 1) return "";
    DType target;
    if (!ref::onnx_dtype_to_slim(to->i, &target)) return "";
    const auto from = g.dtype_of(x);
    return from && *from == target ? x : "";
  }
  if (n.op_type == "Reshape") {
    const auto in = g.shape_of(x);
    const auto out = g.shape_of(y);
    return in && out && *in == *out ? x : "";
  }
  return "";
}

}  // namespace

int64_t remove_noop_nodes(PassGraph& g) {
  UseIndex index(g);
  int64_t rewrites = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* n = g.nodes[i].get();
    if (!n) continue;
    const std::string x = passthrough_input(g, index, *n);
    if (x.empty()) continue;
    const std::string y = n->outputs[0];
    // A graph output or a value a subgraph captures must keep its name.
    if (index.pinned(y)) continue;
    index.remove(n);
    rename_reads(index, y, x);
    remove_at(g, i);
    ++rewrites;
  }
  compact(g);
  return rewrites;
}

}  // namespace slim
