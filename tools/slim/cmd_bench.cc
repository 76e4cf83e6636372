// `slim bench`: latency percentiles, throughput, peak memory and cold start of an ONNX
// model, plus where the time goes (per op type and per node, optionally as a Chrome
// trace). Inputs are random with the model's shapes unless given as .npy files.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_map>

#include "commands.h"
#include "energy_cli.h"
#include "slim/core/cpu_features.h"
#include "slim/core/dispatch.h"
#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/core/progress.h"
#include "slim/core/thread_pool.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/model_summary.h"
#include "slim/runtime/session.h"

namespace slim::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  int64_t batch = 1;
  int threads = 0;
  int warmup = 3;
  int iters = 20;
  std::string providers = "cpu,ref";
  std::string profile;              // Chrome trace path
  std::vector<std::string> inputs;  // NAME=FILE.npy
  std::vector<std::string> dims;    // NAME=VALUE for named symbolic dims
  std::string output_dir;
  std::string json;
  bool no_optimize = false;
  bool no_winograd = false;
  int top = 15;
  uint64_t seed = 1;
  EnergyArgs energy;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);)
    if (!p.empty()) out.push_back(p);
  return out;
}

std::pair<std::string, std::string> name_value(const std::string& spec, const char* option) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw Error(ErrorCode::invalid_argument,
                std::string(option) + " '" + spec + "': expected NAME=VALUE");
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}

// The concrete shape of an input: fixed dims as declared, a symbolic first dim is the
// batch, other symbolic dims come from --dim NAME=VALUE.
Shape input_shape(const ValueInfo& vi, int64_t batch, const std::map<std::string, int64_t>& dims) {
  if (!vi.shape)
    throw Error(ErrorCode::invalid_argument,
                "input '" + vi.name + "' has no declared rank; pass it with --input");
  Shape shape;
  for (size_t d = 0; d < vi.shape->size(); ++d) {
    const Dim& dim = (*vi.shape)[d];
    if (dim.is_fixed()) {
      shape.push_back(dim.value);
    } else if (!dim.param.empty() && dims.count(dim.param)) {
      shape.push_back(dims.at(dim.param));
    } else if (d == 0) {
      shape.push_back(batch);
    } else {
      throw Error(ErrorCode::invalid_argument,
                  "input '" + vi.name + "' dim " + std::to_string(d) + " ('" + dim.param +
                      "') is symbolic; give it with --dim " +
                      (dim.param.empty() ? std::string("NAME") : dim.param) + "=N");
    }
  }
  return shape;
}

// Floats uniform in [-1, 1); integers (token ids, indices) in [0, 10) so they index any
// embedding table; booleans half true.
Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937_64& rng) {
  Tensor t(dtype, shape);
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    std::uniform_real_distribution<float> uf(-1.f, 1.f);
    std::uniform_int_distribution<int> ui(0, 9);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        p[i] = ui(rng) % 2;
      else if constexpr (std::is_integral_v<T>)
        p[i] = T(ui(rng));
      else
        p[i] = T(uf(rng));
    }
  });
  return t;
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  size_t rank = size_t(std::ceil(q * double(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Per-node timings of the measured runs.
struct NodeProfile {
  struct Entry {
    std::string name, op, provider;
    double total_ms = 0;
  };
  struct Event {
    int node;
    double start_us, dur_us;
  };
  std::vector<Entry> nodes;
  std::unordered_map<const Node*, int> index;
  std::vector<Event> events;  // kept only for --profile
  bool keep_events = false;
  Clock::time_point origin = Clock::now();

  void record(const Node& n, const std::string& provider, Clock::time_point t0,
              Clock::time_point t1) {
    auto it = index.find(&n);
    int id;
    if (it == index.end()) {
      id = int(nodes.size());
      index.emplace(&n, id);
      nodes.push_back({n.name, (n.domain.empty() ? "" : n.domain + ":") + n.op_type, provider, 0});
    } else {
      id = it->second;
    }
    const double dur = std::chrono::duration<double, std::micro>(t1 - t0).count();
    nodes[size_t(id)].total_ms += dur / 1000.0;
    if (keep_events)
      events.push_back({id, std::chrono::duration<double, std::micro>(t0 - origin).count(), dur});
  }
};

void write_trace(const std::string& path, const NodeProfile& p,
                 const std::vector<std::pair<double, double>>& runs) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCode::invalid_argument, "--profile: cannot write '" + path + "'");
  f << "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) f << ",\n";
    first = false;
  };
  for (size_t r = 0; r < runs.size(); ++r) {
    sep();
    f << "{\"name\":\"run " << r << "\",\"cat\":\"run\",\"ph\":\"X\",\"ts\":" << runs[r].first
      << ",\"dur\":" << runs[r].second << ",\"pid\":1,\"tid\":0}";
  }
  for (const auto& e : p.events) {
    const auto& n = p.nodes[size_t(e.node)];
    sep();
    f << "{\"name\":\"" << json_escape(n.name) << "\",\"cat\":\"" << json_escape(n.op)
      << "\",\"ph\":\"X\",\"ts\":" << e.start_us << ",\"dur\":" << e.dur_us
      << ",\"pid\":1,\"tid\":1,\"args\":{\"op\":\"" << json_escape(n.op) << "\",\"provider\":\""
      << json_escape(n.provider) << "\"}}";
  }
  f << "\n],\"displayTimeUnit\":\"ms\"}\n";
  if (!f) throw Error(ErrorCode::resource_exhausted, "--profile: write to '" + path + "' failed");
}

void bench(const BenchOptions& o) {
  if (o.iters < 1) throw Error(ErrorCode::invalid_argument, "--iters must be at least 1");
  if (o.batch < 1) throw Error(ErrorCode::invalid_argument, "--batch must be at least 1");
  std::map<std::string, int64_t> dims;
  for (const auto& spec : o.dims) {
    const auto [name, value] = name_value(spec, "--dim");
    try {
      size_t used = 0;
      const long long v = std::stoll(value, &used);
      if (used != value.size() || v < 1) throw std::invalid_argument(value);
      dims[name] = v;
    } catch (const std::exception&) {
      throw Error(ErrorCode::invalid_argument,
                  "--dim '" + spec + "': value must be a positive integer");
    }
  }

  SessionOptions so;
  so.providers = split(o.providers, ',');
  so.num_threads = o.threads;
  so.optimize = !o.no_optimize;
  so.winograd = !o.no_winograd;

  // Cold start: load and compile, then the first run, as a serving process would.
  const auto t_load = Clock::now();
  Model model = OnnxImporter::load_file(o.model);
  require_supported_ops(model, so.providers, o.model);
  TensorMap feeds;
  for (const auto& spec : o.inputs) {
    const auto [name, file] = name_value(spec, "--input");
    feeds[name] = read_npy(file);
  }
  // Fix the batch (and named) dims, or those of the given inputs, before compiling so
  // the plan is static. A rank that contradicts the model is left for run() to report.
  for (auto& vi : model.graph.inputs) {
    if (!vi.shape) continue;
    auto given = feeds.find(vi.name);
    const Shape s = given != feeds.end() ? given->second.shape() : input_shape(vi, o.batch, dims);
    if (s.size() != vi.shape->size()) continue;
    for (size_t d = 0; d < s.size(); ++d)
      if (!(*vi.shape)[d].is_fixed()) (*vi.shape)[d].value = s[d];
  }
  std::mt19937_64 rng(o.seed);
  auto session = Session::compile(std::move(model), so);
  for (const auto& vi : session->inputs()) {
    if (feeds.count(vi.name)) continue;
    if (!vi.dtype)
      throw Error(ErrorCode::unsupported, "input '" + vi.name + "' has type " + vi.onnx_type +
                                              ", which slim cannot generate; pass --input");
    feeds[vi.name] = random_tensor(*vi.dtype, input_shape(vi, o.batch, dims), rng);
  }
  const double compile_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t_load).count();
  const auto t_first = Clock::now();
  TensorMap outs = session->run(feeds);
  const auto t_first_end = Clock::now();
  const double first_run_ms =
      std::chrono::duration<double, std::milli>(t_first_end - t_first).count();
  const double cold_ms = compile_ms + first_run_ms;
  std::optional<EnergyRun> energy;
  if (o.energy.on) energy.emplace(o.energy);

  {
    Progress progress("warmup", o.warmup);
    for (int i = 0; i < o.warmup; ++i) {
      outs = session->run(feeds);
      progress.update(i + 1);
    }
  }

  // Latency from runs without the profiler (its two clock reads and callback per node
  // cost as much as a small node itself), then as many profiled runs for the table.
  std::vector<double> ms;
  // With --energy the timed runs are metered as slim serve meters batches: one CpuTimeScope
  // over them (the pool workers' CPU time included) and a meter reading at the start, after
  // the first run that ends 10 ms or more after the last reading, and at the end. A reading
  // per run would cost a run of a micro-model a quarter of its time (system calls).
  struct Window {
    int runs = 0;
    energy::Reading end;
  };
  std::vector<Window> windows;
  energy::Reading start;
  CpuTimeAccount pool_cpu;
  {
    std::optional<CpuTimeScope> scope;
    if (energy) {
      energy->meter().read(start);
      scope.emplace(pool_cpu);
    }
    Progress progress("bench", o.iters);
    auto last = Clock::now();
    int runs = 0;
    for (int i = 0; i < o.iters; ++i) {
      const auto t0 = Clock::now();
      outs = session->run(feeds);
      const auto t1 = Clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      ++runs;
      if (energy && (t1 - last >= std::chrono::milliseconds(10) || i + 1 == o.iters)) {
        windows.push_back({runs, energy->meter().read()});
        last = t1;
        runs = 0;
      }
      progress.update(i + 1);
    }
  }
  NodeProfile prof;
  prof.keep_events = !o.profile.empty();
  session->set_profiler([&prof](const Node& n, const std::string& provider, Clock::time_point t0,
                                Clock::time_point t1) { prof.record(n, provider, t0, t1); });
  std::vector<std::pair<double, double>> run_spans;
  double profiled_ms = 0;
  {
    Progress progress("profile", o.iters);
    for (int i = 0; i < o.iters; ++i) {
      const auto t0 = Clock::now();
      outs = session->run(feeds);
      const auto t1 = Clock::now();
      profiled_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      run_spans.push_back({std::chrono::duration<double, std::micro>(t0 - prof.origin).count(),
                           std::chrono::duration<double, std::micro>(t1 - t0).count()});
      progress.update(i + 1);
    }
  }
  session->set_profiler(nullptr);

  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : ms) mean += v;
  mean /= double(ms.size());
  const double p50 = percentile(sorted, 0.5), p90 = percentile(sorted, 0.9),
               p99 = percentile(sorted, 0.99);
  const double rss = peak_rss_mib();
  const CompileStats& st = session->last_run_stats();

  std::printf("model:        %s\n", o.model.c_str());
  std::printf("inputs:      ");
  for (const auto& [name, t] : feeds) std::printf(" %s %s", name.c_str(), t.describe().c_str());
  std::printf("\nproviders:    %s   threads: %d   graph passes: %s (%lld rewrites, %lld nodes)\n",
              o.providers.c_str(), o.threads, o.no_optimize ? "off" : "on",
              static_cast<long long>(st.pass_rewrites), static_cast<long long>(st.nodes_out));
  std::printf("kernels:      %s (the cpu provider's own and oneDNN's)\n", isa_report().c_str());
  std::printf("cold start:   %.2f ms (load + compile %.2f ms, first run %.2f ms)\n", cold_ms,
              compile_ms, first_run_ms);
  std::printf(
      "latency:      p50 %.3f ms   p90 %.3f ms   p99 %.3f ms   mean %.3f ms   (%d runs, %d "
      "warmup)\n",
      p50, p90, p99, mean, o.iters, o.warmup);
  std::printf("throughput:   %.2f runs/s   %.2f samples/s (batch %lld)\n", 1000.0 / p50,
              1000.0 / p50 * double(o.batch), static_cast<long long>(o.batch));
  std::printf("peak RSS:     %.1f MiB\n", rss);
  nlohmann::json energy_json;
  if (energy) {
    const ModelSummary summary = summarize_model_shapes(session->model(), so.providers);
    const energy::EnergyReport r = energy->report(start, windows.back().end);
    const double inferences = double(o.iters) * double(o.batch);
    const double tops_per_w = r.work_joules > 0 ? summary.flops * o.iters / r.work_joules / 1e12 : 0;
    energy->print_setup(stdout, 14);
    std::printf("work energy:  %s, %.4g TOPS/W (%s per run); %d runs in %s, %s of CPU time\n",
                EnergyRun::per_unit(r, inferences, "inference").c_str(), tops_per_w,
                energy::si(summary.flops, "FLOPs").c_str(), o.iters, energy::si(r.seconds, "s").c_str(),
                energy::si(r.cpu_seconds, "s").c_str());
    std::printf("carbon:       %s\n", EnergyRun::carbon_line(r, inferences, "inference").c_str());
    energy_json = energy->setup_json();
    energy_json.update(energy::to_json(r, inferences, "inference"));
    energy_json["flops_per_run"] = summary.flops;
    energy_json["tops_per_w"] = tops_per_w;
    // What the pool hook saw of the process's CPU time (oneDNN's OpenMP threads are not in it).
    energy_json["pool_cpu_seconds"] = pool_cpu.seconds();
    // Each metered window: its runs and their work energy.
    nlohmann::json windows_json = nlohmann::json::array();
    for (size_t i = 0; i < windows.size(); ++i)
      windows_json.push_back(
          {{"runs", windows[i].runs},
           {"j", energy->report(i ? windows[i - 1].end : start, windows[i].end).work_joules}});
    energy_json["windows"] = windows_json;
  }

  // Time per op type and the slowest nodes, averaged over the profiled runs.
  double node_total = 0;
  std::map<std::string, std::pair<double, int>> by_op;
  for (const auto& n : prof.nodes) {
    node_total += n.total_ms;
    auto& e = by_op[n.op + " [" + n.provider + "]"];
    e.first += n.total_ms;
    ++e.second;
  }
  const double per_run = 1.0 / double(o.iters);
  std::vector<std::pair<std::string, std::pair<double, int>>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("\ntime by op type (per profiled run; %.3f ms in kernels of %.3f ms mean):\n",
              node_total * per_run, profiled_ms * per_run);
  for (const auto& [op, e] : ops)
    std::printf("  %-32s %9.3f ms  %5.1f%%  %4d nodes\n", op.c_str(), e.first * per_run,
                node_total > 0 ? 100.0 * e.first / node_total : 0.0, e.second);
  std::vector<const NodeProfile::Entry*> slow;
  for (const auto& n : prof.nodes) slow.push_back(&n);
  std::sort(slow.begin(), slow.end(), [](auto* a, auto* b) { return a->total_ms > b->total_ms; });
  std::printf("slowest nodes:\n");
  for (size_t i = 0; i < slow.size() && int(i) < o.top; ++i)
    std::printf("  %-40s %-20s %-4s %9.3f ms  %5.1f%%\n", slow[i]->name.c_str(),
                slow[i]->op.c_str(), slow[i]->provider.c_str(), slow[i]->total_ms * per_run,
                node_total > 0 ? 100.0 * slow[i]->total_ms / node_total : 0.0);

  if (!o.profile.empty()) {
    write_trace(o.profile, prof, run_spans);
    std::printf("trace:        %s (chrome://tracing or ui.perfetto.dev)\n", o.profile.c_str());
  }
  if (!o.output_dir.empty()) {
    std::filesystem::create_directories(o.output_dir);
    for (const auto& [name, t] : outs) {
      std::string file;
      for (char c : name)
        file += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')
                    ? c
                    : '_';
      write_npy((std::filesystem::path(o.output_dir) / (file + ".npy")).string(), t);
    }
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + o.json + "'");
    f << "{\"model\":\"" << json_escape(o.model) << "\",\"batch\":" << o.batch
      << ",\"threads\":" << o.threads << ",\"kernels\":\"" << isa_name(active_isa()) << "\",\"p50_ms\":" << p50 << ",\"p90_ms\":" << p90
      << ",\"p99_ms\":" << p99 << ",\"mean_ms\":" << mean << ",\"cold_start_ms\":" << cold_ms
      << ",\"compile_ms\":" << compile_ms << ",\"first_run_ms\":" << first_run_ms
      << ",\"peak_rss_mib\":" << rss << ",\"runs_ms\":[";
    for (size_t i = 0; i < ms.size(); ++i) f << (i ? "," : "") << ms[i];
    f << "],\"ops\":[";
    for (size_t i = 0; i < ops.size(); ++i)
      f << (i ? "," : "") << "{\"op\":\"" << json_escape(ops[i].first)
        << "\",\"ms\":" << ops[i].second.first * per_run << ",\"nodes\":" << ops[i].second.second
        << "}";
    f << "]";
    if (energy) f << ",\"energy\":" << energy_json.dump();
    f << "}\n";
  }
}

}  // namespace

SLIM_COMMAND(13, [](CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Measure an ONNX model: latency percentiles, throughput, peak RSS, cold start and a "
      "per-node profile");
  cmd->add_option("MODEL", o->model, "ONNX model file")->required();
  cmd->add_option("--batch", o->batch, "Value of a symbolic first input dim")
      ->capture_default_str();
  add_threads_option(cmd, &o->threads);
  add_isa_option(cmd);
  cmd->add_option("--warmup", o->warmup, "Untimed runs before measuring")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--iters", o->iters, "Timed runs")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--providers", o->providers, "Providers in priority order, comma-separated")
      ->capture_default_str();
  cmd->add_option("--profile", o->profile,
                  "Write a Chrome trace (JSON) of every node of the profiled runs");
  cmd->add_option("--input,-i", o->inputs, "NAME=FILE.npy instead of a random input (repeatable)");
  cmd->add_option("--dim", o->dims, "NAME=N for a named symbolic input dim (repeatable)");
  cmd->add_option("--output-dir,-o", o->output_dir,
                  "Write the last run's outputs as NAME.npy here");
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  cmd->add_option("--top", o->top, "Slowest nodes to list")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  cmd->add_flag("--no-optimize", o->no_optimize, "Compile without the graph optimization passes");
  cmd->add_flag("--no-winograd", o->no_winograd, "Run 3x3 convolutions as direct sums (no Winograd)");
  add_energy_options(cmd, &o->energy);
  cmd->callback([o] { bench(*o); });
});

}  // namespace slim::cli
