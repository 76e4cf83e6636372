// What `slim inspect` reports about an ONNX model: op histogram, parameters, estimated
// FLOPs per run (from the statically inferred shapes), and ops no provider can run.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slim/onnx/graph.h"

namespace slim {

struct ModelSummary {
  int64_t num_nodes = 0;
  std::map<std::string, int64_t> op_histogram;  // "Conv" -> count ("domain:Op" outside ai.onnx)
  // Nodes inside If/Loop/Scan/SequenceMap subgraphs: in the histogram, not in the FLOPs
  // (a body runs as often as its data says).
  int64_t subgraph_nodes = 0;
  int64_t num_initializers = 0;
  int64_t parameter_count = 0;  // elements of all initializers
  int64_t parameter_bytes = 0;
  double flops = 0;                 // estimated floating-point operations of one run
  int64_t nodes_without_flops = 0;  // nodes whose shapes were unknown (FLOPs undercounted)
  std::map<std::string, double> flops_by_op;
};

// Shape of a value when known statically (from a compiled Session), else nullopt.
using ShapeLookup = std::function<std::optional<Shape>(const std::string& value)>;

ModelSummary summarize_model(const Model& model, const ShapeLookup& shape_of);

// Estimated FLOPs of one node (multiply-add = 2), nullopt when a needed shape is unknown.
std::optional<double> estimate_node_flops(const Node& node, const ShapeLookup& shape_of);

}  // namespace slim
