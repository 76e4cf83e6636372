// Ref kernels of ONNX Runtime's contrib ops (domain com.microsoft, opset 1) that optimized
// and quantized exports carry: Gelu, FastGelu, BiasGelu, QuickGelu, SkipLayerNormalization,
// SkipSimplifiedLayerNormalization, EmbedLayerNormalization, FusedMatMul, MatMulNBits and
// RotaryEmbedding. The attention ops are in contrib_attention.cc. Floats compute in double
// and round once; the semantics follow ONNX Runtime's CPU kernels (checked against
// onnxruntime-node by tests/runtime/contrib_ops_test.cc).
#include <cmath>
#include <numbers>

#include "runtime/ref/contrib_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

std::vector<double> contrib_floats(const KernelContext& ctx, const Tensor& t, const char* name) {
  if (!dtype_is_float(t.dtype()))
    ctx.fail(ErrorCode::unsupported,
             std::string(name) + " of dtype " + std::string(dtype_name(t.dtype())) + " is not supported");
  return tensor_to_doubles(t);
}

void contrib_write(KernelContext& ctx, int index, DType dtype, const Shape& shape,
                   const std::vector<double>& v) {
  write_doubles(ctx.output(index, dtype, shape), v);
}

void contrib_check_numel(const KernelContext& ctx, const Tensor& t, int64_t n, const char* name) {
  if (t.numel() != n)
    ctx.fail(ErrorCode::invalid_argument,
             std::string(name) + " must have " + std::to_string(n) + " elements, got " + t.describe());
}

void contrib_unsupported_if(const Node& node, bool cond, const std::string& what) {
  if (cond) throw Error(ErrorCode::unsupported, node.describe() + ": " + what + " is not supported");
}

namespace {

constexpr const char* kMs = "com.microsoft";

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x * std::numbers::sqrt2 / 2)); }

// An elementwise activation of X, after adding a bias along X's last axis when the node
// has one (input 1).
template <typename Fn>
KernelDef activation_kernel(const char* op, bool bias_required, Fn fn) {
  KernelFactory f = [=](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const double alpha = node.attr_float("alpha", 1.702f);  // QuickGelu
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      std::vector<double> v = contrib_floats(ctx, x, "input");
      const Tensor* b = bias_required ? &ctx.required_input(1) : ctx.input(1);
      if (b) {
        if (b->dtype() != x.dtype() || b->rank() != 1 || x.rank() == 0 || b->dim(0) != x.dim(-1))
          ctx.fail(ErrorCode::invalid_argument, "bias " + b->describe() +
                                                    " must be 1-D with X's dtype and last dim, X is " +
                                                    x.describe());
        const std::vector<double> bv = tensor_to_doubles(*b);
        for (size_t i = 0; i < v.size(); ++i) v[i] += bv[i % bv.size()];
      }
      for (double& e : v) e = fn(e, alpha);
      contrib_write(ctx, 0, x.dtype(), x.shape(), v);
    });
  };
  return KernelDef{op, kMs, 1, INT_MAX, f, {}};
}

// SkipLayerNormalization / SkipSimplifiedLayerNormalization: s = input + skip (+ bias),
// normalized over the last axis (RMS when simplified), scaled by gamma (+ beta). The skip
// may lack leading dims of the input (it repeats over them).
KernelDef skip_norm_kernel(bool simplified) {
  KernelFactory f = [=](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const double eps = node.attr_float("epsilon", 1e-12f);
    // ONNX Runtime leaves the RMS form's mean output unwritten (zeros): not a value to copy.
    if (simplified && node.outputs.size() > 1 && !node.outputs[1].empty())
      throw Error(ErrorCode::unsupported,
                  node.describe() + ": output 1 (mean) of the RMS normalization is not supported");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      const Tensor& skip = ctx.required_input(1);
      if (x.rank() < 2)
        ctx.fail(ErrorCode::invalid_argument, "input must have rank 2 or 3, got " + x.describe());
      Shape tail = skip.shape();
      while (!tail.empty() && tail.front() == 1 && tail.size() > 1) tail.erase(tail.begin());
      if (skip.dtype() != x.dtype() || tail.size() > x.shape().size() ||
          !std::equal(tail.rbegin(), tail.rend(), x.shape().rbegin()))
        ctx.fail(ErrorCode::invalid_argument, "skip " + skip.describe() +
                                                  " must have the input's dtype and trailing dims, input is " +
                                                  x.describe());
      const int64_t h = x.dim(-1), rows = x.numel() / std::max<int64_t>(h, 1);
      const int bias_index = simplified ? 3 : 4;
      const Tensor& gamma_t = ctx.required_input(2);
      contrib_check_numel(ctx, gamma_t, h, "gamma");
      const std::vector<double> gamma = tensor_to_doubles(gamma_t);
      std::vector<double> beta(size_t(h), 0.0), bias(size_t(h), 0.0);
      if (!simplified && ctx.input(3)) {
        contrib_check_numel(ctx, *ctx.input(3), h, "beta");
        beta = tensor_to_doubles(*ctx.input(3));
      }
      if (const Tensor* b = ctx.input(bias_index)) {
        contrib_check_numel(ctx, *b, h, "bias");
        bias = tensor_to_doubles(*b);
      }
      std::vector<double> s = contrib_floats(ctx, x, "input");
      const std::vector<double> sk = tensor_to_doubles(skip);
      for (size_t i = 0; i < s.size(); ++i) s[i] += sk[i % sk.size()] + bias[i % size_t(h)];
      std::vector<double> y(s.size()), mean(static_cast<size_t>(rows)), inv_std(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const double* row = s.data() + r * h;
        double m = 0, v = 0;
        if (!simplified) {
          for (int64_t i = 0; i < h; ++i) m += row[i];
          m /= double(h);
        }
        for (int64_t i = 0; i < h; ++i) v += (row[i] - m) * (row[i] - m);
        const double is = 1.0 / std::sqrt(v / double(h) + eps);
        for (int64_t i = 0; i < h; ++i)
          y[size_t(r * h + i)] = (row[i] - m) * is * gamma[size_t(i)] + beta[size_t(i)];
        mean[size_t(r)] = m;
        inv_std[size_t(r)] = is;
      }
      contrib_write(ctx, 0, x.dtype(), x.shape(), y);
      Shape stat = x.shape();
      stat.back() = 1;
      if (ctx.output_wanted(1)) contrib_write(ctx, 1, DType::f32, stat, mean);
      if (ctx.output_wanted(2)) contrib_write(ctx, 2, DType::f32, stat, inv_std);
      if (ctx.output_wanted(3)) contrib_write(ctx, 3, x.dtype(), x.shape(), s);
    });
  };
  return KernelDef{simplified ? "SkipSimplifiedLayerNormalization" : "SkipLayerNormalization", kMs,
                   1, INT_MAX, f, {}};
}

// An int32 (or int64) tensor of `shape` as int64s.
std::vector<int64_t> read_ints(const KernelContext& ctx, const Tensor& t, const Shape& shape, const char* name) {
  if (t.dtype() != DType::i32 && t.dtype() != DType::i64)
    ctx.fail(ErrorCode::invalid_argument, std::string(name) + " must be int32, got " + t.describe());
  if (t.shape() != shape)
    ctx.fail(ErrorCode::invalid_argument,
             std::string(name) + " must have shape " + shape_str(shape) + ", got " + t.describe());
  return tensor_to_int64s(t);
}

// read_ints, with every index checked against [0, limit).
std::vector<int64_t> read_indices(const KernelContext& ctx, const Tensor& t, const Shape& shape,
                                  int64_t limit, const char* name) {
  std::vector<int64_t> v = read_ints(ctx, t, shape, name);
  for (int64_t i : v)
    if (i < 0 || i >= limit)
      ctx.fail(ErrorCode::invalid_argument, std::string(name) + " holds " + std::to_string(i) +
                                                ", outside [0, " + std::to_string(limit) + ")");
  return v;
}

// BERT's embedding layer: word + position (+ segment) embeddings, layer-normalized; the
// mask's count of ones per row as mask_index; the sum before normalization as embedding_sum.
KernelDef embed_layer_norm_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const double eps = node.attr_float("epsilon", 1e-12f);
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& ids_t = ctx.required_input(0);
      const Tensor& word_t = ctx.required_input(2);
      const Tensor& pos_t = ctx.required_input(3);
      if (ids_t.rank() != 2)
        ctx.fail(ErrorCode::invalid_argument, "input_ids must be (batch, sequence), got " + ids_t.describe());
      for (const Tensor* e : {&word_t, &pos_t})
        if (e->rank() != 2 || e->dim(1) != word_t.dim(-1))
          ctx.fail(ErrorCode::invalid_argument,
                   "embeddings must be 2-D with one hidden size, got " + e->describe());
      const int64_t batch = ids_t.dim(0), seq = ids_t.dim(1), h = word_t.dim(1);
      const Shape bs{batch, seq};
      const std::vector<int64_t> ids = read_indices(ctx, ids_t, bs, word_t.dim(0), "input_ids");
      std::vector<int64_t> segs, pos;
      const Tensor* seg_emb_t = ctx.input(4);
      if (const Tensor* s = ctx.input(1)) {
        if (!seg_emb_t) ctx.fail(ErrorCode::invalid_argument, "segment_ids need segment_embedding");
        if (seg_emb_t->rank() != 2 || seg_emb_t->dim(1) != h)
          ctx.fail(ErrorCode::invalid_argument, "segment_embedding must be (n, " + std::to_string(h) +
                                                    "), got " + seg_emb_t->describe());
        segs = read_indices(ctx, *s, bs, seg_emb_t->dim(0), "segment_ids");
      }
      if (const Tensor* p = ctx.input(8)) {
        const bool row = p->rank() == 2 && p->dim(0) == 1 && batch != 1;
        pos = read_indices(ctx, *p, row ? Shape{1, seq} : bs, pos_t.dim(0), "position_ids");
      } else {
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t s = 0; s < seq; ++s) pos.push_back(s);
        if (seq > pos_t.dim(0))
          ctx.fail(ErrorCode::invalid_argument, "sequence length " + std::to_string(seq) +
                                                    " exceeds position_embedding " + pos_t.describe());
      }
      const Tensor& gamma_t = ctx.required_input(5);
      const Tensor& beta_t = ctx.required_input(6);
      contrib_check_numel(ctx, gamma_t, h, "gamma");
      contrib_check_numel(ctx, beta_t, h, "beta");
      const std::vector<double> word = contrib_floats(ctx, word_t, "word_embedding"),
                                posv = tensor_to_doubles(pos_t), gamma = tensor_to_doubles(gamma_t),
                                beta = tensor_to_doubles(beta_t);
      const std::vector<double> segv = segs.empty() ? std::vector<double>{} : tensor_to_doubles(*seg_emb_t);
      std::vector<double> sum(static_cast<size_t>(batch * seq * h)), y(sum.size());
      for (int64_t t = 0; t < batch * seq; ++t) {
        double* e = sum.data() + t * h;
        const int64_t p = pos[size_t(pos.size() == size_t(seq) ? t % seq : t)];
        double m = 0, v = 0;
        for (int64_t i = 0; i < h; ++i) {
          e[i] = word[size_t(ids[size_t(t)] * h + i)] + posv[size_t(p * h + i)];
          if (!segs.empty()) e[i] += segv[size_t(segs[size_t(t)] * h + i)];
          m += e[i];
        }
        m /= double(h);
        for (int64_t i = 0; i < h; ++i) v += (e[i] - m) * (e[i] - m);
        const double is = 1.0 / std::sqrt(v / double(h) + eps);
        for (int64_t i = 0; i < h; ++i) y[size_t(t * h + i)] = (e[i] - m) * is * gamma[size_t(i)] + beta[size_t(i)];
      }
      contrib_write(ctx, 0, word_t.dtype(), {batch, seq, h}, y);
      if (ctx.output_wanted(1)) {
        std::vector<int64_t> count(size_t(batch), 0);
        if (const Tensor* m = ctx.input(7)) {
          const std::vector<int64_t> mv = read_ints(ctx, *m, bs, "mask");
          for (size_t i = 0; i < mv.size(); ++i) count[i / size_t(seq)] += mv[i] == 1;
        }
        write_ints(ctx.output(1, DType::i32, {batch}), count);
      }
      if (ctx.output_wanted(2)) contrib_write(ctx, 2, word_t.dtype(), {batch, seq, h}, sum);
    });
  };
  return KernelDef{"EmbedLayerNormalization", kMs, 1, INT_MAX, f, {}};
}

// The last two dims of a row-major (..., r, c) array swapped.
std::vector<double> transpose_last2(const std::vector<double>& v, Shape* shape) {
  const size_t n = shape->size();
  const int64_t r = (*shape)[n - 2], c = (*shape)[n - 1];
  std::vector<double> t(v.size());
  for (size_t base = 0; base < v.size(); base += size_t(r * c))
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) t[base + size_t(j * r + i)] = v[base + size_t(i * c + j)];
  std::swap((*shape)[n - 2], (*shape)[n - 1]);
  return t;
}

// alpha * op(A) x op(B) with numpy matmul batching, op transposing the last two dims.
KernelDef fused_matmul_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const double alpha = node.attr_float("alpha", 1.0f);
    const bool ta = node.attr_int("transA", 0) != 0, tb = node.attr_int("transB", 0) != 0;
    contrib_unsupported_if(node, node.attr_int("transBatchA", 0) != 0 || node.attr_int("transBatchB", 0) != 0,
                           "transBatchA/transBatchB");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& a = ctx.required_input(0);
      const Tensor& b = ctx.required_input(1);
      if (a.dtype() != b.dtype())
        ctx.fail(ErrorCode::invalid_model, "inputs have different dtypes: " + a.describe() + " and " + b.describe());
      if ((ta && a.rank() < 2) || (tb && b.rank() < 2))
        ctx.fail(ErrorCode::unsupported, "transA/transB on a 1-D input is not supported");
      if (a.rank() < 1 || b.rank() < 1)
        ctx.fail(ErrorCode::invalid_argument, "inputs must have rank >= 1, got " + a.describe() +
                                                  " and " + b.describe());
      Shape sa = a.shape(), sb = b.shape();
      std::vector<double> va = contrib_floats(ctx, a, "input"), vb = tensor_to_doubles(b);
      if (ta) va = transpose_last2(va, &sa);
      if (tb) vb = transpose_last2(vb, &sb);
      const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
      if (a1) sa.insert(sa.begin(), 1);
      if (b1) sb.push_back(1);
      const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
      if (sb[sb.size() - 2] != k)
        ctx.fail(ErrorCode::invalid_argument, "inner dimensions differ: " + shape_str(sa) + " x " + shape_str(sb));
      const Shape ab(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
      Shape out = broadcast_shapes(ctx, {ab, bb});
      const int64_t batches = shape_numel(out);
      const std::vector<int64_t> amap = broadcast_index_map(ab, out), bmap = broadcast_index_map(bb, out);
      std::vector<double> y(size_t(batches * m * n), 0.0);
      for (int64_t t = 0; t < batches; ++t)
        for (int64_t i = 0; i < m; ++i) {
          // Row i walks B along its rows; each output still sums its k products in order.
          double* out = y.data() + (t * m + i) * n;
          for (int64_t p = 0; p < k; ++p) {
            const double x = va[size_t((amap[size_t(t)] * m + i) * k + p)];
            const double* br = vb.data() + (bmap[size_t(t)] * k + p) * n;
            for (int64_t j = 0; j < n; ++j) out[j] += x * br[j];
          }
          for (int64_t j = 0; j < n; ++j) out[j] *= alpha;
        }
      if (!a1) out.push_back(m);
      if (!b1) out.push_back(n);
      contrib_write(ctx, 0, a.dtype(), out, y);
    });
  };
  return KernelDef{"FusedMatMul", kMs, 1, INT_MAX, f, {}};
}

KernelDef matmul_nbits_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const NBitsShape q = NBitsShape::from_node(node);
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& a = ctx.required_input(0);
      const std::vector<double> av = contrib_floats(ctx, a, "A");
      if (a.rank() < 1 || a.dim(-1) != q.k)
        ctx.fail(ErrorCode::invalid_argument,
                 "A must end in K=" + std::to_string(q.k) + ", got " + a.describe());
      const std::vector<float> w = q.dequantize(ctx);  // (N, K)
      std::vector<double> a_used = av;
      if (q.int8_a) {
        const std::vector<float> af(av.begin(), av.end());
        std::vector<int8_t> codes(af.size());
        std::vector<float> scales(size_t(q.k_blocks));
        for (size_t r = 0; r < af.size(); r += size_t(q.k)) {
          quantize_a_int8(af.data() + r, q.k, q.block, codes.data() + r, scales.data());
          for (int64_t p = 0; p < q.k; ++p) a_used[r + size_t(p)] = double(codes[r + size_t(p)]) * scales[size_t(p / q.block)];
        }
      }
      std::vector<double> bias;
      if (const Tensor* b = ctx.input(5)) {
        contrib_check_numel(ctx, *b, q.n, "bias");
        bias = tensor_to_doubles(*b);
      }
      const int64_t m = a.numel() / q.k;
      std::vector<double> y(static_cast<size_t>(m * q.n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < q.n; ++j) {
          double acc = bias.empty() ? 0.0 : bias[size_t(j)];
          for (int64_t p = 0; p < q.k; ++p) acc += a_used[size_t(i * q.k + p)] * w[size_t(j * q.k + p)];
          y[size_t(i * q.n + j)] = acc;
        }
      Shape out = a.shape();
      out.back() = q.n;
      contrib_write(ctx, 0, a.dtype(), out, y);
    });
  };
  return KernelDef{"MatMulNBits", kMs, 1, INT_MAX, f, {}};
}

KernelDef rotary_embedding_kernel() {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    const RotaryAttrs attrs{node.attr_int("interleaved", 0) != 0, node.attr_int("num_heads", 0),
                            node.attr_int("rotary_embedding_dim", 0)};
    if (attrs.rotary_dim > 0 && attrs.num_heads <= 0)
      throw Error(ErrorCode::invalid_model, node.describe() + ": rotary_embedding_dim needs num_heads");
    contrib_unsupported_if(node, node.attr_float("scale", 1.0f) != 1.0f, "scale other than 1");
    contrib_unsupported_if(node, node.attr_int("is_packed_batching", 0) != 0, "is_packed_batching");
    return make_kernel([=](KernelContext& ctx) {
      const Tensor& x = ctx.required_input(0);
      const Tensor& pos_t = ctx.required_input(1);
      const Tensor& cos_t = ctx.required_input(2);
      const Tensor& sin_t = ctx.required_input(3);
      if (x.rank() != 3 && x.rank() != 4)
        ctx.fail(ErrorCode::invalid_argument,
                 "input must be (batch, sequence, hidden) or (batch, heads, sequence, head), got " + x.describe());
      if (cos_t.rank() != 2 || cos_t.shape() != sin_t.shape())
        ctx.fail(ErrorCode::invalid_argument, "cos_cache " + cos_t.describe() + " and sin_cache " +
                                                  sin_t.describe() + " must be 2-D of one shape");
      const bool bnsh = x.rank() == 4;
      const int64_t batch = x.dim(0), seq = bnsh ? x.dim(2) : x.dim(1);
      int64_t heads = 0, head = 0;
      if (bnsh) {
        heads = x.dim(1);
        head = x.dim(3);
      } else {
        head = attrs.num_heads > 0 ? x.dim(2) / attrs.num_heads : cos_t.dim(1) * 2;
        heads = head > 0 ? x.dim(2) / head : 0;
        if (head <= 0 || heads * head != x.dim(2))
          ctx.fail(ErrorCode::invalid_argument, "hidden size " + std::to_string(x.dim(2)) +
                                                    " is not a multiple of the head size " + std::to_string(head));
      }
      const int64_t rot = attrs.rotary_dim > 0 ? attrs.rotary_dim : head;
      if (rot > head || rot % 2 != 0 || cos_t.dim(1) != rot / 2)
        ctx.fail(ErrorCode::invalid_argument, "cos_cache " + cos_t.describe() + " does not fit rotary dim " +
                                                  std::to_string(rot) + " of head size " + std::to_string(head));
      std::vector<int64_t> pos;
      if (pos_t.numel() == 1) {
        const int64_t p0 = tensor_to_int64s(pos_t)[0];
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t s = 0; s < seq; ++s) pos.push_back(p0 + s);
      } else {
        if (pos_t.shape() != Shape{batch, seq})
          ctx.fail(ErrorCode::invalid_argument, "position_ids must be (1) or (" + std::to_string(batch) + ", " +
                                                    std::to_string(seq) + "), got " + pos_t.describe());
        pos = tensor_to_int64s(pos_t);
      }
      for (int64_t p : pos)
        if (p < 0 || p >= cos_t.dim(0))
          ctx.fail(ErrorCode::invalid_argument, "position " + std::to_string(p) + " is outside cos_cache " +
                                                    cos_t.describe());
      std::vector<double> v = contrib_floats(ctx, x, "input");
      const std::vector<double> cosv = tensor_to_doubles(cos_t), sinv = tensor_to_doubles(sin_t);
      const int64_t hs = bnsh ? seq * head : head, ss = bnsh ? head : heads * head;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t s = 0; s < seq; ++s)
          for (int64_t n = 0; n < heads; ++n) {
            double* row = v.data() + b * heads * seq * head + s * ss + n * hs;
            const int64_t p = pos[size_t(b * seq + s)];
            rotate(row, cosv.data() + p * rot / 2, sinv.data() + p * rot / 2, rot, attrs.interleaved);
          }
      contrib_write(ctx, 0, x.dtype(), x.shape(), v);
    });
  };
  return KernelDef{"RotaryEmbedding", kMs, 1, INT_MAX, f, {}};
}

}  // namespace

NBitsShape NBitsShape::from_node(const Node& node) {
  NBitsShape q;
  q.k = node.attr_int("K", 0);
  q.n = node.attr_int("N", 0);
  q.bits = node.attr_int("bits", 4);
  q.block = node.attr_int("block_size", 0);
  if (q.k <= 0 || q.n <= 0)
    throw Error(ErrorCode::invalid_model, node.describe() + ": attributes K and N must be positive, got K=" +
                                              std::to_string(q.k) + " N=" + std::to_string(q.n));
  if (q.block < 16 || (q.block & (q.block - 1)) != 0)
    throw Error(ErrorCode::invalid_model, node.describe() + ": block_size must be a power of two >= 16, got " +
                                              std::to_string(q.block));
  if (q.bits != 2 && q.bits != 4 && q.bits != 8)
    throw Error(ErrorCode::unsupported, node.describe() + ": bits=" + std::to_string(q.bits) +
                                            " is not supported (2, 4 or 8)");
  if (node.inputs.size() > 4 && !node.inputs[4].empty())
    throw Error(ErrorCode::unsupported, node.describe() + ": input 4 (g_idx) is not supported");
  // ONNX Runtime has int8 kernels for 4- and 8-bit weights only; 2-bit ones stay in float.
  q.int8_a = node.attr_int("accuracy_level", 0) == 4 && q.bits != 2;
  q.k_blocks = (q.k + q.block - 1) / q.block;
  q.blob = q.block * q.bits / 8;
  return q;
}

std::vector<float> NBitsShape::dequantize(const KernelContext& ctx) const {
  const Tensor& b = ctx.required_input(1);
  const Tensor& scales_t = ctx.required_input(2);
  if (b.dtype() != DType::u8 || b.numel() != n * k_blocks * blob)
    ctx.fail(ErrorCode::invalid_argument, "B must be uint8 (" + std::to_string(n) + ", " + std::to_string(k_blocks) +
                                              ", " + std::to_string(blob) + "), got " + b.describe());
  contrib_check_numel(ctx, scales_t, n * k_blocks, "scales");
  const std::vector<double> scales = contrib_floats(ctx, scales_t, "scales");
  const int64_t per = 8 / bits, mask = (1 << bits) - 1;
  // Zero points: packed like B (uint8) or one float per block; default 2^(bits - 1).
  std::vector<double> zp(size_t(n * k_blocks), double(1 << (bits - 1)));
  if (const Tensor* z = ctx.input(3)) {
    if (z->dtype() == DType::u8) {
      const int64_t row = (k_blocks + per - 1) / per;
      contrib_check_numel(ctx, *z, n * row, "zero_points");
      const uint8_t* zb = z->data<uint8_t>();
      for (int64_t j = 0; j < n; ++j)
        for (int64_t kb = 0; kb < k_blocks; ++kb)
          zp[size_t(j * k_blocks + kb)] = double((zb[j * row + kb / per] >> (bits * (kb % per))) & mask);
    } else {
      contrib_check_numel(ctx, *z, n * k_blocks, "zero_points");
      zp = contrib_floats(ctx, *z, "zero_points");
    }
  }
  const uint8_t* codes = b.data<uint8_t>();
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) {
      const int64_t kb = p / block, i = p % block;
      const uint8_t byte = codes[(j * k_blocks + kb) * blob + i / per];
      const int q = (byte >> (bits * (i % per))) & mask;
      const size_t s = size_t(j * k_blocks + kb);
      w[size_t(j * k + p)] = float((double(q) - zp[s]) * scales[s]);
    }
  return w;
}

void quantize_a_int8(const float* a, int64_t k, int64_t block, int8_t* codes, float* scales) {
  for (int64_t b0 = 0; b0 < k; b0 += block) {
    const int64_t len = std::min(block, k - b0);
    float amax = 0;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(a[b0 + i]));
    const float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < len; ++i) codes[b0 + i] = int8_t(std::nearbyint(a[b0 + i] * inv));
    scales[b0 / block] = scale;
  }
}

void rotate(double* row, const double* cos, const double* sin, int64_t rot, bool interleaved) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const double x = row[a], y = row[b];
    row[a] = x * cos[i] - y * sin[i];
    row[b] = y * cos[i] + x * sin[i];
  }
}

void register_contrib_kernels(KernelRegistry& r) {
  r.add(activation_kernel("Gelu", false, [](double x, double) { return gelu_erf(x); }));
  r.add(activation_kernel("BiasGelu", true, [](double x, double) { return gelu_erf(x); }));
  r.add(activation_kernel("FastGelu", false, [](double x, double) {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }));
  r.add(activation_kernel("QuickGelu", false, [](double x, double alpha) {
    return x / (1.0 + std::exp(-alpha * x));
  }));
  r.add(skip_norm_kernel(false));
  r.add(skip_norm_kernel(true));
  r.add(embed_layer_norm_kernel());
  r.add(fused_matmul_kernel());
  r.add(matmul_nbits_kernel());
  r.add(rotary_embedding_kernel());
}

}  // namespace slim::ref
