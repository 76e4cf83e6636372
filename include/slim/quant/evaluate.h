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
  // (with labels) the first output, or any with EvalOptions::outputs_as_logits; or one
  // integer label per row. Rows: every position before the last axis (every element for
  // labels).
  bool classifier = false;
  int64_t rows = 0, top1_agree = 0;
  double kl_mean = 0;  // mean over rows of KL(float || quantized), in nats (labels: 0)
  // Over every element. A NaN on one side only makes max_abs infinite and the cosine NaN;
  // NaN against NaN agrees.
  double cosine = 0, max_abs = 0;
  // With labels (one per sample, on a classifier whose rows are the samples).
  std::optional<double> accuracy_float, accuracy_quantized;
};

// What an output holds, which decides how two models' versions of it are compared.
enum class OutputKind {
  values,             // numbers: cosine and max |difference| only
  probabilities,      // a class distribution on the last axis (a Softmax's output)
  log_probabilities,  // its logarithm (a LogSoftmax's)
  logits,             // scores on the last axis; their softmax is the distribution
  labels,             // one integer class per element
};

// The kind a tensor's shape suggests (rows on the first axis): a row that is one vector of
// C > 1 floats (axes of 1 before it aside) holds logits, one integer a label, anything
// else values.
OutputKind guess_output_kind(const Tensor& t);

// How far a second model's version of one output departs from the first's, accumulated
// over batches: the comparison behind `slim quantize --eval`, `slim certify` and the
// server's canary check.
class OutputComparison {
 public:
  OutputComparison(std::string name, OutputKind kind) : name_(std::move(name)), kind_(kind) {}
  // One batch of both sides. Different shapes are an invalid_argument error naming the
  // output. `labels` (n of them): the true classes, counted when n equals the rows.
  void add(const Tensor& first, const Tensor& second, const int64_t* labels = nullptr, int64_t n = 0);
  OutputAgreement result() const;
  OutputKind kind() const { return kind_; }

 private:
  std::string name_;
  OutputKind kind_;
  double dot_ = 0, na_ = 0, nb_ = 0, max_abs_ = 0, kl_ = 0;
  int64_t rows_ = 0, agree_ = 0, nan_mismatch_ = 0, labeled_ = 0, correct_first_ = 0, correct_second_ = 0;
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
