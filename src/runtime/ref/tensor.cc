// Ref kernels that move data without arithmetic: reshaping, permuting, joining,
// slicing, padding and tiling. They work on raw element bytes, so one implementation
// serves every dtype.
#include <algorithm>
#include <cstring>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

template <typename K>
KernelFactory factory() {
  return [](const Node& node, int64_t opset) -> std::unique_ptr<OpKernel> {
    return std::make_unique<K>(node, opset);
  };
}

[[noreturn]] void bad_attr(const Node& node, const std::string& msg) {
  throw Error(ErrorCode::invalid_model, node.describe() + ": " + msg);
}

std::string ints_str(const std::vector<int64_t>& v) { return shape_str(v); }

// a * b for non-negative sizes, or an error naming the node when it overflows.
int64_t checked_mul(const KernelContext& ctx, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) ctx.fail(ErrorCode::invalid_argument, "size " + std::to_string(a) + " x " + std::to_string(b) + " overflows");
  return r;
}

int64_t checked_add(const KernelContext& ctx, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) ctx.fail(ErrorCode::invalid_argument, "size " + std::to_string(a) + " + " + std::to_string(b) + " overflows");
  return r;
}

// normalize_axis for an axis that must exist: scalars have none.
int existing_axis(const KernelContext& ctx, int64_t axis, int rank) {
  if (rank == 0) ctx.fail(ErrorCode::invalid_argument, "axis " + std::to_string(axis) + " given for a scalar");
  return normalize_axis(ctx, axis, rank);
}

// Block sizes are squared and multiplied into shapes; anything this large is malformed.
constexpr int64_t kMaxBlockSize = int64_t(1) << 20;

// The input tensor viewed contiguously: the Session hands kernels contiguous inputs,
// but a view keeps direct callers safe too.
Tensor packed(const Tensor& t) { return t.contiguous(); }

// ---------------------------------------------------------------- Reshape

class Reshape final : public OpKernel {
 public:
  Reshape(const Node& node, int64_t opset) {
    shape_from_attr_ = opset < 5;
    if (shape_from_attr_) {
      if (!node.has_attr("shape")) bad_attr(node, "attribute 'shape' is required before opset 5");
      attr_shape_ = node.attr_ints("shape");
    }
    allowzero_ = opset >= 14 && node.attr_int("allowzero", 0) != 0;
  }
  int view_input(int i, bool*) const override { return i == 0 ? 0 : -1; }
  void compute(KernelContext& ctx) const override {
    const Tensor& data = ctx.required_input(0);
    const std::vector<int64_t> spec =
        shape_from_attr_ ? attr_shape_ : tensor_to_int64s(ctx.required_input(1));
    Shape out(spec.size());
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < spec.size(); ++i) {
      int64_t d = spec[i];
      if (d == 0 && !allowzero_) {
        if (int(i) >= data.rank())
          ctx.fail(ErrorCode::invalid_argument, "shape " + ints_str(spec) + " copies dim " +
                                                    std::to_string(i) + " that input " +
                                                    data.describe() + " lacks");
        d = data.shape()[i];
      }
      if (d == -1) {
        if (infer >= 0) ctx.fail(ErrorCode::invalid_argument, "shape " + ints_str(spec) + " has more than one -1");
        infer = int(i);
        continue;
      }
      if (d < 0) ctx.fail(ErrorCode::invalid_argument, "shape " + ints_str(spec) + " has a negative dim");
      out[i] = d;
      known = checked_mul(ctx, known, d);
    }
    if (infer >= 0) {
      if (known == 0 || data.numel() % known != 0)
        ctx.fail(ErrorCode::invalid_argument, "cannot infer the -1 of shape " + ints_str(spec) +
                                                  " for input " + data.describe());
      out[size_t(infer)] = data.numel() / known;
    }
    check_output_shape(ctx, out);
    if (shape_numel(out) != data.numel())
      ctx.fail(ErrorCode::invalid_argument, "cannot reshape " + data.describe() + " to " +
                                                shape_str(out) + " (from shape " + ints_str(spec) + ")");
    ctx.set_output(0, packed(data).reshape(out));
  }

 private:
  bool shape_from_attr_ = false;
  bool allowzero_ = false;
  std::vector<int64_t> attr_shape_;
};

// ---------------------------------------------------------------- Transpose

class Transpose final : public OpKernel {
 public:
  Transpose(const Node& node, int64_t) {
    perm_ = node.attr_ints("perm");
    std::vector<int64_t> sorted = perm_;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i)
      if (sorted[i] != int64_t(i)) bad_attr(node, "perm " + ints_str(perm_) + " is not a permutation");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    std::vector<int> perm(size_t(x.rank()));
    if (perm_.empty()) {
      for (int i = 0; i < x.rank(); ++i) perm[size_t(i)] = x.rank() - 1 - i;
    } else {
      if (int(perm_.size()) != x.rank())
        ctx.fail(ErrorCode::invalid_argument, "perm " + ints_str(perm_) + " does not match input " + x.describe());
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = int(perm_[i]);
    }
    const Tensor src = packed(x).permute(perm);
    ctx.output(0, x.dtype(), src.shape()).copy_from(src);
  }

 private:
  std::vector<int64_t> perm_;
};

// ---------------------------------------------------------------- Concat

class Concat final : public OpKernel {
 public:
  Concat(const Node& node, int64_t opset) {
    if (opset >= 4 && !node.has_attr("axis")) bad_attr(node, "attribute 'axis' is required");
    axis_ = node.attr_int("axis", 1);
  }
  void compute(KernelContext& ctx) const override {
    std::vector<const Tensor*> ins;
    for (int i = 0; i < ctx.num_inputs(); ++i)
      if (const Tensor* t = ctx.input(i)) ins.push_back(t);
    if (ins.empty()) ctx.fail(ErrorCode::invalid_model, "needs at least one input");
    const Tensor& first = *ins[0];
    const int axis = existing_axis(ctx, axis_, first.rank());
    Shape out_shape = first.shape();
    out_shape[size_t(axis)] = 0;
    for (const Tensor* t : ins) {
      bool ok = t->dtype() == first.dtype() && t->rank() == first.rank();
      for (int d = 0; ok && d < first.rank(); ++d)
        ok = d == axis || t->shape()[size_t(d)] == first.shape()[size_t(d)];
      if (!ok)
        ctx.fail(ErrorCode::invalid_argument, "inputs " + first.describe() + " and " + t->describe() +
                                                  " cannot be joined on axis " + std::to_string(axis));
      out_shape[size_t(axis)] += t->shape()[size_t(axis)];
    }
    Tensor& out = ctx.output(0, first.dtype(), out_shape);
    int64_t at = 0;
    for (const Tensor* t : ins) {
      const int64_t len = t->shape()[size_t(axis)];
      out.slice(axis, at, at + len).copy_from(*t);
      at += len;
    }
  }

 private:
  int64_t axis_;
};

// ---------------------------------------------------------------- Split

class Split final : public OpKernel {
 public:
  Split(const Node& node, int64_t opset) : opset_(opset) {
    axis_ = node.attr_int("axis", 0);
    if (opset < 13) split_attr_ = node.attr_ints("split");
    if (opset >= 18 && node.has_attr("num_outputs")) {
      num_outputs_ = node.attr_int("num_outputs", 0);
      if (num_outputs_ < 1) bad_attr(node, "num_outputs must be positive");
      if (num_outputs_ != int64_t(node.outputs.size()))
        bad_attr(node, "num_outputs " + std::to_string(num_outputs_) + " but the node has " +
                           std::to_string(node.outputs.size()) + " outputs");
    }
    for (int64_t s : split_attr_)
      if (s < 0) bad_attr(node, "split " + ints_str(split_attr_) + " has a negative size");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int axis = existing_axis(ctx, axis_, x.rank());
    const int64_t dim = x.shape()[size_t(axis)];
    const int n = ctx.num_outputs();
    std::vector<int64_t> sizes = split_attr_;
    // Opset 1 and 13+ take the split sizes as an input.
    if ((opset_ >= 13 || opset_ < 2) && ctx.input(1)) sizes = tensor_to_int64s(*ctx.input(1));
    if (!sizes.empty()) {
      if (int(sizes.size()) != n)
        ctx.fail(ErrorCode::invalid_argument, "split " + ints_str(sizes) + " has " +
                                                  std::to_string(sizes.size()) + " sizes for " +
                                                  std::to_string(n) + " outputs");
      int64_t sum = 0;
      for (int64_t s : sizes) {
        if (s < 0) ctx.fail(ErrorCode::invalid_argument, "split " + ints_str(sizes) + " has a negative size");
        sum += s;
      }
      if (sum != dim)
        ctx.fail(ErrorCode::invalid_argument, "split " + ints_str(sizes) + " does not add up to dim " +
                                                  std::to_string(dim) + " of " + x.describe());
    } else if (num_outputs_ > 0) {
      // Opset 18: chunks of ceil(dim / n), the last one smaller.
      const int64_t chunk = (dim + n - 1) / n;
      int64_t left = dim;
      for (int i = 0; i < n; ++i) {
        sizes.push_back(std::min(chunk, left));
        left -= sizes.back();
      }
    } else {
      if (n == 0 || dim % n != 0)
        ctx.fail(ErrorCode::invalid_argument, "dim " + std::to_string(dim) + " of " + x.describe() +
                                                  " does not split into " + std::to_string(n) + " equal parts");
      sizes.assign(size_t(n), dim / n);
    }
    const Tensor src = packed(x);
    int64_t at = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t len = sizes[size_t(i)];
      if (ctx.output_wanted(i)) {
        Shape s = x.shape();
        s[size_t(axis)] = len;
        ctx.output(i, x.dtype(), s).copy_from(src.slice(axis, at, at + len));
      }
      at += len;
    }
  }

 private:
  int64_t opset_;
  int64_t axis_;
  int64_t num_outputs_ = 0;
  std::vector<int64_t> split_attr_;
};

// ---------------------------------------------------------------- Slice

class Slice final : public OpKernel {
 public:
  Slice(const Node& node, int64_t opset) : from_attrs_(opset < 10) {
    if (from_attrs_) {
      starts_ = node.attr_ints("starts");
      ends_ = node.attr_ints("ends");
      axes_ = node.attr_ints("axes");
      if (starts_.size() != ends_.size() || (!axes_.empty() && axes_.size() != starts_.size()))
        bad_attr(node, "starts, ends and axes differ in length");
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    std::vector<int64_t> starts = starts_, ends = ends_, axes = axes_, steps;
    if (!from_attrs_) {
      starts = tensor_to_int64s(ctx.required_input(1));
      ends = tensor_to_int64s(ctx.required_input(2));
      if (ctx.input(3)) axes = tensor_to_int64s(*ctx.input(3));
      if (ctx.input(4)) steps = tensor_to_int64s(*ctx.input(4));
    }
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
      ctx.fail(ErrorCode::invalid_argument, "starts " + ints_str(starts) + ", ends " + ints_str(ends) +
                                                ", axes " + ints_str(axes) + " and steps " +
                                                ints_str(steps) + " differ in length");
    Shape shape = x.shape(), strides = x.strides();
    int64_t offset = 0;
    std::vector<bool> seen(size_t(x.rank()), false);
    for (size_t i = 0; i < starts.size(); ++i) {
      const int a = existing_axis(ctx, axes[i], x.rank());
      if (seen[size_t(a)]) ctx.fail(ErrorCode::invalid_argument, "axis " + std::to_string(a) + " repeats in axes");
      seen[size_t(a)] = true;
      const int64_t dim = x.shape()[size_t(a)];
      if (steps[i] == 0) ctx.fail(ErrorCode::invalid_argument, "step of axis " + std::to_string(a) + " is 0");
      // A step longer than the axis takes at most one element; clamping keeps the
      // arithmetic below from overflowing.
      const int64_t step = std::clamp<int64_t>(steps[i], -std::max<int64_t>(dim, 1), std::max<int64_t>(dim, 1));
      int64_t st = starts[i], en = ends[i];
      if (st < 0) st += dim;
      if (en < 0) en += dim;
      int64_t len;
      if (step > 0) {
        st = std::clamp<int64_t>(st, 0, dim);
        en = std::clamp<int64_t>(en, 0, dim);
        len = en > st ? (en - st + step - 1) / step : 0;
      } else {
        st = std::max<int64_t>(std::min<int64_t>(st, dim - 1), 0);
        en = std::max<int64_t>(std::min<int64_t>(en, dim - 1), -1);
        len = st > en ? (st - en - step - 1) / (-step) : 0;
      }
      shape[size_t(a)] = len;
      if (len > 0) offset += st * strides[size_t(a)];
      strides[size_t(a)] *= step;
    }
    const bool empty = shape_numel(shape) == 0;
    Tensor& out = ctx.output(0, x.dtype(), shape);
    if (!empty) out.copy_from(x.view(shape, strides, offset));
  }

 private:
  bool from_attrs_;
  std::vector<int64_t> starts_, ends_, axes_;
};

// ---------------------------------------------------------------- Expand / Tile

void expand(KernelContext& ctx) {
  const Tensor x = packed(ctx.required_input(0));
  const std::vector<int64_t> spec = tensor_to_int64s(ctx.required_input(1));
  for (int64_t d : spec)
    if (d < 0) ctx.fail(ErrorCode::invalid_argument, "shape " + ints_str(spec) + " has a negative dim");
  const Shape out_shape = broadcast_shapes(ctx, {x.shape(), Shape(spec)});
  check_output_shape(ctx, out_shape);
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  out.copy_from(x.view(out_shape, broadcast_strides(x.shape(), out_shape), 0));
}

void tile(KernelContext& ctx) {
  const Tensor x = packed(ctx.required_input(0));
  const std::vector<int64_t> reps = tensor_to_int64s(ctx.required_input(1));
  if (int(reps.size()) != x.rank())
    ctx.fail(ErrorCode::invalid_argument, "repeats " + ints_str(reps) + " does not match input " + x.describe());
  Shape out_shape = x.shape();
  for (size_t i = 0; i < reps.size(); ++i) {
    if (reps[i] < 0) ctx.fail(ErrorCode::invalid_argument, "repeats " + ints_str(reps) + " has a negative count");
    out_shape[i] = checked_mul(ctx, out_shape[i], reps[i]);
  }
  check_output_shape(ctx, out_shape);
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  // Each combination of repetition indices is one copy of x at a shifted offset.
  const size_t r = reps.size();
  std::vector<int64_t> block(r, 0);
  const Shape& ost = out.strides();
  while (true) {
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off += block[d] * x.shape()[d] * ost[d];
    out.view(x.shape(), ost, off).copy_from(x);
    size_t d = r;
    while (d-- > 0) {
      if (++block[d] < reps[d]) break;
      block[d] = 0;
    }
    if (d == size_t(-1)) break;
  }
}

// ---------------------------------------------------------------- Pad

// The element bytes of a scalar `value` converted to dtype t.
std::vector<char> scalar_bytes(DType t, double value) {
  std::vector<char> bytes(dtype_size(t));
  visit_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(float(value));
    else v = static_cast<T>(value);
    std::memcpy(bytes.data(), &v, sizeof(T));
  });
  return bytes;
}

class Pad final : public OpKernel {
 public:
  Pad(const Node& node, int64_t opset) : opset_(opset) {
    mode_ = node.attr_string("mode", "constant");
    if (mode_ != "constant" && mode_ != "reflect" && mode_ != "edge" && !(mode_ == "wrap" && opset >= 19))
      bad_attr(node, "unknown mode '" + mode_ + "'");
    if (opset < 11) {
      const char* key = opset < 2 ? "paddings" : "pads";
      if (!node.has_attr(key)) bad_attr(node, std::string("attribute '") + key + "' is required");
      pads_ = node.attr_ints(key);
      value_ = node.attr_float("value", 0.f);
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    const int r = x.rank();
    std::vector<int64_t> pads = pads_;
    std::vector<char> fill = scalar_bytes(x.dtype(), value_);
    std::vector<int64_t> axes;
    if (opset_ >= 11) {
      pads = tensor_to_int64s(ctx.required_input(1));
      if (const Tensor* v = ctx.input(2); v && v->numel() > 0) {
        if (v->dtype() != x.dtype())
          ctx.fail(ErrorCode::invalid_argument, "constant_value " + v->describe() + " does not match data " + x.describe());
        std::memcpy(fill.data(), packed(*v).raw_data(), fill.size());
      }
      if (const Tensor* a = ctx.input(3)) axes = tensor_to_int64s(*a);
    }
    if (axes.empty())
      for (int i = 0; i < r; ++i) axes.push_back(i);
    if (pads.size() != 2 * axes.size())
      ctx.fail(ErrorCode::invalid_argument, "pads " + ints_str(pads) + " needs " +
                                                std::to_string(2 * axes.size()) + " values for input " + x.describe());
    std::vector<int64_t> begin(size_t(r), 0), end(size_t(r), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int a = existing_axis(ctx, axes[i], r);
      begin[size_t(a)] = pads[i];
      end[size_t(a)] = pads[i + axes.size()];
    }
    Shape out_shape(static_cast<size_t>(r), 0);
    // Per axis, the source index of each output index (-1: the constant).
    std::vector<std::vector<int64_t>> src(static_cast<size_t>(r));
    for (int d = 0; d < r; ++d) {
      const int64_t n = x.shape()[size_t(d)];
      const int64_t o = checked_add(ctx, checked_add(ctx, n, begin[size_t(d)]), end[size_t(d)]);
      if (o < 0) ctx.fail(ErrorCode::invalid_argument, "pads " + ints_str(pads) + " remove more than axis " + std::to_string(d) + " of " + x.describe() + " holds");
      out_shape[size_t(d)] = o;
      src[size_t(d)].resize(size_t(o));
      const bool padded = begin[size_t(d)] > 0 || end[size_t(d)] > 0;
      if (mode_ != "constant" && n == 0 && padded && o > 0)
        ctx.fail(ErrorCode::invalid_argument, mode_ + " padding of empty axis " + std::to_string(d));
      for (int64_t k = 0; k < o; ++k) {
        int64_t i = k - begin[size_t(d)];
        if (i < 0 || i >= n) {
          if (mode_ == "constant") {
            i = -1;
          } else if (mode_ == "edge") {
            i = std::clamp<int64_t>(i, 0, n - 1);
          } else if (mode_ == "wrap") {
            i = ((i % n) + n) % n;
          } else if (n == 1) {
            i = 0;
          } else {
            const int64_t period = 2 * (n - 1);
            i = ((i % period) + period) % period;
            if (i >= n) i = period - i;
          }
        }
        src[size_t(d)][size_t(k)] = i;
      }
    }
    check_output_shape(ctx, out_shape);
    Tensor& out = ctx.output(0, x.dtype(), out_shape);
    const int64_t total = out.numel();
    if (total == 0) return;
    const size_t es = x.element_size();
    const char* in = static_cast<const char*>(x.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    std::vector<int64_t> idx(size_t(r), 0);
    for (int64_t k = 0; k < total; ++k) {
      int64_t off = 0;
      bool constant = false;
      for (int d = 0; d < r; ++d) {
        const int64_t s = src[size_t(d)][size_t(idx[size_t(d)])];
        if (s < 0) {
          constant = true;
          break;
        }
        off += s * x.strides()[size_t(d)];
      }
      std::memcpy(o + size_t(k) * es, constant ? fill.data() : in + size_t(off) * es, es);
      for (int d = r; d-- > 0;) {
        if (++idx[size_t(d)] < out_shape[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
  }

 private:
  int64_t opset_;
  std::string mode_;
  std::vector<int64_t> pads_;
  float value_ = 0.f;
};

// ---------------------------------------------------------------- Squeeze / Unsqueeze / Flatten

class Squeeze final : public OpKernel {
 public:
  Squeeze(const Node& node, int64_t opset) : axes_from_input_(opset >= 13) {
    if (!axes_from_input_) axes_ = node.attr_ints("axes");
  }
  int view_input(int i, bool*) const override { return i == 0 ? 0 : -1; }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    std::vector<int64_t> axes = axes_;
    if (axes_from_input_ && ctx.input(1)) axes = tensor_to_int64s(*ctx.input(1));
    std::vector<bool> drop(size_t(x.rank()), false);
    if (axes.empty()) {
      for (int d = 0; d < x.rank(); ++d) drop[size_t(d)] = x.shape()[size_t(d)] == 1;
    } else {
      for (int64_t a : axes) {
        const int d = existing_axis(ctx, a, x.rank());
        if (x.shape()[size_t(d)] != 1)
          ctx.fail(ErrorCode::invalid_argument, "cannot squeeze axis " + std::to_string(a) + " of " +
                                                    x.describe() + ": its size is not 1");
        drop[size_t(d)] = true;
      }
    }
    Shape out;
    for (int d = 0; d < x.rank(); ++d)
      if (!drop[size_t(d)]) out.push_back(x.shape()[size_t(d)]);
    ctx.set_output(0, packed(x).reshape(out));
  }

 private:
  bool axes_from_input_;
  std::vector<int64_t> axes_;
};

class Unsqueeze final : public OpKernel {
 public:
  Unsqueeze(const Node& node, int64_t opset) : axes_from_input_(opset >= 13) {
    if (!axes_from_input_) {
      if (!node.has_attr("axes")) bad_attr(node, "attribute 'axes' is required");
      axes_ = node.attr_ints("axes");
    }
  }
  int view_input(int i, bool*) const override { return i == 0 ? 0 : -1; }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const std::vector<int64_t> axes =
        axes_from_input_ ? tensor_to_int64s(ctx.required_input(1)) : axes_;
    const int out_rank = x.rank() + int(axes.size());
    std::vector<bool> is_new(size_t(out_rank), false);
    for (int64_t a : axes) {
      const int d = normalize_axis(ctx, a, out_rank);
      if (is_new[size_t(d)]) ctx.fail(ErrorCode::invalid_argument, "axes " + ints_str(axes) + " repeat an axis");
      is_new[size_t(d)] = true;
    }
    Shape out;
    size_t k = 0;
    for (int d = 0; d < out_rank; ++d) out.push_back(is_new[size_t(d)] ? 1 : x.shape()[k++]);
    ctx.set_output(0, packed(x).reshape(out));
  }

 private:
  bool axes_from_input_;
  std::vector<int64_t> axes_;
};

class Flatten final : public OpKernel {
 public:
  Flatten(const Node& node, int64_t opset) : opset_(opset) { axis_ = node.attr_int("axis", 1); }
  int view_input(int i, bool*) const override { return i == 0 ? 0 : -1; }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    int64_t axis = axis_;
    if (axis < 0 && opset_ >= 11) axis += x.rank();
    if (axis < 0 || axis > x.rank())
      ctx.fail(ErrorCode::invalid_argument, "axis " + std::to_string(axis_) + " out of range for " + x.describe());
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < x.rank(); ++d) (d < axis ? outer : inner) *= x.shape()[size_t(d)];
    ctx.set_output(0, packed(x).reshape({outer, inner}));
  }

 private:
  int64_t opset_;
  int64_t axis_;
};

// ---------------------------------------------------------------- Identity / Dropout / Constant

// Sequences and optionals (opset 14 and 16) pass through as they are.
class Identity final : public OpKernel {
 public:
  Identity(const Node&, int64_t) {}
  int view_input(int i, bool* same_shape) const override {
    *same_shape = true;
    return i == 0 ? 0 : -1;
  }
  void compute(KernelContext& ctx) const override {
    Value v = ctx.value(0);
    if (!v.defined()) ctx.fail(ErrorCode::invalid_model, "required input 0 is missing");
    if (v.is_tensor()) return ctx.set_output(0, packed(v.tensor()));
    ctx.set_output(0, std::move(v));
  }
};

class Dropout final : public OpKernel {
 public:
  Dropout(const Node& node, int64_t opset) : opset_(opset) {
    ratio_ = node.attr_float("ratio", 0.5f);
    if (opset < 7) training_attr_ = node.attr_int("is_test", 0) == 0;
    has_seed_ = node.has_attr("seed");
    seed_ = node.attr_int("seed", 0);
    may_train_ = opset >= 12 ? node.inputs.size() > 2 && !node.inputs[2].empty() : training_attr_;
  }
  int view_input(int i, bool* same_shape) const override {
    *same_shape = true;
    return i == 0 && !may_train_ ? 0 : -1;
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    double ratio = ratio_;
    bool training = training_attr_;
    if (opset_ >= 12) {
      if (const Tensor* r = ctx.input(1)) {
        const auto v = tensor_to_doubles(*r);
        if (v.size() != 1) ctx.fail(ErrorCode::invalid_argument, "ratio must be a scalar, got " + r->describe());
        ratio = v[0];
      }
      training = false;
      if (const Tensor* t = ctx.input(2)) {
        const auto v = tensor_to_int64s(*t);
        if (v.size() != 1) ctx.fail(ErrorCode::invalid_argument, "training_mode must be a scalar, got " + t->describe());
        training = v[0] != 0;
      }
    }
    if (training && (ratio < 0 || ratio >= 1))
      ctx.fail(ErrorCode::invalid_argument, "ratio " + std::to_string(ratio) + " is outside [0, 1)");
    const DType mask_type = opset_ >= 10 ? DType::boolean : x.dtype();
    const std::vector<char> one = scalar_bytes(mask_type, 1.0), zero = scalar_bytes(mask_type, 0.0);
    if (!training || ratio == 0) {
      ctx.set_output(0, x);
      if (ctx.output_wanted(1)) {
        Tensor& m = ctx.output(1, mask_type, x.shape());
        char* p = static_cast<char*>(m.raw_data());
        for (int64_t i = 0; i < m.numel(); ++i) std::memcpy(p + size_t(i) * one.size(), one.data(), one.size());
      }
      return;
    }
    if (!dtype_is_float(x.dtype()))
      ctx.fail(ErrorCode::unsupported, "training-mode dropout of " + x.describe());
    UniformRng uniform(has_seed_ ? std::optional<uint32_t>(uint32_t(seed_)) : std::nullopt);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    Tensor* mask = ctx.output_wanted(1) ? &ctx.output(1, mask_type, x.shape()) : nullptr;
    const double scale = 1.0 / (1.0 - ratio);
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        const T* in = static_cast<const T*>(x.raw_data());
        T* out = static_cast<T*>(y.raw_data());
        for (int64_t i = 0; i < x.numel(); ++i) {
          const bool keep = uniform() >= ratio;
          out[i] = T(keep ? double(in[i]) * scale : 0.0);
          if (mask) {
            const auto& b = keep ? one : zero;
            std::memcpy(static_cast<char*>(mask->raw_data()) + size_t(i) * b.size(), b.data(), b.size());
          }
        }
      }
    });
  }

 private:
  int64_t opset_;
  float ratio_;
  bool training_attr_ = false;
  bool has_seed_ = false;
  int64_t seed_ = 0;
  bool may_train_ = false;  // training_mode is given (opset 12+) or is_test is 0 (before 7)
};

class Constant final : public OpKernel {
 public:
  Constant(const Node& node, int64_t) {
    int found = 0;
    for (const auto& [key, attr] : node.attrs) {
      (void)attr;
      if (key == "value") {
        const Tensor* t = node.attr_tensor("value");
        if (!t || !t->defined()) bad_attr(node, "attribute 'value' holds no tensor");
        value_ = *t;
      } else if (key == "value_float") {
        value_ = Tensor::scalar<float>(node.attr_float(key, 0.f));
      } else if (key == "value_floats") {
        const auto v = node.attr_floats(key);
        value_ = Tensor::from_vector<float>({int64_t(v.size())}, v);
      } else if (key == "value_int") {
        value_ = Tensor::scalar<int64_t>(node.attr_int(key, 0));
      } else if (key == "value_ints") {
        const auto v = node.attr_ints(key);
        value_ = Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
      } else if (key == "value_string" || key == "value_strings" || key == "sparse_value") {
        throw Error(ErrorCode::unsupported, node.describe() + ": attribute '" + key + "' is not supported");
      } else {
        continue;
      }
      ++found;
    }
    if (found != 1) bad_attr(node, "needs exactly one value attribute, has " + std::to_string(found));
  }
  void compute(KernelContext& ctx) const override { ctx.set_output(0, value_); }

 private:
  Tensor value_;
};

// ---------------------------------------------------------------- DepthToSpace / SpaceToDepth

class DepthToSpace final : public OpKernel {
 public:
  DepthToSpace(const Node& node, int64_t opset) {
    block_ = node.attr_int("blocksize", 0);
    if (block_ < 1 || block_ > kMaxBlockSize) bad_attr(node, "blocksize " + std::to_string(block_) + " is out of range");
    const std::string mode = opset >= 11 ? node.attr_string("mode", "DCR") : "DCR";
    if (mode != "DCR" && mode != "CRD") bad_attr(node, "unknown mode '" + mode + "'");
    crd_ = mode == "CRD";
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    const int64_t b = block_;
    if (x.rank() != 4 || x.dim(1) % (b * b) != 0)
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not NCHW with C divisible by blocksize^2");
    const int64_t n = x.dim(0), c = x.dim(1) / (b * b), h = x.dim(2), w = x.dim(3);
    Tensor& out = ctx.output(0, x.dtype(), {n, c, h * b, w * b});
    // Both modes are a reshape to 6-D, a permutation, and a reshape back.
    const Tensor src = crd_ ? x.reshape({n, c, b, b, h, w}).permute({0, 1, 4, 2, 5, 3})
                            : x.reshape({n, b, b, c, h, w}).permute({0, 3, 4, 1, 5, 2});
    out.reshape({n, c, h, b, w, b}).copy_from(src);
  }

 private:
  int64_t block_;
  bool crd_;
};

class SpaceToDepth final : public OpKernel {
 public:
  SpaceToDepth(const Node& node, int64_t) {
    block_ = node.attr_int("blocksize", 0);
    if (block_ < 1 || block_ > kMaxBlockSize) bad_attr(node, "blocksize " + std::to_string(block_) + " is out of range");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    const int64_t b = block_;
    if (x.rank() != 4 || x.dim(2) % b != 0 || x.dim(3) % b != 0)
      ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not NCHW with H and W divisible by blocksize");
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2) / b, w = x.dim(3) / b;
    Tensor& out = ctx.output(0, x.dtype(), {n, c * b * b, h, w});
    out.reshape({n, b, b, c, h, w})
        .copy_from(x.reshape({n, c, h, b, w, b}).permute({0, 3, 5, 1, 2, 4}));
  }

 private:
  int64_t block_;
};

// ---------------------------------------------------------------- Trilu / EyeLike

class Trilu final : public OpKernel {
 public:
  Trilu(const Node& node, int64_t) : upper_(node.attr_int("upper", 1) != 0) {}
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    if (x.rank() < 2) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " has rank below 2");
    int64_t k = 0;
    if (const Tensor* kt = ctx.input(1)) {
      const auto v = tensor_to_int64s(*kt);
      if (v.size() != 1) ctx.fail(ErrorCode::invalid_argument, "k must be a scalar, got " + kt->describe());
      k = v[0];
    }
    Tensor& out = ctx.output(0, x.dtype(), x.shape());
    const int64_t rows = x.dim(-2), cols = x.dim(-1);
    const int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
    const size_t es = x.element_size();
    const char* in = static_cast<const char*>(x.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    for (int64_t m = 0; m < mats; ++m)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t at = size_t((m * rows + i) * cols + j) * es;
          const bool keep = upper_ ? j - i >= k : j - i <= k;
          if (keep) std::memcpy(o + at, in + at, es);
          else std::memset(o + at, 0, es);
        }
  }

 private:
  bool upper_;
};

// ONNX TensorProto.DataType codes of the dtypes slim has.
std::optional<DType> dtype_from_onnx(int64_t code) {
  switch (code) {
    case 1: return DType::f32;
    case 2: return DType::u8;
    case 3: return DType::i8;
    case 4: return DType::u16;
    case 5: return DType::i16;
    case 6: return DType::i32;
    case 7: return DType::i64;
    case 9: return DType::boolean;
    case 10: return DType::f16;
    case 11: return DType::f64;
    case 12: return DType::u32;
    case 13: return DType::u64;
    case 16: return DType::bf16;
    default: return std::nullopt;
  }
}

class EyeLike final : public OpKernel {
 public:
  EyeLike(const Node& node, int64_t) {
    // Beyond +-2^62 every diagonal is outside any tensor; clamping avoids overflow.
    k_ = std::clamp<int64_t>(node.attr_int("k", 0), -(int64_t(1) << 62), int64_t(1) << 62);
    if (node.has_attr("dtype")) {
      dtype_ = dtype_from_onnx(node.attr_int("dtype", 0));
      if (!dtype_) bad_attr(node, "dtype " + std::to_string(node.attr_int("dtype", 0)) + " is not supported");
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    if (x.rank() != 2) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " is not 2-D");
    const DType t = dtype_.value_or(x.dtype());
    Tensor& out = ctx.output(0, t, x.shape());
    const std::vector<char> one = scalar_bytes(t, 1.0);
    const size_t es = one.size();
    char* o = static_cast<char*>(out.raw_data());
    std::memset(o, 0, out.nbytes());
    for (int64_t i = 0; i < x.dim(0); ++i) {
      const int64_t j = i + k_;
      if (j >= 0 && j < x.dim(1)) std::memcpy(o + size_t(i * x.dim(1) + j) * es, one.data(), es);
    }
  }

 private:
  int64_t k_;
  std::optional<DType> dtype_;
};

// ---------------------------------------------------------------- Compress / ReverseSequence

class Compress final : public OpKernel {
 public:
  Compress(const Node& node, int64_t) {
    has_axis_ = node.has_attr("axis");
    axis_ = node.attr_int("axis", 0);
  }
  void compute(KernelContext& ctx) const override {
    Tensor x = packed(ctx.required_input(0));
    const Tensor& cond_t = ctx.required_input(1);
    if (cond_t.rank() != 1) ctx.fail(ErrorCode::invalid_argument, "condition " + cond_t.describe() + " is not 1-D");
    const std::vector<int64_t> cond = tensor_to_int64s(cond_t);
    if (!has_axis_) x = x.reshape({x.numel()});
    const int axis = existing_axis(ctx, axis_, x.rank());
    const int64_t dim = x.shape()[size_t(axis)];
    if (int64_t(cond.size()) > dim)
      ctx.fail(ErrorCode::invalid_argument, "condition " + cond_t.describe() + " is longer than axis " +
                                                std::to_string(axis) + " of " + x.describe());
    std::vector<int64_t> keep;
    for (size_t i = 0; i < cond.size(); ++i)
      if (cond[i]) keep.push_back(int64_t(i));
    Shape s = x.shape();
    s[size_t(axis)] = int64_t(keep.size());
    Tensor& out = ctx.output(0, x.dtype(), s);
    for (size_t j = 0; j < keep.size(); ++j)
      out.slice(axis, int64_t(j), int64_t(j) + 1).copy_from(x.slice(axis, keep[j], keep[j] + 1));
  }

 private:
  bool has_axis_;
  int64_t axis_;
};

class ReverseSequence final : public OpKernel {
 public:
  ReverseSequence(const Node& node, int64_t) {
    batch_axis_ = node.attr_int("batch_axis", 1);
    time_axis_ = node.attr_int("time_axis", 0);
    if (!((batch_axis_ == 0 && time_axis_ == 1) || (batch_axis_ == 1 && time_axis_ == 0)))
      bad_attr(node, "batch_axis and time_axis must be 0 and 1 in some order");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor x = packed(ctx.required_input(0));
    if (x.rank() < 2) ctx.fail(ErrorCode::invalid_argument, "input " + x.describe() + " has rank below 2");
    const std::vector<int64_t> lens = tensor_to_int64s(ctx.required_input(1));
    const int b_ax = int(batch_axis_), t_ax = int(time_axis_);
    const int64_t batch = x.shape()[size_t(b_ax)], steps = x.shape()[size_t(t_ax)];
    if (int64_t(lens.size()) != batch)
      ctx.fail(ErrorCode::invalid_argument, "sequence_lens has " + std::to_string(lens.size()) +
                                                " values for batch " + std::to_string(batch));
    Tensor& out = ctx.output(0, x.dtype(), x.shape());
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens[size_t(b)];
      if (len < 0 || len > steps)
        ctx.fail(ErrorCode::invalid_argument, "sequence length " + std::to_string(len) + " of batch " +
                                                  std::to_string(b) + " is outside [0, " + std::to_string(steps) + "]");
      const Tensor src = x.slice(b_ax, b, b + 1);
      const Tensor dst = out.slice(b_ax, b, b + 1);
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t from = t < len ? len - 1 - t : t;
        dst.slice(t_ax, t, t + 1).copy_from(src.slice(t_ax, from, from + 1));
      }
    }
  }

 private:
  int64_t batch_axis_, time_axis_;
};

}  // namespace

void register_tensor_kernels(KernelRegistry& r) {
  r.add({"Reshape", "", 1, 4, factory<Reshape>(), {}});
  r.add({"Reshape", "", 5, INT_MAX, factory<Reshape>(), {1}});
  r.add({"Transpose", "", 1, INT_MAX, factory<Transpose>(), {}});
  r.add({"Concat", "", 1, INT_MAX, factory<Concat>(), {}});
  r.add({"Split", "", 1, 1, factory<Split>(), {1}});
  r.add({"Split", "", 2, 12, factory<Split>(), {}});
  r.add({"Split", "", 13, INT_MAX, factory<Split>(), {1}});
  r.add({"Slice", "", 1, 9, factory<Slice>(), {}});
  r.add({"Slice", "", 10, INT_MAX, factory<Slice>(), {1, 2, 3, 4}});
  r.add({"Expand", "", 8, INT_MAX, simple_kernel(expand), {1}});
  r.add({"Tile", "", 6, INT_MAX, simple_kernel(tile), {1}});
  r.add({"Pad", "", 1, 10, factory<Pad>(), {}});
  r.add({"Pad", "", 11, INT_MAX, factory<Pad>(), {1, 3}});
  r.add({"Squeeze", "", 1, 12, factory<Squeeze>(), {}});
  r.add({"Squeeze", "", 13, INT_MAX, factory<Squeeze>(), {1}});
  r.add({"Unsqueeze", "", 1, 12, factory<Unsqueeze>(), {}});
  r.add({"Unsqueeze", "", 13, INT_MAX, factory<Unsqueeze>(), {1}});
  r.add({"Flatten", "", 1, INT_MAX, factory<Flatten>(), {}});
  r.add({"Identity", "", 1, INT_MAX, factory<Identity>(), {}});
  r.add({"Dropout", "", 1, INT_MAX, factory<Dropout>(), {}});
  r.add({"Constant", "", 1, INT_MAX, factory<Constant>(), {}});
  r.add({"DepthToSpace", "", 1, INT_MAX, factory<DepthToSpace>(), {}});
  r.add({"SpaceToDepth", "", 1, INT_MAX, factory<SpaceToDepth>(), {}});
  r.add({"Trilu", "", 14, INT_MAX, factory<Trilu>(), {}});
  r.add({"EyeLike", "", 9, INT_MAX, factory<EyeLike>(), {}});
  r.add({"Compress", "", 9, INT_MAX, factory<Compress>(), {1}});
  r.add({"ReverseSequence", "", 10, INT_MAX, factory<ReverseSequence>(), {}});
}

}  // namespace slim::ref
