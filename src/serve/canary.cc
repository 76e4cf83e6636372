#include "slim/serve/canary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "slim/core/npy.h"
#include "slim/quant/evaluate.h"

namespace slim::serve {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Shape sample_of(const Tensor& t) {
  return Shape(t.shape().begin() + 1, t.shape().end());
}

}  // namespace

CanaryPolicy canary_policy(const ModelConfig& c, const std::string& model_dir) {
  CanaryPolicy p;
  const std::string model = "model '" + c.name + "': parameter '";
  auto get = [&](const char* key, double lo, double hi, double& out) {
    auto it = c.parameters.find(key);
    if (it == c.parameters.end()) return false;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end || !(v >= lo && v <= hi))
      throw Error(ErrorCode::invalid_model, model + key + "' must be a number from " + num(lo) +
                                                " to " + num(hi) + ", not '" + it->second + "'");
    out = v;
    return true;
  };
  double priority = 0, window = p.window_secs;
  get("canary_share", 0, 1, p.share);
  get("canary_priority", 0, 1e6, priority);
  get("canary_window_secs", 1, 86400, window);
  get("canary_max_error_rate_increase", 0, 1, p.max_error_rate_increase);
  get("canary_max_p99_ratio", 0, 1e6, p.max_p99_ratio);
  p.priority = uint32_t(priority);
  p.window_secs = int(window);
  const bool top1_bound = get("canary_min_top1_agreement", 0, 1, p.min_top1_agreement);
  const bool diff_bound =
      get("canary_max_abs_diff", 0, std::numeric_limits<double>::infinity(), p.max_abs_diff);

  auto it = c.parameters.find("canary_reference");
  if (it == c.parameters.end()) {
    if (top1_bound || diff_bound)
      throw Error(ErrorCode::invalid_model,
                  "model '" + c.name +
                      "': parameters 'canary_min_top1_agreement' and 'canary_max_abs_diff' "
                      "need a reference set (parameter 'canary_reference')");
    return p;
  }
  p.reference_file = it->second;
  const std::string param = model + "canary_reference' (" + p.reference_file + "): ";
  const std::filesystem::path rel(p.reference_file);
  bool inside = !p.reference_file.empty() && rel.is_relative();
  for (const auto& part : rel) inside = inside && part != "..";
  if (!inside)
    throw Error(ErrorCode::invalid_model, param + "must name a file inside the model's folder");
  try {
    p.reference = read_npz((std::filesystem::path(model_dir) / rel).string());
  } catch (const Error& e) {
    throw Error(ErrorCode::invalid_model, param + e.what());
  }
  if (p.reference.empty()) throw Error(ErrorCode::invalid_model, param + "it holds no arrays");
  for (const auto& [name, t] : p.reference) {
    if (t.rank() == 0 || t.shape()[0] == 0)
      throw Error(ErrorCode::invalid_model, param + "array '" + name + "' has no samples (shape " +
                                                shape_str(t.shape()) +
                                                "; the first axis indexes them)");
    if (t.shape()[0] != p.reference[0].second.shape()[0])
      throw Error(ErrorCode::invalid_model, param + "arrays '" + p.reference[0].first + "' and '" +
                                                name + "' disagree on the number of samples (" +
                                                std::to_string(p.reference[0].second.shape()[0]) +
                                                " and " + std::to_string(t.shape()[0]) + ")");
  }
  return p;
}

std::vector<NamedTensors> reference_chunks(const NamedTensors& reference, int64_t max_batch_size) {
  const int64_t rows = reference.empty() ? 0 : reference[0].second.shape()[0];
  const int64_t step = max_batch_size > 0 ? max_batch_size : 1;
  std::vector<NamedTensors> out;
  for (int64_t r = 0; r < rows; r += step) {
    NamedTensors& chunk = out.emplace_back();
    for (const auto& [name, t] : reference) {
      Tensor part = t.slice(0, r, std::min(rows, r + step)).contiguous();
      chunk.emplace_back(name, max_batch_size > 0 ? part : part.reshape(sample_of(t)));
    }
  }
  return out;
}

NamedTensors stack_chunks(const std::vector<NamedTensors>& outputs, bool batched) {
  NamedTensors out;
  if (outputs.empty()) return out;
  for (const auto& named : outputs[0]) {  // the first response's outputs, in its order
    const std::string& name = named.first;
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (const NamedTensors& chunk : outputs) {
      auto it =
          std::find_if(chunk.begin(), chunk.end(), [&](const auto& o) { return o.first == name; });
      check(it != chunk.end(), ErrorCode::invalid_argument,
            "output '" + name + "' is missing from a response");
      Tensor t = it->second.contiguous();
      if (!batched)
        t = t.reshape([&] {
          Shape s = t.shape();
          s.insert(s.begin(), 1);
          return s;
        }());
      check(t.rank() >= 1, ErrorCode::invalid_argument, "output '" + name + "' has no batch axis");
      if (!parts.empty() && (t.dtype() != parts[0].dtype() || sample_of(t) != sample_of(parts[0])))
        throw Error(ErrorCode::invalid_argument,
                    "output '" + name + "' changes its type or shape between requests (" +
                        parts[0].describe() + ", " + t.describe() + ")");
      parts.push_back(t);
      rows += t.shape()[0];
    }
    Shape shape = sample_of(parts.front());
    shape.insert(shape.begin(), rows);
    Tensor all(parts[0].dtype(), shape);
    size_t at = 0;
    for (const Tensor& t : parts) {
      if (t.nbytes())
        std::memcpy(static_cast<char*>(all.raw_data()) + at, t.raw_data(), t.nbytes());
      at += t.nbytes();
    }
    out.emplace_back(name, all);
  }
  return out;
}

OutputAgreement compare_outputs(const NamedTensors& serving, const NamedTensors& candidate) {
  OutputAgreement a;
  bool shared = false;
  for (const auto& [name, old_t] : serving) {
    auto it = std::find_if(candidate.begin(), candidate.end(),
                           [&](const auto& o) { return o.first == name; });
    if (it == candidate.end()) continue;
    const Tensor& new_t = it->second;
    if (old_t.shape() != new_t.shape() || old_t.rank() == 0)
      throw Error(ErrorCode::invalid_argument,
                  "output '" + name + "' has shape " + shape_str(new_t.shape()) +
                      " in the new version, " + shape_str(old_t.shape()) + " in the serving one");
    shared = true;
    a.rows = old_t.shape()[0];
    // The comparison of `slim quantize --eval` and `slim certify`, one batch of all rows.
    quant::OutputComparison c(name, quant::guess_output_kind(old_t));
    c.add(old_t, new_t);
    const quant::OutputAgreement r = c.result();
    if (r.classifier) {
      const double share = double(r.top1_agree) / double(r.rows);
      if (!a.top1_agreement || share < *a.top1_agreement) a.top1_agreement = share, a.top1_output = name;
    } else if (!a.max_abs_diff || r.max_abs > *a.max_abs_diff) {
      a.max_abs_diff = r.max_abs, a.diff_output = name;
    }
  }
  check(shared, ErrorCode::invalid_argument, "the two versions have no output in common");
  return a;
}

std::string disagreement(const OutputAgreement& a, const CanaryPolicy& p) {
  std::string why;
  if (a.top1_agreement && *a.top1_agreement < p.min_top1_agreement)
    why = "top-1 agreement " + num(*a.top1_agreement) + " on output '" + a.top1_output +
          "' is below " + num(p.min_top1_agreement);
  if (a.max_abs_diff && !(*a.max_abs_diff <= p.max_abs_diff))
    why += (why.empty() ? "" : "; ") + ("max abs diff " + num(*a.max_abs_diff) + " on output '" +
                                        a.diff_output + "' is above " + num(p.max_abs_diff));
  return why.empty()
             ? why
             : "its outputs disagree with the serving version's on the reference inputs: " + why;
}

nlohmann::json agreement_json(const OutputAgreement& a, const CanaryPolicy& p) {
  nlohmann::json j = {{"file", p.reference_file}, {"rows", a.rows}};
  if (a.top1_agreement)
    j["top1_agreement"] = {
        {"measured", *a.top1_agreement}, {"min", p.min_top1_agreement}, {"output", a.top1_output}};
  if (a.max_abs_diff)  // infinite (a NaN against a number) is written as null
    j["max_abs_diff"] = {
        {"measured", *a.max_abs_diff}, {"max", p.max_abs_diff}, {"output", a.diff_output}};
  return j;
}

}  // namespace slim::serve
