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

void write_pruned(const GgufFile& g, const std::vector<LayerKeep>& keep, const std::string& out_path) {
  const Shape s = shape_of(g);
  check(int(keep.size()) == s.n_layer, ErrorCode::invalid_argument, "prune: a plan for every layer is needed");
  const bool moe = g.get_int(s.a + "expert_count", 0) > 0;
  const std::string k_heads = s.a + "attention.head_count", k_kv = s.a + "attention.head_count_kv",
                    k_ff = s.a + "feed_forward_length", k_exp = s.a + "expert_count";
  GgufWriter w;
  for (const std::string& key : g.metadata_order())
    if (key != "general.alignment") w.copy_value(key, g, g.metadata().at(key));
  // One number when every layer agrees (any reader loads it), else one per layer.
  auto set_layers = [&](const std::string& key, const std::vector<uint32_t>& v) {
    if (std::all_of(v.begin(), v.end(), [&](uint32_t x) { return x == v[0]; })) w.set_u32(key, v[0]);
    else w.set_u32_array(key, v);
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
  w.set_u32(s.a + "attention.key_length", uint32_t(s.head_dim));
  w.set_u32(s.a + "attention.value_length", uint32_t(s.head_dim));
  if (moe) {
    const size_t e = keep[0].experts.size();
    for (const LayerKeep& k : keep)
      check(k.experts.size() == e && e > 0, ErrorCode::invalid_argument, "prune: every layer keeps as many experts");
    w.set_u32(k_exp, uint32_t(e));
    w.set_u32(s.a + "expert_used_count", uint32_t(std::min<int64_t>(int64_t(e), g.get_int(s.a + "expert_used_count"))));
  } else {
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
      if (ends("attn_q."))
        data = pick_rows(g, t, expand(k.kv_heads, s.group), hd, &dims);
      else if (ends("attn_k.") || ends("attn_v."))
        data = pick_rows(g, t, k.kv_heads, hd, &dims);
      else if (ends("attn_output."))
        data = pick_cols(g, t, expand(expand(k.kv_heads, s.group), hd), &type), dims[0] = int64_t(k.kv_heads.size()) * s.group * hd;
      else if (!moe && (ends("ffn_gate.") || ends("ffn_up.")))
        data = pick_rows(g, t, k.neurons, 1, &dims);
      else if (!moe && ends("ffn_down."))
        data = pick_cols(g, t, k.neurons, &type), dims[0] = int64_t(k.neurons.size());
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

PruneResult prune_model(const std::string& in_path, const std::string& out_path, const std::string& calib_text,
                        const PruneOptions& o) {
  check(o.target_params > 0 && o.target_params <= 1, ErrorCode::invalid_argument,
        "prune: --target-params must be in (0, 1]");
  check(o.width_multiple >= 1, ErrorCode::invalid_argument, "prune: width multiple must be positive");
  auto g = GgufFile::open(in_path);
  auto model = LlamaModel::load(in_path);
  const LlamaConfig& c = model->config();
  const Shape s = shape_of(*g);
  const int d = c.n_embd, hd = c.head_dim, group = s.group;
  PruneResult r;
  r.params_before = model->n_params();
  const int64_t budget = int64_t(std::floor(o.target_params * double(r.params_before)));
  auto progress = [&](const char* stage, int done, int total) {
    if (o.progress) o.progress(stage, done, total);
  };

  PerplexityOptions po;
  po.n_ctx = o.n_ctx;
  po.chunks = o.calib_chunks;
  po.threads = o.threads;
  r.base_nll = [&] {
    const PerplexityResult p = perplexity(model, nullptr, calib_text, "calibration text", po);
    return p.nll / double(p.scored);
  }();

  // Calibration statistics: one pass over the text's chunks with the forward pass observed.
  auto tok = load_gguf_tokenizer(model->gguf());
  text::EncodeOptions eo;
  eo.add_special = false;
  const std::vector<int32_t> tokens = tok->encode(calib_text, eo);
  const int chunks = std::min<int>(o.calib_chunks, int(tokens.size() / size_t(o.n_ctx)));
  std::vector<std::vector<double>> attn_imp(size_t(c.n_layer)), ffn_imp(size_t(c.n_layer));
  std::vector<std::vector<float>> wo(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model->layer(l);
    attn_imp[size_t(l)].assign(size_t(L.n_head_kv), 0);
    ffn_imp[size_t(l)].assign(size_t(L.n_ff), 0);
    wo[size_t(l)] = dequantize(*g, "blk." + std::to_string(l) + ".attn_output.weight");
  }
  ContextOptions co;
  co.n_ctx = o.n_ctx;
  co.n_batch = o.n_ctx;
  co.n_threads = o.threads;
  std::vector<float> y(static_cast<size_t>(d));
  if (o.criterion == PruneCriterion::activation && c.n_expert == 0)
    co.observe = [&](int l, bool ffn, const float* x, int n, int64_t ld, int64_t cols) {
      auto& imp = ffn ? ffn_imp[size_t(l)] : attn_imp[size_t(l)];
      for (int t = 0; t < n; ++t) {
        const float* xt = x + int64_t(t) * ld;
        if (ffn) {
          for (int64_t j = 0; j < cols; ++j) imp[size_t(j)] += double(xt[j]) * xt[j];
          continue;
        }
        // A KV group's contribution to the residual: its columns of attn_output times its heads' outputs.
        const int64_t w = int64_t(group) * hd;
        for (size_t k = 0; k < imp.size(); ++k) {
          for (int i = 0; i < d; ++i) {
            const float* row = wo[size_t(l)].data() + int64_t(i) * cols + int64_t(k) * w;
            float acc = 0;
            for (int64_t j = 0; j < w; ++j) acc += row[j] * xt[int64_t(k) * w + j];
            y[size_t(i)] = acc;
          }
          double n2 = 0;
          for (float v : y) n2 += double(v) * v;
          imp[k] += n2;
        }
      }
    };
  if (c.n_expert) co.n_batch = o.n_ctx;
  LlamaContext ctx(model, co);
  for (int ch = 0; ch < chunks; ++ch) {
    ctx.reset();
    ctx.eval(std::span<const int32_t>(tokens.data() + int64_t(ch) * o.n_ctx, size_t(o.n_ctx)));
    progress("calibration", ch + 1, chunks);
  }

  r.keep.resize(size_t(c.n_layer));
  const std::string probe = out_path + ".probe";
  auto probe_nll = [&](const std::vector<LayerKeep>& keep) {
    write_pruned(*g, keep, probe);
    auto m = LlamaModel::load(probe);
    const PerplexityResult p = perplexity(m, nullptr, calib_text, "calibration text", po);
    std::filesystem::remove(probe);
    return p.nll / double(p.scored) - r.base_nll;
  };
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
  } else {
    const bool mag = o.criterion == PruneCriterion::magnitude;
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const LayerWeights& L = model->layer(l);
      const std::vector<float> down = dequantize(*g, p + "ffn_down.weight");
      std::vector<float> up, gate, wv;
      if (mag) up = dequantize(*g, p + "ffn_up.weight"), gate = dequantize(*g, p + "ffn_gate.weight"),
               wv = dequantize(*g, p + "attn_v.weight");
      auto sq = [](const float* v, int64_t n, int64_t stride) {
        double a = 0;
        for (int64_t i = 0; i < n; ++i) a += double(v[i * stride]) * v[i * stride];
        return a;
      };
      for (int j = 0; j < L.n_ff; ++j) {
        const double out = sq(down.data() + j, d, L.n_ff);
        ffn_imp[size_t(l)][size_t(j)] = mag ? std::sqrt(out * sq(up.data() + int64_t(j) * d, d, 1) *
                                                        sq(gate.data() + int64_t(j) * d, d, 1))
                                            : ffn_imp[size_t(l)][size_t(j)] * out;
      }
      if (mag) {
        const int64_t w = int64_t(group) * hd, q_dim = int64_t(L.n_head_kv) * w;
        for (int k = 0; k < L.n_head_kv; ++k) {
          double o2 = 0;
          for (int i = 0; i < d; ++i) o2 += sq(wo[size_t(l)].data() + i * q_dim + k * w, w, 1);
          attn_imp[size_t(l)][size_t(k)] = std::sqrt(o2 * sq(wv.data() + int64_t(k) * hd * d, int64_t(hd) * d, 1));
        }
      }
    }
    // Units: KV groups, and blocks of width_multiple hidden units (least important first),
    // so FFN widths stay multiples. Each layer's probe measures what removing its least
    // important group, or the target fraction of its hidden units, adds to the calibration
    // NLL; a unit's estimated cost is that share of it by importance.
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
    for (int l = 0; l < c.n_layer; ++l) {
      const LayerWeights& L = model->layer(l);
      auto order = [](const std::vector<double>& imp) {
        std::vector<int> ix(imp.size());
        std::iota(ix.begin(), ix.end(), 0);
        std::stable_sort(ix.begin(), ix.end(), [&](int a, int b) { return imp[size_t(a)] < imp[size_t(b)]; });
        return ix;
      };
      const std::vector<double>& ai = attn_imp[size_t(l)];
      const std::vector<double>& fi = ffn_imp[size_t(l)];
      const std::vector<int> ao = order(ai), fo = order(fi);
      if (L.n_head_kv > 1) {
        std::vector<LayerKeep> k = full;
        k[size_t(l)].kv_heads.erase(std::find(k[size_t(l)].kv_heads.begin(), k[size_t(l)].kv_heads.end(), ao[0]));
        r.attn_sensitivity[size_t(l)] = probe_nll(k);
        const double s1 = std::max(r.attn_sensitivity[size_t(l)], 1e-6);
        for (size_t i = 0; i < ao.size(); ++i)
          units.push_back({s1 * ai[size_t(ao[i])] / std::max(ai[size_t(ao[0])], 1e-30),
                           (2 * int64_t(group) * hd + 2 * hd) * d, l, false, {ao[i]}});
      }
      progress("sensitivity", 2 * l + 1, 2 * c.n_layer);
      const int blocks = L.n_ff / wm;
      const int probe_blocks = std::max(1, int(std::lround(blocks * (1 - o.target_params))));
      if (blocks > 1) {
        std::vector<LayerKeep> k = full;
        std::vector<int> kept(fo.begin() + int64_t(probe_blocks) * wm, fo.end());
        std::sort(kept.begin(), kept.end());
        k[size_t(l)].neurons = kept;
        r.ffn_sensitivity[size_t(l)] = probe_nll(k);
        double removed = 0;
        for (int i = 0; i < probe_blocks * wm; ++i) removed += fi[size_t(fo[size_t(i)])];
        const double s1 = std::max(r.ffn_sensitivity[size_t(l)], 1e-6) / std::max(removed, 1e-30);
        for (int b = 0; b < blocks; ++b) {
          Unit u{0, 3 * int64_t(wm) * d, l, true, {}};
          for (int i = b * wm; i < (b + 1) * wm; ++i) u.cost += s1 * fi[size_t(fo[size_t(i)])], u.idx.push_back(fo[size_t(i)]);
          // Past the probed fraction the linear share underestimates the loss: grow it quadratically.
          u.cost *= std::pow(std::max(1.0, double(b + 1) / probe_blocks), 2);
          units.push_back(std::move(u));
        }
      }
      progress("sensitivity", 2 * l + 2, 2 * c.n_layer);
    }
    // Cheapest NLL per parameter first, each layer's units in importance order, until the
    // budget is met; every layer keeps one KV group and one block of hidden units.
    std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
      return a.cost / double(a.params) < b.cost / double(b.params);
    });
    std::vector<int> groups_left(size_t(c.n_layer)), blocks_left(size_t(c.n_layer));
    std::vector<std::vector<int>> drop_heads(size_t(c.n_layer)), drop_neurons(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      groups_left[size_t(l)] = model->layer(l).n_head_kv, blocks_left[size_t(l)] = model->layer(l).n_ff / wm;
    int64_t params = r.params_before;
    for (const Unit& u : units) {
      if (params <= budget) break;
      int& left = u.ffn ? blocks_left[size_t(u.layer)] : groups_left[size_t(u.layer)];
      if (left <= 1) continue;
      --left;
      params -= u.params;
      auto& drop = u.ffn ? drop_neurons[size_t(u.layer)] : drop_heads[size_t(u.layer)];
      drop.insert(drop.end(), u.idx.begin(), u.idx.end());
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
  }
  write_pruned(*g, r.keep, out_path);
  r.params_after = LlamaModel::load(out_path, true)->n_params();
  return r;
}

}  // namespace slim::llm
