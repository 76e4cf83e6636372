#include "slim/onnx/graph.h"

namespace slim {

std::optional<Shape> ValueInfo::static_shape() const {
  if (!shape) return std::nullopt;
  Shape s;
  for (const auto& d : *shape) {
    if (!d.is_fixed()) return std::nullopt;
    s.push_back(d.value);
  }
  return s;
}

std::string ValueInfo::describe() const {
  std::string out = dtype ? std::string(dtype_name(*dtype)) : (onnx_type.empty() ? "?" : onnx_type);
  if (!shape) return dtype || onnx_type.empty() ? out + "[?]" : out;  // "seq(tensor(float))"
  out += "[";
  for (size_t i = 0; i < shape->size(); ++i) {
    if (i) out += ",";
    const Dim& d = (*shape)[i];
    out += d.is_fixed() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param);
  }
  return out + "]";
}

namespace {
const char* kind_name(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::f: return "float";
    case Attribute::Kind::i: return "int";
    case Attribute::Kind::s: return "string";
    case Attribute::Kind::t: return "tensor";
    case Attribute::Kind::g: return "graph";
    case Attribute::Kind::floats: return "floats";
    case Attribute::Kind::ints: return "ints";
    case Attribute::Kind::strings: return "strings";
    case Attribute::Kind::tensors: return "tensors";
    case Attribute::Kind::graphs: return "graphs";
    case Attribute::Kind::type: return "type";
  }
  return "?";
}

const Attribute* typed(const Node& n, const std::string& key, Attribute::Kind kind) {
  const Attribute* a = n.attr(key);
  if (a && a->kind != kind)
    throw Error(ErrorCode::invalid_model, n.describe() + ": attribute '" + key + "' is " +
                                              kind_name(a->kind) + ", expected " + kind_name(kind));
  return a;
}
}  // namespace

const Attribute* Node::attr(const std::string& key) const {
  auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

int64_t Node::attr_int(const std::string& key, int64_t def) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::i);
  return a ? a->i : def;
}

float Node::attr_float(const std::string& key, float def) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::f);
  return a ? a->f : def;
}

std::string Node::attr_string(const std::string& key, const std::string& def) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::s);
  return a ? a->s : def;
}

std::vector<int64_t> Node::attr_ints(const std::string& key, const std::vector<int64_t>& def) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::ints);
  return a ? a->ints : def;
}

std::vector<float> Node::attr_floats(const std::string& key, const std::vector<float>& def) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::floats);
  return a ? a->floats : def;
}

std::vector<std::string> Node::attr_strings(const std::string& key) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::strings);
  return a ? a->strings : std::vector<std::string>{};
}

const Tensor* Node::attr_tensor(const std::string& key) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::t);
  return a ? &a->t : nullptr;
}

std::string Node::describe() const { return op_type + " node '" + name + "'"; }

int Node::num_present_inputs() const {
  int n = int(inputs.size());
  while (n > 0 && inputs[size_t(n - 1)].empty()) --n;
  return n;
}

int64_t Model::opset(const std::string& domain) const {
  auto it = opsets.find(domain);
  return it == opsets.end() ? 0 : it->second;
}

}  // namespace slim
