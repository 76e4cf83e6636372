// `slim check`'s verdict on hand-built reports (the probes themselves are tested end to
// end by tests/serve/test_check.py), and its refusal of malformed URLs.
#include "slim/serve/check.h"

#include <gtest/gtest.h>

#include "slim/core/error.h"

namespace slim::serve {
namespace {

using json = nlohmann::ordered_json;

// A healthy slim server: REST and gRPC ready, one model with five good samples.
json healthy() {
  return json::parse(R"({
    "url": "http://127.0.0.1:8000", "answered": true, "error": null,
    "server": {"name": "slim", "version": "0.1.0", "extensions": ["model_repository"]},
    "slim": {"isa": "avx2", "kernels": "avx2", "require_signature": true},
    "protocols": {
      "kserve_rest": {"answered": true, "live": true, "ready": true},
      "kserve_grpc": {"address": "127.0.0.1:8001", "requested": false, "answered": true, "live": true,
                      "ready": true, "server": {"name": "slim", "version": "0.1.0"}, "error": null},
      "openai": {"answered": true, "health": true}},
    "models": [{"name": "digits", "platform": "onnxruntime_onnx", "protocols": ["kserve_rest", "kserve_grpc"],
                "versions": [{"version": "1", "state": "READY", "reason": "", "signed": true, "signer": "ops",
                              "variant": "fp32"}],
                "inputs": [], "outputs": [], "batching": null,
                "latency": {"samples": 5, "succeeded": 5, "min_ms": 0.1, "median_ms": 0.2, "max_ms": 0.3,
                            "error": null},
                "errors": []}]})");
}

TEST(CheckVerdict, HealthyServerIsZero) {
  const CheckVerdict v = judge_report(healthy());
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_TRUE(v.problems.empty());
}

TEST(CheckVerdict, NoAnswerIsTwo) {
  const CheckVerdict v = judge_report(json::parse(
      R"j({"url": "http://127.0.0.1:9", "answered": false,
          "error": "GET /v2: cannot connect (refused or unreachable)"})j"));
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_EQ(v.problems, std::vector<std::string>{
                            "the server does not answer: GET /v2: cannot connect (refused or unreachable)"});
}

TEST(CheckVerdict, SignatureOrIntegrityFailureIsThreeAndOutranksOtherFailures) {
  json r = healthy();
  r["protocols"]["kserve_rest"]["ready"] = false;
  r["models"][0]["versions"].push_back(
      {{"version", "2"}, {"state", "UNAVAILABLE"}, {"reason", "refused: bad Signature over model.onnx"}});
  CheckVerdict v = judge_report(r);
  EXPECT_EQ(v.exit_code, 3);
  EXPECT_EQ(v.problems, (std::vector<std::string>{
                            "KServe v2 REST: the server is not ready",
                            "model 'digits' version 2 is unavailable: refused: bad Signature over model.onnx"}));

  r = healthy();
  r["models"].push_back({{"name", "cnn"},
                         {"versions", json::array({{{"version", nullptr},
                                                    {"state", "UNAVAILABLE"},
                                                    {"reason", "integrity check failed: model.onnx changed"}}})}});
  v = judge_report(r);
  EXPECT_EQ(v.exit_code, 3);
  EXPECT_EQ(v.problems,
            std::vector<std::string>{"model 'cnn' is unavailable: integrity check failed: model.onnx changed"});

  // Unavailable for any other reason (not loaded, a load error) is the readiness's business.
  r = healthy();
  r["models"][0]["versions"][0] = {{"version", nullptr}, {"state", "UNAVAILABLE"}, {"reason", "not loaded"}};
  EXPECT_EQ(judge_report(r).exit_code, 0);
}

TEST(CheckVerdict, FailedProbesAreOne) {
  json r = healthy();
  r["protocols"]["kserve_rest"]["live"] = false;
  r["protocols"]["openai"]["health"] = false;
  r["models"][0]["latency"]["succeeded"] = 3;
  r["models"][0]["latency"]["error"] = "POST /v2/models/digits/infer answered 503: queue full";
  r["models"][0]["errors"].push_back("gRPC ModelMetadata: unknown model");
  const CheckVerdict v = judge_report(r);
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_EQ(v.problems, (std::vector<std::string>{
                            "KServe v2 REST: the server is not live",
                            "OpenAI API: GET /health says the server is not ready",
                            "model 'digits': gRPC ModelMetadata: unknown model",
                            "model 'digits': 2 of 5 samples failed: POST /v2/models/digits/infer answered 503: "
                            "queue full"}));
}

TEST(CheckVerdict, GrpcCountsWhereAsked) {
  json r = healthy();
  json& grpc = r["protocols"]["kserve_grpc"];
  grpc = {{"address", "127.0.0.1:8001"}, {"requested", false}, {"answered", false},
          {"error", "ServerLive: failed to connect (gRPC status 14)"}};
  EXPECT_EQ(judge_report(r).exit_code, 0);  // guessed from port 8000: this server has no gRPC
  grpc["requested"] = true;
  EXPECT_EQ(judge_report(r).problems, std::vector<std::string>{
                                          "KServe v2 gRPC at 127.0.0.1:8001: ServerLive: failed to connect (gRPC "
                                          "status 14)"});
  grpc = {{"address", "127.0.0.1:8001"}, {"requested", false}, {"answered", true}, {"live", true}, {"ready", false}};
  EXPECT_EQ(judge_report(r).problems, std::vector<std::string>{"KServe v2 gRPC: the server is not ready"});
}

TEST(CheckVerdict, NoKnownApiIsOne) {
  json r = healthy();
  r["protocols"]["kserve_rest"] = {{"answered", false}, {"live", nullptr}, {"ready", nullptr}};
  r["protocols"]["openai"] = {{"answered", false}, {"health", nullptr}};
  r["models"] = json::array();
  EXPECT_EQ(judge_report(r).problems,
            std::vector<std::string>{"neither KServe v2 (GET /v2) nor the OpenAI API (GET /v1/models) answers"});
}

TEST(CheckServer, MalformedUrlsAreRefused) {
  auto message = [](const std::string& url) {
    try {
      CheckOptions o;
      o.url = url;
      check_server(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("https://example.com"), "'https://example.com': only http:// servers can be checked");
  EXPECT_EQ(message("http://host:8000/v2"), "'http://host:8000/v2' is not a server URL of the form http://HOST[:PORT]");
  EXPECT_EQ(message("http://host:99999"), "'http://host:99999': port out of range");
  EXPECT_EQ(message(""), "'' is not a server URL of the form http://HOST[:PORT]");
}

}  // namespace
}  // namespace slim::serve
