// `slim serve`: the model server. A Triton-style model repository served over KServe v2
// REST and gRPC, with Prometheus metrics on a port of its own (Triton's flag names and
// default ports). SIGTERM or SIGINT: readiness turns false, new requests are refused,
// requests in flight finish, then the process exits 0.
#include <signal.h>

#include <chrono>
#include <iostream>

#include "commands.h"
#include "slim/core/error.h"
#include "slim/serve/grpc.h"
#include "slim/serve/http.h"
#include "slim/serve/server.h"

namespace slim::cli {
namespace {

struct ServeOptions {
  serve::ServerOptions server;
  std::string host = "0.0.0.0";
  int http_port = 8000, grpc_port = 8001, metrics_port = 8002;
  bool allow_http = true, allow_grpc = true, allow_metrics = true;
  std::string control = "none";
  int max_connections = 64;
  size_t max_body_bytes = size_t(64) << 20;
  bool access_log = false;
  int exit_timeout_secs = 30;
  uint64_t request_timeout_ms = 0;
};

void run_serve(ServeOptions& o) {
  o.server.model_control =
      o.control == "explicit" ? serve::ServerOptions::ModelControl::explicit_ : serve::ServerOptions::ModelControl::none;
  o.server.request_timeout_us = o.request_timeout_ms * 1000;
  check(!o.server.repository.empty(), ErrorCode::invalid_argument, "--model-repository is required");

  // Signals go to this thread only (sigwait below): every thread the server starts
  // inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const auto t0 = std::chrono::steady_clock::now();
  serve::InferenceServer server(o.server);
  server.start();

  serve::HttpOptions http;
  http.host = o.host;
  http.max_connections = o.max_connections;
  http.max_body_bytes = o.max_body_bytes;
  http.access_log = o.access_log;
  std::unique_ptr<serve::HttpFrontend> rest;
  std::unique_ptr<serve::GrpcFrontend> grpc;
  std::unique_ptr<serve::MetricsFrontend> metrics;
  if (o.allow_http) {
    http.port = o.http_port;
    rest = std::make_unique<serve::HttpFrontend>(server, http);
    std::cout << "slim serve: HTTP listening on " << o.host << ":" << rest->start() << std::endl;
  }
  if (o.allow_grpc) {
    serve::GrpcOptions g;
    g.host = o.host;
    g.port = o.grpc_port;
    g.max_message_bytes = int(std::min<size_t>(o.max_body_bytes, size_t(INT32_MAX)));
    grpc = std::make_unique<serve::GrpcFrontend>(server, g);
    std::cout << "slim serve: gRPC listening on " << o.host << ":" << grpc->start() << std::endl;
  }
  if (o.allow_metrics) {
    serve::HttpOptions m = http;
    m.port = o.metrics_port;
    m.access_log = false;
    m.max_connections = 8;  // scrapers, not clients: no need for a thread per client
    metrics = std::make_unique<serve::MetricsFrontend>(server, m);
    std::cout << "slim serve: metrics listening on " << o.host << ":" << metrics->start() << std::endl;
  }
  const double start_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "slim serve: started in " << int64_t(start_ms) << " ms" << (server.ready() ? "" : " (not every model is ready)")
            << "\n";
  std::cout << "slim serve: ready" << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "slim serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining " << server.in_flight()
            << " requests in flight\n";
  const bool drained = server.shutdown(std::chrono::seconds(o.exit_timeout_secs));
  if (grpc) grpc->stop();
  if (rest) rest->stop();
  if (metrics) metrics->stop();
  check(drained, ErrorCode::unavailable,
        std::to_string(server.in_flight()) + " requests still in flight after --exit-timeout-secs " +
            std::to_string(o.exit_timeout_secs));
  std::cerr << "slim serve: stopped\n";
}

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve a model repository over KServe v2 REST and gRPC, with Prometheus metrics");
  cmd->add_option("--model-repository", o->server.repository,
                  "Triton-style repository: MODEL/config.pbtxt|config.json and MODEL/VERSION/model.onnx|.json|.ubj|"
                  ".txt|.slimf")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--host", o->host, "Address the front doors bind (default 0.0.0.0)");
  cmd->add_option("--http-port", o->http_port, "KServe v2 REST port (0: a free port; default 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--grpc-port", o->grpc_port, "KServe v2 gRPC port (0: a free port; default 8001)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-port", o->metrics_port, "Prometheus metrics port (0: a free port; default 8002)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--allow-http", o->allow_http, "Serve REST (default true)");
  cmd->add_option("--allow-grpc", o->allow_grpc, "Serve gRPC (default true)");
  cmd->add_option("--allow-metrics", o->allow_metrics, "Serve metrics (default true)");
  cmd->add_option("--model-control-mode", o->control,
                  "none: load every model at start; explicit: load --load-model ones, then the repository API")
      ->check(CLI::IsMember({"none", "explicit"}));
  cmd->add_option("--load-model", o->server.load_models, "Model to load at start in explicit mode ('*': all)");
  add_threads_option(cmd, &o->server.threads);
  add_isa_option(cmd);
  cmd->add_option("--max-queue-size", o->server.max_queue_size,
                  "Queue bound per model and priority level where the config sets none (default 4096)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-tensor-elements", o->server.max_tensor_elements,
                  "Largest input tensor, in elements (default 2^28)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body or gRPC message (default 64 MiB)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-connections", o->max_connections, "HTTP connections served at once (default 64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--request-timeout-ms", o->request_timeout_ms,
                  "Longest a request may wait in a queue (0: only the models' own queue policies)");
  cmd->add_option("--exit-timeout-secs", o->exit_timeout_secs,
                  "How long SIGTERM waits for requests in flight (default 30)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--access-log", o->access_log, "Log one JSON line per HTTP request on stderr");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace

SLIM_COMMAND(50, add_serve);

}  // namespace slim::cli
