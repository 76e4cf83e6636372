// Conv, ConvTranspose and slim:FusedConv on oneDNN. The kernel is built at compile time
// for the node's static shapes: oneDNN picks the weight layout (and the activation
// layout it runs fastest in), constant weights are reordered into it once (weights that
// are graph inputs are reordered at each run into the buffer the kernel owns), and bias,
// residual and activation ride along as post-ops. Activations arrive and leave in ONNX's
// plain NCHW; when oneDNN prefers a blocked layout the kernel reorders through buffers
// it allocated at compile time, unless the neighbours agreed on a private layout.
// Ungrouped 3x3 stride-1 convolutions of 16+ channels run Winograd's algorithm
// (SessionOptions::winograd).
#include <cstring>
#include <mutex>

#include "runtime/cpu/cpu_common.h"

namespace slim::cpu {

std::optional<std::string> conv_geometry(const Node& node, const Shape& x, const Shape& w, bool transposed,
                                         ConvGeometry* s) {
  s->x = x;
  s->w = w;
  const size_t rank = s->x.size();
  if (rank < 3 || rank > 5) return "rank " + std::to_string(rank) + " input (oneDNN covers 1-3 spatial dims)";
  if (s->w.size() != rank) return std::string("weight rank differs from input rank");
  const size_t nd = rank - 2;
  s->group = node.attr_int("group", 1);
  const std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  Shape kernel_shape = node.attr_ints("kernel_shape");
  Shape strides = node.attr_ints("strides", Shape(nd, 1));
  Shape dilations = node.attr_ints("dilations", Shape(nd, 1));
  Shape pads = node.attr_ints("pads", Shape(2 * nd, 0));
  if (strides.size() != nd || dilations.size() != nd || pads.size() != 2 * nd)
    return std::string("strides/dilations/pads do not match the spatial rank");
  if (s->group < 1) return std::string("group < 1");
  for (size_t d = 0; d < nd; ++d)
    if (strides[d] < 1 || dilations[d] < 1 || pads[d] < 0 || pads[d + nd] < 0)
      return std::string("non-positive stride/dilation or negative pad");
  Shape k(s->w.begin() + 2, s->w.end());
  if (!kernel_shape.empty() && kernel_shape != k) return std::string("kernel_shape disagrees with the weights");
  for (int64_t v : s->x)
    if (v < 1) return std::string("empty input");
  for (int64_t v : s->w)
    if (v < 1) return std::string("empty weights");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
    return "auto_pad " + auto_pad;
  const int64_t c = s->x[1];
  int64_t m = 0;
  if (!transposed) {
    m = s->w[0];
    if (s->w[1] * s->group != c || m % s->group != 0) return std::string("weights do not fit the input and group");
  } else {
    if (s->w[0] != c || c % s->group != 0) return std::string("weights do not fit the input and group");
    m = s->w[1] * s->group;
  }
  s->y = {s->x[0], m};
  s->stride = strides;
  s->dil.resize(nd);
  s->pad_l.resize(nd);
  s->pad_r.resize(nd);
  Shape out_pad, out_shape;
  if (transposed) {
    out_pad = node.attr_ints("output_padding", Shape(nd, 0));
    out_shape = node.attr_ints("output_shape");
    if (out_shape.size() == nd + 2) out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
    if (out_pad.size() != nd || (!out_shape.empty() && out_shape.size() != nd))
      return std::string("output_padding/output_shape do not match the spatial rank");
  }
  for (size_t d = 0; d < nd; ++d) {
    const int64_t in = s->x[d + 2];
    const int64_t span = (k[d] - 1) * dilations[d] + 1;
    s->dil[d] = dilations[d] - 1;
    int64_t pb = 0, pe = 0, out = 0;
    const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!transposed) {
      if (same) {
        const int64_t o = (in + strides[d] - 1) / strides[d];
        const int64_t total = std::max<int64_t>(0, (o - 1) * strides[d] + span - in);
        pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        pe = total - pb;
      } else if (auto_pad == "NOTSET") {
        pb = pads[d];
        pe = pads[d + nd];
      }
      if (in + pb + pe < span) return std::string("kernel larger than the padded input");
      out = (in + pb + pe - span) / strides[d] + 1;
    } else {
      const int64_t full = strides[d] * (in - 1) + out_pad[d] + span;
      if (!out_shape.empty() || same) {
        out = !out_shape.empty() ? out_shape[d] : in * strides[d];
        const int64_t total = full - out;
        auto floor_half = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
        pb = auto_pad == "SAME_UPPER" ? floor_half(total) : total - floor_half(total);
      } else {
        pb = auto_pad == "VALID" ? 0 : pads[d];
        const int64_t pe0 = auto_pad == "VALID" ? 0 : pads[d + nd];
        out = full - pb - pe0;
      }
      // oneDNN's deconvolution: out = (in - 1) * stride + span - pad_l - pad_r.
      pe = (in - 1) * strides[d] + span - pb - out;
      if (pb < 0 || pe < 0) return std::string("output_padding/output_shape beyond the padding");
      if (out < 1) return std::string("empty output");
    }
    s->pad_l[d] = pb;
    s->pad_r[d] = pe;
    s->y.push_back(out);
  }
  return std::nullopt;
}

namespace {

using dnnl::memory;

struct ConvSetup : ConvGeometry {
  bool transposed = false;
  bool fused = false;
  bool has_bias = false, has_z = false;
  bool weights_constant = true;
  bool winograd = false;  // try oneDNN's Winograd kernels first
  ActivationSpec act;
  // Multiply-adds: each output (input, when transposed) point times a filter's reach.
  int64_t macs() const {
    int64_t reach = 1;
    for (size_t d = 1; d < w.size(); ++d) reach *= w[d];
    return shape_numel(transposed ? x : y) * reach;
  }
};

// Resolves the setup from attributes and static shapes, or returns why the node is
// declined (ref then runs it and reports any real error in the attributes).
std::optional<std::string> conv_setup(const KernelBuildInfo& info, bool transposed, bool fused,
                                      ConvSetup* s) {
  const Node& node = info.node;
  for (int i = 0; i < int(info.inputs.size()); ++i) {
    if (!info.input(i).present) continue;
    if (auto r = need_f32(info, i)) return r;
    if (auto r = need_static(info, i)) return r;
  }
  if (!info.has_input(1)) return std::string("missing weights");
  s->weights_constant = info.input(1).constant != nullptr;
  if (!fused && node.outputs.size() != 1) return std::string("expects one output");
  s->transposed = transposed;
  s->fused = fused;
  if (auto why = conv_geometry(node, *info.input(0).shape, *info.input(1).shape, transposed, s)) return why;
  const int64_t m = s->y[1], c = s->x[1];
  const Shape k(s->w.begin() + 2, s->w.end());
  const size_t nd = k.size();
  s->has_bias = info.has_input(2);
  if (s->has_bias && (info.input(2).shape->size() != 1 || (*info.input(2).shape)[0] != m))
    return std::string("bias is not a vector of the output channels");
  if (fused) {
    s->has_z = info.has_input(3);
    if (s->has_z && *info.input(3).shape != s->y) return std::string("residual shape differs from the output");
    ActivationSpec a;
    if (!parse_fused_activation(node, &a))
      return std::string("unknown activation");
    s->act = a;
  } else if (info.inputs.size() > 3) {
    return std::string("too many inputs");
  }
  // Winograd F(2x2|4x4, 3x3) does about half a direct 3x3 convolution's multiplications;
  // below 16 channels a convolution is too small for it to matter. Its weights are
  // transformed once, at the first run, by oneDNN's reorder (150-200 ns per weight, single
  // threaded), which costs about the time saved by 39,000 / (N * OH * OW) runs. So that
  // cold start stays short it is used where that is about 13 runs or fewer, or 60 when
  // the layer has at most 160 K weights (30 ms of transform at most).
  const int64_t positions = s->y[0] * s->y[2] * s->y[3], weights = m * c * 9;
  s->winograd = info.winograd && !transposed && s->group == 1 && nd == 2 && k == Shape{3, 3} &&
                s->stride == Shape{1, 1} && s->dil == Shape{0, 0} && c >= 16 && m >= 16 &&
                (positions >= 3000 || (positions >= 650 && weights <= 160'000));
  return std::nullopt;
}

// The kernel is decided in two steps. At build, the primitive descriptor: which oneDNN
// implementation and which activation and weight layouts; the layout negotiation may then
// change it (switch_to_blocked). At the first run, the rest: the primitive (its JIT code),
// the packed weights and the reorder buffers, so that a convolution whose layout the
// negotiation changed generates code and packs weights once.
class DnnlConvKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = s_.y;
    return i == 0;
  }
  DnnlConvKernel(const Node& node, ConvSetup s, const Tensor* weights) : s_(std::move(s)) {
    if (weights) weights_src_ = *weights;  // shares the storage until the weights are packed
    limit_dnnl_threads_at_build(s_.macs(), kMacsPerThread);
    dnnl_call(node, "convolution setup", [&] { setup(); return 0; });
  }

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.x);
    limit_dnnl_threads(ctx, s_.macs(), kMacsPerThread);
    const Tensor& x = ctx.required_input(0);
    Tensor& y = ctx.output(0, DType::f32, s_.y);
    dnnl_call(ctx.node(), "convolution", [&] {
      // The layouts are settled by the first run: the rest of the kernel is built then.
      std::call_once(finalized_, [this] { const_cast<DnnlConvKernel*>(this)->finalize(); });
      // In a private layout (negotiated at compile time) x or y already is in the layout
      // the primitive runs in, so they are used in place instead of reordered.
      memory& dst = private_dst_ ? dst_priv_ : dst_mem_;
      if (private_src_) {
        src_priv_.set_data_handle(x.raw_data());
      } else {
        src_user_.set_data_handle(x.raw_data());
        if (reorder_src_) src_reorder_.execute(stream_, src_user_, src_mem_);
      }
      if (private_dst_) dst_priv_.set_data_handle(y.raw_data());
      else dst_user_.set_data_handle(y.raw_data());
      if (!s_.weights_constant) {
        check_input_shape(ctx, 1, s_.w);
        w_user_.set_data_handle(ctx.required_input(1).raw_data());
        w_reorder_.execute(stream_, w_user_, weights_);
      }
      if (s_.has_z) {
        // The residual: read in place by the binary-add post-op, or copied into dst for
        // the sum post-op; through a reorder from plain when it is not in dst's layout.
        const Tensor& z = ctx.required_input(3);
        check_input_shape(ctx, 3, s_.y);
        if (!private_z_ && reorder_dst_) {
          z_user_.set_data_handle(z.raw_data());
          z_reorder_.execute(stream_, z_user_, z_binary_ ? z_mem_ : dst);
        } else if (z_binary_) {
          z_mem_.set_data_handle(const_cast<void*>(z.raw_data()));
        } else {
          std::memcpy(dst.get_data_handle(), z.raw_data(), y.nbytes());
        }
      }
      if (s_.has_bias) bias_.set_data_handle(ctx.required_input(2).raw_data());
      prim_.execute(stream_, args_);
      if (reorder_dst_ && !private_dst_) dst_reorder_.execute(stream_, dst_mem_, dst_user_);
      stream_.wait();
      return 0;
    });
  }

  // The layout oneDNN runs in, when it is not the plain one and takes no more bytes
  // (blocked layouts that pad the channels do not fit the planned buffers).
  uint64_t private_output_layout(int i) const override {
    if (i != 0 || !reorder_dst() || dst_md_.get_size() != size_t(shape_numel(s_.y)) * 4) return 0;
    return layout_tag(dst_md_);
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    if (i == 0)
      return (reorder_src() && src_md_.get_size() == size_t(shape_numel(s_.x)) * 4 &&
              layout_tag(src_md_) == layout) ||
             (can_switch_to_blocked() && channel_layout(s_.x, layout) == blocked_layout());
    if (i == 3)
      return s_.has_z && reorder_dst() && dst_md_.get_size() == size_t(shape_numel(s_.y)) * 4 &&
             layout_tag(dst_md_) == layout;
    return false;
  }
  uint64_t wanted_input_layout(int i) const override {
    return i == 0 && reorder_src() && src_md_.get_size() == size_t(shape_numel(s_.x)) * 4 ? layout_tag(src_md_) : 0;
  }
  // Another kernel's channels-last or nChw16c: the reorder after the primitive, which
  // otherwise goes to plain, writes that layout instead.
  bool can_write_output_in(int i, uint64_t layout) const override {
    return i == 0 && reorder_dst() && channel_layout(s_.y, layout).has_value();
  }
  void use_private_output(int i, uint64_t layout) override {
    if (i != 0) return;
    if (layout == layout_tag(dst_md_)) private_dst_ = true;
    else dst_user_fmt_ = *channel_layout(s_.y, layout);
  }
  void use_private_input(int i, uint64_t layout) override {
    if (i == 0) {
      // Without an nChw16c kernel after all, the reorder before the primitive reads it.
      if (layout != layout_tag(src_md_) && !switch_to_blocked()) src_user_fmt_ = blocked_layout();
      else private_src_ = true;
    }
    if (i == 3) private_z_ = true;
  }

 private:
  bool reorder_src() const { return src_md_ != plain_md(x_); }
  bool reorder_dst() const { return dst_md_ != plain_md(y_); }

  // oneDNN's direct kernels run an ungrouped 2-D convolution in channels-last or in
  // nChw16c at about the same speed, and pick channels-last; Winograd and pooling run in
  // nChw16c (nChw8c below AVX-512: blocked_layout). When the input arrives blocked (from
  // a Winograd convolution, say), the kernel switches to that layout instead of reordering the activations on both sides. Only
  // before its residual input's layout was settled, which follows dst.
  bool can_switch_to_blocked() const {
    return !s_.transposed && !s_.winograd && s_.group == 1 && s_.x.size() == 4 && s_.x[1] % blocked_channels() == 0 &&
           s_.y[1] % blocked_channels() == 0 && reorder_src() && !private_src_ && !private_z_ &&
           src_user_fmt_ == memory::format_tag::undef;
  }

  void setup() {
    // oneDNN's view of the geometry: ONNX's, except that a 1-D convolution is a 2-D one
    // of height 1 (the same bytes in every layout). oneDNN has jit depthwise kernels for
    // 2-D only: in 1-D it ran Silero v4's 5-tap depthwise convolution of 258 channels as
    // a gemm per group, 107 us against 5.
    x_ = s_.x, y_ = s_.y, stride_ = s_.stride, dil_ = s_.dil, pad_l_ = s_.pad_l, pad_r_ = s_.pad_r;
    const bool lift = s_.x.size() == 3;
    if (lift) {
      x_.insert(x_.begin() + 2, 1);
      y_.insert(y_.begin() + 2, 1);
      stride_.insert(stride_.begin(), 1);
      for (Shape* p : {&dil_, &pad_l_, &pad_r_}) p->insert(p->begin(), 0);
    }
    const int64_t g = s_.group;
    const int64_t m = s_.y[1], c = s_.x[1];
    Shape k(s_.w.begin() + 2, s_.w.end());
    if (lift) k.insert(k.begin(), 1);
    // Weights as ONNX stores them, described in oneDNN's logical order: conv
    // [(G,) OC, IC, k...]; ConvTranspose's file order is [IC, OC/G, k...] per group.
    Shape wstrides;
    const int64_t ksize = shape_numel(k);
    const Shape kstr = contiguous_strides(k);
    const int64_t ocg = m / g, icg = c / g;
    if (g > 1) wdims_.push_back(g);
    wdims_.push_back(ocg);
    wdims_.push_back(icg);
    wdims_.insert(wdims_.end(), k.begin(), k.end());
    if (!s_.transposed) {
      if (g > 1) wstrides.push_back(ocg * icg * ksize);
      wstrides.push_back(icg * ksize);
      wstrides.push_back(ksize);
    } else {
      if (g > 1) wstrides.push_back(icg * ocg * ksize);
      wstrides.push_back(ksize);
      wstrides.push_back(ocg * ksize);
    }
    wstrides.insert(wstrides.end(), kstr.begin(), kstr.end());
    w_user_md_ = strided_md(wdims_, wstrides);
    bias_md_ = s_.has_bias ? plain_md({m}) : memory::desc();

    // Activations arrive and leave in ONNX's plain layout. oneDNN's fastest kernels want
    // channels-last or blocked activations, so the kernel normally lets oneDNN choose and
    // reorders through its own buffers; the reorders are cheap next to the convolution
    // except for ungrouped inputs with few channels (an image): those are read in plain
    // NCHW by oneDNN's first-layer kernels (an nhwc reorder of them is slow), unless
    // only the reference implementation would take them.
    // Depthwise and grouped convolutions only have fast kernels in blocked layouts.
    const int64_t channels_in = s_.x[1] / s_.group;
    std::string impl;
    const bool plain_first = channels_in < 8 && s_.group == 1;
    if (s_.winograd) {
      try {
        impl = describe(any(x_), any(y_), dnnl::algorithm::convolution_winograd);
      } catch (const dnnl::error&) {
        s_.winograd = false;  // this CPU or shape has no Winograd kernel: the direct one below
      }
    } else if (plain_first) {
      try {
        impl = describe(plain_md(x_), any(y_));
      } catch (const dnnl::error&) {
        impl = "ref";  // no kernel for the plain layout at all
      }
    }
    if (impl.empty() || impl.find("ref") != std::string::npos) describe(any(x_), any(y_));
  }

  static memory::desc any(const Shape& d) {
    return memory::desc(to_dims(d), memory::data_type::f32, memory::format_tag::any);
  }

  // Bias is an argument; the residual and the activation are post-ops. The residual is
  // oneDNN's sum (z copied into dst first), or, given z's layout, a binary add that reads
  // z in place (see describe).
  dnnl::primitive_attr post_ops_attr(const memory::desc* binary_z) const {
    dnnl::post_ops ops;
    if (binary_z) ops.append_binary(dnnl::algorithm::binary_add, *binary_z);
    else if (s_.has_z) ops.append_sum(1.f);
    append_activation(ops, s_.act);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return attr;
  }

  dnnl::primitive_desc make_pd(const memory::desc& x_md, const memory::desc& y_md, dnnl::algorithm algorithm,
                               const dnnl::primitive_attr& attr) const {
    const auto& eng = dnnl_engine();
    if (!s_.transposed)
      return dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, algorithm, x_md, any(wdims_),
                                          bias_md_, y_md, to_dims(stride_), to_dims(dil_), to_dims(pad_l_),
                                          to_dims(pad_r_)),
          attr, eng);
    return dnnl::deconvolution_forward::primitive_desc(
        dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                                          x_md, any(wdims_), bias_md_, y_md, to_dims(stride_), to_dims(dil_),
                                          to_dims(pad_l_), to_dims(pad_r_)),
        attr, eng);
  }

  void adopt(const dnnl::primitive_desc& pd) {
    pd_ = pd;
    src_md_ = pd_.src_desc();
    dst_md_ = pd_.dst_desc();
    w_md_ = pd_.weights_desc();
  }

  // The primitive descriptor for activations in x_md / y_md (format_tag::any: oneDNN's
  // choice); returns the implementation's name.
  std::string describe(const memory::desc& x_md, const memory::desc& y_md,
                       dnnl::algorithm algorithm = dnnl::algorithm::convolution_direct) {
    // For output channels that are not a multiple of 16, the sum path of oneDNN's direct
    // channels-last 1x1 kernel is slow (MobileNetV2's 144 -> 24 projection at 56 x 56,
    // batch 8: 1.47 ms without residual, 2.13 with); a binary add reading z in place runs
    // in 1.25. For other shapes binary add selects slower kernels than sum.
    z_binary_ = s_.has_z && !s_.transposed && algorithm == dnnl::algorithm::convolution_direct &&
                s_.y[1] % 16 != 0;
    adopt(make_pd(x_md, y_md, algorithm, post_ops_attr(nullptr)));
    // Now that dst's layout is known: z read in it, added before the activation.
    if (z_binary_) adopt(make_pd(src_md_, dst_md_, algorithm, post_ops_attr(&dst_md_)));
    return pd_.impl_info_str();
  }

  // Describes the convolution with blocked activations (nChw16c, or nChw8c below AVX-512). False (and nothing changed) when
  // oneDNN has no kernel for it.
  bool switch_to_blocked() {
    const dnnl::primitive_desc old = pd_;
    const bool old_z_binary = z_binary_;
    try {
      describe(f32_md(x_, blocked_layout()), f32_md(y_, blocked_layout()));
      return true;
    } catch (const dnnl::error&) {
      adopt(old);
      z_binary_ = old_z_binary;
      return false;
    }
  }

  // The primitive, the packed weights (once, when they are constant; the kernel owns the
  // packed copy) and the memories and reorders between the callers' layouts and the
  // primitive's.
  void finalize() {
    const auto& eng = dnnl_engine();
    stream_ = dnnl::stream(eng);
    prim_ = dnnl::primitive(pd_);
    weights_ = owned_memory(w_md_, eng, buffers_);
    if (s_.weights_constant) {
      memory w_user(w_user_md_, eng, weights_src_.raw_data());
      dnnl::reorder(w_user, weights_).execute(stream_, w_user, weights_);
      stream_.wait();
      weights_src_ = Tensor();
    } else {
      w_user_ = memory(w_user_md_, eng, DNNL_MEMORY_NONE);
      w_reorder_ = dnnl::reorder(w_user_, weights_);
    }
    const memory::desc x_md = plain_md(x_), y_md = plain_md(y_);
    reorder_src_ = reorder_src();
    reorder_dst_ = reorder_dst();
    src_user_ = memory(src_user_fmt_ == memory::format_tag::undef ? x_md : f32_md(x_, src_user_fmt_), eng,
                       DNNL_MEMORY_NONE);
    dst_user_ = memory(dst_user_fmt_ == memory::format_tag::undef ? y_md : f32_md(y_, dst_user_fmt_), eng,
                       DNNL_MEMORY_NONE);
    if (private_src_) {
      src_priv_ = memory(src_md_, eng, DNNL_MEMORY_NONE);
    } else if (reorder_src_) {
      src_mem_ = owned_memory(src_md_, eng, buffers_);
      src_reorder_ = dnnl::reorder(src_user_, src_mem_);
    } else {
      src_mem_ = src_user_;
    }
    if (private_dst_) {
      dst_priv_ = memory(dst_md_, eng, DNNL_MEMORY_NONE);
    } else if (reorder_dst_) {
      dst_mem_ = owned_memory(dst_md_, eng, buffers_);
      dst_reorder_ = dnnl::reorder(dst_mem_, dst_user_);
    } else {
      dst_mem_ = dst_user_;
    }
    if (z_binary_) {
      // z in dst's layout: in place, or reordered from plain into a buffer of its own.
      const bool in_place = private_z_ || !reorder_dst_;
      z_mem_ = in_place ? memory(dst_md_, eng, DNNL_MEMORY_NONE) : owned_memory(dst_md_, eng, buffers_);
      if (!in_place) {
        z_user_ = memory(y_md, eng, DNNL_MEMORY_NONE);
        z_reorder_ = dnnl::reorder(z_user_, z_mem_);
      }
    } else if (s_.has_z && reorder_dst_ && !private_z_) {  // plain z into the primitive's dst layout
      z_user_ = memory(y_md, eng, DNNL_MEMORY_NONE);
      z_reorder_ = dnnl::reorder(z_user_, private_dst_ ? dst_priv_ : dst_mem_);
    }
    if (s_.has_bias) bias_ = memory(bias_md_, eng, DNNL_MEMORY_NONE);
    // The memories are handles: a run sets their data and executes with these.
    args_ = {{DNNL_ARG_SRC, private_src_ ? src_priv_ : src_mem_},
             {DNNL_ARG_WEIGHTS, weights_},
             {DNNL_ARG_DST, private_dst_ ? dst_priv_ : dst_mem_}};
    if (s_.has_bias) args_.emplace(DNNL_ARG_BIAS, bias_);
    if (z_binary_) args_.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, z_mem_);
  }

  ConvSetup s_;
  Tensor weights_src_;  // the constant weights until finalize packs them
  Shape x_, y_, stride_, dil_, pad_l_, pad_r_;  // as oneDNN sees them (setup)
  Shape wdims_;
  memory::desc w_user_md_, bias_md_, w_md_, src_md_, dst_md_;
  dnnl::primitive_desc pd_;
  // Negotiated layouts: x or y in the primitive's own layout (used in place), x or y in
  // another channel layout (the reorder converts from or to it; undef = plain), z in dst's.
  bool private_src_ = false, private_dst_ = false, private_z_ = false;
  bool z_binary_ = false;  // the residual is a binary-add post-op (else sum into dst)
  memory::format_tag src_user_fmt_ = memory::format_tag::undef, dst_user_fmt_ = memory::format_tag::undef;
  // Built by finalize, at the first run.
  mutable std::once_flag finalized_;
  dnnl::primitive prim_;
  dnnl::reorder src_reorder_, dst_reorder_, z_reorder_, w_reorder_;
  mutable memory weights_, bias_, src_user_, dst_user_, z_user_, z_mem_, src_mem_, dst_mem_, w_user_, src_priv_,
      dst_priv_;
  std::unordered_map<int, memory> args_;
  std::vector<std::shared_ptr<Storage>> buffers_;  // behind weights_, src_mem_, dst_mem_
  bool reorder_src_ = false, reorder_dst_ = false;
  mutable dnnl::stream stream_;
};

// ConvTranspose whose kernel equals its stride, with no padding, dilation, output
// padding or groups (the 2x2 stride-2 upsampling of FPN and UNet heads): every input
// pixel owns its own kh x kw patch of the output, so per image the op is one matrix
// product P[O*kh*kw, H*W] = Wt[O*kh*kw, C] x X[C, H*W] (Wt: the weights transposed once)
// and a scatter of P's rows into the patches, plus the bias. oneDNN's direct
// deconvolution pads the output channels to 16 and blocks the layout: on the 1-channel
// probability map of PP-OCR's text detector it took 20 times as long.
bool is_patch_transpose(const ConvSetup& s) {
  if (!s.transposed || s.fused || s.group != 1 || s.x.size() != 4 || !s.weights_constant) return false;
  for (size_t d = 0; d < 2; ++d)
    if (s.stride[d] != s.w[d + 2] || s.dil[d] != 0 || s.pad_l[d] != 0 || s.pad_r[d] != 0 ||
        s.y[d + 2] != s.x[d + 2] * s.stride[d])
      return false;
  return true;
}

class PatchConvTransposeKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = s_.y;
    return i == 0;
  }
  PatchConvTransposeKernel(const Node& node, ConvSetup s, const Tensor& w) : s_(std::move(s)) {
    c_ = s_.x[1];
    o_ = s_.y[1];
    kh_ = s_.w[2];
    kw_ = s_.w[3];
    hw_ = s_.x[2] * s_.x[3];
    m_ = o_ * kh_ * kw_;
    // W [C, O, kh, kw] is [C, M] row-major: Wt = its transpose, [M, C].
    wt_ = Tensor(DType::f32, {m_, c_});
    const Tensor wc = w.contiguous();
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t j = 0; j < m_; ++j) wt_.data<float>()[j * c_ + c] = wc.data<float>()[c * m_ + j];
    p_.resize(size_t(m_ * hw_));
    limit_dnnl_threads_at_build(m_ * c_ * hw_, kMacsPerThread);
    dnnl_call(node, "matmul setup", [&] {
      const auto& eng = dnnl_engine();
      stream_ = dnnl::stream(eng);
      const memory::desc a_md = plain_md({m_, c_}), x_md = plain_md({c_, hw_}), p_md = plain_md({m_, hw_});
      prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, x_md, p_md), eng));
      a_mem_ = memory(a_md, eng, wt_.raw_data());
      x_mem_ = memory(x_md, eng, DNNL_MEMORY_NONE);
      p_mem_ = memory(p_md, eng, p_.data());
      return 0;
    });
  }

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.x);
    const float* x = ctx.required_input(0).data<float>();
    const float* bias = s_.has_bias ? ctx.required_input(2).data<float>() : nullptr;
    float* y = ctx.output(0, DType::f32, s_.y).data<float>();
    const int64_t h = s_.x[2], w = s_.x[3], ow = w * kw_;
    for (int64_t n = 0; n < s_.x[0]; ++n) {
      limit_dnnl_threads(ctx, m_ * c_ * hw_, kMacsPerThread);  // the scatter below sets its own
      dnnl_call(ctx.node(), "matmul", [&] {
        x_mem_.set_data_handle(const_cast<float*>(x + n * c_ * hw_));
        prim_.execute(stream_, {{DNNL_ARG_SRC, a_mem_}, {DNNL_ARG_WEIGHTS, x_mem_}, {DNNL_ARG_DST, p_mem_}});
        stream_.wait();
        return 0;
      });
      // Output row (o, i * kh + a) interleaves rows (o, a, 0..kw-1) of P at input row i.
      float* yn = y + n * o_ * h * kh_ * ow;
      parallel_items(ctx, o_ * h * kh_, ow * 4, kBytesPerThread, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const int64_t o = r / (h * kh_), i = r / kh_ % h, a = r % kh_;
          const float add = bias ? bias[o] : 0.f;
          const float* prow = p_.data() + ((o * kh_ + a) * kw_) * hw_ + i * w;
          float* dst = yn + r * ow;
          for (int64_t j = 0; j < w; ++j)
            for (int64_t k = 0; k < kw_; ++k) dst[j * kw_ + k] = prow[k * hw_ + j] + add;
        }
      });
    }
  }

 private:
  ConvSetup s_;
  int64_t c_ = 0, o_ = 0, kh_ = 0, kw_ = 0, hw_ = 0, m_ = 0;
  Tensor wt_;
  // P of the image in flight; runs of a session are serialized.
  mutable std::vector<float> p_;
  dnnl::matmul prim_;
  mutable memory a_mem_, x_mem_, p_mem_;
  mutable dnnl::stream stream_;
};

// A 1-D convolution of a one-channel signal by long filters (an STFT or a filterbank
// written as Conv: the front ends of Silero's VADs and openWakeWord) is a matrix product:
// the filters W [M, K] times the signal's frames F [OW, K] transposed (row o of F is the
// window at o * stride, zeros where it overhangs into the padding), per image. On
// openWakeWord's STFT (257 filters of 512 taps, stride 160, 297 frames: 39 M
// multiply-adds) oneDNN's direct convolution took 1.1 ms, this 0.8 (one thread, AVX-512).
bool is_frame_conv(const ConvSetup& s) {
  return !s.transposed && s.x.size() == 3 && s.group == 1 && s.x[1] == 1 && s.dil[0] == 0 && !s.has_z &&
         s.weights_constant && s.w[2] >= 64;
}

class FrameConvKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = s_.y;
    return i == 0;
  }
  FrameConvKernel(const Node& node, ConvSetup s, const Tensor& w) : s_(std::move(s)) {
    const int64_t n = s_.x[0], k = s_.w[2], m = s_.w[0], ow = s_.y[2];
    frames_.resize(size_t(n * ow * k));
    limit_dnnl_threads_at_build(s_.macs(), kMacsPerThread);
    dnnl_call(node, "matmul setup", [&] {
      const auto& eng = dnnl_engine();
      stream_ = dnnl::stream(eng);
      // y [N, M, OW] = W [M, K] times F^T (F [N, OW, K] read transposed).
      const memory::desc f_md = strided_md({n, k, ow}, {ow * k, 1, k});
      const memory::desc w_md = plain_md({1, m, k});
      const memory::desc y_md = plain_md({n, m, ow});
      dnnl::post_ops ops;
      append_activation(ops, s_.act);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      const auto d = s_.has_bias ? dnnl::matmul::desc(w_md, f_md, plain_md({1, m, 1}), y_md)
                                 : dnnl::matmul::desc(w_md, f_md, y_md);
      const dnnl::matmul::primitive_desc pd(d, attr, eng);
      prim_ = dnnl::matmul(pd);
      w_ = w.contiguous();
      w_mem_ = memory(w_md, eng, w_.raw_data());
      f_mem_ = memory(f_md, eng, frames_.data());
      y_mem_ = memory(y_md, eng, DNNL_MEMORY_NONE);
      args_ = {{DNNL_ARG_SRC, w_mem_}, {DNNL_ARG_WEIGHTS, f_mem_}, {DNNL_ARG_DST, y_mem_}};
      if (s_.has_bias) {
        bias_mem_ = memory(plain_md({1, m, 1}), eng, DNNL_MEMORY_NONE);
        args_.emplace(DNNL_ARG_BIAS, bias_mem_);
      }
      return 0;
    });
  }

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.x);
    const int64_t len = s_.x[2], k = s_.w[2], ow = s_.y[2], stride = s_.stride[0], pad = s_.pad_l[0];
    const float* x = ctx.required_input(0).data<float>();
    parallel_items(ctx, s_.x[0] * ow, k * 4, kBytesPerThread, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t start = r % ow * stride - pad;  // the window's first sample
        const int64_t lo = std::clamp<int64_t>(-start, 0, k), hi = std::clamp<int64_t>(len - start, lo, k);
        float* f = frames_.data() + r * k;
        std::fill(f, f + lo, 0.f);
        std::memcpy(f + lo, x + r / ow * len + start + lo, size_t(hi - lo) * 4);
        std::fill(f + hi, f + k, 0.f);
      }
    });
    limit_dnnl_threads(ctx, s_.macs(), kMacsPerThread);
    Tensor& y = ctx.output(0, DType::f32, s_.y);
    dnnl_call(ctx.node(), "matmul", [&] {
      y_mem_.set_data_handle(y.raw_data());
      if (s_.has_bias) bias_mem_.set_data_handle(ctx.required_input(2).raw_data());
      prim_.execute(stream_, args_);
      stream_.wait();
      return 0;
    });
  }

 private:
  ConvSetup s_;
  Tensor w_;
  mutable std::vector<float> frames_;  // the run in flight's; runs of a session are serialized
  dnnl::matmul prim_;
  mutable memory f_mem_, w_mem_, y_mem_, bias_mem_;
  std::unordered_map<int, memory> args_;
  mutable dnnl::stream stream_;
};

KernelDef conv_def(const std::string& op, const std::string& domain, int64_t since,
                   bool transposed, bool fused) {
  KernelDef def;
  def.op_type = op;
  def.domain = domain;
  def.since_version = since;
  def.claim = [transposed, fused](const KernelBuildInfo& info) {
    ConvSetup s;
    if (auto why = conv_setup(info, transposed, fused, &s)) return Claim::no(*why);
    return Claim::yes();
  };
  def.build = [transposed, fused](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    ConvSetup s;
    if (auto why = conv_setup(info, transposed, fused, &s))
      throw Error(ErrorCode::internal, info.node.describe() + ": cpu kernel built for a node it declines: " + *why);
    if (is_patch_transpose(s))
      return std::make_unique<PatchConvTransposeKernel>(info.node, std::move(s), *info.input(1).constant);
    if (is_frame_conv(s)) return std::make_unique<FrameConvKernel>(info.node, std::move(s), *info.input(1).constant);
    return std::make_unique<DnnlConvKernel>(info.node, std::move(s), info.input(1).constant);
  };
  return def;
}

}  // namespace

void register_dnnl_conv_kernels(KernelRegistry& r) {
  r.add(conv_def("Conv", "", 1, false, false));
  r.add(conv_def("ConvTranspose", "", 1, true, false));
  r.add(conv_def("FusedConv", kFusedDomain, kFusedOpset, false, true));
}

}  // namespace slim::cpu
