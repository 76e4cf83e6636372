// The steps of quantize_model, each in its own file: preparing the float graph,
// collecting statistics (and the cache), SmoothQuant, and writing Q/DQ nodes.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slim/onnx/graph.h"
#include "slim/quant/quantizer.h"
#include "slim/runtime/session.h"

namespace slim::quant::detail {

// Names in use anywhere in a model (subgraphs included), and fresh ones.
class NameSet {
 public:
  explicit NameSet(const Graph& g);
  std::string fresh(const std::string& base);

 private:
  std::set<std::string> names_;
};

// Who produces and who reads each value of the main graph.
struct GraphIndex {
  explicit GraphIndex(const Graph& g);
  std::map<std::string, size_t> producer;                // value -> node index
  std::map<std::string, std::vector<size_t>> consumers;  // value -> node indices (each once)
  std::set<std::string> captured;                        // read inside subgraphs
  std::set<std::string> graph_outputs, graph_inputs;
  const Tensor* constant(const Graph& g, const std::string& name) const;
};

// Erases the initializers in `replaced` (float ones a writer stood quantized ones in for)
// that no node, graph output or subgraph (index.captured) reads any more.
void erase_unread_initializers(Graph& g, const GraphIndex& index,
                               const std::set<std::string>& replaced);

// The ops quantize_model knows, and how it treats each.
// An integer attribute (the QDQ and MatMulNBits writers).
Attribute int_attr(int64_t v);

bool is_quantizable_op(const std::string& op);
// Ops whose output takes its input's scale (data movement, max pooling): exact in 8 bits.
bool shares_input_scale(const std::string& op);
// The weight input of a weighted node (Conv, ConvTranspose, MatMul, Gemm) when it is a
// constant, and the axis of its output channels; -1 otherwise.
int weight_input(const Graph& g, const GraphIndex& index, const Node& n);
int weight_channel_axis(const Graph& g, const Node& n);
// Inputs of a quantized node that are activations (float, not constants).
std::vector<size_t> activation_inputs(const Graph& g, const GraphIndex& index, const Node& n);

// Opset 13, Constant nodes as initializers, BatchNormalization folded into Conv/Gemm.
// Depends on the model only, so statistics of the prepared model can be cached.
void prepare_float_model(Model& model, QuantizeReport& report);

struct ObserveSpec {
  bool channels = false;  // keep per-channel statistics along `axis` (negative: from the end)
  int axis = 0;
  bool histograms = false;  // and per-channel histograms
};
using ObservePlan = std::map<std::string, ObserveSpec>;
// Every activation a quantizable node reads or writes, whatever the options choose.
ObservePlan observe_plan(const Model& model);

// Runs a model batch by batch: one session per set of input shapes (the last batch may
// be short), compiled with the model's symbolic input dims fixed to them, so the cpu
// provider claims every node from the first run.
class BatchRunner {
 public:
  BatchRunner(Model model, SessionOptions options)
      : model_(std::move(model)), options_(std::move(options)) {}
  TensorMap run(const TensorMap& feeds, const std::vector<std::string>& outputs);

 private:
  Model model_;
  SessionOptions options_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;  // by input shapes
};

// Samples per run: an input's fixed first dim decides; otherwise `wanted`.
int64_t samples_per_run(const Model& model, const SampleSet& data, int64_t wanted);

// Runs the model over the samples and returns the observed tensors' statistics (f32
// tensors only), reading and writing the cache under options.cache_dir with `key`.
StatsMap collect_statistics(const Model& model, const SampleSet& data, const ObservePlan& plan,
                            const QuantizeOptions& options, const std::string& key,
                            QuantizeReport& report);

// SmoothQuant on the model's MatMul/Gemm nodes with constant weights; returns how many.
int64_t smooth_quant(Model& model, const StatsMap& stats, const QuantizeOptions& options);

// The model prepared for quantization (prepare_float_model, SmoothQuant when asked) and
// the statistics of its activations: quantize_model's steps before insert_qdq, which
// mixed precision runs once and then quantizes many subsets of the nodes from.
struct PreparedModel {
  Model model;
  StatsMap stats;
};
PreparedModel prepare_and_collect(const std::string& input, const SampleSet& calib,
                                  const QuantizeOptions& options, QuantizeReport& report);

// Quantizes weights and biases and puts Q/DQ pairs around the chosen activations.
void insert_qdq(Model& model, const StatsMap& stats, const QuantizeOptions& options,
                QuantizeReport& report);

// Why a node cannot be written as weight-only 4-bit MatMulNBits; nullopt when it can
// (a MatMul, or a Gemm without transA and with alpha and beta 1, with a constant 2-D float
// weight).
std::optional<std::string> int4_refusal(const Graph& g, const GraphIndex& index, const Node& n);
// Replaces options.int4_nodes by MatMulNBits (bits 4, blocks of options.int4_block along K,
// per-block scales and 4-bit zero points); errors name a node that is missing or refused.
void insert_matmul_nbits(Model& model, const QuantizeOptions& options, QuantizeReport& report);

}  // namespace slim::quant::detail
