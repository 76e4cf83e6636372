// slim certify: a per-domain consistency report of a compressed model against its
// reference (src/certify), optionally signed; `slim certify verify` checks one.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "plot.h"
#include "slim/certify/certify.h"
#include "slim/core/error.h"
#include "slim/trust/keys.h"
#include "slim/trust/model_signing.h"

namespace slim::cli {
namespace {

// Exit code of a report whose verdict is fail (the report is still written).
constexpr int kFailedExit = 5;

std::vector<certify::Domain> parse_domains(const std::vector<std::string>& specs, const char* flag) {
  std::vector<certify::Domain> out;
  for (const auto& s : specs) {
    const size_t eq = s.find('=');
    check(eq != std::string::npos && eq > 0 && eq + 1 < s.size(), ErrorCode::invalid_argument,
          std::string(flag) + " '" + s + "': expected NAME=FILE");
    out.push_back({s.substr(0, eq), s.substr(eq + 1)});
  }
  return out;
}

// A bar per domain of how closely the compressed model agrees with the reference: top-1
// (ONNX; cosine when no output is a classifier's), next-token (GGUF) or class (forest)
// agreement in percent, or, for regression forests, the largest |score difference|.
void chart(const nlohmann::json& report, const std::string& path) {
  certify::ModelKind kind = certify::ModelKind::onnx;
  for (auto k : {certify::ModelKind::onnx, certify::ModelKind::gguf, certify::ModelKind::forest})
    if (report["kind"] == certify::kind_name(k)) kind = k;
  const auto all_have = [&](const char* metric) {
    for (const auto& d : report["domains"])
      if (!certify::domain_metric(kind, d["metrics"], metric).is_number()) return false;
    return true;
  };
  const char* metric = all_have("agreement") ? "agreement" : all_have("cosine") ? "cosine" : "max_abs";
  const bool percent = std::string(metric) != "max_abs";
  plot::Chart c;
  c.title = report["compressed"]["file"].get<std::string>() + " against " +
            report["reference"]["file"].get<std::string>() + ": " + (report["pass"].get<bool>() ? "pass" : "FAIL");
  c.y_label = std::string(metric == std::string("agreement") ? "agreement with the reference"
                          : percent                          ? "lowest output cosine"
                                                             : "largest |score difference|") +
              (percent ? ", %" : "");
  for (const auto& d : report["domains"]) {
    const nlohmann::json v = certify::domain_metric(kind, d["metrics"], metric);
    c.categories.push_back(d["name"].get<std::string>() + (d["pass"].get<bool>() ? "" : " (FAIL)"));
    c.values.push_back(v.is_number() ? v.get<double>() * (percent ? 100 : 1) : 0.0);
  }
  plot::write_png(c, path);
}

struct CertifyArgs {
  std::string reference, compressed, output, markdown, png, sign_key, bundle, label;
  std::vector<std::string> domains;
  certify::Thresholds th;
  int64_t batch = 1;
  int ctx = 128, chunks = 0, threads = 0;
};

void run_certify(const CertifyArgs& a) {
  check(!a.reference.empty() && !a.compressed.empty(), ErrorCode::invalid_argument,
        "certify: give REFERENCE and COMPRESSED models (or `slim certify verify`)");
  check(!a.output.empty(), ErrorCode::invalid_argument, "certify: give the report file (-o report.json)");
  check(a.sign_key.empty() == a.bundle.empty(), ErrorCode::invalid_argument,
        "certify: --sign and --bundle go together");
  // Load the key first: a bad key should not cost a whole certification run.
  std::optional<trust::PrivateKey> key;
  if (!a.sign_key.empty()) key = trust::PrivateKey::load(a.sign_key);
  certify::Options o;
  o.domains = parse_domains(a.domains, "--domain");
  o.thresholds = a.th;
  o.batch = a.batch;
  o.n_ctx = a.ctx;
  o.chunks = a.chunks;
  o.threads = a.threads;
  o.label_column = a.label;
  o.progress = true;
  const nlohmann::json report = certify::certify(a.reference, a.compressed, o);
  trust::write_file_atomic(a.output, report.dump(2) + "\n");
  const std::string md = certify::report_markdown(report);
  if (!a.markdown.empty()) trust::write_file_atomic(a.markdown, md);
  if (!a.png.empty()) chart(report, a.png);
  if (key) trust::write_file_atomic(a.bundle, certify::sign_report(report, *key));
  std::cout << md;
  std::cout.flush();
  if (!report["pass"].get<bool>()) {
    std::cerr << "slim: certify: a domain failed its thresholds (report in " << a.output << ")\n";
    std::exit(kFailedExit);  // main() knows success and slim::Error only
  }
}

struct VerifyArgs {
  std::string bundle, pub, report;
  std::vector<std::string> models, data;
};

void run_verify(const VerifyArgs& a) {
  const trust::PublicKey key = trust::PublicKey::load(a.pub);
  certify::VerifyRequest req;
  if (!a.models.empty()) req.models = std::make_pair(a.models[0], a.models[1]);
  req.data = parse_domains(a.data, "--data");
  req.report_file = a.report;
  const std::string text = trust::read_small_file(a.bundle, trust::kMaxBundleSize, "certification bundle");
  const nlohmann::json report = certify::verify_report(text, a.bundle, key, req);
  std::printf("verified: %s certifies %s against %s (%s), %zu domain(s), verdict %s\n", a.bundle.c_str(),
              report["compressed"]["file"].get<std::string>().c_str(),
              report["reference"]["file"].get<std::string>().c_str(), report["kind"].get<std::string>().c_str(),
              report["domains"].size(), report["pass"].get<bool>() ? "pass" : "fail");
  if (req.models) std::printf("models: both files are the certified ones\n");
  for (const auto& d : req.data) std::printf("data: %s is the certified data of domain '%s'\n", d.data.c_str(), d.name.c_str());
  if (!a.report.empty()) std::printf("report: %s is the signed report\n", a.report.c_str());
}

void add_certify(CLI::App& app) {
  auto a = std::make_shared<CertifyArgs>();
  auto* cmd = app.add_subcommand(
      "certify",
      "Certify a compressed model against its reference on data domains: per domain the agreement of their "
      "outputs (ONNX: top-1, KL of softmax(logits) for outputs with a class axis, cosine, max |difference|; GGUF: "
      "perplexity of both and their ratio, next-token agreement, KL; forests: class agreement, max |score "
      "difference|, AUC with labels), latency and energy of both, file sizes and SHA-256 digests, pass/fail "
      "against the thresholds given. Writes a JSON report (and Markdown), optionally signed as an in-toto "
      "statement (predicate https://slim.dev/certify/v1) in a DSSE Sigstore bundle.\n\nExit codes: 0 every "
      "domain passed; 5 a domain failed its thresholds (the report is written); 2 bad input; 3 integrity "
      "failure (verify).");
  cmd->add_option("REFERENCE", a->reference, "Reference model (ONNX, GGUF, or a forest: XGBoost/LightGBM/.slimf)");
  cmd->add_option("COMPRESSED", a->compressed, "Compressed model of the same kind");
  cmd->add_option("--domain", a->domains,
                  "NAME=DATA (repeatable): ONNX an .npy/.npz or folder of INPUT.npy (samples on the first axis); "
                  "GGUF a text file; forests a CSV or 2-D .npy of feature rows");
  cmd->add_option("-o,--output", a->output, "JSON report");
  cmd->add_option("--markdown", a->markdown, "Also write a short Markdown table here");
  cmd->add_option("--png", a->png, "Also draw each domain's agreement with the reference as a bar chart (PNG)");
  cmd->add_option("--max-kl", a->th.max_kl, "ONNX/GGUF: highest mean KL(reference || compressed) in nats");
  cmd->add_option("--min-agreement", a->th.min_agreement,
                  "Lowest share of top-1 (ONNX), next-token (GGUF) or class (forest) agreement, 0-1");
  cmd->add_option("--max-ppl-ratio", a->th.max_ppl_ratio, "GGUF: highest compressed / reference perplexity");
  cmd->add_option("--max-abs", a->th.max_abs, "ONNX: highest |output difference|; forests: highest |score difference|");
  cmd->add_option("--min-cosine", a->th.min_cosine, "ONNX: lowest cosine similarity of an output");
  cmd->add_option("--max-auc-drop", a->th.max_auc_drop, "Forests with labels: highest reference AUC - compressed AUC");
  cmd->add_option("--sign", a->sign_key, "PEM private key (slim keygen): sign the report");
  cmd->add_option("--bundle", a->bundle, "Signed bundle to write (with --sign)");
  cmd->add_option("--batch", a->batch, "ONNX samples / forest rows per run (latency is per sample)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--ctx", a->ctx, "GGUF: chunk length in tokens")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--chunks", a->chunks, "GGUF: at most this many chunks per domain (0 = all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--label-column", a->label, "Forests: label column (name or index) of the domain data, for AUC");
  add_threads_option(cmd, &a->threads);
  add_isa_option(cmd);

  auto v = std::make_shared<VerifyArgs>();
  auto* ver = cmd->add_subcommand(
      "verify", "Check a signed certification bundle, and optionally that models, data or a report file are the "
                "certified ones (exit 3 naming what changed)");
  ver->add_option("BUNDLE", v->bundle, "Bundle written by certify --bundle")->required();
  ver->add_option("--pub", v->pub, "PEM public key of the signer")->required();
  ver->add_option("--models", v->models, "REFERENCE COMPRESSED: the files to compare with the certified digests")
      ->expected(2);
  ver->add_option("--data", v->data, "NAME=FILE (repeatable): a domain's data to compare");
  ver->add_option("--report", v->report, "A report.json that must equal the signed report");
  ver->callback([v] { run_verify(*v); });
  cmd->callback([a, cmd] {
    if (cmd->got_subcommand("verify")) return;
    run_certify(*a);
  });
}

}  // namespace

SLIM_COMMAND(43, add_certify);

}  // namespace slim::cli
