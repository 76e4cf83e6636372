#include "slim/onnx/opset_upgrade.h"

#include <limits>
#include <map>
#include <set>

#include "slim/core/error.h"

namespace slim {

namespace {

void collect_names(const Graph& g, std::set<std::string>& names) {
  for (const auto& [name, t] : g.initializers) names.insert(name);
  for (const auto* list : {&g.inputs, &g.outputs, &g.value_info, &g.overridable_inputs})
    for (const auto& v : *list) names.insert(v.name);
  for (const auto& n : g.nodes) {
    names.insert(n.inputs.begin(), n.inputs.end());
    names.insert(n.outputs.begin(), n.outputs.end());
    for (const auto& [key, a] : n.attrs) {
      if (a.g) collect_names(*a.g, names);
      for (const auto& sub : a.graphs) collect_names(*sub, names);
    }
  }
}

struct Upgrader {
  Model& model;
  int64_t from, target;
  std::set<std::string> names;

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; names.count(name); ++k) name = base + "_" + std::to_string(k);
    names.insert(name);
    return name;
  }

  [[noreturn]] void refuse(const Node& n, const std::string& why) {
    throw Error(ErrorCode::unsupported, model.path + ": cannot raise the opset from " +
                                            std::to_string(from) + " to " + std::to_string(target) +
                                            ": " + n.describe() + " " + why);
  }

  // Moves attribute `key` (when present) to input `slot` as an i64 constant; an absent
  // attribute leaves the input empty.
  void ints_to_input(Graph& g, Node& n, const std::string& key, size_t slot,
                     bool as_scalar = false) {
    if (n.inputs.size() <= slot) n.inputs.resize(slot + 1);
    auto it = n.attrs.find(key);
    if (it == n.attrs.end()) return;
    std::vector<int64_t> v = it->second.kind == Attribute::Kind::i
                                 ? std::vector<int64_t>{it->second.i}
                                 : it->second.ints;
    const std::string name = fresh(n.name + "_" + key);
    g.initializers[name] = as_scalar ? Tensor::from_vector<int64_t>({1}, v)
                                     : Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
    n.inputs[slot] = name;
    n.attrs.erase(it);
  }

  void float_to_input(Graph& g, Node& n, const std::string& key, size_t slot) {
    if (n.inputs.size() <= slot) n.inputs.resize(slot + 1);
    auto it = n.attrs.find(key);
    if (it == n.attrs.end()) return;
    const std::string name = fresh(n.name + "_" + key);
    g.initializers[name] = Tensor::scalar<float>(it->second.f);
    n.inputs[slot] = name;
    n.attrs.erase(it);
  }

  // Softmax-like ops before 13 coerce the input to 2-D at `axis` and normalize each row.
  void softmax(Graph& g, std::vector<Node>& out, Node n,
               const std::map<std::string, size_t>& ranks) {
    const int64_t axis = n.attr_int("axis", 1);
    auto r = ranks.find(n.inputs.at(0));
    if (r == ranks.end()) r = ranks.find(n.outputs.at(0));
    if (r != ranks.end() && (axis == int64_t(r->second) - 1 || axis == -1)) {
      n.attrs["axis"].kind = Attribute::Kind::i;
      n.attrs["axis"].i = -1;
      out.push_back(std::move(n));
      return;
    }
    const std::string x = n.inputs.at(0), y = n.outputs.at(0);
    Node flat{fresh(n.name + "_flatten"), "Flatten", "", {x}, {fresh(n.name + "_2d")}, {}};
    flat.attrs["axis"] = n.attrs["axis"];
    flat.attrs["axis"].kind = Attribute::Kind::i;
    flat.attrs["axis"].i = axis;
    Node shape{fresh(n.name + "_shape"), "Shape", "", {x}, {fresh(n.name + "_input_shape")}, {}};
    n.inputs = {flat.outputs[0]};
    n.outputs = {fresh(n.name + "_rows")};
    n.attrs["axis"].i = -1;
    Node back{fresh(n.name + "_reshape"), "Reshape", "", {n.outputs[0], shape.outputs[0]}, {y}, {}};
    out.push_back(std::move(flat));
    out.push_back(std::move(shape));
    out.push_back(std::move(n));
    out.push_back(std::move(back));
  }

  void graph(Graph& g) {
    std::map<std::string, size_t> ranks;
    for (const auto* list : {&g.inputs, &g.outputs, &g.value_info})
      for (const auto& v : *list)
        if (v.shape) ranks[v.name] = v.shape->size();
    std::set<std::string> read;
    for (const auto& n : g.nodes) read.insert(n.inputs.begin(), n.inputs.end());
    for (const auto& v : g.outputs) read.insert(v.name);
    std::vector<Node> out;
    out.reserve(g.nodes.size());
    for (Node& n : g.nodes) {
      for (auto& [key, a] : n.attrs) {
        if (a.g) graph(*a.g);
        for (auto& sub : a.graphs) graph(*sub);
      }
      if (!n.domain.empty()) {
        out.push_back(std::move(n));
        continue;
      }
      const std::string& op = n.op_type;
      if (op == "Slice" && from < 10) {
        ints_to_input(g, n, "starts", 1);
        ints_to_input(g, n, "ends", 2);
        ints_to_input(g, n, "axes", 3);
      } else if (op == "TopK" && from < 10) {
        ints_to_input(g, n, "k", 1, true);
      } else if (op == "Clip" && from < 11) {
        float_to_input(g, n, "min", 1);
        float_to_input(g, n, "max", 2);
      } else if (op == "Pad" && from < 11) {
        const std::string mode = n.attr_string("mode", "constant");
        ints_to_input(g, n, "pads", 1);
        if (mode == "constant") float_to_input(g, n, "value", 2);
        n.attrs.erase("value");
      } else if ((op == "Squeeze" || op == "Unsqueeze") && from < 13) {
        ints_to_input(g, n, "axes", 1);
      } else if (op == "Split" && from < 13) {
        ints_to_input(g, n, "split", 1);
      } else if (op == "ReduceSum" && from < 13) {
        ints_to_input(g, n, "axes", 1);
      } else if ((op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") && from < 13) {
        softmax(g, out, std::move(n), ranks);
        continue;
      } else if (op == "Dropout" && from < 12) {
        if (n.outputs.size() > 1 && !n.outputs[1].empty() && read.count(n.outputs[1]))
          refuse(n, "has a mask output that is read");
        n.op_type = "Identity";
        n.inputs.resize(1);
        n.outputs.resize(1);
        n.attrs.clear();
      } else if (op == "Scatter") {
        n.op_type = "ScatterElements";
      } else if (op == "BatchNormalization" && from < 9) {
        if (n.attr_int("spatial", 1) != 1) refuse(n, "has spatial=0, which opset 9 removed");
        n.attrs.erase("spatial");
      } else if (op == "Upsample" || (op == "Resize" && from < 11) || (op == "Scan" && from < 9)) {
        refuse(n, "changed meaning and has no rewrite");
      }
      while (!n.inputs.empty() && n.inputs.back().empty()) n.inputs.pop_back();
      out.push_back(std::move(n));
    }
    g.nodes = std::move(out);
  }
};

}  // namespace

void upgrade_opset(Model& model, int64_t target) {
  check(target <= 13, ErrorCode::invalid_argument,
        "upgrade_opset: target opset " + std::to_string(target) +
            " is past 13, the last this rewrite knows");
  const int64_t from = model.opset("");
  if (from >= target) return;
  check(
      from >= 7, ErrorCode::unsupported,
      model.path + ": opset " + std::to_string(from) + " is older than 7, which slim cannot raise");
  Upgrader u{model, from, target, {}};
  collect_names(model.graph, u.names);
  u.graph(model.graph);
  model.opsets[""] = target;
  // Per-axis quantization and the later operators need IR version 7 (opset 13's).
  if (target >= 13 && model.ir_version < 7) model.ir_version = 7;
}

}  // namespace slim
