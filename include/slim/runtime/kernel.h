// Kernels and their registry. A kernel is created once per node at compile time (where
// it parses and validates the node's attributes) and computed at run time. Kernels are
// registered by (op type, domain, opset range); a provider is a named set of them.
#pragma once

#include <climits>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/tensor.h"
#include "slim/core/thread_pool.h"
#include "slim/onnx/graph.h"
#include "slim/onnx/value.h"

namespace slim {

// What a kernel sees while it computes one node.
class KernelContext {
 public:
  // `inputs` is read in place (a session runs many small steps: no copy per step), so it
  // must outlive the context.
  KernelContext(const Node& node, const std::vector<const Tensor*>& inputs,
                std::vector<Tensor>* outputs, const std::vector<Tensor>* planned,
                ThreadPool* pool);
  KernelContext(const Node&, std::vector<const Tensor*>&&, std::vector<Tensor>*,
                const std::vector<Tensor>*, ThreadPool*) = delete;

  // Inputs: nullptr for an omitted optional input or an index past the node's inputs.
  int num_inputs() const { return int(inputs_->size()); }
  const Tensor* input(int i) const;
  // The input, or an invalid_model error naming the node when it is missing.
  const Tensor& required_input(int i) const;

  int num_outputs() const { return int(outputs_->size()); }
  // False for an omitted optional output (the kernel may skip computing it).
  bool output_wanted(int i) const;
  // Returns the tensor to write output i into: the memory planner's buffer when its
  // dtype and shape match, else a new contiguous tensor. Always zero-initialized only
  // when newly allocated: kernels must write every element. The tensor is the
  // context's, not the kernel's to reassign.
  Tensor& output(int i, DType dtype, const Shape& shape);
  // Sets output i to an existing tensor (e.g. a view for Identity-like ops).
  void set_output(int i, Tensor t);

  // Sequences and optionals. A session also hands every step its non-tensor inputs
  // (input(i) is nullptr for them), a place for non-tensor outputs, and the values the
  // node's subgraphs capture from enclosing scopes (in node_captures order).
  void set_values(const std::vector<const Value*>* inputs, std::vector<Value>* outputs,
                  const std::vector<Value>* captures);
  // Input i as a value of any kind; undefined for an omitted input.
  Value value(int i) const;
  // Sets output i to a value of any kind (a tensor goes where set_output puts it).
  void set_output(int i, Value v);
  const std::vector<Value>& captures() const;

  ThreadPool& pool() const { return *pool_; }
  const Node& node() const { return node_; }
  // Throws Error(code, "<op> node '<name>': " + msg).
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const;

 private:
  const Node& node_;
  const std::vector<const Tensor*>* inputs_;
  std::vector<Tensor>* outputs_;
  const std::vector<Tensor>* planned_;
  ThreadPool* pool_;
  const std::vector<const Value*>* value_inputs_ = nullptr;
  std::vector<Value>* value_outputs_ = nullptr;
  const std::vector<Value>* captures_ = nullptr;
};

// Values a node's subgraphs read from the scopes around it (sorted by name): what a
// KernelContext's captures() holds, one for one.
std::vector<std::string> node_captures(const Node& node);

// A subgraph (If branch, Loop/Scan/SequenceMap body) compiled by the session into a plan
// of its own (kernels, folding, memory plan) when the node's kernel is built; the kernel
// runs it as often as it needs.
class SubgraphPlan {
 public:
  virtual ~SubgraphPlan() = default;
  // Runs the body on its formal inputs, in the order the body declares them; what it
  // captures from enclosing scopes comes from ctx.captures(). Returns its outputs.
  virtual std::vector<Value> run(const KernelContext& ctx, std::vector<Value> inputs) = 0;
  virtual int num_inputs() const = 0;
  virtual int num_outputs() const = 0;
  // Static dtype and shape of output i, when the plan inferred them.
  virtual std::optional<DType> output_dtype(int i) const = 0;
  virtual std::optional<Shape> output_shape(int i) const = 0;
};

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  // Inputs are contiguous. Outputs must be contiguous tensors obtained from ctx.output()
  // (or ctx.set_output()). Errors name the node through ctx.fail().
  virtual void compute(KernelContext& ctx) const = 0;

  // The dtype and shape of output i when the kernel fixed them at build time (static
  // shapes), written as a fresh tensor (never a view of an input). When a kernel knows all
  // its outputs, compile takes them from here instead of running the node once on probe
  // inputs, a run that touched every activation of the model a second time.
  virtual bool static_output(int i, DType* dtype, Shape* shape) const { return false; }

  // Views: the input whose elements output i always is, in order, under output i's shape
  // (Reshape, Squeeze, Unsqueeze, Flatten, Identity, inference Dropout), else -1;
  // `same_shape` tells whether that shape is always the input's (Identity, Dropout).
  // Where both shapes are static, or always the same, compile makes the output a view of
  // that input and the kernel never runs (it still does for a direct caller, and for a
  // non-tensor input).
  virtual int view_input(int i, bool* same_shape) const { return -1; }

  // Private layouts. A kernel that could write output i in a layout of its own (same
  // byte size, e.g. oneDNN's channels-last) returns a nonzero tag naming that layout; a
  // kernel that could read input i in it says so. When every reader of a value accepts
  // its producer's tag, compile switches them all over, so consecutive kernels skip the
  // conversions; graph outputs and values read by other kernels stay plain. Otherwise,
  // when every reader would convert the value into the same layout of its own
  // (wanted_input_layout) and the producer can write that one (can_write_output_in), the
  // producer converts once into it instead of to plain and the readers back.
  virtual uint64_t private_output_layout(int i) const { return 0; }
  virtual bool accepts_private_input(int i, uint64_t layout) const { return false; }
  virtual uint64_t wanted_input_layout(int i) const { return 0; }
  virtual bool can_write_output_in(int i, uint64_t layout) const { return false; }
  virtual void use_private_output(int i, uint64_t layout) {}
  virtual void use_private_input(int i, uint64_t layout) {}

  // In-place inputs. A kernel whose input i is one run of its output 0's bytes (Concat of
  // a single outer row) returns true and the run's byte offset in the output. Compile may
  // then place the producer's output there, in the reader's output buffer, and the kernel
  // finds those bytes already in place: it must compare addresses and copy only when they
  // differ. Asked after the private layouts are settled.
  virtual bool input_within_output(int i, int64_t* byte_offset) const { return false; }
};

// Builds the kernel of one node; `opset` is the node's domain version in the model.
// Throws invalid_model (bad attribute) or unsupported (valid but not implemented).
using KernelFactory = std::function<std::unique_ptr<OpKernel>(const Node& node, int64_t opset)>;

// What compile knows about one input of a node when it picks and builds its kernel.
struct NodeInputInfo {
  bool present = false;            // false for an omitted optional input
  std::optional<DType> dtype;      // known element type
  std::optional<Shape> shape;      // static shape
  const Tensor* constant = nullptr;  // the value, when it is an initializer or folded
};

// A node with everything compile knows about its inputs: what a claim function decides
// on and what a KernelDef::build factory packs (e.g. constant weights) at compile time.
struct KernelBuildInfo {
  const Node& node;
  int64_t opset = 0;
  std::vector<NodeInputInfo> inputs;
  // SessionOptions::winograd: 3x3 convolutions may use Winograd's algorithm.
  bool winograd = true;
  // Compiles the subgraph in the node's graph attribute `attr` (a session sets it). What
  // is known of the formal inputs comes from `inputs` where given, else from the body's
  // own declarations; captured values are described as the session knows them.
  std::function<std::unique_ptr<SubgraphPlan>(const std::string& attr,
                                              const std::vector<NodeInputInfo>& inputs)>
      compile_subgraph = nullptr;
  // The input, or a shared absent one past the node's inputs.
  const NodeInputInfo& input(int i) const;
  bool has_input(int i) const { return input(i).present; }
};

// A provider's answer to "will you run this node?". A declined claim says why, so
// `slim inspect --partition` can show why a node fell back to the next provider.
struct Claim {
  bool taken = true;
  std::string reason;
  static Claim yes() { return {}; }
  static Claim no(std::string why) { return {false, std::move(why)}; }
};
using ClaimFn = std::function<Claim(const KernelBuildInfo& info)>;
using BuildFn = std::function<std::unique_ptr<OpKernel>(const KernelBuildInfo& info)>;

struct KernelDef {
  std::string op_type;
  std::string domain;  // "" = ai.onnx
  int64_t since_version = 1;
  int64_t until_version = INT_MAX;  // inclusive
  KernelFactory factory;
  // Inputs whose *values* (not only shapes) decide the output shapes, e.g. Reshape's
  // `shape` (1) or NonZero's data (0). The compiler uses this to know which output
  // shapes it can infer statically.
  std::vector<int> shape_inputs;
  // Optional: looks at the node and its inputs and may decline it (a node nobody else
  // claims still fails to compile). Absent: every node of the op and opset range is taken.
  ClaimFn claim = nullptr;
  // Optional factory that also sees input dtypes, static shapes and constant values;
  // used instead of `factory` when set (kernels that pack weights at compile time).
  BuildFn build = nullptr;
};

class KernelRegistry {
 public:
  explicit KernelRegistry(std::string provider) : provider_(std::move(provider)) {}
  void add(KernelDef def);
  // The kernel for an op at the model's opset version; nullptr when none.
  const KernelDef* find(const std::string& op_type, const std::string& domain,
                        int64_t opset) const;
  bool has_op(const std::string& op_type, const std::string& domain) const;
  const std::vector<KernelDef>& defs() const { return defs_; }
  const std::string& provider() const { return provider_; }

 private:
  std::string provider_;
  std::vector<KernelDef> defs_;
};

// The reference provider: readable kernels, the correctness oracle for all others.
const KernelRegistry& ref_kernel_registry();

// Helper for kernels without compile-time state beyond the node: wraps a function.
template <typename Fn>
KernelFactory simple_kernel(Fn fn) {
  struct K final : OpKernel {
    explicit K(Fn f) : f(std::move(f)) {}
    void compute(KernelContext& ctx) const override { f(ctx); }
    Fn f;
  };
  return [fn](const Node&, int64_t) -> std::unique_ptr<OpKernel> { return std::make_unique<K>(fn); };
}

}  // namespace slim
