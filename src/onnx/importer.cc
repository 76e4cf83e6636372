#include "slim/onnx/importer.h"

#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <climits>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "slim/core/mapped_file.h"
#include "function_inliner.h"
#include "proto_graph.h"
#include "proto_tensor.h"

namespace slim {

namespace fs = std::filesystem;

bool is_known_onnx_domain(const std::string& domain) {
  return domain.empty() || domain == "ai.onnx" || domain == "ai.onnx.ml" ||
         domain == "ai.onnx.preview.training" || domain == "com.microsoft";
}

namespace {

std::string normalize_domain(const std::string& domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// Human-readable ONNX type of a value ("float", "seq(tensor(int64))"), for ValueInfo and
// for messages about values slim cannot represent.
std::string type_proto_name(const onnx::TypeProto& type, int depth = 0) {
  if (depth > 32) return "?";
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType:
      // A plain tensor value is named by its element type; nested, ONNX's own spelling.
      return depth == 0 ? onnx_elem_type_name(type.tensor_type().elem_type())
                        : "tensor(" + onnx_elem_type_name(type.tensor_type().elem_type()) + ")";
    case onnx::TypeProto::kSequenceType:
      return "seq(" + type_proto_name(type.sequence_type().elem_type(), depth + 1) + ")";
    case onnx::TypeProto::kMapType:
      return "map(" + onnx_elem_type_name(type.map_type().key_type()) + "," +
             type_proto_name(type.map_type().value_type(), depth + 1) + ")";
    case onnx::TypeProto::kOptionalType:
      return "optional(" + type_proto_name(type.optional_type().elem_type(), depth + 1) + ")";
    case onnx::TypeProto::kSparseTensorType:
      return "sparse_tensor(" + onnx_elem_type_name(type.sparse_tensor_type().elem_type()) + ")";
    case onnx::TypeProto::kOpaqueType:
      return "opaque(" + type.opaque_type().domain() + "." + type.opaque_type().name() + ")";
    default:
      return "";
  }
}

ValueInfo convert_value_info(const onnx::ValueInfoProto& p) {
  ValueInfo v;
  v.name = p.name();
  if (!p.has_type()) return v;
  v.onnx_type = type_proto_name(p.type());
  if (p.type().value_case() != onnx::TypeProto::kTensorType) return v;
  const auto& tt = p.type().tensor_type();
  v.dtype = dtype_from_onnx(tt.elem_type());
  if (!tt.has_shape()) return v;
  std::vector<Dim> dims;
  dims.reserve(size_t(tt.shape().dim_size()));
  for (const auto& d : tt.shape().dim()) {
    Dim dim;
    if (d.value_case() == onnx::TensorShapeProto::Dimension::kDimValue) {
      // Some converters write -1 for "any size"; a type annotation is only a hint, so a
      // negative dim is read as unknown rather than refusing the model.
      if (d.dim_value() >= 0) dim.value = d.dim_value();
    } else if (d.value_case() == onnx::TensorShapeProto::Dimension::kDimParam) {
      dim.param = d.dim_param();
    }
    dims.push_back(std::move(dim));
  }
  v.shape = std::move(dims);
  return v;
}

// State of one load: where messages point and where external data may come from.
struct LoadContext {
  std::string file;
  TensorSource source;
  std::map<std::string, int64_t> opsets;
  // The raw_data of the main graph's initializers, in order, when the parse kept them out
  // of the message (strip_weights); taken by the first convert_graph call.
  const std::vector<std::optional<std::string_view>>* main_raw = nullptr;
};

// ---------------------------------------------------------------------------------------
// Weights read in place. Protobuf copies every bytes field into a string of its own, so a
// model's weights would be copied twice on the way to their tensors (and, with fresh pages
// costing more than the copy, that was half of a 200 MB model's load time). This walks the
// protobuf wire format (varint key, then a varint, 8 bytes, a length-prefixed run or 4
// bytes) of ModelProto.graph (field 7) -> GraphProto.initializer (field 5) ->
// TensorProto.raw_data (field 9), and writes the message again without those raw_data
// runs, which are kept as views of the input. Anything it does not expect (groups, a bad
// length, a truncated field) makes it give up, and the model is parsed as it is, so
// protobuf reports the error.

bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t b = *p++;
    *v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

// One field: its number, wire type and payload (for a length-delimited field, the run
// after the length); [start, p) is the whole field as written.
struct WireField {
  uint64_t number = 0;
  int type = 0;
  const uint8_t* start = nullptr;
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
};

bool next_field(const uint8_t*& p, const uint8_t* end, WireField* f) {
  f->start = p;
  uint64_t key = 0, v = 0;
  if (!read_varint(p, end, &key)) return false;
  f->number = key >> 3;
  f->type = int(key & 7);
  if (f->number == 0) return false;
  switch (f->type) {
    case 0: return read_varint(p, end, &v);
    case 1:
    case 5: {
      const size_t n = f->type == 1 ? 8 : 4;
      if (size_t(end - p) < n) return false;
      p += n;
      return true;
    }
    case 2:
      if (!read_varint(p, end, &v) || v > uint64_t(end - p)) return false;
      f->payload = p;
      f->payload_size = size_t(v);
      p += v;
      return true;
    default: return false;  // groups (3, 4) and invalid types
  }
}

// Rewrites the message [p, end), replacing each length-delimited field `number` with what
// `inner` makes of its payload (false: give up).
template <typename Inner>
bool rewrite_fields(const uint8_t* p, const uint8_t* end, uint64_t number, std::string& out, Inner&& inner) {
  WireField f;
  while (p < end) {
    if (!next_field(p, end, &f)) return false;
    if (f.number != number || f.type != 2) {
      out.append(reinterpret_cast<const char*>(f.start), size_t(p - f.start));
      continue;
    }
    std::string sub;
    if (!inner(f.payload, f.payload + f.payload_size, sub)) return false;
    write_varint(out, (number << 3) | 2);
    write_varint(out, sub.size());
    out += sub;
  }
  return true;
}

bool strip_weights(const void* data, size_t size, std::string* stripped,
                   std::vector<std::optional<std::string_view>>* raws) {
  const auto* begin = static_cast<const uint8_t*>(data);
  auto tensor = [&](const uint8_t* p, const uint8_t* end, std::string& out) {
    std::optional<std::string_view> raw;
    WireField f;
    while (p < end) {
      if (!next_field(p, end, &f)) return false;
      if (f.number == 9 && f.type == 2)  // raw_data: the last one counts, as in protobuf
        raw = std::string_view(reinterpret_cast<const char*>(f.payload), f.payload_size);
      else
        out.append(reinterpret_cast<const char*>(f.start), size_t(p - f.start));
    }
    raws->push_back(raw);
    return true;
  };
  auto graph = [&](const uint8_t* p, const uint8_t* end, std::string& out) {
    return rewrite_fields(p, end, 5, out, tensor);
  };
  return rewrite_fields(begin, begin + size, 7, *stripped, graph);
}

void convert_graph(onnx::GraphProto& p, Graph& g, LoadContext& ctx, const std::string& where);

// The attributes that give a Constant node its value; exactly one must be present.
constexpr const char* kConstantValueAttrs[] = {"value",        "value_float",  "value_floats",
                                               "value_int",    "value_ints",   "value_string",
                                               "value_strings", "sparse_value"};

Attribute convert_attribute(onnx::AttributeProto& p, LoadContext& ctx, const std::string& where) {
  using AP = onnx::AttributeProto;
  const std::string what = where + " attribute " + in_quotes(p.name());
  check(p.ref_attr_name().empty(), ErrorCode::invalid_model,
        what + " refers to function attribute " + in_quotes(p.ref_attr_name()) +
            ", which is only allowed inside a function body");
  int type = p.type();
  if (type == AP::UNDEFINED) {
    // Files written before IR version 2 leave the type out; the set field tells it.
    if (p.has_f()) type = AP::FLOAT;
    else if (p.has_i()) type = AP::INT;
    else if (p.has_s()) type = AP::STRING;
    else if (p.has_t()) type = AP::TENSOR;
    else if (p.has_g()) type = AP::GRAPH;
    else if (p.has_sparse_tensor()) type = AP::SPARSE_TENSOR;
    else if (p.has_tp()) type = AP::TYPE_PROTO;
    else if (p.floats_size()) type = AP::FLOATS;
    else if (p.ints_size()) type = AP::INTS;
    else if (p.strings_size()) type = AP::STRINGS;
    else if (p.tensors_size()) type = AP::TENSORS;
    else if (p.graphs_size()) type = AP::GRAPHS;
    else if (p.sparse_tensors_size()) type = AP::SPARSE_TENSORS;
    else throw Error(ErrorCode::invalid_model, what + " has neither a type nor a value");
  }
  Attribute a;
  switch (type) {
    case AP::FLOAT: a.kind = Attribute::Kind::f; a.f = p.f(); break;
    case AP::INT: a.kind = Attribute::Kind::i; a.i = p.i(); break;
    case AP::STRING: a.kind = Attribute::Kind::s; a.s = p.s(); break;
    case AP::TENSOR:
      a.kind = Attribute::Kind::t;
      check(p.has_t(), ErrorCode::invalid_model, what + " is a tensor attribute without a tensor");
      a.t = tensor_from_proto(*p.mutable_t(), ctx.source, what);
      break;
    case AP::SPARSE_TENSOR:
      // slim has no sparse tensors; a dense copy keeps the meaning for every consumer.
      a.kind = Attribute::Kind::t;
      check(p.has_sparse_tensor(), ErrorCode::invalid_model,
            what + " is a sparse tensor attribute without a tensor");
      a.t = tensor_from_sparse_proto(*p.mutable_sparse_tensor(), ctx.source, what);
      break;
    case AP::GRAPH:
      a.kind = Attribute::Kind::g;
      check(p.has_g(), ErrorCode::invalid_model, what + " is a graph attribute without a graph");
      a.g = std::make_shared<Graph>();
      convert_graph(*p.mutable_g(), *a.g, ctx, what);
      break;
    case AP::FLOATS:
      a.kind = Attribute::Kind::floats;
      a.floats.assign(p.floats().begin(), p.floats().end());
      break;
    case AP::INTS:
      a.kind = Attribute::Kind::ints;
      a.ints.assign(p.ints().begin(), p.ints().end());
      break;
    case AP::STRINGS:
      a.kind = Attribute::Kind::strings;
      a.strings.assign(p.strings().begin(), p.strings().end());
      break;
    case AP::TENSORS:
      a.kind = Attribute::Kind::tensors;
      for (int i = 0; i < p.tensors_size(); ++i)
        a.tensors.push_back(tensor_from_proto(*p.mutable_tensors(i), ctx.source,
                                              what + " tensor " + std::to_string(i)));
      break;
    case AP::SPARSE_TENSORS:
      a.kind = Attribute::Kind::tensors;
      for (int i = 0; i < p.sparse_tensors_size(); ++i)
        a.tensors.push_back(tensor_from_sparse_proto(*p.mutable_sparse_tensors(i), ctx.source,
                                                     what + " tensor " + std::to_string(i)));
      break;
    case AP::GRAPHS:
      a.kind = Attribute::Kind::graphs;
      for (int i = 0; i < p.graphs_size(); ++i) {
        auto sub = std::make_shared<Graph>();
        convert_graph(*p.mutable_graphs(i), *sub, ctx, what + " graph " + std::to_string(i));
        a.graphs.push_back(std::move(sub));
      }
      break;
    case AP::TYPE_PROTO:
      a.kind = Attribute::Kind::type;
      check(p.has_tp(), ErrorCode::invalid_model, what + " is a type attribute without a type");
      a.s = type_proto_name(p.tp(), 1);  // spelled as ONNX does: "tensor(float)"
      break;
    case AP::TYPE_PROTOS:
      throw Error(ErrorCode::unsupported, what + " holds a list of types, which slim does not support");
    default:
      throw Error(ErrorCode::invalid_model,
                  what + " has unknown attribute type " + std::to_string(type));
  }
  return a;
}

void convert_node(onnx::NodeProto& p, Node& n, LoadContext& ctx, const std::string& where) {
  const std::string what = where + ": " + n.describe();
  check(!p.op_type().empty(), ErrorCode::invalid_model, what + " has no op_type");
  n.domain = normalize_domain(p.domain());
  check(is_known_onnx_domain(n.domain), ErrorCode::invalid_model,
        what + " has unknown domain " + in_quotes(p.domain()));
  check(ctx.opsets.count(n.domain) != 0, ErrorCode::invalid_model,
        what + " uses domain " + in_quotes(n.domain.empty() ? "ai.onnx" : n.domain) +
            ", which the model imports no opset for");
  n.inputs.assign(p.input().begin(), p.input().end());
  n.outputs.assign(p.output().begin(), p.output().end());
  const bool is_constant = n.op_type == "Constant" && n.domain.empty();
  for (int i = 0; i < p.attribute_size(); ++i) {
    onnx::AttributeProto& ap = *p.mutable_attribute(i);
    check(!ap.name().empty(), ErrorCode::invalid_model,
          what + " has an attribute without a name");
    std::string key = ap.name();
    // The runtime folds Constant nodes from their dense "value"; a sparse value is
    // densified here so that it needs no second path there.
    if (is_constant && key == "sparse_value") key = "value";
    check(n.attrs.count(key) == 0, ErrorCode::invalid_model,
          what + " has attribute " + in_quotes(key) + " twice");
    n.attrs.emplace(key, convert_attribute(ap, ctx, what));
  }
  if (is_constant) {
    int count = 0;
    for (const auto& [key, attr] : n.attrs)
      for (const char* k : kConstantValueAttrs)
        if (key == k) ++count;
    check(count == 1, ErrorCode::invalid_model,
          what + " must have exactly one value attribute, has " + std::to_string(count));
    check(n.outputs.size() == 1 && !n.outputs[0].empty(), ErrorCode::invalid_model,
          what + " must have exactly one output");
  }
}

void convert_graph(onnx::GraphProto& p, Graph& g, LoadContext& ctx, const std::string& where) {
  g.name = p.name();
  std::set<std::string> seen;
  const auto* raws = ctx.main_raw;  // only the main graph's (subgraphs are converted later)
  ctx.main_raw = nullptr;
  check(!raws || raws->size() == size_t(p.initializer_size()), ErrorCode::internal,
        where + ": " + std::to_string(p.initializer_size()) + " initializers parsed, " +
            std::to_string(raws ? raws->size() : 0) + " found in the file");
  for (int i = 0; i < p.initializer_size(); ++i) {
    onnx::TensorProto& tp = *p.mutable_initializer(i);
    check(!tp.name().empty(), ErrorCode::invalid_model,
          where + ": initializer " + std::to_string(i) + " has no name");
    const std::string what = where + ": initializer " + in_quotes(tp.name());
    check(g.initializers.count(tp.name()) == 0, ErrorCode::invalid_model,
          what + " is defined twice");
    std::string name = tp.name();
    const std::optional<std::string_view>* raw = raws ? &(*raws)[size_t(i)] : nullptr;
    g.initializers.emplace(std::move(name),
                           tensor_from_proto(tp, ctx.source, what, raw && *raw ? &**raw : nullptr));
  }
  for (int i = 0; i < p.sparse_initializer_size(); ++i) {
    onnx::SparseTensorProto& sp = *p.mutable_sparse_initializer(i);
    const std::string name = sp.values().name();
    check(!name.empty(), ErrorCode::invalid_model,
          where + ": sparse initializer " + std::to_string(i) + " has no name");
    const std::string what = where + ": sparse initializer " + in_quotes(name);
    check(g.initializers.count(name) == 0, ErrorCode::invalid_model, what + " is defined twice");
    g.initializers.emplace(name, tensor_from_sparse_proto(sp, ctx.source, what));
  }
  for (const auto& vi : p.input()) {
    check(!vi.name().empty(), ErrorCode::invalid_model, where + ": a graph input has no name");
    check(seen.insert(vi.name()).second, ErrorCode::invalid_model,
          where + ": graph input " + in_quotes(vi.name()) + " is listed twice");
    // Before IR version 4 every initializer had to be listed as an input too; such an
    // input is a default the caller may replace.
    if (g.initializers.count(vi.name()))
      g.overridable_inputs.push_back(convert_value_info(vi));
    else
      g.inputs.push_back(convert_value_info(vi));
  }
  for (const auto& vi : p.output()) {
    check(!vi.name().empty(), ErrorCode::invalid_model, where + ": a graph output has no name");
    g.outputs.push_back(convert_value_info(vi));
  }
  for (const auto& vi : p.value_info()) g.value_info.push_back(convert_value_info(vi));

  std::vector<std::string> names = graph_node_names(p);
  g.nodes.resize(size_t(p.node_size()));
  for (int i = 0; i < p.node_size(); ++i) {
    onnx::NodeProto& np = *p.mutable_node(i);
    Node& n = g.nodes[size_t(i)];
    n.op_type = np.op_type();
    n.name = std::move(names[size_t(i)]);
    convert_node(np, n, ctx, where);
  }
}

// Free values of a graph: names its nodes (and their subgraphs) read, and outputs it
// names, that nothing inside the graph defines. These are uses of the enclosing scope.
void collect_free_values(const Graph& g, std::set<std::string>& free, int depth = 0) {
  check(depth < 256, ErrorCode::invalid_model, "subgraphs are nested too deeply");
  std::set<std::string> defined;
  for (const auto& v : g.inputs) defined.insert(v.name);
  for (const auto& v : g.overridable_inputs) defined.insert(v.name);
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs) defined.insert(o);
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name)) free.insert(name);
  };
  for (const auto& n : g.nodes) {
    for (const auto& in : n.inputs) use(in);
    for (const auto& [key, a] : n.attrs) {
      std::set<std::string> inner;
      if (a.g) collect_free_values(*a.g, inner, depth + 1);
      for (const auto& sub : a.graphs)
        if (sub) collect_free_values(*sub, inner, depth + 1);
      for (const auto& name : inner) use(name);
    }
  }
  for (const auto& o : g.outputs) use(o.name);
}

// The values a subgraph may read from the graphs around it, innermost first. Chained
// instead of copied, so that many nested If/Loop bodies do not copy big name sets.
struct Scope {
  const std::set<std::string>* names = nullptr;
  const Scope* parent = nullptr;
  bool count(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent)
      if (s->names && s->names->count(name)) return true;
    return false;
  }
};

std::vector<size_t> validate_scope(const Graph& g, const std::string& context, const Scope& outer,
                                   int depth) {
  check(depth < 256, ErrorCode::invalid_model, context + ": subgraphs are nested too deeply");
  const size_t n = g.nodes.size();
  // Values that exist before any node runs.
  std::set<std::string> sources;
  for (const auto& v : g.inputs) sources.insert(v.name);
  for (const auto& v : g.overridable_inputs) sources.insert(v.name);
  for (const auto& [name, t] : g.initializers) sources.insert(name);

  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    for (const auto& o : node.outputs) {
      if (o.empty()) continue;
      check(!sources.count(o), ErrorCode::invalid_model,
            context + ": " + node.describe() + " output " + in_quotes(o) +
                " is also a graph input or initializer");
      auto [it, inserted] = producer.emplace(o, i);
      check(inserted, ErrorCode::invalid_model,
            context + ": value " + in_quotes(o) + " is produced twice, by " +
                g.nodes[it->second].describe() + " and by " + node.describe());
    }
  }

  std::vector<std::set<size_t>> deps(n);
  std::vector<std::vector<size_t>> consumers(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    std::vector<std::pair<std::string, std::string>> uses;  // (value, how it is used)
    for (const auto& in : node.inputs)
      if (!in.empty()) uses.emplace_back(in, "input");
    for (const auto& [key, a] : node.attrs) {
      std::set<std::string> inner;
      if (a.g) collect_free_values(*a.g, inner, depth + 1);
      for (const auto& sub : a.graphs)
        if (sub) collect_free_values(*sub, inner, depth + 1);
      for (const auto& name : inner) uses.emplace_back(name, "subgraph " + in_quotes(key) + " value");
    }
    for (const auto& [value, how] : uses) {
      if (sources.count(value)) continue;
      auto it = producer.find(value);
      if (it != producer.end()) {
        check(it->second != i, ErrorCode::invalid_model,
              context + ": " + node.describe() + " " + how + " " + in_quotes(value) +
                  " is its own output (a cycle)");
        if (deps[i].insert(it->second).second) consumers[it->second].push_back(i);
        continue;
      }
      if (outer.count(value)) continue;
      throw Error(ErrorCode::invalid_model,
                  context + ": " + node.describe() + " " + how + " " + in_quotes(value) +
                      " is not defined (no graph input, initializer or node output has that name)");
    }
  }
  for (const auto& o : g.outputs)
    check(sources.count(o.name) || producer.count(o.name) || outer.count(o.name),
          ErrorCode::invalid_model,
          context + ": graph output " + in_quotes(o.name) + " is not produced by any node");

  // Kahn's algorithm with the smallest ready index first, so a file already in
  // topological order keeps its order.
  std::vector<size_t> pending(n);
  std::set<size_t> ready;
  for (size_t i = 0; i < n; ++i) {
    pending[i] = deps[i].size();
    if (pending[i] == 0) ready.insert(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(i);
    for (size_t c : consumers[i])
      if (--pending[c] == 0) ready.insert(c);
  }
  if (order.size() != n) {
    std::vector<bool> done(n, false);
    for (size_t i : order) done[i] = true;
    size_t stuck = 0;
    while (done[stuck]) ++stuck;
    std::string waits_on;
    for (size_t d : deps[stuck])
      if (!done[d]) {
        waits_on = g.nodes[d].describe();
        break;
      }
    throw Error(ErrorCode::invalid_model,
                context + ": the graph has a cycle through " + std::to_string(n - order.size()) +
                    " nodes; " + g.nodes[stuck].describe() + " waits on " + waits_on +
                    ", which depends on it");
  }

  // Subgraphs see every value of this scope (and of the scopes around it).
  bool has_subgraphs = false;
  for (const auto& node : g.nodes)
    for (const auto& [key, a] : node.attrs)
      if (a.g || !a.graphs.empty()) has_subgraphs = true;
  if (has_subgraphs) {
    std::set<std::string> local = sources;
    for (const auto& [name, i] : producer) local.insert(name);
    const Scope visible{&local, &outer};
    for (const auto& node : g.nodes)
      for (const auto& [key, a] : node.attrs) {
        const std::string where = context + ": " + node.describe() + " attribute " + in_quotes(key);
        if (a.g) validate_scope(*a.g, where, visible, depth + 1);
        for (size_t k = 0; k < a.graphs.size(); ++k)
          if (a.graphs[k])
            validate_scope(*a.graphs[k], where + " graph " + std::to_string(k), visible, depth + 1);
      }
  }
  return order;
}

Model load_model_proto(onnx::ModelProto& p, const std::string& name, const std::string& base_dir,
                       const std::vector<std::optional<std::string_view>>* main_raw = nullptr) {
  LoadContext ctx;
  ctx.main_raw = main_raw;
  ctx.file = name;
  ctx.source.file = name;
  ctx.source.base_dir = base_dir;
  check(p.ir_version() > 0, ErrorCode::invalid_model, name + ": missing or invalid ir_version");
  check(p.has_graph(), ErrorCode::invalid_model, name + ": the model has no graph");
  Model m;
  m.ir_version = p.ir_version();
  m.producer_name = p.producer_name();
  m.producer_version = p.producer_version();
  m.doc_string = p.doc_string();
  for (const auto& op : p.opset_import()) {
    const std::string domain = normalize_domain(op.domain());
    const std::string shown = domain.empty() ? "ai.onnx" : domain;
    check(op.version() >= 1, ErrorCode::invalid_model,
          name + ": opset import of " + in_quotes(shown) + " has invalid version " +
              std::to_string(op.version()));
    check(m.opsets.emplace(domain, op.version()).second, ErrorCode::invalid_model,
          name + ": domain " + in_quotes(shown) + " is imported twice");
  }
  // IR versions 1 and 2 had no opset imports; their operators are those of opset 1.
  if (p.opset_import_size() == 0 && p.ir_version() < 3) m.opsets[""] = 1;
  inline_local_functions(p, m.opsets, name);
  ctx.opsets = m.opsets;
  convert_graph(*p.mutable_graph(), m.graph, ctx, name);
  validate_graph(m.graph, name);
  return m;
}

}  // namespace

std::vector<std::string> graph_node_names(const onnx::GraphProto& graph) {
  std::set<std::string> taken;
  for (const auto& np : graph.node())
    if (!np.name().empty()) taken.insert(np.name());
  std::vector<std::string> names;
  names.reserve(size_t(graph.node_size()));
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& np = graph.node(i);
    std::string name = np.name();
    if (name.empty()) {
      // Messages and profiles need a name; "<op>_<index>" is what ONNX tools show too.
      const std::string base = (np.op_type().empty() ? "node" : np.op_type()) + "_" + std::to_string(i);
      name = base;
      for (int k = 1; taken.count(name); ++k) name = base + "_" + std::to_string(k);
      taken.insert(name);
    }
    names.push_back(std::move(name));
  }
  return names;
}

std::set<std::string> outer_scope_refs(const Graph& graph) {
  std::set<std::string> refs;
  collect_free_values(graph, refs);
  return refs;
}

Model OnnxImporter::load_bytes(const void* data, size_t size, const std::string& name,
                               const std::string& base_dir) {
  check(size <= size_t(INT_MAX), ErrorCode::invalid_model,
        name + ": " + std::to_string(size) +
            " bytes is over protobuf's 2 GiB limit; large weights must be stored as external data");
  check(data != nullptr || size == 0, ErrorCode::invalid_argument, name + ": no data");
  onnx::ModelProto proto;
  std::string stripped;
  std::vector<std::optional<std::string_view>> raws;
  if (strip_weights(data, size, &stripped, &raws) && parse_large(proto, stripped.data(), stripped.size()))
    return load_model_proto(proto, name, base_dir, &raws);
  proto.Clear();
  check(parse_large(proto, data, size), ErrorCode::invalid_model,
        name + ": cannot parse as an ONNX model (truncated, corrupt or not a protobuf)");
  return load_model_proto(proto, name, base_dir);
}

Model OnnxImporter::load_file(const std::string& path) {
  auto file = MappedFile::open(path);
  std::string base = fs::path(path).parent_path().string();
  if (base.empty()) base = ".";
  Model m = load_bytes(file->data(), file->size(), path, base);
  m.path = path;
  return m;
}

Tensor read_tensor_pb(const std::string& path, std::string* name) {
  auto file = MappedFile::open(path);
  onnx::TensorProto proto;
  check(parse_large(proto, file->data(), file->size()), ErrorCode::invalid_model,
        path + ": cannot parse as an ONNX TensorProto (truncated, corrupt or not a protobuf)");
  TensorSource source;
  source.file = path;
  source.base_dir = fs::path(path).parent_path().string();
  if (source.base_dir.empty()) source.base_dir = ".";
  if (name) *name = proto.name();
  return tensor_from_proto(proto, source, path + ": tensor " + in_quotes(proto.name()));
}

namespace {

Value value_from_proto(onnx::SequenceProto& p, TensorSource& source, const std::string& what);

Value value_from_proto(onnx::OptionalProto& p, TensorSource& source, const std::string& what) {
  if (p.has_tensor_value())
    return Value::optional(tensor_from_proto(*p.mutable_tensor_value(), source, what + " element"));
  if (p.has_sequence_value())
    return Value::optional(value_from_proto(*p.mutable_sequence_value(), source, what + " element"));
  check(p.elem_type() == onnx::OptionalProto::TENSOR || p.elem_type() == onnx::OptionalProto::SEQUENCE ||
            p.elem_type() == onnx::OptionalProto::UNDEFINED,
        ErrorCode::unsupported, what + ": optionals hold tensors or sequences in slim");
  return Value::none();
}

Value value_from_proto(onnx::SequenceProto& p, TensorSource& source, const std::string& what) {
  check(p.elem_type() == onnx::SequenceProto::TENSOR ||
            (p.elem_type() == onnx::SequenceProto::UNDEFINED && p.tensor_values_size() == 0),
        ErrorCode::unsupported, what + ": sequences hold tensors in slim");
  std::vector<Tensor> items;
  for (int i = 0; i < p.tensor_values_size(); ++i)
    items.push_back(tensor_from_proto(*p.mutable_tensor_values(i), source, what + " item " + std::to_string(i)));
  return Value::sequence(std::move(items));
}

}  // namespace

Value read_value_pb(const std::string& path, const std::string& onnx_type) {
  const bool sequence = onnx_type.rfind("seq(", 0) == 0, optional = onnx_type.rfind("optional(", 0) == 0;
  if (!sequence && !optional) return read_tensor_pb(path);
  auto file = MappedFile::open(path);
  TensorSource source;
  source.file = path;
  source.base_dir = fs::path(path).parent_path().string();
  if (source.base_dir.empty()) source.base_dir = ".";
  if (sequence) {
    onnx::SequenceProto proto;
    check(parse_large(proto, file->data(), file->size()), ErrorCode::invalid_model,
          path + ": cannot parse as an ONNX SequenceProto");
    return value_from_proto(proto, source, path + ": sequence " + in_quotes(proto.name()));
  }
  onnx::OptionalProto proto;
  check(parse_large(proto, file->data(), file->size()), ErrorCode::invalid_model,
        path + ": cannot parse as an ONNX OptionalProto");
  return value_from_proto(proto, source, path + ": optional " + in_quotes(proto.name()));
}

std::vector<size_t> validate_graph(const Graph& graph, const std::string& context) {
  return validate_scope(graph, context, Scope{}, 0);
}

}  // namespace slim
