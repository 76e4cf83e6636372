// `slim inspect` and `slim run`: look into an ONNX model and execute it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "commands.h"
#include "slim/core/convert.h"
#include "slim/core/dispatch.h"
#include "slim/core/npy.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/model_summary.h"
#include "slim/runtime/session.h"

namespace slim::cli {
namespace {

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, i ? "%.2f %s%s" : "%.0f %s%s", v, prefixes[i], unit);
  return buf;
}

std::string domain_label(const std::string& d) { return d.empty() ? "ai.onnx" : d; }

// A copy of the model whose symbolic input dims are fixed to 1, so that shapes (and so
// FLOPs and the memory plan) can be inferred for a single-example run.
Model with_unit_symbolic_dims(Model m) {
  for (auto& in : m.graph.inputs)
    if (in.shape)
      for (auto& d : *in.shape)
        if (!d.is_fixed()) d.value = 1;
  return m;
}

std::string join_names(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

// "op: reason (nodes 'a', 'b' and 3 more)" for each op the providers cannot run.
std::vector<std::string> describe_unsupported(const std::vector<UnsupportedOp>& missing) {
  std::vector<std::string> lines;
  for (const auto& u : missing) {
    std::string nodes;
    for (size_t i = 0; i < std::min<size_t>(u.nodes.size(), 3); ++i) nodes += (i ? ", '" : "'") + u.nodes[i] + "'";
    if (u.nodes.size() > 3) nodes += " and " + std::to_string(u.nodes.size() - 3) + " more";
    lines.push_back(u.op + ": " + u.reason + " (node" + (u.nodes.size() > 1 ? "s " : " ") + nodes + ")");
  }
  return lines;
}

// One line per compiled node: its provider and, where a provider ahead of it declined,
// why (the first reason; the rest follow on indented lines).
void print_partition(const Session& session) {
  std::map<std::string, int64_t> per_provider;
  for (const auto& a : session.partition()) ++per_provider[a.provider];
  std::cout << "partition:";
  for (const auto& [p, n] : per_provider) std::cout << " " << p << " " << n;
  std::cout << " nodes\n";
  for (const auto& a : session.partition()) {
    std::cout << "  " << a.provider << "  " << a.op << " '" << a.node << "'";
    for (size_t i = 0; i < a.declined.size(); ++i)
      std::cout << (i == 0 ? "  fell back: " : "\n      also: ") << a.declined[i];
    std::cout << "\n";
  }
}

void inspect(const std::string& path, const std::vector<std::string>& providers, bool partition) {
  Model model = OnnxImporter::load_file(path);
  std::cout << "model:     " << path << "\n";
  std::cout << "ir:        " << model.ir_version;
  if (!model.producer_name.empty())
    std::cout << " (producer " << model.producer_name
              << (model.producer_version.empty() ? "" : " " + model.producer_version) << ")";
  std::cout << "\nkernels:   " << isa_report();
  std::cout << "\nopsets:   ";
  for (const auto& [d, v] : model.opsets) std::cout << " " << domain_label(d) << " " << v;
  std::cout << "\ninputs:\n";
  for (const auto& v : model.graph.inputs) std::cout << "  " << v.name << "  " << v.describe() << "\n";
  for (const auto& v : model.graph.overridable_inputs)
    std::cout << "  " << v.name << "  " << v.describe() << "  (optional, has initializer)\n";
  std::cout << "outputs:\n";
  for (const auto& v : model.graph.outputs) std::cout << "  " << v.name << "  " << v.describe() << "\n";

  const std::vector<UnsupportedOp> missing = unsupported_op_report(model, providers);
  std::unique_ptr<Session> session;
  std::string compile_error;
  if (missing.empty()) {
    try {
      SessionOptions opt;
      opt.providers = providers;
      session = Session::compile(with_unit_symbolic_dims(model), opt);
    } catch (const Error& e) {
      compile_error = e.what();
    }
  }
  const ModelSummary s = summarize_model_shapes(with_unit_symbolic_dims(model), providers);
  std::cout << "nodes:     " << s.num_nodes;
  if (s.subgraph_nodes) std::cout << " (+" << s.subgraph_nodes << " in subgraphs)";
  std::cout << "\n";
  std::vector<std::pair<std::string, int64_t>> hist(s.op_histogram.begin(), s.op_histogram.end());
  std::stable_sort(hist.begin(), hist.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (const auto& [op, n] : hist) {
    std::cout << "  " << op << " " << n;
    auto f = s.flops_by_op.find(op);
    if (f != s.flops_by_op.end() && f->second > 0) std::cout << "  (" << human(f->second, "FLOPs") << ")";
    std::cout << "\n";
  }
  std::cout << "parameters: " << s.parameter_count << " in " << s.num_initializers
            << " initializers (" << human(double(s.parameter_bytes), "B") << ")\n";
  std::cout << "FLOPs:     " << human(s.flops, "FLOPs") << " per run (estimated, symbolic dims = 1";
  if (s.nodes_without_flops) std::cout << "; " << s.nodes_without_flops << " nodes with unknown shapes not counted";
  if (s.subgraph_nodes) std::cout << "; the nodes in subgraphs not counted";
  std::cout << ")\n";
  if (session) {
    const auto& st = session->stats();
    std::cout << "compile:   " << st.nodes_in << " nodes -> " << st.nodes_out << " ("
              << st.folded_nodes << " folded, " << st.dead_nodes << " dead)\n";
    const auto& m = st.memory;
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * m.reuse_rate());
    std::cout << "memory:    " << m.planned_values << " planned intermediates, "
              << human(double(m.intermediate_bytes), "B") << " -> arena " << human(double(m.planned_bytes), "B")
              << " (reuse " << rate << ")";
    if (m.in_place_values) std::cout << ", " << m.in_place_values << " written in place";
    if (m.dynamic_values) std::cout << ", " << m.dynamic_values << " dynamic";
    std::cout << "\n";
  } else if (!compile_error.empty()) {
    std::cout << "compile:   failed: " << compile_error << "\n";
  }
  if (partition && session) print_partition(*session);
  if (missing.empty()) {
    std::cout << "unsupported ops: none\n";
  } else {
    std::cout << "unsupported ops: " << missing.size() << " (providers " << join_names(providers, ",")
              << " cannot run this model)\n";
    for (const auto& line : describe_unsupported(missing)) std::cout << "  " << line << "\n";
  }
}

Tensor random_input(const ValueInfo& info, std::mt19937_64& rng) {
  if (!info.dtype)
    throw Error(ErrorCode::unsupported, "input '" + info.name + "' has type " + info.onnx_type +
                                            ", which slim cannot generate; pass --input");
  Shape shape;
  if (info.shape)
    for (const auto& d : *info.shape) shape.push_back(d.is_fixed() ? d.value : 1);
  Tensor t(*info.dtype, shape);
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    std::uniform_real_distribution<float> uf(0.f, 1.f);
    std::uniform_int_distribution<int> ui(0, 9);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>) p[i] = ui(rng) % 2;
      else if constexpr (std::is_integral_v<T>) p[i] = T(ui(rng));
      else p[i] = T(uf(rng));
    }
  });
  return t;
}

void print_summary(const std::string& name, const Tensor& t, bool argmax) {
  std::cout << name << "  " << t.describe();
  if (t.numel() == 0) {
    std::cout << "  (empty)\n";
    return;
  }
  const auto v = tensor_to_doubles(t);
  double lo = v[0], hi = v[0], sum = 0;
  for (double x : v) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
  }
  std::cout << "  min " << lo << "  max " << hi << "  mean " << sum / double(v.size()) << "\n  [";
  for (size_t i = 0; i < std::min<size_t>(v.size(), 8); ++i) std::cout << (i ? ", " : "") << v[i];
  std::cout << (v.size() > 8 ? ", ...]\n" : "]\n");
  if (argmax && t.rank() >= 1) {
    const int64_t cols = t.shape().back(), rows = t.numel() / std::max<int64_t>(cols, 1);
    std::cout << "  argmax per row:";
    for (int64_t r = 0; r < rows; ++r) {
      int64_t best = 0;
      for (int64_t c = 1; c < cols; ++c)
        if (v[size_t(r * cols + c)] > v[size_t(r * cols + best)]) best = c;
      std::cout << " " << best;
    }
    std::cout << "\n";
  }
}

struct RunOptions {
  std::string model;
  std::vector<std::string> inputs;
  std::string output_dir;
  int threads = 0;
  uint64_t seed = 0;
  bool argmax = false;
  int repeat = 1;
  bool no_winograd = false;
  std::vector<std::string> providers = {"cpu", "ref"};
};

void run(const RunOptions& o) {
  SessionOptions so;
  so.num_threads = o.threads;
  so.providers = o.providers;
  so.winograd = !o.no_winograd;
  TensorMap feeds;
  for (const auto& spec : o.inputs) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(ErrorCode::invalid_argument, "--input '" + spec + "': expected NAME=FILE.npy");
    feeds[spec.substr(0, eq)] = read_npy(spec.substr(eq + 1));
  }
  // Symbolic input dims are fixed before compiling (from the given arrays, else 1 as the
  // random inputs use), so the whole graph has static shapes: providers such as cpu only
  // claim statically shaped nodes, and a single run never reaches a shape specialization.
  Model model = OnnxImporter::load_file(o.model);
  for (auto& in : model.graph.inputs) {
    if (!in.shape) continue;
    auto given = feeds.find(in.name);
    const bool fits = given != feeds.end() && given->second.rank() == int(in.shape->size());
    for (size_t d = 0; d < in.shape->size(); ++d)
      if (!(*in.shape)[d].is_fixed()) (*in.shape)[d].value = fits ? given->second.shape()[d] : 1;
  }
  require_supported_ops(model, so.providers, o.model);
  auto session = Session::compile(std::move(model), so);
  std::mt19937_64 rng(o.seed);
  for (const auto& in : session->inputs())
    if (!feeds.count(in.name)) {
      feeds[in.name] = random_input(in, rng);
      std::cout << "input " << in.name << ": random " << feeds[in.name].describe() << " (seed " << o.seed << ")\n";
    }
  TensorMap outs;
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, o.repeat); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    outs = session->run(feeds);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  for (const auto& out : session->outputs()) print_summary(out.name, outs.at(out.name), o.argmax);
  std::printf("run: %.3f ms (median of %zu)\n", ms[ms.size() / 2], ms.size());
  if (!o.output_dir.empty()) {
    std::filesystem::create_directories(o.output_dir);
    for (const auto& [name, t] : outs) {
      std::string file;
      for (char c : name) file += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
      const std::string path = (std::filesystem::path(o.output_dir) / (file + ".npy")).string();
      write_npy(path, t);
      std::cout << "wrote " << path << "\n";
    }
  }
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(p);
  return out;
}

SLIM_COMMAND(10, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show an ONNX model's inputs, outputs, opsets, ops, "
                                            "parameters, estimated FLOPs, memory plan and unsupported ops");
  auto model = std::make_shared<std::string>();
  auto providers = std::make_shared<std::string>("cpu,ref");
  auto partition = std::make_shared<bool>(false);
  cmd->add_option("MODEL", *model, "ONNX model file")->required();
  cmd->add_option("--providers", *providers, "Providers in priority order, comma-separated")->capture_default_str();
  cmd->add_flag("--partition", *partition,
                "Show each node's provider and why the providers ahead of it declined it");
  add_isa_option(cmd);
  cmd->callback([model, providers, partition] { inspect(*model, split_commas(*providers), *partition); });
});

SLIM_COMMAND(11, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run an ONNX model on .npy inputs (seeded random inputs for "
                                        "those not given) and summarize or save its outputs");
  auto o = std::make_shared<RunOptions>();
  auto providers = std::make_shared<std::string>("cpu,ref");
  cmd->add_option("MODEL", o->model, "ONNX model file")->required();
  cmd->add_option("--input,-i", o->inputs, "NAME=FILE.npy (repeatable)");
  cmd->add_option("--output-dir,-o", o->output_dir, "Write each output as NAME.npy here");
  add_threads_option(cmd, &o->threads);
  add_isa_option(cmd);
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  cmd->add_option("--repeat", o->repeat, "Run this many times and report the median time")->check(CLI::PositiveNumber);
  cmd->add_flag("--argmax", o->argmax, "Also print the argmax of each output row (classifiers)");
  cmd->add_flag("--no-winograd", o->no_winograd, "Run 3x3 convolutions as direct sums (no Winograd)");
  cmd->add_option("--providers", *providers, "Providers in priority order, comma-separated")->capture_default_str();
  cmd->callback([o, providers] {
    o->providers = split_commas(*providers);
    run(*o);
  });
});

}  // namespace

ModelSummary summarize_model_shapes(const Model& model, const std::vector<std::string>& providers) {
  std::unique_ptr<Session> shapes;
  if (unsupported_op_report(model, providers).empty()) {
    try {
      SessionOptions opt;
      opt.providers = providers;
      opt.optimize = false;
      shapes = Session::compile(model, opt);  // a copy: its tensors share the model's storage
    } catch (const Error&) {
      // FLOPs of what can be counted from the initializers' shapes alone
    }
  }
  return summarize_model(model, [&](const std::string& name) -> std::optional<Shape> {
    if (shapes)
      if (auto shape = shapes->static_shape(name)) return shape;
    auto it = model.graph.initializers.find(name);
    if (it != model.graph.initializers.end()) return it->second.shape();
    return std::nullopt;
  });
}

void require_supported_ops(const Model& model, const std::vector<std::string>& providers, const std::string& path) {
  const std::vector<UnsupportedOp> missing = unsupported_op_report(model, providers);
  if (missing.empty()) return;
  throw Error(ErrorCode::unsupported, path + ": " + std::to_string(missing.size()) + " op" +
                                          (missing.size() > 1 ? "s" : "") + " with no kernel in providers " +
                                          join_names(providers, ",") + ":\n  " +
                                          join_names(describe_unsupported(missing), "\n  "));
}

}  // namespace slim::cli
