// InferenceServer: the protocol-neutral core of `slim serve`. It owns the model
// repository, one scheduler per served model version, and the metrics; the front doors
// (KServe v2 REST and gRPC, the Prometheus endpoint) translate their protocol into these
// calls and back, nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/tensor_model.h"
#include "slim/energy/carbon.h"
#include "slim/energy/meter.h"
#include "slim/serve/llm_service.h"
#include "slim/serve/memory_watch.h"
#include "slim/serve/inference.h"
#include "slim/serve/model_config.h"

namespace slim::serve {

struct ServerOptions {
  std::string repository;  // folder; empty: no repository (models added with add_model)
  // none: load every model at start-up; explicit: only `load_models` at start-up, the
  // repository API loads and unloads; poll: every model at start-up, then the repository
  // is polled every `poll_secs` and new or changed versions are loaded and swapped in,
  // removed models unloaded (Triton's --model-control-mode).
  enum class ModelControl { none, explicit_, poll };
  ModelControl model_control = ModelControl::none;
  int poll_secs = 15;
  // Public keys (PEM files) of the trusted signers: a version loads only if its model.sig
  // (OMS bundle) verifies with one of them over exactly the files in its folder.
  std::vector<std::string> require_signature_keys;
  std::string audit_log;  // hash-chained audit log of every load, refusal, swap, violation
  std::string audit_key;  // private key: each audited event is followed by a signed checkpoint
  // Every this many seconds the files of every serving version are hashed again; a
  // version whose files changed is taken out of service until they verify again (0: off).
  int integrity_interval_secs = 0;
  // Memory-aware variants: every this many seconds (0: off) the memory the server may use
  // is read (cgroup limits and PSI, or /proc/meminfo; `memory_source` names a folder of
  // cgroup v2 files to read instead) and a model whose config lists `variants` is switched
  // to a smaller one when memory runs short, back when it is plentiful (variant_policy).
  int memory_interval_secs = 2;
  std::string memory_source;
  VariantPolicy variant_policy;
  std::vector<std::string> load_models;  // explicit mode: loaded at start ("*": all)
  int threads = 0;                       // compute-thread budget, 0: hardware threads
  int64_t max_tensor_elements = int64_t(1) << 28;  // per input tensor
  int64_t max_queue_size = 4096;  // per model and level when the config sets no bound
  uint64_t request_timeout_us = 0;  // overall limit per request (0: none)
  LlmOptions llm;  // language models (GGUF) of the repository and --model
  // Energy metering (--energy): the meter read around every batch and step, the carbon
  // model that prices it (see EnergyLedger). None: off, at no cost to requests.
  std::optional<energy::MeterOptions> energy;
  energy::CarbonOptions carbon;
};

// The server's view of one version of a model, for metadata.
struct ModelMetadata {
  std::string name;
  std::vector<std::string> versions;  // served versions, newest first
  std::string platform;
  int64_t max_batch_size = 0;
  std::vector<TensorSpec> inputs;  // full shapes; -1 free (the batch dim when batching)
  std::vector<TensorSpec> outputs;
  // slim's own: the files' digest and the key that signed them, when the server hashed
  // (audit, integrity) or verified (signatures) the version ("" otherwise).
  std::string digest, signer;
  // The model's variants (config parameter `variants`, largest first) and the one it serves.
  std::vector<std::string> variants;
  std::string variant;
};

struct RepositoryEntry {
  std::string name;
  std::string version;  // "" for a model that is not loaded
  std::string state;    // "READY", "UNAVAILABLE", "LOADING"
  std::string reason;   // why it is not ready (a load error), else ""
};

class Repository;
class Metrics;

class InferenceServer {
 public:
  explicit InferenceServer(ServerOptions options);
  ~InferenceServer();  // stops the schedulers; callbacks of queued requests get `unavailable`
  InferenceServer(const InferenceServer&) = delete;
  InferenceServer& operator=(const InferenceServer&) = delete;

  // Scans the repository and loads the models the control mode says to. A model that
  // fails to load is logged (and reported by repository_index) and the others still load.
  void start();

  // Queues a request. `done` runs exactly once: inline when the request is refused before
  // it is queued (unknown model, bad input, full queue, shutting down), else from a
  // scheduler thread once the batch that holds it has run.
  void infer(InferRequest request, InferCallback done);
  InferResult infer_sync(InferRequest request);  // for tests and the CLI

  bool live() const;
  bool ready() const;  // started, not shutting down, and every model it should serve is ready
  bool model_ready(const std::string& name, const std::string& version = "") const;
  ModelMetadata model_metadata(const std::string& name, const std::string& version = "") const;
  // The config a model is served with, completed as Triton's is: the platform, and the
  // inputs and outputs read off the model where the config lists none.
  ModelConfig model_config(const std::string& name, const std::string& version = "") const;
  const ServerOptions& options() const;
  std::vector<RepositoryEntry> repository_index() const;
  void load_model(const std::string& name);    // (re)loads from the repository
  // Swaps the version served before the last (re)load back in (throws not_found when there
  // is none) and audits it.
  void rollback_model(const std::string& name);
  // One poll of the repository (poll mode runs it every poll_secs on its own thread) and
  // one integrity check of the serving versions; for tests and the CLI.
  void poll_repository();
  void check_integrity();
  void unload_model(const std::string& name);  // waits for its queued requests

  // Language models, served through the OpenAI front door. `add_language_model` serves a
  // GGUF file outside the repository (`slim serve --model`).
  void add_language_model(const std::string& name, const std::string& gguf_path);
  // Throws not_found for an unknown model, invalid_argument for one that is not a
  // language model, unavailable when it is not loaded.
  std::shared_ptr<LlmService> language_model(const std::string& name) const;
  std::vector<std::shared_ptr<LlmService>> language_models() const;  // ready ones, by name
  // Counts a request that a front door runs outside infer() (a generation) as in flight
  // until the returned handle is dropped; throws unavailable while shutting down.
  std::shared_ptr<void> hold_request();

  // Prometheus text exposition of every metric.
  std::string metrics_text() const;
  Metrics& metrics();

  // Stops accepting (ready() turns false, new requests get `unavailable`), then waits up
  // to `timeout` for queued and running requests to finish. Returns true when all did.
  bool shutdown(std::chrono::milliseconds timeout);

  // Requests accepted and not yet answered.
  int64_t in_flight() const;

  static constexpr const char* kName = "slim";
  static std::vector<std::string> extensions();  // KServe extensions slim implements

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slim::serve
