// Paged KV cache for the language-model engine: one KvBlockPool, reserved up front from a
// byte budget, hands out blocks of kKvBlockTokens tokens; every sequence keeps one block
// table ("stream") per layer and KV head, so eviction policies can keep different tokens
// per head, sequences can share a prompt prefix (refcounted blocks, copy on write), and
// keys and values can be stored F32, F16, Q8 or 4-bit (KIVI) with attention reading them
// in place.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/llm/kernels.h"
#include "slim/llm/kv_attention.h"

namespace slim::llm {

// Storage format of keys or values of one layer.
//   f32, f16: plain rows.
//   q8: int8 per element, one f32 scale per token and head (absmax / 127).
//   q4: 4-bit codes with an f16 scale and minimum; keys per channel over the 16 tokens of
//       a block, values per token (KIVI). The newest tokens of a q4 stream wait in f16
//       ("recent window") until a whole block of them can be quantized.
enum class KvType { f32, f16, q8, q4 };
KvType parse_kv_type(const std::string& name);  // "f32", "f16", "q8", "q4"
const char* kv_type_name(KvType t);
// Bytes of kKvBlockTokens tokens of one head (keys when is_key, else values).
int64_t kv_block_part_bytes(KvType t, int head_dim, bool is_key);

// Refcounted fixed-size blocks carved out of one reservation. Allocation never goes to
// the system allocator: when the blocks are used up the caller gets resource_exhausted
// (or checks free_blocks() first and waits).
class KvBlockPool {
 public:
  KvBlockPool(int64_t block_bytes, int64_t budget_bytes);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  int32_t allocate();  // refcount 1; throws resource_exhausted when none is free
  void retain(int32_t block);   // one more owner (prefix sharing)
  void release(int32_t block);  // frees the block when the last owner lets go
  int refcount(int32_t block) const;
  uint8_t* data(int32_t block) { return base_ + int64_t(block) * block_bytes_; }
  const uint8_t* data(int32_t block) const { return base_ + int64_t(block) * block_bytes_; }

  int64_t block_bytes() const { return block_bytes_; }
  int64_t capacity() const { return int64_t(refs_.size()); }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int64_t used_blocks() const { return capacity() - free_blocks(); }
  int64_t peak_used() const { return peak_; }
  int64_t allocations() const { return allocations_; }
  int64_t shared_refs() const { return shared_refs_; }  // retains beyond the first owner
  // Share of block acquisitions served by sharing an existing block instead of a new one.
  double reuse_rate() const;

 private:
  std::shared_ptr<Storage> memory_;
  uint8_t* base_ = nullptr;
  int64_t block_bytes_ = 0;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  int64_t peak_ = 0, allocations_ = 0, shared_refs_ = 0;
};

// What a KV cache stores: the model's shape and a format per layer for K and V.
struct KvLayout {
  int n_layer = 0, n_head_kv = 0, head_dim = 0;  // n_head_kv: the widest layer's
  // KV heads of each layer when they differ (structurally pruned models); empty: n_head_kv
  // in every layer. A layer's streams, blocks and recent windows are its own heads only.
  std::vector<int> layer_heads;
  int heads(int layer) const { return layer_heads.empty() ? n_head_kv : layer_heads[size_t(layer)]; }
  int64_t total_heads() const {
    int64_t n = 0;
    for (int l = 0; l < n_layer; ++l) n += heads(l);
    return n;
  }
  std::vector<KvType> k_type, v_type;  // one per layer
  int q4_recent_blocks = 2;            // f16 recent window of quantized streams, in blocks
  bool q8_recent = false;              // q8 layers keep that recent window too
  bool has_q4(int layer) const { return k_type[size_t(layer)] == KvType::q4 || v_type[size_t(layer)] == KvType::q4; }
  // Layers whose newest tokens wait in the f16 recent window before they are encoded.
  bool staged(int layer) const {
    return has_q4(layer) ||
           (q8_recent && (k_type[size_t(layer)] == KvType::q8 || v_type[size_t(layer)] == KvType::q8));
  }
};

// One layer and KV head of one sequence: its tokens in order of position.
struct KvStream {
  std::vector<int32_t> blocks;
  int n = 0;         // tokens held
  int n_staged = 0;  // q4 layers: the newest n_staged tokens are in the f16 recent window
  std::vector<int32_t> pos;    // original position of each token
  std::vector<float> score;    // attention mass observed for each token (eviction policies)
  std::vector<float> value_norm;  // L1 norm of each token's value as appended (value-aware policies)
  double entropy_sum = 0;      // of the observed attention rows (entropy policy)
  int64_t entropy_count = 0;
  uint16_t* stage_k = nullptr;  // q4 layers: [kKvBlockTokens * q4_recent_blocks][head_dim]
  uint16_t* stage_v = nullptr;
};

struct KvCacheStats {
  int64_t block_bytes = 0, blocks_total = 0, blocks_used = 0, blocks_free = 0, peak_blocks = 0;
  int64_t tokens = 0;          // token slots filled, over all streams
  int64_t unused_slots = 0;    // empty slots in partly filled blocks
  int64_t staged_tokens = 0;   // tokens in q4 recent windows (outside the pool)
  int64_t bytes_used = 0;      // blocks in use plus the filled part of recent windows
  double fragmentation = 0;    // unused_slots / slots of used blocks
  double reuse_rate = 0;
  int active_sequences = 0;
};

// Which attention rows a policy wants to see, and where to put what it learns.
struct KvObserver {
  bool accumulate = false;  // add each observed row's probabilities to stream.score
  bool entropy = false;     // add each observed row's entropy to stream.entropy_sum
  float decay = 1.f;        // with accumulate: stream.score is scaled by this before each observed row
};

class KvCache {
 public:
  // max_tokens bounds one stream (the context size); pool_bytes 0 sizes the pool for
  // pool_seqs full-length sequences (0: max_seqs).
  KvCache(KvLayout layout, int max_seqs, int max_tokens, int64_t pool_bytes, int pool_seqs = 0);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  KvBlockPool& pool() { return *pool_; }
  const KvBlockPool& pool() const { return *pool_; }
  int max_seqs() const { return int(seqs_.size()); }
  int max_tokens() const { return max_tokens_; }

  int add_sequence();  // resource_exhausted when every slot is taken
  // A new sequence that shares the tokens of `src` at positions < n_tokens (whole blocks
  // by reference, the rest copied).
  int fork_sequence(int src, int n_tokens);
  // Blocks such a fork would share with src instead of taking from the pool.
  int64_t fork_shared_blocks(int src, int n_tokens) const;
  void remove_sequence(int seq);
  bool active(int seq) const;
  int n_past(int seq) const;  // positions seen (evicted tokens included)
  void set_n_past(int seq, int n);
  KvStream& stream(int seq, int layer, int kv_head);
  const KvStream& stream(int seq, int layer, int kv_head) const;

  // Blocks that appending n tokens to seq would take from the pool (copy-on-write included).
  int64_t blocks_needed(int seq, int n) const;
  // Throws resource_exhausted (changing nothing) unless n more tokens of seq fit.
  void check_append(int seq, int n) const;
  // Appends one token of one layer: k and v hold the layer's KV heads, head_dim apart.
  void append(int seq, int layer, int pos, const float* k, const float* v);
  // Keeps only the listed token indices (ascending) of one stream; frees what is left.
  void keep(int seq, int layer, int kv_head, std::span<const int32_t> keep);
  // Forgets positions >= n in every stream of seq.
  void truncate(int seq, int n);

  // Attention over the first n_visible[r] tokens of one stream for n_q rows, each of
  // n_group queries (the query heads sharing this KV head, head_dim apart, rows q_stride
  // apart): out = softmax(q k^T * scale) v, laid out like q. scratch holds
  // scratch_floats(n_group). observe[r] says which rows the observer sees.
  void attend(int seq, int layer, int kv_head, const float* q, int64_t q_stride, int n_q, int n_group,
              const int* n_visible, const uint8_t* observe, const KvObserver& obs, float scale, float* out,
              int64_t out_stride, float* scratch) const;
  int64_t scratch_floats(int n_group = 1) const;

  // Key and value of token i of a stream, in f32 (tests, compaction).
  void read_token(int seq, int layer, int kv_head, int i, float* k, float* v) const;
  KvCacheStats stats() const;
  // Bytes the KV of one sequence takes now (its blocks, shared ones counted in full, and
  // its recent windows).
  int64_t sequence_bytes(int seq) const;

 private:
  struct Sequence {
    bool active = false;
    int n_past = 0;
    std::vector<KvStream> streams;  // [first_stream_[layer] + head]
  };
  int64_t k_bytes(int layer) const { return k_bytes_[size_t(layer)]; }
  int64_t v_bytes(int layer) const { return v_bytes_[size_t(layer)]; }
  void write_token(int layer, uint8_t* block, int slot, const float* k, const float* v);
  void flush_stage(int layer, KvStream& s);
  void make_private(KvStream& s, size_t block_index);
  void rebuild_from(int layer, KvStream& s, int first, std::span<const int32_t> keep);
  void clear_stream(KvStream& s);

  KvLayout layout_;
  std::vector<int64_t> first_stream_;  // per layer: the index of its head 0's stream
  int max_tokens_ = 0;
  std::vector<int64_t> k_bytes_, v_bytes_;
  std::unique_ptr<KvBlockPool> pool_;
  std::vector<Sequence> seqs_;
  std::vector<uint16_t> staging_;  // recent windows of every q4 stream of every sequence slot
  std::vector<float> rebuild_k_, rebuild_v_;
  const KernelSet* k_ = nullptr;
};

}  // namespace slim::llm
