// slim quantize: GGUF language models (llama.cpp's weight formats) and ONNX networks
// (calibrated 8-bit QDQ, optionally evaluated against the float model); the file's type
// picks the path.
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
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/core/progress.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/quantize.h"
#include "slim/onnx/importer.h"
#include "slim/quant/evaluate.h"
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
       verbose = false;
  int64_t batch = 8, max_samples = 0;
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
  o.smoothquant_alpha = a.smoothquant;
  o.smooth_clip = a.smooth_clip;
  o.bias_correction = a.bias_correction;
  for (const auto& op : split_list(a.ops)) o.op_types.insert(op);
  for (const auto& n : split_list(a.exclude)) o.exclude_nodes.insert(n);
  o.batch = a.batch;
  o.max_samples = a.max_samples;
  o.num_threads = a.threads;
  o.providers = split_list(a.providers);
  o.cache_dir = a.no_cache ? "" : (a.cache_dir.empty() ? default_cache_dir() : a.cache_dir);
  std::unique_ptr<Progress> p;
  o.progress = progress_line("calibrate", p);

  const Model probe = OnnxImporter::load_file(a.in);
  const quant::SampleSet calib = quant::SampleSet::open(a.calib, probe.graph.inputs, a.preprocess);
  const auto rep = quant::quantize_model(a.in, a.out, calib, o);

  nlohmann::json js;
  std::printf("%s -> %s (QDQ, opset %lld", a.in.c_str(), a.out.c_str(), (long long)rep.opset_to);
  if (rep.opset_from != rep.opset_to) std::printf(", raised from %lld", (long long)rep.opset_from);
  std::printf(")\n");
  std::printf("calibration: %lld of %s; %s, %s %s activations, %s weights", (long long)rep.samples,
              calib.description().c_str(), quant::calibration_method_name(o.calibrator.method),
              a.activations.c_str(), a.symmetric ? "symmetric" : "asymmetric",
              o.per_channel ? "per-channel" : "per-tensor");
  if (o.calibrator.method == quant::CalibrationMethod::percentile)
    std::printf(" (percentile %g)", a.percentile);
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
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);
  cmd->callback([a] {
    check(a->out.empty() || a->out_positional.empty() || a->out == a->out_positional,
          ErrorCode::invalid_argument, "quantize: two different outputs given");
    if (a->out.empty()) a->out = a->out_positional;
    if (llm::is_gguf_file(a->in))
      quantize_gguf(*a);
    else
      quantize_onnx(*a);
  });
}

}  // namespace

SLIM_COMMAND(42, add_quantize);

}  // namespace slim::cli
