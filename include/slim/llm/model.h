// Llama-family language models from GGUF (llama, qwen2): LlamaModel loads and validates
// the weights (used in place from the memory map), LlamaContext owns a KV cache and all
// scratch memory and runs batched prefill and single-token decode without allocating.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slim/core/thread_pool.h"
#include "slim/llm/gguf.h"

namespace slim::llm {

struct LlamaConfig {
  std::string arch;  // "llama" or "qwen2"
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  int n_vocab = 0, n_ctx_train = 0, n_rot = 0;
  float rms_eps = 1e-5f, rope_base = 10000.f;
  bool rope_neox = false;     // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  bool qkv_bias = false;      // qwen2
  bool tied_output = false;   // no output.weight: the embedding doubles as output matrix
};

// A weight matrix of `rows` rows of `cols` elements, stored in a GGML type.
struct WeightMatrix {
  GgmlType type = GgmlType::f32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  std::string name;
};

struct LayerWeights {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
};

class LlamaModel {
 public:
  // load: validates architecture metadata and every tensor's presence, type and shape.
  static std::shared_ptr<const LlamaModel> load(const std::string& path);

  const LlamaConfig& config() const { return config_; }
  const GgufFile& gguf() const { return *gguf_; }
  std::shared_ptr<const GgufFile> gguf_ptr() const { return gguf_; }
  const WeightMatrix& token_embd() const { return token_embd_; }
  const WeightMatrix& output() const { return output_; }
  const float* output_norm() const { return output_norm_.data(); }
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  // Token ids GGUF metadata names (-1 when absent).
  int bos_token() const { return bos_; }
  int eos_token() const { return eos_; }
  int64_t n_params() const;

 private:
  LlamaModel() = default;
  const float* store(std::vector<float> v) {
    f32_store_.push_back(std::move(v));
    return f32_store_.back().data();
  }
  std::shared_ptr<const GgufFile> gguf_;
  LlamaConfig config_;
  WeightMatrix token_embd_, output_;
  std::vector<LayerWeights> layers_;
  // Norm vectors and biases converted to f32 at load (they are tiny).
  std::vector<std::vector<float>> f32_store_;
  std::vector<float> output_norm_;
  int bos_ = -1, eos_ = -1;
  friend class ModelLoader;
};

struct ContextOptions {
  int n_ctx = 0;        // 0: the training context, capped at 4096
  int n_batch = 512;    // most tokens per forward pass; longer inputs are split
  bool f16_kv = true;   // f16 KV cache (as llama.cpp); false keeps f32 for exact checks
  int n_threads = 0;    // 0: all hardware threads
  bool all_logits = false;  // keep logits of every token of a batch (perplexity)
};

class LlamaContext {
 public:
  // compile: sizes the KV cache, scratch and logits buffers; nothing is allocated later.
  LlamaContext(std::shared_ptr<const LlamaModel> model, ContextOptions options);
  ~LlamaContext();
  LlamaContext(const LlamaContext&) = delete;
  LlamaContext& operator=(const LlamaContext&) = delete;

  // Appends tokens to the sequence and runs them through the model. Throws
  // invalid_argument for token ids outside the vocabulary and resource_exhausted when
  // the context is full.
  void eval(std::span<const int32_t> tokens);
  // Logits after the last eval: of its last token, or of token i when all_logits is set.
  const float* logits() const;
  const float* logits(int i) const;
  int n_past() const { return n_past_; }
  int n_ctx() const { return n_ctx_; }
  // Forgets positions >= n (e.g. to reuse a shared prompt prefix).
  void truncate(int n);
  void reset() { truncate(0); }
  const LlamaModel& model() const { return *model_; }
  const char* kernel_isa() const;

 private:
  struct State;
  void eval_batch(const int32_t* tokens, int n);
  std::shared_ptr<const LlamaModel> model_;
  ContextOptions options_;
  int n_ctx_ = 0, n_past_ = 0, last_batch_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<State> s_;
};

}  // namespace slim::llm
