// `slim serve`: the model server. A Triton-style model repository served over KServe v2
// REST and gRPC, with Prometheus metrics on a port of its own (Triton's flag names and
// default ports); GGUF language models (in the repository or --model FILE.gguf) answer the
// OpenAI API on the HTTP port. SIGTERM or SIGINT: readiness turns false, new requests are refused,
// requests in flight finish, then the process exits 0.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "energy_cli.h"
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
  std::string llm_file, llm_name, chat_template_file;
  int64_t kv_pool_mb = 0;
  EnergyArgs energy;
};

void run_serve(ServeOptions& o) {
  using Control = serve::ServerOptions::ModelControl;
  o.server.model_control = o.control == "explicit" ? Control::explicit_ : o.control == "poll" ? Control::poll : Control::none;
  check(o.server.model_control != Control::poll || !o.server.repository.empty(), ErrorCode::invalid_argument,
        "--model-control-mode poll needs --model-repository");
  o.server.request_timeout_us = o.request_timeout_ms * 1000;
  check(!o.server.repository.empty() || !o.llm_file.empty(), ErrorCode::invalid_argument,
        "give --model-repository DIR or --model FILE.gguf");
  o.server.llm.threads = o.server.threads;
  if (o.energy.on) {
    o.server.energy = meter_options(o.energy);
    o.server.carbon = o.energy.carbon;
  }
  o.server.llm.kv_pool_bytes = o.kv_pool_mb << 20;
  if (!o.chat_template_file.empty()) {
    std::ifstream f(o.chat_template_file, std::ios::binary);
    check(bool(f), ErrorCode::not_found, "cannot read the chat template " + o.chat_template_file);
    std::ostringstream text;
    text << f.rdbuf();
    o.server.llm.chat_template = text.str();
  }

  // Signals go to this thread only (sigwait below): every thread the server starts
  // inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const auto t0 = std::chrono::steady_clock::now();
  serve::InferenceServer server(o.server);
  if (!o.llm_file.empty())
    server.add_language_model(o.llm_name.empty() ? std::filesystem::path(o.llm_file).stem().string() : o.llm_name,
                              o.llm_file);
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
      "serve",
      "Serve a model repository over KServe v2 REST and gRPC, and language models over the OpenAI API, with "
      "Prometheus metrics");
  cmd->add_option("--model-repository", o->server.repository,
                  "Triton-style repository: MODEL/config.pbtxt|config.json and MODEL/VERSION/model.onnx|.json|.ubj|"
                  ".txt|.slimf|.gguf")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--model", o->llm_file, "A GGUF language model to serve over the OpenAI API (besides the repository)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model-name", o->llm_name, "Name of the --model model (default: the file name without .gguf)");
  auto& l = o->server.llm;
  cmd->add_option("--max-sequences,--parallel", l.max_sequences,
                  "Language models: sequences generated at once, per model (default 4)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--cache-sequences", l.cache_sequences,
                  "Language models: finished conversations whose KV stays for reuse by follow-ups with the same "
                  "prefix (default: as many as --max-sequences; 0: no prefix cache)")
      ->check(CLI::Range(-1, 1024));
  cmd->add_option("--ctx-size,-c", l.n_ctx,
                  "Language models: context per sequence in tokens (default: the model's, at most 4096)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-type", l.kv_type, "Language models: KV cache format f16, q8, q4 or f32 (default f16)")
      ->check(CLI::IsMember({"f32", "f16", "q8", "q4"}));
  cmd->add_option("--kv-policy", l.kv_policy,
                  "Language models: KV eviction policy (streaming, h2o, snapkv, pyramid, entropy; default: keep every "
                  "token); turns the prefix cache off");
  cmd->add_option("--kv-budget", l.kv_budget, "Budget of --kv-policy: 0.25, 25% or a token count (default 0.5)");
  cmd->add_option("--kv-pool-mb", o->kv_pool_mb,
                  "Language models: KV pool per model in MiB (default: every sequence at full context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prefill-chunk", l.prefill_chunk,
                  "Language models: most prompt tokens of one sequence per step, so that long prompts do not stall "
                  "running streams (default 128)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--default-priority", l.default_priority,
                  "Language models: priority of requests that give none (lower is more urgent; default 0)")
      ->check(CLI::Range(-1000, 1000));
  cmd->add_option("--max-llm-queue", l.max_queue,
                  "Language models: requests per priority level in flight; more get 429 (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--chat-template", o->chat_template_file,
                  "Jinja chat template for language models, instead of the GGUF's tokenizer.chat_template")
      ->check(CLI::ExistingFile);
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
                  "none: load every model at start; explicit: load --load-model ones, then the repository API; "
                  "poll: load every model, then poll the repository and hot-swap new or changed versions")
      ->check(CLI::IsMember({"none", "explicit", "poll"}));
  cmd->add_option("--repository-poll-secs", o->server.poll_secs,
                  "Poll mode: seconds between two looks at the repository; a changed model loads once it looks the "
                  "same on two polls in a row (default 15)")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--require-signature", o->server.require_signature_keys,
                  "Public key (PEM) of a trusted signer, repeatable: a version loads only if its model.sig (slim sign "
                  "REPO/MODEL/VERSION) verifies with one of them over exactly its files")
      ->check(CLI::ExistingFile);
  cmd->add_option("--audit-log", o->server.audit_log,
                  "Append every load, refusal, swap, rollback and integrity failure to this hash-chained audit log "
                  "(slim audit show LOG --model M)");
  cmd->add_option("--audit-key", o->server.audit_key,
                  "Private key (PEM): each audited event is followed by a checkpoint signed with it")
      ->check(CLI::ExistingFile);
  cmd->add_option("--integrity-interval-secs", o->server.integrity_interval_secs,
                  "Hash the serving versions' files again every N seconds; a version whose files changed stops "
                  "serving until they verify again (0: off)")
      ->check(CLI::NonNegativeNumber);
  serve::VariantPolicy& vp = o->server.variant_policy;
  cmd->add_option("--memory-interval-secs", o->server.memory_interval_secs,
                  "Read the memory the server may use every N seconds and switch models whose config lists "
                  "'variants' to a smaller one when it runs short, back when it is plentiful (0: off; default 2)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--memory-source", o->server.memory_source,
                  "Folder of cgroup v2 memory files (memory.max, memory.current, memory.pressure, ...) to read "
                  "instead of the process's own cgroup or /proc/meminfo")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--variant-low-headroom", vp.low_headroom,
                  "Step a model down when available memory falls below this share of the limit (default 0.15)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--variant-high-headroom", vp.high_headroom,
                  "Step a model up when available memory stays above this share with the larger variant (default 0.35)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--variant-pressure", vp.pressure_down,
                  "Step a model down when memory pressure (PSI some avg10, percent) is above this (default 10)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option_function<int>(
         "--variant-min-dwell-secs", [o](int s) { o->server.variant_policy.min_dwell = std::chrono::seconds(s); },
         "A model keeps a variant at least this long (default 30)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option_function<int>(
         "--variant-settle-secs", [o](int s) { o->server.variant_policy.settle = std::chrono::seconds(s); },
         "No other switch for this long after one, so the memory it frees shows first (default 5)")
      ->check(CLI::NonNegativeNumber);
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
  add_energy_options(cmd, &o->energy);
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace

SLIM_COMMAND(50, add_serve);

}  // namespace slim::cli
