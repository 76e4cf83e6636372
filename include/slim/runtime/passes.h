// Graph optimization passes: compile-time rewrites that leave a model's outputs unchanged
// but give providers fewer, larger nodes (Conv + BatchNorm + bias + activation + residual
// as one slim:FusedConv) and drop nodes that do nothing. Session::compile runs them
// (SessionOptions::optimize); each pass can also run alone, which is how they are tested.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"

namespace slim {

// What the passes rewrite and what they know about its values. Passes are conservative:
// a rewrite that needs a fact (a shape, a dtype, a constant value) it does not have is
// skipped, so the same passes run before shape inference (knowing only constants and
// input shapes) and after it (knowing every static shape).
struct PassGraph {
  std::vector<std::unique_ptr<Node>> nodes;  // a topological order
  std::map<std::string, Tensor> constants;   // values known at compile time
  std::map<std::string, DType> dtypes;       // element types of other values, when known
  std::map<std::string, Shape> shapes;       // static shapes of other values, when known
  std::set<std::string> graph_outputs;
  // Every value name in use (node inputs and outputs, graph inputs, initializers, names
  // of enclosing scopes): fresh names avoid them. Whoever builds a PassGraph fills it.
  std::set<std::string> reserved_names;
  std::map<std::string, int64_t> opsets;  // the model's; a fused node adds slim:1
  std::string context;                    // model name, for messages
  // Whether a node of `base_op` (ai.onnx) may become `fused_op` (slim domain). The Session
  // answers from its providers, so a fast provider's Conv is not traded for ref's
  // FusedConv. Unset: always.
  std::function<bool(const std::string& base_op, const std::string& fused_op)> can_fuse;
  // The provider that runs a node first computes in float32 only (the cpu provider):
  // run_float16_in_float32 moves float16 computation to float32 for it.
  bool float16_in_float32 = false;
  // The provider that runs nodes first has 8-bit kernels (the cpu provider): fuse_qdq
  // turns QDQ patterns into QLinearConv/QLinearMatMul for it. Without it (ref alone) a
  // QDQ model runs as written.
  bool int8_kernels = false;
  // Nodes the passes replaced or removed. They are kept alive (not destroyed) so a caller
  // that keyed state by node address never sees that address reused by a new node.
  std::vector<std::unique_ptr<Node>> removed;

  std::optional<Shape> shape_of(const std::string& value) const;
  std::optional<DType> dtype_of(const std::string& value) const;
  const Tensor* constant(const std::string& value) const;  // nullptr when not constant
  // A name not in use yet (`base`, or `base_<n>`); it is reserved from then on.
  std::string fresh_name(const std::string& base);
  std::string add_constant(const std::string& base, Tensor value);
};

// The graph of a model as passes see it: nodes in validate_graph's order, initializers
// (except overridable ones) as constants, Constant nodes kept as nodes, static shapes and
// dtypes of graph inputs and value_info.
PassGraph pass_graph_from_model(const Model& model);

// Each pass returns how many rewrites it made (0: the graph is unchanged).

// When g.float16_in_float32: every node with a float16 input whose op computes (anything
// but Cast, shape queries and data movement) runs in float32 instead, with Casts around
// it (float16 constants converted here, once), a data-movement node whose float16 inputs
// and readers are all such nodes too; then the Cast pairs that meet (f32 -> f16 -> f32)
// are dropped. These are ONNX Runtime's CPU-provider rules (InsertCastTransformer and
// RemoveDuplicateCastTransformer), so values are rounded to float16 where ORT rounds them.
int64_t run_float16_in_float32(PassGraph& g);

// Drops Identity, inference-mode Dropout (mask unused), Cast to the dtype its input
// already has and Reshape whose output shape equals its input shape; consumers read the
// input instead. Outputs that are graph outputs or read by subgraphs are kept.
int64_t remove_noop_nodes(PassGraph& g);

// Replaces Shape/Size of statically shaped values by constants, then evaluates (with the
// ref kernels) the nodes that only read those constants and other constants: the shape
// arithmetic exporters emit for Reshape targets.
int64_t fold_shape_subgraphs(PassGraph& g);

// Folds an inference BatchNormalization into the weights and bias of the Conv or Gemm
// that feeds it (constant weights, f32, the Conv/Gemm output read by nothing else).
int64_t fold_batch_norm(PassGraph& g);

// Fuses Conv / Gemm / MatMul with a following constant bias Add, a residual Add (an
// input of the output's exact shape) and an activation (Relu, Clip with constant bounds,
// Sigmoid, HardSwish, LeakyRelu, Tanh, SiLU = x * Sigmoid(x), Gelu and torch's erf form
// x * 0.5 * (1 + Erf(x / sqrt 2))) into slim:FusedConv / FusedGemm / FusedMatMul.
// An intermediate that is a graph output or has another reader stops the chain.
int64_t fuse_bias_activation(PassGraph& g);

// Fuses DynamicQuantizeLinear -> ConvInteger -> Cast(f32) -> Mul by (x_scale * w_scale)
// -> [Add of a per-channel bias] -> [Relu], as ONNX Runtime's dynamic quantizer writes
// it, into slim:DynamicQuantizeConv (constant weights, zero point and scales; w_scale
// and bias of one value or one per output channel). The DynamicQuantizeLinear's outputs
// must feed only this chain.
int64_t fuse_dynamic_quantize_conv(PassGraph& g);

// When g.int8_kernels: DequantizeLinear(x) and DequantizeLinear(w) [and DequantizeLinear
// of an int32 bias at scale x_scale * w_scale, zero point 0] -> Conv or MatMul ->
// QuantizeLinear(y), with per-tensor x and y parameters and constant weights quantized
// per tensor or per output channel, becomes QLinearConv / QLinearMatMul (ONNX Runtime's
// QDQ fusion, so results equal its optimized run). The DequantizeLinear nodes stay while
// something else reads them.
int64_t fuse_qdq(PassGraph& g);

// When g.int8_kernels: DequantizeLinear (per tensor) -> one elementwise op (scalar
// constants aside) -> QuantizeLinear stays on bytes. When every dequantized input is the
// same 8-bit tensor, or a slim:QLookup of it, the chain becomes slim:QLookup of that
// tensor with a 256-entry table computed by ref's kernels of the nodes it replaces (so
// it is exact); otherwise an Add or Mul of two dequantized tensors becomes
// slim:QLinearAdd / slim:QLinearMul (fused_ops.h).
int64_t fuse_qdq_elementwise(PassGraph& g);

// When g.int8_kernels: data movement stays on bytes. DequantizeLinear (per tensor) ->
// Resize (nearest, constant roi/scales/sizes, no extrapolation) -> QuantizeLinear
// becomes a Resize of the bytes, after a slim:QLookup with the table Q(DQ(v)) unless that
// is the identity (equal scales and zero points); DequantizeLinear_i -> Concat ->
// QuantizeLinear a Concat of the bytes, each input requantized by its table (folded into
// the table of a slim:QLookup -> Resize made here when that feeds only the Concat);
// DequantizeLinear -> MaxPool (4-D) -> QuantizeLinear a MaxPool of the bytes when that table
// never decreases, then the table (or the table composed into a slim:QLookup before it, or
// before it for fuse_qlinear_conv_lookup to fold into a QLinearConv: either only feeding
// it). Nearest resizing and concatenation copy values and max commutes with a
// non-decreasing table, so all are exact. Last, a slim:QLookup read only by another becomes
// one table (the second's applied to the first's bytes).
int64_t fuse_qdq_movement(PassGraph& g);

// When g.int8_kernels, once the passes above are done: a QLinearConv read only by a
// slim:QLookup (its activation, tabulated) becomes slim:QLinearConvLookup, whose kernel
// maps the bytes through the table as it requantizes them (no pass of its own).
int64_t fuse_qlinear_conv_lookup(PassGraph& g);

// When g.int8_kernels, after fuse_qlinear_conv_lookup: a QLinearConv or
// slim:QLinearConvLookup read only by a slim:QLinearAdd whose other input has the same
// shape (a residual) becomes slim:QLinearConvAdd, whose kernel adds the residual to the
// requantized bytes in its epilogue, as the Add computes it; a slim:QLinearMul so read (the
// shortcut around a squeeze-excitation gate) slim:QLinearMulAdd.
int64_t fuse_residual_qlinear_add(PassGraph& g);

struct PassStats {
  std::map<std::string, int64_t> rewrites;  // pass name -> rewrites
  int64_t total() const;
};

// All passes in order, repeated while they find work (at most a few rounds).
PassStats optimize_graph(PassGraph& g);

}  // namespace slim
