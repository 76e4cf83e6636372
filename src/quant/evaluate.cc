#include "slim/quant/evaluate.h"

#include <cmath>

#include "quant/quant_internal.h"
#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim::quant {

namespace {

enum class Kind { values, probabilities, log_probabilities, logits };

struct Accumulator {
  Kind kind = Kind::values;
  double dot = 0, na = 0, nb = 0, max_abs = 0, kl = 0;
  int64_t rows = 0, agree = 0, labeled = 0, correct_float = 0, correct_quantized = 0;
};

// One row of a class distribution as probabilities.
void probabilities(const float* x, int64_t c, Kind kind, std::vector<double>& p) {
  p.resize(size_t(c));
  if (kind == Kind::probabilities) {
    for (int64_t i = 0; i < c; ++i) p[size_t(i)] = x[i];
    return;
  }
  double m = -INFINITY;
  if (kind == Kind::logits)
    for (int64_t i = 0; i < c; ++i) m = std::max(m, double(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < c; ++i)
    sum += p[size_t(i)] = std::exp(double(x[i]) - (kind == Kind::logits ? m : 0.0));
  if (kind == Kind::logits)
    for (double& v : p) v /= sum;
}

int64_t argmax(const float* x, int64_t c) {
  int64_t best = 0;
  for (int64_t i = 1; i < c; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

EvalReport evaluate_quantized(const std::string& float_path, const std::string& quant_path,
                              const SampleSet& data, const Tensor& labels,
                              const EvalOptions& options) {
  Model fm = OnnxImporter::load_file(float_path);
  Model qm = OnnxImporter::load_file(quant_path);
  std::vector<std::string> outputs;
  std::vector<Accumulator> acc;
  std::map<std::string, std::string> producers;
  for (const auto& n : fm.graph.nodes)
    for (const auto& o : n.outputs)
      if (n.domain.empty() && (n.op_type == "Softmax" || n.op_type == "LogSoftmax"))
        producers[o] = n.op_type;
  for (const auto& v : fm.graph.outputs) {
    bool found = false;
    for (const auto& q : qm.graph.outputs) found |= q.name == v.name;
    check(found, ErrorCode::invalid_argument,
          quant_path + ": has no output '" + v.name + "' (the float model's)");
    outputs.push_back(v.name);
    Accumulator a;
    auto p = producers.find(v.name);
    if (p != producers.end())
      a.kind = p->second == "Softmax" ? Kind::probabilities : Kind::log_probabilities;
    else if (options.outputs_as_logits)
      a.kind = Kind::logits;
    acc.push_back(a);
  }
  if (labels.defined()) {
    check(labels.rank() == 1 && (labels.dtype() == DType::i64 || labels.dtype() == DType::i32),
          ErrorCode::invalid_argument,
          "labels: expected a 1-D array of integer classes, got " + labels.describe());
    bool any = false;
    for (const auto& a : acc) any |= a.kind != Kind::values;
    if (!any) acc[0].kind = Kind::logits;
  }
  const int64_t total =
      options.max_samples > 0 ? std::min(options.max_samples, data.size()) : data.size();
  check(!labels.defined() || labels.numel() >= total, ErrorCode::invalid_argument,
        "labels: " + std::to_string(labels.numel()) + " labels for " + std::to_string(total) +
            " samples");
  const int64_t per_run = detail::samples_per_run(fm, data, options.batch);
  SessionOptions so;
  so.num_threads = options.num_threads;
  so.providers = options.providers;
  detail::BatchRunner float_runner(std::move(fm), so), quant_runner(std::move(qm), so);
  std::vector<double> p, q;
  for (int64_t begin = 0; begin < total; begin += per_run) {
    const int64_t end = std::min(total, begin + per_run);
    const TensorMap feeds = data.batch(begin, end);
    TensorMap fo, qo;
    const auto run = [&](bool quantized) {
      const auto work = [&] {
        (quantized ? qo : fo) = (quantized ? quant_runner : float_runner).run(feeds, outputs);
      };
      if (options.around_run) options.around_run(quantized, end - begin, work);
      else work();
    };
    run(false);
    run(true);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Tensor& ft = fo.at(outputs[k]);
      const Tensor& qt = qo.at(outputs[k]);
      check(ft.shape() == qt.shape(), ErrorCode::invalid_argument,
            "output '" + outputs[k] + "': float " + ft.describe() + ", quantized " + qt.describe());
      if (ft.dtype() != DType::f32 || qt.dtype() != DType::f32 || ft.numel() == 0) continue;
      Accumulator& a = acc[k];
      const Tensor fc = ft.contiguous(), qc = qt.contiguous();
      const float* x = fc.data<float>();
      const float* y = qc.data<float>();
      for (int64_t i = 0; i < fc.numel(); ++i) {
        a.dot += double(x[i]) * y[i];
        a.na += double(x[i]) * x[i];
        a.nb += double(y[i]) * y[i];
        a.max_abs = std::max(a.max_abs, std::fabs(double(x[i]) - y[i]));
      }
      if (a.kind == Kind::values || fc.rank() == 0) continue;
      const int64_t c = fc.shape().back(), rows = c ? fc.numel() / c : 0;
      if (c < 2 && a.kind == Kind::logits) continue;  // one logit is no distribution
      const bool per_sample = labels.defined() && rows == end - begin;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t af = argmax(x + r * c, c), aq = argmax(y + r * c, c);
        a.agree += af == aq;
        probabilities(x + r * c, c, a.kind, p);
        probabilities(y + r * c, c, a.kind, q);
        double kl = 0;
        for (size_t i = 0; i < p.size(); ++i)
          if (p[i] > 0) kl += p[i] * std::log(p[i] / std::max(q[i], 1e-30));
        a.kl += kl;
        if (per_sample) {
          const int64_t label = labels.dtype() == DType::i64 ? labels.data<int64_t>()[begin + r]
                                                             : labels.data<int32_t>()[begin + r];
          a.labeled++;
          a.correct_float += af == label;
          a.correct_quantized += aq == label;
        }
      }
      a.rows += rows;
    }
    if (options.progress) options.progress(end, total);
  }
  EvalReport rep;
  rep.samples = total;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Accumulator& a = acc[k];
    OutputAgreement o;
    o.name = outputs[k];
    o.classifier = a.kind != Kind::values && a.rows > 0;
    o.rows = a.rows;
    o.top1_agree = a.agree;
    o.kl_mean = a.rows ? a.kl / double(a.rows) : 0;
    o.cosine = a.na > 0 && a.nb > 0 ? a.dot / std::sqrt(a.na * a.nb) : (a.na == a.nb ? 1.0 : 0.0);
    o.max_abs = a.max_abs;
    if (a.labeled) {
      o.accuracy_float = double(a.correct_float) / double(a.labeled);
      o.accuracy_quantized = double(a.correct_quantized) / double(a.labeled);
    }
    rep.outputs.push_back(std::move(o));
  }
  return rep;
}

}  // namespace slim::quant
