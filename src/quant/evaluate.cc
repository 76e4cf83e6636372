#include "slim/quant/evaluate.h"

#include <cmath>

#include "quant/quant_internal.h"
#include "slim/core/convert.h"
#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim::quant {

namespace {

// One row of a class distribution as probabilities.
void probabilities(const double* x, int64_t c, OutputKind kind, std::vector<double>& p) {
  p.resize(size_t(c));
  if (kind == OutputKind::probabilities) {
    for (int64_t i = 0; i < c; ++i) p[size_t(i)] = x[i];
    return;
  }
  double m = -INFINITY;
  if (kind == OutputKind::logits)
    for (int64_t i = 0; i < c; ++i) m = std::max(m, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < c; ++i) sum += p[size_t(i)] = std::exp(x[i] - (kind == OutputKind::logits ? m : 0.0));
  if (kind == OutputKind::logits)
    for (double& v : p) v /= sum;
}

int64_t argmax(const double* x, int64_t c) {
  int64_t best = 0;
  for (int64_t i = 1; i < c; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

OutputKind guess_output_kind(const Tensor& t) {
  if (t.rank() == 0) return OutputKind::values;
  Shape row(t.shape().begin() + 1, t.shape().end());
  if (dtype_is_integer(t.dtype())) return shape_numel(row) == 1 ? OutputKind::labels : OutputKind::values;
  while (row.size() > 1 && row.front() == 1) row.erase(row.begin());
  return dtype_is_float(t.dtype()) && row.size() == 1 && row[0] > 1 ? OutputKind::logits : OutputKind::values;
}

void OutputComparison::add(const Tensor& first, const Tensor& second, const int64_t* labels, int64_t n) {
  check(first.shape() == second.shape(), ErrorCode::invalid_argument,
        "output '" + name_ + "': " + first.describe() + " in the first model, " + second.describe() +
            " in the second");
  if (first.numel() == 0) return;
  const std::vector<double> x = tensor_to_doubles(first), y = tensor_to_doubles(second);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (std::isnan(x[i]) != std::isnan(y[i])) ++nan_mismatch_;
      continue;
    }
    dot_ += x[i] * y[i];
    na_ += x[i] * x[i];
    nb_ += y[i] * y[i];
    max_abs_ = std::max(max_abs_, std::fabs(x[i] - y[i]));
  }
  if (kind_ == OutputKind::values || first.rank() == 0) return;
  const int64_t c = kind_ == OutputKind::labels ? 1 : first.shape().back();
  if (c < 2 && kind_ != OutputKind::labels) return;  // one score is no distribution
  const int64_t rows = int64_t(x.size()) / c;
  const bool per_sample = labels && n == rows;
  std::vector<double> p, q;
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * c;
    const double* yr = y.data() + r * c;
    const int64_t af = kind_ == OutputKind::labels ? int64_t(*xr) : argmax(xr, c);
    const int64_t aq = kind_ == OutputKind::labels ? int64_t(*yr) : argmax(yr, c);
    agree_ += af == aq;
    if (kind_ != OutputKind::labels) {
      probabilities(xr, c, kind_, p);
      probabilities(yr, c, kind_, q);
      double kl = 0;
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] > 0) kl += p[i] * std::log(p[i] / std::max(q[i], 1e-30));
      kl_ += kl;
    }
    if (per_sample) {
      labeled_++;
      correct_first_ += af == labels[r];
      correct_second_ += aq == labels[r];
    }
  }
  rows_ += rows;
}

OutputAgreement OutputComparison::result() const {
  OutputAgreement o;
  o.name = name_;
  o.classifier = kind_ != OutputKind::values && rows_ > 0;
  o.rows = rows_;
  o.top1_agree = agree_;
  o.kl_mean = rows_ ? kl_ / double(rows_) : 0;
  o.cosine = nan_mismatch_ ? NAN : na_ > 0 && nb_ > 0 ? dot_ / std::sqrt(na_ * nb_) : (na_ == nb_ ? 1.0 : 0.0);
  o.max_abs = nan_mismatch_ ? INFINITY : max_abs_;
  if (labeled_) {
    o.accuracy_float = double(correct_first_) / double(labeled_);
    o.accuracy_quantized = double(correct_second_) / double(labeled_);
  }
  return o;
}

EvalReport evaluate_quantized(const std::string& float_path, const std::string& quant_path,
                              const SampleSet& data, const Tensor& labels,
                              const EvalOptions& options) {
  Model fm = OnnxImporter::load_file(float_path);
  Model qm = OnnxImporter::load_file(quant_path);
  std::vector<std::string> outputs;
  std::vector<OutputComparison> acc;
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
    OutputKind kind = OutputKind::values;
    auto p = producers.find(v.name);
    if (p != producers.end())
      kind = p->second == "Softmax" ? OutputKind::probabilities : OutputKind::log_probabilities;
    else if (options.outputs_as_logits)
      kind = OutputKind::logits;
    acc.emplace_back(v.name, kind);
  }
  if (labels.defined()) {
    check(labels.rank() == 1 && (labels.dtype() == DType::i64 || labels.dtype() == DType::i32),
          ErrorCode::invalid_argument,
          "labels: expected a 1-D array of integer classes, got " + labels.describe());
    bool any = false;
    for (const auto& a : acc) any |= a.kind() != OutputKind::values;
    if (!any) acc[0] = OutputComparison(outputs[0], OutputKind::logits);
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
  const Tensor label_values = labels.defined() ? convert_dtype(labels, DType::i64) : Tensor();
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
      if (ft.dtype() != DType::f32) continue;  // the float model's f32 outputs are compared
      acc[k].add(ft, qo.at(outputs[k]),
                 label_values.defined() ? label_values.data<int64_t>() + begin : nullptr, end - begin);
    }
    if (options.progress) options.progress(end, total);
  }
  EvalReport rep;
  rep.samples = total;
  for (const auto& a : acc) rep.outputs.push_back(a.result());
  return rep;
}

}  // namespace slim::quant
