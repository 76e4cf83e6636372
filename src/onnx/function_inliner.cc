#include "function_inliner.h"

#include <algorithm>
#include <set>

#include "slim/core/error.h"

namespace slim {

namespace {

std::string normalized(const std::string& domain) { return domain == "ai.onnx" ? "" : domain; }
std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// Bounds nesting of calls; a function that calls itself would otherwise expand forever.
constexpr int kMaxCallDepth = 64;
// Bounds the expanded size: calls that fan out at every level grow exponentially, so
// the size is computed before anything is expanded.
constexpr int64_t kMaxInlinedNodes = int64_t(1) << 20;

using Key = std::pair<std::string, std::string>;  // (normalized domain, name)
using Rename = std::map<std::string, std::string>;

void collect_names(const onnx::GraphProto& g, std::set<std::string>& names) {
  for (const auto& v : g.input()) names.insert(v.name());
  for (const auto& v : g.output()) names.insert(v.name());
  for (const auto& t : g.initializer()) names.insert(t.name());
  for (const auto& n : g.node()) {
    names.insert(n.input().begin(), n.input().end());
    names.insert(n.output().begin(), n.output().end());
    if (!n.name().empty()) names.insert(n.name());
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_names(a.g(), names);
      for (const auto& sub : a.graphs()) collect_names(sub, names);
    }
  }
}

class Inliner {
 public:
  Inliner(onnx::ModelProto& model, const std::string& file) : file_(file) {
    for (const auto& f : model.functions()) {
      const Key key{normalized(f.domain()), f.name()};
      check(!f.name().empty(), ErrorCode::invalid_model, file + ": a model-local function has no name");
      check(functions_.emplace(key, &f).second, ErrorCode::invalid_model,
            file + ": function " + in_quotes(f.domain() + "." + f.name()) + " is defined twice");
    }
    if (!functions_.empty()) collect_names(model.graph(), used_);
  }

  bool empty() const { return functions_.empty(); }

  // Node count of a graph once every call is expanded, saturating just above the limit.
  int64_t expanded_size(const onnx::GraphProto& g) {
    int64_t total = 0;
    for (const auto& n : g.node()) total = std::min(total + expanded_size(n), kMaxInlinedNodes + 1);
    return total;
  }
  const std::map<Key, const onnx::FunctionProto*>& functions() const { return functions_; }

  // Replaces each call in `g` (and in its subgraphs) by the function's body.
  void inline_graph(onnx::GraphProto& g, int depth) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
    for (auto& node : *g.mutable_node()) {
      for (auto& a : *node.mutable_attribute()) {
        if (a.has_g()) inline_graph(*a.mutable_g(), depth);
        for (auto& sub : *a.mutable_graphs()) inline_graph(sub, depth);
      }
      auto it = functions_.find({normalized(node.domain()), node.op_type()});
      if (it == functions_.end()) {
        *out.Add() = std::move(node);
      } else {
        expand(node, *it->second, out, depth);
      }
    }
    g.mutable_node()->Swap(&out);
  }

 private:
  int64_t expanded_size(const onnx::NodeProto& n) {
    auto it = functions_.find({normalized(n.domain()), n.op_type()});
    if (it != functions_.end()) return expanded_size(*it->second);
    int64_t total = 1;
    for (const auto& a : n.attribute()) {
      if (a.has_g()) total += expanded_size(a.g());
      for (const auto& sub : a.graphs()) total += expanded_size(sub);
      total = std::min(total, kMaxInlinedNodes + 1);
    }
    return total;
  }

  int64_t expanded_size(const onnx::FunctionProto& fn) {
    auto [it, inserted] = size_.emplace(&fn, -1);
    if (!inserted) {
      check(it->second >= 0, ErrorCode::invalid_model,
            file_ + ": function " + in_quotes(fn.domain() + "." + fn.name()) +
                " calls itself (recursive functions cannot be inlined)");
      return it->second;
    }
    check(++depth_ <= kMaxCallDepth, ErrorCode::invalid_model,
          file_ + ": function " + in_quotes(fn.domain() + "." + fn.name()) + " nests calls more than " +
              std::to_string(kMaxCallDepth) + " deep");
    int64_t total = 0;
    for (const auto& n : fn.node()) total = std::min(total + expanded_size(n), kMaxInlinedNodes + 1);
    --depth_;
    size_[&fn] = total;
    return total;
  }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; used_.count(name); ++k) name = base + "_" + std::to_string(k);
    used_.insert(name);
    return name;
  }

  // Renames the values a subgraph inside a body reads from the body's scope; values
  // the subgraph defines itself keep their names.
  static void rename_in_subgraph(onnx::GraphProto& g, const Rename& rename) {
    std::set<std::string> local;
    for (const auto& v : g.input()) local.insert(v.name());
    for (const auto& t : g.initializer()) local.insert(t.name());
    for (const auto& n : g.node()) local.insert(n.output().begin(), n.output().end());
    auto apply = [&](std::string* name) {
      if (local.count(*name)) return;
      auto it = rename.find(*name);
      if (it != rename.end()) *name = it->second;
    };
    for (auto& n : *g.mutable_node()) {
      for (auto& in : *n.mutable_input()) apply(&in);
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) rename_in_subgraph(*a.mutable_g(), rename);
        for (auto& sub : *a.mutable_graphs()) rename_in_subgraph(sub, rename);
      }
    }
    for (auto& v : *g.mutable_output()) apply(v.mutable_name());
  }

  // Attributes that refer to the function's own attributes take the caller's value; a
  // reference the caller does not set leaves the attribute unset (the op's default).
  static void substitute_attributes(onnx::NodeProto& n, const onnx::NodeProto& call) {
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> kept;
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) substitute_in_graph(*a.mutable_g(), call);
      for (auto& sub : *a.mutable_graphs()) substitute_in_graph(sub, call);
      if (a.ref_attr_name().empty()) {
        *kept.Add() = std::move(a);
        continue;
      }
      for (const auto& given : call.attribute())
        if (given.name() == a.ref_attr_name()) {
          onnx::AttributeProto* copy = kept.Add();
          *copy = given;
          copy->set_name(a.name());
          break;
        }
    }
    n.mutable_attribute()->Swap(&kept);
  }

  static void substitute_in_graph(onnx::GraphProto& g, const onnx::NodeProto& call) {
    for (auto& n : *g.mutable_node()) substitute_attributes(n, call);
  }

  void expand(const onnx::NodeProto& call, const onnx::FunctionProto& fn,
              google::protobuf::RepeatedPtrField<onnx::NodeProto>& out, int depth) {
    const std::string fn_name = in_quotes((fn.domain().empty() ? "" : fn.domain() + ".") + fn.name());
    const std::string what = file_ + ": " + call.op_type() + " node " + in_quotes(call.name()) +
                             " (a call of function " + fn_name + ")";
    check(depth < kMaxCallDepth, ErrorCode::invalid_model,
          what + ": functions nest more than " + std::to_string(kMaxCallDepth) +
              " deep (a recursive function?)");
    check(call.input_size() <= fn.input_size(), ErrorCode::invalid_model,
          what + " passes " + std::to_string(call.input_size()) + " inputs, the function takes " +
              std::to_string(fn.input_size()));
    check(call.output_size() <= fn.output_size(), ErrorCode::invalid_model,
          what + " asks for " + std::to_string(call.output_size()) +
              " outputs, the function has " + std::to_string(fn.output_size()));
    const std::string prefix = (call.name().empty() ? fn.name() : call.name()) + "/";
    Rename rename;
    for (int k = 0; k < fn.input_size(); ++k)
      rename[fn.input(k)] = k < call.input_size() ? call.input(k) : "";
    for (int k = 0; k < fn.output_size(); ++k)
      rename[fn.output(k)] = k < call.output_size() && !call.output(k).empty()
                                 ? call.output(k)
                                 : fresh(prefix + fn.output(k));
    for (const auto& n : fn.node())
      for (const auto& o : n.output())
        if (!o.empty() && !rename.count(o)) rename[o] = fresh(prefix + o);

    for (int i = 0; i < fn.node_size(); ++i) {
      onnx::NodeProto n = fn.node(i);
      for (auto& in : *n.mutable_input()) {
        if (in.empty()) continue;
        auto it = rename.find(in);
        check(it != rename.end(), ErrorCode::invalid_model,
              what + ": body node " + in_quotes(n.name().empty() ? n.op_type() : n.name()) +
                  " reads " + in_quotes(in) +
                  ", which is neither a function input nor produced in the body");
        in = it->second;
      }
      for (auto& o : *n.mutable_output())
        if (!o.empty()) o = rename.at(o);
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) rename_in_subgraph(*a.mutable_g(), rename);
        for (auto& sub : *a.mutable_graphs()) rename_in_subgraph(sub, rename);
      }
      substitute_attributes(n, call);
      n.set_name(fresh(prefix + (n.name().empty() ? n.op_type() + "_" + std::to_string(i) : n.name())));
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) inline_graph(*a.mutable_g(), depth + 1);
        for (auto& sub : *a.mutable_graphs()) inline_graph(sub, depth + 1);
      }
      auto it = functions_.find({normalized(n.domain()), n.op_type()});
      if (it == functions_.end()) {
        *out.Add() = std::move(n);
      } else {
        expand(n, *it->second, out, depth + 1);
      }
    }
  }

  std::string file_;
  std::map<Key, const onnx::FunctionProto*> functions_;
  std::set<std::string> used_;
  std::map<const onnx::FunctionProto*, int64_t> size_;  // -1 while being computed
  int depth_ = 0;
};

}  // namespace

void inline_local_functions(onnx::ModelProto& model, std::map<std::string, int64_t>& opsets,
                            const std::string& file) {
  Inliner inliner(model, file);
  if (inliner.empty()) return;
  const int64_t nodes = inliner.expanded_size(model.graph());
  check(nodes <= kMaxInlinedNodes, ErrorCode::resource_exhausted,
        file + ": inlining the model-local functions would create more than " +
            std::to_string(kMaxInlinedNodes) + " nodes");
  // Inlined nodes are dispatched with the model's opsets, so a function must agree with
  // the model on every domain both import.
  for (const auto& [key, fn] : inliner.functions())
    for (const auto& op : fn->opset_import()) {
      const std::string domain = normalized(op.domain());
      auto [it, inserted] = opsets.emplace(domain, op.version());
      check(inserted || it->second == op.version(), ErrorCode::unsupported,
            file + ": function " + in_quotes(fn->name()) + " imports opset " +
                std::to_string(op.version()) + " of " + in_quotes(domain.empty() ? "ai.onnx" : domain) +
                ", the model opset " + std::to_string(it->second));
    }
  inliner.inline_graph(*model.mutable_graph(), 0);
}

}  // namespace slim
