// Session: load -> compile -> run for ONNX models. Compile orders the graph, folds
// constants, drops dead nodes, infers static shapes, assigns kernels and plans memory;
// run executes the plan with named tensors in and out.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"
#include "slim/onnx/value.h"
#include "slim/runtime/provider.h"

namespace slim {

struct SessionOptions {
  int num_threads = 0;                         // 0: all hardware threads
  // In priority order: each node goes to the first provider that claims it.
  std::vector<std::string> providers = {"cpu", "ref"};
  bool fold_constants = true;
  // Graph optimization passes (include/slim/runtime/passes.h): BatchNorm folding, fused
  // Conv/Gemm/MatMul epilogues, no-op removal, shape-subgraph folding.
  bool optimize = true;
  bool plan_memory = true;
  // Ungrouped 3x3 stride-1 convolutions with 16 or more input and output channels run
  // Winograd's algorithm where its one-time weight transform pays back within a few dozen
  // runs (about half the multiplications; results differ from the direct sum by rounding,
  // a few 1e-6 relative). Off: every convolution is a direct sum.
  bool winograd = true;
  // A model with symbolic input dims is compiled once more for a concrete set of input
  // shapes when run() sees those shapes a second time, so folding and the memory plan
  // also cover it. This many specializations are kept (least recently used goes first);
  // 0 turns specialization off (as do fold_constants and plan_memory both off).
  int shape_specializations = 4;
};

struct MemoryPlanStats {
  int64_t intermediate_bytes = 0;  // sum of the bytes of all planned intermediate tensors
  int64_t planned_bytes = 0;       // size of the arena that holds them
  int64_t planned_values = 0;      // values with a static shape, placed in the arena
  int64_t dynamic_values = 0;      // values whose shape is only known at run time
  // Planned values written straight into the output buffer of the node that reads them
  // (OpKernel::input_within_output: Concat), so that node copies nothing for them.
  int64_t in_place_values = 0;
  double reuse_rate() const {
    return intermediate_bytes ? 1.0 - double(planned_bytes) / double(intermediate_bytes) : 0.0;
  }
};

struct CompileStats {
  int64_t nodes_in = 0, nodes_out = 0;
  int64_t folded_nodes = 0, dead_nodes = 0;
  // Nodes run once on probe inputs at compile to learn their output shapes (kernels that
  // report them, OpKernel::static_output, are not).
  int64_t probed_nodes = 0;
  int64_t pass_rewrites = 0;  // rewrites the graph passes made (SessionOptions::optimize)
  // Subgraphs (If branches, Loop/Scan/SequenceMap bodies, nested ones included) compiled
  // into plans of their own; an If whose condition was known is inlined and not counted.
  int64_t subgraph_plans = 0;
  MemoryPlanStats memory;
};

using TensorMap = std::map<std::string, Tensor>;
using ValueMap = std::map<std::string, Value>;

// Called after each node of Session::run with the node, its provider and when the
// kernel started and ended (`slim bench --profile`). It runs on the hot path: keep it cheap.
// The nodes of subgraphs (If branches, Loop bodies) are reported as they run; the
// If/Loop/Scan/SequenceMap node that runs them is not, so times add up.
using NodeProfiler = std::function<void(const Node& node, const std::string& provider,
                                        std::chrono::steady_clock::time_point start,
                                        std::chrono::steady_clock::time_point end)>;

class Session {
 public:
  // Loads an ONNX file and compiles it.
  static std::unique_ptr<Session> load(const std::string& path, SessionOptions options = {});
  static std::unique_ptr<Session> compile(Model model, SessionOptions options = {});
  ~Session();

  // Runs the model. Inputs are matched by name; a missing input, an unknown name, or a
  // dtype/shape that contradicts the model is invalid_argument naming the input.
  // Returns the requested outputs (all graph outputs when `output_names` is empty);
  // they never share memory with the session. Concurrent calls are serialized by a
  // mutex, because every run writes its intermediates into the session's one arena.
  TensorMap run(const TensorMap& inputs, const std::vector<std::string>& output_names = {});
  // run() for models whose inputs or outputs include sequences or optionals (ONNX's
  // seq(...) and optional(...) types); run() refuses those outputs.
  ValueMap run_values(const ValueMap& inputs, const std::vector<std::string>& output_names = {});
  // Installs (or, with an empty function, removes) a per-node timing callback for later runs.
  void set_profiler(NodeProfiler profiler);

  const Model& model() const;
  const std::vector<ValueInfo>& inputs() const;   // what run() needs
  const std::vector<ValueInfo>& outputs() const;
  const CompileStats& stats() const;
  // Shape of any value of the compiled graph when compile inferred it statically.
  std::optional<Shape> static_shape(const std::string& value) const;
  // Element type of a value when compile knows it (constants, typed inputs, probed nodes).
  std::optional<DType> static_dtype(const std::string& value) const;
  // The graph as compiled: nodes in execution order after folding and dead-node
  // elimination, Constant nodes and folded values turned into initializers.
  const Graph& compiled_graph() const;
  // Provider that runs each node of compiled_graph(), index for index.
  const std::vector<std::string>& node_providers() const;
  // The partition: for each node of compiled_graph(), its provider and why the providers
  // ahead of it declined.
  const std::vector<NodeAssignment>& partition() const;
  // Shape specializations compiled so far (see SessionOptions::shape_specializations),
  // and the stats of the one the last run used (stats() when it used none).
  int64_t num_specializations() const;
  CompileStats last_run_stats() const;

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class KernelRegistry;

// Makes a provider's kernels selectable by name in SessionOptions::providers (a second
// registry of the same name replaces the first). "cpu" and "ref" are always registered. The
// registry must outlive every session compiled with it.
void register_provider(const KernelRegistry* registry);
// The registry of a provider name; nullptr when none is registered under that name.
const KernelRegistry* find_provider(const std::string& name);

// An op that none of the given providers has a kernel for, at the model's opset.
struct UnsupportedOp {
  std::string op;                  // "domain:Op (opset N)"
  std::string reason;              // why: not implemented, other opsets only, provider not selected
  std::vector<std::string> nodes;  // the nodes that need it, in file order
};

// The ops of a model that the providers cannot run, one entry per op (nodes in
// subgraphs included; nodes no graph output depends on, which compile drops, left out).
// Looks at the graph only, so it answers before compile touches any weight.
std::vector<UnsupportedOp> unsupported_op_report(const Model& model,
                                                 const std::vector<std::string>& providers = {"cpu", "ref"});
// The same as "domain:Op (opset N)" strings.
std::vector<std::string> unsupported_ops(const Model& model,
                                         const std::vector<std::string>& providers = {"cpu", "ref"});

}  // namespace slim
