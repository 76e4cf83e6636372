// `slim prune model.onnx -o pruned.onnx --target-flops F`: channel pruning of ONNX CNNs
// (prune/channel_prune.h), then the report: parameters, MACs, file size, latency of both
// models in slim (alternating rounds, medians) and their agreement on held-out samples.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "prune.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/core/progress.h"
#include "slim/onnx/importer.h"
#include "slim/prune/channel_prune.h"
#include "slim/quant/evaluate.h"
#include "slim/quant/sample_set.h"
#include "slim/runtime/session.h"

namespace slim::cli {
namespace {

namespace fs = std::filesystem;

// Median milliseconds of one run of each model on `feeds`. The models take turns run by
// run (so that a load that comes and goes on the machine hits both alike): `rounds` x
// about 0.2 s of runs each.
std::pair<double, double> latencies(const std::string& a, const std::string& b, const TensorMap& feeds, int threads,
                                    int rounds) {
  SessionOptions so;
  so.num_threads = threads;
  auto sa = Session::load(a, so), sb = Session::load(b, so);
  auto once = [&](Session& s) {
    const auto t0 = std::chrono::steady_clock::now();
    s.run(feeds);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  double warm = 0;
  for (int i = 0; i < 2; ++i) warm = once(*sa), once(*sb);
  const int runs = rounds * std::clamp(int(200.0 / std::max(0.05, warm)), 3, 50);
  std::vector<double> ta, tb;
  for (int i = 0; i < runs; ++i) {
    if (i % 2) ta.push_back(once(*sa)), tb.push_back(once(*sb));
    else tb.push_back(once(*sb)), ta.push_back(once(*sa));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(ta), median(tb)};
}

nlohmann::json groups_json(const std::vector<prune::ChannelGroup>& groups) {
  nlohmann::json js = nlohmann::json::array();
  for (const auto& g : groups) {
    js.push_back({{"values", g.values}, {"channels", g.channels}, {"kept", g.kept}, {"prunable", g.prunable}});
    if (!g.prunable) js.back()["reason"] = g.reason;
  }
  return js;
}

}  // namespace

void prune_onnx_model(const PruneArgs& a) {
  check(a.prune_gain == 0 && a.max_margin_change == 0 && a.label.empty() && a.random_experts < 0,
        ErrorCode::invalid_argument,
        "prune: --prune-gain, --max-margin-change, --label-column and --random-experts are not for ONNX models");
  check(a.target_flops < 1 || a.target_params < 1, ErrorCode::invalid_argument,
        "prune: nothing to do: give --target-flops (or --target-params) below 1");
  check(a.target_flops > 0 && a.target_params > 0, ErrorCode::invalid_argument,
        "prune: --target-flops and --target-params must be above 0");
  check(fs::path(a.output).extension() == ".onnx", ErrorCode::invalid_argument,
        "prune: the output of an ONNX model is an .onnx file, got " + a.output);
  check(fs::weakly_canonical(a.output) != fs::weakly_canonical(a.model), ErrorCode::invalid_argument,
        "prune: the output would overwrite the input " + a.model);
  prune::ChannelPruneOptions o;
  o.target_flops = a.target_flops;
  o.target_params = a.target_params;
  std::string crit = a.criterion;
  if (crit == "activation") crit = "output";
  if (crit == "magnitude") crit = "l2";
  if (crit == "output" && a.calib.empty() && a.criterion == "activation") crit = "l2";  // the default without data
  o.criterion = prune::parse_criterion(crit);
  o.channel_multiple = a.channel_multiple;
  o.bias_correction = !a.no_bias_correction;
  o.recalibrate = !a.no_recalibration;
  o.cost_weight = a.cost_weight;
  o.threads = a.threads;
  std::unique_ptr<Progress> progress;
  std::string stage;
  o.progress = [&](const std::string& st, int64_t done, int64_t total) {
    if (st != stage) progress = std::make_unique<Progress>("prune: " + st, total), stage = st;
    progress->update(done);
  };
  const Model probe = OnnxImporter::load_file(a.model);
  std::unique_ptr<quant::SampleSet> calib, held;
  if (!a.calib.empty()) {
    calib = std::make_unique<quant::SampleSet>(quant::SampleSet::open(a.calib, probe.graph.inputs));
    const int64_t n = std::min<int64_t>(calib->size(), a.calib_samples);
    for (int64_t i = 0; i < n; i += 8) o.calibration.push_back(calib->batch(i, std::min(n, i + 8)));
  }
  const std::string eval_path = a.eval.empty() ? a.calib : a.eval;
  if (!eval_path.empty())
    held = std::make_unique<quant::SampleSet>(quant::SampleSet::open(eval_path, probe.graph.inputs));
  check(a.labels.empty() || held, ErrorCode::invalid_argument, "prune: --labels needs --eval (or --calib) samples");

  const auto t0 = std::chrono::steady_clock::now();
  const prune::ChannelPruneReport r = prune::prune_channels_file(a.model, a.output, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.reset();

  nlohmann::json js = {{"kind", "onnx"},
                       {"model", a.model},
                       {"output", a.output},
                       {"criterion", prune::criterion_name(r.criterion)},
                       {"channel_multiple", a.channel_multiple},
                       {"cost_weight", a.cost_weight},
                       {"bias_correction", o.bias_correction && !o.calibration.empty()},
                       {"target_flops", a.target_flops},
                       {"target_params", a.target_params},
                       {"target_reached", r.target_reached},
                       {"input_shape", r.input_shape},
                       {"seconds", seconds},
                       {"before", {{"params", r.params_before}, {"macs", r.macs_before},
                                   {"file_bytes", fs::file_size(a.model)}}},
                       {"after", {{"params", r.params_after}, {"macs", r.macs_after},
                                  {"file_bytes", fs::file_size(a.output)}}},
                       {"bias_corrected", r.bias_corrected},
                       {"recalibrated", r.recalibrated},
                       {"notes", r.notes}};
  js["groups"] = groups_json(r.groups);

  std::printf("%s -> %s: criterion %s, channels in multiples of %d%s, at %s\n", a.model.c_str(), a.output.c_str(),
              prune::criterion_name(r.criterion).c_str(), a.channel_multiple,
              !js["bias_correction"].get<bool>() ? ""
              : o.recalibrate                    ? ", bias correction and recalibration"
                                                 : ", bias correction",
              r.input_shape.c_str());
  std::printf("%-16s %14s %14s\n", "", "before", "after");
  std::printf("%-16s %14lld %14lld  (%.1f%% kept)\n", "parameters", (long long)r.params_before,
              (long long)r.params_after, 100.0 * double(r.params_after) / double(r.params_before));
  std::printf("%-16s %14lld %14lld  (%.1f%% kept)\n", "MACs", (long long)r.macs_before, (long long)r.macs_after,
              100.0 * double(r.macs_after) / double(r.macs_before));
  std::printf("%-16s %10.3f MiB %10.3f MiB\n", "file", double(fs::file_size(a.model)) / 1048576,
              double(fs::file_size(a.output)) / 1048576);
  if (a.latency_rounds > 0) {
    TensorMap feeds;
    if (held) feeds = held->batch(0, 1);
    else if (calib) feeds = calib->batch(0, 1);
    else {
      for (const auto& in : probe.graph.inputs) {
        Shape s;
        for (const auto& d : *in.shape) s.push_back(d.is_fixed() ? d.value : 1);
        feeds[in.name] = Tensor(in.dtype.value_or(DType::f32), s);
      }
    }
    const auto [ms_a, ms_b] = latencies(a.model, a.output, feeds, a.threads, a.latency_rounds);
    std::printf("%-16s %11.3f ms %11.3f ms  (%.2fx speed-up; 1 sample, runs alternating, medians)\n", "latency",
                ms_a, ms_b, ms_a / ms_b);
    js["before"]["latency_ms"] = ms_a;
    js["after"]["latency_ms"] = ms_b;
  }
  int prunable = 0, pruned = 0;
  std::map<std::string, int> why;
  for (const auto& g : r.groups) {
    if (g.prunable) prunable++, pruned += g.kept < g.channels;
    else why[g.reason]++;
  }
  std::printf("groups: %zu (%d prunable, %d pruned); %lld layers took bias correction, %lld recalibrated\n",
              r.groups.size(), prunable, pruned, (long long)r.bias_corrected, (long long)r.recalibrated);
  int shown = 0;
  for (const auto& [reason, count] : why) {
    if (shown++ == 8) {
      std::printf("  ... %zu more reasons (--json lists every group)\n", why.size() - 8);
      break;
    }
    std::printf("  kept: %d group%s: %s\n", count, count > 1 ? "s" : "", reason.c_str());
  }
  for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
  if (!r.target_reached) std::printf("note: the target was not reached: every prunable group is at its minimum\n");
  if (held) {
    quant::EvalOptions eo;
    eo.num_threads = a.threads;
    std::unique_ptr<Progress> ep;
    eo.progress = [&](int64_t done, int64_t total) {
      if (!ep) ep = std::make_unique<Progress>("prune: eval", total);
      ep->update(done);
    };
    const Tensor labels = a.labels.empty() ? Tensor() : read_npy(a.labels);
    const quant::EvalReport ev = quant::evaluate_quantized(a.model, a.output, *held, labels, eo);
    ep.reset();
    std::printf("eval: %lld samples of %s, pruned vs original\n", (long long)ev.samples, eval_path.c_str());
    for (const auto& out : ev.outputs) {
      nlohmann::json j = {{"name", out.name}, {"cosine", out.cosine}, {"max_abs", out.max_abs}};
      std::printf("  %s: cosine %.6f, max |diff| %.4g", out.name.c_str(), out.cosine, out.max_abs);
      if (out.classifier && out.rows) {
        const double agree = double(out.top1_agree) / double(out.rows);
        std::printf(", top-1 agreement %.2f%% (%lld/%lld), KL %.3g", 100 * agree, (long long)out.top1_agree,
                    (long long)out.rows, out.kl_mean);
        j["rows"] = out.rows;
        j["top1_agreement"] = agree;
        j["kl_mean"] = out.kl_mean;
      }
      if (out.accuracy_float) {
        std::printf(", accuracy %.2f%% original, %.2f%% pruned", 100 * *out.accuracy_float,
                    100 * *out.accuracy_quantized);
        j["accuracy_before"] = *out.accuracy_float;
        j["accuracy_after"] = *out.accuracy_quantized;
      }
      std::printf("\n");
      js["eval"]["outputs"].push_back(j);
    }
    js["eval"]["samples"] = ev.samples;
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << js.dump(2) << "\n";
    check(bool(f), ErrorCode::invalid_argument, a.json + ": cannot write");
  }
}

}  // namespace slim::cli
