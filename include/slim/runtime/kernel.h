// Kernels and their registry. A kernel is created once per node at compile time (where
// it parses and validates the node's attributes) and computed at run time. Kernels are
// registered by (op type, domain, opset range); a provider is a named set of them.
#pragma once

#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/tensor.h"
#include "slim/core/thread_pool.h"
#include "slim/onnx/graph.h"

namespace slim {

// What a kernel sees while it computes one node.
class KernelContext {
 public:
  KernelContext(const Node& node, std::vector<const Tensor*> inputs,
                std::vector<Tensor>* outputs, const std::vector<Tensor>* planned,
                ThreadPool* pool);

  // Inputs: nullptr for an omitted optional input or an index past the node's inputs.
  int num_inputs() const { return int(inputs_.size()); }
  const Tensor* input(int i) const;
  // The input, or an invalid_model error naming the node when it is missing.
  const Tensor& required_input(int i) const;

  int num_outputs() const { return int(outputs_->size()); }
  // False for an omitted optional output (the kernel may skip computing it).
  bool output_wanted(int i) const;
  // Returns the tensor to write output i into: the memory planner's buffer when its
  // dtype and shape match, else a new contiguous tensor. Always zero-initialized only
  // when newly allocated: kernels must write every element.
  Tensor& output(int i, DType dtype, const Shape& shape);
  // Sets output i to an existing tensor (e.g. a view for Identity-like ops).
  void set_output(int i, Tensor t);

  ThreadPool& pool() const { return *pool_; }
  const Node& node() const { return node_; }
  // Throws Error(code, "<op> node '<name>': " + msg).
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const;

 private:
  const Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor>* outputs_;
  const std::vector<Tensor>* planned_;
  ThreadPool* pool_;
};

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  // Inputs are contiguous. Outputs must be contiguous tensors obtained from ctx.output()
  // (or ctx.set_output()). Errors name the node through ctx.fail().
  virtual void compute(KernelContext& ctx) const = 0;
};

// Builds the kernel of one node; `opset` is the node's domain version in the model.
// Throws invalid_model (bad attribute) or unsupported (valid but not implemented).
using KernelFactory = std::function<std::unique_ptr<OpKernel>(const Node& node, int64_t opset)>;

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
