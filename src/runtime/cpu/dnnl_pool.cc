// MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool on oneDNN's pooling
// primitive (with dilation), built at compile time for the static input shape. ONNX's
// ceil_mode becomes extra end padding, which oneDNN's max and exclude-padding average
// ignore; where that would change an include-padding average, the node is declined.
// MaxPool of 8-bit bytes (where fuse_qdq_movement sends DequantizeLinear -> MaxPool ->
// QuantizeLinear) runs on the provider's own byte max instead.
#include <cstring>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/dnnl_int8.h"
#include "runtime/cpu/quantize.h"

namespace slim::cpu {
namespace {

using dnnl::memory;

enum class PoolKind { max, average, global_max, global_average };

struct PoolSetup {
  dnnl::algorithm alg = dnnl::algorithm::pooling_max;
  Shape x, y, k, stride, dil, pad_l, pad_r;
};

bool byte_input(const KernelBuildInfo& info) {
  return info.input(0).dtype == DType::u8 || info.input(0).dtype == DType::i8;
}

std::optional<std::string> pool_setup(const KernelBuildInfo& info, PoolKind kind, PoolSetup* s) {
  const Node& node = info.node;
  if (!byte_input(info) || kind != PoolKind::max)
    if (auto r = need_f32(info, 0)) return r;
  if (auto r = need_static(info, 0)) return r;
  if (byte_input(info) && info.input(0).shape->size() != 4)
    return std::string("8-bit MaxPool of 4-D tensors only");
  if (node.outputs.size() != 1) return std::string("the Indices output is not implemented");
  s->x = *info.input(0).shape;
  const size_t rank = s->x.size();
  if (rank < 3 || rank > 5) return "rank " + std::to_string(rank) + " input (oneDNN covers 1-3 spatial dims)";
  for (int64_t v : s->x)
    if (v < 1) return std::string("empty input");
  const size_t nd = rank - 2;
  const Shape in(s->x.begin() + 2, s->x.end());
  s->y = {s->x[0], s->x[1]};
  if (kind == PoolKind::global_max || kind == PoolKind::global_average) {
    s->alg = kind == PoolKind::global_max ? dnnl::algorithm::pooling_max
                                          : dnnl::algorithm::pooling_avg_exclude_padding;
    s->k = in;
    s->stride = Shape(nd, 1);
    s->dil = s->pad_l = s->pad_r = Shape(nd, 0);
    s->y.insert(s->y.end(), nd, 1);
    return std::nullopt;
  }
  const std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  const bool ceil_mode = node.attr_int("ceil_mode", 0) != 0;
  const bool include_pad = kind == PoolKind::average && node.attr_int("count_include_pad", 0) != 0;
  s->alg = kind == PoolKind::max ? dnnl::algorithm::pooling_max
           : include_pad          ? dnnl::algorithm::pooling_avg_include_padding
                                  : dnnl::algorithm::pooling_avg_exclude_padding;
  s->k = node.attr_ints("kernel_shape");
  const Shape strides = node.attr_ints("strides", Shape(nd, 1));
  const Shape dilations = node.attr_ints("dilations", Shape(nd, 1));
  const Shape pads = node.attr_ints("pads", Shape(2 * nd, 0));
  if (s->k.size() != nd || strides.size() != nd || dilations.size() != nd || pads.size() != 2 * nd)
    return std::string("kernel_shape/strides/dilations/pads do not match the spatial rank");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
    return "auto_pad " + auto_pad;
  if (node.attr_int("storage_order", 0) != 0) return std::string("storage_order 1");
  for (size_t d = 0; d < nd; ++d) {
    if (s->k[d] < 1 || strides[d] < 1 || dilations[d] < 1 || pads[d] < 0 || pads[d + nd] < 0)
      return std::string("non-positive kernel/stride/dilation or negative pad");
    const int64_t span = (s->k[d] - 1) * dilations[d] + 1, st = strides[d];
    int64_t pb = 0, pe = 0, out = 0;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out = (in[d] + st - 1) / st;
      const int64_t total = std::max<int64_t>(0, (out - 1) * st + span - in[d]);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (auto_pad == "NOTSET") {
        pb = pads[d];
        pe = pads[d + nd];
      }
      const int64_t avail = in[d] + pb + pe - span;
      if (avail < 0) return std::string("kernel larger than the padded input");
      out = (ceil_mode ? (avail + st - 1) / st : avail / st) + 1;
      if (ceil_mode && (out - 1) * st >= in[d] + pb) --out;
    }
    // Windows lying wholly in the padding have no defined value in the ONNX ops.
    if (pb >= span || pe >= span) return std::string("padding as large as the window");
    // oneDNN's end padding is whatever makes its floor formula land on `out`.
    const int64_t pr = (out - 1) * st + span - in[d] - pb;
    if (pr > pe && include_pad) return std::string("ceil_mode with count_include_pad");
    if (pr < 0 && include_pad) return std::string("unused input tail with count_include_pad");
    s->pad_l.push_back(pb);
    s->pad_r.push_back(pr);
    s->y.push_back(out);
  }
  s->stride = strides;
  for (int64_t d : dilations) s->dil.push_back(d - 1);
  return std::nullopt;
}

// The input may arrive channels-last or in nChw16c from a convolution (a private layout,
// OpKernel); the pooling then runs in that layout, and its output stays in it when every
// reader takes it, is reordered once into the layout its readers want (a convolution's
// channels-last after an nChw16c stem), or is reordered to plain.
class DnnlPoolKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = s_.y;
    return i == 0;
  }
  DnnlPoolKernel(const Node& node, PoolSetup s) : s_(std::move(s)), node_(node.describe()) {
    dnnl_call(node, "pooling setup", [&] {
      stream_ = dnnl::stream(dnnl_engine());
      build();
      return 0;
    });
  }

  uint64_t private_output_layout(int i) const override {
    return in_fmt_ != memory::format_tag::undef ? layout_tag(f32_md(s_.y, in_fmt_)) : 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override { return channel_layout(s_.x, layout).has_value(); }
  void use_private_input(int i, uint64_t layout) override {
    in_fmt_ = *channel_layout(s_.x, layout);
    rebuild();
  }
  bool can_write_output_in(int i, uint64_t layout) const override {
    return i == 0 && channel_layout(s_.y, layout).has_value();
  }
  void use_private_output(int i, uint64_t layout) override {
    out_fmt_ = *channel_layout(s_.y, layout);
    rebuild();
  }

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.x);
    limit_dnnl_threads(ctx, work(), kMacsPerThread);
    Tensor& y = ctx.output(0, DType::f32, s_.y);
    dnnl_call(ctx.node(), "pooling", [&] {
      x_mem_.set_data_handle(ctx.required_input(0).raw_data());
      y_mem_.set_data_handle(y.raw_data());
      if (reorder_out_) {
        prim_.execute(stream_, {{DNNL_ARG_SRC, x_mem_}, {DNNL_ARG_DST, tmp_}});
        reorder_.execute(stream_, tmp_, y_mem_);
      } else {
        prim_.execute(stream_, {{DNNL_ARG_SRC, x_mem_}, {DNNL_ARG_DST, y_mem_}});
      }
      stream_.wait();
      return 0;
    });
  }

 private:
  void rebuild() {
    try {
      build();
    } catch (const dnnl::error& e) {
      throw Error(ErrorCode::internal, node_ + ": oneDNN pooling setup failed: " + e.what());
    }
  }
  // Runs plain, or in the input's private layout; y is written plain or in the layout
  // use_private_output chose, through a reorder when that is not the run layout.
  // Each output element reads a window.
  int64_t work() const { return shape_numel(s_.y) * shape_numel(s_.k); }
  void build() {
    limit_dnnl_threads_at_build(work(), kMacsPerThread);
    const auto& eng = dnnl_engine();
    const bool priv = in_fmt_ != memory::format_tag::undef;
    const memory::desc x_md = priv ? f32_md(s_.x, in_fmt_) : plain_md(s_.x);
    const memory::desc run_md = priv ? f32_md(s_.y, in_fmt_) : plain_md(s_.y);
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, s_.alg, x_md, run_md,
                                     to_dims(s_.stride), to_dims(s_.k), to_dims(s_.dil),
                                     to_dims(s_.pad_l), to_dims(s_.pad_r));
    dnnl::pooling_v2_forward::primitive_desc pd(d, eng);
    prim_ = dnnl::pooling_v2_forward(pd);
    x_mem_ = memory(x_md, eng, DNNL_MEMORY_NONE);
    const memory::desc out_md = out_fmt_ != memory::format_tag::undef ? f32_md(s_.y, out_fmt_) : plain_md(s_.y);
    reorder_out_ = out_md != run_md;
    y_mem_ = memory(out_md, eng, DNNL_MEMORY_NONE);
    buffers_.clear();
    if (reorder_out_) {
      tmp_ = owned_memory(run_md, eng, buffers_);
      reorder_ = dnnl::reorder(tmp_, y_mem_);
    }
  }

  PoolSetup s_;
  std::string node_;
  memory::format_tag in_fmt_ = memory::format_tag::undef;   // undef: plain input
  memory::format_tag out_fmt_ = memory::format_tag::undef;  // undef: plain output
  bool reorder_out_ = false;
  dnnl::primitive prim_;
  dnnl::reorder reorder_;
  std::vector<std::shared_ptr<Storage>> buffers_;
  mutable memory x_mem_, y_mem_, tmp_;
  mutable dnnl::stream stream_;
};

// MaxPool of 4-D uint8 or int8 bytes: each output the maximum of its window's bytes
// (padding never wins: it is -inf in ref), compared in the bytes' type. Channels-last bytes
// from a QLinearConv (or QLookup) are pooled as runs of C bytes per tap, vectorized
// (max_bytes), and handed on so; NCHW planes take each output row's maximum over the
// window's rows (vectorized along the row), then over the columns.
class ByteMaxPoolKernel final : public ByteLayoutKernel {
 public:
  ByteMaxPoolKernel(PoolSetup s, DType t) : ByteLayoutKernel(t, s.x, s.y), s_(std::move(s)) {}

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.x, t_);
    const auto* x = static_cast<const uint8_t*>(ctx.required_input(0).raw_data());
    auto* y = static_cast<uint8_t*>(ctx.output(0, t_, s_.y).raw_data());
    const int64_t n = s_.x[0], c = s_.x[1], ih = s_.x[2], iw = s_.x[3], oh = s_.y[2], ow = s_.y[3];
    const bool is_signed = t_ == DType::i8;
    const uint8_t lowest = is_signed ? 0x80 : 0;
    // The input rows (columns) of output row oy's (column ox's) window inside the input.
    auto taps = [&](int d, int64_t o, int64_t in, auto&& fn) {
      for (int64_t k = 0; k < s_.k[size_t(d)]; ++k) {
        const int64_t i =
            o * s_.stride[size_t(d)] - s_.pad_l[size_t(d)] + k * (s_.dil[size_t(d)] + 1);
        if (i >= 0 && i < in) fn(i);
      }
    };
    if (cl_x_) {
      // Channels-last: each output pixel the maximum of its taps' runs of C bytes, into the
      // output, or into scratch and transposed for a reader that wants NCHW.
      uint8_t* to = cl_y_ ? y : static_cast<uint8_t*>(thread_scratch(size_t(shape_numel(s_.y))));
      parallel_items(ctx, n * oh, ow * c * shape_numel(s_.k), 1 << 15, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t img = r / oh, oy = r % oh;
          const uint8_t* xi = x + img * ih * iw * c;
          for (int64_t ox = 0; ox < ow; ++ox) {
            uint8_t* d = to + (r * ow + ox) * c;
            std::memset(d, lowest, size_t(c));
            taps(0, oy, ih, [&](int64_t iy) {
              taps(1, ox, iw,
                   [&](int64_t ix) { max_bytes(d, xi + (iy * iw + ix) * c, c, is_signed); });
            });
          }
        }
      });
      if (!cl_y_) bytes_to_nchw(to, y, n, c, oh * ow);
      return;
    }
    // NCHW: per plane and output row, the maximum of the window's input rows, then of each
    // output column's taps in it.
    parallel_items(ctx, n * c * oh, iw * s_.k[0], 1 << 15, [&](int64_t r0, int64_t r1) {
      uint8_t* row = static_cast<uint8_t*>(thread_scratch(size_t(iw)));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t plane = r / oh, oy = r % oh;
        std::memset(row, lowest, size_t(iw));
        taps(0, oy, ih,
             [&](int64_t iy) { max_bytes(row, x + (plane * ih + iy) * iw, iw, is_signed); });
        uint8_t* d = y + r * ow;
        if (s_.stride[1] == 1) {
          // Stride 1: tap k is the row shifted by k * dilation - pad, over the output
          // columns it falls inside.
          std::memset(d, lowest, size_t(ow));
          for (int64_t k = 0; k < s_.k[1]; ++k) {
            const int64_t off = k * (s_.dil[1] + 1) - s_.pad_l[1];
            const int64_t lo = std::max<int64_t>(0, -off), hi = std::min(ow, iw - off);
            if (hi > lo) max_bytes(d + lo, row + lo + off, hi - lo, is_signed);
          }
          continue;
        }
        for (int64_t ox = 0; ox < ow; ++ox) {
          int32_t m = is_signed ? -128 : 0;
          taps(1, ox, iw, [&](int64_t ix) {
            m = std::max(m, is_signed ? int32_t(int8_t(row[ix])) : int32_t(row[ix]));
          });
          d[ox] = uint8_t(m);
        }
      }
    });
  }

 private:
  PoolSetup s_;
};

KernelDef pool_def(const std::string& op, int64_t since, PoolKind kind) {
  KernelDef def;
  def.op_type = op;
  def.since_version = since;
  def.claim = [kind](const KernelBuildInfo& info) {
    PoolSetup s;
    if (auto why = pool_setup(info, kind, &s)) return Claim::no(*why);
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    PoolSetup s;
    if (auto why = pool_setup(info, kind, &s))
      throw Error(ErrorCode::internal, info.node.describe() + ": cpu kernel built for a node it declines: " + *why);
    if (byte_input(info))
      return std::make_unique<ByteMaxPoolKernel>(std::move(s), *info.input(0).dtype);
    return std::make_unique<DnnlPoolKernel>(info.node, std::move(s));
  };
  return def;
}

}  // namespace

void register_dnnl_pool_kernels(KernelRegistry& r) {
  r.add(pool_def("MaxPool", 1, PoolKind::max));
  r.add(pool_def("AveragePool", 1, PoolKind::average));
  r.add(pool_def("GlobalMaxPool", 1, PoolKind::global_max));
  r.add(pool_def("GlobalAveragePool", 1, PoolKind::global_average));
}

}  // namespace slim::cpu
