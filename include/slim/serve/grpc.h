// The KServe v2 gRPC front door (inference.GRPCInferenceService): translates the
// protocol's messages into InferenceServer calls and back. Inference runs on the callback
// API, so a request waiting in a model's batcher holds no thread.
#pragma once

#include <memory>
#include <string>

#include "slim/serve/server.h"

namespace slim::serve {

struct GrpcOptions {
  std::string host = "0.0.0.0";
  int port = 8001;                   // 0: a free port
  int max_message_bytes = 64 << 20;  // per request and per response
};

class GrpcFrontend {
 public:
  GrpcFrontend(InferenceServer& server, GrpcOptions options);
  ~GrpcFrontend();  // stop()
  GrpcFrontend(const GrpcFrontend&) = delete;
  GrpcFrontend& operator=(const GrpcFrontend&) = delete;

  // Binds and starts serving; returns the bound port. Throws `unavailable` naming
  // host:port when it cannot bind.
  int start();
  // Stops accepting, lets the calls in flight finish, and returns. Safe to call twice.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slim::serve
