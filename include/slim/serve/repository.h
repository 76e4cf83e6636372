// Repository: a folder of models in Triton's layout, REPO/<model>/config.pbtxt (or
// config.json, or no config: it is then read off the model) and REPO/<model>/<version>/
// with one model file (a GGUF file makes it a language model, served by the OpenAI front
// door instead of KServe v2), or several variants of it that the config's `variants`
// parameter lists (the server picks one by the memory it has). Loading a model reads its config, checks it against the model's
// real inputs and outputs, and builds one scheduler per version its version policy
// serves. A loaded model is immutable: the server swaps whole LoadedModels atomically.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slim/core/tensor_model.h"
#include "slim/serve/batcher.h"
#include "slim/serve/llm_service.h"
#include "slim/serve/model_guard.h"
#include "slim/serve/metrics.h"
#include "slim/serve/model_config.h"

namespace slim::serve {

// One tensor as the protocol shows it, and how it maps onto the model's own tensor.
struct ServedTensor {
  TensorSpec spec;         // config name, dtype and full shape (-1 first when batching)
  Shape sample_dims;       // the config's dims (after the batch dim when batching)
  Shape model_sample_dims; // the model's, when they differ (a reshape); else empty
};

struct LoadedVersion {
  int64_t version = 0;
  std::string name;  // the version as a string
  std::unique_ptr<DynamicBatcher> batcher;  // tensor models
  std::shared_ptr<LlmService> llm;          // language models (GGUF), served by the OpenAI front door
  int64_t memory_bytes = 0;  // weights and planned buffers of every instance
  std::string dir;           // the version folder
  std::optional<VerifiedVersion> verified;  // its files as hashed (and signature-checked) at load
};

struct LoadedModel {
  std::string name;
  ModelConfig config;
  std::string platform;  // "onnxruntime_onnx", "slim_forest" or "slim_llm"
  std::vector<ServedTensor> inputs, outputs;
  BatchPolicy policy;
  std::map<int64_t, std::shared_ptr<LoadedVersion>, std::greater<>> versions;  // newest first
  // Memory-aware variants (config parameter `variants`: model files of each version folder,
  // largest first): their names, bytes (file sizes summed over the served versions) and
  // the one this load serves. Empty when the config lists none.
  std::vector<std::string> variants;
  std::vector<int64_t> variant_bytes;
  size_t variant = 0;
  ~LoadedModel();  // stops the schedulers, draining what they hold
};

struct LoadOptions {
  int threads = 0;                // kernel threads of each ONNX session
  int64_t max_queue_size = 4096;  // per level when the config sets no bound
  Metrics* metrics = nullptr;
  EnergyLedger* energy = nullptr;  // slim serve --energy
  LlmOptions llm;  // language models
  // Hash every version's files before loading them (the integrity check and the audit
  // need the digests); with keys, a version loads only if its model.sig verifies with one.
  bool hash_versions = false;
  std::span<const trust::PublicKey> trusted_keys;
  // Which of a model's variants to load, given their bytes (largest first); none: the first.
  std::function<size_t(const std::vector<int64_t>& variant_bytes)> choose_variant;
};

class Repository {
 public:
  explicit Repository(std::string root);
  const std::string& root() const { return root_; }
  // Sub-folders that hold a model (a config file or a numeric version folder), sorted.
  std::vector<std::string> model_names() const;
  // Loads every version of `name` its version policy serves. Throws not_found for an
  // unknown name, invalid_model / unsupported naming the file for anything wrong.
  std::shared_ptr<LoadedModel> load(const std::string& name, const LoadOptions& options,
                                    std::vector<std::string>* warnings) const;

 private:
  std::string root_;
};

// Builds a model version's executors from one model file (.onnx, a forest file).
// `batch_sizes`: how many batch sizes the scheduler may run (max_batch_size), so an ONNX
// session keeps a compiled plan for each instead of recompiling as sizes alternate.
std::vector<std::shared_ptr<TensorModel>> load_model_file(const std::string& path, int instances, int threads,
                                                          int64_t batch_sizes, int64_t* memory_bytes,
                                                          std::string* platform);

}  // namespace slim::serve
