#include "slim/certify/certify.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/core/thread_pool.h"
#include "slim/energy/meter.h"
#include "slim/forest/compress.h"
#include "slim/forest/forest_model.h"
#include "slim/forest/slimf.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/perplexity.h"
#include "slim/onnx/importer.h"
#include "slim/quant/evaluate.h"
#include "slim/trust/digest.h"
#include "slim/trust/model_signing.h"

namespace slim::certify {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::onnx: return "onnx";
    case ModelKind::gguf: return "gguf";
    case ModelKind::forest: return "forest";
  }
  return "?";
}

ModelKind detect_kind(const std::string& path) {
  check(fs::is_regular_file(path), ErrorCode::not_found, path + ": no such model file");
  if (llm::is_gguf_file(path)) return ModelKind::gguf;
  const std::string ext = fs::path(path).extension().string();
  if (forest::is_slimf_file(path) || ext == ".json" || ext == ".ubj" || ext == ".txt") return ModelKind::forest;
  return ModelKind::onnx;
}

std::string data_digest(const std::string& path) {
  check(fs::exists(path), ErrorCode::not_found, path + ": no such file or folder");
  if (fs::is_directory(path))
    return trust::to_hex(trust::hash_model(path, trust::HashOptions{}).root_digest());
  return trust::to_hex(trust::hash_file(trust::HashAlg::sha256, path));
}

namespace {

json file_info(const std::string& path) {
  uint64_t bytes = 0;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file()) bytes += e.file_size();
  } else {
    bytes = fs::file_size(path);
  }
  return {{"file", fs::path(path).filename().string()}, {"sha256", data_digest(path)}, {"bytes", bytes}};
}

// Latency (the work alone, per item) and energy (readings around each run, above idle)
// of the two models, kept apart.
class SideMeter {
 public:
  explicit SideMeter(energy::EnergyMeter& meter) : meter_(meter) {}
  void run(bool compressed, int64_t items, const std::function<void()>& work) {
    Side& s = sides_[compressed];
    const energy::Reading a = meter_.read();
    const auto t0 = std::chrono::steady_clock::now();
    work();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const energy::Reading b = meter_.read();
    s.per_item.push_back(secs / double(std::max<int64_t>(items, 1)));
    s.joules += meter_.between(a, b).work();
    s.items += items;
  }
  json side(bool compressed, const char* unit) const {
    Side s = sides_[compressed];
    double median = 0;
    if (!s.per_item.empty()) {
      const size_t m = s.per_item.size() / 2;
      std::nth_element(s.per_item.begin(), s.per_item.begin() + long(m), s.per_item.end());
      median = s.per_item[m];
      if (s.per_item.size() % 2 == 0)
        median = (median + *std::max_element(s.per_item.begin(), s.per_item.begin() + long(m))) / 2;
    }
    return {{"unit", unit},
            {"median_latency_s", median},
            {"energy_j", s.joules},
            {"energy_j_per_" + std::string(unit), s.items ? s.joules / double(s.items) : 0.0}};
  }

 private:
  struct Side {
    std::vector<double> per_item;
    double joules = 0;
    int64_t items = 0;
  };
  energy::EnergyMeter& meter_;
  Side sides_[2];
};

struct Measured {
  json metrics, reference, compressed;
  int64_t samples = 0;
};

std::unique_ptr<Progress> progress_for(const Options& o, const std::string& label, int64_t total) {
  return o.progress ? std::make_unique<Progress>(label, total) : nullptr;
}

Measured onnx_domain(const std::string& ref, const std::string& comp, const Domain& d, const Options& o,
                     SideMeter& meter) {
  const Model probe = OnnxImporter::load_file(ref);
  const quant::SampleSet data = quant::SampleSet::open(d.data, probe.graph.inputs);
  quant::EvalOptions eo;
  eo.batch = o.batch;
  eo.num_threads = o.threads;
  eo.outputs_as_logits = true;
  auto progress = progress_for(o, "certify " + d.name, data.size());
  eo.progress = [&](int64_t end, int64_t) {
    if (progress) progress->update(end);
  };
  eo.around_run = [&](bool compressed, int64_t n, const std::function<void()>& work) { meter.run(compressed, n, work); };
  const quant::EvalReport rep = quant::evaluate_quantized(ref, comp, data, Tensor(), eo);
  Measured m;
  m.samples = rep.samples;
  json outs = json::array();
  for (const auto& out : rep.outputs) {
    json j = {{"name", out.name}, {"rows", out.rows}, {"cosine", out.cosine}, {"max_abs", out.max_abs}};
    if (out.classifier) {
      j["top1_agreement"] = out.rows ? double(out.top1_agree) / double(out.rows) : 0.0;
      j["kl"] = out.kl_mean;
    }
    outs.push_back(j);
  }
  m.metrics = {{"outputs", outs}};
  return m;
}

Measured gguf_domain(const std::string& ref, const std::string& comp, const Domain& d, const Options& o,
                     SideMeter& meter) {
  std::ifstream in(d.data, std::ios::binary);
  check(bool(in), ErrorCode::not_found, d.data + ": cannot open (domain " + d.name + ")");
  std::ostringstream text;
  text << in.rdbuf();
  auto base = llm::LlamaModel::load(ref), model = llm::LlamaModel::load(comp);
  llm::PerplexityOptions po;
  po.n_ctx = o.n_ctx;
  po.chunks = o.chunks;
  po.threads = o.threads;
  std::unique_ptr<Progress> progress;
  po.progress = [&](int done, int chunks, double) {
    if (!progress) progress = progress_for(o, "certify " + d.name, chunks);
    if (progress) progress->update(done);
  };
  po.around_eval = [&](bool is_base, const std::function<void()>& work) { meter.run(!is_base, o.n_ctx, work); };
  const llm::PerplexityResult r = llm::perplexity(model, base, text.str(), d.data, po);
  Measured m;
  m.samples = r.scored;
  m.metrics = {{"tokens", r.tokens},           {"chunks", r.chunks},
               {"scored_tokens", r.scored},    {"ppl_reference", r.base_ppl()},
               {"ppl_compressed", r.ppl()},    {"ppl_ratio", r.ppl() / r.base_ppl()},
               {"token_agreement", r.top1_agreement()}, {"kl", r.mean_kl()}};
  return m;
}

// The class a forest's transformed outputs predict, or -1 for regression outputs.
int64_t predicted_class(forest::Transform t, const float* y, int w) {
  switch (t) {
    case forest::Transform::sigmoid: return w == 1 ? int64_t(y[0] >= 0.5f) : -1;
    case forest::Transform::softmax: return std::max_element(y, y + w) - y;
    case forest::Transform::argmax: return int64_t(y[0]);
    default: return -1;
  }
}

Measured forest_domain(const std::string& ref, const std::string& comp, const Domain& d, const Options& o,
                       SideMeter& meter) {
  const forest::CompiledForest a = forest::load_compiled_forest(ref), b = forest::load_compiled_forest(comp);
  check(a.num_features() == b.num_features() && a.output_width() == b.output_width(), ErrorCode::invalid_argument,
        comp + ": " + std::to_string(b.num_features()) + " features and " + std::to_string(b.output_width()) +
            " outputs, the reference " + std::to_string(a.num_features()) + " and " +
            std::to_string(a.output_width()));
  const forest::FeatureRows rows = forest::read_feature_rows(d.data, o.label_column, a.num_features());
  check(rows.n > 0, ErrorCode::invalid_argument, d.data + ": no rows (domain " + d.name + ")");
  const int w = a.output_width();
  std::vector<float> ya(size_t(rows.n * w)), yb(ya.size());
  auto progress = progress_for(o, "certify " + d.name, rows.n);
  for (int64_t i = 0; i < rows.n; i += o.batch) {
    const int64_t n = std::min(o.batch, rows.n - i);
    const float* x = rows.x.data() + i * rows.f;
    meter.run(false, n, [&] { a.predict(x, n, ya.data() + i * w, false, &default_thread_pool()); });
    meter.run(true, n, [&] { b.predict(x, n, yb.data() + i * w, false, &default_thread_pool()); });
    if (progress) progress->update(i + n);
  }
  double max_diff = 0, sum_diff = 0;
  for (size_t i = 0; i < ya.size(); ++i) {
    const double diff = std::fabs(double(ya[i]) - yb[i]);
    max_diff = std::max(max_diff, std::isnan(diff) ? INFINITY : diff);
    sum_diff += diff;
  }
  Measured m;
  m.samples = rows.n;
  m.metrics = {{"rows", rows.n}, {"max_score_diff", max_diff}, {"mean_abs_score_diff", sum_diff / double(ya.size())}};
  if (predicted_class(a.transform(), ya.data(), w) >= 0) {
    int64_t same = 0;
    for (int64_t r = 0; r < rows.n; ++r)
      same += predicted_class(a.transform(), &ya[size_t(r * w)], w) == predicted_class(b.transform(), &yb[size_t(r * w)], w);
    m.metrics["class_agreement"] = double(same) / double(rows.n);
  }
  if (!rows.labels.empty() && w == 1) {
    const bool binary = a.transform() == forest::Transform::sigmoid &&
                        std::all_of(rows.labels.begin(), rows.labels.end(), [](float l) { return l == 0 || l == 1; });
    if (binary) {
      m.metrics["auc_reference"] = forest::roc_auc(ya, rows.labels);
      m.metrics["auc_compressed"] = forest::roc_auc(yb, rows.labels);
    } else {  // a regression: the error of each against the labels
      const auto rmse = [&](const std::vector<float>& y) {
        double s = 0;
        for (int64_t r = 0; r < rows.n; ++r) s += (double(y[size_t(r)]) - rows.labels[size_t(r)]) * (y[size_t(r)] - rows.labels[size_t(r)]);
        return std::sqrt(s / double(rows.n));
      };
      m.metrics["rmse_reference"] = rmse(ya);
      m.metrics["rmse_compressed"] = rmse(yb);
    }
  }
  return m;
}

}  // namespace

json domain_metric(ModelKind kind, const json& m, const std::string& metric) {
  const auto over_outputs = [&](const char* key, bool highest) {
    json best;
    for (const auto& out : m["outputs"])
      if (out.contains(key) && (best.is_null() || (highest ? out[key] > best : out[key] < best))) best = out[key];
    return best;
  };
  const auto get = [&](const char* key) { return m.contains(key) ? m[key] : json(); };
  if (kind == ModelKind::onnx) {
    if (metric == "kl") return over_outputs("kl", true);
    if (metric == "agreement") return over_outputs("top1_agreement", false);
    if (metric == "max_abs") return over_outputs("max_abs", true);
    if (metric == "cosine") return over_outputs("cosine", false);
  } else if (kind == ModelKind::gguf) {
    if (metric == "kl") return get("kl");
    if (metric == "agreement") return get("token_agreement");
    if (metric == "ppl_ratio") return get("ppl_ratio");
  } else {
    if (metric == "agreement") return get("class_agreement");
    if (metric == "max_abs") return get("max_score_diff");
    if (metric == "auc_drop" && m.contains("auc_reference"))
      return m["auc_reference"].get<double>() - m["auc_compressed"].get<double>();
  }
  return json();
}

namespace {

struct Bound {
  const char* metric;
  const char* flag;
  bool upper;  // the value must be <= the limit (else >=)
  std::optional<double> Thresholds::*limit;
  std::vector<ModelKind> kinds;
};
const std::vector<Bound>& bounds() {
  static const std::vector<Bound> b = {
      {"kl", "--max-kl", true, &Thresholds::max_kl, {ModelKind::onnx, ModelKind::gguf}},
      {"agreement", "--min-agreement", false, &Thresholds::min_agreement,
       {ModelKind::onnx, ModelKind::gguf, ModelKind::forest}},
      {"ppl_ratio", "--max-ppl-ratio", true, &Thresholds::max_ppl_ratio, {ModelKind::gguf}},
      {"max_abs", "--max-abs", true, &Thresholds::max_abs, {ModelKind::onnx, ModelKind::forest}},
      {"cosine", "--min-cosine", false, &Thresholds::min_cosine, {ModelKind::onnx}},
      {"auc_drop", "--max-auc-drop", true, &Thresholds::max_auc_drop, {ModelKind::forest}},
  };
  return b;
}

}  // namespace

json certify(const std::string& reference, const std::string& compressed, const Options& o) {
  const ModelKind kind = detect_kind(reference), other = detect_kind(compressed);
  check(kind == other, ErrorCode::invalid_argument,
        "certify: " + reference + " is " + kind_name(kind) + ", " + compressed + " is " + kind_name(other));
  check(!o.domains.empty(), ErrorCode::invalid_argument, "certify: give at least one --domain NAME=DATA");
  check(o.batch > 0, ErrorCode::invalid_argument, "certify: --batch must be positive");
  json thresholds = json::object();
  for (const Bound& b : bounds()) {
    const auto& limit = o.thresholds.*b.limit;
    if (!limit) continue;
    check(std::find(b.kinds.begin(), b.kinds.end(), kind) != b.kinds.end(), ErrorCode::invalid_argument,
          std::string("certify: ") + b.flag + " does not apply to " + kind_name(kind) + " models");
    thresholds[b.flag + 2] = *limit;
  }
  energy::EnergyMeter meter;
  if (meter.basis() == energy::Basis::measured) meter.measure_idle(0.5);
  json domains = json::array();
  bool all_pass = true;
  for (const Domain& d : o.domains) {
    for (const auto& seen : domains)
      check(seen["name"] != d.name, ErrorCode::invalid_argument, "certify: domain '" + d.name + "' given twice");
    SideMeter sides(meter);
    const char* unit = kind == ModelKind::gguf ? "token" : kind == ModelKind::onnx ? "sample" : "row";
    const Measured m = kind == ModelKind::onnx   ? onnx_domain(reference, compressed, d, o, sides)
                       : kind == ModelKind::gguf ? gguf_domain(reference, compressed, d, o, sides)
                                                 : forest_domain(reference, compressed, d, o, sides);
    json checks = json::array();
    bool pass = true;
    for (const Bound& b : bounds()) {
      const auto& limit = o.thresholds.*b.limit;
      if (!limit) continue;
      const json v = domain_metric(kind, m.metrics, b.metric);
      const bool ok = v.is_number() && (b.upper ? v.get<double>() <= *limit : v.get<double>() >= *limit);
      checks.push_back({{"metric", b.metric}, {"limit", *limit}, {"value", v}, {"pass", ok}});
      pass &= ok;
    }
    all_pass &= pass;
    domains.push_back({{"name", d.name},
                       {"data", file_info(d.data)},
                       {"samples", m.samples},
                       {"metrics", m.metrics},
                       {"reference", sides.side(false, unit)},
                       {"compressed", sides.side(true, unit)},
                       {"checks", checks},
                       {"pass", pass}});
  }
  return {{"schema", kPredicateType},
          {"kind", kind_name(kind)},
          {"reference", file_info(reference)},
          {"compressed", file_info(compressed)},
          {"thresholds", thresholds},
          {"energy_basis", energy::basis_name(meter.basis())},
          {"energy_source", meter.describe()},
          {"domains", domains},
          {"pass", all_pass}};
}

std::string report_markdown(const json& r) {
  const auto num = [](const json& v, const char* fmt) {
    if (!v.is_number()) return std::string("-");
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v.get<double>());
    return std::string(buf);
  };
  std::ostringstream md;
  md << "# slim certify: " << r["compressed"]["file"].get<std::string>() << " against "
     << r["reference"]["file"].get<std::string>() << " (" << r["kind"].get<std::string>() << ")\n\n"
     << "Size: " << r["reference"]["bytes"] << " -> " << r["compressed"]["bytes"] << " bytes. Energy "
     << r["energy_basis"].get<std::string>() << ". Verdict: **" << (r["pass"].get<bool>() ? "pass" : "FAIL")
     << "**\n\n| domain | samples | metrics | latency ref -> compressed | energy ref -> compressed | checks | "
        "verdict |\n|---|---|---|---|---|---|---|\n";
  for (const auto& d : r["domains"]) {
    std::string metrics;
    const auto add = [&](const std::string& name, const json& v) {
      if (!v.is_number()) return;
      metrics += (metrics.empty() ? "" : ", ") + name + " " + num(v, "%.4g");
    };
    const json& m = d["metrics"];
    if (m.contains("outputs")) {
      for (const auto& out : m["outputs"]) {
        const std::string n = out["name"].get<std::string>() + " ";
        add(n + "top-1", out.value("top1_agreement", json()));
        add(n + "KL", out.value("kl", json()));
        add(n + "cos", out["cosine"]);
        add(n + "max abs", out["max_abs"]);
      }
    } else {
      for (const auto& [k, v] : m.items())
        if (k != "tokens" && k != "chunks" && k != "rows" && k != "scored_tokens") add(k, v);
    }
    std::string checks;
    for (const auto& c : d["checks"])
      checks += (checks.empty() ? "" : ", ") + c["metric"].get<std::string>() + (c["pass"].get<bool>() ? " ok" : " FAIL");
    const std::string unit = d["reference"]["unit"];
    md << "| " << d["name"].get<std::string>() << " | " << d["samples"] << " | " << metrics << " | "
       << num(d["reference"]["median_latency_s"].get<double>() * 1e3, "%.3g") << " -> "
       << num(d["compressed"]["median_latency_s"].get<double>() * 1e3, "%.3g") << " ms/" << unit << " | "
       << num(d["reference"]["energy_j"], "%.3g") << " -> " << num(d["compressed"]["energy_j"], "%.3g") << " J | "
       << (checks.empty() ? "-" : checks) << " | " << (d["pass"].get<bool>() ? "pass" : "FAIL") << " |\n";
  }
  return md.str();
}

namespace {

json subjects_of(const json& report) {
  json s = json::array();
  const auto add = [&](const std::string& role, const json& f) {
    s.push_back({{"name", role + ":" + f["file"].get<std::string>()}, {"digest", {{"sha256", f["sha256"]}}}});
  };
  add("reference", report["reference"]);
  add("compressed", report["compressed"]);
  for (const auto& d : report["domains"]) add("data/" + d["name"].get<std::string>(), d["data"]);
  return s;
}

std::string digest_of(const std::string& path, const std::string& what) {
  try {
    return data_digest(path);
  } catch (const Error& e) {
    throw Error(ErrorCode::not_found, what + ": " + e.what());
  }
}

}  // namespace

std::string sign_report(const json& report, const trust::PrivateKey& key) {
  const json statement = {{"_type", trust::kStatementType},
                          {"subject", subjects_of(report)},
                          {"predicateType", kPredicateType},
                          {"predicate", report}};
  trust::SignatureBundle b;
  b.key_hint = key.public_key().hint();
  b.payload = statement.dump();
  const std::string pae = trust::dsse_pae(b.payload_type, b.payload);
  b.signatures.push_back(key.sign({reinterpret_cast<const uint8_t*>(pae.data()), pae.size()}));
  return trust::bundle_json(b);
}

json verify_report(std::string_view bundle_text, const std::string& source, const trust::PublicKey& key,
                   const VerifyRequest& request) {
  const trust::SignatureBundle b = trust::parse_bundle(bundle_text, source);
  check(b.payload_type == trust::kInTotoPayloadType, ErrorCode::integrity,
        source + ": payload type '" + b.payload_type + "', expected " + std::string(trust::kInTotoPayloadType));
  check(b.key_hint.empty() || b.key_hint == key.hint(), ErrorCode::integrity,
        source + ": signed by another key (hint " + b.key_hint + ", the given key's " + key.hint() + ")");
  const std::string pae = trust::dsse_pae(b.payload_type, b.payload);
  bool ok = false;
  for (const auto& sig : b.signatures)
    ok |= key.verify({reinterpret_cast<const uint8_t*>(pae.data()), pae.size()}, sig);
  check(ok, ErrorCode::integrity, source + ": the signature does not verify with the given key (the report or bundle was changed, or another key signed it)");
  json st;
  try {
    st = json::parse(b.payload);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::invalid_model, source + ": the statement is not JSON: " + e.what());
  }
  check(st.is_object() && st.value("_type", "") == trust::kStatementType && st.value("predicateType", "") == kPredicateType &&
            st.contains("predicate") && st["predicate"].is_object(),
        ErrorCode::integrity, source + ": not a slim certify statement (predicate type " + std::string(kPredicateType) + ")");
  const json& report = st["predicate"];
  try {
    check(st["subject"] == subjects_of(report), ErrorCode::integrity,
          source + ": the statement's subjects are not the report's files");
  } catch (const json::exception& e) {
    throw Error(ErrorCode::invalid_model, source + ": malformed report: " + e.what());
  }
  if (!request.report_file.empty()) {
    json given;
    try {
      given = json::parse(trust::read_small_file(request.report_file, trust::kMaxBundleSize, "report"));
    } catch (const json::exception& e) {
      throw Error(ErrorCode::integrity, request.report_file + ": not the signed report (not JSON: " + e.what() + ")");
    }
    const json patch = json::diff(report, given);
    check(patch.empty(), ErrorCode::integrity,
          request.report_file + ": differs from the signed report at " +
              (patch.empty() ? "" : patch[0]["path"].get<std::string>()));
  }
  const auto compare = [&](const std::string& path, const json& certified, const std::string& what) {
    const std::string now = digest_of(path, what);
    check(now == certified["sha256"].get<std::string>(), ErrorCode::integrity,
          what + " " + path + " changed: sha256 " + now + ", certified " + certified["sha256"].get<std::string>() +
              " (" + certified["file"].get<std::string>() + ")");
  };
  if (request.models) {
    compare(request.models->first, report["reference"], "reference model");
    compare(request.models->second, report["compressed"], "compressed model");
  }
  for (const Domain& d : request.data) {
    const json* found = nullptr;
    for (const auto& dom : report["domains"])
      if (dom["name"] == d.name) found = &dom;
    check(found != nullptr, ErrorCode::integrity, source + ": no domain '" + d.name + "' was certified");
    compare(d.data, (*found)["data"], "data of domain '" + d.name + "'");
  }
  return report;
}

}  // namespace slim::certify
