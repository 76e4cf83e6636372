#include "slim/onnx/exporter.h"

#include <onnx/onnx_pb.h>

#include <fstream>
#include <map>
#include <set>

#include "function_inliner.h"
#include "proto_graph.h"
#include "proto_tensor.h"
#include "slim/core/error.h"
#include "slim/core/mapped_file.h"

namespace slim {

namespace {

std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

onnx::ValueInfoProto value_info_proto(const ValueInfo& v) {
  onnx::ValueInfoProto p;
  p.set_name(v.name);
  if (!v.dtype) return p;
  auto* tt = p.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx_elem_type(*v.dtype));
  if (!v.shape) return p;
  auto* shape = tt->mutable_shape();
  for (const auto& d : *v.shape) {
    auto* dim = shape->add_dim();
    if (d.is_fixed())
      dim->set_dim_value(d.value);
    else if (!d.param.empty())
      dim->set_dim_param(d.param);
  }
  return p;
}

// Attributes the IR holds in full; graphs and types are only ever copied from a template.
bool is_plain_attribute(const Attribute& a) {
  return a.kind != Attribute::Kind::g && a.kind != Attribute::Kind::graphs &&
         a.kind != Attribute::Kind::type;
}

onnx::AttributeProto attribute_proto(const std::string& key, const Attribute& a) {
  using AP = onnx::AttributeProto;
  AP p;
  p.set_name(key);
  switch (a.kind) {
    case Attribute::Kind::f:
      p.set_type(AP::FLOAT);
      p.set_f(a.f);
      break;
    case Attribute::Kind::i:
      p.set_type(AP::INT);
      p.set_i(a.i);
      break;
    case Attribute::Kind::s:
      p.set_type(AP::STRING);
      p.set_s(a.s);
      break;
    case Attribute::Kind::t:
      p.set_type(AP::TENSOR);
      *p.mutable_t() = tensor_to_proto(a.t, "");
      break;
    case Attribute::Kind::floats:
      p.set_type(AP::FLOATS);
      for (float v : a.floats) p.add_floats(v);
      break;
    case Attribute::Kind::ints:
      p.set_type(AP::INTS);
      for (int64_t v : a.ints) p.add_ints(v);
      break;
    case Attribute::Kind::strings:
      p.set_type(AP::STRINGS);
      for (const auto& v : a.strings) p.add_strings(v);
      break;
    case Attribute::Kind::tensors:
      p.set_type(AP::TENSORS);
      for (const auto& t : a.tensors) *p.add_tensors() = tensor_to_proto(t, "");
      break;
    default:
      break;
  }
  return p;
}

// The template's node with the IR node's inputs, outputs and plain attributes; or, with
// no template node, the IR node converted.
onnx::NodeProto node_proto(const Node& n, const onnx::NodeProto* tmpl, const std::string& file) {
  onnx::NodeProto p;
  if (tmpl) {
    p = *tmpl;
    p.clear_input();
    p.clear_output();
    p.clear_attribute();
    for (const auto& ap : tmpl->attribute()) {
      auto it = n.attrs.find(ap.name());
      if (it == n.attrs.end()) continue;  // the IR dropped it
      *p.add_attribute() =
          is_plain_attribute(it->second) ? attribute_proto(it->first, it->second) : ap;
    }
    for (const auto& [key, a] : n.attrs) {
      bool in_template = false;
      for (const auto& ap : tmpl->attribute()) in_template |= ap.name() == key;
      if (in_template) continue;
      check(is_plain_attribute(a), ErrorCode::unsupported,
            file + ": " + n.describe() + " attribute " + in_quotes(key) +
                " cannot be written (a new graph or type)");
      *p.add_attribute() = attribute_proto(key, a);
    }
  } else {
    p.set_name(n.name);
    p.set_op_type(n.op_type);
    if (!n.domain.empty()) p.set_domain(n.domain);
    for (const auto& [key, a] : n.attrs) {
      check(is_plain_attribute(a), ErrorCode::unsupported,
            file + ": " + n.describe() + " attribute " + in_quotes(key) +
                " cannot be written (a subgraph or type of a node not in the source file)");
      *p.add_attribute() = attribute_proto(key, a);
    }
  }
  for (const auto& v : n.inputs) p.add_input(v);
  for (const auto& v : n.outputs) p.add_output(v);
  return p;
}

onnx::ModelProto load_template(const Model& model) {
  onnx::ModelProto proto;
  if (model.path.empty()) return proto;
  auto file = MappedFile::open(model.path);
  check(parse_large(proto, file->data(), file->size()), ErrorCode::invalid_model,
        model.path + ": cannot parse as an ONNX model (truncated, corrupt or not a protobuf)");
  // The IR saw the main graph with local functions expanded; its node names refer to that.
  std::map<std::string, int64_t> opsets;
  inline_local_functions(proto, opsets, model.path);
  return proto;
}

}  // namespace

void OnnxExporter::save_file(const Model& model, const std::string& path) {
  onnx::ModelProto proto = load_template(model);
  const bool has_template = proto.has_graph();
  const Graph& g = model.graph;
  onnx::GraphProto tmpl = proto.graph();
  onnx::GraphProto& out = *proto.mutable_graph();
  out.clear_node();
  out.clear_initializer();
  out.clear_sparse_initializer();
  out.clear_input();
  out.clear_output();
  out.clear_value_info();
  if (!has_template) {
    proto.set_producer_name(model.producer_name);
    proto.set_producer_version(model.producer_version);
    proto.set_doc_string(model.doc_string);
    out.set_name(g.name);
  }
  proto.set_ir_version(model.ir_version);
  proto.clear_opset_import();
  for (const auto& [domain, version] : model.opsets) {
    auto* op = proto.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }

  std::map<std::string, const onnx::NodeProto*> tmpl_nodes;
  const std::vector<std::string> names = graph_node_names(tmpl);
  for (int i = 0; i < tmpl.node_size(); ++i) tmpl_nodes[names[size_t(i)]] = &tmpl.node(i);
  std::set<std::string> used;  // values the new graph's nodes read or write
  for (const auto& n : g.nodes) {
    auto it = tmpl_nodes.find(n.name);
    const onnx::NodeProto* t = nullptr;
    if (it != tmpl_nodes.end() && it->second->op_type() == n.op_type &&
        (it->second->domain() == n.domain ||
         (n.domain.empty() && it->second->domain() == "ai.onnx")))
      t = it->second;
    *out.add_node() = node_proto(n, t, path);
    used.insert(n.inputs.begin(), n.inputs.end());
    used.insert(n.outputs.begin(), n.outputs.end());
  }
  for (const auto& [name, t] : g.initializers) *out.add_initializer() = tensor_to_proto(t, name);

  std::map<std::string, const onnx::ValueInfoProto*> tmpl_values;
  for (const auto& v : tmpl.value_info()) tmpl_values[v.name()] = &v;
  for (const auto& v : tmpl.output()) tmpl_values[v.name()] = &v;
  std::set<std::string> inputs;
  for (const auto* list : {&g.inputs, &g.overridable_inputs})
    for (const auto& v : *list) inputs.insert(v.name);
  for (const auto& v : tmpl.input())
    if (inputs.erase(v.name())) *out.add_input() = v;
  for (const auto* list : {&g.inputs, &g.overridable_inputs})
    for (const auto& v : *list)
      if (inputs.count(v.name)) *out.add_input() = value_info_proto(v);
  std::set<std::string> outputs;
  for (const auto& v : g.outputs) {
    auto it = tmpl_values.find(v.name);
    *out.add_output() = it != tmpl_values.end() ? *it->second : value_info_proto(v);
    outputs.insert(v.name);
  }
  std::set<std::string> described;
  for (const auto& v : tmpl.value_info())
    if (used.count(v.name()) && !outputs.count(v.name()) && described.insert(v.name()).second)
      *out.add_value_info() = v;
  for (const auto& v : g.value_info)
    if (used.count(v.name) && !outputs.count(v.name) && described.insert(v.name).second)
      *out.add_value_info() = value_info_proto(v);

  const size_t bytes = proto.ByteSizeLong();
  check(bytes <= size_t(INT_MAX), ErrorCode::unsupported,
        path + ": the model would be " + std::to_string(bytes) +
            " bytes, over protobuf's 2 GiB limit");
  std::string data;
  check(proto.SerializeToString(&data), ErrorCode::internal, path + ": cannot serialize the model");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  check(bool(f), ErrorCode::not_found, path + ": cannot open for writing");
  f.write(data.data(), std::streamsize(data.size()));
  f.close();
  check(bool(f), ErrorCode::internal, path + ": write failed");
}

}  // namespace slim
