// Accuracy of a quantized model, measured against its float original on held-out data:
// per output, top-1 agreement and KL divergence for class distributions, cosine and max
// |difference| for every output, and accuracy against labels when they are given.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/quant/sample_set.h"

namespace slim::quant {

struct EvalOptions {
  int64_t batch = 8;
  int64_t max_samples = 0;  // 0: all
  int num_threads = 0;
  std::vector<std::string> providers = {"cpu", "ref"};
  std::function<void(int64_t, int64_t)> progress;
  // Wraps each batch's run (of `samples` samples) of one model (`quantized`: the second),
  // so a caller can time and meter the two apart.
  std::function<void(bool quantized, int64_t samples, const std::function<void()>& run)> around_run;
  // Read every f32 output that is not a Softmax/LogSoftmax's as logits over its last axis
  // (when that has at least 2 entries): top-1 agreement and KL of their softmax.
  bool outputs_as_logits = false;
};

struct OutputAgreement {
  std::string name;
  // A class distribution along the last axis: the output of a Softmax or LogSoftmax, or
  // (with labels) the first output, or any with EvalOptions::outputs_as_logits. Rows: every position before the last axis.
  bool classifier = false;
  int64_t rows = 0, top1_agree = 0;
  double kl_mean = 0;  // mean over rows of KL(float || quantized), in nats
  double cosine = 0, max_abs = 0;
  // With labels (one per sample, on a classifier whose rows are the samples).
  std::optional<double> accuracy_float, accuracy_quantized;
};

struct EvalReport {
  int64_t samples = 0;
  std::vector<OutputAgreement> outputs;
};

// Runs both models on `data`. `labels`, when defined, holds one integer class per sample.
EvalReport evaluate_quantized(const std::string& float_model, const std::string& quantized_model,
                              const SampleSet& data, const Tensor& labels,
                              const EvalOptions& options);

}  // namespace slim::quant
