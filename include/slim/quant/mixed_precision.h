// Mixed precision under a latency or accuracy budget (`slim quantize --latency-budget-ms`,
// `--accuracy-budget`): the quantizable nodes are grouped into layers (one Conv, ConvTranspose,
// MatMul or Gemm with the elementwise and data-movement nodes that follow it); each layer's
// sensitivity (the loss on calibration samples when it alone is int8, or int4 weight-only
// for a MatMul/Gemm with a constant weight) and its latency in fp32, int8 and int4 (per-node
// profiles of the compiled all-fp32, all-int8 and all-int4 models, Q/DQ nodes charged to
// the layer they serve) are measured on this machine; a knapsack over the layers picks each
// one's precision for the least predicted loss within the latency budget (or the least
// latency within the loss budget); the losses of sets do not
// add up, so candidate plans near the budget (the knapsack's front, contiguous runs, and
// swap/drop moves from the best) are then built and their loss measured, and the plan of
// least measured loss within the budget is written. docs/quantization.md §11 has the
// formulas.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slim/onnx/graph.h"
#include "slim/quant/quantizer.h"
#include "slim/quant/sample_set.h"

namespace slim::quant {

// A layer's precision in a plan. fp16 is not one: slim's CPU kernels compute in fp32.
enum class Precision : uint8_t { fp32, int8, int4 };
const char* precision_name(Precision p);

// One quantizable layer: `nodes` (names in the prepared model) are quantized together.
struct Layer {
  std::string name;  // its Conv/ConvTranspose/MatMul/Gemm (or its first node)
  std::string op;
  std::vector<std::string> nodes;
  // Measurements.
  // Its loss: the mean of the loss when it alone is int8 (alone) and what keeping it alone
  // in fp32 saves of the all-int8 loss (leave_one_out). An activation between two layers is
  // quantized when either is int8: the alone losses count it twice, the leave-one-out ones
  // not at all, their mean once.
  double loss = 0, loss_alone = 0, loss_leave_one_out = 0;
  // Weight-only int4 (MatMulNBits), offered for a MatMul/Gemm anchor with a constant 2-D
  // weight: the loss when the anchor alone is int4 (weight-only: no activation is shared
  // with a neighbour, so these add up better), its time in the all-int4 model.
  bool int4 = false;
  double loss_int4 = 0, int4_ms = 0;
  // Time charged to it (median of runs) in the all-fp32 and the all-int8 profiles, and in
  // the profile of the model where it alone is int8 (its Q/DQ at the fp32 borders included).
  double fp32_ms = 0, int8_ms = 0, int8_alone_ms = 0;
  double saving_ms() const { return fp32_ms - int8_ms; }
  // What int8 neighbours save it: the Q/DQ pairs at borders with fp32 layers.
  double border_ms() const { return std::max(0.0, int8_alone_ms - int8_ms); }
};

// Groups the prepared model's quantizable nodes (QuantizeOptions::op_types, less
// exclude_nodes) into layers, in topological order.
std::vector<Layer> quantizable_layers(const Model& prepared, const QuantizeOptions& options);

// What measure_layers found: everything the choice needs, and what a plan file keeps.
struct Measurements {
  std::string model_sha256;
  std::string metric;  // "kl" (softmax outputs) or "1-cosine"; summed over the outputs
  std::vector<Layer> layers;
  double fp32_ms = 0, int8_ms = 0;  // end-to-end medians without the profiler, one sample
  double fp32_profiled_ms = 0, int8_profiled_ms = 0;  // kernel time summed, medians
  double int8_loss = 0;                               // all layers int8
  // The profiled layer changes times this give the end-to-end ones (predicted_latency).
  double scale = 1;
  int64_t samples = 0;
  int runs = 0, threads = 0;
  // What the times were read on: "process CPU time" with one thread (immune to other
  // processes sharing the cores), else "wall time".
  std::string clock;
};

struct MixedPrecisionOptions {
  std::optional<double> latency_budget_ms;  // minimize loss subject to latency ≤ this
  std::optional<double> accuracy_budget;    // or latency subject to predicted loss ≤ this
  int64_t samples = 16;                     // calibration samples for the loss
  int latency_runs = 20;                    // timed runs per model (medians)
  int tries = 5;  // builds of the chosen plan: a re-measure over budget tightens the target
  // Candidate plans whose loss is measured per build (0: the knapsack's choice as is).
  int evaluations = 24;
  bool int4 = true;  // offer int4 weight-only for MatMul/Gemm layers with constant weights
  // Measurements to choose from instead of measuring (a plan file's, read_plan), for
  // another budget; they must be of this model with these quantizer settings.
  std::optional<Measurements> measurements;
  // Called as work proceeds: (stage, done, total).
  std::function<void(const std::string&, int64_t, int64_t)> progress;
};

// T(P) = fp32_ms + scale · (Σ_{i int8} [(int8_ms − fp32_ms) + border_ms/2 per neighbour in
// the layer order that is not int8] + Σ_{i int4} (int4_ms − fp32_ms)): a plan's predicted
// latency.
double predicted_latency(const Measurements& m, const std::vector<Precision>& precision);

// Measures every layer's sensitivity and latency. `qo` is the quantizer's settings
// (SmoothQuant is refused: its factors depend on which nodes are quantized).
Measurements measure_layers(const std::string& model_path, const SampleSet& calib,
                            const QuantizeOptions& qo, const MixedPrecisionOptions& mo);

struct PlanPoint {
  double latency_ms = 0, loss = 0;   // predicted
  std::vector<Precision> precision;  // per layer
  int64_t layers(Precision p) const;
};

struct Plan {
  PlanPoint chosen;
  std::vector<PlanPoint> pareto;  // by latency, ascending; loss descending
  double fastest_ms = 0;          // the front's fastest point
};

// The choice from measurements (no model runs): throws invalid_argument when the latency
// budget is below the fastest reachable latency (naming both) or no budget is given.
// `target_ms` overrides the latency budget (the retries of run_mixed_precision).
Plan choose_plan(const Measurements& m, const MixedPrecisionOptions& o,
                 std::optional<double> target_ms = std::nullopt);

// The quantizer settings that write a plan: `base` with the nodes of the plan's fp32 and
// int4 layers excluded from int8 and the int4 layers' anchors in int4_nodes.
QuantizeOptions plan_quantizer(const Measurements& m, const std::vector<Precision>& precision,
                               QuantizeOptions base);

struct Verification {
  // End-to-end medians of the written model and of the all-fp32 one, runs alternating,
  // one sample; normalized: latency_ms · (Measurements::fp32_ms / fp32_latency_ms), the
  // written model's time at the load the layers were measured under.
  double latency_ms = 0, fp32_latency_ms = 0, normalized_ms = 0;
  double loss = 0;  // on the same samples and metric as the sensitivities
};

// What building a candidate plan measured: its loss (the same meter as the sensitivities)
// and, under a latency budget, its latency (timed alternating with the all-fp32 model and
// normalized as Verification::normalized_ms; negative: not timed).
struct CandidateMeasure {
  double loss = 0, latency_ms = -1;
  CandidateMeasure() = default;
  CandidateMeasure(double l, double ms = -1) : loss(l), latency_ms(ms) {}  // NOLINT: a loss alone
};

// A candidate plan built and measured.
struct Candidate {
  std::string source;  // "front", "run a-b" (a run of int8 layers), "i=fp32 j=int8" (a move)
  PlanPoint point;     // predicted latency and loss
  double loss = 0;     // measured
  double target_ms = 0;  // the latency target it was evaluated for
  double measured_ms = -1;  // measured latency, normalized (negative: not timed)
  int timings = 0;          // the timings measured_ms is the mean of
  // The latency it is held to the budget by: measured where timed, else T(P).
  double latency_ms() const { return measured_ms >= 0 ? measured_ms : point.latency_ms; }
};

// Candidates near the latency target, measured with `measure` (at most `evaluations` new
// ones; `evaluated` holds those measured before and is extended; a plan is measured once),
// from the front's points that fit (the nearest the target first), contiguous runs of
// int8 layers that fit (the shortest prefix and suffix, and the runs of least predicted
// loss), and, from the best measured so far, moves of one or two layers to another
// precision that fit (drops back to fp32, swaps), ranked by predicted loss. A plan fits
// when T(P) plus T(P)'s error, fitted over the timed candidates as a + b · (the plan's int8
// borders), is within the target (a move: the base plan's own measured error plus b times
// the borders it adds); seeds are taken again with the fitted error when none timed fits.
// Returns the plan of least measured loss whose latency (measured where timed, else T(P))
// is within the target (the front's choice when none is). With an accuracy budget
// instead: the front's points are bisected for the fastest whose measured loss is within
// it. docs/quantization.md §11 has the details.
PlanPoint search_plans(
    const Measurements& m, const Plan& plan, const MixedPrecisionOptions& o, double target_ms,
    const std::function<CandidateMeasure(const std::vector<Precision>&)>& measure,
    std::vector<Candidate>& evaluated);

// The search keeps the least loss among the candidates timed within the target, and
// among several near it that favours those whose one timing came out low (a timing's noise
// is about 1.5 % on PP-OCR's recognizer): the plan written then re-measured over the
// budget, and the next build aimed lower and lost more. So the candidates of least loss
// timed up to 3 % over the target are timed again with `time` (normalized as
// Candidate::measured_ms), in order of loss, at most 3; each is held to the target by the
// mean of its timings (measured_ms and timings updated), and the first that fits is
// returned (none: the search's choice stands).
std::optional<PlanPoint> confirm_plan(
    double target_ms, std::vector<Candidate>& evaluated,
    const std::function<double(const std::vector<Precision>&)>& time,
    const std::function<void(int64_t, int64_t)>& progress = nullptr);

struct MixedPrecisionResult {
  Measurements measurements;
  Plan plan;
  std::vector<Candidate> candidates;  // every plan whose loss was measured, in order
  Verification measured;
  double target_ms = 0;  // the latency the last try aimed at (the budget, or tighter)
  int tries = 0;
  struct Try {
    double target_ms, predicted_ms, measured_ms, normalized_ms, loss;
    int64_t int8_layers, int4_layers;
  };
  std::vector<Try> history;
};

// measure_layers, choose_plan, quantize_model with the fp32 layers excluded to `output`,
// then the written model's latency and loss measured; over the latency budget, the plan is
// chosen again for the budget less the overshoot (up to mo.tries builds).
MixedPrecisionResult run_mixed_precision(const std::string& model_path, const std::string& output,
                                         const SampleSet& calib, const QuantizeOptions& qo,
                                         const MixedPrecisionOptions& mo);

// The plan file (JSON): the model's SHA-256, the quantizer settings, the measurements, the
// Pareto front and each layer's precision and nodes.
std::string plan_to_json(const MixedPrecisionResult& r, const QuantizeOptions& qo,
                         const MixedPrecisionOptions& mo);

struct LoadedPlan {
  Measurements measurements;
  std::vector<Precision> precision;
  QuantizeOptions quantizer;  // the settings the plan was made with
};
// Reads a plan file; errors name the file.
LoadedPlan read_plan(const std::string& path);
// The quantizer options that re-apply a plan to `model_path` (no measuring): the plan's
// settings with its fp32 layers excluded. Errors: the model's SHA-256 is not the plan's
// (another model), a node of the plan that the prepared model lacks.
QuantizeOptions plan_options(const LoadedPlan& plan, const std::string& plan_path,
                             const std::string& model_path, const QuantizeOptions& base);

// The mutually exclusive options of `slim quantize`'s mixed precision; throws
// invalid_argument naming them.
struct MixedPrecisionFlags {
  bool latency_budget = false, accuracy_budget = false, plan = false, plan_out = false,
       pareto_png = false, exclude = false, smoothquant = false, measurements = false;
};
void check_mixed_precision_flags(const MixedPrecisionFlags& f);

}  // namespace slim::quant
