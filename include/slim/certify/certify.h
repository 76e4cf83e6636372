// `slim certify`: how far a compressed model departs from its reference on each of a
// user's data domains, as a JSON report with pass/fail per domain against thresholds,
// optionally signed as an in-toto statement in a DSSE Sigstore bundle (the keys and code
// of model signing). The comparisons are library code so the server's canary can reuse
// them. Report layout and metrics: docs/architecture.md, "certify".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slim/trust/keys.h"

namespace slim::certify {

inline constexpr std::string_view kPredicateType = "https://slim.dev/certify/v1";

enum class ModelKind { onnx, gguf, forest };
const char* kind_name(ModelKind kind);
// GGUF by its magic, forests by .slimf magic or a .json/.ubj/.txt name, else ONNX.
ModelKind detect_kind(const std::string& path);

struct Domain {
  std::string name, data;  // data: ONNX .npy/.npz/folder of NAME.npy; GGUF text; forest CSV/.npy
};

// Bounds a domain must meet; a bound that does not apply to the model kind is an
// invalid_argument error, and a bounded metric the domain could not measure fails.
struct Thresholds {
  std::optional<double> max_kl;          // ONNX classifier outputs (highest), GGUF mean KL
  std::optional<double> min_agreement;   // ONNX top-1 (lowest output), GGUF next token, forest class
  std::optional<double> max_ppl_ratio;   // GGUF: compressed PPL / reference PPL
  std::optional<double> max_abs;         // ONNX max |difference| (highest output), forest max |Δscore|
  std::optional<double> min_cosine;      // ONNX (lowest output)
  std::optional<double> max_auc_drop;    // forest, labelled domains: reference AUC − compressed AUC
};

struct Options {
  std::vector<Domain> domains;
  Thresholds thresholds;
  int threads = 0;
  int64_t batch = 1;          // ONNX samples / forest rows per run (latency is per sample)
  int n_ctx = 128, chunks = 0;  // GGUF: chunk length and count (as `slim perplexity`)
  std::string label_column;     // forests: label column name or index ("" : none)
  bool progress = false;
};

// Runs both models on every domain and returns the report (schema in the docs):
// {"schema", "kind", "reference"/"compressed": {file, sha256, bytes}, "thresholds",
//  "energy_basis", "domains": [{name, data: {file, sha256, bytes}, metrics, latency and
//  energy per model, checks, pass}], "pass"}.
nlohmann::json certify(const std::string& reference, const std::string& compressed, const Options& options);

// The value of a bounded metric in a domain's `metrics` (null when not measured):
// "agreement" (ONNX: the lowest top-1 agreement of an output; GGUF: next token; forest:
// class), "kl", "ppl_ratio", "max_abs", "cosine", "auc_drop"; worst over ONNX outputs.
nlohmann::json domain_metric(ModelKind kind, const nlohmann::json& metrics, const std::string& metric);

// A short Markdown table of a report, one row per domain.
std::string report_markdown(const nlohmann::json& report);

// SHA-256 (hex) of a file, or of a folder as model signing hashes it (the root digest).
std::string data_digest(const std::string& path);

// The report as an in-toto Statement v1 (subjects: both models and the domains' data by
// SHA-256; predicateType kPredicateType; predicate: the report), in a DSSE-signed
// Sigstore bundle v0.3 (trust/model_signing.h).
std::string sign_report(const nlohmann::json& report, const trust::PrivateKey& key);

struct VerifyRequest {
  std::optional<std::pair<std::string, std::string>> models;  // reference, compressed
  std::vector<Domain> data;                                   // NAME=FILE
  std::string report_file;                                    // "" : none
};
// Checks the bundle's signature with `key`, the statement (type, predicate type, that
// its subjects are the report's files), and the files named in `request` against the
// certified digests; returns the signed report. Every mismatch is an integrity error
// naming what changed.
nlohmann::json verify_report(std::string_view bundle_json, const std::string& source,
                             const trust::PublicKey& key, const VerifyRequest& request);

}  // namespace slim::certify
