#include "slim/llm/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "slim/llm/kernels.h"
#include "slim/llm/kv_attention.h"
#include "slim/core/error.h"
#include "slim/core/half.h"

namespace slim::llm {

// ---------------------------------------------------------------- load

// llama.cpp's limit (LLAMA_MAX_EXPERTS).
constexpr int kMaxExperts = 1024;

class ModelLoader {
 public:
  static std::shared_ptr<const LlamaModel> load(const std::string& path, bool map) {
    std::shared_ptr<LlamaModel> m(new LlamaModel());
    // Matmul weights are repacked for the kernels' 16-row tiles as the file is read.
    std::set<std::string> repacked;
    const GgufFile::TensorRewrite rewrite = [&repacked](const GgufTensorInfo& t, uint8_t* data) {
      // A 3-D tensor holds one matrix per expert; groups of 16 rows stay within one.
      const bool matmul_weight = t.name == "output.weight" || t.name.rfind("blk.", 0) == 0;
      if (!matmul_weight || !tile16_fn(kernels(), t.type()) || t.dims.size() < 2 || t.dims.size() > 3 ||
          t.dims[1] % 16 != 0)
        return;
      const int64_t row_bytes = ggml_row_bytes(t.type(), t.dims[0]);
      for (int64_t r = 0; r < t.rows(); r += 16) repack_x16(t.type(), data + r * row_bytes, t.dims[0]);
      repacked.insert(t.name);
    };
    m->gguf_ = GgufFile::open(path, !map, rewrite);
    const GgufFile& g = *m->gguf_;
    LlamaConfig& c = m->config_;
    c.arch = g.get_string("general.architecture");
    // deci (llama.cpp's name for Nemotron-NAS; `slim prune` writes variable-width llama
    // models as it) is llama's math with per-layer widths; its attention-free and FFN-free
    // layers (a zero width) are refused below.
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "mistral" && c.arch != "qwen2moe" && c.arch != "deci")
      throw Error(ErrorCode::unsupported,
                  path + ": architecture '" + c.arch + "' (slim runs llama, deci, mistral, qwen2 and qwen2moe)");
    const std::string a = c.arch + ".";
    auto positive = [&](const std::string& key, int64_t v, int64_t max) {
      if (v <= 0 || v > max)
        throw Error(ErrorCode::invalid_model, path + ": metadata '" + key + "' = " + std::to_string(v) +
                                                  " is out of range (1.." + std::to_string(max) + ")");
      return int(v);
    };
    c.n_layer = positive(a + "block_count", g.get_int(a + "block_count"), 1024);
    c.n_embd = positive(a + "embedding_length", g.get_int(a + "embedding_length"), 1 << 16);
    // Head counts and the FFN width: a number, or one per layer (an array, as llama.cpp
    // reads variable-width models); the config holds the widest.
    auto per_layer = [&](const std::string& key, std::optional<std::vector<int>> fallback, int64_t max) {
      const GgufValue* v = g.find(key);
      if (!v && fallback) return *fallback;
      std::vector<int64_t> vals;
      if (v && v->type == GgufValueType::array) {
        if (v->integers.size() != size_t(c.n_layer) || v->array_size != uint64_t(c.n_layer))
          throw Error(ErrorCode::invalid_model, path + ": metadata '" + key + "' has " + std::to_string(v->array_size) +
                                                    " entries for " + std::to_string(c.n_layer) + " layers");
        vals = v->integers;
      } else {
        vals.assign(size_t(c.n_layer), g.get_int(key));
      }
      std::vector<int> out;
      for (int64_t x : vals) out.push_back(positive(key, x, max));
      return out;
    };
    const std::vector<int> ff = per_layer(a + "feed_forward_length", std::nullopt, 1 << 18);
    const std::vector<int> heads = per_layer(a + "attention.head_count", std::nullopt, 1024);
    const std::vector<int> heads_kv = per_layer(a + "attention.head_count_kv", heads, 1024);
    c.n_ff = *std::max_element(ff.begin(), ff.end());
    c.n_head = *std::max_element(heads.begin(), heads.end());
    c.n_head_kv = *std::max_element(heads_kv.begin(), heads_kv.end());
    for (int l = 0; l < c.n_layer; ++l)
      if (int64_t(heads[size_t(l)]) * c.n_head_kv != int64_t(heads_kv[size_t(l)]) * c.n_head)
        throw Error(ErrorCode::unsupported, path + ": layer " + std::to_string(l) + " has " +
                                                std::to_string(heads[size_t(l)]) + " heads for " +
                                                std::to_string(heads_kv[size_t(l)]) +
                                                " KV heads; slim needs the same query heads per KV head in every layer");
    c.n_ctx_train = positive(a + "context_length", g.get_int(a + "context_length", 2048), 1 << 24);
    if (!g.has(a + "attention.key_length") && c.n_embd % c.n_head != 0)
      throw Error(ErrorCode::invalid_model, path + ": embedding length " + std::to_string(c.n_embd) +
                                                " is not a multiple of the head count " + std::to_string(c.n_head));
    c.head_dim = positive(a + "attention.key_length", g.get_int(a + "attention.key_length", c.n_embd / c.n_head), 4096);
    const int vdim = int(g.get_int(a + "attention.value_length", c.head_dim));
    if (vdim != c.head_dim)
      throw Error(ErrorCode::unsupported, path + ": value length " + std::to_string(vdim) + " differs from key length");
    if (c.n_head % c.n_head_kv != 0)
      throw Error(ErrorCode::invalid_model, path + ": head count " + std::to_string(c.n_head) +
                                                " is not a multiple of the KV head count " + std::to_string(c.n_head_kv));
    c.n_rot = positive(a + "rope.dimension_count", g.get_int(a + "rope.dimension_count", c.head_dim), c.head_dim);
    if (c.n_rot % 2 != 0) throw Error(ErrorCode::invalid_model, path + ": odd rope.dimension_count");
    c.rms_eps = float(g.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
    if (!(c.rms_eps > 0) || c.rms_eps > 1)
      throw Error(ErrorCode::invalid_model, path + ": layer_norm_rms_epsilon out of range");
    c.rope_base = float(g.get_float(a + "rope.freq_base", 10000.0));
    if (!(c.rope_base > 1)) throw Error(ErrorCode::invalid_model, path + ": rope.freq_base must be > 1");
    if (g.has(a + "rope.scaling.type") && g.get_string(a + "rope.scaling.type") != "none")
      throw Error(ErrorCode::unsupported, path + ": RoPE scaling '" + g.get_string(a + "rope.scaling.type") + "'");
    const bool qwen_moe = c.arch == "qwen2moe";
    c.rope_neox = c.arch == "qwen2" || qwen_moe;
    c.qkv_bias = c.rope_neox;
    // Mixture of Experts: Mixtral is the llama architecture with experts of n_ff hidden
    // units; qwen2moe gives the sizes of its experts and of its shared expert (llama.cpp's
    // defaults when absent: n_ff / n_expert_used and n_ff).
    if (const int64_t n_expert = g.get_int(a + "expert_count", 0); n_expert != 0 || qwen_moe) {
      c.n_expert = positive(a + "expert_count", n_expert, kMaxExperts);
      c.n_expert_used = positive(a + "expert_used_count", g.get_int(a + "expert_used_count"), c.n_expert);
      c.n_ff_exp = qwen_moe ? positive(a + "expert_feed_forward_length",
                                       g.get_int(a + "expert_feed_forward_length", c.n_ff / c.n_expert_used), 1 << 18)
                            : c.n_ff;
      if (qwen_moe)
        c.n_ff_shexp = positive(a + "expert_shared_feed_forward_length",
                                g.get_int(a + "expert_shared_feed_forward_length", c.n_ff), 1 << 18);
      c.expert_norm = !qwen_moe;
    }

    const GgufTensorInfo& embd = g.tensor("token_embd.weight");
    if (embd.dims.size() != 2 || embd.dims[0] != c.n_embd)
      throw Error(ErrorCode::invalid_model, path + ": token_embd.weight must be [" + std::to_string(c.n_embd) + ", n_vocab]");
    c.n_vocab = int(std::min<int64_t>(embd.dims[1], 1 << 24));
    if (embd.dims[1] > (1 << 24)) throw Error(ErrorCode::invalid_model, path + ": vocabulary too large");
    if (const GgufValue* toks = g.find("tokenizer.ggml.tokens")) {
      if (toks->type != GgufValueType::array || toks->array_size != uint64_t(c.n_vocab))
        throw Error(ErrorCode::invalid_model, path + ": tokenizer.ggml.tokens has " + std::to_string(toks->array_size) +
                                                  " entries but token_embd.weight has " + std::to_string(c.n_vocab) + " rows");
    }
    m->token_embd_ = matrix(g, "token_embd.weight", c.n_vocab, c.n_embd, repacked);
    if (g.find_tensor("output.weight")) {
      m->output_ = matrix(g, "output.weight", c.n_vocab, c.n_embd, repacked);
    } else {
      c.tied_output = true;
      m->output_ = m->token_embd_;
    }
    m->output_norm_ = vec(g, "output_norm.weight", c.n_embd);
    m->layers_.resize(size_t(c.n_layer));
    for (int i = 0; i < c.n_layer; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      LayerWeights& L = m->layers_[size_t(i)];
      L.n_head_kv = heads_kv[size_t(i)];
      L.n_ff = ff[size_t(i)];
      const int q_dim = heads[size_t(i)] * c.head_dim, kv_dim = L.n_head_kv * c.head_dim;
      L.attn_norm = m->store(vec(g, p + "attn_norm.weight", c.n_embd));
      L.ffn_norm = m->store(vec(g, p + "ffn_norm.weight", c.n_embd));
      L.wq = matrix(g, p + "attn_q.weight", q_dim, c.n_embd, repacked);
      L.wk = matrix(g, p + "attn_k.weight", kv_dim, c.n_embd, repacked);
      L.wv = matrix(g, p + "attn_v.weight", kv_dim, c.n_embd, repacked);
      L.wo = matrix(g, p + "attn_output.weight", c.n_embd, q_dim, repacked);
      if (c.n_expert == 0) {
        L.w_gate = matrix(g, p + "ffn_gate.weight", L.n_ff, c.n_embd, repacked);
        L.w_up = matrix(g, p + "ffn_up.weight", L.n_ff, c.n_embd, repacked);
        L.w_down = matrix(g, p + "ffn_down.weight", c.n_embd, L.n_ff, repacked);
      } else {
        L.router = matrix(g, p + "ffn_gate_inp.weight", c.n_expert, c.n_embd, repacked);
        L.gate_exps = experts(g, p + "ffn_gate_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd, repacked);
        L.up_exps = experts(g, p + "ffn_up_exps.weight", c.n_expert, c.n_ff_exp, c.n_embd, repacked);
        L.down_exps = experts(g, p + "ffn_down_exps.weight", c.n_expert, c.n_embd, c.n_ff_exp, repacked);
        if (c.n_ff_shexp > 0) {
          L.shexp_gate = matrix(g, p + "ffn_gate_inp_shexp.weight", 1, c.n_embd, repacked);
          L.w_gate = matrix(g, p + "ffn_gate_shexp.weight", c.n_ff_shexp, c.n_embd, repacked);
          L.w_up = matrix(g, p + "ffn_up_shexp.weight", c.n_ff_shexp, c.n_embd, repacked);
          L.w_down = matrix(g, p + "ffn_down_shexp.weight", c.n_embd, c.n_ff_shexp, repacked);
        }
      }
      if (c.qkv_bias) {
        L.bq = m->store(vec(g, p + "attn_q.bias", q_dim));
        L.bk = m->store(vec(g, p + "attn_k.bias", kv_dim));
        L.bv = m->store(vec(g, p + "attn_v.bias", kv_dim));
      }
    }
    auto token_id = [&](const std::string& key) {
      if (!g.has(key)) return -1;
      const int64_t id = g.get_int(key);
      if (id < 0 || id >= c.n_vocab)
        throw Error(ErrorCode::invalid_model, path + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary");
      return int(id);
    };
    m->bos_ = token_id("tokenizer.ggml.bos_token_id");
    m->eos_ = token_id("tokenizer.ggml.eos_token_id");
    return m;
  }

 private:
  // A matrix of `rows` rows of `cols` values; one row may also be stored as a vector [cols].
  static WeightMatrix matrix(const GgufFile& g, const std::string& name, int64_t rows, int64_t cols,
                             const std::set<std::string>& repacked) {
    const GgufTensorInfo& t = g.tensor(name);
    const bool row_vector = rows == 1 && t.dims.size() == 1 && t.dims[0] == cols;
    if (!row_vector && (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows))
      throw Error(ErrorCode::invalid_model, g.path() + ": tensor '" + name + "' has shape " + dims_str(t.dims) +
                                                ", expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
    check_computable(g, t);
    return {t.type(), g.tensor_data(t), rows, cols, ggml_row_bytes(t.type(), cols), name, repacked.count(name) > 0};
  }
  // The n matrices of a 3-D expert tensor [cols, rows, n], one view per expert.
  static std::vector<WeightMatrix> experts(const GgufFile& g, const std::string& name, int n, int64_t rows,
                                           int64_t cols, const std::set<std::string>& repacked) {
    const GgufTensorInfo& t = g.tensor(name);
    if (t.dims.size() != 3 || t.dims[0] != cols || t.dims[1] != rows || t.dims[2] != n)
      throw Error(ErrorCode::invalid_model, g.path() + ": tensor '" + name + "' has shape " + dims_str(t.dims) +
                                                ", expected [" + std::to_string(cols) + ", " + std::to_string(rows) +
                                                ", " + std::to_string(n) + "] (columns, rows, experts)");
    check_computable(g, t);
    const int64_t row_bytes = ggml_row_bytes(t.type(), cols);
    std::vector<WeightMatrix> v;
    for (int e = 0; e < n; ++e)
      v.push_back({t.type(), g.tensor_data(t) + e * rows * row_bytes, rows, cols, row_bytes, name,
                   repacked.count(name) > 0});
    return v;
  }
  static void check_computable(const GgufFile& g, const GgufTensorInfo& t) {
    const GgmlTypeInfo* info = ggml_type_info(t.type_id);
    if (!info->computable)
      throw Error(ErrorCode::unsupported, g.path() + ": tensor '" + t.name + "' has type " + std::string(info->name) +
                                              " (slim computes with F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)");
  }
  static std::vector<float> vec(const GgufFile& g, const std::string& name, int64_t n) {
    const GgufTensorInfo& t = g.tensor(name);
    if (t.dims.size() != 1 || t.dims[0] != n)
      throw Error(ErrorCode::invalid_model, g.path() + ": tensor '" + name + "' has shape " + dims_str(t.dims) +
                                                ", expected [" + std::to_string(n) + "]");
    const GgmlTypeInfo* info = ggml_type_info(t.type_id);
    if (!info->computable)
      throw Error(ErrorCode::unsupported, g.path() + ": tensor '" + name + "' has type " + std::string(info->name));
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(t.type(), g.tensor_data(t), v.data(), n);
    return v;
  }
  static std::string dims_str(const std::vector<int64_t>& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }
};

std::shared_ptr<const LlamaModel> LlamaModel::load(const std::string& path, bool map) {
  return ModelLoader::load(path, map);
}

int64_t LlamaModel::n_params() const {
  int64_t n = n_active_params();
  const LlamaConfig& c = config_;
  return n + int64_t(c.n_layer) * (c.n_expert - c.n_expert_used) * 3 * c.n_ff_exp * c.n_embd;
}

int64_t LlamaModel::n_active_params() const {
  const LlamaConfig& c = config_;
  int64_t n = token_embd_.rows * token_embd_.cols + (c.tied_output ? 0 : output_.rows * output_.cols);
  for (const auto& L : layers_)
    for (const WeightMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router, &L.shexp_gate})
      n += w->rows * w->cols;
  return n + int64_t(c.n_layer) * c.n_expert_used * 3 * c.n_ff_exp * c.n_embd;
}

// ---------------------------------------------------------------- compile

namespace {

template <typename T>
struct AlignedBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  void allocate(size_t count) {
    std::free(ptr);
    n = count;
    ptr = static_cast<T*>(std::aligned_alloc(64, std::max<size_t>(64, (count * sizeof(T) + 63) / 64 * 64)));
    if (!ptr) throw Error(ErrorCode::resource_exhausted, "out of memory allocating " + std::to_string(count * sizeof(T)) + " bytes");
    std::memset(static_cast<void*>(ptr), 0, count * sizeof(T));
  }
  ~AlignedBuffer() { std::free(ptr); }
  T* data() { return ptr; }
  const T* data() const { return ptr; }
};

// y rows [0, w->rows) for n activation rows: rows row0.. of source src of a section.
struct MatmulJob {
  const WeightMatrix* w;
  int64_t act_stride;
  int n;
  float* y;
  int64_t ldy;
  DotFn dot;
  TileFn tile;
  Tile16Fn tile16, tile32;
  int64_t unit;  // rows per work item
  int src, row0;
};

// Rows a section converts to activations: rows of src (stride ld) of cols values, or
// rows gather[0..rows) of it.
struct ActSource {
  const float* src;
  int64_t ld;
  int rows;
  int64_t cols;
  const int32_t* gather;
};
constexpr int kMaxSources = 2;

}  // namespace

double ExpertUsage::total_flops() const {
  double f = other_flops + shared_flops();
  for (int64_t r : routed) f += double(r) * expert_token_flops;
  return f;
}

void ExpertUsage::add(const ExpertUsage& o) {
  if (o.routed.size() != routed.size())
    throw Error(ErrorCode::invalid_argument, "ExpertUsage::add: the usages are of different models");
  for (size_t i = 0; i < routed.size(); ++i) routed[i] += o.routed[i];
  tokens += o.tokens;
  other_flops += o.other_flops;
}

void ExpertUsage::clear() {
  std::fill(routed.begin(), routed.end(), 0);
  tokens = 0;
  other_flops = 0;
}

struct LlamaContext::State {
  const KernelSet* k = nullptr;
  int n_batch = 0, n_threads = 1;
  int64_t q_dim = 0, kv_dim = 0;
  AlignedBuffer<float> x, xn, q, kbuf, vbuf, attn, gate, up, logits;
  // MoE: router logits [n_batch][n_expert] and probabilities, the shared expert's gate
  // [n_batch]; per (token, slot) its expert's weight and its row in the expert-ordered
  // pairs; per pair its token; per expert its first pair; the experts' gate, up and down
  // outputs per pair.
  AlignedBuffer<float> router, probs, shexp_gate, route_w, egate, eup, edown;
  std::vector<int32_t> route_pos, pair_token, expert_first;
  // The jobs of a group of matmuls, and of the section running those with one activation format.
  std::vector<MatmulJob> jobs, section_jobs;
  std::vector<int64_t> first;
  // Per thread: activation rows converted for a weight type (act_stride bytes each).
  AlignedBuffer<uint8_t> act;
  int64_t act_stride = 0, act_bytes = 0;
  std::vector<AlignedBuffer<uint8_t>> k_cache, v_cache;  // per layer [n_ctx][kv_dim]
  size_t kv_elem = 2;
  AlignedBuffer<float> rope_cos, rope_sin;  // [n_ctx][n_rot/2]
  // Per-thread attention scratch: scores [query heads per KV head][n_ctx].
  AlignedBuffer<float> scores;
  int64_t scores_stride = 0;
  // Paged cache: the cache, and per row of a pass its position and whether the eviction
  // policy observes its attention; per thread the visible length of each row.
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> row_pos;
  std::vector<uint8_t> row_observe;
  AlignedBuffer<float> kv_scratch;
  int64_t kv_scratch_stride = 0;
  std::vector<int32_t> visible;  // [n_threads][n_batch]
  std::unique_ptr<WorkSplit> split;  // the work items of the current parallel section
  // Paged attention's work items: a KV head of an entry, or every chunks-th row of it.
  struct AttnItem {
    int entry, kvh, chunk, chunks;
  };
  std::vector<AttnItem> attn_items;
};

LlamaContext::LlamaContext(std::shared_ptr<const LlamaModel> model, ContextOptions options)
    : model_(std::move(model)), options_(options), s_(std::make_unique<State>()) {
  const LlamaConfig& c = model_->config();
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : std::min(c.n_ctx_train, 4096);
  if (n_ctx_ > (1 << 20)) throw Error(ErrorCode::invalid_argument, "context size " + std::to_string(n_ctx_) + " is too large");
  if (options.n_batch <= 0) throw Error(ErrorCode::invalid_argument, "batch size must be positive");
  int threads = options.n_threads > 0 ? options.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  // A forward pass is dozens of short parallel sections (one per matmul and attention):
  // workers poll for the next for up to a millisecond instead of sleeping between them.
  pool_ = std::make_unique<ThreadPool>(threads, 1000);
  State& s = *s_;
  s.k = &kernels();
  s.n_threads = pool_->num_threads();
  s.split = std::make_unique<WorkSplit>(s.n_threads);
  const bool paged = options.kv.paged;
  if (paged && (options.kv.max_seqs < 1 || options.kv.max_seqs > 4096))
    throw Error(ErrorCode::invalid_argument, "KV cache: max_seqs must be 1..4096");
  s.n_batch = int(std::min<int64_t>(options.n_batch, int64_t(n_ctx_) * (paged ? options.kv.max_seqs : 1)));
  s.q_dim = int64_t(c.n_head) * c.head_dim;
  s.kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  const size_t nb = size_t(s.n_batch);
  s.x.allocate(nb * c.n_embd);
  s.xn.allocate(nb * std::max<int64_t>(c.n_embd, s.q_dim));
  s.q.allocate(nb * s.q_dim);
  s.kbuf.allocate(nb * s.kv_dim);
  s.vbuf.allocate(nb * s.kv_dim);
  s.attn.allocate(nb * s.q_dim);
  const int64_t n_ff = c.n_expert ? c.n_ff_shexp : c.n_ff;  // the dense network or the shared expert
  s.gate.allocate(nb * n_ff);
  s.up.allocate(nb * n_ff);
  s.logits.allocate(std::max<size_t>(options.all_logits ? nb : 1, paged ? size_t(options.kv.max_seqs) : 1) *
                    size_t(c.n_vocab));
  const size_t pairs = nb * size_t(c.n_expert_used);
  if (c.n_expert) {
    s.router.allocate(nb * c.n_expert);
    s.probs.allocate(size_t(c.n_expert));
    s.shexp_gate.allocate(nb);
    s.route_w.allocate(pairs);
    s.egate.allocate(pairs * c.n_ff_exp);
    s.eup.allocate(pairs * c.n_ff_exp);
    s.edown.allocate(pairs * c.n_embd);
    s.route_pos.resize(pairs);
    s.pair_token.resize(pairs);
    s.expert_first.resize(size_t(c.n_expert) + 1);
    ExpertUsage u;
    u.n_layer = c.n_layer;
    u.n_expert = c.n_expert;
    u.routed.assign(size_t(c.n_layer) * c.n_expert, 0);
    u.expert_token_flops = 6.0 * c.n_embd * c.n_ff_exp;
    u.shared_token_flops = c.n_ff_shexp ? 6.0 * c.n_embd * c.n_ff_shexp + 2.0 * c.n_embd : 0;
    usage_total_ = u;
    usage_.assign(paged ? size_t(options.kv.max_seqs) : 1, u);
  }
  const size_t max_jobs = std::max<size_t>(4, 2 * size_t(c.n_expert) + 1);
  s.jobs.resize(max_jobs);
  s.section_jobs.resize(max_jobs);
  s.first.resize(max_jobs + 1);
  const int64_t max_cols = std::max<int64_t>({c.n_embd, n_ff, c.n_ff_exp, s.q_dim});
  s.act_stride = max_act_row_bytes(max_cols);
  // A MoE layer's down projections convert every (token, expert) pair and the shared expert's rows.
  s.act_bytes = (int64_t(nb + pairs) * s.act_stride + 63) / 64 * 64;
  s.act.allocate(size_t(s.n_threads) * size_t(s.act_bytes));
  s.kv_elem = options.f16_kv ? 2 : 4;
  if (paged) {
    KvLayout lay;
    lay.n_layer = c.n_layer;
    lay.n_head_kv = c.n_head_kv;
    lay.head_dim = c.head_dim;
    for (int l = 0; l < c.n_layer; ++l) lay.layer_heads.push_back(model_->layer(l).n_head_kv);
    if (std::all_of(lay.layer_heads.begin(), lay.layer_heads.end(), [&](int h) { return h == c.n_head_kv; }))
      lay.layer_heads.clear();  // every layer as wide as the widest
    lay.q4_recent_blocks = options.kv.q4_recent_blocks;
    lay.q8_recent = options.kv.q8_recent;
    auto per_layer = [&](const std::vector<KvType>& v, KvType all, const char* what) {
      if (!v.empty() && int(v.size()) != c.n_layer)
        throw Error(ErrorCode::invalid_argument, std::string("KV cache: ") + what + " types given for " +
                                                     std::to_string(v.size()) + " layers, the model has " +
                                                     std::to_string(c.n_layer));
      return v.empty() ? std::vector<KvType>(size_t(c.n_layer), all) : v;
    };
    lay.k_type = per_layer(options.kv.layer_k, options.kv.k_type, "key");
    lay.v_type = per_layer(options.kv.layer_v, options.kv.v_type, "value");
    s.cache = std::make_unique<KvCache>(lay, options.kv.max_seqs, n_ctx_, options.kv.pool_bytes, options.kv.pool_seqs);
    s.cache->add_sequence();
    s.row_pos.resize(nb);
    s.row_observe.resize(nb);
    s.kv_scratch_stride = (s.cache->scratch_floats(c.n_head / c.n_head_kv) + 15) / 16 * 16;
    s.kv_scratch.allocate(size_t(s.n_threads) * size_t(s.kv_scratch_stride));
    s.visible.resize(size_t(s.n_threads) * nb);
    s.attn_items.reserve(nb * size_t(c.n_head_kv));  // an item has at least one row
  }
  s.k_cache.resize(paged ? 0 : size_t(c.n_layer));
  s.v_cache.resize(paged ? 0 : size_t(c.n_layer));
  // Each layer's rows are its own KV heads wide (a pruned layer's cache is smaller).
  for (int l = 0; l < (paged ? 0 : c.n_layer); ++l) {
    const size_t kv_dim = size_t(model_->layer(l).n_head_kv) * size_t(c.head_dim);
    s.k_cache[size_t(l)].allocate(size_t(n_ctx_) * kv_dim * s.kv_elem);
    s.v_cache[size_t(l)].allocate(size_t(n_ctx_) * kv_dim * s.kv_elem);
  }
  // ggml's RoPE angles: theta advances by repeated float multiplication, which the
  // table reproduces so positions rotate exactly as in llama.cpp.
  const int half = c.n_rot / 2;
  s.rope_cos.allocate(size_t(n_ctx_) * half);
  s.rope_sin.allocate(size_t(n_ctx_) * half);
  const float theta_scale = std::pow(c.rope_base, -2.0f / float(c.n_rot));
  for (int p = 0; p < n_ctx_; ++p) {
    float theta = float(p);
    for (int i = 0; i < half; ++i) {
      s.rope_cos.data()[size_t(p) * half + i] = std::cos(theta);
      s.rope_sin.data()[size_t(p) * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
  s.scores_stride = (n_ctx_ + 15) / 16 * 16 + 2 * c.head_dim;
  s.scores.allocate(size_t(s.n_threads) * s.scores_stride * size_t(c.n_head / c.n_head_kv));
}

LlamaContext::~LlamaContext() = default;

const char* LlamaContext::kernel_isa() const { return s_->k->isa; }

const float* LlamaContext::logits() const {
  if (last_batch_ == 0) throw Error(ErrorCode::invalid_argument, "no logits: nothing evaluated yet");
  return s_->logits.data() + (options_.all_logits ? size_t(last_batch_ - 1) * model_->config().n_vocab : 0);
}

const float* LlamaContext::logits(int i) const {
  if (!options_.all_logits) {
    if (i != last_batch_ - 1) throw Error(ErrorCode::invalid_argument, "logits of token " + std::to_string(i) + " not kept (all_logits is off)");
    return logits();
  }
  if (i < 0 || i >= last_batch_) throw Error(ErrorCode::invalid_argument, "logits index " + std::to_string(i) + " out of range");
  return s_->logits.data() + size_t(i) * model_->config().n_vocab;
}

void LlamaContext::truncate(int n) {
  if (n < 0 || n > n_past_) throw Error(ErrorCode::invalid_argument, "truncate: position " + std::to_string(n) + " beyond the sequence");
  if (s_->cache) {
    if (!s_->cache->active(0)) s_->cache->add_sequence();
    s_->cache->truncate(0, n);
  }
  n_past_ = n;
}

KvCache& LlamaContext::kv_cache() {
  if (!s_->cache) throw Error(ErrorCode::invalid_argument, "the context has no paged KV cache (ContextOptions::kv.paged)");
  return *s_->cache;
}
const KvCache& LlamaContext::kv_cache() const { return const_cast<LlamaContext*>(this)->kv_cache(); }

int LlamaContext::add_sequence() {
  const int seq = kv_cache().add_sequence();
  if (!usage_.empty()) usage_[size_t(seq)].clear();
  return seq;
}
int LlamaContext::fork_sequence(int src, int n_tokens) {
  const int seq = kv_cache().fork_sequence(src, n_tokens);
  if (!usage_.empty()) usage_[size_t(seq)].clear();
  return seq;
}

const ExpertUsage& LlamaContext::expert_usage(int seq) const {
  if (usage_.empty()) return usage_total_;  // a dense model's: empty
  if (seq < 0 || seq >= int(usage_.size()))
    throw Error(ErrorCode::invalid_argument, "expert_usage: no sequence " + std::to_string(seq));
  return usage_[size_t(seq)];
}

void LlamaContext::clear_expert_usage(int seq) {
  expert_usage(seq);  // checks seq
  if (!usage_.empty()) usage_[size_t(seq)].clear();
}
void LlamaContext::remove_sequence(int seq) {
  kv_cache().remove_sequence(seq);
  if (seq == 0) n_past_ = 0;
}

const float* LlamaContext::sequence_logits(int i) const {
  if (i < 0 || i >= int(last_entries_.size()))
    throw Error(ErrorCode::invalid_argument, "sequence_logits: entry " + std::to_string(i) + " of " +
                                                 std::to_string(last_entries_.size()));
  const Entry& e = last_entries_[size_t(i)];
  const int row = options_.all_logits ? e.row0 + e.n - 1 : i;
  return s_->logits.data() + size_t(row) * model_->config().n_vocab;
}

void LlamaContext::eval_sequences(std::span<const SeqTokens> batch) {
  KvCache& cache = kv_cache();
  const int n_vocab = model_->config().n_vocab;
  int64_t total = 0, blocks = 0;
  std::vector<Entry> entries;
  entries.reserve(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const SeqTokens& st = batch[b];
    if (!cache.active(st.seq)) throw Error(ErrorCode::invalid_argument, "eval_sequences: no sequence " + std::to_string(st.seq));
    if (st.tokens.empty()) throw Error(ErrorCode::invalid_argument, "eval_sequences: no tokens for sequence " + std::to_string(st.seq));
    for (size_t j = 0; j < b; ++j)
      if (batch[j].seq == st.seq) throw Error(ErrorCode::invalid_argument, "eval_sequences: sequence " + std::to_string(st.seq) + " appears twice");
    for (size_t i = 0; i < st.tokens.size(); ++i)
      if (st.tokens[i] < 0 || st.tokens[i] >= n_vocab)
        throw Error(ErrorCode::invalid_argument, "token id " + std::to_string(st.tokens[i]) + " of sequence " +
                                                     std::to_string(st.seq) + " is outside the vocabulary of " + std::to_string(n_vocab));
    const int np = cache.n_past(st.seq);
    if (int64_t(np) + int64_t(st.tokens.size()) > n_ctx_)
      throw Error(ErrorCode::resource_exhausted, "context full: sequence " + std::to_string(st.seq) + " at " +
                                                     std::to_string(np) + " + " + std::to_string(st.tokens.size()) +
                                                     " tokens exceeds the context of " + std::to_string(n_ctx_));
    blocks += cache.blocks_needed(st.seq, int(st.tokens.size()));
    entries.push_back({st.seq, int(total), int(st.tokens.size()), np});
    total += int64_t(st.tokens.size());
  }
  if (total == 0) return;
  if (total > s_->n_batch)
    throw Error(ErrorCode::invalid_argument, "eval_sequences: " + std::to_string(total) + " tokens exceed the batch size " +
                                                 std::to_string(s_->n_batch));
  if (blocks > cache.pool().free_blocks())
    throw Error(ErrorCode::resource_exhausted, "KV pool exhausted: the batch needs " + std::to_string(blocks) + " blocks, " +
                                                   std::to_string(cache.pool().free_blocks()) + " of " +
                                                   std::to_string(cache.pool().capacity()) + " are free");
  std::vector<int32_t> tokens;
  tokens.reserve(size_t(total));
  for (const SeqTokens& st : batch) tokens.insert(tokens.end(), st.tokens.begin(), st.tokens.end());
  forward(tokens.data(), int(total), entries);
}

// ---------------------------------------------------------------- run

namespace {

// y = x / rms(x) * w for `rows` consecutive rows of n values. Each row's sum of
// squares is one chain of double additions in column order, which fixes its bits; the
// rows of a batch go 8 at a time so that their chains overlap instead of each waiting on
// the adder's latency (8 decode rows: 8x faster, same bits).
void rms_norm_rows(const float* x, const float* w, float* y, int rows, int64_t n, float eps) {
  for (int r0 = 0; r0 < rows; r0 += 8) {
    const int m = std::min(8, rows - r0);
    double sum[8] = {};
    const float* xr = x + r0 * n;
    if (m == 8)
      for (int64_t i = 0; i < n; ++i)
        for (int r = 0; r < 8; ++r) sum[r] += double(xr[r * n + i]) * xr[r * n + i];
    else
      for (int64_t i = 0; i < n; ++i)
        for (int r = 0; r < m; ++r) sum[r] += double(xr[r * n + i]) * xr[r * n + i];
    for (int r = 0; r < m; ++r) {
      const float scale = 1.0f / std::sqrt(float(sum[r] / double(n)) + eps);
      float* yr = y + (r0 + r) * n;
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[r * n + i] * scale * w[i];
    }
  }
}

// Rows per work item of a matmul: a tile's rows (see run_matmul_rows); for one token two
// 16-row tiles, so that a claim is not made for every 16 rows.
int64_t matmul_unit(const WeightMatrix& w, bool tile32, bool tile, int n) {
  if (w.x16) return (tile32 && n >= 4) || n == 1 ? 32 : 16;
  return tile ? 16 : 8;
}

// y rows [r0, r1) for every token.
void run_matmul_rows(const MatmulJob& j, const uint8_t* act, int64_t r0, int64_t r1) {
  if (j.w->x16) {
    // Each group of 16 rows (a few KB per 1,000 columns) stays in L1 while the tokens
    // pass it 8 at a time; with 4 tokens, or more than 8, and a 32-row tile, pairs of
    // groups pass them 4 at a time. Not for 5-8 tokens (a batched decode step): there the
    // 32-row tile's first pass over the weights, which come from memory, does only 4
    // multiply-adds per weight, while one pass of the 16-row tile does all of them (in
    // one process, alternating: 8 sequences at 1 thread 4-22 % faster, at 2 threads
    // -2 to +11 %; 12 and 16 sequences were faster with the 32-row tile at 2 threads).
    int64_t r = r0;
    if (j.tile32 && (j.n == 4 || j.n > 8))
      for (; r + 16 < r1; r += 32)
        for (int t = 0; t < j.n; t += 4)
          j.tile32(j.w->cols, j.w->data + r * j.w->row_bytes, int(std::min<int64_t>(32, r1 - r)), act + t * j.act_stride,
                   j.act_stride, std::min(4, j.n - t), j.y + t * j.ldy + r, j.ldy);
    for (; r < r1; r += 16)
      for (int t = 0; t < j.n; t += 8)
        j.tile16(j.w->cols, j.w->data + r * j.w->row_bytes, int(std::min<int64_t>(16, r1 - r)), act + t * j.act_stride,
                 j.act_stride, std::min(8, j.n - t), j.y + t * j.ldy + r, j.ldy);
    return;
  }
  if (j.tile) {
    // 16 rows stay in L1 while every token passes them in tiles of 4 x 4.
    for (int t = 0; t < j.n; t += 4)
      for (int64_t r = r0; r < r1; r += 4)
        j.tile(j.w->cols, j.w->data + r * j.w->row_bytes, j.w->row_bytes, int(std::min<int64_t>(4, r1 - r)),
               act + t * j.act_stride, j.act_stride, std::min(4, j.n - t), j.y + t * j.ldy + r, j.ldy);
    return;
  }
  for (int t = 0; t < j.n; ++t) {
    const uint8_t* a = act + t * j.act_stride;
    float* yt = j.y + t * j.ldy;
    for (int64_t r = r0; r < r1; ++r) yt[r] = j.dot(j.w->cols, j.w->data + r * j.w->row_bytes, a);
  }
}

}  // namespace

void LlamaContext::eval(std::span<const int32_t> tokens) {
  const int n_vocab = model_->config().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      throw Error(ErrorCode::invalid_argument, "token id " + std::to_string(tokens[i]) + " at position " +
                                                   std::to_string(i) + " is outside the vocabulary of " + std::to_string(n_vocab));
  if (tokens.empty()) return;
  if (int64_t(n_past_) + int64_t(tokens.size()) > n_ctx_)
    throw Error(ErrorCode::resource_exhausted, "context full: " + std::to_string(n_past_) + " + " +
                                                   std::to_string(tokens.size()) + " tokens exceed the context of " + std::to_string(n_ctx_));
  if (options_.all_logits && int(tokens.size()) > s_->n_batch)
    throw Error(ErrorCode::invalid_argument, "all_logits: " + std::to_string(tokens.size()) +
                                                 " tokens exceed the batch size " + std::to_string(s_->n_batch));
  if (s_->cache) {
    if (!s_->cache->active(0)) s_->cache->add_sequence();
    // Checked for the whole input up front so a long prompt fails before any chunk runs.
    s_->cache->check_append(0, int(tokens.size()));
  }
  for (size_t off = 0; off < tokens.size(); off += size_t(s_->n_batch)) {
    const int n = int(std::min<size_t>(size_t(s_->n_batch), tokens.size() - off));
    eval_batch(tokens.data() + off, n);
  }
}

void LlamaContext::eval_batch(const int32_t* tokens, int n) {
  const Entry e{s_->cache ? 0 : -1, 0, n, n_past_};
  forward(tokens, n, std::span<const Entry>(&e, 1));
}

void LlamaContext::forward(const int32_t* tokens, int n, std::span<const Entry> entries) {
  State& s = *s_;
  KvCache* cache = s.cache.get();
  const KvPolicy* policy = options_.kv.policy.get();
  const LlamaConfig& c = model_->config();
  const LlamaModel& m = *model_;
  const int64_t d = c.n_embd;
  ThreadPool& pool = *pool_;
  const int T = s.n_threads;
  const int p0 = n_past_;
  if (cache) {
    const int w = policy ? policy->observe_window() : 0;
    for (const Entry& e : entries)
      for (int t = 0; t < e.n; ++t) {
        s.row_pos[size_t(e.row0 + t)] = e.p0 + t;
        s.row_observe[size_t(e.row0 + t)] = w < 0 || (w > 0 && (e.n == 1 || t >= e.n - w));
      }
  }

  for (int t = 0; t < n; ++t) {
    const WeightMatrix& e = m.token_embd();
    dequantize_row(e.type, e.data + int64_t(tokens[t]) * e.row_bytes, s.x.data() + t * d, d);
  }

  // Matrix products run as parallel sections of jobs (y = source rows @ w^T), all the jobs
  // that share activations in one section (q, k and v, or gate and up: one wait for the
  // threads instead of one per matrix; a quantized model may mix activation formats, then
  // one section per format). Each thread first converts the sources' rows to the
  // activation format into its own buffer: a buffer written by one thread and read by the
  // other cost more in cache-line transfers than converting on both (8 sequences, 2
  // threads: 0.10 ms of a 1.8 ms step). Items run the jobs one after the other, each job's
  // rows in order: items that took the same rows of gate and up (and finished them with
  // SiLU) interleaved two weight streams, which made one-sequence decode 3-4 % slower.
  auto job = [&](const WeightMatrix& w, int src, int row0, int rows, float* y, int64_t ldy) {
    const TileFn tile = tile_fn(*s.k, w.type);
    MatmulJob j{&w, s.act_stride, rows, y, ldy, w.x16 ? nullptr : dot_fn(*s.k, w.type), tile, tile16_fn(*s.k, w.type),
                w.type == GgmlType::f16 ? s.k->tile_f16x32 : nullptr, 0, src, row0};
    j.unit = matmul_unit(w, j.tile32 != nullptr, tile != nullptr, rows);
    return j;
  };
  auto section = [&](const ActSource* sources, int nsrc, ActType at, int nj) {
    const MatmulJob* jobs = s.section_jobs.data();
    int64_t* first = s.first.data();
    int base[kMaxSources] = {};
    uint32_t used = 0;
    first[0] = 0;
    for (int i = 0; i < nj; ++i) {
      used |= 1u << jobs[i].src;
      first[i + 1] = first[i] + (jobs[i].w->rows + jobs[i].unit - 1) / jobs[i].unit;
    }
    for (int i = 0, rows = 0; i < nsrc; ++i)
      if (used >> i & 1) {
        base[i] = rows;
        rows += sources[i].rows;
      }
    s.split->reset(first[nj]);
    pool.parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t slot = b; slot < e; ++slot) {
        uint8_t* act = s.act.data() + slot * s.act_bytes;
        for (int i = 0; i < nsrc; ++i) {
          if (!(used >> i & 1)) continue;
          const ActSource& a = sources[i];
          uint8_t* dst = act + base[i] * s.act_stride;
          for (int t = 0; t < a.rows; ++t)
            quantize_act_row(*s.k, at, a.src + (a.gather ? a.gather[t] : t) * a.ld, dst + t * s.act_stride, a.cols);
        }
        for (int64_t item; s.split->next(int(slot), &item);) {
          const int p = int(std::upper_bound(first + 1, first + nj + 1, item) - (first + 1));
          const MatmulJob& j = jobs[p];
          const int64_t r0 = (item - first[p]) * j.unit;
          run_matmul_rows(j, act + (base[j.src] + j.row0) * s.act_stride, r0, std::min(j.w->rows, r0 + j.unit));
        }
      }
    });
  };
  // Runs s.jobs[0, nj): a section per activation format among their weights.
  auto run_jobs = [&](const ActSource* sources, int nsrc, int nj) {
    uint32_t done = 0;
    for (int i = 0; i < nj; ++i) {
      const ActType at = act_type_for(s.jobs[size_t(i)].w->type);
      if (done >> int(at) & 1) continue;
      done |= 1u << int(at);
      int m = 0;
      for (int j = i; j < nj; ++j) {
        const MatmulJob& jb = s.jobs[size_t(j)];
        if (jb.src >= nsrc || jb.w->cols != sources[jb.src].cols) throw Error(ErrorCode::internal, "matmul: source and weight widths differ");
        if (act_type_for(jb.w->type) == at) s.section_jobs[size_t(m++)] = jb;
      }
      section(sources, nsrc, at, m);
    }
  };
  struct Part {
    const WeightMatrix& w;
    float* y;
    int64_t ldy;
  };
  // y_p = src @ w_p^T for `rows` rows of src (stride ld) and each part p.
  auto matmul = [&](const float* src, int64_t ld, int rows, std::initializer_list<Part> parts) {
    const ActSource in{src, ld, rows, parts.begin()->w.cols, nullptr};
    int nj = 0;
    for (const Part& p : parts) s.jobs[size_t(nj++)] = job(p.w, 0, 0, rows, p.y, p.ldy);
    run_jobs(&in, 1, nj);
  };

  // Mixture of Experts on the normalized rows in s.xn, added to the residual stream.
  // The router's softmax picks each token's top k experts (weights renormalized to sum 1
  // where the architecture does: Mixtral, not qwen2moe); the (token, expert) pairs are
  // ordered by expert, so each selected expert runs once over all its rows with the dense
  // kernels, and an expert no token chose is not read at all. The weighted sum follows
  // llama.cpp's order (slot by slot, then the shared expert, then the residual).
  auto moe_ffn = [&](const LayerWeights& L, int l) {
    const int E = c.n_expert, K = c.n_expert_used;
    const int64_t fe = c.n_ff_exp, fs = c.n_ff_shexp;
    const ActSource in[1] = {{s.xn.data(), d, n, d, nullptr}};
    int nj = 0;
    s.jobs[size_t(nj++)] = job(L.router, 0, 0, n, s.router.data(), E);
    if (fs) {
      s.jobs[size_t(nj++)] = job(L.shexp_gate, 0, 0, n, s.shexp_gate.data(), 1);
      s.jobs[size_t(nj++)] = job(L.w_gate, 0, 0, n, s.gate.data(), fs);
      s.jobs[size_t(nj++)] = job(L.w_up, 0, 0, n, s.up.data(), fs);
    }
    run_jobs(in, 1, nj);

    int32_t* first = s.expert_first.data();
    std::fill(first, first + E + 1, 0);
    float* p = s.probs.data();
    for (int t = 0; t < n; ++t) {
      const float* lg = s.router.data() + int64_t(t) * E;
      const float mx = *std::max_element(lg, lg + E);
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += p[e] = std::exp(lg[e] - mx);
      const float inv = float(1.0 / sum);
      for (int e = 0; e < E; ++e) p[e] *= inv;
      float* w = s.route_w.data() + int64_t(t) * K;
      int32_t* sel = s.route_pos.data() + int64_t(t) * K;  // the experts for now, their pair rows below
      double wsum = 0;
      for (int j = 0; j < K; ++j) {
        int best = -1;
        for (int e = 0; e < E; ++e)
          if ((best < 0 || p[e] > p[best]) && std::find(sel, sel + j, e) == sel + j) best = e;
        sel[j] = best;
        wsum += w[j] = p[best];
        ++first[best + 1];
      }
      if (c.expert_norm) {
        const float div = std::max(float(wsum), 6.103515625e-5f);  // llama.cpp's clamp
        for (int j = 0; j < K; ++j) w[j] /= div;
      }
    }
    for (int e = 0; e < E; ++e) first[e + 1] += first[e];
    for (const Entry& en : entries) {
      int64_t* routed = usage_.empty() ? nullptr : usage_[size_t(std::max(en.seq, 0))].routed.data() + int64_t(l) * E;
      for (int t = en.row0; t < en.row0 + en.n; ++t)
        for (int j = 0; j < K; ++j) {
          int32_t& pos = s.route_pos[size_t(t * K + j)];
          const int e = pos;
          if (routed) ++routed[e];
          ++usage_total_.routed[size_t(l * E + e)];
          pos = first[e]++;  // first[e] ends at its successor's start
          s.pair_token[size_t(pos)] = t;
        }
    }
    for (int e = E; e > 0; --e) first[e] = first[e - 1];
    first[0] = 0;

    const ActSource pairs[1] = {{s.xn.data(), d, n * K, d, s.pair_token.data()}};
    nj = 0;
    for (int e = 0; e < E; ++e)
      if (const int m = first[e + 1] - first[e]) {
        s.jobs[size_t(nj++)] = job(L.gate_exps[size_t(e)], 0, first[e], m, s.egate.data() + first[e] * fe, fe);
        s.jobs[size_t(nj++)] = job(L.up_exps[size_t(e)], 0, first[e], m, s.eup.data() + first[e] * fe, fe);
      }
    run_jobs(pairs, 1, nj);
    s.k->silu_mul(s.egate.data(), s.eup.data(), int64_t(n) * K * fe);
    if (fs) s.k->silu_mul(s.gate.data(), s.up.data(), int64_t(n) * fs);
    const ActSource hidden[2] = {{s.egate.data(), fe, n * K, fe, nullptr}, {s.gate.data(), fs, n, fs, nullptr}};
    nj = 0;
    for (int e = 0; e < E; ++e)
      if (const int m = first[e + 1] - first[e])
        s.jobs[size_t(nj++)] = job(L.down_exps[size_t(e)], 0, first[e], m, s.edown.data() + first[e] * d, d);
    if (fs) s.jobs[size_t(nj++)] = job(L.w_down, 1, 0, n, s.xn.data(), d);
    run_jobs(hidden, 2, nj);

    for (int t = 0; t < n; ++t) {
      const float* w = s.route_w.data() + int64_t(t) * K;
      const int32_t* pos = s.route_pos.data() + int64_t(t) * K;
      // llama.cpp computes the shared expert's sigmoid gate as silu(g) / g.
      const float g = fs ? 1.0f / (1.0f + std::exp(-s.shexp_gate.data()[t])) : 0.0f;
      const float* sh = s.xn.data() + int64_t(t) * d;
      float* xt = s.x.data() + int64_t(t) * d;
      for (int64_t i = 0; i < d; ++i) {
        float acc = s.edown.data()[pos[0] * d + i] * w[0];
        for (int j = 1; j < K; ++j) acc += s.edown.data()[pos[j] * d + i] * w[j];
        if (fs) acc += sh[i] * g;
        xt[i] += acc;
      }
    }
  };

  const int half = c.n_rot / 2;
  auto rope = [&](float* v, int heads, int pos) {
    const float* cs = s.rope_cos.data() + size_t(pos) * half;
    const float* sn = s.rope_sin.data() + size_t(pos) * half;
    for (int h = 0; h < heads; ++h) {
      float* x = v + int64_t(h) * c.head_dim;
      if (c.rope_neox) {
        for (int i = 0; i < half; ++i) {
          const float x0 = x[i], x1 = x[i + half];
          x[i] = x0 * cs[i] - x1 * sn[i];
          x[i + half] = x0 * sn[i] + x1 * cs[i];
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float x0 = x[2 * i], x1 = x[2 * i + 1];
          x[2 * i] = x0 * cs[i] - x1 * sn[i];
          x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
      }
    }
  };

  const float kq_scale = 1.0f / std::sqrt(float(c.head_dim));
  const int group = c.n_head / c.n_head_kv;

  // Paged attention: one item per (entry, KV head), so a stream's policy bookkeeping has
  // one writer and the group's query heads read its blocks while they are in cache. Without
  // an observing policy an item may also take every k-th row, which spreads a single
  // sequence's prefill over more threads than it has KV heads.
  const bool observing = policy && policy->observe_window() != 0;
  const KvObserver observer = policy ? policy->observer() : KvObserver{};
  auto attend_paged = [&](int l, int n_head_kv) {
    const int base_items = int(entries.size()) * n_head_kv;
    const int chunks = observing ? 1 : std::max(1, (2 * T + base_items - 1) / base_items);
    s.attn_items.clear();
    for (int ei = 0; ei < int(entries.size()); ++ei)
      for (int kvh = 0; kvh < n_head_kv; ++kvh) {
        const int ce = std::min(chunks, entries[size_t(ei)].n);
        for (int ch = 0; ch < ce; ++ch) s.attn_items.push_back({ei, kvh, ch, ce});
      }
    s.split->reset(int64_t(s.attn_items.size()));
    const int hd = c.head_dim;
    pool.parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t slot = b; slot < e; ++slot) {
        float* scratch = s.kv_scratch.data() + slot * s.kv_scratch_stride;
        int32_t* vis = s.visible.data() + slot * s.n_batch;
        for (int64_t i; s.split->next(int(slot), &i);) {
          const State::AttnItem& it = s.attn_items[size_t(i)];
          const Entry& en = entries[size_t(it.entry)];
          const int base = cache->stream(en.seq, l, it.kvh).n - en.n;
          int nq = 0;
          for (int t = it.chunk; t < en.n; t += it.chunks) vis[nq++] = base + t + 1;
          const int64_t off = int64_t(en.row0 + it.chunk) * s.q_dim + int64_t(it.kvh) * group * hd;
          cache->attend(en.seq, l, it.kvh, s.q.data() + off, s.q_dim * it.chunks, nq, group, vis,
                        observing ? s.row_observe.data() + en.row0 : nullptr, observer, kq_scale, s.attn.data() + off,
                        s.q_dim * it.chunks, scratch);
        }
      }
    });
  };

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = m.layer(l);
    // A pruned layer fills the first q_dim and kv_dim values of the widest layer's rows.
    const int64_t q_dim = L.wq.rows, kv_dim = L.wk.rows, n_ff = L.n_ff;
    rms_norm_rows(s.x.data(), L.attn_norm, s.xn.data(), n, d, c.rms_eps);
    matmul(s.xn.data(), d, n, {{L.wq, s.q.data(), s.q_dim}, {L.wk, s.kbuf.data(), s.kv_dim}, {L.wv, s.vbuf.data(), s.kv_dim}});
    for (int t = 0; t < n; ++t) {
      float* q = s.q.data() + t * s.q_dim;
      float* k = s.kbuf.data() + t * s.kv_dim;
      float* v = s.vbuf.data() + t * s.kv_dim;
      if (c.qkv_bias) {
        for (int64_t i = 0; i < q_dim; ++i) q[i] += L.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) k[i] += L.bk[i];
        for (int64_t i = 0; i < kv_dim; ++i) v[i] += L.bv[i];
      }
      const int pos = cache ? s.row_pos[size_t(t)] : p0 + t;
      rope(q, int(q_dim / c.head_dim), pos);
      rope(k, L.n_head_kv, pos);
      if (cache) continue;
      uint8_t* kc = s.k_cache[size_t(l)].data() + size_t(p0 + t) * size_t(kv_dim) * s.kv_elem;
      uint8_t* vc = s.v_cache[size_t(l)].data() + size_t(p0 + t) * size_t(kv_dim) * s.kv_elem;
      if (s.kv_elem == 2) {
        s.k->f32_to_f16_row(k, reinterpret_cast<uint16_t*>(kc), kv_dim);
        s.k->f32_to_f16_row(v, reinterpret_cast<uint16_t*>(vc), kv_dim);
      } else {
        std::memcpy(kc, k, size_t(kv_dim) * 4);
        std::memcpy(vc, v, size_t(kv_dim) * 4);
      }
    }

    if (cache) {
      for (const Entry& e : entries)
        for (int t = e.row0; t < e.row0 + e.n; ++t)
          cache->append(e.seq, l, s.row_pos[size_t(t)], s.kbuf.data() + t * s.kv_dim, s.vbuf.data() + t * s.kv_dim);
      attend_paged(l, L.n_head_kv);
    } else {
    // Causal attention, one (token, KV head) pair per item with the query heads that
    // share the KV head (grouped-query attention), so each key and value row is read and
    // converted once for all of them; items are dealt round-robin so the longer rows of
    // late tokens spread over the threads.
    struct AttnJob {
      LlamaContext::State* s;
      const LlamaConfig* c;
      int layer, n, p0, group, T, n_head_kv;
      float scale;
    } aj{&s, &c, l, n, p0, group, T, L.n_head_kv, kq_scale};
    const AttnJob* ap = &aj;
    pool.parallel_for(T, [ap](int64_t b, int64_t e) {
      const AttnJob& j = *ap;
      State& st = *j.s;
      const int hd = j.c->head_dim, g = j.group;
      const int64_t ls = st.scores_stride;
      for (int64_t slot = b; slot < e; ++slot) {
        float* scores = st.scores.data() + slot * ls * g;
        const int items = j.n * j.n_head_kv;
        for (int it = int(slot); it < items; it += j.T) {
          const int t = it / j.n_head_kv, kvh = it % j.n_head_kv;
          const int len = j.p0 + t + 1;
          const float* q = st.q.data() + t * st.q_dim + int64_t(kvh) * g * hd;
          float* out = st.attn.data() + t * st.q_dim + int64_t(kvh) * g * hd;
          const uint8_t* kc = st.k_cache[size_t(j.layer)].data();
          const uint8_t* vc = st.v_cache[size_t(j.layer)].data();
          const int64_t kv_dim = int64_t(j.n_head_kv) * hd;  // the layer's row
          const size_t row = size_t(kv_dim) * st.kv_elem;
          const size_t off = size_t(kvh) * hd * st.kv_elem;
          // f16 rows go through the same kernels as the paged cache, so a paged cache
          // that keeps everything reproduces this one bit for bit (a query's result does
          // not depend on how many share the call).
          const KvAttentionKernels& ak = kv_attention_kernels();
          if (st.kv_elem == 2)
            ak.scores_f16(KvF16Rows::contiguous(reinterpret_cast<const uint16_t*>(kc + off), kv_dim), len, q, g, hd,
                          scores, ls);
          for (int qh = 0; qh < g; ++qh) {
            float* sc = scores + qh * ls;
            if (st.kv_elem != 2)
              for (int p = 0; p < len; ++p) sc[p] = st.k->dot_f32(hd, kc + p * row + off, q + qh * hd);
            ak.softmax(sc, len, j.scale);
            float* o = out + qh * hd;
            std::fill(o, o + hd, 0.f);
            if (st.kv_elem != 2)
              for (int p = 0; p < len; ++p) {
                const float* v = reinterpret_cast<const float*>(vc + p * row + off);
                for (int i = 0; i < hd; ++i) o[i] += sc[p] * v[i];
              }
          }
          if (st.kv_elem == 2)
            ak.accumulate_f16(KvF16Rows::contiguous(reinterpret_cast<const uint16_t*>(vc + off), kv_dim), len, scores,
                              ls, g, hd, out);
        }
      }
    });
    }

    if (options_.observe) options_.observe(l, false, s.attn.data(), n, s.q_dim, q_dim);
    matmul(s.attn.data(), s.q_dim, n, {{L.wo, s.xn.data(), d}});
    for (int64_t i = 0; i < int64_t(n) * d; ++i) s.x.data()[i] += s.xn.data()[i];
    rms_norm_rows(s.x.data(), L.ffn_norm, s.xn.data(), n, d, c.rms_eps);
    if (c.n_expert) {
      moe_ffn(L, l);
      continue;
    }
    matmul(s.xn.data(), d, n, {{L.w_gate, s.gate.data(), n_ff}, {L.w_up, s.up.data(), n_ff}});
    s.k->silu_mul(s.gate.data(), s.up.data(), int64_t(n) * n_ff);
    if (options_.observe) options_.observe(l, true, s.gate.data(), n, n_ff, n_ff);
    matmul(s.gate.data(), n_ff, n, {{L.w_down, s.xn.data(), d}});
    for (int64_t i = 0; i < int64_t(n) * d; ++i) s.x.data()[i] += s.xn.data()[i];
  }

  // Logits of every row (all_logits) or of each entry's last row, in entry order.
  int rows = 0;
  if (options_.all_logits) {
    rms_norm_rows(s.x.data(), m.output_norm(), s.xn.data(), n, d, c.rms_eps);
    rows = n;
  } else {
    for (const Entry& e : entries)
      rms_norm_rows(s.x.data() + int64_t(e.row0 + e.n - 1) * d, m.output_norm(), s.xn.data() + int64_t(rows++) * d, 1, d, c.rms_eps);
  }
  matmul(s.xn.data(), d, rows, {{m.output(), s.logits.data(), c.n_vocab}});
  last_entries_.assign(entries.begin(), entries.end());
  if (!usage_.empty()) {
    // The work besides the experts, per token and layer: the attention projections and the
    // router, and attention over every earlier position (as if the cache kept them all);
    // then the output head per row whose logits were computed.
    const double per_token = 4.0 * d * (s.q_dim + s.kv_dim) + 2.0 * d * c.n_expert;
    for (const Entry& e : entries) {
      const double positions = double(e.n) * e.p0 + double(e.n) * (e.n + 1) / 2;
      const double f = c.n_layer * (e.n * per_token + 4.0 * double(s.q_dim) * positions) +
                       2.0 * d * c.n_vocab * (options_.all_logits ? e.n : 1);
      for (ExpertUsage* u : {&usage_[size_t(std::max(e.seq, 0))], &usage_total_}) {
        u->tokens += e.n;
        u->other_flops += f;
      }
    }
  }
  if (cache) {
    for (const Entry& e : entries) {
      cache->set_n_past(e.seq, e.p0 + e.n);
      if (e.seq == 0) n_past_ = e.p0 + e.n;
      if (policy) evicted_ += policy->apply(*cache, e.seq, options_.kv.evict_slack);
    }
  } else {
    n_past_ += n;
  }
  last_batch_ = n;
}

}  // namespace slim::llm
