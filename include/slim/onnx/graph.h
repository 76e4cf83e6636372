// The graph IR that the ONNX importer produces and the runtime compiles: nodes with
// typed attributes, initializers as slim tensors, and value infos with symbolic dims.
// It mirrors ONNX's ModelProto closely but owns no protobuf objects.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/tensor.h"

namespace slim {

struct Graph;

// One dimension of a value's shape: a fixed size, a symbolic name ("batch"), or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when fixed
  std::string param;   // symbolic name, when not fixed
  bool is_fixed() const { return value >= 0; }
};

struct ValueInfo {
  std::string name;
  std::optional<DType> dtype;                // absent: untyped, or a type slim lacks
  std::optional<std::vector<Dim>> shape;     // absent: rank unknown
  std::string onnx_type;                     // ONNX type name, e.g. "float", "string"
  // Fixed shape when every dim is fixed.
  std::optional<Shape> static_shape() const;
  std::string describe() const;              // "f32[batch,3,224,224]"
};

struct Attribute {
  // `type`: an ONNX type (Optional's), held as its name in `s` ("seq(tensor(float))").
  enum class Kind { f, i, s, t, g, floats, ints, strings, tensors, graphs, type };
  Kind kind = Kind::i;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
};

struct Node {
  std::string name;     // may be empty in the file; the importer fills "<op>_<index>"
  std::string op_type;
  std::string domain;   // "" for the default ONNX domain ("ai.onnx" is normalized to "")
  std::vector<std::string> inputs;   // "" marks an omitted optional input
  std::vector<std::string> outputs;  // "" marks an omitted optional output
  std::map<std::string, Attribute> attrs;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  // Typed getters: the default when absent; invalid_model naming the node when the
  // attribute has another kind.
  int64_t attr_int(const std::string& key, int64_t def) const;
  float attr_float(const std::string& key, float def) const;
  std::string attr_string(const std::string& key, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& key, const std::vector<int64_t>& def = {}) const;
  std::vector<float> attr_floats(const std::string& key, const std::vector<float>& def = {}) const;
  std::vector<std::string> attr_strings(const std::string& key) const;
  const Tensor* attr_tensor(const std::string& key) const;  // nullptr when absent
  const Attribute* attr(const std::string& key) const;      // nullptr when absent
  std::string describe() const;  // "Conv node 'conv1'"
  // Number of inputs that are present: trailing "" inputs do not count.
  int num_present_inputs() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::map<std::string, Tensor> initializers;
  std::vector<ValueInfo> inputs;   // graph inputs that are not initializers
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_info;
  // Inputs that also have an initializer: the initializer is a default the caller may
  // override at run time.
  std::vector<ValueInfo> overridable_inputs;
};

struct Model {
  std::string path;  // file it was loaded from ("" when built in memory)
  int64_t ir_version = 0;
  std::string producer_name, producer_version, doc_string;
  std::map<std::string, int64_t> opsets;  // domain ("" = ai.onnx) -> version
  Graph graph;

  // Opset version of a domain; 0 when the model does not import it.
  int64_t opset(const std::string& domain) const;
};

}  // namespace slim
