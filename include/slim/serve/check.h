// `slim check URL`: probes a running model server over KServe v2 REST and gRPC and the
// OpenAI API, and reports what it can do as JSON: the protocols that answer, the server,
// its models with their versions, tensors, batching and a latency sample. Only the
// protocols' standard fields are needed, so it works against slim, Triton-like KServe v2
// servers and llama.cpp's llama-server; what only slim says (the "slim" objects of its
// metadata: ISA, kernels, signatures, variants) is null elsewhere. The verdict is a function
// of the report alone.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace slim::serve {

struct CheckOptions {
  std::string url;        // http://HOST[:PORT] (the scheme may be left out; port 80 by default)
  std::string grpc;       // KServe gRPC HOST:PORT; "": the URL's host:8001 when its port is 8000, else none
  int timeout_ms = 3000;  // connect and read limit of each request
  int samples = 5;        // latency samples per model (0: none)
};

// Probes the server and returns the report (fields in a fixed order). Throws
// invalid_argument for a malformed URL only: whatever the server answers, or that it
// does not answer, goes in the report.
nlohmann::ordered_json check_server(const CheckOptions& options);

struct CheckVerdict {
  // 0: healthy (ready, every probe that ran succeeded); 3: a model version is unavailable
  // for a failed signature or integrity check; 2: the URL does not answer; 1: anything
  // else that failed (not live or ready, a failed inference, an explicit --grpc that
  // does not answer, no known API at the URL).
  int exit_code = 0;
  std::vector<std::string> problems;  // one sentence each, in report order
};
CheckVerdict judge_report(const nlohmann::ordered_json& report);

}  // namespace slim::serve
