// Ref kernels of ONNX Runtime's attention contrib ops (com.microsoft, opset 1): Attention
// (fused QKV projection, mask_index forms, unidirectional, past/present), MultiHeadAttention
// (separate, packed or BNSH Q/K/V, key padding masks, past/present) and GroupQueryAttention
// (grouped KV heads, KV cache with seqlens_k, rotary, local window, softcap). One scaled
// dot-product core in double serves all three; the masking rules follow ONNX Runtime's CPU
// kernels: padding masks add mask_filter_value to the scores, causal masking removes the
// future keys from the softmax.
#include <algorithm>
#include <cmath>

#include "runtime/ref/contrib_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

constexpr const char* kMs = "com.microsoft";

// Q (B, Nq, S, Dqk), K (B, Nkv, T, Dqk), V (B, Nkv, T, Dv) and what is added to or removed
// from the scores; query head n reads KV head n / (Nq / Nkv).
struct AttentionProblem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, seq = 0, total = 0, qk_dim = 0, v_dim = 0;
  double scale = 1, softcap = 0;
  bool smooth_softmax = false;  // an extra zero logit in every softmax
  std::vector<double> q, k, v;
  std::vector<double> add;      // (B, S, T) added to the scores; empty: none
  std::vector<char> visible;    // (B, S, T) keys a query may see; empty: all
  std::vector<double> bias;     // attention_bias (B or 1, N or 1, S, T); empty: none
  bool bias_per_batch = false, bias_per_head = false;
};

// The attention output (B, S, Nq * Dv).
std::vector<double> attend(const AttentionProblem& p) {
  const int64_t group = p.q_heads / p.kv_heads, s_len = p.seq, t_len = p.total;
  std::vector<double> out(size_t(p.batch * s_len * p.q_heads * p.v_dim), 0.0), scores(static_cast<size_t>(t_len));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t n = 0; n < p.q_heads; ++n) {
      const int64_t kvh = b * p.kv_heads + n / group;
      const double* kh = p.k.data() + kvh * t_len * p.qk_dim;
      const double* vh = p.v.data() + kvh * t_len * p.v_dim;
      for (int64_t s = 0; s < s_len; ++s) {
        const double* qr = p.q.data() + ((b * p.q_heads + n) * s_len + s) * p.qk_dim;
        const size_t mask_row = size_t((b * s_len + s) * t_len);
        const size_t bias_row = size_t((((p.bias_per_batch ? b : 0) * (p.bias_per_head ? p.q_heads : 1) +
                                         (p.bias_per_head ? n : 0)) * s_len + s) * t_len);
        double mx = p.smooth_softmax ? 0.0 : -INFINITY;
        bool any = false;
        for (int64_t t = 0; t < t_len; ++t) {
          if (!p.visible.empty() && !p.visible[mask_row + size_t(t)]) continue;
          double x = 0;
          for (int64_t d = 0; d < p.qk_dim; ++d) x += qr[d] * kh[t * p.qk_dim + d];
          x *= p.scale;
          if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
          // ONNX Runtime adds bias and mask in float, then the score: rounding
          // score - 10000 to float moves it by up to 5e-4, which the output shows.
          if (!p.bias.empty() || !p.add.empty()) {
            const float c = float(p.bias.empty() ? 0.0 : p.bias[bias_row + size_t(t)]) +
                            float(p.add.empty() ? 0.0 : p.add[mask_row + size_t(t)]);
            x = double(float(x) + c);
          }
          scores[size_t(t)] = x;
          mx = std::max(mx, x);
          any = true;
        }
        if (!any) continue;  // no key to attend to: zeros
        double sum = p.smooth_softmax ? std::exp(-mx) : 0.0;
        for (int64_t t = 0; t < t_len; ++t)
          if (p.visible.empty() || p.visible[mask_row + size_t(t)]) sum += scores[size_t(t)] = std::exp(scores[size_t(t)] - mx);
        double* o = out.data() + ((b * s_len + s) * p.q_heads + n) * p.v_dim;
        for (int64_t t = 0; t < t_len; ++t) {
          if (!p.visible.empty() && !p.visible[mask_row + size_t(t)]) continue;
          const double w = scores[size_t(t)] / sum;
          for (int64_t d = 0; d < p.v_dim; ++d) o[d] += w * vh[t * p.v_dim + d];
        }
      }
    }
  return out;
}

// Heads of a token-major buffer as (B, N, L, H): token (b, l) starts at (b * L + l) *
// token_stride, head n at n * head_stride + offset; bias (indexed n * H + h from
// bias_offset) is added when given.
std::vector<double> to_bnsh(const std::vector<double>& src, int64_t batch, int64_t len, int64_t heads,
                            int64_t head, int64_t token_stride, int64_t head_stride, int64_t offset,
                            const std::vector<double>* bias = nullptr, int64_t bias_offset = 0) {
  std::vector<double> out(static_cast<size_t>(batch * heads * len * head));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t n = 0; n < heads; ++n)
      for (int64_t l = 0; l < len; ++l)
        for (int64_t h = 0; h < head; ++h)
          out[size_t(((b * heads + n) * len + l) * head + h)] =
              src[size_t((b * len + l) * token_stride + n * head_stride + offset + h)] +
              (bias ? (*bias)[size_t(bias_offset + n * head + h)] : 0.0);
  return out;
}

// (B, N, P, H) past rows followed by (B, N, L, H) new rows: (B, N, P + L, H).
std::vector<double> concat_rows(const std::vector<double>& past, int64_t past_len, const std::vector<double>& cur,
                                int64_t len, int64_t bn, int64_t head) {
  std::vector<double> out;
  out.reserve(size_t(bn * (past_len + len) * head));
  for (int64_t i = 0; i < bn; ++i) {
    out.insert(out.end(), past.begin() + i * past_len * head, past.begin() + (i + 1) * past_len * head);
    out.insert(out.end(), cur.begin() + i * len * head, cur.begin() + (i + 1) * len * head);
  }
  return out;
}

// The padding mask (Attention's mask_index, MultiHeadAttention's key_padding_mask) as
// additive scores (B, S, T): end positions (B), end and start positions (2B), or raw 0/1
// masks (B, T) and (B, S, T).
std::vector<double> padding_mask(const KernelContext& ctx, const Tensor& m, int64_t batch, int64_t seq,
                                 int64_t total, double filter, const char* name) {
  if (m.dtype() != DType::i32)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " must be int32, got " + m.describe());
  const std::vector<int64_t> mv = tensor_to_int64s(m);
  std::vector<double> add(size_t(batch * seq * total), 0.0);
  const auto at = [&](int64_t b, int64_t s, int64_t t) -> double& { return add[size_t((b * seq + s) * total + t)]; };
  if (m.rank() == 1 && (m.dim(0) == batch || m.dim(0) == 2 * batch)) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t end = mv[size_t(b)], start = m.dim(0) == 2 * batch ? mv[size_t(batch + b)] : 0;
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t t = 0; t < total; ++t)
          if (t >= end || t < start) at(b, s, t) = filter;
    }
  } else if (m.shape() == Shape{batch, total} || m.shape() == Shape{batch, seq, total}) {
    const bool per_query = m.rank() == 3;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t t = 0; t < total; ++t)
          if (mv[size_t(per_query ? (b * seq + s) * total + t : b * total + t)] == 0) at(b, s, t) = filter;
  } else {
    ctx.fail(ErrorCode::unsupported, std::string(name) + " " + m.describe() + " is not supported: expected (" +
                                         std::to_string(batch) + "), (" + std::to_string(2 * batch) + "), (" +
                                         std::to_string(batch) + ", " + std::to_string(total) + ") or (" +
                                         std::to_string(batch) + ", " + std::to_string(seq) + ", " +
                                         std::to_string(total) + ")");
  }
  return add;
}

// Query s may see keys up to past + s (ONNX Runtime applies it only when S > 1).
std::vector<char> causal_mask(int64_t batch, int64_t seq, int64_t total, int64_t past) {
  std::vector<char> vis(size_t(batch * seq * total), 1);
  if (seq > 1)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t t = past + s + 1; t < total; ++t) vis[size_t((b * seq + s) * total + t)] = 0;
  return vis;
}

void set_attention_bias(const KernelContext& ctx, const Tensor& t, AttentionProblem* p) {
  if (t.rank() != 4 || (t.dim(0) != 1 && t.dim(0) != p->batch) || (t.dim(1) != 1 && t.dim(1) != p->q_heads) ||
      t.dim(2) != p->seq || t.dim(3) != p->total)
    ctx.fail(ErrorCode::invalid_argument, "attention_bias must be (" + std::to_string(p->batch) + " or 1, " +
                                              std::to_string(p->q_heads) + " or 1, " + std::to_string(p->seq) +
                                              ", " + std::to_string(p->total) + "), got " + t.describe());
  p->bias = contrib_floats(ctx, t, "attention_bias");
  p->bias_per_batch = t.dim(0) != 1;
  p->bias_per_head = t.dim(1) != 1;
}

double default_scale(double scale_attr, int64_t head) {
  return scale_attr != 0.0 ? scale_attr : 1.0 / std::sqrt(double(head));
}

void check_rank(const KernelContext& ctx, const Tensor& t, int rank, const char* name, const char* dims) {
  if (t.rank() != rank)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " must be " + dims + ", got " + t.describe());
}

int64_t positive_attr(const Node& node, const char* name) {
  const int64_t v = node.attr_int(name, 0);
  if (v <= 0)
    throw Error(ErrorCode::invalid_model, node.describe() + ": attribute " + name + " must be positive, got " +
                                              std::to_string(v));
  return v;
}

KernelDef attention_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t heads = positive_attr(node, "num_heads");
    const bool unidirectional = node.attr_int("unidirectional", 0) != 0;
    const double filter = node.attr_float("mask_filter_value", -10000.0f), scale_attr = node.attr_float("scale", 0.0f);
    const std::vector<int64_t> sizes = node.attr_ints("qkv_hidden_sizes");
    if (!sizes.empty() && (sizes.size() != 3 || sizes[0] != sizes[1] ||
                           std::any_of(sizes.begin(), sizes.end(), [&](int64_t d) { return d <= 0 || d % heads; })))
      throw Error(ErrorCode::invalid_model, node.describe() +
                                                ": qkv_hidden_sizes must be three positive multiples of num_heads "
                                                "with equal Q and K sizes");
    contrib_unsupported_if(node, node.attr_int("do_rotary", 0) != 0, "do_rotary");
    contrib_unsupported_if(node, node.attr_int("past_present_share_buffer", 0) != 0, "past_present_share_buffer");
    contrib_unsupported_if(node, node.inputs.size() > 6 && !node.inputs[6].empty(), "input 6 (past_sequence_length)");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      const Tensor& w = ctx.required_input(1);
      check_rank(ctx, x, 3, "input", "(batch, sequence, input_hidden)");
      const int64_t batch = x.dim(0), seq = x.dim(1), hin = x.dim(2);
      if (w.rank() != 2 || w.dim(0) != hin || w.dtype() != x.dtype())
        ctx.fail(ErrorCode::invalid_argument, "weights must be (" + std::to_string(hin) +
                                                  ", 3 x hidden) of the input's dtype, got " + w.describe());
      const int64_t width = w.dim(1);
      const int64_t dq = sizes.empty() ? width / 3 : sizes[0], dv = sizes.empty() ? width / 3 : sizes[2];
      if (2 * dq + dv != width || dq % heads || dv % heads || dq == 0)
        ctx.fail(ErrorCode::invalid_argument, "weights " + w.describe() + " do not split into Q, K and V of " +
                                                  std::to_string(heads) + " heads");
      std::vector<double> bias(size_t(width), 0.0);
      if (const Tensor* b = ctx.input(2)) {
        contrib_check_numel(ctx, *b, width, "bias");
        bias = tensor_to_doubles(*b);
      }
      const std::vector<double> xv = contrib_floats(ctx, x, "input"), wv = tensor_to_doubles(w);
      // The projection row by row, walking the weights along their rows.
      std::vector<double> proj(static_cast<size_t>(batch * seq * width));
      for (int64_t r = 0; r < batch * seq; ++r) {
        double* out = proj.data() + r * width;
        std::copy(bias.begin(), bias.end(), out);
        for (int64_t i = 0; i < hin; ++i) {
          const double x = xv[size_t(r * hin + i)];
          const double* wr = wv.data() + i * width;
          for (int64_t j = 0; j < width; ++j) out[j] += x * wr[j];
        }
      }
      AttentionProblem p;
      p.batch = batch;
      p.q_heads = p.kv_heads = heads;
      p.seq = seq;
      p.qk_dim = dq / heads;
      p.v_dim = dv / heads;
      p.scale = default_scale(scale_attr, p.qk_dim);
      p.q = to_bnsh(proj, batch, seq, heads, p.qk_dim, width, p.qk_dim, 0);
      p.k = to_bnsh(proj, batch, seq, heads, p.qk_dim, width, p.qk_dim, dq);
      p.v = to_bnsh(proj, batch, seq, heads, p.v_dim, width, p.v_dim, 2 * dq);
      int64_t past_len = 0;
      if (const Tensor* past = ctx.input(4)) {
        if (past->rank() != 5 || past->dim(0) != 2 || past->dim(1) != batch || past->dim(2) != heads ||
            past->dim(4) != p.qk_dim || p.qk_dim != p.v_dim)
          ctx.fail(ErrorCode::invalid_argument, "past must be (2, " + std::to_string(batch) + ", " +
                                                    std::to_string(heads) + ", past_sequence, " +
                                                    std::to_string(p.qk_dim) + ") with equal Q, K and V sizes, got " +
                                                    past->describe());
        past_len = past->dim(3);
        const std::vector<double> pv = contrib_floats(ctx, *past, "past");
        const size_t half = pv.size() / 2;
        p.k = concat_rows({pv.begin(), pv.begin() + long(half)}, past_len, p.k, seq, batch * heads, p.qk_dim);
        p.v = concat_rows({pv.begin() + long(half), pv.end()}, past_len, p.v, seq, batch * heads, p.v_dim);
      }
      p.total = past_len + seq;
      if (const Tensor* m = ctx.input(3)) p.add = padding_mask(ctx, *m, batch, seq, p.total, filter, "mask_index");
      if (unidirectional) p.visible = causal_mask(batch, seq, p.total, past_len);
      if (const Tensor* ab = ctx.input(5)) set_attention_bias(ctx, *ab, &p);
      contrib_write(ctx, 0, x.dtype(), {batch, seq, dv}, attend(p));
      if (ctx.output_wanted(1)) {
        std::vector<double> present = p.k;
        present.insert(present.end(), p.v.begin(), p.v.end());
        contrib_write(ctx, 1, x.dtype(), {2, batch, heads, p.total, p.qk_dim}, present);
      }
    });
  };
  return KernelDef{"Attention", kMs, 1, INT_MAX, f, {}};
}

KernelDef multihead_attention_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t heads = positive_attr(node, "num_heads");
    const bool unidirectional = node.attr_int("unidirectional", 0) != 0;
    const double filter = node.attr_float("mask_filter_value", -10000.0f), scale_attr = node.attr_float("scale", 0.0f);
    for (int i : {8, 9})
      contrib_unsupported_if(node, int(node.inputs.size()) > i && !node.inputs[size_t(i)].empty(),
                             i == 8 ? "input 8 (past_sequence_length)" : "input 9 (cache_indirection)");
    contrib_unsupported_if(node, node.outputs.size() > 3 && !node.outputs[3].empty(), "output 3 (qk)");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& q = ctx.required_input(0);
      const Tensor* key = ctx.input(1);
      const Tensor* value = ctx.input(2);
      const Tensor* bias_t = ctx.input(3);
      for (const Tensor* t : {key, value, bias_t})
        if (t && t->dtype() != q.dtype())
          ctx.fail(ErrorCode::invalid_argument, "query " + q.describe() + " and " + t->describe() +
                                                    " must have one dtype");
      if (q.rank() != 3 && q.rank() != 5)
        ctx.fail(ErrorCode::invalid_argument,
                 "query must be (batch, sequence, hidden) or packed (batch, sequence, heads, 3, head), got " +
                     q.describe());
      const bool packed_qkv = q.rank() == 5;
      const int64_t batch = q.dim(0), seq = q.dim(1);
      const int64_t head = packed_qkv ? q.dim(4) : q.dim(2) / heads;
      if (packed_qkv ? (q.dim(2) != heads || q.dim(3) != 3 || key || value) : (q.dim(2) % heads || !key))
        ctx.fail(ErrorCode::invalid_argument,
                 "query " + q.describe() + " must hold num_heads=" + std::to_string(heads) +
                     " heads, with key and value given unless it packs Q, K and V");
      const std::vector<double> qv = contrib_floats(ctx, q, "query");
      AttentionProblem p;
      p.batch = batch;
      p.q_heads = p.kv_heads = heads;
      p.seq = seq;
      p.qk_dim = head;
      const bool kv_bnsh = key && key->rank() == 4;
      int64_t kv_len = seq, dv = head;
      if (key && key->rank() == 5) {
        if (key->dim(0) != batch || key->dim(2) != heads || key->dim(3) != 2 || key->dim(4) != head || value)
          ctx.fail(ErrorCode::invalid_argument, "packed key must be (" + std::to_string(batch) +
                                                    ", kv_sequence, " + std::to_string(heads) + ", 2, " +
                                                    std::to_string(head) + ") without value, got " + key->describe());
        kv_len = key->dim(1);
      } else if (kv_bnsh) {
        if (!value || key->shape() != Shape{batch, heads, key->dim(2), head} || value->rank() != 4 ||
            value->dim(0) != batch || value->dim(1) != heads || value->dim(2) != key->dim(2))
          ctx.fail(ErrorCode::invalid_argument, "key and value (batch, heads, kv_sequence, head) must match query " +
                                                    q.describe() + ", got " + key->describe() + " and " +
                                                    (value ? value->describe() : std::string("none")));
        if (bias_t || ctx.input(6))
          ctx.fail(ErrorCode::invalid_argument, "key and value in (batch, heads, kv_sequence, head) take no bias or past");
        kv_len = key->dim(2);
        dv = value->dim(3);
      } else if (key) {
        if (key->rank() != 3 || !value || value->rank() != 3 || key->dim(0) != batch || key->dim(2) != heads * head ||
            value->dim(0) != batch || value->dim(1) != key->dim(1) || value->dim(2) % heads)
          ctx.fail(ErrorCode::invalid_argument, "key and value must be (" + std::to_string(batch) +
                                                    ", kv_sequence, hidden) for query " + q.describe() + ", got " +
                                                    key->describe() + " and " +
                                                    (value ? value->describe() : std::string("none")));
        kv_len = key->dim(1);
        dv = value->dim(2) / heads;
      }
      p.v_dim = dv;
      std::vector<double> bias;
      if (bias_t) {
        contrib_check_numel(ctx, *bias_t, 2 * heads * head + heads * dv, "bias");
        bias = tensor_to_doubles(*bias_t);
      }
      const std::vector<double>* bp = bias_t ? &bias : nullptr;
      if (packed_qkv) {
        p.q = to_bnsh(qv, batch, seq, heads, head, heads * 3 * head, 3 * head, 0, bp, 0);
        p.k = to_bnsh(qv, batch, seq, heads, head, heads * 3 * head, 3 * head, head, bp, heads * head);
        p.v = to_bnsh(qv, batch, seq, heads, head, heads * 3 * head, 3 * head, 2 * head, bp, 2 * heads * head);
      } else {
        p.q = to_bnsh(qv, batch, seq, heads, head, heads * head, head, 0, bp, 0);
        const std::vector<double> kv = tensor_to_doubles(*key);
        if (kv_bnsh) {
          p.k = kv;
          p.v = tensor_to_doubles(*value);
        } else if (key->rank() == 5) {
          p.k = to_bnsh(kv, batch, kv_len, heads, head, heads * 2 * head, 2 * head, 0, bp, heads * head);
          p.v = to_bnsh(kv, batch, kv_len, heads, head, heads * 2 * head, 2 * head, head, bp, 2 * heads * head);
        } else {
          p.k = to_bnsh(kv, batch, kv_len, heads, head, heads * head, head, 0, bp, heads * head);
          p.v = to_bnsh(tensor_to_doubles(*value), batch, kv_len, heads, dv, heads * dv, dv, 0, bp, 2 * heads * head);
        }
      }
      const Tensor* past_k = ctx.input(6);
      const Tensor* past_v = ctx.input(7);
      if (bool(past_k) != bool(past_v))
        ctx.fail(ErrorCode::invalid_argument, "past_key and past_value must be given together");
      int64_t past_len = 0;
      if (past_k) {
        if (past_k->shape() != Shape{batch, heads, past_k->dim(2), head} ||
            past_v->shape() != Shape{batch, heads, past_k->dim(2), dv})
          ctx.fail(ErrorCode::invalid_argument, "past_key " + past_k->describe() + " and past_value " +
                                                    past_v->describe() + " must be (batch, heads, past_sequence, head)");
        past_len = past_k->dim(2);
        p.k = concat_rows(contrib_floats(ctx, *past_k, "past_key"), past_len, p.k, kv_len, batch * heads, head);
        p.v = concat_rows(tensor_to_doubles(*past_v), past_len, p.v, kv_len, batch * heads, dv);
      }
      p.total = past_len + kv_len;
      p.scale = default_scale(scale_attr, head);
      if (const Tensor* m = ctx.input(4))
        p.add = padding_mask(ctx, *m, batch, seq, p.total, filter, "key_padding_mask");
      if (unidirectional) p.visible = causal_mask(batch, seq, p.total, past_len);
      if (const Tensor* ab = ctx.input(5)) set_attention_bias(ctx, *ab, &p);
      contrib_write(ctx, 0, q.dtype(), {batch, seq, heads * dv}, attend(p));
      if (ctx.output_wanted(1)) contrib_write(ctx, 1, q.dtype(), {batch, heads, p.total, head}, p.k);
      if (ctx.output_wanted(2)) contrib_write(ctx, 2, q.dtype(), {batch, heads, p.total, dv}, p.v);
    });
  };
  return KernelDef{"MultiHeadAttention", kMs, 1, INT_MAX, f, {}};
}

KernelDef group_query_attention_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const int64_t heads = positive_attr(node, "num_heads"), kv_heads = positive_attr(node, "kv_num_heads");
    if (heads % kv_heads)
      throw Error(ErrorCode::invalid_model, node.describe() + ": num_heads " + std::to_string(heads) +
                                                " is not a multiple of kv_num_heads " + std::to_string(kv_heads));
    const double scale_attr = node.attr_float("scale", 0.0f), softcap = node.attr_float("softcap", 0.0f);
    const int64_t window = node.attr_int("local_window_size", -1);
    const bool rotary = node.attr_int("do_rotary", 0) != 0, interleaved = node.attr_int("rotary_interleaved", 0) != 0;
    const bool smooth = node.attr_int("smooth_softmax", 0) != 0;
    contrib_unsupported_if(node, node.attr_int("causal", 1) != 1, "causal=0");
    contrib_unsupported_if(node, node.attr_int("qk_output", 0) != 0, "qk_output");
    contrib_unsupported_if(node, node.attr_int("sliding_window_cache", 0) != 0, "sliding_window_cache");
    for (const char* a : {"k_quant_type", "v_quant_type"})
      contrib_unsupported_if(node, node.attr_string(a, "NONE") != "NONE", std::string("a quantized KV cache (") + a + ")");
    for (size_t i = 9; i < node.inputs.size(); ++i)
      contrib_unsupported_if(node, !node.inputs[i].empty(), "input " + std::to_string(i));
    contrib_unsupported_if(node, node.outputs.size() > 3 && !node.outputs[3].empty(), "output 3 (output_qk)");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& q = ctx.required_input(0);
      const Tensor* key = ctx.input(1);
      const Tensor* value = ctx.input(2);
      check_rank(ctx, q, 3, "query", "(batch, sequence, hidden)");
      const int64_t batch = q.dim(0), seq = q.dim(1);
      const bool packed = !key;
      if (bool(key) != bool(value))
        ctx.fail(ErrorCode::invalid_argument, "key and value must be given together (or neither, for packed QKV)");
      const int64_t width = q.dim(2), head = packed ? width / (heads + 2 * kv_heads) : width / heads;
      if (head == 0 || (packed ? head * (heads + 2 * kv_heads) : head * heads) != width)
        ctx.fail(ErrorCode::invalid_argument, "query " + q.describe() + " does not split into " +
                                                  std::to_string(heads) + " heads" +
                                                  (packed ? " and 2 x " + std::to_string(kv_heads) + " KV heads" : ""));
      if (!packed)
        for (const Tensor* t : {key, value})
          if (t->shape() != Shape{batch, seq, kv_heads * head} || t->dtype() != q.dtype())
            ctx.fail(ErrorCode::invalid_argument, "key and value must be (" + std::to_string(batch) + ", " +
                                                      std::to_string(seq) + ", " + std::to_string(kv_heads * head) +
                                                      ") of the query's dtype, got " + t->describe());
      const Tensor& lens_t = ctx.required_input(5);
      const Tensor& total_t = ctx.required_input(6);
      if (lens_t.dtype() != DType::i32 || lens_t.shape() != Shape{batch} || total_t.dtype() != DType::i32 ||
          total_t.numel() != 1)
        ctx.fail(ErrorCode::invalid_argument, "seqlens_k must be int32 (" + std::to_string(batch) +
                                                  ") and total_sequence_length an int32 scalar, got " +
                                                  lens_t.describe() + " and " + total_t.describe());
      const std::vector<int64_t> lens = tensor_to_int64s(lens_t);
      const int64_t total_seq = tensor_to_int64s(total_t)[0];
      const Tensor* past_k = ctx.input(3);
      const Tensor* past_v = ctx.input(4);
      if (bool(past_k) != bool(past_v))
        ctx.fail(ErrorCode::invalid_argument, "past_key and past_value must be given together");
      int64_t past_buf = 0;
      if (past_k) {
        past_buf = past_k->dim(2);
        for (const Tensor* t : {past_k, past_v})
          if (t->rank() != 4 || t->shape() != Shape{batch, kv_heads, past_buf, head} || t->dtype() != q.dtype())
            ctx.fail(ErrorCode::invalid_argument, "past_key and past_value must be (" + std::to_string(batch) + ", " +
                                                      std::to_string(kv_heads) + ", past_sequence, " +
                                                      std::to_string(head) + "), got " + t->describe());
      }
      // A first prompt fills the cache from row 0; otherwise the S new rows follow each
      // batch entry's past (seqlens_k + 1 - S rows). Several new rows after a past are
      // allowed for one batch entry only, as in ONNX Runtime.
      const bool first_prompt = seq == total_seq;
      if (!first_prompt && seq > 1 && batch != 1)
        ctx.fail(ErrorCode::invalid_argument,
                 "batch size must be 1 when sequence_length > 1 and past context is given");
      const int64_t present_len = std::max(total_seq, past_buf);
      std::vector<int64_t> past_len(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t total = lens[size_t(b)] + 1;
        past_len[size_t(b)] = first_prompt ? 0 : total - seq;
        if (total < 1 || total > present_len || past_len[size_t(b)] < 0 || past_len[size_t(b)] > past_buf)
          ctx.fail(ErrorCode::invalid_argument, "seqlens_k[" + std::to_string(b) + "] = " + std::to_string(total - 1) +
                                                    " does not fit sequence length " + std::to_string(seq) +
                                                    ", past length " + std::to_string(past_buf) +
                                                    " and total_sequence_length " + std::to_string(total_seq));
      }
      const std::vector<double> qv = contrib_floats(ctx, q, "query");
      AttentionProblem p;
      p.batch = batch;
      p.q_heads = heads;
      p.kv_heads = kv_heads;
      p.seq = seq;
      p.total = present_len;
      p.qk_dim = p.v_dim = head;
      p.scale = default_scale(scale_attr, head);
      p.softcap = softcap;
      p.smooth_softmax = smooth;
      std::vector<double> kn, vn;
      if (packed) {
        p.q = to_bnsh(qv, batch, seq, heads, head, width, head, 0);
        kn = to_bnsh(qv, batch, seq, kv_heads, head, width, head, heads * head);
        vn = to_bnsh(qv, batch, seq, kv_heads, head, width, head, (heads + kv_heads) * head);
      } else {
        p.q = to_bnsh(qv, batch, seq, heads, head, heads * head, head, 0);
        kn = to_bnsh(tensor_to_doubles(*key), batch, seq, kv_heads, head, kv_heads * head, head, 0);
        vn = to_bnsh(tensor_to_doubles(*value), batch, seq, kv_heads, head, kv_heads * head, head, 0);
      }
      if (rotary) {
        const Tensor& cos_t = ctx.required_input(7);
        const Tensor& sin_t = ctx.required_input(8);
        if (cos_t.rank() != 2 || cos_t.shape() != sin_t.shape() || 2 * cos_t.dim(1) > head)
          ctx.fail(ErrorCode::invalid_argument, "cos_cache " + cos_t.describe() + " and sin_cache " +
                                                    sin_t.describe() + " must be (positions, <= head_size / 2)");
        const int64_t rot = 2 * cos_t.dim(1);
        const std::vector<double> cosv = contrib_floats(ctx, cos_t, "cos_cache"), sinv = tensor_to_doubles(sin_t);
        const auto apply = [&](std::vector<double>& x, int64_t n_heads) {
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t s = 0; s < seq; ++s) {
              // ONNX Runtime gives a first prompt's padding rows position 1.
              const int64_t pos = first_prompt ? (s < lens[size_t(b)] + 1 ? s : 1) : past_len[size_t(b)] + s;
              if (pos >= cos_t.dim(0))
                ctx.fail(ErrorCode::invalid_argument, "position " + std::to_string(pos) + " is outside cos_cache " +
                                                          cos_t.describe());
              for (int64_t n = 0; n < n_heads; ++n)
                rotate(x.data() + ((b * n_heads + n) * seq + s) * head, cosv.data() + pos * rot / 2,
                       sinv.data() + pos * rot / 2, rot, interleaved);
            }
        };
        apply(p.q, heads);
        apply(kn, kv_heads);
      }
      // The present cache: each entry's past rows, its new rows, zeros after them.
      p.k.assign(size_t(batch * kv_heads * present_len * head), 0.0);
      p.v = p.k;
      const std::vector<double> pk = past_k ? tensor_to_doubles(*past_k) : std::vector<double>{},
                                pv = past_v ? tensor_to_doubles(*past_v) : std::vector<double>{};
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t n = 0; n < kv_heads; ++n) {
          const int64_t bn = b * kv_heads + n, past = past_len[size_t(b)];
          const int64_t new_rows = std::min(seq, present_len - past);
          std::copy_n(pk.begin() + bn * past_buf * head, past * head, p.k.begin() + bn * present_len * head);
          std::copy_n(pv.begin() + bn * past_buf * head, past * head, p.v.begin() + bn * present_len * head);
          std::copy_n(kn.begin() + bn * seq * head, new_rows * head, p.k.begin() + (bn * present_len + past) * head);
          std::copy_n(vn.begin() + bn * seq * head, new_rows * head, p.v.begin() + (bn * present_len + past) * head);
        }
      // Query s of entry b sees keys (past + s - window, past + s].
      p.visible.assign(size_t(batch * seq * present_len), 0);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t s = 0; s < seq; ++s) {
          const int64_t last = std::min(past_len[size_t(b)] + s, present_len - 1);
          const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
          for (int64_t t = first; t <= last; ++t) p.visible[size_t((b * seq + s) * present_len + t)] = 1;
        }
      contrib_write(ctx, 0, q.dtype(), {batch, seq, heads * head}, attend(p));
      if (ctx.output_wanted(1)) contrib_write(ctx, 1, q.dtype(), {batch, kv_heads, present_len, head}, p.k);
      if (ctx.output_wanted(2)) contrib_write(ctx, 2, q.dtype(), {batch, kv_heads, present_len, head}, p.v);
    });
  };
  // total_sequence_length (input 6) sets the present length.
  return KernelDef{"GroupQueryAttention", kMs, 1, INT_MAX, f, {6}};
}

}  // namespace

void register_contrib_attention_kernels(KernelRegistry& r) {
  r.add(attention_kernel());
  r.add(multihead_attention_kernel());
  r.add(group_query_attention_kernel());
}

}  // namespace slim::ref
