// `slim check URL`: probes a running model server (slim, any KServe v2 server, llama.cpp's
// llama-server) and prints a JSON capability report on stdout; its exit code says whether
// the server is healthy (see slim/serve/check.h).
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "slim/serve/check.h"

namespace slim::cli {
namespace {

void run_check(const serve::CheckOptions& o) {
  nlohmann::ordered_json report = serve::check_server(o);
  const serve::CheckVerdict verdict = serve::judge_report(report);
  report["problems"] = verdict.problems;
  report["exit_code"] = verdict.exit_code;
  std::cout << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  for (const std::string& p : verdict.problems) std::cerr << "slim check: " << p << "\n";
  if (verdict.exit_code != 0) std::exit(verdict.exit_code);  // main() knows success and slim::Error only
}

void add_check(CLI::App& app) {
  auto o = std::make_shared<serve::CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Probe a running model server (slim, KServe v2, llama-server) and print a JSON capability report");
  cmd->footer(
      "Probes KServe v2 REST (GET /v2, /v2/health/live|ready, POST /v2/repository/index when the server has the "
      "model_repository extension, GET /v2/models/M and /v2/models/M/config), KServe v2 gRPC (ServerLive, "
      "ServerReady, ServerMetadata, ModelMetadata) and the OpenAI API (GET /v1/models, /health). The report lists "
      "the protocols that answer, the server's name, version and extensions, slim's ISA, kernel set and signature "
      "requirement, and per model its versions (state, signed, signer, variant), inputs, outputs, batching and "
      "priority configuration, and a latency sample: --samples inferences with zeros of each input's shape (free "
      "dimensions 1), or 4-token greedy completions for OpenAI models. Fields a server does not give are null.\n\n"
      "Exit codes: 0 healthy (ready, every probe that ran succeeded); 1 a failure (not live or ready, a failed "
      "inference or probe, no known API at the URL); 2 the URL does not answer (refused, --timeout-ms passed) or "
      "is malformed; 3 a model version is unavailable because its signature or integrity check failed.");
  cmd->add_option("url", o->url, "The server's HTTP address, http://HOST[:PORT]")->required();
  cmd->add_option("--grpc", o->grpc,
                  "KServe v2 gRPC address HOST:PORT (default: the URL's host with port 8001 when the URL is on port "
                  "8000, where no answer is no failure; otherwise gRPC is not probed)");
  cmd->add_option("--timeout-ms", o->timeout_ms, "Connect and read limit of each request (default 3000)")
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--samples", o->samples, "Latency samples per model (default 5; 0: none)")
      ->check(CLI::Range(0, 1000));
  cmd->callback([o] { run_check(*o); });
}

}  // namespace

SLIM_COMMAND(51, add_check);

}  // namespace slim::cli
