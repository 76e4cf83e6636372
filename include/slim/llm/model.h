// Llama-family language models from GGUF (llama, mistral, qwen2, and the Mixture-of-Experts
// layouts Mixtral and qwen2moe): LlamaModel loads and validates the weights, LlamaContext
// owns a KV cache and all scratch memory and runs batched prefill and decode without allocating.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slim/core/thread_pool.h"
#include "slim/llm/gguf.h"
#include "slim/llm/kv_cache.h"
#include "slim/llm/kv_policy.h"

namespace slim::llm {

struct LlamaConfig {
  std::string arch;  // "llama", "deci", "mistral", "qwen2" or "qwen2moe"
  // n_head, n_head_kv and n_ff are the widest layer's; a pruned model's layers may be
  // narrower (LayerWeights::n_head_kv, n_ff), with the same query heads per KV head.
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  // Mixture of Experts (n_expert > 0): every layer routes each token to n_expert_used of
  // n_expert experts of n_ff_exp hidden units; n_ff_shexp > 0 adds a shared expert that
  // every token passes, scaled by a sigmoid gate (qwen2moe). expert_norm: the top-k
  // weights are renormalized to sum 1 (Mixtral), else they stay softmax probabilities.
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  bool expert_norm = false;
  int n_vocab = 0, n_ctx_train = 0, n_rot = 0;
  float rms_eps = 1e-5f, rope_base = 10000.f;
  bool rope_neox = false;     // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  bool qkv_bias = false;      // qwen2, qwen2moe
  bool tied_output = false;   // no output.weight: the embedding doubles as output matrix
};

// A weight matrix of `rows` rows of `cols` elements, stored in a GGML type.
struct WeightMatrix {
  GgmlType type = GgmlType::f32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  std::string name;
  // Rows repacked at load, 16 at a time, for the kernel set's 16-row tile (repack_x16,
  // tile16_fn); otherwise rows are in the GGUF layout.
  bool x16 = false;
};

struct LayerWeights {
  // This layer's KV heads (query heads: n_head_kv * n_head / n_head_kv of the config) and
  // dense feed-forward width: GGUF's per-layer arrays (`head_count_kv`, `feed_forward_length`).
  int n_head_kv = 0, n_ff = 0;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  // w_gate, w_up and w_down: the dense feed-forward network, or a MoE layer's shared
  // expert (absent without one: data == nullptr).
  WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  // MoE: the router (ffn_gate_inp, a row per expert), each expert's matrices as views into
  // the file's 3-D ffn_{gate,up,down}_exps tensors, and the shared expert's gate (one row).
  WeightMatrix router, shexp_gate;
  std::vector<WeightMatrix> gate_exps, up_exps, down_exps;
};

// The work of a MoE model's experts: tokens routed to each (layer, expert) and the FLOPs
// that cost, the shared expert apart and the rest of the forward pass as one figure, so
// that energy measured for the same work can be split over the experts by FLOPs.
struct ExpertUsage {
  int n_layer = 0, n_expert = 0;
  std::vector<int64_t> routed;     // [layer * n_expert + expert]: tokens routed there
  int64_t tokens = 0;              // tokens evaluated; each passes every layer's shared expert
  double expert_token_flops = 0;   // one token through one routed expert (gate, up, down)
  double shared_token_flops = 0;   // one token through one layer's shared expert and its gate
  double other_flops = 0;          // the rest: attention, routers, output head
  int64_t count(int layer, int expert) const { return routed[size_t(layer) * size_t(n_expert) + size_t(expert)]; }
  double expert_flops(int layer, int expert) const { return double(count(layer, expert)) * expert_token_flops; }
  double shared_flops() const { return double(tokens) * n_layer * shared_token_flops; }
  double total_flops() const;
  void add(const ExpertUsage& other);  // of the same model
  void clear();
};

class LlamaModel {
 public:
  // load: validates architecture metadata and every tensor's presence, type and shape.
  // The weights are read into huge-page-backed memory (decode streams them on every
  // token; 2 MiB pages make that 13-19% faster than the file's 4 KiB pages); `map` uses
  // them in place from the file's page cache instead (less memory, faster load).
  // Resident Q8_0, Q4_0 and Q4_K matrices (not the token embeddings) with rows in
  // multiples of 16 are repacked in place for the kernel set's 16-row tiles where it has
  // them.
  static std::shared_ptr<const LlamaModel> load(const std::string& path, bool map = false);

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
  // Parameters one token passes through: n_params() less the experts it is not routed to.
  int64_t n_active_params() const;

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

// The paged KV cache (kv_cache.h): keys and values in pool blocks per layer and KV head,
// quantized per layer, pruned by an eviction policy, shared by several sequences.
struct KvOptions {
  bool paged = false;  // false: one contiguous f16/f32 cache (ContextOptions::f16_kv)
  KvType k_type = KvType::f16, v_type = KvType::f16;
  std::vector<KvType> layer_k, layer_v;  // per-layer overrides (empty: every layer as above)
  int max_seqs = 1;                      // sequences sharing the pool
  int64_t pool_bytes = 0;                // 0: room for pool_seqs full-context sequences
  int pool_seqs = 0;                     // 0: max_seqs (fewer: the other slots live in what they leave)
  int q4_recent_blocks = 2;              // q4 layers: newest blocks kept in f16
  bool q8_recent = true;                 // q8 layers keep that f16 recent window too
  std::shared_ptr<const KvPolicy> policy;  // null: keep every token
  int evict_slack = 0;  // a stream may grow this far past its budget before eviction (amortizes it)
};

struct ContextOptions {
  int n_ctx = 0;        // 0: the training context, capped at 4096
  int n_batch = 512;    // most tokens per forward pass; longer inputs are split
  bool f16_kv = true;   // f16 KV cache (as llama.cpp); false keeps f32 for exact checks
  int n_threads = 0;    // 0: all hardware threads
  bool all_logits = false;  // keep logits of every token of a batch (perplexity)
  // Called in every forward pass with each dense layer's attention output before its output
  // projection (ffn = false) and its feed-forward hidden units after SwiGLU (ffn = true):
  // n rows of `cols` values, `ld` apart. Pruning's calibration statistics (llm/prune.h).
  std::function<void(int layer, bool ffn, const float* x, int n, int64_t ld, int64_t cols)> observe;
  KvOptions kv;
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

  // MoE models: the experts' work for a sequence (0 outside the paged cache) since it was
  // added or cleared, and over the context's life; n_expert == 0 for dense models.
  const ExpertUsage& expert_usage(int seq = 0) const;
  const ExpertUsage& expert_usage_total() const { return usage_total_; }
  void clear_expert_usage(int seq = 0);

  // Paged cache only (options.kv.paged). The single-sequence calls above act on
  // sequence 0, which exists from the start; more come from add_sequence/fork_sequence.
  KvCache& kv_cache();
  const KvCache& kv_cache() const;
  int add_sequence();
  int fork_sequence(int src, int n_tokens);  // shares the prefix's blocks
  void remove_sequence(int seq);
  struct SeqTokens {
    int seq;
    std::span<const int32_t> tokens;
  };
  // One forward pass over the tokens of several distinct sequences (at most n_batch in
  // all): every weight matrix is read once for the whole batch. Checks that everything
  // fits (context, pool blocks) before changing anything; resource_exhausted otherwise.
  void eval_sequences(std::span<const SeqTokens> batch);
  // Logits of the last token of entry i of the last eval_sequences.
  const float* sequence_logits(int i) const;
  int64_t evicted_tokens() const { return evicted_; }

 private:
  struct State;
  struct Entry {
    int seq, row0, n, p0;
  };
  void eval_batch(const int32_t* tokens, int n);
  void forward(const int32_t* tokens, int n, std::span<const Entry> entries);
  std::shared_ptr<const LlamaModel> model_;
  ContextOptions options_;
  int n_ctx_ = 0, n_past_ = 0, last_batch_ = 0;
  int64_t evicted_ = 0;
  std::vector<Entry> last_entries_;
  std::vector<ExpertUsage> usage_;  // per sequence slot
  ExpertUsage usage_total_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<State> s_;
};

}  // namespace slim::llm
