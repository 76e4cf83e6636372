// The HTTP front doors of `slim serve`: KServe v2 (Open Inference Protocol) REST with the
// binary tensor data and model repository extensions, the OpenAI API for language models,
// and the Prometheus metrics endpoint. Each translates HTTP into InferenceServer calls and
// back, nothing else.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "slim/serve/server.h"

namespace slim::serve {

struct HttpOptions {
  std::string host = "0.0.0.0";
  int port = 8000;                       // 0: a free port
  int max_connections = 64;              // connections served at once; more get 503 and are closed
  size_t max_body_bytes = size_t(64) << 20;  // larger requests: 413
  size_t max_header_bytes = 8192;        // larger Inference-Header-Content-Length / JSON header: 400/413
  bool access_log = false;               // one JSON line per request on stderr
};

class HttpService;

class HttpFrontend {  // KServe v2 REST and the OpenAI API (openai.h) on its port
 public:
  HttpFrontend(InferenceServer& server, HttpOptions options);
  ~HttpFrontend();  // stop()
  // Binds (port 0: a free one), serves on its own threads, returns the bound port; throws
  // unavailable naming host:port if it cannot bind.
  int start();
  void stop();  // stops listening and returns when its threads are done

 private:
  std::unique_ptr<HttpService> service_;
};

class MetricsFrontend {  // Prometheus: GET /metrics -> server.metrics_text(), text/plain; version=0.0.4
 public:
  MetricsFrontend(InferenceServer& server, HttpOptions options);
  ~MetricsFrontend();
  int start();
  void stop();

 private:
  std::unique_ptr<HttpService> service_;
};

}  // namespace slim::serve
