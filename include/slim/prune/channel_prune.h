// Structured channel pruning of ONNX CNNs (`slim prune model.onnx`). A dependency graph
// couples the channels that must go together: a Conv's output channels with the
// BatchNormalization, activations and pools after it, with the other operands of
// residual Adds and squeeze-excitation Muls, through depthwise convolutions (input and
// output channel are one), across Concat (at each input's offset), Flatten/Reshape into
// Gemm/MatMul in-features, Resize and Pad. Every channel ("unit") is the set of tensor
// slices it owns: producer weight rows, BN parameters, consumer weight columns. Units
// that reach a graph input or output, or an op the analysis does not understand, are
// kept, and the report says which and why. The least important units (L1/L2 weight
// norm, BN scale, or the energy they contribute to the layers that read them, measured
// on calibration data), normalized within their group, go first until the MACs (and
// parameters) reach the target; each group keeps at least one channel and a multiple of
// `channel_multiple`. With calibration samples, the layers that read pruned channels are
// corrected: their biases take the removed channels' mean contribution, then their output
// channels' mean and variance are matched to the original model's, layer by layer.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"

namespace slim::prune {

enum class Criterion { l1, l2, bn, output };
Criterion parse_criterion(const std::string& name);  // "l1", "l2", "bn", "output"
std::string criterion_name(Criterion c);

struct ChannelPruneOptions {
  double target_flops = 1;   // keep at most this fraction of the Conv/Gemm/MatMul MACs
  double target_params = 1;  // and of the parameters
  Criterion criterion = Criterion::l2;
  int channel_multiple = 8;
  // Rank chunks by importance / (MACs a channel saves / the mean)^cost_weight: 0 ranks
  // by importance alone, 1 by importance per MAC saved.
  double cost_weight = 0;  // kept channels per group: a multiple of this (or the whole group)
  bool bias_correction = true;  // needs calibration samples
  // And then, layer by layer in graph order, scale and shift each reading layer's output
  // channels so that their mean and variance on the calibration samples match the
  // original model's (what BatchNormalization recalibration does, for any Conv/Gemm).
  bool recalibrate = true;
  // Calibration samples, one feed map per run (each with the model's inputs). The first
  // fixes the input shape used to count MACs; with none, the model's inputs need fixed
  // dims (a symbolic first dim counts as 1).
  std::vector<std::map<std::string, Tensor>> calibration;
  int threads = 0;
  std::function<void(const std::string& stage, int64_t done, int64_t total)> progress;
};

// One set of coupled channels: the values that carry them, and whether they may go.
struct ChannelGroup {
  std::vector<std::string> values;  // the tensors whose channel axis the group spans
  int64_t channels = 0, kept = 0;
  bool prunable = false;
  std::string reason;  // why not, when !prunable
};

// A slice of a tensor that pruning removed from an input of a node that reads the
// group's channels (a consumer's weight columns, in-features): zeroing those slices in
// the original model gives the pruned model's outputs (without bias correction).
struct RemovedSlice {
  std::string tensor;  // initializer name in the original model (Constant nodes included)
  int axis = 0;
  std::vector<int64_t> indices;
};

struct ChannelPruneReport {
  int64_t params_before = 0, params_after = 0;
  int64_t macs_before = 0, macs_after = 0;  // per sample, at the analysis input shape
  std::string input_shape;                  // "x: [1,3,48,192]"
  Criterion criterion = Criterion::l2;
  bool target_reached = true;
  int64_t bias_corrected = 0;  // layers whose bias took removed channels' mean
  int64_t recalibrated = 0;    // layers whose output statistics were matched
  std::vector<ChannelGroup> groups;
  std::vector<RemovedSlice> consumer_slices;
  std::vector<std::string> notes;  // e.g. groups scored by l2 for want of a BatchNormalization
};

// Prunes `model` in place (Constant nodes become initializers). Errors: invalid_argument
// for targets outside (0, 1] or a criterion that needs calibration samples without them.
ChannelPruneReport prune_channels(Model& model, const ChannelPruneOptions& options);

// Loads `input`, prunes it and writes `output` (through OnnxExporter).
ChannelPruneReport prune_channels_file(const std::string& input, const std::string& output,
                                       const ChannelPruneOptions& options);

}  // namespace slim::prune
