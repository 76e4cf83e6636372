// The cpu provider's data-movement kernels: Transpose, Concat, Slice, Pad and Gather, for
// any dtype (they move element bytes), and the view ops (Reshape, Squeeze, Unsqueeze,
// Flatten, Identity, Dropout), which compile turns into views. Geometry is resolved at
// compile time from static shapes; the copies run as contiguous runs (memcpy) where the
// layout allows and are split over slim's thread pool when large.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/dnnl_int8.h"
#include "slim/core/convert.h"

namespace slim::cpu {
namespace {

template <typename Fn>
void parallel_rows(const KernelContext& ctx, int64_t rows, int64_t row_bytes, Fn&& fn) {
  parallel_items(ctx, rows, row_bytes, kBytesPerThread, fn);
}

std::optional<std::string> need_static_dtype(const KernelBuildInfo& info, int i) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return "input " + std::to_string(i) + " is missing";
  if (!in.dtype) return "dtype of input " + std::to_string(i) + " is unknown";
  if (!in.shape) return "shape of input " + std::to_string(i) + " is dynamic";
  return std::nullopt;
}

// A strided gather of elements: out[o] = in[offset(o)], walked as `outer` rows of
// `inner` elements each, where the input advances by `in_inner_stride` inside a row.
struct StridedCopy {
  Shape out_shape;     // output shape (the result)
  Shape dims;          // outer dims (over rows)
  Shape in_strides;    // input element strides of those dims
  int64_t base = 0;    // input element offset of the first output element
  int64_t inner = 1;   // elements per row
  int64_t inner_stride = 1;
  size_t elem = 4;
  int64_t rows() const { return shape_numel(dims); }

  void run(const KernelContext& ctx, const char* in, char* out) const {
    const int64_t n_rows = rows();
    parallel_rows(ctx, n_rows, inner * int64_t(elem), [&](int64_t b, int64_t e) {
      Shape idx(dims.size(), 0);
      int64_t off = base, r = b;
      for (size_t d = dims.size(); d-- > 0;) {
        idx[d] = r % dims[d];
        r /= dims[d];
        off += idx[d] * in_strides[d];
      }
      for (int64_t row = b; row < e; ++row) {
        char* dst = out + row * inner * int64_t(elem);
        const char* src = in + off * int64_t(elem);
        if (inner_stride == 1) {
          std::memcpy(dst, src, size_t(inner) * elem);
        } else {
          copy_strided(dst, src);
        }
        for (size_t d = dims.size(); d-- > 0;) {
          off += in_strides[d];
          if (++idx[d] < dims[d]) break;
          off -= idx[d] * in_strides[d];
          idx[d] = 0;
        }
      }
    });
  }

 private:
  template <typename T>
  void copy_as(char* dst, const char* src) const {
    T* d = reinterpret_cast<T*>(dst);
    const T* s = reinterpret_cast<const T*>(src);
    for (int64_t i = 0; i < inner; ++i) d[i] = s[i * inner_stride];
  }
  void copy_strided(char* dst, const char* src) const {
    switch (elem) {
      case 1: return copy_as<uint8_t>(dst, src);
      case 2: return copy_as<uint16_t>(dst, src);
      case 4: return copy_as<uint32_t>(dst, src);
      case 8: return copy_as<uint64_t>(dst, src);
      default:
        for (int64_t i = 0; i < inner; ++i) std::memcpy(dst + i * int64_t(elem), src + i * inner_stride * int64_t(elem), elem);
    }
  }
};

// Output dims (shape) with input strides; size-1 dims dropped, mergeable neighbours
// merged, the last one becoming the row.
StridedCopy make_copy(const Shape& out_shape, const Shape& dims, const Shape& strides, int64_t base, size_t elem) {
  StridedCopy c;
  c.out_shape = out_shape;
  c.base = base;
  c.elem = elem;
  Shape d2, s2;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 1) continue;
    if (!d2.empty() && s2.back() == strides[i] * dims[i]) {
      d2.back() *= dims[i];
      s2.back() = strides[i];
      continue;
    }
    d2.push_back(dims[i]);
    s2.push_back(strides[i]);
  }
  if (!d2.empty()) {
    c.inner = d2.back();
    c.inner_stride = s2.back();
    d2.pop_back();
    s2.pop_back();
  }
  c.dims = d2;
  c.in_strides = s2;
  return c;
}

class CopyKernel final : public OpKernel {
 public:
  explicit CopyKernel(StridedCopy c) : c_(std::move(c)) {}
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    Tensor& y = ctx.output(0, x.dtype(), c_.out_shape);
    if (y.numel() == 0) return;
    c_.run(ctx, static_cast<const char*>(x.raw_data()), static_cast<char*>(y.raw_data()));
  }

 private:
  StridedCopy c_;
};

// ---------------------------------------------------------------------------------------
// Transpose

std::optional<std::string> transpose_plan(const KernelBuildInfo& info, StridedCopy* out) {
  if (auto r = need_static_dtype(info, 0)) return r;
  const Shape& s = *info.input(0).shape;
  const int rank = int(s.size());
  Shape perm = info.node.attr_ints("perm");
  if (perm.empty())
    for (int d = rank - 1; d >= 0; --d) perm.push_back(d);
  if (int(perm.size()) != rank) return std::string("perm does not match the rank");
  std::vector<bool> seen(size_t(rank), false);
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[size_t(p)]) return std::string("perm is not a permutation");
    seen[size_t(p)] = true;
  }
  const Shape strides = contiguous_strides(s);
  Shape y, st;
  for (int64_t p : perm) {
    y.push_back(s[size_t(p)]);
    st.push_back(strides[size_t(p)]);
  }
  *out = make_copy(y, y, st, 0, dtype_size(*info.input(0).dtype));
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// Slice (attributes before opset 10, inputs from 10)

std::optional<std::string> slice_plan(const KernelBuildInfo& info, StridedCopy* out) {
  if (auto r = need_static_dtype(info, 0)) return r;
  const Shape& s = *info.input(0).shape;
  const int rank = int(s.size());
  auto ints = [&](int i, Shape* v) -> std::optional<std::string> {
    if (!info.has_input(i)) return std::nullopt;
    const Tensor* t = info.input(i).constant;
    if (!t) return "input " + std::to_string(i) + " is not a constant";
    if (t->rank() != 1) return "input " + std::to_string(i) + " is not a vector";
    if (t->dtype() == DType::i64) v->assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    else if (t->dtype() == DType::i32) v->assign(t->data<int32_t>(), t->data<int32_t>() + t->numel());
    else return "input " + std::to_string(i) + " is not int32/int64";
    return std::nullopt;
  };
  Shape starts, ends, axes, steps;
  if (info.opset < 10) {
    starts = info.node.attr_ints("starts");
    ends = info.node.attr_ints("ends");
    axes = info.node.attr_ints("axes");
  } else {
    if (!info.has_input(1) || !info.has_input(2)) return std::string("missing starts/ends");
    for (auto [i, v] : {std::pair{1, &starts}, {2, &ends}, {3, &axes}, {4, &steps}})
      if (auto r = ints(i, v)) return r;
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return std::string("starts/ends/axes/steps differ in length");
  Shape begin(size_t(rank), 0), step(size_t(rank), 1), y = s;
  std::vector<bool> seen(size_t(rank), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = axes[i];
    if (a < -rank || a >= rank) return std::string("axis out of range");
    if (a < 0) a += rank;
    if (seen[size_t(a)]) return std::string("repeated axis");
    seen[size_t(a)] = true;
    const int64_t dim = s[size_t(a)], st = steps[i];
    if (st == 0) return std::string("zero step");
    int64_t b = starts[i], e = ends[i];
    if (b < 0) b += dim;
    if (e < 0) e += dim;
    int64_t count = 0;
    if (st > 0) {
      b = std::clamp<int64_t>(b, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count = e > b ? (e - b + st - 1) / st : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      count = b > e ? (b - e + (-st) - 1) / (-st) : 0;
    }
    begin[size_t(a)] = b;
    step[size_t(a)] = st;
    y[size_t(a)] = count;
  }
  const Shape strides = contiguous_strides(s);
  Shape st(static_cast<size_t>(rank), 0);
  int64_t base = 0;
  for (int d = 0; d < rank; ++d) {
    st[size_t(d)] = strides[size_t(d)] * step[size_t(d)];
    if (y[size_t(d)] > 0) base += begin[size_t(d)] * strides[size_t(d)];
  }
  *out = make_copy(y, y, st, base, dtype_size(*info.input(0).dtype));
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// Concat

struct ConcatPlan {
  Shape y;
  int64_t axis = 0;  // non-negative
  int64_t outer = 1;
  std::vector<int64_t> chunk_bytes;  // per input: bytes of one outer row
  int64_t row_bytes = 0;
};

std::optional<std::string> concat_plan(const KernelBuildInfo& info, ConcatPlan* p) {
  if (info.inputs.empty()) return std::string("no inputs");
  for (int i = 0; i < int(info.inputs.size()); ++i)
    if (auto r = need_static_dtype(info, i)) return r;
  const DType dt = *info.input(0).dtype;
  const Shape& s0 = *info.input(0).shape;
  const int rank = int(s0.size());
  if (rank == 0) return std::string("scalar inputs");
  int64_t axis = info.node.attr_int("axis", 1);
  if (axis < -rank || axis >= rank) return std::string("axis out of range");
  if (axis < 0) axis += rank;
  p->axis = axis;
  p->y = s0;
  p->y[size_t(axis)] = 0;
  for (int d = 0; d < axis; ++d) p->outer *= s0[size_t(d)];
  for (int i = 0; i < int(info.inputs.size()); ++i) {
    const Shape& s = *info.input(i).shape;
    if (*info.input(i).dtype != dt) return std::string("inputs differ in dtype");
    if (int(s.size()) != rank) return std::string("inputs differ in rank");
    for (int d = 0; d < rank; ++d)
      if (d != axis && s[size_t(d)] != s0[size_t(d)]) return std::string("inputs differ outside the axis");
    p->y[size_t(axis)] += s[size_t(axis)];
    int64_t inner = 1;
    for (int d = int(axis); d < rank; ++d) inner *= s[size_t(d)];
    p->chunk_bytes.push_back(inner * int64_t(dtype_size(dt)));
    p->row_bytes += p->chunk_bytes.back();
  }
  return std::nullopt;
}

// Along the channels of 4-D f32 tensors, the inputs may arrive in a layout of oneDNN's from
// the convolutions before it (channels-last, or nChw16c when every channel count is a
// multiple of 16), and the output may stay in it for the convolution after (SqueezeNet's
// fire modules). In both layouts the channels of an input are contiguous runs (per pixel,
// or per image), so the concatenation stays a copy of runs. When the inputs' layouts
// differ or the output is plain, oneDNN reorders each input into its part of the output.
// 8-bit bytes (a QDQ model's Concat, fuse_qdq_movement) do the same in channels-last
// (int8_nhwc_layout, what QLinearConv, QLookup, byte Resize and MaxPool hand on), so
// PP-OCR's detector's Concat hands its head convolution channels-last bytes.
class ConcatKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = dt_;
    *shape = p_.y;
    return i == 0;
  }
  ConcatKernel(ConcatPlan p, DType dt, std::vector<Shape> in) : p_(std::move(p)), dt_(dt), in_(std::move(in)) {
    bytes_ = dt_ == DType::u8 || dt_ == DType::i8;
    channels_ = (dt_ == DType::f32 || bytes_) && p_.y.size() == 4 && p_.axis == 1;
    for (const Shape& s : in_) channels_ = channels_ && s.size() == 4;
    in_fmt_.assign(in_.size(), dnnl::memory::format_tag::nchw);
  }

  uint64_t private_output_layout(int i) const override {
    const auto f = in_fmt_[0];
    const bool same = f != dnnl::memory::format_tag::nchw &&
                      std::all_of(in_fmt_.begin(), in_fmt_.end(), [&](auto g) { return g == f; });
    return i == 0 && same ? layout_tag(md(p_.y, f)) : 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    if (bytes_) return channels_ && layout == int8_nhwc_layout(in_[size_t(i)], dt_);
    return channels_ && channel_layout(in_[size_t(i)], layout).has_value();
  }
  void use_private_output(int i, uint64_t layout) override { out_fmt_ = in_fmt_[0]; }
  void use_private_input(int i, uint64_t layout) override {
    in_fmt_[size_t(i)] =
        bytes_ ? dnnl::memory::format_tag::nhwc : *channel_layout(in_[size_t(i)], layout);
  }
  // One outer row (plain or nChw16c with a batch of 1; channels-last only for one pixel),
  // every input in the output's layout: input i is the output's bytes from the inputs
  // before it on.
  bool input_within_output(int i, int64_t* byte_offset) const override {
    for (auto f : in_fmt_)
      if (f != out_fmt_) return false;
    const int64_t rows = out_fmt_ == dnnl::memory::format_tag::nhwc ? p_.outer * p_.y[2] * p_.y[3] : p_.outer;
    if (rows != 1) return false;
    *byte_offset = 0;
    for (int k = 0; k < i; ++k) *byte_offset += p_.chunk_bytes[size_t(k)];
    return true;
  }

  void compute(KernelContext& ctx) const override {
    Tensor& y = ctx.output(0, dt_, p_.y);
    if (y.numel() == 0) return;
    const bool any_private = std::any_of(in_fmt_.begin(), in_fmt_.end(), [](auto f) { return f != dnnl::memory::format_tag::nchw; });
    if (any_private && out_fmt_ == dnnl::memory::format_tag::nchw) return compute_reorders(ctx, y);
    // Plain, or nChw16c (per image, each input's channel blocks are one run): runs of
    // chunk_bytes per outer index; channels-last: runs of C_i values per pixel.
    const bool nhwc = out_fmt_ == dnnl::memory::format_tag::nhwc;
    const int64_t outer = nhwc ? p_.outer * p_.y[2] * p_.y[3] : p_.outer;
    std::vector<int64_t> chunk = p_.chunk_bytes;
    const int64_t e = int64_t(dtype_size(dt_));
    if (nhwc)
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = in_[i][1] * e;
    const int64_t row = nhwc ? p_.y[1] * e : p_.row_bytes;
    std::vector<const char*> src(chunk.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<const char*>(ctx.required_input(int(i)).raw_data());
    char* out = static_cast<char*>(y.raw_data());
    parallel_rows(ctx, outer, row, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        char* dst = out + r * row;
        for (size_t i = 0; i < src.size(); ++i) {
          // Already there when compile placed the input inside the output.
          if (src[i] + r * chunk[i] != dst) std::memcpy(dst, src[i] + r * chunk[i], size_t(chunk[i]));
          dst += chunk[i];
        }
      }
    });
  }

 private:
  // Inputs in private layouts, the output plain or the inputs' layouts mixed: one oneDNN
  // reorder per input into its channels of the output (built on the first run, after the
  // layouts were negotiated).
  void compute_reorders(KernelContext& ctx, Tensor& y) const {
    limit_dnnl_threads(ctx, shape_numel(p_.y), kElementsPerThread);
    dnnl_call(ctx.node(), "concat reorder", [&] {
      const auto& eng = dnnl_engine();
      if (reorders_.empty()) {
        stream_ = dnnl::stream(eng);
        const dnnl::memory::desc y_md = md(p_.y, dnnl::memory::format_tag::nchw);
        int64_t c0 = 0;
        for (size_t i = 0; i < in_.size(); ++i) {
          const dnnl::memory::desc part = y_md.submemory_desc(to_dims(in_[i]), {0, c0, 0, 0});
          src_.push_back(dnnl::memory(md(in_[i], in_fmt_[i]), eng, DNNL_MEMORY_NONE));
          dst_.push_back(dnnl::memory(part, eng, DNNL_MEMORY_NONE));
          reorders_.push_back(dnnl::reorder(src_.back(), dst_.back()));
          c0 += in_[i][1];
        }
      }
      for (size_t i = 0; i < in_.size(); ++i) {
        src_[i].set_data_handle(const_cast<void*>(ctx.required_input(int(i)).raw_data()));
        dst_[i].set_data_handle(y.raw_data());
        reorders_[i].execute(stream_, src_[i], dst_[i]);
      }
      stream_.wait();
      return 0;
    });
  }

  // A 4-D f32 or 8-bit layout of the values.
  dnnl::memory::desc md(const Shape& s, dnnl::memory::format_tag f) const {
    if (!bytes_) return f32_md(s, f);
    return dnnl::memory::desc(
        to_dims(s), dt_ == DType::i8 ? dnnl::memory::data_type::s8 : dnnl::memory::data_type::u8,
        f);
  }

  ConcatPlan p_;
  DType dt_;
  std::vector<Shape> in_;
  bool bytes_ = false;     // u8 or i8
  bool channels_ = false;  // 4-D f32 or 8-bit along axis 1: private layouts possible
  std::vector<dnnl::memory::format_tag> in_fmt_;  // nchw = plain
  dnnl::memory::format_tag out_fmt_ = dnnl::memory::format_tag::nchw;
  mutable dnnl::stream stream_;
  mutable std::vector<dnnl::memory> src_, dst_;
  mutable std::vector<dnnl::reorder> reorders_;
};

// ---------------------------------------------------------------------------------------
// Gather

struct GatherPlan {
  Shape y;
  int64_t outer = 1, axis_dim = 1, n_idx = 1, inner_bytes = 0;
  DType dt = DType::f32;
};

std::optional<std::string> gather_plan(const KernelBuildInfo& info, GatherPlan* p) {
  if (auto r = need_static_dtype(info, 0)) return r;
  if (auto r = need_static_dtype(info, 1)) return r;
  const DType it = *info.input(1).dtype;
  if (it != DType::i64 && it != DType::i32) return std::string("indices are not int32/int64");
  const Shape& s = *info.input(0).shape;
  const Shape& is = *info.input(1).shape;
  const int rank = int(s.size());
  if (rank == 0) return std::string("scalar data");
  int64_t axis = info.node.attr_int("axis", 0);
  if (axis < -rank || axis >= rank) return std::string("axis out of range");
  if (axis < 0) axis += rank;
  p->dt = *info.input(0).dtype;
  p->axis_dim = s[size_t(axis)];
  p->n_idx = shape_numel(is);
  int64_t inner = 1;
  for (int d = 0; d < rank; ++d) {
    if (d < axis) p->outer *= s[size_t(d)];
    if (d > axis) inner *= s[size_t(d)];
  }
  p->inner_bytes = inner * int64_t(dtype_size(p->dt));
  p->y.assign(s.begin(), s.begin() + axis);
  p->y.insert(p->y.end(), is.begin(), is.end());
  p->y.insert(p->y.end(), s.begin() + axis + 1, s.end());
  return std::nullopt;
}

class GatherKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = p_.dt;
    *shape = p_.y;
    return i == 0;
  }
  explicit GatherKernel(GatherPlan p) : p_(std::move(p)) { scratch_.resize(size_t(p_.n_idx)); }
  void compute(KernelContext& ctx) const override {
    const Tensor& data = ctx.required_input(0);
    const Tensor& indices = ctx.required_input(1);
    Tensor& y = ctx.output(0, p_.dt, p_.y);
    if (y.numel() == 0) return;
    // Indices are checked (and negative ones resolved) once, before any copy.
    std::vector<int64_t>& idx = scratch_;
    idx.resize(size_t(p_.n_idx));
    for (int64_t i = 0; i < p_.n_idx; ++i) {
      int64_t v = indices.dtype() == DType::i64 ? indices.data<int64_t>()[i] : indices.data<int32_t>()[i];
      if (v < -p_.axis_dim || v >= p_.axis_dim)
        ctx.fail(ErrorCode::invalid_argument, "index " + std::to_string(v) + " is out of range for an axis of size " +
                                                  std::to_string(p_.axis_dim));
      idx[size_t(i)] = v < 0 ? v + p_.axis_dim : v;
    }
    const char* src = static_cast<const char*>(data.raw_data());
    char* out = static_cast<char*>(y.raw_data());
    const int64_t rows = p_.outer * p_.n_idx;
    parallel_rows(ctx, rows, p_.inner_bytes, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / p_.n_idx, i = r % p_.n_idx;
        std::memcpy(out + r * p_.inner_bytes, src + (o * p_.axis_dim + idx[size_t(i)]) * p_.inner_bytes,
                    size_t(p_.inner_bytes));
      }
    });
  }

 private:
  GatherPlan p_;
  // Resolved indices, sized at compile time; runs of a session are serialized.
  mutable std::vector<int64_t> scratch_;
};

// ---------------------------------------------------------------------------------------
// Pad (constant, edge, reflect, wrap): per axis, the source index of every output index
// (-1: the constant), resolved at compile time from constant pads. The output is walked
// in rows along the last axis: a row whose outer indices hit the constant is filled, any
// other copies its middle run in one memcpy and maps its padded ends element by element.

struct PadPlan {
  Shape x, y;
  std::vector<std::vector<int64_t>> src;  // per axis, per output index
  std::vector<char> fill;                 // the constant, one element
  int64_t begin_last = 0, run = 0;        // last axis: where the input run starts, its length
};

std::optional<std::string> pad_plan(const KernelBuildInfo& info, PadPlan* p) {
  if (auto r = need_static_dtype(info, 0)) return r;
  const Node& node = info.node;
  const DType dt = *info.input(0).dtype;
  const size_t es = dtype_size(dt);
  const std::string mode = node.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && !(mode == "wrap" && info.opset >= 19))
    return "mode '" + mode + "'";
  p->x = *info.input(0).shape;
  const int r = int(p->x.size());
  if (r == 0) return std::string("scalar input");
  Shape pads, axes;
  p->fill.assign(es, 0);
  if (info.opset < 11) {
    pads = node.attr_ints("pads");
    const float v = node.attr_float("value", 0.f);
    if (v != 0.f) {
      if (dt != DType::f32) return std::string("a nonzero value for a non-f32 input");
      std::memcpy(p->fill.data(), &v, 4);
    }
  } else {
    for (int i = 1; i <= 3; ++i)
      if (info.has_input(i) && !info.input(i).constant) return "input " + std::to_string(i) + " is not a constant";
    if (!info.has_input(1)) return std::string("missing pads");
    pads = tensor_to_int64s(*info.input(1).constant);
    if (info.has_input(2) && info.input(2).constant->numel() > 0) {
      const Tensor& v = *info.input(2).constant;
      if (v.dtype() != dt) return std::string("constant_value's dtype differs from the data's");
      std::memcpy(p->fill.data(), v.contiguous().raw_data(), es);
    }
    if (info.has_input(3)) axes = tensor_to_int64s(*info.input(3).constant);
  }
  if (axes.empty())
    for (int d = 0; d < r; ++d) axes.push_back(d);
  if (pads.size() != 2 * axes.size()) return std::string("pads do not match the axes");
  Shape begin(size_t(r), 0), end(size_t(r), 0);
  std::vector<bool> seen(size_t(r), false);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    if (a < 0 || a >= r || seen[size_t(a)]) return std::string("bad axes");
    seen[size_t(a)] = true;
    begin[size_t(a)] = pads[i];
    end[size_t(a)] = pads[i + axes.size()];
  }
  for (int d = 0; d < r; ++d) {
    const int64_t n = p->x[size_t(d)], o = n + begin[size_t(d)] + end[size_t(d)];
    if (n <= 0 || o <= 0) return std::string("an empty axis before or after padding");
    p->y.push_back(o);
    auto& src = p->src.emplace_back(size_t(o));
    for (int64_t k = 0; k < o; ++k) {
      int64_t i = k - begin[size_t(d)];
      if (i < 0 || i >= n) {
        if (mode == "constant") i = -1;
        else if (mode == "edge") i = std::clamp<int64_t>(i, 0, n - 1);
        else if (mode == "wrap") i = ((i % n) + n) % n;
        else if (n == 1) i = 0;
        else {
          const int64_t period = 2 * (n - 1);
          i = ((i % period) + period) % period;
          if (i >= n) i = period - i;
        }
      }
      src[size_t(k)] = i;
    }
  }
  // The input run of the last axis: output indices max(begin, 0) .. that map to i = k - begin.
  const int64_t b = begin.back(), n = p->x.back();
  p->begin_last = std::max<int64_t>(b, 0);
  p->run = std::max<int64_t>(0, std::min(n, p->y.back() - b) - std::max<int64_t>(-b, 0));
  return std::nullopt;
}

class PadKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = dt_;
    *shape = p_.y;
    return i == 0;
  }
  PadKernel(PadPlan p, DType dt) : p_(std::move(p)), dt_(dt), es_(int64_t(dtype_size(dt))) {}
  void compute(KernelContext& ctx) const override {
    const char* in = static_cast<const char*>(ctx.required_input(0).raw_data());
    char* out = static_cast<char*>(ctx.output(0, dt_, p_.y).raw_data());
    const int r = int(p_.y.size());
    const int64_t ow = p_.y.back(), rows = shape_numel(p_.y) / ow;
    const Shape in_str = contiguous_strides(p_.x);
    const auto& last = p_.src.back();
    parallel_rows(ctx, rows, ow * es_, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        char* dst = out + row * ow * es_;
        int64_t off = 0, rest = row;
        bool constant = false;
        for (int d = r - 2; d >= 0; --d) {
          const int64_t s = p_.src[size_t(d)][size_t(rest % p_.y[size_t(d)])];
          rest /= p_.y[size_t(d)];
          constant = constant || s < 0;
          off += s * in_str[size_t(d)];
        }
        if (constant) {
          for (int64_t k = 0; k < ow; ++k) std::memcpy(dst + k * es_, p_.fill.data(), size_t(es_));
          continue;
        }
        const char* src = in + off * es_;
        for (int64_t k = 0; k < ow; ++k) {
          if (k == p_.begin_last && p_.run > 0) {
            std::memcpy(dst + k * es_, src + last[size_t(k)] * es_, size_t(p_.run * es_));
            k += p_.run - 1;
            continue;
          }
          const int64_t s = last[size_t(k)];
          std::memcpy(dst + k * es_, s < 0 ? p_.fill.data() : src + s * es_, size_t(es_));
        }
      }
    });
  }

 private:
  PadPlan p_;
  DType dt_;
  int64_t es_;
};

template <typename Plan, typename PlanFn, typename MakeFn>
KernelDef plan_def(const std::string& op, int64_t since, PlanFn plan, MakeFn make) {
  KernelDef def;
  def.op_type = op;
  def.since_version = since;
  def.claim = [plan](const KernelBuildInfo& info) {
    Plan p;
    if (info.node.outputs.size() != 1) return Claim::no("expects one output");
    if (auto r = plan(info, &p)) return Claim::no(*r);
    return Claim::yes();
  };
  def.build = [plan, make](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    Plan p;
    if (auto r = plan(info, &p)) throw Error(ErrorCode::internal, info.node.describe() + ": " + *r);
    return make(std::move(p), info);
  };
  return def;
}

}  // namespace

void register_tensor_kernels(KernelRegistry& r) {
  auto copy = [](StridedCopy c, const KernelBuildInfo&) -> std::unique_ptr<OpKernel> {
    return std::make_unique<CopyKernel>(std::move(c));
  };
  r.add(plan_def<StridedCopy>("Transpose", 1, transpose_plan, copy));
  r.add(plan_def<StridedCopy>("Slice", 1, slice_plan, copy));
  r.add(plan_def<ConcatPlan>("Concat", 4, concat_plan, [](ConcatPlan p, const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    const DType dt = *info.input(0).dtype;
    std::vector<Shape> in;
    for (int i = 0; i < int(info.inputs.size()); ++i) in.push_back(*info.input(i).shape);
    return std::make_unique<ConcatKernel>(std::move(p), dt, std::move(in));
  }));
  r.add(plan_def<PadPlan>("Pad", 2, pad_plan, [](PadPlan p, const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<PadKernel>(std::move(p), *info.input(0).dtype);
  }));
  r.add(plan_def<GatherPlan>("Gather", 1, gather_plan, [](GatherPlan p, const KernelBuildInfo&) -> std::unique_ptr<OpKernel> {
    return std::make_unique<GatherKernel>(std::move(p));
  }));
  // Views: ref's kernels, taken where compile turns the node into a view of its input
  // (OpKernel::view_input), so that no kernel runs for it.
  for (const char* op : {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout"})
    for (const KernelDef& ref_def : ref_kernel_registry().defs()) {
      if (ref_def.op_type != op || !ref_def.domain.empty()) continue;
      KernelDef def = ref_def;
      def.claim = [shape_inputs = ref_def.shape_inputs, factory = ref_def.factory](const KernelBuildInfo& info) {
        const NodeInputInfo& in = info.input(0);
        if (!in.present || !in.dtype) return Claim::no("input 0 is not a tensor of a known dtype");
        for (size_t o = 1; o < info.node.outputs.size(); ++o)
          if (!info.node.outputs[o].empty()) return Claim::no("output " + std::to_string(o) + " is used");
        bool same_shape = false;
        if (factory(info.node, info.opset)->view_input(0, &same_shape) != 0)
          return Claim::no("not a view (training mode)");
        if (same_shape) return Claim::yes();
        if (!in.shape) return Claim::no("shape of input 0 is dynamic");
        for (int i : shape_inputs)
          if (info.has_input(i) && !info.input(i).constant)
            return Claim::no("input " + std::to_string(i) + " is not a constant");
        return Claim::yes();
      };
      r.add(std::move(def));
    }
}

}  // namespace slim::cpu
