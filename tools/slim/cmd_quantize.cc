// slim quantize: GGUF language models (llama.cpp's weight formats) and ONNX networks
// (calibrated 8-bit QDQ, optionally evaluated against the float model); the file's type
// picks the path.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "commands.h"
#include "plot.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/core/progress.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/quantize.h"
#include "slim/onnx/importer.h"
#include "slim/quant/evaluate.h"
#include "slim/quant/mixed_precision.h"
#include "slim/quant/quantizer.h"

namespace slim::cli {
namespace {

namespace fs = std::filesystem;

struct QuantizeArgs {
  std::string in, out_positional, out, type;
  int threads = 0;
  // ONNX
  std::string calib, preprocess, calibrator = "minmax", activations = "u8", ops, exclude, cache_dir,
                                 eval, labels, json, providers = "cpu,ref";
  double percentile = 99.999, smoothquant = 0, smooth_clip = 100;
  bool per_tensor = false, symmetric = false, bias_correction = false, no_cache = false,
       verbose = false, reduce_range = false;
  int64_t batch = 8, max_samples = 0;
  // Mixed precision
  double latency_budget = 0, accuracy_budget = 0;
  bool has_latency_budget = false, has_accuracy_budget = false;
  std::string plan, plan_out, pareto_png, measurements;
  int64_t sensitivity_samples = 16;
  int latency_runs = 20, search_evaluations = 24;
  int64_t int4_block = 32;
  bool no_int4 = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(p);
  return out;
}

// $XDG_CACHE_HOME/slim/calib, else ~/.cache/slim/calib; "" when neither is set.
std::string default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "slim" / "calib").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "slim" / "calib").string();
  return "";
}

// A progress line per pass over the data, drawn only on a terminal.
std::function<void(int64_t, int64_t)> progress_line(const std::string& label,
                                                    std::unique_ptr<Progress>& p) {
  return [&p, label](int64_t done, int64_t total) {
    if (!p) p = std::make_unique<Progress>(label, total);
    p->update(done);
    if (done >= total) p.reset();
  };
}

void quantize_gguf(const QuantizeArgs& a) {
  check(!a.type.empty(), ErrorCode::invalid_argument,
        "quantize: a GGUF model needs --type (q8_0, q4_0, q4_k, q6_k, q4_k_m)");
  check(!a.out.empty(), ErrorCode::invalid_argument, "quantize: give the output file (-o OUTPUT)");
  check(a.calib.empty() && a.eval.empty(), ErrorCode::invalid_argument,
        "quantize: --calib and --eval are for ONNX models; " + a.in + " is a GGUF file");
  const llm::QuantScheme scheme = llm::parse_quant_scheme(a.type);
  const int threads =
      a.threads > 0 ? a.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<Progress> p;
  auto rep = llm::quantize_model(a.in, a.out, scheme, threads, [&](int64_t done, int64_t total) {
    if (!p) p = std::make_unique<Progress>("quantize " + a.type, total);
    p->update(done);
  });
  if (p) p->finish();
  std::printf("%s -> %s (%s)\n", a.in.c_str(), a.out.c_str(), llm::quant_scheme_name(scheme));
  std::printf("size: %.2f MiB -> %.2f MiB (%.2f bits per weight over all tensors)\n",
              rep.bytes_in / 1048576.0, rep.bytes_out / 1048576.0,
              rep.weights_quantized ? 8.0 * rep.bytes_out / double(rep.weights_quantized) : 0.0);
  std::printf("tensors:");
  for (const auto& [t, n] : rep.tensors_per_type) std::printf(" %s=%d", t.c_str(), n);
  std::printf("\n");
  if (rep.fallbacks)
    std::printf(
        "note: %d tensors have rows not a multiple of 256 and use Q4_0/Q8_0 instead of a K-quant\n",
        rep.fallbacks);
}

void print_eval(const quant::EvalReport& r, nlohmann::json& js) {
  std::printf("eval: %lld held-out samples, quantized vs float\n", (long long)r.samples);
  for (const auto& o : r.outputs) {
    nlohmann::json j = {{"name", o.name},
                        {"cosine", o.cosine},
                        {"max_abs", o.max_abs},
                        {"classifier", o.classifier}};
    std::printf("  %s: cosine %.6f, max |diff| %.4g", o.name.c_str(), o.cosine, o.max_abs);
    if (o.classifier && o.rows) {
      const double agree = double(o.top1_agree) / double(o.rows);
      std::printf(", top-1 agreement %.2f%% (%lld/%lld), KL %.3g", 100 * agree,
                  (long long)o.top1_agree, (long long)o.rows, o.kl_mean);
      j["rows"] = o.rows;
      j["top1_agreement"] = agree;
      j["kl_mean"] = o.kl_mean;
    }
    if (o.accuracy_float) {
      std::printf(", accuracy %.2f%% float, %.2f%% quantized", 100 * *o.accuracy_float,
                  100 * *o.accuracy_quantized);
      j["accuracy_float"] = *o.accuracy_float;
      j["accuracy_quantized"] = *o.accuracy_quantized;
    }
    std::printf("\n");
    js["eval"]["outputs"].push_back(j);
  }
  js["eval"]["samples"] = r.samples;
}

// Mixed precision: measure, choose, write, re-measure; print the layers, the Pareto front
// and predicted against measured.
void mixed_precision(const QuantizeArgs& a, const quant::QuantizeOptions& o,
                     const quant::SampleSet& calib, nlohmann::json& js) {
  quant::MixedPrecisionOptions mo;
  if (a.has_latency_budget) mo.latency_budget_ms = a.latency_budget;
  if (a.has_accuracy_budget) mo.accuracy_budget = a.accuracy_budget;
  mo.samples = a.sensitivity_samples;
  if (!a.measurements.empty()) {
    mo.measurements = quant::read_plan(a.measurements).measurements;
    std::printf("measurements: from %s (not measured again)\n", a.measurements.c_str());
  }
  mo.latency_runs = a.latency_runs;
  mo.evaluations = a.search_evaluations;
  mo.int4 = !a.no_int4;
  std::unique_ptr<Progress> p;
  std::string stage;
  mo.progress = [&](const std::string& s, int64_t done, int64_t total) {
    if (!p || s != stage) p = std::make_unique<Progress>("mixed precision: " + s, total);
    stage = s;
    p->update(done);
    if (done >= total) p.reset();
  };
  const quant::MixedPrecisionResult r = quant::run_mixed_precision(a.in, a.out, calib, o, mo);
  p.reset();
  const quant::Measurements& m = r.measurements;
  const quant::PlanPoint& c = r.plan.chosen;
  std::printf("%s -> %s (mixed precision QDQ)\n", a.in.c_str(), a.out.c_str());
  std::printf(
      "measured on this machine (%d threads, one sample, median of %d runs, %s): all fp32 %.3f "
      "ms, all int8 %.3f ms (loss %.4g)\n",
      o.num_threads, m.runs, m.clock.c_str(), m.fp32_ms, m.int8_ms, m.int8_loss);
  std::printf("loss: %s on %lld calibration samples, summed over the outputs\n", m.metric.c_str(),
              (long long)m.samples);
  int64_t slower = 0;
  for (const auto& l : m.layers) slower += l.saving_ms() <= 0;
  std::printf("layers: %zu (%lld not faster in int8 here even among int8 neighbours)\n",
              m.layers.size(), (long long)slower);
  std::printf(
      "  loss = (loss alone in int8 + loss saved keeping it alone in fp32) / 2; int4: weight-only "
      "MatMulNBits (blocks of %lld), loss alone, time among int4 layers\n",
      (long long)o.int4_block);
  std::printf("  %-4s %-28s %-8s %5s %9s %9s %9s %9s %9s %9s %9s %9s\n", "#", "layer", "op",
              "nodes", "loss", "alone", "l-o-o", "fp32 ms", "int8 ms", "alone ms", "int4 loss",
              "int4 ms");
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    std::printf("  %-4zu %-28s %-8s %5zu %9.3g %9.3g %9.3g %9.4f %9.4f %9.4f", i, l.name.c_str(),
                l.op.c_str(), l.nodes.size(), l.loss, l.loss_alone, l.loss_leave_one_out,
                l.fp32_ms, l.int8_ms, l.int8_alone_ms);
    if (l.int4)
      std::printf(" %9.3g %9.4f", l.loss_int4, l.int4_ms);
    else
      std::printf(" %9s %9s", "-", "-");
    std::printf("  %s\n", quant::precision_name(c.precision[i]));
  }
  std::printf(
      "Pareto front (predicted: all-fp32 latency + Σ over int8 layers of (int8 − fp32) + half the "
      "(alone − int8) border cost per neighbour not in int8 + Σ over int4 layers of (int4 − "
      "fp32)):\n");
  std::printf("  %12s %12s %12s %12s\n", "latency ms", "loss", "int8 layers", "int4 layers");
  // At most ~24 rows, evenly spread (all of them in the plan file), and the chosen one.
  const auto& front = r.plan.pareto;
  const size_t step = std::max<size_t>(1, (front.size() + 23) / 24);
  for (size_t k = 0; k < front.size(); ++k) {
    const auto& pt = front[k];
    const bool chosen = pt.precision == c.precision;
    if (k % step && k + 1 != front.size() && !chosen) continue;
    std::printf("  %12.3f %12.4g %12lld %12lld%s\n", pt.latency_ms, pt.loss,
                (long long)pt.layers(quant::Precision::int8),
                (long long)pt.layers(quant::Precision::int4), chosen ? "  <- chosen" : "");
  }
  if (step > 1)
    std::printf("  (%zu points on the front; every %zu-th shown)\n", front.size(), step);
  if (!r.candidates.empty()) {
    std::printf(
        "candidates (built; loss measured on the same samples, latency timed against fp32 "
        "under a latency budget; the least measured loss within the target is chosen):\n");
    std::printf("  %-20s %10s %6s %6s %12s %12s %12s %12s\n", "source", "target ms", "int8",
                "int4", "predicted ms", "measured ms", "pred. loss", "loss");
    for (const auto& cd : r.candidates) {
      char timed[32] = "-";
      if (cd.measured_ms >= 0) std::snprintf(timed, sizeof timed, "%.3f", cd.measured_ms);
      std::printf("  %-20s %10.3f %6lld %6lld %12.3f %12s %12.4g %12.4g%s\n", cd.source.c_str(),
                  cd.target_ms, (long long)cd.point.layers(quant::Precision::int8),
                  (long long)cd.point.layers(quant::Precision::int4), cd.point.latency_ms,
                  timed, cd.point.loss, cd.loss,
                  cd.point.precision == c.precision ? "  <- chosen" : "");
    }
  }
  if (mo.latency_budget_ms)
    std::printf("budget: latency %.3f ms%s\n", *mo.latency_budget_ms,
                r.tries > 1 ? (" (" + std::to_string(r.tries) + " builds; last aimed at " +
                               std::to_string(r.target_ms) + " ms)")
                                  .c_str()
                            : "");
  else
    std::printf("budget: loss %.4g\n", *mo.accuracy_budget);
  if (r.history.size() > 1)
    for (const auto& t : r.history)
      std::printf(
          "  build aimed at %.3f ms: predicted %.3f, measured %.3f (%.3f at the prediction's "
          "load), %lld layers int8, %lld int4\n",
          t.target_ms, t.predicted_ms, t.measured_ms, t.normalized_ms, (long long)t.int8_layers,
          (long long)t.int4_layers);
  std::printf("chosen: %lld of %zu layers int8, %lld int4 weight-only\n",
              (long long)c.layers(quant::Precision::int8), m.layers.size(),
              (long long)c.layers(quant::Precision::int4));
  std::printf("  predicted: latency %.3f ms, loss %.4g\n", c.latency_ms, c.loss);
  std::printf(
      "  measured:  latency %.3f ms (all fp32 %.3f ms in the same rounds; %.3f ms at the load "
      "of the prediction), loss %.4g\n",
      r.measured.latency_ms, r.measured.fp32_latency_ms, r.measured.normalized_ms, r.measured.loss);
  if (mo.latency_budget_ms && r.measured.normalized_ms > *mo.latency_budget_ms)
    std::printf(
        "note: the re-measured latency is over the budget (noise, or Q/DQ at fp32/int8 "
        "boundaries the per-layer model does not see)\n");
  js["mixed_precision"] = nlohmann::json::parse(quant::plan_to_json(r, o, mo));
  if (!a.plan_out.empty()) {
    std::ofstream f(a.plan_out);
    check(bool(f), ErrorCode::not_found, a.plan_out + ": cannot open for writing");
    f << quant::plan_to_json(r, o, mo);
    std::printf("plan: %s (re-apply with --plan)\n", a.plan_out.c_str());
  }
  if (!a.pareto_png.empty()) {
    plot::Chart ch;
    ch.title = "Mixed precision: predicted loss against latency (" +
               fs::path(a.in).filename().string() + ")";
    ch.x_label = "latency, ms (one sample)";
    ch.y_label = "loss (" + m.metric + ")";
    plot::Series front{"Pareto front (predicted)", {}, {}, true};
    for (const auto& pt : r.plan.pareto) {
      front.x.push_back(pt.latency_ms);
      front.y.push_back(pt.loss);
    }
    ch.series.push_back(front);
    plot::Series measured{"candidates: measured latency (else predicted), measured loss", {}, {},
                          false};
    for (const auto& cd : r.candidates) {
      measured.x.push_back(cd.latency_ms());
      measured.y.push_back(cd.loss);
    }
    if (!measured.x.empty()) ch.series.push_back(measured);
    ch.series.push_back({"chosen, predicted", {c.latency_ms}, {c.loss}, false});
    ch.series.push_back({"chosen, measured (at the prediction's load)",
                         {r.measured.normalized_ms},
                         {r.measured.loss},
                         false});
    ch.series.push_back(
        {"all fp32 / all int8, measured", {m.fp32_ms, m.int8_ms}, {0.0, m.int8_loss}, false});
    plot::write_png(ch, a.pareto_png);
    std::printf("Pareto plot: %s\n", a.pareto_png.c_str());
  }
}

// --eval (the written model against the input on held-out data) and --json.
void eval_and_write(const QuantizeArgs& a, const quant::QuantizeOptions& o, const Model& probe,
                    std::unique_ptr<Progress>& p, nlohmann::json& js) {
  if (!a.eval.empty()) {
    const quant::SampleSet held = quant::SampleSet::open(a.eval, probe.graph.inputs, a.preprocess);
    quant::EvalOptions eo;
    eo.batch = a.batch;
    eo.num_threads = a.threads;
    eo.providers = o.providers;
    eo.progress = progress_line("eval", p);
    const Tensor labels = a.labels.empty() ? Tensor() : read_npy(a.labels);
    print_eval(quant::evaluate_quantized(a.in, a.out, held, labels, eo), js);
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    check(bool(f), ErrorCode::not_found, a.json + ": cannot open for writing");
    f << js.dump(2) << "\n";
  }
}

void quantize_onnx(const QuantizeArgs& a) {
  check(a.type.empty(), ErrorCode::invalid_argument,
        "quantize: --type is for GGUF models; " + a.in + " is ONNX");
  check(!a.calib.empty(), ErrorCode::invalid_argument,
        "quantize: an ONNX model needs calibration data (--calib DIR|FILE.npz|IMAGES_DIR)");
  check(!a.out.empty(), ErrorCode::invalid_argument, "quantize: give the output file (-o OUTPUT)");
  check(fs::absolute(a.out).lexically_normal() != fs::absolute(a.in).lexically_normal(),
        ErrorCode::invalid_argument, "quantize: the output would overwrite the input " + a.in);
  check(a.activations == "u8" || a.activations == "i8", ErrorCode::invalid_argument,
        "quantize: --activations is u8 or i8, got '" + a.activations + "'");
  quant::QuantizeOptions o;
  o.calibrator.method = quant::parse_calibration_method(a.calibrator);
  o.calibrator.percentile = a.percentile;
  o.activations.dtype = a.activations == "u8" ? DType::u8 : DType::i8;
  o.activations.symmetric = a.symmetric;
  o.per_channel = !a.per_tensor;
  o.reduce_range = a.reduce_range;
  o.smoothquant_alpha = a.smoothquant;
  o.smooth_clip = a.smooth_clip;
  o.bias_correction = a.bias_correction;
  for (const auto& op : split_list(a.ops)) o.op_types.insert(op);
  for (const auto& n : split_list(a.exclude)) o.exclude_nodes.insert(n);
  o.batch = a.batch;
  o.max_samples = a.max_samples;
  o.int4_block = a.int4_block;
  o.num_threads = a.threads;
  o.providers = split_list(a.providers);
  o.cache_dir = a.no_cache ? "" : (a.cache_dir.empty() ? default_cache_dir() : a.cache_dir);
  std::unique_ptr<Progress> p;
  o.progress = progress_line("calibrate", p);

  quant::MixedPrecisionFlags flags;
  flags.latency_budget = a.has_latency_budget;
  flags.accuracy_budget = a.has_accuracy_budget;
  flags.plan = !a.plan.empty();
  flags.plan_out = !a.plan_out.empty();
  flags.pareto_png = !a.pareto_png.empty();
  flags.measurements = !a.measurements.empty();
  flags.exclude = !a.exclude.empty();
  flags.smoothquant = a.smoothquant != 0;
  quant::check_mixed_precision_flags(flags);
  if (!a.plan.empty()) {
    const quant::LoadedPlan plan = quant::read_plan(a.plan);
    o = quant::plan_options(plan, a.plan, a.in, o);
    const auto count = [&](quant::Precision p) {
      return (long long)std::count(plan.precision.begin(), plan.precision.end(), p);
    };
    std::printf("plan: %s, %lld of %zu layers int8, %lld int4 (quantizer settings from the plan)\n",
                a.plan.c_str(), count(quant::Precision::int8), plan.precision.size(),
                count(quant::Precision::int4));
  }

  const Model probe = OnnxImporter::load_file(a.in);
  const quant::SampleSet calib = quant::SampleSet::open(a.calib, probe.graph.inputs, a.preprocess);
  nlohmann::json js;
  if (a.has_latency_budget || a.has_accuracy_budget) {
    mixed_precision(a, o, calib, js);
    return eval_and_write(a, o, probe, p, js);
  }
  const auto rep = quant::quantize_model(a.in, a.out, calib, o);

  std::printf("%s -> %s (QDQ, opset %lld", a.in.c_str(), a.out.c_str(), (long long)rep.opset_to);
  if (rep.opset_from != rep.opset_to) std::printf(", raised from %lld", (long long)rep.opset_from);
  std::printf(")\n");
  std::printf("calibration: %lld of %s; %s, %s %s activations, %s weights", (long long)rep.samples,
              calib.description().c_str(), quant::calibration_method_name(o.calibrator.method),
              o.activations.dtype == DType::u8 ? "u8" : "i8",
              o.activations.symmetric ? "symmetric" : "asymmetric",
              o.per_channel ? "per-channel" : "per-tensor");
  if (o.reduce_range) std::printf(" (7-bit, reduce range)");
  if (o.calibrator.method == quant::CalibrationMethod::percentile)
    std::printf(" (percentile %g)", o.calibrator.percentile);
  std::printf("\n");
  if (rep.stats_from_cache)
    std::printf("statistics: from the calibration cache (%s)\n", rep.cache_files.back().c_str());
  else
    std::printf("statistics: float model run in %.2f s%s%s\n", rep.calibration_seconds,
                rep.cache_files.empty() ? "" : ", cached in ",
                rep.cache_files.empty() ? "" : rep.cache_files.back().c_str());
  std::string ops;
  int64_t nodes = 0;
  for (const auto& [op, n] : rep.nodes_quantized) {
    ops += (ops.empty() ? "" : ", ") + op + " " + std::to_string(n);
    nodes += n;
  }
  std::printf("quantized: %lld nodes (%s)\n", (long long)nodes, ops.c_str());
  std::printf(
      "  %lld activations in %zu ranges, %lld weights (%.2f MiB -> %.2f MiB), %lld biases "
      "(int32)\n",
      (long long)rep.activations_quantized, rep.ranges.size(), (long long)rep.weights_quantized,
      rep.weight_bytes_float / 1048576.0, rep.weight_bytes_quantized / 1048576.0,
      (long long)rep.biases_quantized);
  if (rep.int4_weights)
    std::printf("  %lld MatMul/Gemm weights int4 weight-only (MatMulNBits, blocks of %lld)\n",
                (long long)rep.int4_weights, (long long)o.int4_block);
  if (rep.batch_norms_folded)
    std::printf("  %lld BatchNormalization/Mul folded into the preceding Conv/Gemm\n",
                (long long)rep.batch_norms_folded);
  if (rep.activations_removed)
    std::printf("  %lld Relu/Clip done by the QuantizeLinear of their output\n",
                (long long)rep.activations_removed);
  if (o.smoothquant_alpha > 0)
    std::printf("  SmoothQuant (alpha %g, channel clip %g%%): %lld matrix products\n",
                o.smoothquant_alpha, o.smooth_clip, (long long)rep.smoothed);
  if (o.bias_correction)
    std::printf("  bias correction: %lld nodes\n", (long long)rep.bias_corrected);
  js["model"] = a.in;
  js["output"] = a.out;
  js["calibrator"] = quant::calibration_method_name(o.calibrator.method);
  js["per_channel"] = o.per_channel;
  js["reduce_range"] = o.reduce_range;
  js["samples"] = rep.samples;
  js["stats_from_cache"] = rep.stats_from_cache;
  js["nodes_quantized"] = rep.nodes_quantized;
  for (const auto& t : rep.ranges) {
    js["ranges"].push_back({{"tensors", t.names},
                            {"min", t.min},
                            {"max", t.max},
                            {"lo", t.range.lo},
                            {"hi", t.range.hi},
                            {"scale", t.params.scale},
                            {"zero_point", t.params.zero_point}});
    if (a.verbose)
      std::printf("  range %-40s [%.5g, %.5g] of [%.5g, %.5g]: scale %.6g, zero point %d\n",
                  t.names[0].c_str(), t.range.lo, t.range.hi, t.min, t.max, t.params.scale,
                  t.params.zero_point);
  }
  eval_and_write(a, o, probe, p, js);
}

void add_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand(
      "quantize",
      "Quantize a model: GGUF weights to llama.cpp's formats (--type), or an ONNX network to "
      "calibrated "
      "8-bit QDQ (--calib), optionally measured against the float model (--eval)");
  cmd->add_option("input", a->in, "GGUF or ONNX model")->required()->check(CLI::ExistingFile);
  cmd->add_option("output", a->out_positional, "Output file (or -o)");
  cmd->add_option("-o,--output", a->out, "Output file");
  cmd->add_option("--type", a->type, "GGUF: q8_0, q4_0, q4_k, q6_k or q4_k_m");
  auto* onnx = "ONNX";
  cmd->add_option("--calib", a->calib,
                  "Calibration data: a folder of NAME.npy (one per input, samples along the "
                  "first axis), an .npz with those keys, or a folder of PNG/JPEG images")
      ->group(onnx);
  cmd->add_option("--preprocess", a->preprocess,
                  "Image preprocessing spec (JSON: size, resize, pad, scale, mean, std, layout, "
                  "color); default "
                  "DIR/preprocess.json")
      ->group(onnx);
  cmd->add_option("--calibrator", a->calibrator, "minmax, percentile, entropy or mse")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_option("--percentile", a->percentile,
                  "Share of |x| the percentile calibrator keeps, in percent")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_flag("--per-tensor", a->per_tensor,
                "One scale per weight tensor (default: per output channel)")
      ->group(onnx);
  cmd->add_flag("--reduce-range", a->reduce_range,
                "7-bit weights in [-64, 64] (ONNX Runtime's reduce_range): for AVX2 CPUs "
                "without VNNI (Haswell to Skylake, Zen 1-3), whose 8-bit products then run at "
                "full speed instead of half; slightly less accurate")
      ->group(onnx);
  cmd->add_option("--activations", a->activations, "Activation type: u8 or i8")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_flag("--symmetric", a->symmetric,
                "Symmetric activations (zero point 0 for i8, 128 for u8)")
      ->group(onnx);
  cmd->add_option("--smoothquant", a->smoothquant,
                  "SmoothQuant alpha in (0, 1) for MatMul/Gemm inputs (0: off)")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_option("--smooth-clip", a->smooth_clip,
                  "SmoothQuant takes each channel's max |x| at this percentile of its histogram")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_flag("--bias-correction", a->bias_correction,
                "Correct biases for the mean shift of rounded weights")
      ->group(onnx);
  cmd->add_option("--ops", a->ops,
                  "Op types to quantize, comma-separated (default: all quantizable)")
      ->group(onnx);
  cmd->add_option("--exclude", a->exclude, "Nodes to leave in float, comma-separated")->group(onnx);
  cmd->add_option("--batch", a->batch, "Samples per run where the model's batch dim is free")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(onnx);
  cmd->add_option("--max-samples", a->max_samples,
                  "Use at most this many calibration samples (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->group(onnx);
  cmd->add_option("--calib-cache", a->cache_dir,
                  "Calibration cache folder (default ~/.cache/slim/calib)")
      ->group(onnx);
  cmd->add_flag("--no-calib-cache", a->no_cache, "Neither read nor write the calibration cache")
      ->group(onnx);
  cmd->add_option("--eval", a->eval,
                  "Held-out data (same forms as --calib): compare quantized with float")
      ->group(onnx);
  cmd->add_option("--labels", a->labels, "Integer class per held-out sample (.npy) for accuracy")
      ->group(onnx);
  cmd->add_option("--json", a->json, "Write the report (ranges, eval) as JSON")->group(onnx);
  cmd->add_option("--providers", a->providers, "Providers that run the float and quantized models")
      ->capture_default_str()
      ->group(onnx);
  cmd->add_flag("--verbose", a->verbose, "Print every activation range")->group(onnx);
  auto* mp = "Mixed precision (ONNX)";
  auto* lb =
      cmd->add_option("--latency-budget-ms", a->latency_budget,
                      "Choose each layer's precision (fp32, int8, or int4 weight-only for "
                      "MatMul/Gemm with a constant weight) for the least loss whose predicted "
                      "latency of one sample on this machine is at most this; layers slower in "
                      "int8 here stay fp32. fp16 is not offered: slim's CPU kernels compute in "
                      "fp32, so fp16 would only add conversions")
          ->group(mp);
  auto* ab = cmd->add_option("--accuracy-budget", a->accuracy_budget,
                             "Or the least latency whose predicted loss (KL of softmax outputs, "
                             "else 1 - cosine; summed over outputs) is at most this")
                 ->group(mp);
  lb->excludes(ab);
  cmd->add_option("--plan-out", a->plan_out,
                  "Write the chosen plan (per-layer precision, nodes, measurements, Pareto front) "
                  "as JSON")
      ->group(mp);
  cmd->add_option("--plan", a->plan,
                  "Re-apply a plan written by --plan-out (no measuring; the model must be the one "
                  "it was made for)")
      ->group(mp);
  cmd->add_option("--measurements", a->measurements,
                  "Choose from the layer measurements of a plan file (--plan-out) instead of "
                  "measuring again: another budget for the same model and settings")
      ->group(mp);
  cmd->add_option("--pareto-png", a->pareto_png,
                  "Draw the Pareto front (predicted loss against latency) in this PNG file")
      ->group(mp);
  cmd->add_option("--sensitivity-samples", a->sensitivity_samples,
                  "Calibration samples each layer's loss is measured on")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(mp);
  cmd->add_option("--search-evaluations", a->search_evaluations,
                  "Candidate plans near the budget (the front's, contiguous int8 runs, swap and "
                  "drop moves) built and their loss measured; the least measured loss is "
                  "chosen (0: the predicted choice as is)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group(mp);
  cmd->add_option("--int4-block", a->int4_block,
                  "Block size along K of int4 weight-only MatMulNBits (a power of two >= 16)")
      ->capture_default_str()
      ->group(mp);
  cmd->add_flag("--no-int4", a->no_int4,
                "Offer fp32 and int8 only (no int4 weight-only MatMul/Gemm layers)")
      ->group(mp);
  cmd->add_option("--latency-runs", a->latency_runs,
                  "Timed runs per model (medians) for the latencies")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(mp);
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a, cmd] {
    check(a->out.empty() || a->out_positional.empty() || a->out == a->out_positional,
          ErrorCode::invalid_argument, "quantize: two different outputs given");
    if (a->out.empty()) a->out = a->out_positional;
    a->has_latency_budget = cmd->count("--latency-budget-ms") > 0;
    a->has_accuracy_budget = cmd->count("--accuracy-budget") > 0;
    if (llm::is_gguf_file(a->in))
      quantize_gguf(*a);
    else
      quantize_onnx(*a);
  });
}

}  // namespace

SLIM_COMMAND(42, add_quantize);

}  // namespace slim::cli
