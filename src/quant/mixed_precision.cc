// Mixed precision: layers, their sensitivities and latencies, the knapsack that picks the
// int8 layers, and the plan file. docs/quantization.md §11 has the method.
#include "slim/quant/mixed_precision.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/session.h"
#include "slim/trust/digest.h"

namespace slim::quant {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPlanFormat = "slim-mixed-precision-1";

bool is_anchor_op(const std::string& op) {
  return op == "Conv" || op == "ConvTranspose" || op == "MatMul" || op == "Gemm";
}

std::string fmt(double v, int digits = 3) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

// Each node's layer: the seeds (node name -> layer) first, then a node takes the layer of
// the producer of its first input that has one (in topological order), and a node still
// without one the layer of its first reader that has one (in reverse order). Nodes with
// neither stay out (-1). Q/DQ nodes so follow the node whose value they quantize, a
// weight's DequantizeLinear its reader, and float nodes between layers the layer before.
std::map<std::string, int> owners(const Graph& g, const std::map<std::string, int>& seeds) {
  std::vector<size_t> order;
  try {
    order = validate_graph(g, "mixed precision");
  } catch (const Error&) {  // a compiled graph is already in execution order
    for (size_t i = 0; i < g.nodes.size(); ++i) order.push_back(i);
  }
  std::map<std::string, int> of_value, of_node;
  for (size_t i : order) {
    const Node& n = g.nodes[i];
    int owner = -1;
    if (auto s = seeds.find(n.name); s != seeds.end()) owner = s->second;
    for (size_t k = 0; owner < 0 && k < n.inputs.size(); ++k)
      if (auto v = of_value.find(n.inputs[k]); v != of_value.end()) owner = v->second;
    if (owner < 0) continue;
    of_node[n.name] = owner;
    for (const auto& o : n.outputs) of_value[o] = owner;
  }
  std::map<std::string, int> reader_of;  // value -> layer of its first owned reader
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& n = g.nodes[*it];
    int owner = -1;
    if (auto o = of_node.find(n.name); o != of_node.end()) owner = o->second;
    for (size_t k = 0; owner < 0 && k < n.outputs.size(); ++k)
      if (auto r = reader_of.find(n.outputs[k]); r != reader_of.end()) owner = r->second;
    if (owner < 0) continue;
    of_node.emplace(n.name, owner);
    for (const auto& in : n.inputs) reader_of[in] = owner;  // reverse order: the first reader wins
  }
  return of_node;
}

std::map<std::string, int> layer_seeds(const std::vector<Layer>& layers) {
  std::map<std::string, int> seeds;
  for (size_t i = 0; i < layers.size(); ++i)
    for (const auto& n : layers[i].nodes) seeds[n] = int(i);
  return seeds;
}

// The loss of a candidate's outputs against the float model's, summed over the outputs:
// mean KL(p_float ‖ p_candidate) over the rows of a Softmax/LogSoftmax output, else
// 1 − cosine over all values.
struct LossMeter {
  std::vector<std::string> outputs;
  std::vector<bool> distribution, log_space;
  std::vector<TensorMap> reference;  // the float model's outputs, per batch
  std::vector<std::pair<int64_t, int64_t>> batches;
  const SampleSet* data = nullptr;
  SessionOptions so;

  std::string metric() const {
    bool kl = false, cos = false;
    for (bool d : distribution) (d ? kl : cos) = true;
    return kl && cos ? "kl+1-cosine" : kl ? "kl" : "1-cosine";
  }

  double loss(const Model& candidate) const {
    detail::BatchRunner runner(candidate, so);
    double total = 0;
    std::vector<double> kl(outputs.size(), 0.0), dot(outputs.size(), 0.0), na(outputs.size(), 0.0),
        nb(outputs.size(), 0.0);
    std::vector<int64_t> rows(outputs.size(), 0);
    for (size_t b = 0; b < batches.size(); ++b) {
      const TensorMap got = runner.run(data->batch(batches[b].first, batches[b].second), outputs);
      for (size_t k = 0; k < outputs.size(); ++k) {
        const Tensor x = reference[b].at(outputs[k]).contiguous();
        const Tensor y = got.at(outputs[k]).contiguous();
        check(x.shape() == y.shape() && x.dtype() == y.dtype(), ErrorCode::internal,
              "mixed precision: output '" + outputs[k] + "' changed shape");
        if (x.dtype() != DType::f32 || x.numel() == 0) continue;
        const float* p = x.data<float>();
        const float* q = y.data<float>();
        if (distribution[k] && x.rank() > 0) {
          const int64_t c = x.shape().back(), r = c ? x.numel() / c : 0;
          for (int64_t i = 0; i < r * c; ++i) {
            const double pi = log_space[k] ? std::exp(double(p[i])) : double(p[i]);
            const double qi = log_space[k] ? std::exp(double(q[i])) : double(q[i]);
            if (pi > 0) kl[k] += pi * std::log(pi / std::max(qi, 1e-30));
          }
          rows[k] += r;
        } else {
          for (int64_t i = 0; i < x.numel(); ++i) {
            dot[k] += double(p[i]) * q[i];
            na[k] += double(p[i]) * p[i];
            nb[k] += double(q[i]) * q[i];
          }
        }
      }
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (distribution[k]) {
        total += rows[k] ? std::max(0.0, kl[k] / double(rows[k])) : 0.0;
      } else {
        const double cos =
            na[k] > 0 && nb[k] > 0 ? dot[k] / std::sqrt(na[k] * nb[k]) : (na[k] == nb[k] ? 1 : 0);
        total += std::max(0.0, 1.0 - cos);
      }
    }
    return total;
  }
};

LossMeter make_meter(const Model& prepared, const SampleSet& calib, const QuantizeOptions& qo,
                     int64_t samples) {
  LossMeter m;
  m.data = &calib;
  m.so.num_threads = qo.num_threads;
  m.so.providers = qo.providers;
  std::map<std::string, std::string> producer_op;
  for (const auto& n : prepared.graph.nodes)
    for (const auto& o : n.outputs)
      if (n.domain.empty()) producer_op[o] = n.op_type;
  for (const auto& v : prepared.graph.outputs) {
    m.outputs.push_back(v.name);
    const std::string op = producer_op.count(v.name) ? producer_op[v.name] : "";
    m.distribution.push_back(op == "Softmax" || op == "LogSoftmax");
    m.log_space.push_back(op == "LogSoftmax");
  }
  const int64_t total = std::min(std::max<int64_t>(1, samples), calib.size());
  const int64_t per_run = detail::samples_per_run(prepared, calib, qo.batch);
  for (int64_t b = 0; b < total; b += per_run)
    m.batches.push_back({b, std::min(calib.size(), b + per_run)});
  detail::BatchRunner runner(prepared, m.so);
  for (const auto& [b, e] : m.batches)
    m.reference.push_back(runner.run(calib.batch(b, e), m.outputs));
  return m;
}

// The prepared model with the plan's int8 and int4 layers quantized (the rest, and the
// user's exclusions, in float): what quantize_model writes with plan_quantizer's settings.
Model build(const detail::PreparedModel& p, const Measurements& m,
            const std::vector<Precision>& precision, const QuantizeOptions& qo) {
  const QuantizeOptions o = plan_quantizer(m, precision, qo);
  Model model = p.model;
  QuantizeReport scratch;
  detail::insert_qdq(model, p.stats, o, scratch);
  detail::insert_matmul_nbits(model, o, scratch);
  return model;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timing {
  double e2e_ms = 0, profiled_ms = 0;
  std::vector<double> layer_ms;  // median over the profiled runs of each layer's time
};

// Which layer each node of a model is charged to: from the model's graph and from its
// compiled graph (fused nodes keep the name of the node they stand for).
using Attribution =
    std::function<std::map<std::string, int>(const Graph& model, const Graph& compiled)>;

// The model compiled for the feeds' shapes (its symbolic dims fixed), warmed up.
std::unique_ptr<Session> compile_for(const Model& model, const TensorMap& feeds,
                                     const QuantizeOptions& qo) {
  Model fixed = model;
  for (auto& in : fixed.graph.inputs) {
    auto it = feeds.find(in.name);
    if (!in.shape || it == feeds.end() || it->second.rank() != int(in.shape->size())) continue;
    for (size_t d = 0; d < in.shape->size(); ++d)
      if (!(*in.shape)[d].is_fixed()) (*in.shape)[d].value = it->second.shape()[d];
  }
  SessionOptions so;
  so.num_threads = qo.num_threads;
  so.providers = qo.providers;
  auto session = Session::compile(std::move(fixed), so);
  for (int i = 0; i < 3; ++i) session->run(feeds);  // warm-up
  return session;
}

// The clock latencies are read on: with one thread, the process's CPU time, which other
// processes sharing the cores do not inflate (a run on one thread is busy from start to
// end, so it equals the wall time of an idle machine); with more, wall time.
double now_ms(bool cpu) {
  if (!cpu)
    return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

bool cpu_clock(const QuantizeOptions& qo) {
  return qo.num_threads == 1;
}

double run_ms(Session& s, const TensorMap& feeds, bool cpu) {
  const double t0 = now_ms(cpu);
  s.run(feeds);
  return now_ms(cpu) - t0;
}

// Medians of `runs` runs of two models, alternating run by run, so that a change of the
// machine's load falls on both.
// `b` is compiled already (the all-fp32 model, compiled once per run: Context::fp32).
std::pair<double, double> time_alternating(const Model& a, Session& b, const TensorMap& feeds,
                                           const QuantizeOptions& qo, int runs) {
  auto sa = compile_for(a, feeds, qo);
  std::vector<double> ta, tb;
  for (int i = 0; i < runs; ++i) {
    ta.push_back(run_ms(*sa, feeds, cpu_clock(qo)));
    tb.push_back(run_ms(b, feeds, cpu_clock(qo)));
  }
  return {median(ta), median(tb)};
}

// A compiled model whose runs charge each node's time to a layer; runs of several of them
// can alternate, so that a change of the machine's load falls on all.
class Profiled {
 public:
  Profiled(const Model& model, const TensorMap& feeds, const QuantizeOptions& qo,
           const Attribution& attribute, size_t n_layers)
      : feeds_(feeds),
        cpu_(cpu_clock(qo)),
        session_(compile_for(model, feeds, qo)),
        per_layer_(n_layers),
        run_ms_(n_layers, 0.0) {
    owner_ = attribute(model.graph, session_->compiled_graph());
    // On the CPU clock a node's time is the CPU time since the previous node ended (the
    // callback runs on the thread that ran the node, right after it).
    session_->set_profiler(
        [this](const Node& n, const std::string&, Clock::time_point a, Clock::time_point b) {
          double ms = std::chrono::duration<double, std::milli>(b - a).count();
          if (cpu_) {
            const double t = now_ms(true);
            ms = t - last_;
            last_ = t;
          }
          total_ += ms;
          auto it = owner_.find(n.name);
          if (it != owner_.end() && it->second >= 0) run_ms_[size_t(it->second)] += ms;
        });
  }
  void run() {
    std::fill(run_ms_.begin(), run_ms_.end(), 0.0);
    total_ = 0;
    last_ = now_ms(cpu_);
    session_->run(feeds_);
    for (size_t l = 0; l < run_ms_.size(); ++l) per_layer_[l].push_back(run_ms_[l]);
    totals_.push_back(total_);
  }
  Timing timing() const {
    Timing t;
    t.profiled_ms = median(totals_);
    for (const auto& v : per_layer_) t.layer_ms.push_back(median(v));
    return t;
  }

 private:
  const TensorMap& feeds_;
  bool cpu_;
  std::unique_ptr<Session> session_;
  std::map<std::string, int> owner_;
  std::vector<std::vector<double>> per_layer_;
  std::vector<double> run_ms_, totals_;
  double total_ = 0, last_ = 0;
};

// Layers by propagation from their nodes (owners()): the all-fp32 and all-int8 models.
Attribution by_layers(const std::vector<Layer>& layers) {
  return [seeds = layer_seeds(layers)](const Graph& model, const Graph& compiled) {
    std::map<std::string, int> owner = owners(model, seeds);
    for (const auto& [name, l] : owners(compiled, owner)) owner.emplace(name, l);
    return owner;
  };
}

TensorMap latency_feeds(const Model& prepared, const SampleSet& calib) {
  const int64_t n = detail::samples_per_run(prepared, calib, 1);
  return calib.batch(0, std::min(calib.size(), n));
}

std::string file_sha256(const std::string& path) {
  return trust::to_hex(trust::hash_file(trust::HashAlg::sha256, path));
}

void report(const MixedPrecisionOptions& mo, const std::string& stage, int64_t done,
            int64_t total) {
  if (mo.progress) mo.progress(stage, done, total);
}

}  // namespace

const char* precision_name(Precision p) {
  return p == Precision::int8 ? "int8" : p == Precision::int4 ? "int4" : "fp32";
}

int64_t PlanPoint::layers(Precision p) const {
  return std::count(precision.begin(), precision.end(), p);
}

std::vector<Layer> quantizable_layers(const Model& prepared, const QuantizeOptions& options) {
  const Graph& g = prepared.graph;
  const auto& ops = options.op_types.empty() ? default_op_types() : options.op_types;
  auto selected = [&](const Node& n) {
    return n.domain.empty() && ops.count(n.op_type) && !options.exclude_nodes.count(n.name);
  };
  const std::vector<size_t> order = validate_graph(g, prepared.path);
  std::map<std::string, int> seeds;
  std::vector<Layer> layers;
  const detail::GraphIndex index(g);
  for (size_t i : order) {
    const Node& n = g.nodes[i];
    if (!selected(n) || !is_anchor_op(n.op_type)) continue;
    seeds[n.name] = int(layers.size());
    layers.push_back(Layer{n.name, n.op_type, {}});
    layers.back().int4 = !detail::int4_refusal(g, index, n);
  }
  const std::map<std::string, int> owner = owners(g, seeds);
  std::map<std::string, int> singles;  // quantizable nodes no anchor reaches: a layer each
  for (size_t i : order) {
    const Node& n = g.nodes[i];
    if (!selected(n)) continue;
    auto it = owner.find(n.name);
    if (it != owner.end()) {
      layers[size_t(it->second)].nodes.push_back(n.name);
    } else {
      singles[n.name] = int(layers.size());
      layers.push_back(Layer{n.name, n.op_type, {n.name}});
    }
  }
  // Anchors first in each layer's list, then the rest in order (the anchor is already first:
  // it precedes the nodes that inherit its layer).
  return layers;
}

namespace {

// What the measuring and the verification share: the prepared model and its statistics,
// the float outputs to compare with, the sample that is timed.
struct Context {
  detail::PreparedModel p;
  LossMeter meter;
  TensorMap feeds;
  std::shared_ptr<Session> fp32;  // the prepared float model compiled for feeds
};

Context make_context(const std::string& model_path, const SampleSet& calib,
                     const QuantizeOptions& qo, const MixedPrecisionOptions& mo) {
  check(qo.smoothquant_alpha == 0, ErrorCode::invalid_argument,
        "quantize: mixed precision does not take --smoothquant (its factors depend on which "
        "nodes are quantized)");
  check(mo.latency_runs >= 1 && mo.samples >= 1, ErrorCode::invalid_argument,
        "quantize: --latency-runs and --sensitivity-samples must be at least 1");
  check(mo.evaluations >= 0, ErrorCode::invalid_argument,
        "quantize: --search-evaluations must be at least 0");
  QuantizeReport rep;
  Context c{detail::prepare_and_collect(model_path, calib, qo, rep), {}, {}, {}};
  c.meter = make_meter(c.p.model, calib, qo, mo.samples);
  c.feeds = latency_feeds(c.p.model, calib);
  c.fp32 = compile_for(c.p.model, c.feeds, qo);
  return c;
}

Measurements measure(const Context& c, const std::string& model_path, const QuantizeOptions& qo,
                     const MixedPrecisionOptions& mo) {
  Measurements m;
  m.model_sha256 = file_sha256(model_path);
  m.layers = quantizable_layers(c.p.model, qo);
  check(!m.layers.empty(), ErrorCode::invalid_argument,
        model_path +
            ": no quantizable layer (Conv, ConvTranspose, MatMul, Gemm, ...) to choose a "
            "precision for");
  m.runs = mo.latency_runs;
  m.threads = qo.num_threads;
  m.clock = cpu_clock(qo) ? "process CPU time" : "wall time";
  const size_t n = m.layers.size();
  if (!mo.int4)
    for (auto& l : m.layers) l.int4 = false;
  m.metric = c.meter.metric();
  m.samples = c.meter.batches.empty() ? 0 : c.meter.batches.back().second;
  // The all-fp32 profile first: its attribution tells which nodes are the float model's.
  std::map<std::string, int> fp32_owner;
  std::set<std::string> fp32_names;
  const Attribution layered = by_layers(m.layers);
  const Attribution record = [&](const Graph& model, const Graph& compiled) {
    fp32_owner = layered(model, compiled);
    for (const Graph* g : {&model, &compiled})
      for (const auto& nd : g->nodes) fp32_names.insert(nd.name);
    return fp32_owner;
  };
  const Model all8 = build(c.p, m, std::vector<Precision>(n, Precision::int8), qo);
  // Every layer that is offered int4 in int4, the rest fp32.
  std::vector<Precision> all4(n, Precision::fp32);
  for (size_t i = 0; i < n; ++i)
    if (m.layers[i].int4) all4[i] = Precision::int4;
  const bool int4 = std::count(all4.begin(), all4.end(), Precision::int4) > 0;
  // The all-fp32, all-int8 (and all-int4) profiles, runs alternating.
  report(mo, "latency", 0, 1);
  Profiled pf(c.p.model, c.feeds, qo, record, n), pq(all8, c.feeds, qo, layered, n);
  std::unique_ptr<Profiled> p4;
  if (int4) p4 = std::make_unique<Profiled>(build(c.p, m, all4, qo), c.feeds, qo, layered, n);
  for (int r = 0; r < mo.latency_runs; ++r) {
    pf.run();
    pq.run();
    if (p4) p4->run();
  }
  const Timing f = pf.timing(), q = pq.timing(), w = p4 ? p4->timing() : Timing{};
  for (size_t i = 0; i < n; ++i)
    if (m.layers[i].int4) m.layers[i].int4_ms = w.layer_ms[i];
  report(mo, "latency", 1, 1);
  // End to end, the two models alternating too.
  std::tie(m.int8_ms, m.fp32_ms) = time_alternating(all8, *c.fp32, c.feeds, qo, mo.latency_runs);
  m.fp32_profiled_ms = f.profiled_ms;
  m.int8_profiled_ms = q.profiled_ms;
  for (size_t i = 0; i < n; ++i) {
    m.layers[i].fp32_ms = f.layer_ms[i];
    m.layers[i].int8_ms = q.layer_ms[i];
  }
  // Each layer alone in int8: its loss, and its time with the Q/DQ nodes of its borders
  // (every node the float model does not have is one of them), its runs alternating with
  // the all-int8 model's: the border cost is the difference of the two at one load.
  const int alone_runs = std::max(3, mo.latency_runs / 2);
  for (size_t i = 0; i < n; ++i) {
    report(mo, "layers", int64_t(i), int64_t(n));
    std::vector<Precision> only(n, Precision::fp32);
    only[i] = Precision::int8;
    const Model one = build(c.p, m, only, qo);
    m.layers[i].loss_alone = c.meter.loss(one);
    std::vector<Precision> but(n, Precision::int8);
    but[i] = Precision::fp32;
    m.layers[i].loss_leave_one_out = c.meter.loss(build(c.p, m, but, qo));
    if (m.layers[i].int4) {
      only[i] = Precision::int4;
      m.layers[i].loss_int4 = c.meter.loss(build(c.p, m, only, qo));
    }
    const Attribution alone = [&](const Graph& model, const Graph& compiled) {
      std::map<std::string, int> owner;
      for (const Graph* g : {&model, &compiled})
        for (const auto& nd : g->nodes) {
          auto it = fp32_owner.find(nd.name);
          owner[nd.name] = it != fp32_owner.end()      ? (it->second == int(i) ? 0 : -1)
                           : fp32_names.count(nd.name) ? -1
                                                       : 0;
        }
      return owner;
    };
    Profiled pa(one, c.feeds, qo, alone, 1);
    Profiled pi(
        all8, c.feeds, qo,
        [&](const Graph& mg, const Graph& cg) {
          std::map<std::string, int> owner;
          for (const auto& [name, l] : layered(mg, cg)) owner[name] = l == int(i) ? 0 : -1;
          return owner;
        },
        1);
    for (int r = 0; r < alone_runs; ++r) {
      pa.run();
      pi.run();
    }
    const double a = pa.timing().layer_ms[0], inner = pi.timing().layer_ms[0];
    m.layers[i].int8_alone_ms = m.layers[i].int8_ms + (a - inner);
  }
  report(mo, "layers", int64_t(n), int64_t(n));
  m.int8_loss = c.meter.loss(all8);
  for (auto& l : m.layers) {
    l.loss_leave_one_out = std::max(0.0, m.int8_loss - l.loss_leave_one_out);
    l.loss = 0.5 * (l.loss_alone + l.loss_leave_one_out);
  }
  // The layer times are profiled, the two ends timed end to end: scale the layers' changes
  // so that the all-int8 plan predicts the measured all-int8 latency, when the two agree in
  // sign and the change is large enough to measure a ratio from.
  m.scale = 1;
  const double raw = predicted_latency(m, std::vector<Precision>(n, Precision::int8)) - m.fp32_ms, e2e = m.int8_ms - m.fp32_ms;
  if (std::fabs(raw) >= 0.05 * m.fp32_ms && std::fabs(e2e) >= 0.05 * m.fp32_ms && raw * e2e > 0)
    m.scale = std::clamp(e2e / raw, 0.5, 2.0);
  return m;
}

}  // namespace

Measurements measure_layers(const std::string& model_path, const SampleSet& calib,
                            const QuantizeOptions& qo, const MixedPrecisionOptions& mo) {
  return measure(make_context(model_path, calib, qo, mo), model_path, qo, mo);
}

double predicted_latency(const Measurements& m, const std::vector<Precision>& precision) {
  const size_t n = m.layers.size();
  const auto int8 = [&](size_t i) { return precision[i] == Precision::int8; };
  double t = 0;
  for (size_t i = 0; i < n; ++i) {
    const Layer& l = m.layers[i];
    if (precision[i] == Precision::int4) t += l.int4_ms - l.fp32_ms;
    if (!int8(i)) continue;
    t += l.int8_ms - l.fp32_ms;
    if (i == 0 || !int8(i - 1)) t += 0.5 * l.border_ms();
    if (i + 1 == n || !int8(i + 1)) t += 0.5 * l.border_ms();
  }
  return m.fp32_ms + m.scale * t;
}

namespace {

// A plan's predicted latency T(P) and loss L(P).
double layer_loss(const Layer& l, Precision p) {
  return p == Precision::int8 ? l.loss : p == Precision::int4 ? l.loss_int4 : 0.0;
}

PlanPoint point_of(const Measurements& m, std::vector<Precision> precision) {
  PlanPoint p;
  p.precision = std::move(precision);
  p.latency_ms = predicted_latency(m, p.precision);
  for (size_t i = 0; i < p.precision.size(); ++i) p.loss += layer_loss(m.layers[i], p.precision[i]);
  return p;
}

}  // namespace

Plan choose_plan(const Measurements& m, const MixedPrecisionOptions& o,
                 std::optional<double> target_ms) {
  check(o.latency_budget_ms.has_value() != o.accuracy_budget.has_value(),
        ErrorCode::invalid_argument,
        "quantize: give one of --latency-budget-ms and --accuracy-budget");
  const size_t n = m.layers.size();
  check(n > 0, ErrorCode::invalid_argument, "quantize: no layers to choose a precision for");
  // Dynamic programming along the layers in topological order. State after layer i: its
  // precision x_i (Precision's values: 0 fp32, 1 int8, 2 int4) and the latency change so
  // far, D, in units u; value: the least loss. Layer i in int8 adds q_i − f_i, plus half
  // its border cost b_i for each neighbour in the order that is not int8 (entering:
  // x_{i−1} ≠ int8, leaving: x_{i+1} ≠ int8); in int4 (where offered) w_i − f_i.
  constexpr int kStates = 3;
  constexpr int64_t kUnits = 4000;
  double span = 0;
  for (const auto& l : m.layers)
    span += m.scale * (std::fabs(l.int8_ms - l.fp32_ms) + l.border_ms() +
                       (l.int4 ? std::fabs(l.int4_ms - l.fp32_ms) : 0.0));
  const double u = span > 0 ? span / double(kUnits) : 1e-9;
  const int64_t off = kUnits + int64_t(n), size = 2 * off + 1;
  auto units = [&](double ms) { return int64_t(std::llround(ms / u)); };
  // The change layer i makes in precision x after layer i−1 in px, in units.
  auto step = [&](size_t i, int px, int x) {
    const Layer& l = m.layers[i];
    double add = 0;
    if (x == 1) add += l.int8_ms - l.fp32_ms + (px == 1 ? 0.0 : 0.5 * l.border_ms());
    if (x == 2) add += l.int4_ms - l.fp32_ms;
    if (px == 1 && x != 1) add += 0.5 * m.layers[i - 1].border_ms();
    return units(m.scale * add);
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> cur(size_t(kStates * size), inf), next(size_t(kStates * size), inf);
  // from[i][x·size + D]: the precision of layer i−1 on the best path into that state.
  std::vector<std::vector<uint8_t>> from(n, std::vector<uint8_t>(size_t(kStates * size), 0));
  auto idx = [&](int x, int64_t d) { return size_t(x) * size_t(size) + size_t(d); };
  // A virtual fp32 layer before the first.
  cur[idx(0, off)] = 0;
  for (size_t i = 0; i < n; ++i) {
    std::fill(next.begin(), next.end(), inf);
    const Layer& l = m.layers[i];
    for (int px = 0; px < kStates; ++px)
      for (int x = 0; x < kStates; ++x) {
        if (x == 2 && !l.int4) continue;
        const int64_t inc = step(i, px, x);
        const double add = layer_loss(l, Precision(x));
        for (int64_t d = 0; d < size; ++d) {
          const double v = cur[idx(px, d)];
          if (v == inf) continue;
          const int64_t nd = std::clamp<int64_t>(d + inc, 0, size - 1);
          if (v + add < next[idx(x, nd)]) {
            next[idx(x, nd)] = v + add;
            from[i][idx(x, nd)] = uint8_t(px);
          }
        }
      }
    std::swap(cur, next);
  }
  const int64_t exit_last = units(m.scale * 0.5 * m.layers[n - 1].border_ms());
  auto plan_of = [&](int x, int64_t d) {
    std::vector<Precision> precision(n, Precision::fp32);
    for (size_t i = n; i-- > 0;) {
      precision[i] = Precision(x);
      const int px = from[i][idx(x, d)];
      d = std::clamp<int64_t>(d - step(i, px, x), 0, size - 1);
      x = px;
    }
    return point_of(m, std::move(precision));
  };
  // The best end state per final latency change, then the front: ascending latency, each
  // point losing less than every faster one.
  std::map<int64_t, std::pair<double, std::pair<int, int64_t>>> by_final;
  for (int x = 0; x < kStates; ++x)
    for (int64_t d = 0; d < size; ++d) {
      const double v = cur[idx(x, d)];
      if (v == inf) continue;
      const int64_t fd = d + (x == 1 ? exit_last : 0);
      auto it = by_final.find(fd);
      if (it == by_final.end() || v < it->second.first) by_final[fd] = {v, {x, d}};
    }
  std::vector<PlanPoint> points;
  double least = inf;
  for (const auto& [fd, best] : by_final)
    if (best.first < least) {
      least = best.first;
      points.push_back(plan_of(best.second.first, best.second.second));
    }
  std::sort(points.begin(), points.end(), [](const PlanPoint& a, const PlanPoint& b) {
    return a.latency_ms < b.latency_ms || (a.latency_ms == b.latency_ms && a.loss < b.loss);
  });
  Plan plan;
  least = inf;
  for (auto& p : points)
    if (p.loss < least) {
      least = p.loss;
      plan.pareto.push_back(std::move(p));
    }
  plan.fastest_ms = plan.pareto.front().latency_ms;
  if (o.latency_budget_ms) {
    const double budget = target_ms.value_or(*o.latency_budget_ms);
    check(budget >= plan.fastest_ms - 1e-9, ErrorCode::invalid_argument,
          "quantize: the latency budget " + fmt(budget) +
              " ms is below the fastest latency a plan reaches on this machine, " +
              fmt(plan.fastest_ms) + " ms (all fp32 " + fmt(m.fp32_ms) + " ms, all int8 " +
              fmt(m.int8_ms) + " ms)");
    const PlanPoint* pick = nullptr;  // the least loss within the budget
    for (const auto& p : plan.pareto)
      if (p.latency_ms <= budget + 1e-12 && (!pick || p.loss < pick->loss)) pick = &p;
    plan.chosen = *pick;
  } else {
    check(*o.accuracy_budget >= 0, ErrorCode::invalid_argument,
          "quantize: the accuracy budget must be ≥ 0, got " + fmt(*o.accuracy_budget, 6));
    const PlanPoint* pick = nullptr;  // the fastest within the loss budget
    for (const auto& p : plan.pareto)
      if (p.loss <= *o.accuracy_budget && (!pick || p.latency_ms < pick->latency_ms)) pick = &p;
    if (!pick) {  // all fp32 is on the front unless a faster plan loses nothing
      plan.chosen.precision.assign(n, Precision::fp32);
      plan.chosen.latency_ms = m.fp32_ms;
    } else {
      plan.chosen = *pick;
    }
  }
  return plan;
}

namespace {

// Contiguous runs [a, b) of int8 layers (the rest fp32) that fit the target: the shortest
// prefix and the shortest suffix that fit, then, of the shortest run that fits from each
// first layer, the `count` of least predicted loss (each run once). T(P) of a run, from
// prefix sums: its layers' changes and the borders of its two ends.
std::vector<std::pair<size_t, size_t>> fitting_runs(const Measurements& m, double target_ms,
                                                    size_t count) {
  const size_t n = m.layers.size();
  std::vector<double> change(n + 1, 0.0), loss(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) {
    change[i + 1] = change[i] + m.layers[i].int8_ms - m.layers[i].fp32_ms;
    loss[i + 1] = loss[i] + m.layers[i].loss;
  }
  const auto fits = [&](size_t a, size_t b) {
    return m.fp32_ms + m.scale * (change[b] - change[a] + 0.5 * m.layers[a].border_ms() +
                                  0.5 * m.layers[b - 1].border_ms()) <=
           target_ms + 1e-9;
  };
  std::vector<std::pair<size_t, size_t>> out;
  const auto add = [&](size_t a, size_t b) {
    if (std::find(out.begin(), out.end(), std::make_pair(a, b)) == out.end()) out.emplace_back(a, b);
  };
  for (size_t b = 1; b <= n; ++b)
    if (fits(0, b)) {
      add(0, b);
      break;
    }
  for (size_t a = n; a-- > 0;)
    if (fits(a, n)) {
      add(a, n);
      break;
    }
  std::vector<std::tuple<double, size_t, size_t>> runs;  // predicted loss, a, b
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b <= n; ++b)
      if (fits(a, b)) {
        runs.emplace_back(loss[b] - loss[a], a, b);
        break;
      }
  std::sort(runs.begin(), runs.end());
  for (size_t k = 0; k < runs.size() && k < count; ++k) add(std::get<1>(runs[k]), std::get<2>(runs[k]));
  return out;
}

}  // namespace

PlanPoint search_plans(
    const Measurements& m, const Plan& plan, const MixedPrecisionOptions& o, double target_ms,
    const std::function<CandidateMeasure(const std::vector<Precision>&)>& measure,
    std::vector<Candidate>& evaluated) {
  const size_t n = m.layers.size();
  if (o.evaluations <= 0) return plan.chosen;
  int fresh = 0;
  const auto seen = [&](const std::vector<Precision>& x) {
    return std::any_of(evaluated.begin(), evaluated.end(),
                       [&](const Candidate& c) { return c.point.precision == x; });
  };
  // The measured loss of a plan (measured once across calls); nullopt once the
  // evaluations are spent.
  auto loss_of = [&](const std::vector<Precision>& x,
                     const std::string& source) -> std::optional<double> {
    for (const auto& c : evaluated)
      if (c.point.precision == x) return c.loss;
    if (fresh >= o.evaluations) return std::nullopt;
    ++fresh;
    const CandidateMeasure r = measure(x);
    evaluated.push_back(
        Candidate{source, point_of(m, x), r.loss, target_ms, r.latency_ms, r.latency_ms >= 0});
    return evaluated.back().loss;
  };
  const auto& front = plan.pareto;
  if (!o.latency_budget_ms) {
    // The front by latency has losses falling: bisect it for the fastest point whose
    // measured loss is within the budget (all fp32 loses nothing).
    PlanPoint best = point_of(m, std::vector<Precision>(n, Precision::fp32));
    size_t lo = 0, hi = front.size();
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      const auto l = loss_of(front[mid].precision, "front");
      if (!l) break;
      if (*l <= *o.accuracy_budget) {
        best = front[mid];
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return best;
  }
  // What T(P) misses, from the timed candidates: the profile does not see all that the
  // Q/DQ nodes and layout changes at the borders between int8 and other layers cost (on
  // PP-OCRv4's recognizer runs of int8 layers measured 0.4-0.8 ms over T(P), scattered plans
  // 1.5-3 ms). The error, measured − T(P), is fitted as a + b · (the plan's int8 borders) by
  // least squares (b ≥ 0; with one border count only, a is the median error), and a plan
  // fits when T(P) + max(0, a + b · borders) ≤ target.
  const auto borders = [&](const std::vector<Precision>& x) {
    int count = 0;
    for (size_t i = 0; i <= n; ++i)
      count += (i < n && x[i] == Precision::int8) != (i > 0 && x[i - 1] == Precision::int8);
    return double(count);
  };
  double err_a = 0, err_b = 0;
  const auto refit = [&] {
    std::vector<double> e, k;
    for (const auto& c : evaluated)
      if (c.measured_ms >= 0) {
        e.push_back(c.measured_ms - c.point.latency_ms);
        k.push_back(borders(c.point.precision));
      }
    if (e.empty()) return;
    const double mk = std::accumulate(k.begin(), k.end(), 0.0) / double(k.size()),
                 me = std::accumulate(e.begin(), e.end(), 0.0) / double(e.size());
    double skk = 0, ske = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      skk += (k[i] - mk) * (k[i] - mk);
      ske += (k[i] - mk) * (e[i] - me);
    }
    err_b = skk > 0 ? std::max(0.0, ske / skk) : 0.0;
    err_a = err_b > 0 ? me - err_b * mk : median(e);
  };
  const auto correction = [&](double k) { return std::max(0.0, err_a + err_b * k); };
  const auto fits = [&](const std::vector<Precision>& x) {
    return predicted_latency(m, x) + correction(borders(x)) <= target_ms + 1e-9;
  };
  const auto best_within = [&](double limit_ms) -> const Candidate* {
    const Candidate* best = nullptr;
    for (const auto& c : evaluated)
      if (c.latency_ms() <= limit_ms + 1e-9 && (!best || c.loss < best->loss)) best = &c;
    return best;
  };
  const auto best_fitting = [&] { return best_within(target_ms); };
  // Seeds, alternating: the front's points that fit (the nearest, of least predicted loss,
  // first) and contiguous int8 runs that fit (fitting_runs, held to T(P) ≤ target less the
  // correction of two borders). Taken again with the fitted correction when none of them,
  // timed, is within the target.
  constexpr size_t kSeeds = 3;
  constexpr double kLoose = 0.05;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<Precision>> from_front;
    for (auto it = front.rbegin(); it != front.rend() && from_front.size() < kSeeds; ++it)
      if (fits(it->precision)) from_front.push_back(it->precision);
    auto runs = fitting_runs(m, target_ms - correction(2), kSeeds);
    // T(P) errs both ways (the recognizer's last 25 layers, predicted 4.5 % over a budget,
    // measured 3 % under it), so the shortest prefix and suffix within kLoose over the
    // target by T(P) are timed too; the measurement decides.
    if (round == 0)
      for (const auto& r : fitting_runs(m, target_ms * (1 + kLoose), 0))
        if (std::find(runs.begin(), runs.end(), r) == runs.end()) runs.push_back(r);
    for (size_t k = 0; k < std::max(from_front.size(), runs.size()); ++k) {
      if (k < from_front.size()) loss_of(from_front[k], "front");
      if (k < runs.size()) {
        std::vector<Precision> x(n, Precision::fp32);
        std::fill(x.begin() + std::ptrdiff_t(runs[k].first),
                  x.begin() + std::ptrdiff_t(runs[k].second), Precision::int8);
        loss_of(x, "run " + std::to_string(runs[k].first) + "-" + std::to_string(runs[k].second - 1));
      }
    }
    const double before = correction(2);
    refit();
    if (best_fitting() || correction(2) <= before + 1e-9) break;
  }
  // Local search: moves of one layer, or two, to another precision it is offered (a drop
  // back to fp32, a swap of an int8 layer for another, ...) that fit, in order of predicted
  // loss change, measured a few at a time, from the plan of least measured loss within the
  // target or up to kNear over it (a plan just over the budget that loses much less is
  // worth a move that wins its latency back), until the evaluations run out.
  constexpr size_t kBatch = 4;
  constexpr double kNear = 0.02;
  for (const Candidate* best = best_within(target_ms * (1 + kNear)); best && fresh < o.evaluations;) {
    const std::vector<Precision> x = best->point.precision;
    const double best_loss = best->loss;
    // A move is a small change of the base plan: its latency is the base's measured one
    // moved by T(P)'s change and the fitted cost of the borders it adds or removes (the
    // fit across all candidates misjudges a plan like the recognizer's last 27 layers,
    // measured at T(P), by the 0.7 ms the runs before it averaged).
    const double base_error = best->measured_ms >= 0 ? best->measured_ms - best->point.latency_ms
                                                     : correction(borders(x));
    const auto move_fits = [&](const std::vector<Precision>& y) {
      return predicted_latency(m, y) + base_error + err_b * (borders(y) - borders(x)) <=
             target_ms + 1e-9;
    };
    // Each layer's other precisions: (layer, precision, predicted loss change).
    std::vector<std::tuple<size_t, Precision, double>> changes;
    for (size_t i = 0; i < n; ++i)
      for (Precision p : {Precision::fp32, Precision::int8, Precision::int4})
        if (p != x[i] && (p != Precision::int4 || m.layers[i].int4))
          changes.emplace_back(i, p, layer_loss(m.layers[i], p) - layer_loss(m.layers[i], x[i]));
    const auto label = [](size_t i, Precision p) {
      return std::to_string(i) + "=" + precision_name(p);
    };
    std::vector<std::tuple<double, std::vector<Precision>, std::string>> moves;
    for (size_t a = 0; a < changes.size(); ++a) {
      const auto& [i, p, di] = changes[a];
      std::vector<Precision> y = x;
      y[i] = p;
      if (move_fits(y)) moves.emplace_back(di, y, label(i, p));
      for (size_t b = a + 1; b < changes.size(); ++b) {
        const auto& [j, q, dj] = changes[b];
        if (j == i) continue;
        std::vector<Precision> z = y;
        z[j] = q;
        if (move_fits(z)) moves.emplace_back(di + dj, std::move(z), label(i, p) + " " + label(j, q));
      }
    }
    std::stable_sort(moves.begin(), moves.end(), [](const auto& a, const auto& b) {
      return std::get<0>(a) < std::get<0>(b);
    });
    bool improved = false, untried = false;
    size_t tried = 0;
    for (const auto& [delta, y, source] : moves) {
      if (seen(y)) continue;
      untried = true;
      if (tried == kBatch) break;
      const auto l = loss_of(y, source);
      if (!l) break;
      ++tried;
      improved |= *l < best_loss;
    }
    if (!untried) break;
    // The next batch goes on from the best so far (the same plan when nothing improved:
    // its measured moves are skipped).
    refit();
    best = best_within(target_ms * (1 + kNear));
    if (!improved && tried == 0) break;
  }
  const Candidate* best = best_fitting();
  return best ? best->point : plan.chosen;
}

QuantizeOptions plan_quantizer(const Measurements& m, const std::vector<Precision>& precision,
                               QuantizeOptions base) {
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const Layer& l = m.layers[i];
    if (precision[i] != Precision::int8) base.exclude_nodes.insert(l.nodes.begin(), l.nodes.end());
    if (precision[i] == Precision::int4) base.int4_nodes.insert(l.name);
  }
  return base;
}

// The share of the budget a verifying re-measure may be over before it is confirmed by a
// second one (see run_mixed_precision).
constexpr double kRemeasureNoise = 0.03;
// Candidates timed again before one is written (see confirm_plan).
constexpr int kFinalists = 3;

std::optional<PlanPoint> confirm_plan(
    double target_ms, std::vector<Candidate>& evaluated,
    const std::function<double(const std::vector<Precision>&)>& time,
    const std::function<void(int64_t, int64_t)>& progress) {
  std::vector<Candidate*> finalists;
  for (Candidate& cd : evaluated)
    if (cd.measured_ms >= 0 && cd.measured_ms <= target_ms * (1 + kRemeasureNoise))
      finalists.push_back(&cd);
  std::stable_sort(finalists.begin(), finalists.end(),
                   [](const Candidate* a, const Candidate* b) { return a->loss < b->loss; });
  if (finalists.size() > size_t(kFinalists)) finalists.resize(size_t(kFinalists));
  const auto total = int64_t(finalists.size());
  std::optional<PlanPoint> chosen;
  for (int64_t i = 0; i < total && !chosen; ++i) {
    if (progress) progress(i, total);
    Candidate& cd = *finalists[size_t(i)];
    if (cd.timings < 2) {
      cd.measured_ms = (cd.measured_ms * cd.timings + time(cd.point.precision)) / (cd.timings + 1);
      ++cd.timings;
    }
    if (cd.measured_ms <= target_ms) chosen = cd.point;
  }
  if (progress) progress(total, total);
  return chosen;
}

MixedPrecisionResult run_mixed_precision(const std::string& model_path, const std::string& output,
                                         const SampleSet& calib, const QuantizeOptions& qo,
                                         const MixedPrecisionOptions& mo) {
  const Context c = make_context(model_path, calib, qo, mo);
  MixedPrecisionResult r;
  if (mo.measurements) {  // from a plan file: the model must be the one measured
    const std::string sha = file_sha256(model_path);
    check(sha == mo.measurements->model_sha256, ErrorCode::invalid_argument,
          "quantize: the measurements were made on another model (SHA-256 " +
              mo.measurements->model_sha256.substr(0, 16) + "...), not " + model_path);
    const std::vector<Layer> layers = quantizable_layers(c.p.model, qo);
    check(layers.size() == mo.measurements->layers.size(), ErrorCode::invalid_argument,
          "quantize: the measurements have " + std::to_string(mo.measurements->layers.size()) +
              " layers, " + model_path + " with these settings " + std::to_string(layers.size()));
    for (size_t i = 0; i < layers.size(); ++i)
      check(layers[i].nodes == mo.measurements->layers[i].nodes, ErrorCode::invalid_argument,
            "quantize: layer '" + layers[i].name +
                "' of the measurements has other nodes than with these settings");
    r.measurements = *mo.measurements;
    if (!mo.int4)
      for (auto& l : r.measurements.layers) l.int4 = false;
  } else {
    r.measurements = measure(c, model_path, qo, mo);
  }
  const Measurements& m = r.measurements;
  std::optional<double> target;
  for (r.tries = 1;; ++r.tries) {
    r.plan = choose_plan(m, mo, target);
    r.target_ms = target.value_or(mo.latency_budget_ms.value_or(r.plan.chosen.latency_ms));
    // The plan of least measured loss among candidates near the target.
    const size_t before = r.candidates.size();
    // The load may have changed since the layers were timed: the all-fp32 model, timed in
    // the same rounds, scales a measurement back to the conditions of the prediction.
    const auto normalized = [&](double ms, double fp32) {
      return fp32 > 0 ? ms * m.fp32_ms / fp32 : ms;
    };
    // Under a latency budget each candidate is timed too, alternating with the all-fp32
    // model and normalized (as the re-measure below).
    const auto timed = [&](const Model& candidate) {
      const auto [ms, fp32] = time_alternating(candidate, *c.fp32, c.feeds, qo, mo.latency_runs);
      return normalized(ms, fp32);
    };
    const auto measure = [&](const std::vector<Precision>& x) {
      report(mo, "search", int64_t(r.candidates.size() - before), mo.evaluations);
      const Model candidate = build(c.p, m, x, qo);
      CandidateMeasure cm(c.meter.loss(candidate));
      if (mo.latency_budget_ms) cm.latency_ms = timed(candidate);
      return cm;
    };
    r.plan.chosen = search_plans(m, r.plan, mo, r.target_ms, measure, r.candidates);
    if (mo.evaluations > 0) report(mo, "search", mo.evaluations, mo.evaluations);
    if (mo.latency_budget_ms && mo.evaluations > 0) {
      const auto confirmed = confirm_plan(
          r.target_ms, r.candidates,
          [&](const std::vector<Precision>& x) { return timed(build(c.p, m, x, qo)); },
          [&](int64_t done, int64_t total) { report(mo, "confirm", done, total); });
      if (confirmed) r.plan.chosen = *confirmed;
    }
    // quantize_model with the fp32 layers excluded writes these bytes (what --plan does).
    const Model written = build(c.p, m, r.plan.chosen.precision, qo);
    OnnxExporter::save_file(written, output);
    report(mo, "verify", 0, 1);
    // A candidate's loss is the written model's (the same bytes and meter): not measured
    // again.
    const auto built = std::find_if(
        r.candidates.begin(), r.candidates.end(),
        [&](const Candidate& cd) { return cd.point.precision == r.plan.chosen.precision; });
    r.measured.loss = built != r.candidates.end() ? built->loss : c.meter.loss(written);
    const auto verify = [&](Verification& v) {
      std::tie(v.latency_ms, v.fp32_latency_ms) =
          time_alternating(written, *c.fp32, c.feeds, qo, 2 * mo.latency_runs);
      v.normalized_ms = normalized(v.latency_ms, v.fp32_latency_ms);
    };
    verify(r.measured);
    int timings = 1;
    // Over the budget by less than a re-measure's noise (about 1.5 % on PP-OCR's
    // recognizer): timed once more and the two averaged before aiming lower, where a single
    // unlucky measurement had sent the search to tighter plans that lose more.
    if (mo.latency_budget_ms && r.measured.normalized_ms > *mo.latency_budget_ms &&
        r.measured.normalized_ms <= *mo.latency_budget_ms * (1 + kRemeasureNoise)) {
      report(mo, "verify", timings++, 2);
      Verification again;
      verify(again);
      r.measured.latency_ms = (r.measured.latency_ms + again.latency_ms) / 2;
      r.measured.fp32_latency_ms = (r.measured.fp32_latency_ms + again.fp32_latency_ms) / 2;
      r.measured.normalized_ms = (r.measured.normalized_ms + again.normalized_ms) / 2;
    }
    report(mo, "verify", timings, timings);
    r.history.push_back({r.target_ms, r.plan.chosen.latency_ms, r.measured.latency_ms,
                         r.measured.normalized_ms, r.measured.loss,
                         r.plan.chosen.layers(Precision::int8), r.plan.chosen.layers(Precision::int4)});
    if (!mo.latency_budget_ms || r.measured.normalized_ms <= *mo.latency_budget_ms ||
        r.tries >= mo.tries)
      break;
    // Over budget: aim lower by the overshoot, unless no plan is faster.
    // (At least 1 % of the budget: a smaller overshoot is within the noise of a re-measure.)
    const double next =
        r.target_ms - std::max(r.measured.normalized_ms - *mo.latency_budget_ms,
                               0.01 * *mo.latency_budget_ms);
    if (r.plan.chosen.latency_ms <= r.plan.fastest_ms + 1e-9) break;
    target = std::max(next, r.plan.fastest_ms);
  }
  return r;
}

std::string plan_to_json(const MixedPrecisionResult& r, const QuantizeOptions& qo,
                         const MixedPrecisionOptions& mo) {
  using nlohmann::json;
  const Measurements& m = r.measurements;
  json j;
  j["format"] = kPlanFormat;
  j["model_sha256"] = m.model_sha256;
  json q;
  q["calibrator"] = calibration_method_name(qo.calibrator.method);
  q["percentile"] = qo.calibrator.percentile;
  q["activations"] = qo.activations.dtype == DType::u8 ? "u8" : "i8";
  q["symmetric"] = qo.activations.symmetric;
  q["per_channel"] = qo.per_channel;
  q["bias_correction"] = qo.bias_correction;
  if (qo.reduce_range) q["reduce_range"] = true;  // absent: 8-bit weights (older plans too)
  q["ops"] = std::vector<std::string>(qo.op_types.begin(), qo.op_types.end());
  q["exclude"] = std::vector<std::string>(qo.exclude_nodes.begin(), qo.exclude_nodes.end());
  q["max_samples"] = qo.max_samples;
  q["int4_block"] = qo.int4_block;
  j["quantizer"] = q;
  if (mo.latency_budget_ms) j["budget"]["latency_ms"] = *mo.latency_budget_ms;
  if (mo.accuracy_budget) j["budget"]["loss"] = *mo.accuracy_budget;
  j["metric"] = m.metric;
  j["samples"] = m.samples;
  j["latency_runs"] = m.runs;
  j["threads"] = m.threads;
  j["clock"] = m.clock;
  j["fp32_ms"] = m.fp32_ms;
  j["int8_ms"] = m.int8_ms;
  j["fp32_profiled_ms"] = m.fp32_profiled_ms;
  j["int8_profiled_ms"] = m.int8_profiled_ms;
  j["int8_loss"] = m.int8_loss;
  j["scale"] = m.scale;
  j["fastest_ms"] = r.plan.fastest_ms;
  j["predicted"] = {{"latency_ms", r.plan.chosen.latency_ms}, {"loss", r.plan.chosen.loss}};
  j["search_evaluations"] = mo.evaluations;
  j["measured"] = {{"latency_ms", r.measured.latency_ms},
                   {"fp32_latency_ms", r.measured.fp32_latency_ms},
                   {"normalized_latency_ms", r.measured.normalized_ms},
                   {"loss", r.measured.loss}};
  for (const auto& t : r.history)
    j["tries"].push_back({{"target_ms", t.target_ms},
                          {"predicted_ms", t.predicted_ms},
                          {"measured_ms", t.measured_ms},
                          {"normalized_ms", t.normalized_ms},
                          {"loss", t.loss},
                          {"int8_layers", t.int8_layers},
                          {"int4_layers", t.int4_layers}});
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const Layer& l = m.layers[i];
    j["layers"].push_back({{"name", l.name},
                           {"op", l.op},
                           {"precision", precision_name(r.plan.chosen.precision[i])},
                           {"nodes", l.nodes},
                           {"loss", l.loss},
                           {"loss_alone", l.loss_alone},
                           {"loss_leave_one_out", l.loss_leave_one_out},
                           {"fp32_ms", l.fp32_ms},
                           {"int8_ms", l.int8_ms},
                           {"int8_alone_ms", l.int8_alone_ms},
                           {"int4", l.int4},
                           {"loss_int4", l.loss_int4},
                           {"int4_ms", l.int4_ms}});
  }
  for (const auto& c : r.candidates)
    j["candidates"].push_back({{"source", c.source},
                               {"target_ms", c.target_ms},
                               {"predicted_ms", c.point.latency_ms},
                               {"predicted_loss", c.point.loss},
                               {"loss", c.loss},
                               {"measured_ms", c.measured_ms},
                               {"timings", c.timings},
                               {"int8_layers", c.point.layers(Precision::int8)},
                               {"int4_layers", c.point.layers(Precision::int4)},
                               {"chosen", c.point.precision == r.plan.chosen.precision}});
  for (const auto& p : r.plan.pareto)
    j["pareto"].push_back(
        {{"latency_ms", p.latency_ms},
         {"loss", p.loss},
         {"int8_layers", p.layers(Precision::int8)},
         {"int4_layers", p.layers(Precision::int4)}});
  return j.dump(1) + "\n";
}

LoadedPlan read_plan(const std::string& path) {
  std::ifstream f(path);
  check(bool(f), ErrorCode::not_found, path + ": cannot open the plan");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::invalid_argument, path + ": not a JSON plan (" + e.what() + ")");
  }
  LoadedPlan p;
  try {
    check(j.value("format", "") == kPlanFormat, ErrorCode::invalid_argument,
          path + ": not a slim mixed-precision plan (format '" + j.value("format", "") +
              "', expected '" + kPlanFormat + "')");
    Measurements& m = p.measurements;
    m.model_sha256 = j.at("model_sha256").get<std::string>();
    m.metric = j.value("metric", "");
    m.fp32_ms = j.value("fp32_ms", 0.0);
    m.int8_ms = j.value("int8_ms", 0.0);
    m.fp32_profiled_ms = j.value("fp32_profiled_ms", 0.0);
    m.int8_profiled_ms = j.value("int8_profiled_ms", 0.0);
    m.int8_loss = j.value("int8_loss", 0.0);
    m.scale = j.value("scale", 1.0);
    m.samples = j.value("samples", int64_t(0));
    m.runs = j.value("latency_runs", 0);
    m.threads = j.value("threads", 0);
    m.clock = j.value("clock", "");
    for (const auto& l : j.at("layers")) {
      Layer layer{l.at("name").get<std::string>(), l.value("op", ""),
                  l.at("nodes").get<std::vector<std::string>>()};
      layer.loss = l.value("loss", 0.0);
      layer.loss_alone = l.value("loss_alone", 0.0);
      layer.loss_leave_one_out = l.value("loss_leave_one_out", 0.0);
      layer.fp32_ms = l.value("fp32_ms", 0.0);
      layer.int8_ms = l.value("int8_ms", 0.0);
      layer.int8_alone_ms = l.value("int8_alone_ms", 0.0);
      layer.int4 = l.value("int4", false);
      layer.loss_int4 = l.value("loss_int4", 0.0);
      layer.int4_ms = l.value("int4_ms", 0.0);
      const std::string prec = l.at("precision").get<std::string>();
      check(prec == "int8" || prec == "fp32" || (prec == "int4" && layer.int4),
            ErrorCode::invalid_argument,
            path + ": layer '" + layer.name + "' has precision '" + prec + "' (" +
                (layer.int4 ? "fp32, int8 or int4" : "fp32 or int8; int4 is for MatMul/Gemm "
                                                     "layers with a constant weight") +
                "; fp16 is not offered: slim's CPU kernels compute in fp32)");
      p.precision.push_back(prec == "int8"   ? Precision::int8
                            : prec == "int4" ? Precision::int4
                                             : Precision::fp32);
      m.layers.push_back(std::move(layer));
    }
    const auto& q = j.at("quantizer");
    QuantizeOptions& o = p.quantizer;
    o.calibrator.method = parse_calibration_method(q.at("calibrator").get<std::string>());
    o.calibrator.percentile = q.value("percentile", 99.999);
    o.activations.dtype = q.value("activations", "u8") == "u8" ? DType::u8 : DType::i8;
    o.activations.symmetric = q.value("symmetric", false);
    o.per_channel = q.value("per_channel", true);
    o.bias_correction = q.value("bias_correction", false);
    o.reduce_range = q.value("reduce_range", false);
    o.max_samples = q.value("max_samples", int64_t(0));
    o.int4_block = q.value("int4_block", int64_t(32));
    for (const auto& s : q.value("ops", std::vector<std::string>{})) o.op_types.insert(s);
    for (const auto& s : q.value("exclude", std::vector<std::string>{})) o.exclude_nodes.insert(s);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::invalid_argument, path + ": malformed plan (" + e.what() + ")");
  }
  return p;
}

QuantizeOptions plan_options(const LoadedPlan& plan, const std::string& plan_path,
                             const std::string& model_path, const QuantizeOptions& base) {
  const std::string sha = file_sha256(model_path);
  check(sha == plan.measurements.model_sha256, ErrorCode::invalid_argument,
        plan_path + ": the plan was made for another model (SHA-256 " +
            plan.measurements.model_sha256.substr(0, 16) + "...), not " + model_path +
            " (SHA-256 " + sha.substr(0, 16) + "...)");
  Model prepared = OnnxImporter::load_file(model_path);
  QuantizeReport scratch;
  detail::prepare_float_model(prepared, scratch);
  std::set<std::string> names;
  for (const auto& n : prepared.graph.nodes) names.insert(n.name);
  for (const auto& l : plan.measurements.layers)
    for (const auto& n : l.nodes)
      check(names.count(n) != 0, ErrorCode::invalid_argument,
            plan_path + ": layer '" + l.name + "' names node '" + n + "', which " + model_path +
                " does not have");
  QuantizeOptions o = plan.quantizer;
  o.batch = base.batch;
  o.num_threads = base.num_threads;
  o.providers = base.providers;
  o.cache_dir = base.cache_dir;
  o.progress = base.progress;
  o = plan_quantizer(plan.measurements, plan.precision, o);
  return o;
}

void check_mixed_precision_flags(const MixedPrecisionFlags& f) {
  check(!(f.latency_budget && f.accuracy_budget), ErrorCode::invalid_argument,
        "quantize: --latency-budget-ms and --accuracy-budget exclude each other (give one)");
  const bool budget = f.latency_budget || f.accuracy_budget;
  check(!(f.plan && budget), ErrorCode::invalid_argument,
        "quantize: --plan re-applies a plan without measuring; it excludes --latency-budget-ms "
        "and --accuracy-budget");
  check(!(f.plan && f.exclude), ErrorCode::invalid_argument,
        "quantize: --plan and --exclude exclude each other (the plan names the fp32 nodes)");
  check(!((f.plan_out || f.pareto_png) && !budget), ErrorCode::invalid_argument,
        "quantize: --plan-out and --pareto-png need --latency-budget-ms or --accuracy-budget");
  check(!(f.measurements && !budget), ErrorCode::invalid_argument,
        "quantize: --measurements needs --latency-budget-ms or --accuracy-budget");
  check(!((budget || f.plan) && f.smoothquant), ErrorCode::invalid_argument,
        "quantize: mixed precision does not take --smoothquant (its factors depend on which "
        "nodes are quantized)");
}

}  // namespace slim::quant
