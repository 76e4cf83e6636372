// Sequences and optionals (ONNX's non-tensor values): SequenceConstruct/Empty/At/Insert/
// Erase/Length, SplitToSequence, ConcatFromSequence, Optional, OptionalHasElement,
// OptionalGetElement. A sequence is an immutable list of tensors of one type (a Value):
// ops that change one build a new list that shares the tensors. SequenceMap, which runs
// a subgraph, is in control_flow.cc.
#include <climits>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

Value sequence_input(const KernelContext& ctx, int i) {
  const Value v = ctx.value(i);
  if (!v.defined()) ctx.fail(ErrorCode::invalid_model, "required input " + std::to_string(i) + " is missing");
  if (!v.is_sequence())
    ctx.fail(ErrorCode::invalid_argument, "input " + std::to_string(i) + " must be a sequence, got " + v.describe());
  return v;
}

// A position input (an int32 or int64 scalar) in [-size, size - 1], or [-size, size]
// where one past the end is allowed (SequenceInsert); negative counts from the end.
int64_t position(const KernelContext& ctx, const Tensor& p, int64_t size, bool past_end) {
  if ((p.dtype() != DType::i64 && p.dtype() != DType::i32) || p.numel() != 1)
    ctx.fail(ErrorCode::invalid_argument, "the position must be an int32 or int64 scalar, got " + p.describe());
  const int64_t pos = p.dtype() == DType::i64 ? *p.data<int64_t>() : *p.data<int32_t>();
  const int64_t last = past_end ? size : size - 1;
  if (size == 0 && !past_end)
    ctx.fail(ErrorCode::invalid_argument, "position " + std::to_string(pos) + " is out of range: the sequence is empty");
  if (pos < -size || pos > last)
    ctx.fail(ErrorCode::invalid_argument, "position " + std::to_string(pos) + " is out of range [" +
                                              std::to_string(-size) + ", " + std::to_string(last) +
                                              "] for a sequence of " + std::to_string(size) + " tensors");
  return pos < 0 ? pos + size : pos;
}

// The sequence's element type, which every tensor put into it must have.
void check_fits(const KernelContext& ctx, const Value& seq, const Tensor& t) {
  if (seq.elem_dtype() && *seq.elem_dtype() != t.dtype())
    ctx.fail(ErrorCode::invalid_argument, "cannot put " + t.describe() + " into a sequence of " +
                                              std::string(dtype_name(*seq.elem_dtype())) + " tensors");
}

void sequence_construct(KernelContext& ctx) {
  std::vector<Tensor> items;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    items.push_back(ctx.required_input(i));
    if (items.back().dtype() != items[0].dtype())
      ctx.fail(ErrorCode::invalid_argument, "input " + std::to_string(i) + " is " + items.back().describe() +
                                                ", input 0 " + items[0].describe() + ": a sequence has one type");
  }
  if (items.empty()) ctx.fail(ErrorCode::invalid_model, "needs at least one input");
  ctx.set_output(0, Value::sequence(std::move(items)));
}

class SequenceEmpty final : public OpKernel {
 public:
  explicit SequenceEmpty(const Node& node) {
    const int64_t code = node.attr_int("dtype", 1);  // float
    if (!onnx_dtype_to_slim(code, &dtype_))
      throw Error(ErrorCode::unsupported, node.describe() + ": attribute 'dtype' is ONNX type " +
                                              std::to_string(code) + ", which slim does not support");
  }
  void compute(KernelContext& ctx) const override { ctx.set_output(0, Value::sequence({}, dtype_)); }

 private:
  DType dtype_ = DType::f32;
};

void sequence_at(KernelContext& ctx) {
  const Value seq = sequence_input(ctx, 0);
  const auto& items = seq.items();
  ctx.set_output(0, items[size_t(position(ctx, ctx.required_input(1), int64_t(items.size()), false))]);
}

void sequence_insert(KernelContext& ctx) {
  const Value seq = sequence_input(ctx, 0);
  const Tensor& t = ctx.required_input(1);
  check_fits(ctx, seq, t);
  std::vector<Tensor> items = seq.items();
  const Tensor* p = ctx.input(2);
  const int64_t pos = p ? position(ctx, *p, int64_t(items.size()), true) : int64_t(items.size());
  items.insert(items.begin() + pos, t);
  ctx.set_output(0, Value::sequence(std::move(items), t.dtype()));
}

void sequence_erase(KernelContext& ctx) {
  const Value seq = sequence_input(ctx, 0);
  std::vector<Tensor> items = seq.items();
  const int64_t n = int64_t(items.size());
  const Tensor* p = ctx.input(1);
  const int64_t pos = p ? position(ctx, *p, n, false) : n - 1;
  if (!p && n == 0) ctx.fail(ErrorCode::invalid_argument, "cannot erase from an empty sequence");
  items.erase(items.begin() + pos);
  ctx.set_output(0, Value::sequence(std::move(items), seq.elem_dtype()));
}

void sequence_length(KernelContext& ctx) {
  const Value seq = sequence_input(ctx, 0);
  ctx.output(0, DType::i64, {}).data<int64_t>()[0] = int64_t(seq.items().size());
}

// SplitToSequence(input, split?): pieces of `split` along `axis` (a scalar: that size,
// the last piece smaller; a list: those sizes), or of size 1 without it, the axis
// dropped when keepdims is 0.
class SplitToSequence final : public OpKernel {
 public:
  explicit SplitToSequence(const Node& node)
      : axis_(node.attr_int("axis", 0)), keepdims_(node.attr_int("keepdims", 1) != 0) {}

  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int axis = normalize_axis(ctx, axis_, x.rank());
    const int64_t dim = x.shape()[size_t(axis)];
    std::vector<int64_t> sizes;
    const Tensor* split = ctx.input(1);
    if (split) {
      if (split->dtype() != DType::i64 && split->dtype() != DType::i32)
        ctx.fail(ErrorCode::invalid_argument, "split must be int32 or int64, got " + split->describe());
      const std::vector<int64_t> v = tensor_to_int64s(*split);
      if (split->rank() == 0) {
        if (v[0] <= 0) ctx.fail(ErrorCode::invalid_argument, "a scalar split must be positive, got " + std::to_string(v[0]));
        for (int64_t start = 0; start < dim; start += v[0]) sizes.push_back(std::min(v[0], dim - start));
      } else {
        if (split->rank() != 1) ctx.fail(ErrorCode::invalid_argument, "split must be a scalar or 1-D, got " + split->describe());
        int64_t total = 0;
        for (int64_t s : v) {
          if (s < 0) ctx.fail(ErrorCode::invalid_argument, "split sizes must not be negative");
          total += s;
        }
        if (total != dim)
          ctx.fail(ErrorCode::invalid_argument, "split sizes add up to " + std::to_string(total) +
                                                    ", axis " + std::to_string(axis) + " has " + std::to_string(dim));
        sizes = v;
      }
    } else {
      sizes.assign(size_t(dim), 1);
    }
    const bool squeeze = !split && !keepdims_;
    std::vector<Tensor> items;
    int64_t start = 0;
    for (int64_t s : sizes) {
      Tensor piece = x.slice(axis, start, start + s).contiguous();
      if (squeeze) {
        Shape shape = piece.shape();
        shape.erase(shape.begin() + axis);
        piece = piece.reshape(shape);
      }
      items.push_back(std::move(piece));
      start += s;
    }
    ctx.set_output(0, Value::sequence(std::move(items), x.dtype()));
  }

 private:
  int64_t axis_;
  bool keepdims_;
};

// ConcatFromSequence: the tensors joined along `axis`, or stacked along a new one.
class ConcatFromSequence final : public OpKernel {
 public:
  explicit ConcatFromSequence(const Node& node) : new_axis_(node.attr_int("new_axis", 0) != 0) {
    if (!node.has_attr("axis"))
      throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'axis' is required");
    axis_ = node.attr_int("axis", 0);
  }

  void compute(KernelContext& ctx) const override {
    const Value seq = sequence_input(ctx, 0);
    const auto& items = seq.items();
    if (items.empty()) ctx.fail(ErrorCode::invalid_argument, "the sequence is empty: nothing to concatenate");
    const Tensor& first = items[0];
    const int axis = normalize_axis(ctx, axis_, first.rank() + (new_axis_ ? 1 : 0));
    Shape out_shape = first.shape();
    if (new_axis_) out_shape.insert(out_shape.begin() + axis, 0);
    for (const auto& t : items) {
      Shape s = t.shape();
      if (new_axis_) s.insert(s.begin() + axis, 1);
      bool fits = t.dtype() == first.dtype() && s.size() == out_shape.size();
      for (size_t d = 0; fits && d < s.size(); ++d) fits = int(d) == axis || s[d] == out_shape[d];
      if (!fits)
        ctx.fail(ErrorCode::invalid_argument, "cannot join " + t.describe() + " with " + first.describe() +
                                                  " along axis " + std::to_string(axis));
    }
    out_shape[size_t(axis)] = 0;
    for (const auto& t : items) out_shape[size_t(axis)] += new_axis_ ? 1 : t.shape()[size_t(axis)];
    check_output_shape(ctx, out_shape);
    Tensor& y = ctx.output(0, first.dtype(), out_shape);
    int64_t at = 0;
    for (const auto& t : items) {
      const int64_t n = new_axis_ ? 1 : t.shape()[size_t(axis)];
      Tensor dst = y.slice(axis, at, at + n);
      dst.copy_from(t.reshape(dst.shape()));
      at += n;
    }
  }

 private:
  int64_t axis_ = 0;
  bool new_axis_;
};

// Optional(x): an optional holding x; without x, an empty one of the `type` attribute.
class OptionalKernel final : public OpKernel {
 public:
  explicit OptionalKernel(const Node& node) {
    if (node.num_present_inputs() == 0 && !node.has_attr("type"))
      throw Error(ErrorCode::invalid_model, node.describe() + ": without an input it needs the 'type' attribute");
    if (const Attribute* a = node.attr("type")) {
      if (a->kind != Attribute::Kind::type)
        throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'type' is not a type");
      if (a->s.rfind("tensor(", 0) != 0 && a->s.rfind("seq(", 0) != 0)
        throw Error(ErrorCode::unsupported, node.describe() + ": optionals of " + a->s +
                                                " are not supported (tensors and sequences are)");
    }
  }
  void compute(KernelContext& ctx) const override {
    const Value v = ctx.value(0);
    if (!v.defined()) return ctx.set_output(0, Value::none());
    if (v.is_optional()) ctx.fail(ErrorCode::invalid_argument, "cannot wrap " + v.describe() + " in an optional");
    ctx.set_output(0, Value::optional(v));
  }
};

// OptionalHasElement / OptionalGetElement also take a plain tensor or sequence (a
// present value, as opset 18 spells out): a Loop carries an optional into its body and
// the body's sequence back into the same input.
void optional_has_element(KernelContext& ctx) {
  const Value v = ctx.value(0);
  ctx.output(0, DType::boolean, {}).data<bool>()[0] = v.defined() && (!v.is_optional() || v.has_element());
}

void optional_get_element(KernelContext& ctx) {
  const Value v = ctx.value(0);
  if (!v.defined()) ctx.fail(ErrorCode::invalid_model, "required input 0 is missing");
  if (!v.is_optional()) return ctx.set_output(0, v);
  if (!v.has_element()) ctx.fail(ErrorCode::invalid_argument, "the optional is empty");
  ctx.set_output(0, v.element());
}

template <typename K>
KernelFactory node_kernel() {
  return [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> { return std::make_unique<K>(node); };
}

}  // namespace

void register_sequence_kernels(KernelRegistry& r) {
  r.add({"SequenceConstruct", "", 11, INT_MAX, simple_kernel(sequence_construct), {}});
  r.add({"SequenceEmpty", "", 11, INT_MAX, node_kernel<SequenceEmpty>(), {}});
  r.add({"SequenceAt", "", 11, INT_MAX, simple_kernel(sequence_at), {}});
  r.add({"SequenceInsert", "", 11, INT_MAX, simple_kernel(sequence_insert), {}});
  r.add({"SequenceErase", "", 11, INT_MAX, simple_kernel(sequence_erase), {}});
  r.add({"SequenceLength", "", 11, INT_MAX, simple_kernel(sequence_length), {}});
  r.add({"SplitToSequence", "", 11, INT_MAX, node_kernel<SplitToSequence>(), {}});
  r.add({"ConcatFromSequence", "", 11, INT_MAX, node_kernel<ConcatFromSequence>(), {}});
  r.add({"Optional", "", 15, INT_MAX, node_kernel<OptionalKernel>(), {}});
  r.add({"OptionalHasElement", "", 15, INT_MAX, simple_kernel(optional_has_element), {}});
  r.add({"OptionalGetElement", "", 15, INT_MAX, simple_kernel(optional_get_element), {}});
}

}  // namespace slim::ref
