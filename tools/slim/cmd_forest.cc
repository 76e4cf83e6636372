// `slim forest compile|predict|inspect|bench`: tree ensembles from XGBoost and LightGBM,
// compiled to .slimf, predicted from CSV, and timed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include "commands.h"
#include "energy_cli.h"
#include "prune.h"
#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/core/thread_pool.h"
#include "slim/forest/compress.h"
#include "slim/forest/forest_model.h"
#include "slim/forest/slimf.h"

namespace slim::cli {
namespace {

using namespace slim::forest;

size_t file_size(const std::string& path) { return size_t(std::filesystem::file_size(path)); }

std::string kib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

// Binary-classification quality of a forest on labelled rows (empty when not binary).
std::string quality(const CompiledForest& cf, const FeatureRows& rows) {
  if (rows.labels.empty() || cf.output_width() != 1) return "";
  std::vector<float> p(size_t(rows.n));
  cf.predict(rows.x.data(), rows.n, p.data(), false, &default_thread_pool());
  char buf[128];
  if (cf.transform() == Transform::sigmoid) {
    std::snprintf(buf, sizeof buf, "AUC %.6f  logloss %.6f", roc_auc(p, rows.labels), log_loss(p, rows.labels));
  } else {
    std::snprintf(buf, sizeof buf, "AUC %.6f", roc_auc(p, rows.labels));
  }
  return buf;
}

struct CompileOptions {
  std::string model, output, quantize = "none", encoding = "plain", calib, eval, label;
  double prune_gain = 0, prune_tree_eps = 0;
};

void compile_cmd(const CompileOptions& o) {
  const bool slimf_in = is_slimf_file(o.model);
  Forest f = slimf_in ? decompile(load_slimf(o.model)) : load_forest_source(o.model);
  const CompiledForest original = compile_forest(f);
  slim::check(o.encoding == "plain" || o.encoding == "compact", ErrorCode::invalid_argument,
              "--encoding must be plain or compact, got '" + o.encoding + "'");
  const SlimfEncoding enc = o.encoding == "plain" ? SlimfEncoding::plain : SlimfEncoding::compact;
  bool ranked = false;
  if (o.prune_gain > 0 || o.prune_tree_eps > 0) {
    slim::check(!slimf_in || (o.prune_tree_eps > 0 && o.prune_gain == 0), ErrorCode::invalid_argument,
                o.model + ": --prune-gain needs the source model (a .slimf keeps no split gains)");
    PruneStats ps;
    f = prune_forest(f, {o.prune_gain, o.prune_tree_eps}, &ps);
    std::cout << "pruned: " << ps.splits_merged << " splits merged, " << ps.trees_dropped
              << " trees dropped, nodes " << ps.nodes_before << " -> " << ps.nodes_after << "\n";
  }
  if (o.quantize == "lossless") {
    ranked = true;
  } else if (o.quantize != "none") {
    int bits = 0;
    slim::check(std::sscanf(o.quantize.c_str(), "%dbit", &bits) == 1 && bits >= 4 && bits <= 8 &&
                    o.quantize == std::to_string(bits) + "bit",
                ErrorCode::invalid_argument,
                "--quantize must be none, lossless or 4bit..8bit, got '" + o.quantize + "'");
    FeatureRows calib;
    if (!o.calib.empty()) calib = read_feature_rows(o.calib, o.label, f.num_features);
    QuantizeStats qs;
    f = quantize_thresholds(f, bits, calib.n ? calib.x.data() : nullptr, calib.n, &qs);
    ranked = true;
    std::cout << "quantized to " << bits << " bits: " << qs.features_changed
              << " features changed, distinct thresholds " << qs.thresholds_before << " -> "
              << qs.thresholds_after << (calib.n ? " (calibrated on " + std::to_string(calib.n) + " rows)" : "")
              << "\n";
  }
  if (ranked) {
    const std::string why = ranked_layout_blocker(f);
    if (!why.empty()) {
      std::cerr << "note: kept the plain node layout (threshold ranks need numeric splits only; the model has "
                << why << ")\n";
      ranked = false;
    }
  }
  const CompiledForest result = compile_forest(f, ranked);
  save_slimf(result, o.output, enc);
  std::cout << "wrote " << o.output << " (" << (enc == SlimfEncoding::plain ? "plain" : "compact") << " encoding, "
            << (ranked ? "ranked" : "plain") << " layout: " << result.node_bytes() << " bytes per node in memory, "
            << kib(double(result.payload_size())) << " compiled; file " << kib(double(file_size(o.output)))
            << ", source " << kib(double(file_size(o.model))) << "; " << result.num_trees() << " trees, "
            << result.num_nodes() << " nodes)\n";
  if (!o.eval.empty()) {
    FeatureRows rows = read_feature_rows(o.eval, o.label, f.num_features);
    std::cout << "eval " << o.eval << " (" << rows.n << " rows):\n  original  " << quality(original, rows)
              << "\n  compiled  " << quality(load_slimf(o.output), rows) << "\n";
  }
}

struct PredictOptions {
  std::string model, csv, output, label;
  bool margin = false;
  int threads = 0;
};

void predict_cmd(const PredictOptions& o) {
  set_num_threads(o.threads);
  CompiledForest cf = load_compiled_forest(o.model);
  FeatureRows rows = read_feature_rows(o.csv, o.label, cf.num_features());
  const int W = o.margin ? int(cf.num_groups()) : cf.output_width();
  std::vector<float> out(size_t(rows.n) * size_t(W));
  cf.predict(rows.x.data(), rows.n, out.data(), o.margin, &default_thread_pool());
  std::ofstream file;
  if (!o.output.empty()) {
    file.open(o.output);
    slim::check(bool(file), ErrorCode::not_found, o.output + ": cannot open for writing");
  }
  std::ostream& os = o.output.empty() ? std::cout : file;
  for (int k = 0; k < W; ++k) os << (k ? "," : "") << (W == 1 ? std::string("prediction") : "class_" + std::to_string(k));
  os << "\n";
  char buf[32];
  for (int64_t r = 0; r < rows.n; ++r) {
    for (int k = 0; k < W; ++k) {
      std::snprintf(buf, sizeof buf, "%.9g", double(out[size_t(r * W + k)]));
      os << (k ? "," : "") << buf;
    }
    os << "\n";
  }
  if (!o.margin && !rows.labels.empty()) std::cerr << quality(cf, rows) << "\n";
}

void inspect_cmd(const std::string& path) {
  const bool slimf = is_slimf_file(path);
  CompiledForest cf = load_compiled_forest(path);
  const CompiledHeader& h = cf.header();
  static const char* transforms[] = {"identity", "sigmoid", "exp", "softmax", "argmax"};
  std::cout << "model:      " << path << " (" << kib(double(file_size(path))) << ")\n";
  if (slimf)
    std::cout << "format:     .slimf v" << kSlimfVersion << ", "
              << (slimf_encoding(path) == SlimfEncoding::plain ? "plain (used in place)" : "compact (expanded on load)")
              << ", checksum ok\n";
  else
    std::cout << "format:     " << (cf.source() == SourceKind::xgboost ? "XGBoost" : "LightGBM") << " source model\n";
  std::cout << "source:     " << (cf.source() == SourceKind::xgboost ? "xgboost" : "lightgbm")
            << "\ntransform:  " << transforms[h.transform];
  if (cf.transform() == Transform::sigmoid && h.sigmoid_scale != 1.0) std::cout << " (scale " << h.sigmoid_scale << ")";
  std::cout << "\nfeatures:   " << h.num_features << "\noutputs:    " << cf.output_width() << " (" << h.num_groups
            << " margin groups)\ntrees:      " << h.num_trees << "\nnodes:      " << h.num_nodes << " ("
            << h.num_leaves << " leaves)\nmax depth:  " << h.max_depth << "\ncategorical: "
            << ((h.flags & kHasCategorical) ? "yes (" + std::to_string(h.num_category_sets) + " sets)" : std::string("no"))
            << "\nlayout:     " << (cf.ranked() ? "ranked (thresholds as per-feature ranks, " : "plain (float thresholds, ")
            << cf.node_bytes() << " bytes per node)"
            << "\nsums in:    " << (h.accumulate_double ? "double" : "float32") << "\nbase margin:";
  for (uint32_t g = 0; g < std::min<uint32_t>(h.num_groups, 8); ++g) std::cout << " " << cf.base_margin()[g];
  std::cout << "\nsimd:       " << simd_level_name(cf.simd_level())
            << cpu_note()
            << ((h.flags & (kHasCategorical | kHasZeroMissing)) ? " (batch walks scalar: categorical or zero-as-missing splits)" : "")
            << "\ncompiled:   " << kib(double(cf.payload_size())) << "\n";
}

struct BenchOptions {
  std::string model, csv, label, json;
  int threads = 1;
  int64_t rows = 10000;
  double seconds = 0.5;
  EnergyArgs energy;
};

void bench_cmd(const BenchOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  CompiledForest cf = load_compiled_forest(o.model);
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  const uint32_t F = cf.num_features();
  std::vector<float> x;
  int64_t n = o.rows;
  if (!o.csv.empty()) {
    FeatureRows r = read_feature_rows(o.csv, o.label, F);
    x = std::move(r.x);
    n = r.n;
    slim::check(n > 0, ErrorCode::invalid_argument, o.csv + ": no rows");
  } else {
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    x.resize(size_t(n) * F);
    for (auto& v : x) v = d(rng);
  }
  ThreadPool pool(std::max(1, o.threads));
  std::vector<float> out(size_t(n) * cf.num_groups());
  std::cout << "model " << o.model << ": " << cf.num_trees() << " trees, " << cf.num_nodes() << " nodes, load "
            << load_ms << " ms, simd " << simd_level_name(cf.simd_level())
            << cpu_note() << ", " << pool.num_threads()
            << " thread(s)\n";
  std::optional<EnergyRun> energy;
  nlohmann::json report = {{"model", o.model}, {"trees", cf.num_trees()}, {"nodes", cf.num_nodes()},
                           {"threads", pool.num_threads()}, {"simd", simd_level_name(cf.simd_level())}};
  if (o.energy.on) {
    energy.emplace(o.energy);
    std::cout.flush();
    energy->print_setup(stdout, 12);
    report["energy"] = energy->setup_json();
  }
  energy::Reading e0, e1;
  // " | 1.2 uJ per row (...), 3.4 ngCO2e per row" for the rows predicted between e0 and e1.
  auto energy_of = [&](double rows, nlohmann::json& j) -> std::string {
    if (!energy) return "";
    const energy::EnergyReport r = energy->report(e0, e1);
    j["energy"] = energy::to_json(r, rows, "row");
    return " | " + EnergyRun::per_unit(r, rows, "row") + ", " + energy::si(r.work_grams / rows, "gCO2e") + " per row";
  };
  Progress progress("forest bench", 4);
  int step = 0;
  for (int64_t batch : {int64_t(1), int64_t(64), int64_t(10000)}) {
    progress.update(step++, "batch " + std::to_string(batch));
    std::vector<float> xb(size_t(batch) * F);
    for (int64_t r = 0; r < batch; ++r)
      std::copy_n(x.begin() + (r % n) * F, F, xb.begin() + r * F);
    std::vector<float> ob(size_t(batch) * cf.num_groups());
    std::vector<double> rates;
    double rows = 0;
    if (energy) energy->meter().read(e0);
    const auto end = clock::now() + std::chrono::duration<double>(o.seconds);
    while (clock::now() < end || rates.size() < 5) {
      const auto a = clock::now();
      int reps = 0;
      do {
        cf.predict(xb.data(), batch, ob.data(), false, &pool);
        ++reps;
      } while (std::chrono::duration<double>(clock::now() - a).count() < 0.01);
      rates.push_back(double(batch) * reps / std::chrono::duration<double>(clock::now() - a).count());
      rows += double(batch) * reps;
    }
    if (energy) energy->meter().read(e1);
    std::sort(rates.begin(), rates.end());
    nlohmann::json j = {{"batch", batch}, {"rows_per_s", rates[rates.size() / 2]}, {"measurements", rates.size()}};
    const std::string e = energy_of(rows, j);
    std::printf("batch %6lld: %12.0f rows/s (median of %zu)%s\n", static_cast<long long>(batch),
                rates[rates.size() / 2], rates.size(), e.c_str());
    report["batches"].push_back(j);
  }
  progress.update(step++, "single row");
  std::vector<double> lat;
  std::vector<float> o1(cf.num_groups());
  if (energy) energy->meter().read(e0);
  const auto end = clock::now() + std::chrono::duration<double>(o.seconds);
  for (int64_t i = 0; clock::now() < end || lat.size() < 1000; ++i) {
    const float* row = x.data() + (i % n) * F;
    const auto a = clock::now();
    cf.predict_row(row, o1.data());
    lat.push_back(std::chrono::duration<double, std::micro>(clock::now() - a).count());
  }
  if (energy) energy->meter().read(e1);
  progress.finish();
  std::sort(lat.begin(), lat.end());
  nlohmann::json j = {{"p50_us", lat[lat.size() / 2]}, {"p99_us", lat[lat.size() * 99 / 100]}, {"calls", lat.size()}};
  const std::string e = energy_of(double(lat.size()), j);
  std::printf("single row: p50 %.2f us  p99 %.2f us  (%zu calls)%s\n", lat[lat.size() / 2],
              lat[lat.size() * 99 / 100], lat.size(), e.c_str());
  report["single_row"] = j;
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + o.json + "'");
    f << report.dump() << "\n";
  }
}

}  // namespace

// `slim prune` for tree ensembles: weak splits merged (--prune-gain, source models only),
// then trees dropped by their contribution on the calibration rows; the report compares
// both models on the evaluation rows.
void prune_forest_model(const PruneArgs& a) {
  set_num_threads(a.threads);
  const bool slimf_in = is_slimf_file(a.model);
  slim::check(!slimf_in || a.prune_gain == 0, ErrorCode::invalid_argument,
              a.model + ": --prune-gain needs the source model (a .slimf keeps no split gains)");
  slim::check(a.prune_gain > 0 || a.target_params < 1 || a.max_margin_change > 0, ErrorCode::invalid_argument,
              "prune: nothing to do: give --target-params below 1, --max-margin-change or --prune-gain");
  slim::check(a.calib.size() || (a.target_params == 1 && a.max_margin_change == 0), ErrorCode::invalid_argument,
              "prune: --target-params and --max-margin-change need --calib (tree contributions are measured on it)");
  const Forest original = slimf_in ? decompile(load_slimf(a.model)) : load_forest_source(a.model);
  Forest f = original;
  nlohmann::json report = {{"kind", "forest"}, {"model", a.model}, {"output", a.output}};
  if (a.prune_gain > 0) {
    PruneStats ps;
    f = prune_forest(f, {a.prune_gain, 0}, &ps);
    report["splits_merged"] = ps.splits_merged;
  }
  FeatureRows calib;
  if (!a.calib.empty()) {
    calib = read_feature_rows(a.calib, a.label, f.num_features, true);
    slim::check(calib.n > 0, ErrorCode::invalid_argument, a.calib + ": no rows");
  }
  if (a.target_params < 1 || a.max_margin_change > 0) {
    TreeDropStats ds;
    f = drop_trees(f, calib.x.data(), calib.n, {a.target_params, a.max_margin_change}, &ds);
    report["trees_dropped"] = ds.trees_dropped;
    report["calib_max_margin_change"] = ds.max_margin_change;
    if (!ds.budget_met)
      std::cerr << "note: --max-margin-change stopped tree drops before --target-params was reached\n";
  }
  const CompiledForest before = compile_forest(original), after = compile_forest(f);
  save_slimf(after, a.output, SlimfEncoding::plain);

  const FeatureRows eval = a.eval.empty() ? calib : read_feature_rows(a.eval, a.label, f.num_features);
  auto side = [&](const CompiledForest& cf, const std::string& path, std::vector<float>* out) {
    nlohmann::json j = {{"trees", cf.num_trees()}, {"nodes", cf.num_nodes()}, {"file_bytes", file_size(path)},
                        {"compiled_bytes", cf.payload_size()}};
    if (eval.n == 0) return j;
    out->resize(size_t(eval.n) * size_t(cf.output_width()));
    // Median of 9 timings, each over at least 20,000 rows (the set repeated).
    const int64_t reps = std::max<int64_t>(1, 20000 / eval.n);
    std::vector<double> us;
    for (int i = 0; i < 9; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t k = 0; k < reps; ++k) cf.predict(eval.x.data(), eval.n, out->data(), false, &default_thread_pool());
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                   double(eval.n * reps));
    }
    std::sort(us.begin(), us.end());
    j["us_per_row"] = us[us.size() / 2];
    if (!eval.labels.empty() && cf.output_width() == 1) j["auc"] = roc_auc(*out, eval.labels);
    return j;
  };
  std::vector<float> y0, y1;
  report["before"] = side(before, a.model, &y0);
  report["after"] = side(after, a.output, &y1);
  if (eval.n > 0) {
    // Agreement of the outputs: the largest and mean |difference|, and how often both pick
    // the same class (argmax over classes; 0.5 for one probability; sign for a margin).
    const int w = before.output_width();
    double max_diff = 0, sum_diff = 0;
    int64_t same = 0;
    auto cls = [&](const float* y) -> int64_t {
      if (w > 1) return std::max_element(y, y + w) - y;
      return before.transform() == Transform::sigmoid ? y[0] > 0.5f
             : before.transform() == Transform::identity ? y[0] > 0.f : int64_t(y[0]);
    };
    for (int64_t r = 0; r < eval.n; ++r) {
      for (int k = 0; k < w; ++k) {
        const double d = std::fabs(double(y0[size_t(r * w + k)]) - double(y1[size_t(r * w + k)]));
        max_diff = std::max(max_diff, d);
        sum_diff += d;
      }
      same += cls(&y0[size_t(r * w)]) == cls(&y1[size_t(r * w)]);
    }
    report["eval"] = {{"rows", eval.n}, {"file", a.eval.empty() ? a.calib : a.eval}, {"max_abs_diff", max_diff},
                      {"mean_abs_diff", sum_diff / double(eval.n * w)},
                      {"class_agreement", double(same) / double(eval.n)}};
  }
  const auto& b = report["before"];
  const auto& c = report["after"];
  std::printf("%-16s %12s %12s\n", "", "before", "after");
  std::printf("%-16s %12lld %12lld\n", "trees", b["trees"].get<long long>(), c["trees"].get<long long>());
  std::printf("%-16s %12lld %12lld  (%.1f%% kept)\n", "nodes", b["nodes"].get<long long>(),
              c["nodes"].get<long long>(), 100.0 * c["nodes"].get<double>() / b["nodes"].get<double>());
  std::printf("%-16s %12s %12s\n", "compiled", kib(b["compiled_bytes"].get<double>()).c_str(),
              kib(c["compiled_bytes"].get<double>()).c_str());
  if (eval.n > 0) {
    std::printf("%-16s %12.3f %12.3f  (%.2fx faster)\n", "us per row", b["us_per_row"].get<double>(),
                c["us_per_row"].get<double>(), b["us_per_row"].get<double>() / c["us_per_row"].get<double>());
    if (b.contains("auc")) std::printf("%-16s %12.6f %12.6f\n", "AUC", b["auc"].get<double>(), c["auc"].get<double>());
    const auto& e = report["eval"];
    std::printf("on %lld rows: max |diff| %.6g, mean |diff| %.6g, same class %.4f%%\n", e["rows"].get<long long>(),
                e["max_abs_diff"].get<double>(), e["mean_abs_diff"].get<double>(),
                100.0 * e["class_agreement"].get<double>());
  }
  std::printf("wrote %s\n", a.output.c_str());
  if (!a.json.empty()) {
    std::ofstream j(a.json);
    slim::check(bool(j), ErrorCode::invalid_argument, "--json: cannot write '" + a.json + "'");
    j << report.dump(1) << "\n";
  }
}

SLIM_COMMAND(40, [](CLI::App& app) {
  auto* forest = app.add_subcommand("forest", "Tree ensembles (XGBoost JSON/UBJSON, LightGBM text, .slimf): "
                                              "compile, predict, inspect, bench");
  forest->require_subcommand(1);

  auto* c = forest->add_subcommand("compile", "Compile a model to .slimf, optionally quantized and pruned");
  auto co = std::make_shared<CompileOptions>();
  c->add_option("MODEL", co->model, "XGBoost .json/.ubj, LightGBM .txt or .slimf")->required()->check(CLI::ExistingFile);
  c->add_option("-o,--output", co->output, "Output .slimf file")->required();
  c->add_option("--quantize", co->quantize,
                "none (float thresholds), lossless (thresholds as per-feature ranks: identical outputs, "
                "8-byte nodes) or 4bit..8bit (at most 2^k-1 thresholds per feature, then ranked)")
      ->capture_default_str();
  c->add_option("--encoding", co->encoding,
                "plain (the compiled tables, used in place from a memory map) or compact (smallest file, "
                "expanded on load)")
      ->capture_default_str();
  c->add_option("--prune-gain", co->prune_gain, "Merge splits whose gain is below this into leaves")->check(CLI::NonNegativeNumber);
  c->add_option("--prune-tree-eps", co->prune_tree_eps, "Drop trees whose largest |leaf| is below this")->check(CLI::NonNegativeNumber);
  c->add_option("--calib", co->calib, "CSV of calibration rows for k-bit quantization")->check(CLI::ExistingFile);
  c->add_option("--eval", co->eval, "Labelled CSV: report AUC/logloss before and after")->check(CLI::ExistingFile);
  c->add_option("--label-column", co->label, "Name or index of the label column in the CSVs");
  c->callback([co] { compile_cmd(*co); });

  auto* p = forest->add_subcommand("predict", "Predict the rows of a CSV (source model or .slimf)");
  auto po = std::make_shared<PredictOptions>();
  p->add_option("MODEL", po->model, "Model file")->required()->check(CLI::ExistingFile);
  p->add_option("--csv", po->csv, "Input rows, one feature per column")->required()->check(CLI::ExistingFile);
  p->add_option("--output", po->output, "Output CSV (default: stdout)");
  p->add_option("--label-column", po->label, "Label column to skip (and score against)");
  p->add_flag("--margin", po->margin, "Write raw margins instead of transformed outputs");
  add_threads_option(p, &po->threads);
  add_isa_option(p);
  p->callback([po] { predict_cmd(*po); });

  auto* i = forest->add_subcommand("inspect", "Describe a model: format, objective, trees, nodes, depth");
  auto path = std::make_shared<std::string>();
  i->add_option("MODEL", *path, "Model file")->required()->check(CLI::ExistingFile);
  add_isa_option(i);
  i->callback([path] { inspect_cmd(*path); });

  auto* b = forest->add_subcommand("bench", "Time batch (1, 64, 10000 rows) and single-row prediction");
  auto bo = std::make_shared<BenchOptions>();
  b->add_option("MODEL", bo->model, "Model file")->required()->check(CLI::ExistingFile);
  b->add_option("--csv", bo->csv, "Rows to use (default: random normal rows)")->check(CLI::ExistingFile);
  b->add_option("--label-column", bo->label, "Label column to skip");
  b->add_option("--threads", bo->threads, "Threads for batch prediction")->capture_default_str()->check(CLI::PositiveNumber);
  b->add_option("--seconds", bo->seconds, "Time per measurement")->capture_default_str()->check(CLI::PositiveNumber);
  b->add_option("--json", bo->json, "Also write the results as JSON to this file");
  add_energy_options(b, &bo->energy);
  add_isa_option(b);
  b->callback([bo] { bench_cmd(*bo); });
});

}  // namespace slim::cli
