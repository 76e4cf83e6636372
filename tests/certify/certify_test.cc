// The signed certification bundle and the Markdown rendering on hand-made reports (the
// metrics themselves are checked against numpy, xgboost and `slim perplexity` in
// test_certify.py, which runs the models).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "slim/certify/certify.h"
#include "slim/core/error.h"
#include "slim/trust/digest.h"
#include "slim/trust/model_signing.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace slim;

namespace {

std::string sha(const std::string& s) { return trust::to_hex(trust::hash_bytes(trust::HashAlg::sha256, s)); }

class CertifyBundle : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("slim_certify_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "folder");
    write("ref.bin", "reference");
    write("small.bin", "compressed");
    write("folder/x.npy", "data");
    report_ = {{"schema", certify::kPredicateType},
               {"kind", "onnx"},
               {"reference", {{"file", "ref.bin"}, {"sha256", sha("reference")}, {"bytes", 9}}},
               {"compressed", {{"file", "small.bin"}, {"sha256", sha("compressed")}, {"bytes", 10}}},
               {"thresholds", {{"max-kl", 0.01}}},
               {"energy_basis", "estimated"},
               {"domains",
                {{{"name", "a"},
                  {"data", {{"file", "folder"}, {"sha256", certify::data_digest(path("folder"))}, {"bytes", 4}}},
                  {"samples", 3},
                  {"metrics",
                   {{"outputs", {{{"name", "y"}, {"rows", 3}, {"cosine", 0.5}, {"max_abs", 0.25}, {"top1_agreement", 1.0}, {"kl", 0.125}}}}}},
                  {"reference", {{"unit", "sample"}, {"median_latency_s", 0.002}, {"energy_j", 1.5}}},
                  {"compressed", {{"unit", "sample"}, {"median_latency_s", 0.001}, {"energy_j", 0.75}}},
                  {"checks", {{{"metric", "kl"}, {"limit", 0.01}, {"value", 0.125}, {"pass", false}}}},
                  {"pass", false}}}},
               {"pass", false}};
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir_ / name) << text; }
  void expect_integrity(const std::string& bundle, const certify::VerifyRequest& req, const std::string& message,
                        const trust::PublicKey& key) {
    try {
      certify::verify_report(bundle, "b.json", key, req);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::integrity);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
  json report_;
};

TEST_F(CertifyBundle, SignsAStatementOverTheReportAndItsFiles) {
  for (auto alg : {trust::KeyAlg::ecdsa_p256, trust::KeyAlg::ed25519, trust::KeyAlg::sm2}) {
    const auto key = trust::PrivateKey::generate(alg);
    const std::string bundle = certify::sign_report(report_, key);
    const trust::SignatureBundle b = trust::parse_bundle(bundle, "b.json");
    const json st = json::parse(b.payload);
    EXPECT_EQ(st["_type"], "https://in-toto.io/Statement/v1");
    EXPECT_EQ(st["predicateType"], "https://slim.dev/certify/v1");
    EXPECT_EQ(st["predicate"], report_);
    EXPECT_EQ(st["subject"], json::parse(R"([{"name":"reference:ref.bin","digest":{"sha256":")" + sha("reference") +
                                         R"("}},{"name":"compressed:small.bin","digest":{"sha256":")" +
                                         sha("compressed") + R"("}},{"name":"data/a:folder","digest":{"sha256":")" +
                                         certify::data_digest(path("folder")) + R"("}}])"));
    certify::VerifyRequest req;
    req.models = {path("ref.bin"), path("small.bin")};
    req.data = {{"a", path("folder")}};
    EXPECT_EQ(certify::verify_report(bundle, "b.json", key.public_key(), req), report_);
  }
}

TEST_F(CertifyBundle, NamesWhatChanged) {
  const auto key = trust::PrivateKey::generate(trust::KeyAlg::ecdsa_p256);
  const std::string bundle = certify::sign_report(report_, key);
  certify::VerifyRequest req;
  req.models = {path("ref.bin"), path("small.bin")};
  write("small.bin", "compresseD");
  expect_integrity(bundle, req, "compressed model " + path("small.bin") + " changed: sha256 " + sha("compresseD") +
                                    ", certified " + sha("compressed") + " (small.bin)", key.public_key());
  req.models.reset();
  write("folder/y.npy", "more");  // a file added to a data folder changes its digest
  req.data = {{"a", path("folder")}};
  expect_integrity(bundle, req, "data of domain 'a' " + path("folder") + " changed", key.public_key());
  req.data.clear();
  json changed = report_;
  changed["domains"][0]["checks"][0]["pass"] = true;
  write("report.json", changed.dump(2));
  req.report_file = path("report.json");
  expect_integrity(bundle, req, "report.json: differs from the signed report at /domains/0/checks/0/pass",
                   key.public_key());
  write("report.json", report_.dump(2));
  EXPECT_NO_THROW(certify::verify_report(bundle, "b.json", key.public_key(), req));
  // The payload swapped for another statement: the signature no longer covers it.
  trust::SignatureBundle b = trust::parse_bundle(bundle, "b.json");
  b.payload.replace(b.payload.find("\"pass\":false"), 12, "\"pass\":true ");
  expect_integrity(trust::bundle_json(b), {}, "b.json: the signature does not verify", key.public_key());
  // A model signature is not a certification, though validly signed.
  b = trust::parse_bundle(bundle, "b.json");
  json st = json::parse(b.payload);
  st["predicateType"] = trust::kModelSigningPredicate;
  b.payload = st.dump();
  const std::string pae = trust::dsse_pae(b.payload_type, b.payload);
  b.signatures = {key.sign({reinterpret_cast<const uint8_t*>(pae.data()), pae.size()})};
  expect_integrity(trust::bundle_json(b), {}, "not a slim certify statement", key.public_key());
  const auto other = trust::PrivateKey::generate(trust::KeyAlg::ed25519);
  expect_integrity(bundle, {}, "b.json: signed by another key", other.public_key());
}

TEST_F(CertifyBundle, MarkdownTable) {
  EXPECT_EQ(certify::report_markdown(report_),
            "# slim certify: small.bin against ref.bin (onnx)\n\n"
            "Size: 9 -> 10 bytes. Energy estimated. Verdict: **FAIL**\n\n"
            "| domain | samples | metrics | latency ref -> compressed | energy ref -> compressed | checks | verdict |\n"
            "|---|---|---|---|---|---|---|\n"
            "| a | 3 | y top-1 1, y KL 0.125, y cos 0.5, y max abs 0.25 | 2 -> 1 ms/sample | 1.5 -> 0.75 J | kl FAIL | "
            "FAIL |\n");
}

TEST(Certify, KindsAndRefusals) {
  EXPECT_STREQ(certify::kind_name(certify::ModelKind::forest), "forest");
  try {
    certify::detect_kind("/nonexistent/model.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_STREQ(e.what(), "/nonexistent/model.onnx: no such model file");
  }
}

}  // namespace
