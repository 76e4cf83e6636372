#include "slim/quant/quantizer.h"

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/trust/digest.h"

namespace slim::quant {

namespace {

// Bump when the statistics or the preparation change, so old cache files are not used.
constexpr const char* kStatsVersion = "slim-calib-1";

std::string hex_sha256(const std::string& s) {
  return trust::to_hex(trust::hash_bytes(trust::HashAlg::sha256, s));
}

}  // namespace

const std::set<std::string>& default_op_types() {
  static const std::set<std::string> ops = {
      "Conv",      "ConvTranspose", "MatMul",    "Gemm",        "Add",
      "Mul",       "Concat",        "MaxPool",   "AveragePool", "GlobalAveragePool",
      "Relu",      "Clip",          "LeakyRelu", "Sigmoid",     "HardSigmoid",
      "Tanh",      "Reshape",       "Flatten",   "Transpose",   "Squeeze",
      "Unsqueeze", "Slice",         "Gather",    "Split",       "Resize"};
  return ops;
}

namespace detail {

PreparedModel prepare_and_collect(const std::string& input, const SampleSet& calib,
                                  const QuantizeOptions& options, QuantizeReport& rep) {
  for (const auto& op : options.op_types)
    check(default_op_types().count(op) != 0, ErrorCode::invalid_argument,
          "cannot quantize op type '" + op +
              "' (quantizable: Conv, ConvTranspose, MatMul, Gemm, Add, Mul, Concat, "
              "MaxPool, AveragePool, GlobalAveragePool, Relu, Clip, LeakyRelu, Sigmoid, "
              "HardSigmoid, Tanh, Reshape, "
              "Flatten, Transpose, Squeeze, Unsqueeze, Slice, Gather, Split, Resize)");
  check(options.smoothquant_alpha >= 0 && options.smoothquant_alpha < 1,
        ErrorCode::invalid_argument,
        "SmoothQuant's alpha must be in (0, 1) (0: off), got " +
            std::to_string(options.smoothquant_alpha));
  check(options.smooth_clip > 0 && options.smooth_clip <= 100, ErrorCode::invalid_argument,
        "the SmoothQuant clip percentile must be in (0, 100], got " +
            std::to_string(options.smooth_clip));
  check(options.calibrator.percentile > 0 && options.calibrator.percentile <= 100,
        ErrorCode::invalid_argument,
        "the percentile must be in (0, 100], got " + std::to_string(options.calibrator.percentile));
  PreparedModel p{OnnxImporter::load_file(input), {}};
  Model& model = p.model;
  detail::prepare_float_model(model, rep);
  std::set<std::string> nodes;
  for (const auto& n : model.graph.nodes) nodes.insert(n.name);
  for (const auto& n : options.exclude_nodes)
    check(nodes.count(n) != 0, ErrorCode::invalid_argument,
          input + ": --exclude names no node '" + n + "'");
  const int64_t samples =
      options.max_samples > 0 ? std::min(options.max_samples, calib.size()) : calib.size();
  rep.samples = samples;
  const std::string base = trust::to_hex(trust::hash_file(trust::HashAlg::sha256, input)) + "|" +
                           calib.digest() + "|" + std::to_string(samples) + "|" + kStatsVersion;
  rep.stats_from_cache = true;
  StatsMap& stats = p.stats;
  stats = detail::collect_statistics(model, calib, detail::observe_plan(model), options,
                                     hex_sha256(base), rep);
  if (options.smoothquant_alpha > 0) {
    rep.smoothed = detail::smooth_quant(model, stats, options);
    if (rep.smoothed) {
      std::string key = base + "|smoothquant " + std::to_string(options.smoothquant_alpha) + " " +
                        std::to_string(options.smooth_clip) + " ops";
      for (const auto& op : options.op_types) key += " " + op;
      key += " exclude";
      for (const auto& n : options.exclude_nodes) key += " " + n;
      stats = detail::collect_statistics(model, calib, detail::observe_plan(model), options,
                                         hex_sha256(key), rep);
    }
  }
  return p;
}

}  // namespace detail

QuantizeReport quantize_model(const std::string& input, const std::string& output,
                              const SampleSet& calib, const QuantizeOptions& options) {
  QuantizeReport rep;
  detail::PreparedModel p = detail::prepare_and_collect(input, calib, options, rep);
  detail::insert_qdq(p.model, p.stats, options, rep);
  detail::insert_matmul_nbits(p.model, options, rep);
  OnnxExporter::save_file(p.model, output);
  return rep;
}

}  // namespace slim::quant
