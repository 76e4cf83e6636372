// Ref kernels that address elements through index tensors: Gather*, Scatter*, OneHot,
// NonZero and Unique. Every index read from a tensor is range-checked (negative ones
// count from the end) before it touches memory.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <numeric>

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

// An index into an axis of length `dim`, negative ones counted from the end.
// normalize_axis, but an error for scalars, which have no axis to index.
int data_axis(const KernelContext& ctx, int64_t axis, const Tensor& data) {
  if (data.rank() == 0) ctx.fail(ErrorCode::invalid_argument, "data " + data.describe() + " is a scalar");
  return normalize_axis(ctx, axis, data.rank());
}

int64_t checked_index(const KernelContext& ctx, int64_t i, int64_t dim, const char* what) {
  const int64_t k = i < 0 ? i + dim : i;
  if (k < 0 || k >= dim)
    ctx.fail(ErrorCode::invalid_argument, std::string(what) + " " + std::to_string(i) +
                                              " is out of range for an axis of size " + std::to_string(dim));
  return k;
}

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// Advances a row-major multi-index; false when it wrapped around.
bool next_index(std::vector<int64_t>& idx, const Shape& shape) {
  for (size_t d = idx.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

enum class Reduction { none, add, mul, max, min };

Reduction parse_reduction(const Node& node, int64_t opset) {
  const std::string r = node.attr_string("reduction", "none");
  if (r == "none") return Reduction::none;
  if (opset >= 16 && r == "add") return Reduction::add;
  if (opset >= 16 && r == "mul") return Reduction::mul;
  if (opset >= 18 && r == "max") return Reduction::max;
  if (opset >= 18 && r == "min") return Reduction::min;
  throw Error(ErrorCode::invalid_model, node.describe() + ": unknown reduction '" + r + "'");
}

template <typename T>
T combine(T a, T b, Reduction r) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(combine<float>(float(a), float(b), r));
  } else if constexpr (std::is_same_v<T, bool>) {
    switch (r) {
      case Reduction::none: return b;
      case Reduction::add: case Reduction::max: return a || b;
      case Reduction::mul: case Reduction::min: return a && b;
    }
    return b;
  } else {
    switch (r) {
      case Reduction::none: return b;
      case Reduction::add: return T(a + b);
      case Reduction::mul: return T(a * b);
      case Reduction::max: return std::max(a, b);
      case Reduction::min: return std::min(a, b);
    }
    return b;
  }
}

// ---------------------------------------------------------------- Gather

class Gather final : public OpKernel {
 public:
  Gather(const Node& node, int64_t) : axis_(node.attr_int("axis", 0)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor data = ctx.required_input(0).contiguous();
    const std::vector<int64_t> idx = tensor_to_int64s(ctx.required_input(1));
    const Shape& ishape = ctx.required_input(1).shape();
    const int axis = data_axis(ctx, axis_, data);
    const int64_t dim = data.shape()[size_t(axis)];
    Shape out_shape(data.shape().begin(), data.shape().begin() + axis);
    out_shape.insert(out_shape.end(), ishape.begin(), ishape.end());
    out_shape.insert(out_shape.end(), data.shape().begin() + axis + 1, data.shape().end());
    check_output_shape(ctx, out_shape);
    Tensor& out = ctx.output(0, data.dtype(), out_shape);
    const int64_t outer = prod(data.shape(), 0, size_t(axis));
    const size_t inner = size_t(prod(data.shape(), size_t(axis) + 1, data.shape().size())) * data.element_size();
    const char* in = static_cast<const char*>(data.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    const int64_t n = int64_t(idx.size());
    for (int64_t j = 0; j < n; ++j) checked_index(ctx, idx[size_t(j)], dim, "index");
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t j = 0; j < n; ++j) {
        int64_t k = idx[size_t(j)];
        if (k < 0) k += dim;
        std::memcpy(o + size_t(a * n + j) * inner, in + size_t(a * dim + k) * inner, inner);
      }
  }

 private:
  int64_t axis_;
};

// ---------------------------------------------------------------- GatherElements / ScatterElements

// Checks that `indices` fits `data` for the *Elements ops and returns the normalized axis.
int elements_axis(const KernelContext& ctx, int64_t axis, const Tensor& data, const Tensor& indices) {
  const int a = data_axis(ctx, axis, data);
  bool ok = indices.rank() == data.rank();
  for (int d = 0; ok && d < data.rank(); ++d)
    ok = d == a || indices.shape()[size_t(d)] <= data.shape()[size_t(d)];
  if (!ok)
    ctx.fail(ErrorCode::invalid_argument, "indices " + indices.describe() + " do not fit data " +
                                              data.describe() + " on axis " + std::to_string(a));
  return a;
}

class GatherElements final : public OpKernel {
 public:
  GatherElements(const Node& node, int64_t) : axis_(node.attr_int("axis", 0)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor data = ctx.required_input(0).contiguous();
    const Tensor& indices = ctx.required_input(1);
    const int axis = elements_axis(ctx, axis_, data, indices);
    const std::vector<int64_t> idx = tensor_to_int64s(indices);
    Tensor& out = ctx.output(0, data.dtype(), indices.shape());
    if (out.numel() == 0) return;
    const size_t es = data.element_size();
    const char* in = static_cast<const char*>(data.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    const int64_t dim = data.shape()[size_t(axis)];
    std::vector<int64_t> pos(indices.shape().size(), 0);
    int64_t k = 0;
    do {
      int64_t off = 0;
      for (size_t d = 0; d < pos.size(); ++d)
        off += (int(d) == axis ? checked_index(ctx, idx[size_t(k)], dim, "index") : pos[d]) * data.strides()[d];
      std::memcpy(o + size_t(k) * es, in + size_t(off) * es, es);
      ++k;
    } while (next_index(pos, indices.shape()));
  }

 private:
  int64_t axis_;
};

class ScatterElements final : public OpKernel {
 public:
  ScatterElements(const Node& node, int64_t opset)
      : axis_(node.attr_int("axis", 0)), reduction_(parse_reduction(node, opset)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor data = ctx.required_input(0).contiguous();
    const Tensor& indices = ctx.required_input(1);
    const Tensor updates = ctx.required_input(2).contiguous();
    const int axis = elements_axis(ctx, axis_, data, indices);
    if (updates.shape() != indices.shape() || updates.dtype() != data.dtype())
      ctx.fail(ErrorCode::invalid_argument, "updates " + updates.describe() + " must match indices " +
                                                indices.describe() + " in shape and data " + data.describe() + " in dtype");
    const std::vector<int64_t> idx = tensor_to_int64s(indices);
    Tensor& out = ctx.output(0, data.dtype(), data.shape());
    out.copy_from(data);
    if (indices.numel() == 0) return;
    const int64_t dim = data.shape()[size_t(axis)];
    visit_dtype(data.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* o = static_cast<T*>(out.raw_data());
      const T* u = static_cast<const T*>(updates.raw_data());
      std::vector<int64_t> pos(indices.shape().size(), 0);
      int64_t k = 0;
      do {
        int64_t off = 0;
        for (size_t d = 0; d < pos.size(); ++d)
          off += (int(d) == axis ? checked_index(ctx, idx[size_t(k)], dim, "index") : pos[d]) * out.strides()[d];
        o[off] = combine<T>(o[off], u[k], reduction_);
        ++k;
      } while (next_index(pos, indices.shape()));
    });
  }

 private:
  int64_t axis_;
  Reduction reduction_;
};

// ---------------------------------------------------------------- GatherND / ScatterND

class GatherND final : public OpKernel {
 public:
  GatherND(const Node& node, int64_t) : batch_dims_(node.attr_int("batch_dims", 0)) {
    if (batch_dims_ < 0) throw Error(ErrorCode::invalid_model, node.describe() + ": batch_dims is negative");
  }
  void compute(KernelContext& ctx) const override {
    const Tensor data = ctx.required_input(0).contiguous();
    const Tensor& indices = ctx.required_input(1);
    const size_t b = size_t(batch_dims_), r = size_t(data.rank()), q = size_t(indices.rank());
    const Shape& is = indices.shape();
    if (q < 1 || b >= q || b >= r || b + size_t(is[q - 1]) > r)
      ctx.fail(ErrorCode::invalid_argument, "indices " + indices.describe() + " with batch_dims " +
                                                std::to_string(b) + " do not fit data " + data.describe());
    for (size_t d = 0; d < b; ++d)
      if (is[d] != data.shape()[d])
        ctx.fail(ErrorCode::invalid_argument, "batch dims of indices " + indices.describe() +
                                                  " and data " + data.describe() + " differ");
    const size_t m = size_t(is[q - 1]);
    Shape out_shape(is.begin(), is.end() - 1);
    out_shape.insert(out_shape.end(), data.shape().begin() + long(b + m), data.shape().end());
    Tensor& out = ctx.output(0, data.dtype(), out_shape);
    const std::vector<int64_t> idx = tensor_to_int64s(indices);
    const int64_t batches = prod(data.shape(), 0, b);
    const int64_t tuples = prod(is, b, q - 1);
    const int64_t slice = prod(data.shape(), b + m, r);
    const int64_t batch_size = prod(data.shape(), b, r);
    const size_t es = data.element_size();
    const char* in = static_cast<const char*>(data.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    for (int64_t bi = 0; bi < batches; ++bi)
      for (int64_t t = 0; t < tuples; ++t) {
        const int64_t row = bi * tuples + t;
        int64_t off = 0;
        for (size_t j = 0; j < m; ++j) {
          const int64_t dim = data.shape()[b + j];
          off += checked_index(ctx, idx[size_t(row) * m + j], dim, "index") * data.strides()[b + j];
        }
        std::memcpy(o + size_t(row * slice) * es, in + size_t(bi * batch_size + off) * es, size_t(slice) * es);
      }
  }

 private:
  int64_t batch_dims_;
};

class ScatterND final : public OpKernel {
 public:
  ScatterND(const Node& node, int64_t opset) : reduction_(parse_reduction(node, opset)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor data = ctx.required_input(0).contiguous();
    const Tensor& indices = ctx.required_input(1);
    const Tensor updates = ctx.required_input(2).contiguous();
    const size_t r = size_t(data.rank()), q = size_t(indices.rank());
    const Shape& is = indices.shape();
    if (q < 1 || size_t(is[q - 1]) > r)
      ctx.fail(ErrorCode::invalid_argument, "indices " + indices.describe() + " do not fit data " + data.describe());
    const size_t m = size_t(is[q - 1]);
    Shape want(is.begin(), is.end() - 1);
    want.insert(want.end(), data.shape().begin() + long(m), data.shape().end());
    if (updates.shape() != want || updates.dtype() != data.dtype())
      ctx.fail(ErrorCode::invalid_argument, "updates " + updates.describe() + " should be " +
                                                std::string(dtype_name(data.dtype())) + shape_str(want));
    Tensor& out = ctx.output(0, data.dtype(), data.shape());
    out.copy_from(data);
    const std::vector<int64_t> idx = tensor_to_int64s(indices);
    const int64_t tuples = prod(is, 0, q - 1);
    const int64_t slice = prod(data.shape(), m, r);
    visit_dtype(data.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* o = static_cast<T*>(out.raw_data());
      const T* u = static_cast<const T*>(updates.raw_data());
      for (int64_t t = 0; t < tuples; ++t) {
        int64_t off = 0;
        for (size_t j = 0; j < m; ++j)
          off += checked_index(ctx, idx[size_t(t) * m + j], data.shape()[j], "index") * data.strides()[j];
        for (int64_t e = 0; e < slice; ++e) o[off + e] = combine<T>(o[off + e], u[t * slice + e], reduction_);
      }
    });
  }

 private:
  Reduction reduction_;
};

// ---------------------------------------------------------------- OneHot / NonZero

class OneHot final : public OpKernel {
 public:
  OneHot(const Node& node, int64_t) : axis_(node.attr_int("axis", -1)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& indices = ctx.required_input(0);
    const std::vector<double> depth_v = tensor_to_doubles(ctx.required_input(1));
    const Tensor values = ctx.required_input(2).contiguous();
    if (depth_v.size() != 1) ctx.fail(ErrorCode::invalid_argument, "depth must hold one value");
    if (values.numel() != 2) ctx.fail(ErrorCode::invalid_argument, "values " + values.describe() + " must hold [off, on]");
    if (!(depth_v[0] >= 1 && depth_v[0] < 9.2e18))
      ctx.fail(ErrorCode::invalid_argument, "depth " + std::to_string(depth_v[0]) + " is out of range");
    const int64_t depth = int64_t(depth_v[0]);
    if (depth < 1) ctx.fail(ErrorCode::invalid_argument, "depth " + std::to_string(depth_v[0]) + " is not positive");
    const int axis = normalize_axis(ctx, axis_, indices.rank() + 1);
    Shape out_shape = indices.shape();
    out_shape.insert(out_shape.begin() + axis, depth);
    check_output_shape(ctx, out_shape);
    Tensor& out = ctx.output(0, values.dtype(), out_shape);
    const std::vector<int64_t> idx = tensor_to_int64s(indices);
    const int64_t outer = prod(indices.shape(), 0, size_t(axis));
    const int64_t inner = prod(indices.shape(), size_t(axis), indices.shape().size());
    const size_t es = values.element_size();
    const char* off_v = static_cast<const char*>(values.raw_data());
    const char* on_v = off_v + es;
    char* o = static_cast<char*>(out.raw_data());
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t j = 0; j < depth; ++j)
        for (int64_t i = 0; i < inner; ++i) {
          int64_t k = idx[size_t(a * inner + i)];
          if (k < 0) k += depth;  // out-of-range indices give an all-off row
          std::memcpy(o + size_t((a * depth + j) * inner + i) * es, k == j ? on_v : off_v, es);
        }
  }

 private:
  int64_t axis_;
};

void non_zero(KernelContext& ctx) {
  const Tensor x = ctx.required_input(0).contiguous();
  // A scalar is treated as a 1-element vector, as ONNX Runtime does.
  const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
  std::vector<int64_t> hits;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(x.raw_data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      bool nz;
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) nz = float(p[i]) != 0.f;
      else nz = p[i] != T(0);
      if (nz) hits.push_back(i);
    }
  });
  const int64_t r = int64_t(shape.size()), n = int64_t(hits.size());
  Tensor& out = ctx.output(0, DType::i64, {r, n});
  int64_t* o = out.data<int64_t>();
  const Shape st = contiguous_strides(shape);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < r; ++d) o[d * n + j] = (hits[size_t(j)] / st[size_t(d)]) % shape[size_t(d)];
}

// ---------------------------------------------------------------- Unique

class Unique final : public OpKernel {
 public:
  Unique(const Node& node, int64_t) {
    sorted_ = node.attr_int("sorted", 1) != 0;
    has_axis_ = node.has_attr("axis");
    axis_ = node.attr_int("axis", 0);
  }
  void compute(KernelContext& ctx) const override {
    Tensor x = ctx.required_input(0).contiguous();
    if (!has_axis_) x = x.reshape({x.numel()});
    const int axis = data_axis(ctx, axis_, x);
    const int64_t dim = x.shape()[size_t(axis)];
    const int64_t outer = prod(x.shape(), 0, size_t(axis));
    const int64_t inner = prod(x.shape(), size_t(axis) + 1, x.shape().size());
    // Slices along the axis are compared element by element in row-major order.
    std::vector<int64_t> group_of(static_cast<size_t>(dim), 0);
    std::vector<int64_t> first;  // per group, in order of first occurrence
    std::vector<int64_t> counts;
    visit_dtype(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* p = static_cast<const T*>(x.raw_data());
      auto value = [&](int64_t k, int64_t e) {
        const T v = p[((e / inner) * dim + k) * inner + e % inner];
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return float(v);
        else return v;
      };
      const int64_t len = outer * inner;
      auto less = [&](int64_t a, int64_t b) {
        for (int64_t e = 0; e < len; ++e) {
          const auto va = value(a, e), vb = value(b, e);
          if (va < vb) return true;
          if (vb < va) return false;
        }
        return false;
      };
      std::map<int64_t, int64_t, decltype(less)> seen(less);
      for (int64_t k = 0; k < dim; ++k) {
        auto [it, inserted] = seen.emplace(k, int64_t(first.size()));
        if (inserted) {
          first.push_back(k);
          counts.push_back(0);
        }
        group_of[size_t(k)] = it->second;
        ++counts[size_t(it->second)];
      }
      if (sorted_) {
        // Renumber groups in ascending value order.
        std::vector<int64_t> order(first.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return less(first[size_t(a)], first[size_t(b)]); });
        std::vector<int64_t> rank(order.size()), f2(order.size()), c2(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
          rank[size_t(order[i])] = int64_t(i);
          f2[i] = first[size_t(order[i])];
          c2[i] = counts[size_t(order[i])];
        }
        for (auto& g : group_of) g = rank[size_t(g)];
        first = f2;
        counts = c2;
      }
    });
    const int64_t groups = int64_t(first.size());
    Shape ys = x.shape();
    ys[size_t(axis)] = groups;
    Tensor& y = ctx.output(0, x.dtype(), ys);
    for (int64_t g = 0; g < groups; ++g)
      y.slice(axis, g, g + 1).copy_from(x.slice(axis, first[size_t(g)], first[size_t(g)] + 1));
    if (ctx.output_wanted(1))
      std::copy(first.begin(), first.end(), ctx.output(1, DType::i64, {groups}).data<int64_t>());
    if (ctx.output_wanted(2))
      std::copy(group_of.begin(), group_of.end(), ctx.output(2, DType::i64, {dim}).data<int64_t>());
    if (ctx.output_wanted(3))
      std::copy(counts.begin(), counts.end(), ctx.output(3, DType::i64, {groups}).data<int64_t>());
  }

 private:
  bool sorted_, has_axis_;
  int64_t axis_;
};

// ---------------------------------------------------------------- NonMaxSuppression

// Greedy per-(batch, class) selection in descending score order (ties: lower box index
// first); a box is dropped when its IoU with an already selected box exceeds the
// threshold. Output rows are (batch, class, box) in selection order.
class NonMaxSuppression final : public OpKernel {
 public:
  NonMaxSuppression(const Node& node, int64_t) {
    const int64_t cpb = node.attr_int("center_point_box", 0);
    if (cpb != 0 && cpb != 1) throw Error(ErrorCode::invalid_model, node.describe() + ": center_point_box must be 0 or 1");
    center_ = cpb == 1;
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& boxes_t = ctx.required_input(0);
    const Tensor& scores_t = ctx.required_input(1);
    if (boxes_t.rank() != 3 || boxes_t.dim(2) != 4 || scores_t.rank() != 3 || scores_t.dim(0) != boxes_t.dim(0) ||
        scores_t.dim(2) != boxes_t.dim(1))
      ctx.fail(ErrorCode::invalid_argument, "boxes " + boxes_t.describe() + " and scores " + scores_t.describe() +
                                                " must be [B,N,4] and [B,C,N]");
    auto scalar = [&](int i, double def) {
      const Tensor* t = ctx.input(i);
      if (!t || t->numel() == 0) return def;
      if (t->numel() != 1) ctx.fail(ErrorCode::invalid_argument, "input " + std::to_string(i) + " must be a scalar, got " + t->describe());
      return tensor_to_doubles(*t)[0];
    };
    const double max_out_d = scalar(2, 0);
    const int64_t max_out = max_out_d <= 0 ? 0 : int64_t(std::min(max_out_d, 9.0e18));
    const double iou_threshold = scalar(3, 0);
    const bool has_score_threshold = ctx.input(4) && ctx.input(4)->numel() > 0;
    const double score_threshold = scalar(4, 0);
    const std::vector<double> boxes = tensor_to_doubles(boxes_t), scores = tensor_to_doubles(scores_t);
    const int64_t nb = boxes_t.dim(0), nc = scores_t.dim(1), n = boxes_t.dim(1);
    std::vector<int64_t> rows;
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t c = 0; c < nc; ++c) {
        const double* sc = scores.data() + (b * nc + c) * n;
        std::vector<int64_t> order;
        for (int64_t i = 0; i < n; ++i)
          if (!has_score_threshold || sc[i] > score_threshold) order.push_back(i);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t bb) { return sc[a] > sc[bb]; });
        std::vector<int64_t> kept;
        for (int64_t i : order) {
          if (int64_t(kept.size()) >= max_out) break;
          bool keep = true;
          for (int64_t k : kept)
            if (iou(boxes.data() + (b * n + i) * 4, boxes.data() + (b * n + k) * 4) > iou_threshold) {
              keep = false;
              break;
            }
          if (!keep) continue;
          kept.push_back(i);
          rows.insert(rows.end(), {b, c, i});
        }
      }
    const int64_t count = int64_t(rows.size() / 3);
    std::copy(rows.begin(), rows.end(), ctx.output(0, DType::i64, {count, 3}).data<int64_t>());
  }

 private:
  // Corners (y1, x1, y2, x2) of a box in either encoding, ordered so y1 <= y2, x1 <= x2.
  std::array<double, 4> corners(const double* p) const {
    if (center_) return {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
    return {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
  }
  double iou(const double* a, const double* b) const {
    const auto ca = corners(a), cb = corners(b);
    const double ih = std::min(ca[2], cb[2]) - std::max(ca[0], cb[0]);
    const double iw = std::min(ca[3], cb[3]) - std::max(ca[1], cb[1]);
    if (ih <= 0 || iw <= 0) return 0;
    const double inter = ih * iw;
    const double uni = (ca[2] - ca[0]) * (ca[3] - ca[1]) + (cb[2] - cb[0]) * (cb[3] - cb[1]) - inter;
    return uni > 0 ? inter / uni : 0;
  }
  bool center_ = false;
};

}  // namespace

void register_tensor_index_kernels(KernelRegistry& r) {
  r.add({"NonMaxSuppression", "", 10, INT_MAX, factory<NonMaxSuppression>(), {0, 1, 2, 3, 4}});
  r.add({"Gather", "", 1, INT_MAX, factory<Gather>(), {}});
  r.add({"GatherElements", "", 11, INT_MAX, factory<GatherElements>(), {}});
  r.add({"GatherND", "", 11, INT_MAX, factory<GatherND>(), {}});
  r.add({"ScatterElements", "", 11, INT_MAX, factory<ScatterElements>(), {}});
  r.add({"Scatter", "", 9, 10, factory<ScatterElements>(), {}});
  r.add({"ScatterND", "", 11, INT_MAX, factory<ScatterND>(), {}});
  r.add({"OneHot", "", 9, INT_MAX, factory<OneHot>(), {1}});
  r.add({"NonZero", "", 9, INT_MAX, simple_kernel(non_zero), {0}});
  r.add({"Unique", "", 11, INT_MAX, factory<Unique>(), {0}});
}

}  // namespace slim::ref
