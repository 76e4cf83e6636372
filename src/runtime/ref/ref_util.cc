#include "runtime/ref/ref_util.h"

#include <type_traits>

namespace slim::ref {

int normalize_axis(const Node& node, int64_t axis, int rank) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1))
    throw Error(ErrorCode::invalid_model, node.describe() + ": axis " + std::to_string(axis) +
                                              " out of range for rank " + std::to_string(rank));
  return int(a);
}

int normalize_axis(const KernelContext& ctx, int64_t axis, int rank) {
  return normalize_axis(ctx.node(), axis, rank);
}

Shape broadcast_shapes(const KernelContext& ctx, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      const size_t o = rank - s.size() + i;
      const int64_t d = s[i];
      if (d == out[o] || d == 1) continue;
      if (out[o] == 1) {
        out[o] = d;
        continue;
      }
      std::string all;
      for (const auto& x : shapes) all += shape_str(x) + " ";
      ctx.fail(ErrorCode::invalid_argument, "shapes cannot be broadcast: " + all);
    }
  }
  return out;
}

Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st(out.size(), 0);
  int64_t acc = 1;
  for (size_t i = in.size(); i-- > 0;) {
    const size_t o = out.size() - in.size() + i;
    st[o] = in[i] == 1 ? 0 : acc;
    acc *= in[i];
  }
  return st;
}

std::vector<int64_t> broadcast_index_map(const Shape& in, const Shape& out) {
  const int64_t n = shape_numel(out);
  std::vector<int64_t> map(size_t(n), 0);
  const Shape st = broadcast_strides(in, out);
  const size_t r = out.size();
  std::vector<int64_t> idx(r, 0);
  int64_t src = 0;
  for (int64_t k = 0; k < n; ++k) {
    map[size_t(k)] = src;
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      src += st[d];
      if (idx[d] < out[d]) break;
      src -= st[d] * idx[d];
      idx[d] = 0;
    }
  }
  return map;
}

void check_output_shape(const KernelContext& ctx, const Shape& shape) {
  int64_t acc = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(acc, std::max<int64_t>(d, 1), &acc))
      ctx.fail(ErrorCode::invalid_argument, "output shape " + shape_str(shape) + " is not a valid tensor shape");
  }
}

namespace {
template <typename V>
void write_converted(Tensor& out, const std::vector<V>& v) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.raw_data());
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) o[i] = T(float(v[i]));
      else o[i] = static_cast<T>(v[i]);
    }
  });
}
}  // namespace

void write_doubles(Tensor& out, const std::vector<double>& v) { write_converted(out, v); }
void write_ints(Tensor& out, const std::vector<int64_t>& v) { write_converted(out, v); }

MatMulPlan::MatMulPlan(const KernelContext& ctx, const Shape& a_in, const Shape& b_in) {
  if (a_in.empty() || b_in.empty())
    ctx.fail(ErrorCode::invalid_argument, "MatMul inputs must have rank >= 1, got " +
                                              shape_str(a_in) + " and " + shape_str(b_in));
  Shape a = a_in, b = b_in;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  m = a[a.size() - 2];
  k = a[a.size() - 1];
  n = b[b.size() - 1];
  if (b[b.size() - 2] != k)
    ctx.fail(ErrorCode::invalid_argument,
             "inner dimensions differ: " + shape_str(a_in) + " x " + shape_str(b_in));
  const Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  const Shape batch = broadcast_shapes(ctx, {ab, bb});
  batches = shape_numel(batch);
  a_batch = broadcast_index_map(ab, batch);
  b_batch = broadcast_index_map(bb, batch);
  out_shape = batch;
  if (a_in.size() > 1) out_shape.push_back(m);
  if (b_in.size() > 1) out_shape.push_back(n);
}

namespace {
// The kernel of `def`, reporting the outputs inferred when it was built.
class InferredOutputsKernel final : public OpKernel {
 public:
  InferredOutputsKernel(std::unique_ptr<OpKernel> inner, std::vector<std::pair<DType, Shape>> outputs)
      : inner_(std::move(inner)), outputs_(std::move(outputs)) {}
  void compute(KernelContext& ctx) const override { inner_->compute(ctx); }
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i < 0 || size_t(i) >= outputs_.size()) return false;
    *dtype = outputs_[size_t(i)].first;
    *shape = outputs_[size_t(i)].second;
    return true;
  }

 private:
  std::unique_ptr<OpKernel> inner_;
  std::vector<std::pair<DType, Shape>> outputs_;
};
}  // namespace

KernelDef with_inferred_outputs(KernelDef def, OutputInference infer) {
  def.build = [factory = def.factory, infer = std::move(infer)](const KernelBuildInfo& info) {
    std::unique_ptr<OpKernel> kernel = factory(info.node, info.opset);
    for (const auto& in : info.inputs)
      if (in.present && (!in.dtype || !in.shape)) return kernel;
    std::vector<Tensor> none;
    const std::vector<const Tensor*> no_inputs;
    const KernelContext ctx(info.node, no_inputs, &none, nullptr, nullptr);
    std::vector<std::pair<DType, Shape>> outputs;
    try {
      outputs = infer(info, ctx);
    } catch (const Error&) {
      return kernel;  // the run reports it, with the real inputs
    }
    return std::unique_ptr<OpKernel>(std::make_unique<InferredOutputsKernel>(std::move(kernel), std::move(outputs)));
  };
  return def;
}

}  // namespace slim::ref
