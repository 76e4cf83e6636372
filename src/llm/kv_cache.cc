#include "slim/llm/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "slim/core/error.h"
#include "slim/core/half.h"
#include "slim/llm/kv_attention.h"

namespace slim::llm {

KvType parse_kv_type(const std::string& name) {
  if (name == "f32") return KvType::f32;
  if (name == "f16") return KvType::f16;
  if (name == "q8" || name == "q8_0") return KvType::q8;
  if (name == "q4" || name == "4bit" || name == "kivi") return KvType::q4;
  throw Error(ErrorCode::invalid_argument, "unknown KV type '" + name + "' (f32, f16, q8, q4)");
}

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "f32";
    case KvType::f16: return "f16";
    case KvType::q8: return "q8";
    case KvType::q4: return "q4";
  }
  return "?";
}

int64_t kv_block_part_bytes(KvType t, int head_dim, bool is_key) {
  const int64_t n = kKvBlockTokens;
  switch (t) {
    case KvType::f32: return n * head_dim * 4;
    case KvType::f16: return n * head_dim * 2;
    case KvType::q8: return n * head_dim + n * 4;
    case KvType::q4: return n * head_dim / 2 + (is_key ? int64_t(head_dim) : n) * 4;
  }
  return 0;
}

// ---------------------------------------------------------------- pool

KvBlockPool::KvBlockPool(int64_t block_bytes, int64_t budget_bytes) : block_bytes_((block_bytes + 63) / 64 * 64) {
  if (block_bytes <= 0) throw Error(ErrorCode::invalid_argument, "KV pool: block size must be positive");
  const int64_t n = budget_bytes / block_bytes_;
  if (n <= 0)
    throw Error(ErrorCode::resource_exhausted, "KV pool: budget of " + std::to_string(budget_bytes) +
                                                   " bytes holds no block of " + std::to_string(block_bytes_) + " bytes");
  if (n > INT32_MAX) throw Error(ErrorCode::invalid_argument, "KV pool: budget holds more than 2^31 blocks");
  // Pages are committed by the OS when first written, so a generous budget costs address
  // space, not memory; the pool never asks the allocator again. A large pool is a mapping
  // of its own in transparent huge pages (Storage::allocate): attention reads each
  // sequence's blocks from all over the pool, and in 4 KiB pages (in a VM above all) the
  // TLB misses cost a third of that time (microbenchmark: 38 -> 26 ns per key and value
  // row of a 128 MB pool).
  try {
    memory_ = Storage::allocate(size_t(n * block_bytes_));
  } catch (const Error&) {
    throw Error(ErrorCode::resource_exhausted, "KV pool: cannot reserve " + std::to_string(n * block_bytes_) + " bytes");
  }
  base_ = static_cast<uint8_t*>(memory_->data());
  refs_.assign(size_t(n), 0);
  free_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) free_[size_t(i)] = int32_t(n - 1 - i);  // block 0 first
}

int32_t KvBlockPool::allocate() {
  if (free_.empty())
    throw Error(ErrorCode::resource_exhausted, "KV pool exhausted: all " + std::to_string(capacity()) + " blocks of " +
                                                   std::to_string(block_bytes_) + " bytes are in use");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[size_t(b)] = 1;
  ++allocations_;
  peak_ = std::max(peak_, used_blocks());
  return b;
}

void KvBlockPool::retain(int32_t b) {
  if (b < 0 || b >= capacity() || refs_[size_t(b)] <= 0)
    throw Error(ErrorCode::internal, "KV pool: retain of unowned block " + std::to_string(b));
  ++refs_[size_t(b)];
  ++shared_refs_;
}

void KvBlockPool::release(int32_t b) {
  if (b < 0 || b >= capacity() || refs_[size_t(b)] <= 0)
    throw Error(ErrorCode::internal, "KV pool: release of unowned block " + std::to_string(b));
  if (--refs_[size_t(b)] == 0) free_.push_back(b);
}

int KvBlockPool::refcount(int32_t b) const {
  if (b < 0 || b >= capacity()) throw Error(ErrorCode::invalid_argument, "KV pool: no block " + std::to_string(b));
  return refs_[size_t(b)];
}

double KvBlockPool::reuse_rate() const {
  const int64_t total = allocations_ + shared_refs_;
  return total ? double(shared_refs_) / double(total) : 0.0;
}

// ---------------------------------------------------------------- block formats

namespace {

// Where a block part's per-token (q8) or per-channel/per-token (q4) scales start: after
// the codes of its kKvBlockTokens rows.
template <typename T, typename P>
T* q8_scales(P* part, int hd) {
  return reinterpret_cast<T*>(part + int64_t(kKvBlockTokens) * hd);
}
template <typename T, typename P>
T* q4_scales(P* part, int hd) {
  return reinterpret_cast<T*>(part + int64_t(kKvBlockTokens) * hd / 2);
}

// Per-token rows of a block part: where token `slot` lives and how to (de)code it.
void encode_row(KvType t, uint8_t* part, int slot, const float* x, int hd) {
  switch (t) {
    case KvType::f32: std::memcpy(part + int64_t(slot) * hd * 4, x, size_t(hd) * 4); return;
    case KvType::f16: {
      uint16_t* y = reinterpret_cast<uint16_t*>(part) + int64_t(slot) * hd;
      for (int i = 0; i < hd; ++i) y[i] = f32_to_f16(x[i]);
      return;
    }
    case KvType::q8: {
      float amax = 0;
      for (int i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
      int8_t* y = reinterpret_cast<int8_t*>(part) + int64_t(slot) * hd;
      for (int i = 0; i < hd; ++i) y[i] = int8_t(std::lrint(std::clamp(x[i] * id, -127.f, 127.f)));
      q8_scales<float>(part, hd)[slot] = d;
      return;
    }
    case KvType::q4: {  // values: one scale and minimum per token
      float lo = x[0], hi = x[0];
      for (int i = 1; i < hd; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      const uint16_t d16 = f32_to_f16((hi - lo) / 15.f), m16 = f32_to_f16(lo);
      const float d = f16_to_f32(d16), m = f16_to_f32(m16), id = d > 0 ? 1.f / d : 0.f;
      uint8_t* y = part + int64_t(slot) * hd / 2;
      for (int i = 0; i < hd; i += 2) {
        const int a = std::clamp(int(std::lrint((x[i] - m) * id)), 0, 15);
        const int b = std::clamp(int(std::lrint((x[i + 1] - m) * id)), 0, 15);
        y[i / 2] = uint8_t(a | (b << 4));
      }
      uint16_t* sm = q4_scales<uint16_t>(part, hd);
      sm[slot] = d16;
      sm[kKvBlockTokens + slot] = m16;
      return;
    }
  }
}

// Keys of a whole block quantized per channel: each channel's 16 values share a scale
// and minimum, which follows the outlier channels keys have (KIVI).
void encode_q4_keys(uint8_t* part, const float* x, int hd) {
  uint16_t* sm = q4_scales<uint16_t>(part, hd);
  // Grown once per thread: flushing runs on the decode path.
  thread_local std::vector<float> d, id, m;
  d.resize(static_cast<size_t>(hd));
  id.resize(static_cast<size_t>(hd));
  m.resize(static_cast<size_t>(hd));
  for (int c = 0; c < hd; ++c) {
    float lo = x[c], hi = x[c];
    for (int t = 1; t < kKvBlockTokens; ++t) lo = std::min(lo, x[t * hd + c]), hi = std::max(hi, x[t * hd + c]);
    sm[c] = f32_to_f16((hi - lo) / 15.f);
    sm[hd + c] = f32_to_f16(lo);
    d[size_t(c)] = f16_to_f32(sm[c]);
    m[size_t(c)] = f16_to_f32(sm[hd + c]);
    id[size_t(c)] = d[size_t(c)] > 0 ? 1.f / d[size_t(c)] : 0.f;
  }
  for (int t = 0; t < kKvBlockTokens; ++t) {
    uint8_t* y = part + int64_t(t) * hd / 2;
    for (int c = 0; c < hd; c += 2) {
      const size_t a0 = size_t(c), a1 = size_t(c + 1);
      const int a = std::clamp(int(std::lrint((x[t * hd + c] - m[a0]) * id[a0])), 0, 15);
      const int b = std::clamp(int(std::lrint((x[t * hd + c + 1] - m[a1]) * id[a1])), 0, 15);
      y[c / 2] = uint8_t(a | (b << 4));
    }
  }
}

void decode_row(KvType t, bool is_key, const uint8_t* part, int slot, float* y, int hd) {
  switch (t) {
    case KvType::f32: std::memcpy(y, part + int64_t(slot) * hd * 4, size_t(hd) * 4); return;
    case KvType::f16: {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(part) + int64_t(slot) * hd;
      for (int i = 0; i < hd; ++i) y[i] = f16_to_f32(x[i]);
      return;
    }
    case KvType::q8: {
      const int8_t* x = reinterpret_cast<const int8_t*>(part) + int64_t(slot) * hd;
      const float d = q8_scales<const float>(part, hd)[slot];
      for (int i = 0; i < hd; ++i) y[i] = d * float(x[i]);
      return;
    }
    case KvType::q4: {
      const uint8_t* x = part + int64_t(slot) * hd / 2;
      const uint16_t* sm = q4_scales<const uint16_t>(part, hd);
      for (int i = 0; i < hd; i += 2) {
        const int a = x[i / 2] & 15, b = x[i / 2] >> 4;
        if (is_key) {
          y[i] = f16_to_f32(sm[hd + i]) + f16_to_f32(sm[i]) * float(a);
          y[i + 1] = f16_to_f32(sm[hd + i + 1]) + f16_to_f32(sm[i + 1]) * float(b);
        } else {
          const float d = f16_to_f32(sm[slot]), m = f16_to_f32(sm[kKvBlockTokens + slot]);
          y[i] = m + d * float(a);
          y[i + 1] = m + d * float(b);
        }
      }
      return;
    }
  }
}

// Raw copy of one token's row (and its per-token scale) between blocks of the same layer.
void copy_row(KvType t, const uint8_t* src, int s, uint8_t* dst, int d, int hd) {
  switch (t) {
    case KvType::f32: std::memmove(dst + int64_t(d) * hd * 4, src + int64_t(s) * hd * 4, size_t(hd) * 4); return;
    case KvType::f16: std::memmove(dst + int64_t(d) * hd * 2, src + int64_t(s) * hd * 2, size_t(hd) * 2); return;
    case KvType::q8:
      std::memmove(dst + int64_t(d) * hd, src + int64_t(s) * hd, size_t(hd));
      q8_scales<float>(dst, hd)[d] =
          q8_scales<const float>(src, hd)[s];
      return;
    case KvType::q4: throw Error(ErrorCode::internal, "KV cache: q4 rows are not copied one by one");
  }
}

// One of the parts (keys at offset 0, values after them) of a stream's blocks, as row
// runs that fetch each block's part ahead of use: f16 and q8 parts go to the kernels as
// one run list; f32 and 4-bit parts f(part, first row, rows) a block at a time.
struct BlockParts {
  const KvBlockPool& pool;
  const std::vector<int32_t>& blocks;
  int64_t offset, bytes;
  int n;
  template <typename T>
  KvRowRuns<T> runs(int64_t stride) const {
    return {reinterpret_cast<const T*>(pool.data(0) + offset), blocks.data(), pool.block_bytes() / int64_t(sizeof(T)),
            kKvBlockTokens, stride, bytes};
  }
  // The first blocks' parts, to start coming before they are needed (the loop written
  // out: GCC may drop the calls of a function that only prefetches).
  [[gnu::always_inline]] void prefetch_first() const {
    const int first = std::min(KvRowRuns<uint8_t>::kAhead, (n + kKvBlockTokens - 1) / kKvBlockTokens);
    for (int b = 0; b < first; ++b)
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(pool.data(blocks[size_t(b)]) + offset + o, 0, 3);
  }
  template <typename F>
  void each(F&& f) const {
    runs<uint8_t>(0).each(n, [&](int, const uint8_t* part, int i0, int len) { f(part, i0, len); });
  }
};

// Scores of the stream's first keys against g queries (hd apart), query j's at
// out + j * ldo. f16 rows use the same kernels as the contiguous cache, so a paged cache
// that keeps everything reproduces it bit for bit.
void key_scores(const KernelSet& k, const KvAttentionKernels& ak, KvType t, const BlockParts& parts, const float* q,
                int g, int hd, float* out, int64_t ldo) {
  switch (t) {
    case KvType::f32:
      parts.each([&](const uint8_t* part, int i0, int n) {
        for (int j = 0; j < g; ++j)
          for (int i = 0; i < n; ++i) out[j * ldo + i0 + i] = k.dot_f32(hd, part + int64_t(i) * hd * 4, q + j * hd);
      });
      return;
    case KvType::f16: ak.scores_f16(parts.runs<uint16_t>(hd), parts.n, q, g, hd, out, ldo); return;
    case KvType::q8: ak.scores_q8(parts.runs<int8_t>(hd), parts.n, q, g, hd, out, ldo); return;
    case KvType::q4:
      parts.each([&](const uint8_t* part, int i0, int n) {
        ak.scores_q4(part, q4_scales<const uint16_t>(part, hd), n, q, g, hd, out + i0, ldo);
      });
      return;
  }
}

// out_j += sum_i p[j * ldp + i] * v_i over the stream's first values; out_j = out + j * hd.
void accumulate_values(const KvAttentionKernels& ak, KvType t, const BlockParts& parts, const float* p, int64_t ldp,
                       int g, int hd, float* out) {
  switch (t) {
    case KvType::f32:
      parts.each([&](const uint8_t* part, int i0, int n) {
        for (int j = 0; j < g; ++j)
          for (int i = 0; i < n; ++i) {
            const float* v = reinterpret_cast<const float*>(part) + int64_t(i) * hd;
            const float a = p[j * ldp + i0 + i];
            for (int c = 0; c < hd; ++c) out[j * hd + c] += a * v[c];
          }
      });
      return;
    case KvType::f16: ak.accumulate_f16(parts.runs<uint16_t>(hd), parts.n, p, ldp, g, hd, out); return;
    case KvType::q8: ak.accumulate_q8(parts.runs<int8_t>(hd), parts.n, p, ldp, g, hd, out); return;
    case KvType::q4:
      parts.each([&](const uint8_t* part, int i0, int n) {
        ak.accumulate_q4(part, q4_scales<const uint16_t>(part, hd), n, p + i0, ldp, g, hd, out);
      });
      return;
  }
}

}  // namespace

// ---------------------------------------------------------------- cache

KvCache::KvCache(KvLayout layout, int max_seqs, int max_tokens, int64_t pool_bytes, int pool_seqs)
    : layout_(std::move(layout)), max_tokens_(max_tokens), k_(&kernels()) {
  const KvLayout& L = layout_;
  if (L.n_layer <= 0 || L.n_head_kv <= 0 || L.head_dim <= 0 || L.head_dim % 2 != 0)
    throw Error(ErrorCode::invalid_argument, "KV cache: bad layout (layers " + std::to_string(L.n_layer) + ", heads " +
                                                 std::to_string(L.n_head_kv) + ", head_dim " + std::to_string(L.head_dim) + ")");
  if (int(L.k_type.size()) != L.n_layer || int(L.v_type.size()) != L.n_layer)
    throw Error(ErrorCode::invalid_argument, "KV cache: need one K and one V type per layer (" +
                                                 std::to_string(L.n_layer) + " layers)");
  if (max_seqs <= 0 || max_tokens <= 0)
    throw Error(ErrorCode::invalid_argument, "KV cache: sequence count and length must be positive");
  if (L.q4_recent_blocks < 1 || L.q4_recent_blocks > 64)
    throw Error(ErrorCode::invalid_argument, "KV cache: q4 recent window must be 1..64 blocks");
  if (!L.layer_heads.empty() && int(L.layer_heads.size()) != L.n_layer)
    throw Error(ErrorCode::invalid_argument, "KV cache: " + std::to_string(L.layer_heads.size()) +
                                                 " per-layer head counts for " + std::to_string(L.n_layer) + " layers");
  for (int l = 0; l < L.n_layer; ++l) {
    if (L.heads(l) < 1 || L.heads(l) > L.n_head_kv)
      throw Error(ErrorCode::invalid_argument, "KV cache: layer " + std::to_string(l) + " has " +
                                                   std::to_string(L.heads(l)) + " KV heads (1.." +
                                                   std::to_string(L.n_head_kv) + ")");
    first_stream_.push_back(l ? first_stream_.back() + L.heads(l - 1) : 0);
  }
  const int64_t streams = L.total_heads();
  int64_t block = 0;
  bool any_q4 = false;
  for (int l = 0; l < L.n_layer; ++l) {
    k_bytes_.push_back(kv_block_part_bytes(L.k_type[size_t(l)], L.head_dim, true));
    v_bytes_.push_back(kv_block_part_bytes(L.v_type[size_t(l)], L.head_dim, false));
    block = std::max(block, k_bytes_.back() + v_bytes_.back());
    any_q4 = any_q4 || L.staged(l);
  }
  const int64_t per_stream_blocks = (int64_t(max_tokens) + kKvBlockTokens - 1) / kKvBlockTokens;
  if (pool_bytes <= 0)
    pool_bytes = ((block + 63) / 64 * 64) * per_stream_blocks * streams *
                 (pool_seqs > 0 ? pool_seqs : max_seqs);
  pool_ = std::make_unique<KvBlockPool>(block, pool_bytes);
  seqs_.resize(size_t(max_seqs));
  const int64_t stage_rows = int64_t(kKvBlockTokens) * L.q4_recent_blocks;
  if (any_q4) staging_.assign(size_t(max_seqs) * size_t(streams) * stage_rows * L.head_dim * 2, 0);
  for (int s = 0; s < max_seqs; ++s) {
    auto& sq = seqs_[size_t(s)];
    sq.streams.resize(size_t(streams));
    for (int l = 0; l < L.n_layer; ++l)
      for (int h = 0; h < L.heads(l); ++h) {
        KvStream& st = sq.streams[size_t(first_stream_[size_t(l)] + h)];
        if (L.staged(l)) {
          const size_t idx = size_t(s) * size_t(streams) + size_t(first_stream_[size_t(l)] + h);
          st.stage_k = staging_.data() + idx * stage_rows * L.head_dim * 2;
          st.stage_v = st.stage_k + stage_rows * L.head_dim;
        }
      }
  }
  rebuild_k_.resize(size_t(max_tokens) * L.head_dim);
  rebuild_v_.resize(size_t(max_tokens) * L.head_dim);
}

KvCache::~KvCache() {
  for (int s = 0; s < max_seqs(); ++s)
    if (seqs_[size_t(s)].active) remove_sequence(s);
}

namespace {
// A stream's per-token bookkeeping (position, observed attention, value norm): parallel
// vectors that change together, here only.
void reserve_token_meta(KvStream& s, size_t n) {
  s.pos.reserve(n);
  s.score.reserve(n);
  s.value_norm.reserve(n);
}
void resize_token_meta(KvStream& s, size_t n) {
  s.pos.resize(n);
  s.score.resize(n);
  s.value_norm.resize(n);
}
void push_token_meta(KvStream& s, int32_t pos, float value_norm) {
  s.pos.push_back(pos);
  s.score.push_back(0.f);
  s.value_norm.push_back(value_norm);
}
void move_token_meta(KvStream& s, size_t to, size_t from) {
  s.pos[to] = s.pos[from];
  s.score[to] = s.score[from];
  s.value_norm[to] = s.value_norm[from];
}
// d's bookkeeping becomes that of s's first n tokens.
void copy_token_meta(KvStream& d, const KvStream& s, size_t n) {
  d.pos.assign(s.pos.begin(), s.pos.begin() + ptrdiff_t(n));
  d.score.assign(s.score.begin(), s.score.begin() + ptrdiff_t(n));
  d.value_norm.assign(s.value_norm.begin(), s.value_norm.begin() + ptrdiff_t(n));
}
}  // namespace

int KvCache::add_sequence() {
  for (int s = 0; s < max_seqs(); ++s) {
    Sequence& sq = seqs_[size_t(s)];
    if (sq.active) continue;
    sq.active = true;
    sq.n_past = 0;
    for (KvStream& st : sq.streams) {
      // Reserved once per slot, so appending never allocates.
      st.blocks.reserve(size_t(max_tokens_ / kKvBlockTokens + 2));
      reserve_token_meta(st, size_t(max_tokens_));
    }
    return s;
  }
  throw Error(ErrorCode::resource_exhausted, "KV cache: all " + std::to_string(max_seqs()) + " sequence slots are in use");
}

bool KvCache::active(int seq) const { return seq >= 0 && seq < max_seqs() && seqs_[size_t(seq)].active; }

void KvCache::clear_stream(KvStream& s) {
  for (int32_t b : s.blocks) pool_->release(b);
  s.blocks.clear();
  s.n = s.n_staged = 0;
  resize_token_meta(s, 0);
  s.entropy_sum = 0;
  s.entropy_count = 0;
}

void KvCache::remove_sequence(int seq) {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  for (KvStream& st : seqs_[size_t(seq)].streams) clear_stream(st);
  seqs_[size_t(seq)].active = false;
  seqs_[size_t(seq)].n_past = 0;
}

int KvCache::n_past(int seq) const {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  return seqs_[size_t(seq)].n_past;
}

void KvCache::set_n_past(int seq, int n) {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  seqs_[size_t(seq)].n_past = n;
}

KvStream& KvCache::stream(int seq, int layer, int h) {
  return seqs_[size_t(seq)].streams[size_t(first_stream_[size_t(layer)] + h)];
}
const KvStream& KvCache::stream(int seq, int layer, int h) const {
  return seqs_[size_t(seq)].streams[size_t(first_stream_[size_t(layer)] + h)];
}

int64_t KvCache::blocks_needed(int seq, int n) const {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  const int recent = kKvBlockTokens * layout_.q4_recent_blocks;
  int64_t need = 0;
  for (int l = 0; l < layout_.n_layer; ++l)
    for (int h = 0; h < layout_.heads(l); ++h) {
      const KvStream& s = stream(seq, l, h);
      if (layout_.staged(l)) {
        const int over = s.n_staged + n - recent;
        if (over > 0) need += (over + kKvBlockTokens - 1) / kKvBlockTokens;
      } else {
        need += (int64_t(s.n) + n + kKvBlockTokens - 1) / kKvBlockTokens - int64_t(s.blocks.size());
        if (n > 0 && s.n % kKvBlockTokens != 0 && pool_->refcount(s.blocks.back()) > 1) ++need;
      }
    }
  return need;
}

void KvCache::check_append(int seq, int n) const {
  const int np = n_past(seq);
  if (int64_t(np) + n > max_tokens_)
    throw Error(ErrorCode::resource_exhausted, "KV cache: sequence " + std::to_string(seq) + " at position " +
                                                   std::to_string(np) + " + " + std::to_string(n) +
                                                   " tokens exceeds the context of " + std::to_string(max_tokens_));
  const int64_t need = blocks_needed(seq, n);
  if (need > pool_->free_blocks())
    throw Error(ErrorCode::resource_exhausted, "KV pool exhausted: " + std::to_string(n) + " tokens of sequence " +
                                                   std::to_string(seq) + " need " + std::to_string(need) + " blocks, " +
                                                   std::to_string(pool_->free_blocks()) + " of " +
                                                   std::to_string(pool_->capacity()) + " are free");
}

void KvCache::make_private(KvStream& s, size_t bi) {
  const int32_t b = s.blocks[bi];
  if (pool_->refcount(b) == 1) return;
  const int32_t nb = pool_->allocate();
  std::memcpy(pool_->data(nb), pool_->data(b), size_t(pool_->block_bytes()));
  pool_->release(b);
  s.blocks[bi] = nb;
}

void KvCache::write_token(int layer, uint8_t* block, int slot, const float* k, const float* v) {
  encode_row(layout_.k_type[size_t(layer)], block, slot, k, layout_.head_dim);
  encode_row(layout_.v_type[size_t(layer)], block + k_bytes(layer), slot, v, layout_.head_dim);
}

// Moves the oldest block of the recent window into the pool, quantized.
void KvCache::flush_stage(int layer, KvStream& s) {
  const int hd = layout_.head_dim;
  const int32_t b = pool_->allocate();
  uint8_t* blk = pool_->data(b);
  float kf[kKvBlockTokens * 512 / 4], vrow[1024];
  std::vector<float> kbuf;
  float* kx = kf;
  if (kKvBlockTokens * hd > int(sizeof(kf) / 4)) {
    kbuf.resize(size_t(kKvBlockTokens) * hd);
    kx = kbuf.data();
  }
  const KvType kt = layout_.k_type[size_t(layer)], vt = layout_.v_type[size_t(layer)];
  for (int t = 0; t < kKvBlockTokens; ++t)
    for (int c = 0; c < hd; ++c) kx[t * hd + c] = f16_to_f32(s.stage_k[t * hd + c]);
  if (kt == KvType::q4) {
    encode_q4_keys(blk, kx, hd);
  } else {
    for (int t = 0; t < kKvBlockTokens; ++t) encode_row(kt, blk, t, kx + t * hd, hd);
  }
  std::vector<float> vbuf;
  float* vx = vrow;
  if (hd > 1024) {
    vbuf.resize(size_t(hd));
    vx = vbuf.data();
  }
  for (int t = 0; t < kKvBlockTokens; ++t) {
    for (int c = 0; c < hd; ++c) vx[c] = f16_to_f32(s.stage_v[t * hd + c]);
    encode_row(vt, blk + k_bytes(layer), t, vx, hd);
  }
  const int rest = s.n_staged - kKvBlockTokens;
  std::memmove(s.stage_k, s.stage_k + kKvBlockTokens * hd, size_t(rest) * hd * 2);
  std::memmove(s.stage_v, s.stage_v + kKvBlockTokens * hd, size_t(rest) * hd * 2);
  s.n_staged = rest;
  s.blocks.push_back(b);
}

void KvCache::append(int seq, int layer, int pos, const float* k, const float* v) {
  const int hd = layout_.head_dim;
  const bool staged = layout_.staged(layer);
  const int recent = kKvBlockTokens * layout_.q4_recent_blocks;
  for (int h = 0; h < layout_.heads(layer); ++h) {
    KvStream& s = stream(seq, layer, h);
    if (s.n >= max_tokens_) throw Error(ErrorCode::resource_exhausted, "KV cache: stream full");
    const float* kh = k + int64_t(h) * hd;
    const float* vh = v + int64_t(h) * hd;
    if (staged) {
      if (s.n_staged == recent) flush_stage(layer, s);
      for (int c = 0; c < hd; ++c) {
        s.stage_k[int64_t(s.n_staged) * hd + c] = f32_to_f16(kh[c]);
        s.stage_v[int64_t(s.n_staged) * hd + c] = f32_to_f16(vh[c]);
      }
      ++s.n_staged;
    } else {
      const int slot = s.n % kKvBlockTokens;
      if (slot == 0) s.blocks.push_back(pool_->allocate());
      else make_private(s, s.blocks.size() - 1);
      write_token(layer, pool_->data(s.blocks.back()), slot, kh, vh);
    }
    ++s.n;
    float norm = 0;
    for (int c = 0; c < hd; ++c) norm += std::fabs(vh[c]);
    push_token_meta(s, pos, norm);
  }
}

void KvCache::read_token(int seq, int layer, int h, int i, float* k, float* v) const {
  const KvStream& s = stream(seq, layer, h);
  if (i < 0 || i >= s.n) throw Error(ErrorCode::invalid_argument, "KV cache: token " + std::to_string(i) + " out of range");
  const int hd = layout_.head_dim;
  const int in_blocks = s.n - s.n_staged;
  if (i >= in_blocks) {
    const int r = i - in_blocks;
    for (int c = 0; c < hd; ++c) {
      k[c] = f16_to_f32(s.stage_k[int64_t(r) * hd + c]);
      v[c] = f16_to_f32(s.stage_v[int64_t(r) * hd + c]);
    }
    return;
  }
  const uint8_t* blk = pool_->data(s.blocks[size_t(i / kKvBlockTokens)]);
  decode_row(layout_.k_type[size_t(layer)], true, blk, i % kKvBlockTokens, k, hd);
  decode_row(layout_.v_type[size_t(layer)], false, blk + k_bytes(layer), i % kKvBlockTokens, v, hd);
}

// Rewrites a q4 stream from token `first` (a block boundary) on with the tokens `keep`
// lists from there: they are decoded and quantized again, since per-channel key scales
// belong to a whole block.
void KvCache::rebuild_from(int layer, KvStream& s, int first, std::span<const int32_t> keep) {
  const int hd = layout_.head_dim;
  const int fb = first / kKvBlockTokens;
  const size_t count = keep.size() - size_t(fb) * kKvBlockTokens;
  // read_token needs the sequence; decode here with the stream directly.
  const int in_blocks = s.n - s.n_staged;
  for (size_t j = 0; j < count; ++j) {
    const int i = keep[size_t(fb) * kKvBlockTokens + j];
    float* kd = rebuild_k_.data() + j * hd;
    float* vd = rebuild_v_.data() + j * hd;
    if (i >= in_blocks) {
      for (int c = 0; c < hd; ++c) {
        kd[c] = f16_to_f32(s.stage_k[int64_t(i - in_blocks) * hd + c]);
        vd[c] = f16_to_f32(s.stage_v[int64_t(i - in_blocks) * hd + c]);
      }
    } else {
      const uint8_t* blk = pool_->data(s.blocks[size_t(i / kKvBlockTokens)]);
      decode_row(layout_.k_type[size_t(layer)], true, blk, i % kKvBlockTokens, kd, hd);
      decode_row(layout_.v_type[size_t(layer)], false, blk + k_bytes(layer), i % kKvBlockTokens, vd, hd);
    }
    // keep is ascending, so token i's bookkeeping moves down in place.
    move_token_meta(s, size_t(fb) * kKvBlockTokens + j, size_t(i));
  }
  for (size_t b = size_t(fb); b < s.blocks.size(); ++b) pool_->release(s.blocks[b]);
  s.blocks.resize(size_t(fb));
  s.n = fb * kKvBlockTokens;
  s.n_staged = 0;
  resize_token_meta(s, keep.size());
  const int recent = kKvBlockTokens * layout_.q4_recent_blocks;
  for (size_t j = 0; j < count; ++j) {
    if (s.n_staged == recent) flush_stage(layer, s);
    for (int c = 0; c < hd; ++c) {
      s.stage_k[int64_t(s.n_staged) * hd + c] = f32_to_f16(rebuild_k_[j * hd + size_t(c)]);
      s.stage_v[int64_t(s.n_staged) * hd + c] = f32_to_f16(rebuild_v_[j * hd + size_t(c)]);
    }
    ++s.n_staged;
    ++s.n;
  }
}

void KvCache::keep(int seq, int layer, int h, std::span<const int32_t> keep) {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  KvStream& s = stream(seq, layer, h);
  for (size_t j = 0; j < keep.size(); ++j)
    if (keep[j] < 0 || keep[j] >= s.n || (j > 0 && keep[j] <= keep[j - 1]))
      throw Error(ErrorCode::invalid_argument, "KV cache: keep list of layer " + std::to_string(layer) + " head " +
                                                   std::to_string(h) + " is not ascending within 0.." +
                                                   std::to_string(s.n - 1) + " at entry " + std::to_string(j));
  size_t first = 0;
  while (first < keep.size() && keep[first] == int32_t(first)) ++first;
  if (first == keep.size() && keep.size() == size_t(s.n)) return;
  if (layout_.staged(layer)) {
    // Whole blocks before the first change stay as they are; only later ones are requantized.
    const int in_blocks = s.n - s.n_staged;
    const int fb = std::min<int>(int(first), in_blocks) / kKvBlockTokens * kKvBlockTokens;
    rebuild_from(layer, s, fb, keep);
    return;
  }
  const int hd = layout_.head_dim;
  const KvType kt = layout_.k_type[size_t(layer)], vt = layout_.v_type[size_t(layer)];
  for (size_t j = first; j < keep.size(); ++j) {
    const int i = keep[j];
    make_private(s, j / kKvBlockTokens);
    const uint8_t* src = pool_->data(s.blocks[size_t(i / kKvBlockTokens)]);
    uint8_t* dst = pool_->data(s.blocks[j / kKvBlockTokens]);
    copy_row(kt, src, i % kKvBlockTokens, dst, int(j % kKvBlockTokens), hd);
    copy_row(vt, src + k_bytes(layer), i % kKvBlockTokens, dst + k_bytes(layer), int(j % kKvBlockTokens), hd);
    move_token_meta(s, j, size_t(i));
  }
  s.n = int(keep.size());
  resize_token_meta(s, keep.size());
  const size_t nb = (keep.size() + kKvBlockTokens - 1) / kKvBlockTokens;
  for (size_t b = nb; b < s.blocks.size(); ++b) pool_->release(s.blocks[b]);
  s.blocks.resize(nb);
}

void KvCache::truncate(int seq, int n) {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  if (n < 0) throw Error(ErrorCode::invalid_argument, "KV cache: truncate to a negative position");
  std::vector<int32_t> idx;
  for (int l = 0; l < layout_.n_layer; ++l)
    for (int h = 0; h < layout_.heads(l); ++h) {
      KvStream& s = stream(seq, l, h);
      const int m = int(std::lower_bound(s.pos.begin(), s.pos.end(), n) - s.pos.begin());
      if (m == s.n) continue;
      idx.resize(size_t(m));
      std::iota(idx.begin(), idx.end(), 0);
      keep(seq, l, h, idx);
    }
  Sequence& sq = seqs_[size_t(seq)];
  sq.n_past = std::min(sq.n_past, n);
}

int64_t KvCache::fork_shared_blocks(int src, int n_tokens) const {
  int64_t shared = 0;
  for (int l = 0; l < layout_.n_layer; ++l)
    for (int h = 0; h < layout_.heads(l); ++h) {
      const KvStream& s = stream(src, l, h);
      const int m = int(std::lower_bound(s.pos.begin(), s.pos.end(), n_tokens) - s.pos.begin());
      shared += std::min(m, s.n - s.n_staged) / kKvBlockTokens;
    }
  return shared;
}

int KvCache::fork_sequence(int src, int n_tokens) {
  if (!active(src)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(src));
  if (n_tokens < 0 || n_tokens > n_past(src))
    throw Error(ErrorCode::invalid_argument, "KV cache: fork of " + std::to_string(n_tokens) + " tokens from a sequence of " +
                                                 std::to_string(n_past(src)));
  // Partial blocks are copied: check they fit before touching anything.
  int64_t need = 0;
  for (int l = 0; l < layout_.n_layer; ++l)
    for (int h = 0; h < layout_.heads(l); ++h) {
      const KvStream& s = stream(src, l, h);
      const int m = int(std::lower_bound(s.pos.begin(), s.pos.end(), n_tokens) - s.pos.begin());
      if (!layout_.staged(l) && m % kKvBlockTokens != 0) ++need;
    }
  if (need > pool_->free_blocks())
    throw Error(ErrorCode::resource_exhausted, "KV pool exhausted: forking needs " + std::to_string(need) + " blocks, " +
                                                   std::to_string(pool_->free_blocks()) + " are free");
  const int dst = add_sequence();
  const int hd = layout_.head_dim;
  std::vector<float> kx(static_cast<size_t>(hd)), vx(static_cast<size_t>(hd));
  for (int l = 0; l < layout_.n_layer; ++l)
    for (int h = 0; h < layout_.heads(l); ++h) {
      const KvStream& s = stream(src, l, h);
      KvStream& d = stream(dst, l, h);
      const int m = int(std::lower_bound(s.pos.begin(), s.pos.end(), n_tokens) - s.pos.begin());
      const int in_blocks = s.n - s.n_staged;
      const int shared = std::min(m, in_blocks) / kKvBlockTokens;
      for (int b = 0; b < shared; ++b) {
        pool_->retain(s.blocks[size_t(b)]);
        d.blocks.push_back(s.blocks[size_t(b)]);
      }
      d.n = shared * kKvBlockTokens;
      if (layout_.staged(l)) {
        // The rest goes to the f16 recent window (decoded if it had been quantized).
        for (int i = d.n; i < m; ++i) {
          read_token(src, l, h, i, kx.data(), vx.data());
          for (int c = 0; c < hd; ++c) {
            d.stage_k[int64_t(d.n_staged) * hd + c] = f32_to_f16(kx[size_t(c)]);
            d.stage_v[int64_t(d.n_staged) * hd + c] = f32_to_f16(vx[size_t(c)]);
          }
          ++d.n_staged;
        }
        d.n = m;
      } else if (m > d.n) {
        const int32_t nb = pool_->allocate();
        const uint8_t* sb = pool_->data(s.blocks[size_t(shared)]);
        for (int i = d.n; i < m; ++i) {
          copy_row(layout_.k_type[size_t(l)], sb, i % kKvBlockTokens, pool_->data(nb), i % kKvBlockTokens, hd);
          copy_row(layout_.v_type[size_t(l)], sb + k_bytes(l), i % kKvBlockTokens, pool_->data(nb) + k_bytes(l),
                   i % kKvBlockTokens, hd);
        }
        d.blocks.push_back(nb);
        d.n = m;
      }
      copy_token_meta(d, s, size_t(m));
    }
  seqs_[size_t(dst)].n_past = n_tokens;
  return dst;
}

int64_t KvCache::scratch_floats(int n_group) const {
  return (int64_t(max_tokens_) + 15) / 16 * 16 * std::max(1, n_group);
}

void KvCache::attend(int seq, int layer, int h, const float* q, int64_t q_stride, int n_q, int n_group,
                     const int* n_visible, const uint8_t* observe, const KvObserver& obs, float scale, float* out,
                     int64_t out_stride, float* scratch) const {
  const KvStream& s = stream(seq, layer, h);
  const int hd = layout_.head_dim, G = n_group;
  const KvType kt = layout_.k_type[size_t(layer)], vt = layout_.v_type[size_t(layer)];
  const int64_t kb = k_bytes(layer);
  const int64_t sp = (int64_t(max_tokens_) + 15) / 16 * 16;  // scores of one query
  const KvAttentionKernels& ak = kv_attention_kernels();
  const int in_blocks = s.n - s.n_staged;
  for (int r = 0; r < n_q; ++r) {
    const float* qr = q + r * q_stride;
    float* o = out + r * out_stride;
    const int len = n_visible[r];
    if (len <= 0 || len > s.n) throw Error(ErrorCode::internal, "KV attention: visible length out of range");
    const int nb_tok = std::min(len, in_blocks);
    key_scores(*k_, ak, kt, BlockParts{*pool_, s.blocks, 0, kb, nb_tok}, qr, G, hd, scratch, sp);
    if (len > nb_tok) ak.scores_f16(KvF16Rows::contiguous(s.stage_k, hd), len - nb_tok, qr, G, hd, scratch + nb_tok, sp);
    // The first value blocks start coming while the softmax runs (in one process,
    // alternating: 8 sequences x 512 context 1.3-6.6 % faster).
    const BlockParts values{*pool_, s.blocks, kb, v_bytes(layer), nb_tok};
    values.prefetch_first();
    for (int j = 0; j < G; ++j) {
      ak.softmax(scratch + j * sp, len, scale);
      std::fill(o + j * hd, o + (j + 1) * hd, 0.f);
    }
    accumulate_values(ak, vt, values, scratch, sp, G, hd, o);
    if (len > nb_tok)
      ak.accumulate_f16(KvF16Rows::contiguous(s.stage_v, hd), len - nb_tok, scratch + nb_tok, sp, G, hd, o);
    if (observe && observe[r]) {
      // The stream is only read here; its policy bookkeeping is written by one item at a
      // time (the caller gives each (sequence, KV head) to one thread).
      KvStream& ms = const_cast<KvStream&>(s);
      if (obs.accumulate && obs.decay != 1.f)
        for (int i = 0; i < len; ++i) ms.score[size_t(i)] *= obs.decay;
      for (int j = 0; j < G; ++j) {
        const float* sc = scratch + j * sp;
        if (obs.accumulate)
          for (int i = 0; i < len; ++i) ms.score[size_t(i)] += sc[i];
        if (obs.entropy) {
          double e = 0;
          for (int i = 0; i < len; ++i)
            if (sc[i] > 0) e -= double(sc[i]) * std::log(double(sc[i]));
          ms.entropy_sum += e;
          ++ms.entropy_count;
        }
      }
    }
  }
}

KvCacheStats KvCache::stats() const {
  KvCacheStats st;
  st.block_bytes = pool_->block_bytes();
  st.blocks_total = pool_->capacity();
  st.blocks_used = pool_->used_blocks();
  st.blocks_free = pool_->free_blocks();
  st.peak_blocks = pool_->peak_used();
  st.reuse_rate = pool_->reuse_rate();
  for (const Sequence& sq : seqs_) {
    if (!sq.active) continue;
    ++st.active_sequences;
    for (const KvStream& s : sq.streams) {
      const int in_blocks = s.n - s.n_staged;
      st.tokens += in_blocks;
      st.staged_tokens += s.n_staged;
      st.unused_slots += int64_t(s.blocks.size()) * kKvBlockTokens - in_blocks;
    }
  }
  st.bytes_used = st.blocks_used * st.block_bytes + st.staged_tokens * layout_.head_dim * 4;
  st.fragmentation = st.blocks_used ? double(st.unused_slots) / double(st.blocks_used * kKvBlockTokens) : 0.0;
  return st;
}

int64_t KvCache::sequence_bytes(int seq) const {
  if (!active(seq)) throw Error(ErrorCode::invalid_argument, "KV cache: no sequence " + std::to_string(seq));
  int64_t b = 0;
  for (const KvStream& s : seqs_[size_t(seq)].streams)
    b += int64_t(s.blocks.size()) * pool_->block_bytes() + int64_t(s.n_staged) * layout_.head_dim * 4;
  return b;
}

}  // namespace slim::llm
