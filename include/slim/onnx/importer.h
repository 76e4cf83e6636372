// OnnxImporter reads an ONNX ModelProto (protobuf, with the protos of Debian's
// libonnx-dev) into slim's graph IR and validates it: undefined inputs, duplicate
// outputs, cycles, unknown domains, tensor data that disagrees with its dims, and
// external data that escapes the model's folder or reads past its file.
#pragma once

#include <set>
#include <string>

#include "slim/onnx/graph.h"
#include "slim/onnx/value.h"

namespace slim {

// Domains the importer accepts (nodes of any other domain are invalid_model).
bool is_known_onnx_domain(const std::string& domain);

class OnnxImporter {
 public:
  // Loads and validates a model file. Errors name the file and the node or tensor.
  static Model load_file(const std::string& path);
  // Parses bytes already in memory; `base_dir` resolves external data ("" forbids it).
  static Model load_bytes(const void* data, size_t size, const std::string& name,
                          const std::string& base_dir);
};

// Reads a serialized TensorProto file (the input_N.pb / output_N.pb files of the ONNX
// backend test data). Returns the tensor and its name.
Tensor read_tensor_pb(const std::string& path, std::string* name = nullptr);
// Reads a value file of that data for a value of ONNX type `onnx_type` (ValueInfo::
// onnx_type): a SequenceProto for "seq(...)", an OptionalProto for "optional(...)", else
// a TensorProto.
Value read_value_pb(const std::string& path, const std::string& onnx_type);

// Checks the graph structure: every node input is defined before use (by a graph input,
// an initializer or an earlier node in some topological order), no value has two
// producers, no cycles, every graph output is produced. Throws invalid_model naming
// the node and value. Returns the node indices in topological order.
std::vector<size_t> validate_graph(const Graph& graph, const std::string& context);

// Names a graph reads but does not define itself (by its inputs, initializers or node
// outputs), including those its own subgraphs read: what an If/Loop/Scan body takes
// from the scopes around it.
std::set<std::string> outer_scope_refs(const Graph& graph);

}  // namespace slim
