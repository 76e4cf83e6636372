// Statistics collection: the float model runs over the calibration samples with every
// observed tensor made a graph output; each tensor's statistics are updated on the
// thread pool between runs. The calibration cache keeps the result by key.
#include <chrono>
#include <filesystem>

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/core/thread_pool.h"
#include "slim/runtime/session.h"

namespace slim::quant::detail {

namespace fs = std::filesystem;

namespace {

void update(TensorStats& s, const ObserveSpec& spec, const Tensor& t) {
  if (t.dtype() != DType::f32) return;
  const Tensor c = t.contiguous();
  const float* x = c.data<float>();
  s.add(x, c.numel());
  if (!spec.channels || c.rank() == 0) return;
  const int axis = spec.axis < 0 ? c.rank() + spec.axis : spec.axis;
  if (axis < 0 || axis >= c.rank()) return;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= c.shape()[size_t(d)];
  for (int d = axis + 1; d < c.rank(); ++d) inner *= c.shape()[size_t(d)];
  s.channels.axis = spec.axis;
  s.add_channels(x, outer, c.shape()[size_t(axis)], inner, spec.histograms);
}

}  // namespace

TensorMap BatchRunner::run(const TensorMap& feeds, const std::vector<std::string>& outputs) {
  std::string key;
  for (const auto& [name, t] : feeds) key += name + shape_str(t.shape()) + ";";
  auto& session = sessions_[key];
  if (!session) {
    Model fixed = model_;
    for (auto& in : fixed.graph.inputs) {
      auto it = feeds.find(in.name);
      if (!in.shape || it == feeds.end() || it->second.rank() != int(in.shape->size())) continue;
      for (size_t d = 0; d < in.shape->size(); ++d)
        if (!(*in.shape)[d].is_fixed()) (*in.shape)[d].value = it->second.shape()[d];
    }
    session = Session::compile(std::move(fixed), options_);
  }
  return session->run(feeds, outputs);
}

int64_t samples_per_run(const Model& m, const SampleSet& data, int64_t wanted) {
  int64_t fixed = 0;
  std::string which;
  for (const auto& in : m.graph.inputs) {
    if (!in.shape || in.shape->empty() || !(*in.shape)[0].is_fixed()) continue;
    const int64_t b = (*in.shape)[0].value;
    check(
        fixed == 0 || fixed == b, ErrorCode::invalid_argument,
        m.path + ": inputs '" + which + "' and '" + in.name + "' have different fixed batch sizes");
    fixed = b;
    which = in.name;
  }
  if (!fixed) return std::max<int64_t>(1, wanted);
  check(fixed > 0 && data.size() % fixed == 0, ErrorCode::invalid_argument,
        data.description() + ": the model's input '" + which + "' takes " + std::to_string(fixed) +
            " samples per run, which does not divide the sample count");
  return fixed;
}

StatsMap collect_statistics(const Model& model, const SampleSet& data, const ObservePlan& plan,
                            const QuantizeOptions& options, const std::string& key,
                            QuantizeReport& report) {
  StatsMap stats;
  std::string cache;
  if (!options.cache_dir.empty()) {
    cache = (fs::path(options.cache_dir) / (key + ".slimcal")).string();
    report.cache_files.push_back(cache);
    if (load_stats(cache, stats)) return stats;
  }
  report.stats_from_cache = false;
  Model m = model;
  std::set<std::string> inputs, outputs;
  for (const auto& v : m.graph.inputs) inputs.insert(v.name);
  for (const auto& v : m.graph.outputs) outputs.insert(v.name);
  std::vector<std::string> observed;  // what run() returns
  std::vector<std::pair<std::string, const ObserveSpec*>> list;
  for (const auto& [name, spec] : plan) {
    list.emplace_back(name, &spec);
    if (inputs.count(name)) continue;
    observed.push_back(name);
    if (!outputs.count(name)) m.graph.outputs.push_back(ValueInfo{name, {}, {}, ""});
  }
  const int64_t total =
      options.max_samples > 0 ? std::min(options.max_samples, data.size()) : data.size();
  const int64_t per_run = samples_per_run(m, data, options.batch);
  SessionOptions so;
  so.num_threads = options.num_threads;
  so.providers = options.providers;
  BatchRunner runner(std::move(m), so);
  std::vector<TensorStats> acc(list.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t begin = 0; begin < total; begin += per_run) {
    const int64_t end = std::min(total, begin + per_run);
    const TensorMap feeds = data.batch(begin, end);
    const TensorMap outs = runner.run(feeds, observed);
    default_thread_pool().parallel_for(int64_t(list.size()), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const auto& [name, spec] = list[size_t(i)];
        auto it = outs.find(name);
        const Tensor& t = it != outs.end() ? it->second : feeds.at(name);
        update(acc[size_t(i)], *spec, t);
      }
    });
    if (options.progress) options.progress(end, total);
  }
  report.calibration_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < list.size(); ++i)
    if (acc[i].count || acc[i].nonfinite) stats.emplace(list[i].first, std::move(acc[i]));
  if (!cache.empty()) {
    fs::create_directories(options.cache_dir);
    save_stats(stats, cache);
  }
  return stats;
}

}  // namespace slim::quant::detail
