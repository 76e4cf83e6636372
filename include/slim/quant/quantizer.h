// Static 8-bit quantization of ONNX models: calibration statistics from a float model
// run on real data (cached), calibrated ranges, optional SmoothQuant and bias correction,
// and a QDQ model (QuantizeLinear/DequantizeLinear pairs around weights and activations,
// ONNX Runtime's layout) written next to everything else of the original file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "slim/onnx/graph.h"
#include "slim/quant/calibrators.h"
#include "slim/quant/sample_set.h"
#include "slim/quant/statistics.h"

namespace slim::quant {

struct QuantizeOptions {
  CalibratorOptions calibrator;
  ActivationType activations;
  bool per_channel = true;  // weights: one scale per output channel (else per tensor)
  // Weights in 7 bits, [−64, 64] (ONNX Runtime's reduce_range): AVX2 CPUs without VNNI
  // multiply them at full speed (no weight split, dnnl_int8.h), at some accuracy.
  bool reduce_range = false;
  // SmoothQuant: for MatMul/Gemm with constant weights, x·W = (x / s)·(s·W) with
  // s_j = a_j^α / w_j^(1−α) (a_j: channel j's max |x|, w_j: row j's max |W|). 0 is off.
  double smoothquant_alpha = 0;
  // The a_j SmoothQuant uses: this percentile of channel j's |x| (100: its max), so one
  // extreme value does not set a channel's factor.
  double smooth_clip = 100;
  bool bias_correction = false;    // correct each bias for the mean shift weight rounding causes
  std::set<std::string> op_types;  // ops to quantize; empty: default_op_types()
  std::set<std::string> exclude_nodes;  // nodes left in float
  // MatMul/Gemm nodes with constant weights written as weight-only 4-bit com.microsoft
  // MatMulNBits (blocks of int4_block along K; never int8), for mixed precision.
  std::set<std::string> int4_nodes;
  int64_t int4_block = 32;
  int64_t batch = 8;                    // samples per run where the batch dim is free
  int64_t max_samples = 0;              // 0: the whole calibration set
  int num_threads = 0;
  std::vector<std::string> providers = {"cpu", "ref"};
  std::string cache_dir;  // the calibration cache's folder; "" keeps no cache
  // Called as samples go through the float model (done, total).
  std::function<void(int64_t, int64_t)> progress;
};

const std::set<std::string>& default_op_types();

struct QuantizeReport {
  int64_t opset_from = 0, opset_to = 0;
  int64_t samples = 0;
  bool stats_from_cache = false;  // every statistics pass was read from the cache
  std::vector<std::string> cache_files;
  double calibration_seconds = 0;                  // running the float model (0 when cached)
  std::map<std::string, int64_t> nodes_quantized;  // by op type
  int64_t activations_quantized = 0, weights_quantized = 0, biases_quantized = 0;
  int64_t activations_removed = 0;  // Relu/Clip whose clamp the QuantizeLinear does
  int64_t batch_norms_folded = 0, smoothed = 0, bias_corrected = 0;
  int64_t int4_weights = 0;  // MatMul/Gemm weights written as 4-bit MatMulNBits
  int64_t weight_bytes_float = 0, weight_bytes_quantized = 0;
  // Per group of activations that share a scale: their names, the observed and the
  // chosen range, and the QuantizeLinear parameters.
  struct ActivationRange {
    std::vector<std::string> names;
    double min = 0, max = 0;
    Range range;
    QuantParams params;
  };
  std::vector<ActivationRange> ranges;
};

// Quantizes the model at `input` and writes the QDQ model to `output`.
QuantizeReport quantize_model(const std::string& input, const std::string& output,
                              const SampleSet& calib, const QuantizeOptions& options);

}  // namespace slim::quant
