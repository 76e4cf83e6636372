// Canary trials of `slim serve` (docs/architecture.md, "serve"): the config parameters
// that ask for one, and the check of a new version's outputs against the serving
// version's on a reference input set before any request goes to it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/serve/model_config.h"

namespace slim::serve {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// A new version serving a share of the requests beside the old one for a window, then
// promoted or dropped by its error rate and p99 latency against the old one's (config
// parameters canary_share, canary_priority, canary_window_secs,
// canary_max_error_rate_increase, canary_max_p99_ratio). With canary_reference it first
// runs the reference inputs beside the old one and is dropped at once when its outputs
// disagree beyond canary_min_top1_agreement (classifier outputs) or canary_max_abs_diff
// (the others).
struct CanaryPolicy {
  double share = 0;       // of the requests, 0 < share <= 1
  uint32_t priority = 0;  // only requests of this level (0: any)
  int window_secs = 60;
  double max_error_rate_increase = 0.01;
  double max_p99_ratio = 1.5;
  std::string reference_file;  // as the config names it, relative to the model's folder; "" : none
  NamedTensors reference;      // one array per model input, the first axis indexing the samples
  double min_top1_agreement = 0.99;  // share of the reference rows whose top-1 class must agree
  double max_abs_diff = 1e-3;        // largest difference allowed in any element of another output
};

// Reads a model's canary parameters, and its reference set from the model's folder
// `model_dir`. A bad value, a reference file that is missing, malformed, outside the
// folder or of arrays that disagree on the sample count, and a tolerance without a
// reference set are invalid_model errors naming the model and parameter.
CanaryPolicy canary_policy(const ModelConfig& config, const std::string& model_dir);

// The reference set cut into requests: chunks of at most `max_batch_size` rows, or rows
// one at a time without their sample axis when the model does not batch (0).
std::vector<NamedTensors> reference_chunks(const NamedTensors& reference, int64_t max_batch_size);
// The outputs of those requests, in order, put back together with the samples on the
// first axis (`batched`: as cut for a model that batches).
NamedTensors stack_chunks(const std::vector<NamedTensors>& outputs, bool batched);

// How a new version's outputs on the reference rows compare with the serving version's.
// An output whose sample is one vector of C > 1 floats (scores; dims of 1 before it do
// not count) or one integer (a label) is a classifier's, measured by the share of rows
// whose top-1 class (the argmax, or the label) agrees; any other output by the largest
// absolute difference of an element (a NaN on one side only counts as infinite).
struct OutputAgreement {
  int64_t rows = 0;
  std::optional<double> top1_agreement;  // the lowest over the classifier outputs
  std::optional<double> max_abs_diff;    // the highest over the other outputs
  std::string top1_output, diff_output;  // where each was measured
};
// Compares the outputs both sides have (tensors with the rows on their first axis). A
// shared output whose shapes differ, or no shared output, is an invalid_argument error.
OutputAgreement compare_outputs(const NamedTensors& serving, const NamedTensors& candidate);
// "" when the agreement is within the policy's bounds, else why not.
std::string disagreement(const OutputAgreement& a, const CanaryPolicy& p);
// For the audit: the rows, and each measured value with its bound and output.
nlohmann::json agreement_json(const OutputAgreement& a, const CanaryPolicy& p);

}  // namespace slim::serve
