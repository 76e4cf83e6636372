#include "slim/llm/prune.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "slim/core/error.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/model.h"
#include "slim/llm/perplexity.h"

namespace slim::llm {
namespace {

// A per-layer metadata value: one number for every layer, or an array.
int64_t layer_value(const GgufFile& g, const std::string& key, int l, int64_t fallback) {
  const GgufValue* v = g.find(key);
  if (!v) return fallback;
  if (v->type == GgufValueType::array) return v->integers.at(size_t(l));
  return g.get_int(key);
}

struct Shape {
  std::string a;  // "{arch}."
  int n_layer = 0, n_embd = 0, head_dim = 0, group = 0;
};

Shape shape_of(const GgufFile& g) {
  Shape s;
  s.a = g.get_string("general.architecture") + ".";
  s.n_layer = int(g.get_int(s.a + "block_count"));
  s.n_embd = int(g.get_int(s.a + "embedding_length"));
  const int64_t heads = layer_value(g, s.a + "attention.head_count", 0, 0);
  const int64_t kv = layer_value(g, s.a + "attention.head_count_kv", 0, heads);
  check(heads > 0 && kv > 0 && heads % kv == 0, ErrorCode::invalid_model, g.path() + ": bad head counts");
  s.head_dim = int(g.get_int(s.a + "attention.key_length", s.n_embd / heads));
  s.group = int(heads / kv);
  return s;
}

// Rows of a matrix (or experts of a 3-D tensor: rows of `unit` rows each), copied as stored.
std::vector<uint8_t> pick_rows(const GgufFile& g, const GgufTensorInfo& t, const std::vector<int>& units, int64_t unit,
                               std::vector<int64_t>* dims) {
  const int64_t row_bytes = t.dims.size() == 1 ? ggml_row_bytes(t.type(), 1) : ggml_row_bytes(t.type(), t.dims[0]);
  const uint8_t* src = g.tensor_data(t);
  std::vector<uint8_t> out;
  for (int u : units) {
    const uint8_t* p = src + int64_t(u) * unit * row_bytes;
    out.insert(out.end(), p, p + unit * row_bytes);
  }
  // The last dimension counts rows (1-D, 2-D) or experts (3-D).
  dims->back() = int64_t(units.size()) * (t.dims.size() == 3 ? 1 : unit);
  return out;
}

// Columns of a matrix: decoded, picked and re-encoded (F32 when the type's blocks do not fit).
std::vector<uint8_t> pick_cols(const GgufFile& g, const GgufTensorInfo& t, const std::vector<int>& cols,
                               GgmlType* type) {
  const int64_t n = t.dims[0], m = int64_t(cols.size()), rows = t.rows();
  const GgmlTypeInfo* info = ggml_type_info(t.type_id);
  *type = m % info->block_elems == 0 ? t.type() : GgmlType::f32;
  const int64_t in_row = ggml_row_bytes(t.type(), n), out_row = ggml_row_bytes(*type, m);
  std::vector<uint8_t> out(size_t(out_row * rows));
  std::vector<float> row(static_cast<size_t>(n)), picked(static_cast<size_t>(m));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type(), g.tensor_data(t) + r * in_row, row.data(), n);
    for (int64_t i = 0; i < m; ++i) picked[size_t(i)] = row[size_t(cols[size_t(i)])];
    quantize_row(*type, picked.data(), out.data() + r * out_row, m);
  }
  return out;
}

// New columns (rows x m floats, row-major) encoded in the matrix's type (F32 when the type's
// blocks do not fit m).
std::vector<uint8_t> encode_cols(const GgufTensorInfo& t, const std::vector<float>& w, int64_t m, GgmlType* type) {
  const int64_t rows = t.rows();
  check(int64_t(w.size()) == rows * m, ErrorCode::invalid_argument, "prune: refitted " + t.name + " has the wrong size");
  const GgmlTypeInfo* info = ggml_type_info(t.type_id);
  *type = m % info->block_elems == 0 ? t.type() : GgmlType::f32;
  const int64_t out_row = ggml_row_bytes(*type, m);
  std::vector<uint8_t> out(size_t(out_row * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(*type, w.data() + r * m, out.data() + r * out_row, m);
  return out;
}

// G += X^T X (lower triangle) for n rows of `cols` values `ld` apart, in double.
void add_gram(std::vector<double>& G, const float* x, int n, int64_t ld, int64_t cols) {
  std::vector<double> xt(size_t(cols * n));
  for (int t = 0; t < n; ++t)
    for (int64_t j = 0; j < cols; ++j) xt[size_t(j * n + t)] = x[int64_t(t) * ld + j];
  for (int64_t i = 0; i < cols; ++i) {
    const double* a = xt.data() + i * n;
    int64_t j = 0;
    for (; j + 4 <= i + 1; j += 4) {
      const double *b0 = xt.data() + j * n, *b1 = b0 + n, *b2 = b1 + n, *b3 = b2 + n;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int t = 0; t < n; ++t) s0 += a[t] * b0[t], s1 += a[t] * b1[t], s2 += a[t] * b2[t], s3 += a[t] * b3[t];
      double* g = G.data() + i * cols + j;
      g[0] += s0, g[1] += s1, g[2] += s2, g[3] += s3;
    }
    for (; j <= i; ++j) {
      const double* b = xt.data() + j * n;
      double s0 = 0;
      for (int t = 0; t < n; ++t) s0 += a[t] * b[t];
      G[size_t(i * cols + j)] += s0;
    }
  }
}

// Solves A Y = B in place (A: n x n symmetric positive definite, row-major, overwritten by
// its Cholesky factor; B: n x r, row-major, overwritten by Y). False when A is not positive definite.
bool cholesky_solve(std::vector<double>& A, std::vector<double>& B, int64_t n, int64_t r) {
  for (int64_t j = 0; j < n; ++j) {
    double* aj = A.data() + j * n;
    double d = aj[j];
    for (int64_t k = 0; k < j; ++k) d -= aj[k] * aj[k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    aj[j] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      double* ai = A.data() + i * n;
      double s = ai[j];
      for (int64_t k = 0; k < j; ++k) s -= ai[k] * aj[k];
      ai[j] = s / d;
    }
  }
  // L Z = B, then L^T Y = Z, all right-hand sides at once.
  for (int64_t i = 0; i < n; ++i) {
    double* bi = B.data() + i * r;
    const double* ai = A.data() + i * n;
    for (int64_t k = 0; k < i; ++k) {
      const double l = ai[k];
      const double* bk = B.data() + k * r;
      for (int64_t c = 0; c < r; ++c) bi[c] -= l * bk[c];
    }
    for (int64_t c = 0; c < r; ++c) bi[c] /= ai[i];
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    double* bi = B.data() + i * r;
    for (int64_t k = i + 1; k < n; ++k) {
      const double l = A[size_t(k * n + i)];
      const double* bk = B.data() + k * r;
      for (int64_t c = 0; c < r; ++c) bi[c] -= l * bk[c];
    }
    for (int64_t c = 0; c < r; ++c) bi[c] /= A[size_t(i * n + i)];
  }
  return true;
}

// The refit of one output projection W (rows x n, row-major) over the kept columns K of n:
// W_K + ((G_KK + lambda I)^-1 G_KR W_R^T)^T, rows x |K|. G: n x n, symmetric.
std::vector<float> refit_cols(const std::vector<double>& G, int64_t n, const std::vector<float>& W, int64_t rows,
                              const std::vector<int>& K, double ridge) {
  std::vector<char> kept(size_t(n), 0);
  for (int k : K) {
    check(k >= 0 && k < n && !kept[size_t(k)], ErrorCode::invalid_argument,
          "prune: a kept unit " + std::to_string(k) + " is out of range or repeated");
    kept[size_t(k)] = 1;
  }
  std::vector<int> R;
  for (int j = 0; j < n; ++j)
    if (!kept[size_t(j)]) R.push_back(j);
  const int64_t m = int64_t(K.size());
  std::vector<float> out(size_t(rows * m));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < m; ++k) out[size_t(i * m + k)] = W[size_t(i * n + K[size_t(k)])];
  if (R.empty()) return out;
  std::vector<double> A(size_t(m * m)), B(size_t(m * rows), 0.0);
  double mean_diag = 0;
  for (int64_t a = 0; a < m; ++a) {
    for (int64_t b = 0; b < m; ++b) A[size_t(a * m + b)] = G[size_t(K[size_t(a)] * n + K[size_t(b)])];
    mean_diag += A[size_t(a * m + a)];
  }
  mean_diag /= double(m);
  if (!(mean_diag > 0)) return out;  // the kept units never fired: nothing to fit
  const double lambda = std::max(ridge, 1e-12) * mean_diag;
  for (int64_t a = 0; a < m; ++a) A[size_t(a * m + a)] += lambda;
  // B = G_KR W_R^T: |K| x rows.
  std::vector<double> wr(size_t(R.size()));
  for (int64_t i = 0; i < rows; ++i) {
    for (size_t r = 0; r < R.size(); ++r) wr[r] = W[size_t(i * n + R[r])];
    for (int64_t a = 0; a < m; ++a) {
      const double* g = G.data() + K[size_t(a)] * n;
      double s = 0;
      for (size_t r = 0; r < R.size(); ++r) s += g[R[r]] * wr[r];
      B[size_t(a * rows + i)] = s;
    }
  }
  if (!cholesky_solve(A, B, m, rows)) return out;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < m; ++k) out[size_t(i * m + k)] += float(B[size_t(k * rows + i)]);
  return out;
}

// Element indices of units of `width` elements each.
std::vector<int> expand(const std::vector<int>& units, int width) {
  std::vector<int> out;
  for (int u : units)
    for (int i = 0; i < width; ++i) out.push_back(u * width + i);
  return out;
}

std::vector<float> dequantize(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo& t = g.tensor(name);
  std::vector<float> v(size_t(t.elements()));
  dequantize_row(t.type(), g.tensor_data(t), v.data(), t.elements());
  return v;
}

}  // namespace

void write_pruned(const GgufFile& g, const std::vector<LayerKeep>& keep, const std::string& out_path,
                  const std::string& arch) {
  const Shape s = shape_of(g);
  check(int(keep.size()) == s.n_layer, ErrorCode::invalid_argument, "prune: a plan for every layer is needed");
  const bool moe = g.get_int(s.a + "expert_count", 0) > 0;
  const std::string src_arch = g.get_string("general.architecture");
  const std::string out_arch = arch.empty() ? src_arch : arch;
  check(out_arch == src_arch || (src_arch == "llama" && out_arch == "deci" && !moe), ErrorCode::invalid_argument,
        "prune: a " + src_arch + (moe ? " MoE" : "") + " model cannot be written as '" + out_arch +
            "' (deci is written from dense llama models)");
  const std::string a = out_arch + ".";
  const std::string k_heads = a + "attention.head_count", k_kv = a + "attention.head_count_kv",
                    k_ff = a + "feed_forward_length", k_exp = a + "expert_count";
  GgufWriter w;
  for (const std::string& key : g.metadata_order()) {
    if (key == "general.alignment") continue;
    // Another architecture: its keys under its own name.
    const std::string name = key.rfind(s.a, 0) == 0 ? a + key.substr(s.a.size()) : key;
    w.copy_value(name, g, g.metadata().at(key));
  }
  if (out_arch != src_arch) w.set_string("general.architecture", out_arch);
  // One number when every layer agrees (any reader loads it), else one per layer; deci
  // always per layer (llama.cpp's Nemotron-NAS files have arrays).
  auto set_layers = [&](const std::string& key, const std::vector<uint32_t>& v) {
    if (out_arch != "deci" && std::all_of(v.begin(), v.end(), [&](uint32_t x) { return x == v[0]; }))
      w.set_u32(key, v[0]);
    else
      w.set_u32_array(key, v);
  };
  std::vector<uint32_t> heads, kv, ff;
  for (const LayerKeep& k : keep) {
    check(!k.kv_heads.empty(), ErrorCode::invalid_argument, "prune: every layer keeps at least one KV head");
    kv.push_back(uint32_t(k.kv_heads.size()));
    heads.push_back(uint32_t(k.kv_heads.size() * size_t(s.group)));
    ff.push_back(uint32_t(k.neurons.size()));
  }
  set_layers(k_heads, heads);
  set_layers(k_kv, kv);
  w.set_u32(a + "attention.key_length", uint32_t(s.head_dim));
  w.set_u32(a + "attention.value_length", uint32_t(s.head_dim));
  if (moe) {
    const size_t e = keep[0].experts.size();
    for (const LayerKeep& k : keep)
      check(k.experts.size() == e && e > 0, ErrorCode::invalid_argument, "prune: every layer keeps as many experts");
    w.set_u32(k_exp, uint32_t(e));
    w.set_u32(a + "expert_used_count", uint32_t(std::min<int64_t>(int64_t(e), g.get_int(s.a + "expert_used_count"))));
  } else {
    for (uint32_t x : ff) check(x > 0, ErrorCode::invalid_argument, "prune: every layer keeps at least one FFN unit");
    set_layers(k_ff, ff);
  }
  const int hd = s.head_dim;
  for (const GgufTensorInfo& t : g.tensors()) {
    std::vector<int64_t> dims = t.dims;
    GgmlType type = t.type();
    std::vector<uint8_t> data;
    const uint8_t* raw = g.tensor_data(t);
    const std::string& n = t.name;
    const int l = n.rfind("blk.", 0) == 0 ? std::atoi(n.c_str() + 4) : -1;
    const std::string kind = l < 0 ? "" : n.substr(n.find('.', 4) + 1);
    auto ends = [&](const char* suffix) { return kind.rfind(suffix, 0) == 0; };
    if (l >= 0) {
      const LayerKeep& k = keep[size_t(l)];
      const int64_t q_cols = int64_t(k.kv_heads.size()) * s.group * hd;
      if (ends("attn_q."))
        data = pick_rows(g, t, expand(k.kv_heads, s.group), hd, &dims);
      else if (ends("attn_k.") || ends("attn_v."))
        data = pick_rows(g, t, k.kv_heads, hd, &dims);
      else if (ends("attn_output.weight"))
        data = k.attn_output.empty() ? pick_cols(g, t, expand(expand(k.kv_heads, s.group), hd), &type)
                                     : encode_cols(t, k.attn_output, q_cols, &type),
        dims[0] = q_cols;
      else if (!moe && (ends("ffn_gate.") || ends("ffn_up.")))
        data = pick_rows(g, t, k.neurons, 1, &dims);
      else if (!moe && ends("ffn_down.weight"))
        data = k.ffn_down.empty() ? pick_cols(g, t, k.neurons, &type)
                                  : encode_cols(t, k.ffn_down, int64_t(k.neurons.size()), &type),
        dims[0] = int64_t(k.neurons.size());
      else if (moe && ends("ffn_gate_inp."))
        data = pick_rows(g, t, k.experts, 1, &dims);
      else if (moe && kind.find("_exps.") != std::string::npos)
        data = pick_rows(g, t, k.experts, t.dims[1], &dims);
    }
    if (data.empty()) data.assign(raw, raw + t.size);  // norms, embeddings, output: unchanged
    w.add_tensor(n, type, dims, std::move(data));
  }
  w.write(out_path);
}

CalibrationStats calibrate(const std::string& model_path, std::span<const int32_t> tokens, int n_ctx, int threads) {
  auto model = LlamaModel::load(model_path);
  const LlamaConfig& c = model->config();
  check(c.n_expert == 0, ErrorCode::invalid_argument, "prune: calibration statistics are for dense models");
  CalibrationStats st;
  double bytes = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model->layer(l);
    st.attn_dim.push_back(L.n_head_kv * (c.n_head / c.n_head_kv) * c.head_dim);
    st.ffn_dim.push_back(L.n_ff);
    bytes += 8.0 * (double(st.attn_dim.back()) * st.attn_dim.back() + double(L.n_ff) * L.n_ff);
  }
  check(bytes < 16.0 * (1ull << 30), ErrorCode::invalid_argument,
        "prune: the calibration statistics of this model (" + std::to_string(int64_t(bytes / (1 << 20))) +
            " MiB of Gram matrices) exceed 16 GiB");
  for (int l = 0; l < c.n_layer; ++l) {
    st.attn_gram.emplace_back(size_t(st.attn_dim[size_t(l)]) * size_t(st.attn_dim[size_t(l)]), 0.0);
    st.ffn_gram.emplace_back(size_t(st.ffn_dim[size_t(l)]) * size_t(st.ffn_dim[size_t(l)]), 0.0);
  }
  ContextOptions co;
  co.n_ctx = n_ctx;
  co.n_batch = n_ctx;
  co.n_threads = threads;
  co.observe = [&](int l, bool ffn, const float* x, int n, int64_t ld, int64_t cols) {
    add_gram(ffn ? st.ffn_gram[size_t(l)] : st.attn_gram[size_t(l)], x, n, ld, cols);
  };
  LlamaContext ctx(model, co);
  const size_t chunks = tokens.size() / size_t(n_ctx);
  for (size_t ch = 0; ch < chunks; ++ch) {
    ctx.reset();
    ctx.eval(tokens.subspan(ch * size_t(n_ctx), size_t(n_ctx)));
    st.tokens += n_ctx;
  }
  auto mirror = [](std::vector<double>& G, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) G[size_t(i * n + j)] = G[size_t(j * n + i)];
  };
  for (int l = 0; l < c.n_layer; ++l)
    mirror(st.attn_gram[size_t(l)], st.attn_dim[size_t(l)]), mirror(st.ffn_gram[size_t(l)], st.ffn_dim[size_t(l)]);
  return st;
}

void refit_outputs(const GgufFile& g, const CalibrationStats& st, std::vector<LayerKeep>& keep, double ridge) {
  const Shape s = shape_of(g);
  check(int(keep.size()) == s.n_layer && int(st.ffn_gram.size()) == s.n_layer, ErrorCode::invalid_argument,
        "prune: a plan and statistics for every layer are needed");
  for (int l = 0; l < s.n_layer; ++l) {
    LayerKeep& k = keep[size_t(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    const int64_t qd = st.attn_dim[size_t(l)], nf = st.ffn_dim[size_t(l)];
    k.attn_output.clear();
    k.ffn_down.clear();
    if (int64_t(k.kv_heads.size()) * s.group * s.head_dim < qd)
      k.attn_output = refit_cols(st.attn_gram[size_t(l)], qd, dequantize(g, p + "attn_output.weight"), s.n_embd,
                                 expand(expand(k.kv_heads, s.group), s.head_dim), ridge);
    if (int64_t(k.neurons.size()) < nf)
      k.ffn_down = refit_cols(st.ffn_gram[size_t(l)], nf, dequantize(g, p + "ffn_down.weight"), s.n_embd, k.neurons,
                              ridge);
  }
}

PruneResult prune_model(const std::string& in_path, const std::string& out_path, const std::string& calib_text,
                        const PruneOptions& o) {
  check(o.target_params > 0 && o.target_params <= 1, ErrorCode::invalid_argument,
        "prune: --target-params must be in (0, 1]");
  check(o.width_multiple >= 1, ErrorCode::invalid_argument, "prune: width multiple must be positive");
  check(o.ridge >= 0, ErrorCode::invalid_argument, "prune: the refit's ridge must be >= 0");
  check(o.n_ctx >= 8 && o.calib_chunks >= 1, ErrorCode::invalid_argument, "prune: bad calibration chunks");
  auto g = GgufFile::open(in_path);
  auto model = LlamaModel::load(in_path);
  const LlamaConfig& c = model->config();
  const Shape s = shape_of(*g);
  const int d = c.n_embd, hd = c.head_dim, group = s.group;
  check(o.arch.empty() || o.arch == c.arch || (o.arch == "deci" && c.arch == "llama" && c.n_expert == 0),
        ErrorCode::invalid_argument,
        "prune: cannot write a " + c.arch + (c.n_expert ? " MoE" : "") + " model as '" + o.arch +
            "' (deci is written from dense llama models)");
  PruneResult r;
  r.params_before = model->n_params();
  const int64_t budget = int64_t(std::floor(o.target_params * double(r.params_before)));
  auto progress = [&](const char* stage, int done, int total) {
    if (o.progress) o.progress(stage, done, total);
  };

  auto tok = load_gguf_tokenizer(model->gguf());
  text::EncodeOptions eo;
  eo.add_special = false;
  const std::vector<int32_t> tokens = tok->encode(calib_text, eo);
  const int chunks = std::min<int>(o.calib_chunks, int(tokens.size() / size_t(o.n_ctx)));
  check(chunks >= 1, ErrorCode::invalid_argument,
        "prune: the calibration text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
            std::to_string(o.n_ctx));
  // Dense models: the refit is fitted on the first half of the calibration text and the
  // sensitivity probes measure on the second, so a probe sees what the refit does on text
  // it was not fitted to (on the same text it overfits and a layer looks free to prune).
  // A text too short for a chunk in each half serves both.
  std::vector<int32_t> fit_tokens = tokens;
  std::string probe_text = calib_text;
  if (c.n_expert == 0) {
    size_t half = calib_text.size() / 2;
    while (half < calib_text.size() && (uint8_t(calib_text[half]) & 0xC0) == 0x80) ++half;  // a UTF-8 boundary
    std::vector<int32_t> first = tok->encode(calib_text.substr(0, half), eo);
    if (first.size() >= size_t(o.n_ctx) && tokens.size() - first.size() >= size_t(o.n_ctx)) {
      fit_tokens = std::move(first);
      probe_text = calib_text.substr(half);
    }
    fit_tokens.resize(std::min(fit_tokens.size(), size_t(std::max(o.refit_chunks, 1)) * size_t(o.n_ctx)) /
                      size_t(o.n_ctx) * size_t(o.n_ctx));
  }
  PerplexityOptions po;
  po.n_ctx = o.n_ctx;
  po.chunks = o.calib_chunks;
  po.threads = o.threads;
  r.base_nll = [&] {
    const PerplexityResult p = perplexity(model, nullptr, probe_text, "calibration text", po);
    return p.nll / double(p.scored);
  }();

  r.keep.resize(size_t(c.n_layer));
  std::vector<LayerKeep> full(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    LayerKeep& k = full[size_t(l)];
    k.kv_heads.resize(size_t(model->layer(l).n_head_kv));
    std::iota(k.kv_heads.begin(), k.kv_heads.end(), 0);
    k.neurons.resize(c.n_expert ? 0 : size_t(model->layer(l).n_ff));
    std::iota(k.neurons.begin(), k.neurons.end(), 0);
    k.experts.resize(size_t(c.n_expert));
    std::iota(k.experts.begin(), k.experts.end(), 0);
  }

  if (c.n_expert) {
    // Experts: every layer keeps as many (GGUF has one expert_count); each drops its least
    // routed on the calibration text (or random ones, for comparison).
    ContextOptions co;
    co.n_ctx = o.n_ctx;
    co.n_batch = o.n_ctx;
    co.n_threads = o.threads;
    LlamaContext ctx(model, co);
    for (int ch = 0; ch < chunks; ++ch) {
      ctx.reset();
      ctx.eval(std::span<const int32_t>(tokens.data() + int64_t(ch) * o.n_ctx, size_t(o.n_ctx)));
      progress("calibration", ch + 1, chunks);
    }
    const int64_t per_expert = int64_t(c.n_layer) * (3 * int64_t(c.n_ff_exp) * d + d);
    const int64_t excess = std::max<int64_t>(0, r.params_before - budget);
    const int drop = int((excess + per_expert - 1) / per_expert);
    check(c.n_expert - drop >= c.n_expert_used, ErrorCode::invalid_argument,
          "prune: --target-params " + std::to_string(o.target_params) + " would leave fewer experts than the " +
              std::to_string(c.n_expert_used) + " each token is routed to");
    const ExpertUsage& u = ctx.expert_usage_total();
    std::mt19937 rng(uint32_t(std::max(o.expert_seed, 0)));
    r.keep = full;
    for (int l = 0; l < c.n_layer; ++l) {
      std::vector<int>& e = r.keep[size_t(l)].experts;
      if (o.expert_seed >= 0) std::shuffle(e.begin(), e.end(), rng);
      else std::stable_sort(e.begin(), e.end(), [&](int a, int b) { return u.count(l, a) > u.count(l, b); });
      e.resize(size_t(c.n_expert - drop));
      std::sort(e.begin(), e.end());
    }
    r.arch = o.arch.empty() ? c.arch : o.arch;
    write_pruned(*g, r.keep, out_path, r.arch);
    r.params_after = LlamaModel::load(out_path, true)->n_params();
    return r;
  }

  // Dense: the calibration Grams give the importances and the refit.
  progress("calibration", 0, 1);
  const CalibrationStats st = calibrate(in_path, fit_tokens, o.n_ctx, o.threads);
  progress("calibration", 1, 1);
  std::vector<std::vector<double>> attn_imp(size_t(c.n_layer)), ffn_imp(size_t(c.n_layer));
  const PruneCriterion crit = o.criterion;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const LayerWeights& L = model->layer(l);
    const std::vector<float> down = dequantize(*g, p + "ffn_down.weight");
    const std::vector<float> wo = dequantize(*g, p + "attn_output.weight");
    const std::vector<double>& G = st.ffn_gram[size_t(l)];
    const std::vector<double>& A = st.attn_gram[size_t(l)];
    const int64_t nf = L.n_ff, qd = st.attn_dim[size_t(l)], w = int64_t(group) * hd;
    auto col = [](const std::vector<float>& m, int64_t cols, int64_t j, int rows, bool abs) {
      double a = 0;
      for (int i = 0; i < rows; ++i) {
        const double v = m[size_t(i * cols + j)];
        a += abs ? std::fabs(v) : v * v;
      }
      return a;
    };
    auto sq = [](const float* v, int64_t n) {
      double a = 0;
      for (int64_t i = 0; i < n; ++i) a += double(v[i]) * v[i];
      return a;
    };
    std::vector<double>& fi = ffn_imp[size_t(l)];
    std::vector<double>& ai = attn_imp[size_t(l)];
    fi.assign(size_t(nf), 0);
    ai.assign(size_t(L.n_head_kv), 0);
    if (crit == PruneCriterion::magnitude) {
      const std::vector<float> up = dequantize(*g, p + "ffn_up.weight"), gate = dequantize(*g, p + "ffn_gate.weight"),
                               wv = dequantize(*g, p + "attn_v.weight");
      for (int64_t j = 0; j < nf; ++j)
        fi[size_t(j)] = std::sqrt(col(down, nf, j, d, false) * sq(up.data() + j * d, d) * sq(gate.data() + j * d, d));
      for (int k = 0; k < L.n_head_kv; ++k) {
        double o2 = 0;
        for (int64_t j = k * w; j < (k + 1) * w; ++j) o2 += col(wo, qd, j, d, false);
        ai[size_t(k)] = std::sqrt(o2 * sq(wv.data() + int64_t(k) * hd * d, int64_t(hd) * d));
      }
    } else if (crit == PruneCriterion::wanda) {
      for (int64_t j = 0; j < nf; ++j) fi[size_t(j)] = std::sqrt(G[size_t(j * nf + j)]) * col(down, nf, j, d, true);
      for (int k = 0; k < L.n_head_kv; ++k)
        for (int64_t j = k * w; j < (k + 1) * w; ++j)
          ai[size_t(k)] += std::sqrt(A[size_t(j * qd + j)]) * col(wo, qd, j, d, true);
    } else {
      // What the unit adds to the residual stream, summed over the calibration tokens:
      // a hidden unit: G_jj |down_j|^2; a KV group: sum over output rows of w G_gg w^T.
      for (int64_t j = 0; j < nf; ++j) fi[size_t(j)] = G[size_t(j * nf + j)] * col(down, nf, j, d, false);
      std::vector<double> gw(static_cast<size_t>(w));
      for (int k = 0; k < L.n_head_kv; ++k)
        for (int i = 0; i < d; ++i) {
          const float* row = wo.data() + int64_t(i) * qd + k * w;
          for (int64_t a = 0; a < w; ++a) {
            const double* ga = A.data() + (k * w + a) * qd + k * w;
            double acc = 0;
            for (int64_t b = 0; b < w; ++b) acc += ga[b] * row[b];
            gw[size_t(a)] = acc;
          }
          double acc = 0;
          for (int64_t a = 0; a < w; ++a) acc += gw[size_t(a)] * row[a];
          ai[size_t(k)] += acc;
        }
    }
  }

  // The plan written: the kept units, each pruned layer's output projections refitted.
  auto finish = [&](std::vector<LayerKeep> keep) {
    if (o.refit) refit_outputs(*g, st, keep, o.ridge);
    return keep;
  };
  const std::string probe = out_path + ".probe";
  auto probe_nll = [&](const std::vector<LayerKeep>& keep) {
    write_pruned(*g, keep, probe);
    auto m = LlamaModel::load(probe);
    const PerplexityResult p = perplexity(m, nullptr, probe_text, "calibration text", po);
    std::filesystem::remove(probe);
    return p.nll / double(p.scored) - r.base_nll;
  };
  // Units: KV groups, and blocks of width_multiple hidden units (least important first),
  // so FFN widths stay multiples. Each layer's probes measure what removing its least
  // important group, or a quarter, half, three quarters of its hidden units, adds to the
  // NLL on the calibration text's second half (without the refit: with it the probes
  // cost twice the time and chose no better plans on slimlm): a KV group's estimated cost is the probe's share
  // by importance; the FFN blocks' costs follow the piecewise-linear curve through the
  // probes (extended to all blocks by its last slope), made non-decreasing.
  struct Unit {
    double cost;
    int64_t params;
    int layer;
    bool ffn;
    std::vector<int> idx;
  };
  std::vector<Unit> units;
  const int wm = o.width_multiple;
  r.attn_sensitivity.assign(size_t(c.n_layer), 0);
  r.ffn_sensitivity.assign(size_t(c.n_layer), 0);
  r.ffn_probes.assign(size_t(c.n_layer), {});
  auto order = [](const std::vector<double>& imp) {
    std::vector<int> ix(imp.size());
    std::iota(ix.begin(), ix.end(), 0);
    std::stable_sort(ix.begin(), ix.end(), [&](int a, int b) { return imp[size_t(a)] < imp[size_t(b)]; });
    return ix;
  };
  const double fracs[] = {0.25, 0.5, 0.75};
  const int probes_per_layer = 4;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model->layer(l);
    const std::vector<double>& ai = attn_imp[size_t(l)];
    const std::vector<int> ao = order(ai), fo = order(ffn_imp[size_t(l)]);
    if (L.n_head_kv > 1) {
      std::vector<LayerKeep> k = full;
      k[size_t(l)].kv_heads.erase(std::find(k[size_t(l)].kv_heads.begin(), k[size_t(l)].kv_heads.end(), ao[0]));
      r.attn_sensitivity[size_t(l)] = probe_nll(k);
      const double s1 = std::max(r.attn_sensitivity[size_t(l)], 1e-6);
      for (size_t i = 0; i < ao.size(); ++i)
        units.push_back({s1 * std::max(ai[size_t(ao[i])], 1e-30) / std::max(ai[size_t(ao[0])], 1e-30),
                         (2 * int64_t(group) * hd + 2 * hd) * d, l, false, {ao[i]}});
    }
    progress("sensitivity", probes_per_layer * l + 1, probes_per_layer * c.n_layer);
    const int blocks = L.n_ff / wm;
    if (blocks > 1) {
      // The curve: (blocks removed, NLL added), from (0, 0).
      std::vector<std::pair<double, double>> curve = {{0.0, 0.0}};
      for (double f : fracs) {
        const int nb = std::clamp(int(std::lround(blocks * f)), 1, blocks - 1);
        if (nb <= curve.back().first) continue;
        std::vector<LayerKeep> k = full;
        std::vector<int> kept(fo.begin() + int64_t(nb) * wm, fo.end());
        std::sort(kept.begin(), kept.end());
        k[size_t(l)].neurons = kept;
        const double v = std::max(probe_nll(k), curve.back().second);
        curve.push_back({double(nb), v});
        r.ffn_probes[size_t(l)].push_back(v);
        if (f == 0.5) r.ffn_sensitivity[size_t(l)] = v;
        progress("sensitivity", probes_per_layer * l + 1 + int(curve.size()) - 1, probes_per_layer * c.n_layer);
      }
      auto at = [&](double x) {
        for (size_t i = 1; i < curve.size(); ++i)
          if (x <= curve[i].first || i + 1 == curve.size()) {
            const auto [x0, y0] = curve[i - 1];
            const auto [x1, y1] = curve[i];
            return y0 + (y1 - y0) * (x - x0) / std::max(x1 - x0, 1e-9);
          }
        return curve.back().second;
      };
      double prev_cost = 1e-9;
      for (int b = 0; b < blocks; ++b) {
        Unit u{std::max(at(b + 1) - at(b), prev_cost), 3 * int64_t(wm) * d, l, true, {}};
        prev_cost = u.cost;
        for (int i = b * wm; i < (b + 1) * wm; ++i) u.idx.push_back(fo[size_t(i)]);
        units.push_back(std::move(u));
      }
    }
    progress("sensitivity", probes_per_layer * (l + 1), probes_per_layer * c.n_layer);
  }
  // Uniform allocation (for comparison): FFN blocks only, round-robin over the layers.
  if (o.uniform)
    for (Unit& u : units) {
      int b = 0;
      for (const Unit& v : units) b += v.ffn && v.layer == u.layer && &v < &u;
      u.cost = u.ffn ? double(b + 1) * double(u.params) : 1e300;
    }
  // Cheapest NLL per parameter first, each layer's units in importance order, until the
  // budget is met; every layer keeps one KV group and one block of hidden units.
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    return a.cost / double(a.params) < b.cost / double(b.params);
  });
  // Every layer keeps at least min_ffn_share of its FFN blocks (single-layer probes
  // under-predict what emptying several layers' FFNs costs together); when the budget
  // needs more, the floor comes down in eighths.
  std::vector<int> groups_left, blocks_left;
  std::vector<std::vector<int>> drop_heads, drop_neurons;
  int64_t params = 0;
  for (double share = o.uniform ? 0.0 : std::clamp(o.min_ffn_share, 0.0, 1.0);; share = std::max(0.0, share - 0.125)) {
    groups_left.assign(size_t(c.n_layer), 0), blocks_left.assign(size_t(c.n_layer), 0);
    drop_heads.assign(size_t(c.n_layer), {}), drop_neurons.assign(size_t(c.n_layer), {});
    std::vector<int> min_blocks(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) {
      groups_left[size_t(l)] = model->layer(l).n_head_kv, blocks_left[size_t(l)] = model->layer(l).n_ff / wm;
      min_blocks[size_t(l)] = int(std::ceil(share * double(blocks_left[size_t(l)])));
    }
    params = r.params_before;
    for (const Unit& u : units) {
      if (params <= budget) break;
      int& left = u.ffn ? blocks_left[size_t(u.layer)] : groups_left[size_t(u.layer)];
      if (left <= 1 || (u.ffn && left <= min_blocks[size_t(u.layer)])) continue;
      --left;
      params -= u.params;
      auto& drop = u.ffn ? drop_neurons[size_t(u.layer)] : drop_heads[size_t(u.layer)];
      drop.insert(drop.end(), u.idx.begin(), u.idx.end());
    }
    if (params <= budget || share <= 0) break;
  }
  check(params <= budget, ErrorCode::invalid_argument,
        "prune: --target-params " + std::to_string(o.target_params) +
            " is out of reach: every layer keeps one KV group and " + std::to_string(wm) + " FFN units");
  r.keep = full;
  for (int l = 0; l < c.n_layer; ++l) {
    auto erase = [](std::vector<int>& v, const std::vector<int>& drop) {
      std::erase_if(v, [&](int x) { return std::find(drop.begin(), drop.end(), x) != drop.end(); });
    };
    erase(r.keep[size_t(l)].kv_heads, drop_heads[size_t(l)]);
    erase(r.keep[size_t(l)].neurons, drop_neurons[size_t(l)]);
  }
  r.keep = finish(r.keep);
  // llama.cpp's llama architecture takes layer 0's widths for every layer: a llama model
  // whose widths now differ is written as deci, which reads them per layer.
  r.arch = o.arch;
  if (r.arch.empty()) {
    bool varies = false;
    for (int l = 1; l < c.n_layer; ++l)
      varies |= r.keep[size_t(l)].kv_heads.size() != r.keep[0].kv_heads.size() ||
                r.keep[size_t(l)].neurons.size() != r.keep[0].neurons.size();
    r.arch = c.arch == "llama" && varies ? "deci" : c.arch;
  }
  write_pruned(*g, r.keep, out_path, r.arch);
  r.params_after = LlamaModel::load(out_path, true)->n_params();
  return r;
}

}  // namespace slim::llm
