// OnnxExporter writes the graph IR back to an ONNX file, for tools that turn one model
// into another (quantization): what the IR does not hold (doc strings, metadata,
// subgraphs, functions, value_info) comes from the file the model was loaded from.
#pragma once

#include <string>

#include "slim/onnx/graph.h"

namespace slim {

class OnnxExporter {
 public:
  // Writes `model` to `path`. When model.path names the file it was loaded from, that
  // ModelProto is the template: its fields outside the main graph are kept, and so is
  // every node of its main graph that the IR still has under the same name, op and
  // domain (doc string, subgraph and type attributes), with the IR's inputs, outputs and
  // other attributes. Other nodes, the initializers (stored inline), the inputs and
  // outputs come from the IR; graph inputs and outputs and value_info of values still in
  // the graph keep the template's types. A new node with a subgraph attribute is
  // unsupported; errors name the node.
  static void save_file(const Model& model, const std::string& path);
};

}  // namespace slim
