// The channel dependency graph of prune_channels: which (value, axis) pairs carry
// channels, which slots of them are one channel ("unit"), which tensor slices each unit
// owns, and which node attributes or shape constants follow the kept counts.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"

namespace slim::prune::detail {

// A channel axis of a value: `size` slots, numbered from `base` in the global slot space.
struct Space {
  std::string value;
  int axis = 1;
  int64_t size = 0, base = 0;
  std::string frozen;  // why its channels must stay ("" when they may go)
};

// A slice of an initializer along `axis`: index j belongs to slot `offset + j` of `space`.
struct Member {
  enum Kind { produce, consume, param };
  std::string tensor;
  int axis = 0, space = -1;
  int64_t offset = 0;
  Kind kind = param;
  int node = -1;  // the node that reads the tensor
  bool depthwise = false;
};

// A constant whose element must become a space's kept count (Reshape target, Resize sizes).
struct ShapeFix {
  std::string tensor;
  int64_t index = 0;
  int space = -1;
};

// A BatchNormalization over a space: scale and variance inputs, epsilon.
struct BnInfo {
  int node = -1, space = -1;
};

// A node whose MACs count: Conv, ConvTranspose, Gemm, MatMul.
struct MacNode {
  int node = -1;
  int64_t per = 0;         // MACs per (input channel / group x output channel)
  int64_t cin = 0, cout = 0, group = 1;
  int in_space = -1, out_space = -1;
  bool depthwise = false;  // MACs follow the output channels only
  bool transpose = false;
};

struct ChannelGraph {
  std::vector<Space> spaces;
  std::map<std::string, int> space_of;
  std::vector<Member> members;
  std::vector<ShapeFix> shape_fixes;
  std::vector<std::pair<int, int>> depthwise_fixes;  // (node, output space): group = kept
  std::vector<BnInfo> bns;
  std::vector<MacNode> macs;
  std::vector<std::string> seed_failures;  // why weighted nodes could not seed channels
  std::vector<int64_t> parent;  // union-find over slots
  int64_t slots = 0;

  int64_t find(int64_t s);
  void unite(int64_t a, int64_t b);
};

// Builds the graph of `g` (Constant nodes already initializers) with `shapes` the static
// shape of every value at the analysis input.
ChannelGraph build_channel_graph(const Graph& g, const std::map<std::string, Shape>& shapes, int64_t opset);

}  // namespace slim::prune::detail
