// Raises a model's ai.onnx opset, rewriting the nodes whose operator changed in a way
// that is not compatible (attributes that became inputs, Softmax's axis semantics), so a
// tool that needs newer operators (per-axis QuantizeLinear: opset 13) can add them to an
// older model without changing what it computes.
#pragma once

#include <cstdint>

#include "slim/onnx/graph.h"

namespace slim {

// Rewrites `model` (subgraphs included) for ai.onnx opset `target` (at most 13) and sets
// its import to it; a model already there is left alone. Slice (< 10), TopK (< 10), Clip
// and Pad (< 11), Squeeze, Unsqueeze, Split and ReduceSum (< 13) get their attributes as
// constant inputs, Softmax/LogSoftmax/Hardmax over trailing dims (< 13) become Flatten,
// the op over the last axis and a Reshape back (or keep the axis when it is the last
// one), inference Dropout (< 12) becomes Identity, Scatter becomes ScatterElements and
// BatchNormalization drops `spatial`. Operators without such a rewrite (Upsample, Resize
// before 11, Scan before 9, models before opset 7) are unsupported, naming the node.
void upgrade_opset(Model& model, int64_t target);

}  // namespace slim
