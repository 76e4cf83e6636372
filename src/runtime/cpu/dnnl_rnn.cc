// The cpu provider's RNN, GRU and LSTM: the claim, and the kernel on oneDNN's RNN
// primitives (vanilla_rnn, gru, lbr_gru, lstm with or without peepholes) for what the own
// cells (rnn_cells.cc: batches up to 8 with constant weights) do not run. oneDNN fixes
// what ONNX makes attributes, so the claim takes only nodes both compute exactly: the
// default activations (any of Tanh, Sigmoid, Relu, LeakyRelu for RNN), no clip, no
// input_forget. The primitive is built at compile time for the static shapes with
// constant weights packed once (weights fed as graph inputs are packed at every run).
// oneDNN has no per-batch lengths: a constant sequence_lens must equal the sequence
// length everywhere, one fed at run time is checked at each run and other lengths go to
// the node's ref kernel. ref runs what the claim declines.
//
// ONNX orders the LSTM gates i, o, f, c and the peepholes i, o, f; oneDNN i, f, c, o and
// i, f, o. GRU's z, r, h are oneDNN's u, r, o; its biases add Wb and Rb, except that
// linear-before-reset keeps Rbh apart as a fourth gate bias. ONNX's W[d] is [gates *
// hidden, input]; oneDNN's weights are [input, gates, hidden] (ldigo).
#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/rnn.h"
#include "slim/core/convert.h"

namespace slim::cpu {
namespace {

using dnnl::memory;
using ref::RnnActivation;
using ref::RnnKind;

// ONNX gate index of each oneDNN gate.
const int* onnx_gate_order(RnnKind kind) {
  static const int lstm[] = {0, 2, 3, 1}, other[] = {0, 1, 2};
  return kind == RnnKind::lstm ? lstm : other;
}

std::optional<std::string> rnn_setup(const KernelBuildInfo& info, RnnSetup* s) {
  try {
    s->a = ref::parse_rnn_attrs(info.node, info.opset);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  const ref::RnnAttrs& a = s->a;
  for (int i : {0, 1, 2, 3, 5, 6, 7}) {
    if (!info.input(i).present) continue;
    if (auto r = need_f32(info, i)) return r;
    if (auto r = need_static(info, i)) return r;
  }
  if (a.clip) return std::string("clip is not supported by oneDNN's RNN primitives");
  if (a.input_forget) return std::string("input_forget is not supported by oneDNN's LSTM");
  const int per = a.activations_per_direction();
  for (int d = 0; d < a.directions; ++d)
    for (int k = 0; k < per; ++k) {
      const RnnActivation& act = a.activation(d, k);
      const RnnActivation& first = a.activation(0, k);
      if (act.kind != first.kind || act.alpha != first.alpha)
        return std::string("the directions have different activations");
      if (a.kind == RnnKind::rnn) {
        using A = dnnl::algorithm;
        switch (act.kind) {
          case RnnActivation::tanh: s->activation = A::eltwise_tanh; break;
          case RnnActivation::sigmoid: s->activation = A::eltwise_logistic; break;
          case RnnActivation::relu: s->activation = A::eltwise_relu; break;
          case RnnActivation::leaky_relu: s->activation = A::eltwise_relu, s->alpha = act.alpha; break;
          default: return std::string("activation other than Tanh, Sigmoid, Relu or LeakyRelu");
        }
      } else if (act.kind != (k == 0 ? RnnActivation::sigmoid : RnnActivation::tanh)) {
        return std::string(a.kind == RnnKind::lstm ? "activations other than Sigmoid, Tanh, Tanh"
                                                   : "activations other than Sigmoid, Tanh");
      }
    }
  const Shape x = *info.input(0).shape, w = *info.input(1).shape, r = *info.input(2).shape;
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) return std::string("X, W or R is not 3-D");
  const bool batch_first = a.layout == 1;
  s->T = x[batch_first ? 1 : 0];
  s->N = x[batch_first ? 0 : 1];
  s->I = x[2];
  s->H = r[2];
  s->D = a.directions;
  const int64_t G = a.gates, D = s->D, H = s->H, N = s->N;
  if (s->T < 1 || s->N < 1 || s->I < 1 || H < 1) return std::string("empty input");
  const Shape state = batch_first ? Shape{N, D, H} : Shape{D, N, H};
  const Shape shapes[] = {{}, {D, G * H, s->I}, {D, G * H, H}, {D, 2 * G * H}, {N}, state, state, {D, 3 * H}};
  if ((a.hidden && a.hidden != H) || w != shapes[1] || r != shapes[2])
    return std::string("input shapes do not match");
  for (int i : {3, 5, 6, 7})
    if (info.input(i).present && *info.input(i).shape != shapes[i]) return std::string("input shapes do not match");
  s->lens_at_run = info.input(4).present && !info.input(4).constant;
  s->has_b = info.input(3).present;
  s->has_h0 = info.input(5).present;
  s->has_c0 = info.input(6).present;
  s->has_p = info.input(7).present;
  s->weights_constant = true;
  for (int i : {1, 2, 3, 7})
    if (info.input(i).present && !info.input(i).constant) s->weights_constant = false;
  if (const Tensor* lens = info.input(4).constant) {
    if (!dtype_is_integer(lens->dtype())) return std::string("sequence_lens is not an integer tensor");
    for (int64_t v : tensor_to_int64s(*lens))
      if (v != s->T && !rnn_cells_suit(*s))
        return std::string("sequence_lens differs from the sequence length (oneDNN has no per-batch lengths)");
  }
  return std::nullopt;
}

class DnnlRnnKernel final : public OpKernel {
 public:
  DnnlRnnKernel(const KernelBuildInfo& info, RnnSetup s) : s_(std::move(s)) {
    limit_dnnl_threads_at_build(macs(), kMacsPerThread);
    dnnl_call(info.node, "RNN setup", [&] { setup(info); return 0; });
    if (s_.lens_at_run) ref_ = ref_kernel_registry().find(info.node.op_type, "", info.opset)->factory(info.node, info.opset);
  }

  // Multiply-adds: per step, direction and batch row, every gate's input and recurrent products.
  int64_t macs() const { return s_.D * s_.T * s_.N * s_.a.gates * s_.H * (s_.I + s_.H); }

  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i < 0 || i > (s_.a.kind == RnnKind::lstm ? 2 : 1)) return false;
    *dtype = DType::f32;
    *shape = i == 0 ? y_shape() : state_shape();
    return true;
  }

  void compute(KernelContext& ctx) const override {
    const bool batch_first = s_.a.layout == 1;
    check_input_shape(ctx, 0, batch_first ? Shape{s_.N, s_.T, s_.I} : Shape{s_.T, s_.N, s_.I});
    if (ref_ && !full_lengths(ctx.required_input(4))) {
      ref_->compute(ctx);  // per-batch lengths: oneDNN has none
      return;
    }
    limit_dnnl_threads(ctx, macs(), kMacsPerThread);
    if (!s_.weights_constant) {
      for (int i : {1, 2, 3, 7})
        if (ctx.input(i)) check_input_shape(ctx, i, input_shape(i));
      pack_weights(ctx.required_input(1), ctx.required_input(2), ctx.input(3), ctx.input(7));
    }
    const bool lstm = s_.a.kind == RnnKind::lstm;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC_LAYER, src_layer_}, {DNNL_ARG_WEIGHTS_LAYER, weights_layer_},
                                         {DNNL_ARG_WEIGHTS_ITER, weights_iter_}, {DNNL_ARG_BIAS, bias_},
                                         {DNNL_ARG_DST_LAYER, dst_layer_}};
    src_layer_.set_data_handle(ctx.required_input(0).raw_data());
    if (states_in_) {
      load_state(ctx, 5, src_iter_);
      args.emplace(DNNL_ARG_SRC_ITER, src_iter_);
      if (lstm) {
        load_state(ctx, 6, src_iter_c_);
        args.emplace(DNNL_ARG_SRC_ITER_C, src_iter_c_);
      }
    }
    if (s_.has_p) args.emplace(DNNL_ARG_WEIGHTS_PEEPHOLE, peephole_);
    // Outputs oneDNN writes in ONNX's layout are written in place, the others go
    // through the kernel's buffers and are rearranged after.
    const bool y_wanted = ctx.output_wanted(0);
    Tensor* y = y_wanted ? &ctx.output(0, DType::f32, y_shape()) : nullptr;
    dst_layer_.set_data_handle(y && y_in_place_ ? y->raw_data() : y_buffer_.raw_data());
    Tensor *yh = nullptr, *yc = nullptr;
    if (states_out_) {
      if (ctx.output_wanted(1)) yh = &ctx.output(1, DType::f32, state_shape());
      if (lstm && ctx.output_wanted(2)) yc = &ctx.output(2, DType::f32, state_shape());
      dst_iter_.set_data_handle(yh && states_in_place_ ? yh->raw_data() : yh_buffer_.raw_data());
      args.emplace(DNNL_ARG_DST_ITER, dst_iter_);
      if (lstm) {
        dst_iter_c_.set_data_handle(yc && states_in_place_ ? yc->raw_data() : yc_buffer_.raw_data());
        args.emplace(DNNL_ARG_DST_ITER_C, dst_iter_c_);
      }
    }
    dnnl_call(ctx.node(), "RNN", [&] {
      prim_.execute(stream_, args);
      stream_.wait();
      return 0;
    });
    if (y && !y_in_place_) {
      // [T, N, D * H] (bidirectional concat) to ONNX's [T, D, N, H].
      const int64_t T = s_.T, N = s_.N, D = s_.D, H = s_.H;
      const float* src = y_buffer_.data<float>();
      float* dst = y->data<float>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t d = 0; d < D; ++d)
            std::memcpy(dst + ((t * D + d) * N + n) * H, src + ((t * N + n) * D + d) * H, size_t(H) * sizeof(float));
    }
    if (!states_in_place_) {
      if (yh) transpose_state(yh_buffer_.data<float>(), yh->data<float>(), false);
      if (yc) transpose_state(yc_buffer_.data<float>(), yc->data<float>(), false);
    }
  }

 private:
  Shape y_shape() const {
    return s_.a.layout == 1 ? Shape{s_.N, s_.T, s_.D, s_.H} : Shape{s_.T, s_.D, s_.N, s_.H};
  }
  Shape state_shape() const { return s_.a.layout == 1 ? Shape{s_.N, s_.D, s_.H} : Shape{s_.D, s_.N, s_.H}; }

  // Between ONNX's batch-first [N, D, H] and oneDNN's [D, N, H].
  void transpose_state(const float* src, float* dst, bool to_dnnl) const {
    for (int64_t d = 0; d < s_.D; ++d)
      for (int64_t n = 0; n < s_.N; ++n) {
        const int64_t dn = (d * s_.N + n) * s_.H, nd = (n * s_.D + d) * s_.H;
        std::memcpy(dst + (to_dnnl ? dn : nd), src + (to_dnnl ? nd : dn), size_t(s_.H) * sizeof(float));
      }
  }

  // Points `mem` at initial state input i, or at zeros when the node has none.
  void load_state(const KernelContext& ctx, int i, memory& mem) const {
    const Tensor* t = ctx.input(i);
    if (!t) {
      mem.set_data_handle(zeros_.raw_data());
      return;
    }
    check_input_shape(ctx, i, state_shape());
    if (states_in_place_) {
      mem.set_data_handle(t->raw_data());
    } else {
      Tensor& buf = i == 5 ? h0_buffer_ : c0_buffer_;
      transpose_state(t->data<float>(), buf.data<float>(), true);
      mem.set_data_handle(buf.raw_data());
    }
  }

  bool full_lengths(const Tensor& lens) const {
    if (!dtype_is_integer(lens.dtype()) || lens.shape() != Shape{s_.N}) return false;
    const std::vector<int64_t> v = tensor_to_int64s(lens);
    return std::all_of(v.begin(), v.end(), [&](int64_t len) { return len == s_.T; });
  }

  Shape input_shape(int i) const {
    const int64_t G = s_.a.gates, D = s_.D, H = s_.H;
    return i == 1 ? Shape{D, G * H, s_.I} : i == 2 ? Shape{D, G * H, H} : i == 3 ? Shape{D, 2 * G * H} : Shape{D, 3 * H};
  }

  // ONNX's W and R rearranged into plain ldigo in oneDNN's gate order and reordered into
  // the layout the primitive chose; the biases summed (Rbh kept apart for linear-before-
  // reset GRU), the peepholes reordered.
  void pack_weights(const Tensor& w, const Tensor& r, const Tensor* b, const Tensor* p) const {
    const bool lbr = s_.a.kind == RnnKind::gru && s_.a.linear_before_reset;
    const int64_t G = s_.a.gates, D = s_.D, H = s_.H;
    const int* gate = onnx_gate_order(s_.a.kind);
    auto pack = [&](const Tensor& onnx, int64_t k, memory& packed) {
      Tensor plain(DType::f32, {1, D, k, G, H});
      const Tensor c = onnx.contiguous();
      const float* src = c.data<float>();
      float* dst = plain.data<float>();
      for (int64_t d = 0; d < D; ++d)
        for (int64_t i = 0; i < k; ++i)
          for (int64_t g = 0; g < G; ++g)
            for (int64_t o = 0; o < H; ++o)
              dst[((d * k + i) * G + g) * H + o] = src[(d * G * H + gate[g] * H + o) * k + i];
      memory user(f32_md({1, D, k, G, H}, memory::format_tag::ldigo), dnnl_engine(), plain.raw_data());
      dnnl::reorder(user, packed).execute(stream_, user, packed);
      stream_.wait();
    };
    pack(w, s_.I, weights_layer_);
    pack(r, H, weights_iter_);
    float* bias = bias_value_.data<float>();
    std::fill_n(bias, bias_value_.numel(), 0.f);
    if (b) {
      const Tensor c = b->contiguous();
      for (int64_t d = 0; d < D; ++d) {
        const float* wb = c.data<float>() + d * 2 * G * H;
        const float* rb = wb + G * H;
        float* bd = bias + d * (G + (lbr ? 1 : 0)) * H;
        for (int64_t g = 0; g < G; ++g)
          for (int64_t o = 0; o < H; ++o) {
            const int64_t at = gate[g] * H + o;
            bd[g * H + o] = wb[at] + (lbr && g == 2 ? 0.f : rb[at]);
          }
        if (lbr) std::copy_n(rb + 2 * H, H, bd + 3 * H);
      }
    }
    if (p) {
      static const int peep_order[] = {0, 2, 1};  // oneDNN's i, f, o from ONNX's i, o, f
      const Tensor c = p->contiguous();
      for (int64_t d = 0; d < D; ++d)
        for (int g = 0; g < 3; ++g)
          std::copy_n(c.data<float>() + (d * 3 + peep_order[g]) * H, H, peep_value_.data<float>() + (d * 3 + g) * H);
    }
  }

  void setup(const KernelBuildInfo& info) {
    const auto& eng = dnnl_engine();
    stream_ = dnnl::stream(eng);
    const RnnSetup& s = s_;
    const bool lstm = s.a.kind == RnnKind::lstm, lbr = s.a.kind == RnnKind::gru && s.a.linear_before_reset;
    const bool batch_first = s.a.layout == 1;
    const int64_t G = s.a.gates, D = s.D, H = s.H, I = s.I;
    using tag = memory::format_tag;
    const tag seq_tag = batch_first ? tag::ntc : tag::tnc;
    const memory::desc src_layer_md = f32_md({s.T, s.N, I}, seq_tag);
    const memory::desc state_md = f32_md({1, D, s.N, H}, tag::ldnc);
    const memory::desc dst_layer_md = f32_md({s.T, s.N, D * H}, seq_tag);
    const memory::desc wl_md = f32_md({1, D, I, G, H}, tag::any), wi_md = f32_md({1, D, H, G, H}, tag::any);
    const memory::desc bias_md = f32_md({1, D, G + (lbr ? 1 : 0), H}, tag::ldgo);
    const memory::desc peep_md = s.has_p ? f32_md({1, D, 3, H}, tag::ldgo) : memory::desc();
    // States pass through only where a node has them; a zero descriptor makes oneDNN
    // start from zeros and skip the final state.
    states_in_ = s.has_h0 || s.has_c0;
    const auto& outs = info.node.outputs;
    states_out_ = (outs.size() > 1 && !outs[1].empty()) || (outs.size() > 2 && !outs[2].empty());
    const memory::desc src_iter_md = states_in_ ? state_md : memory::desc();
    const memory::desc dst_iter_md = states_out_ ? state_md : memory::desc();
    const auto dir = D == 2       ? dnnl::rnn_direction::bidirectional_concat
                     : s.a.reverse ? dnnl::rnn_direction::unidirectional_right2left
                                   : dnnl::rnn_direction::unidirectional_left2right;
    const auto prop = dnnl::prop_kind::forward_inference;
    dnnl::primitive_desc_base pd;
    switch (s.a.kind) {
      case RnnKind::lstm: {
        auto p = dnnl::lstm_forward::primitive_desc(
            dnnl::lstm_forward::desc(prop, dir, src_layer_md, src_iter_md, src_iter_md, wl_md, wi_md, peep_md,
                                     bias_md, dst_layer_md, dst_iter_md, dst_iter_md),
            eng);
        prim_ = dnnl::lstm_forward(p);
        pd = p;
        break;
      }
      case RnnKind::gru:
        if (lbr) {
          auto p = dnnl::lbr_gru_forward::primitive_desc(
              dnnl::lbr_gru_forward::desc(prop, dir, src_layer_md, src_iter_md, wl_md, wi_md, bias_md, dst_layer_md,
                                          dst_iter_md),
              eng);
          prim_ = dnnl::lbr_gru_forward(p);
          pd = p;
        } else {
          auto p = dnnl::gru_forward::primitive_desc(
              dnnl::gru_forward::desc(prop, dir, src_layer_md, src_iter_md, wl_md, wi_md, bias_md, dst_layer_md,
                                      dst_iter_md),
              eng);
          prim_ = dnnl::gru_forward(p);
          pd = p;
        }
        break;
      case RnnKind::rnn: {
        auto p = dnnl::vanilla_rnn_forward::primitive_desc(
            dnnl::vanilla_rnn_forward::desc(prop, s.activation, dir, src_layer_md, src_iter_md, wl_md, wi_md, bias_md,
                                            dst_layer_md, dst_iter_md, dnnl::rnn_flags::undef, s.alpha),
            eng);
        prim_ = dnnl::vanilla_rnn_forward(p);
        pd = p;
        break;
      }
    }

    weights_layer_ = owned_memory(pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_LAYER), eng, buffers_);
    weights_iter_ = owned_memory(pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS_ITER), eng, buffers_);
    bias_value_ = Tensor(DType::f32, {1, D, G + (lbr ? 1 : 0), H});
    bias_ = memory(bias_md, eng, bias_value_.raw_data());
    if (s.has_p) {
      peep_value_ = Tensor(DType::f32, {1, D, 3, H});
      peephole_ = memory(peep_md, eng, peep_value_.raw_data());
    }
    if (s.weights_constant) {
      const Tensor* b = s.has_b ? info.input(3).constant : nullptr;
      const Tensor* p = s.has_p ? info.input(7).constant : nullptr;
      pack_weights(*info.input(1).constant, *info.input(2).constant, b, p);
    }

    src_layer_ = memory(src_layer_md, eng, DNNL_MEMORY_NONE);
    dst_layer_ = memory(dst_layer_md, eng, DNNL_MEMORY_NONE);
    // ONNX's layouts equal oneDNN's except for a bidirectional Y of more than one batch
    // entry in layout 0 and batch-first states of more than one direction and entry.
    y_in_place_ = D == 1 || s.N == 1 || batch_first;
    states_in_place_ = D == 1 || s.N == 1 || !batch_first;
    if (!y_in_place_ || outs.empty() || outs[0].empty()) y_buffer_ = Tensor(DType::f32, {s.T, s.N, D * H});
    const Shape state_dims{D, s.N, H};
    if (states_in_) {
      src_iter_ = memory(state_md, eng, DNNL_MEMORY_NONE);
      if (lstm) src_iter_c_ = memory(state_md, eng, DNNL_MEMORY_NONE);
      zeros_ = Tensor(DType::f32, state_dims);
      std::fill_n(zeros_.data<float>(), zeros_.numel(), 0.f);
      if (!states_in_place_) h0_buffer_ = Tensor(DType::f32, state_dims), c0_buffer_ = Tensor(DType::f32, state_dims);
    }
    if (states_out_) {
      dst_iter_ = memory(state_md, eng, DNNL_MEMORY_NONE);
      if (lstm) dst_iter_c_ = memory(state_md, eng, DNNL_MEMORY_NONE);
      yh_buffer_ = Tensor(DType::f32, state_dims);
      if (lstm) yc_buffer_ = Tensor(DType::f32, state_dims);
    }
  }

  RnnSetup s_;
  std::unique_ptr<OpKernel> ref_;  // runs sequence_lens that differ from the sequence length
  dnnl::primitive prim_;
  bool states_in_ = false, states_out_ = false, y_in_place_ = true, states_in_place_ = true;
  mutable memory weights_layer_, weights_iter_;
  memory bias_, peephole_;
  mutable memory src_layer_, src_iter_, src_iter_c_, dst_layer_, dst_iter_, dst_iter_c_;
  std::vector<std::shared_ptr<Storage>> buffers_;  // behind the packed weights
  mutable Tensor bias_value_, peep_value_;
  Tensor zeros_;
  // Where an output or initial state is not in oneDNN's layout, or not wanted.
  mutable Tensor y_buffer_, yh_buffer_, yc_buffer_, h0_buffer_, c0_buffer_;
  mutable dnnl::stream stream_;
};

KernelDef rnn_def(const char* op) {
  KernelDef def;
  def.op_type = op;
  def.claim = [](const KernelBuildInfo& info) {
    RnnSetup s;
    if (auto why = rnn_setup(info, &s)) return Claim::no(*why);
    return Claim::yes();
  };
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    RnnSetup s;
    if (auto why = rnn_setup(info, &s))
      throw Error(ErrorCode::internal, info.node.describe() + ": cpu kernel built for a node it declines: " + *why);
    if (rnn_cells_suit(s)) return make_rnn_cell_kernel(info, s);
    return std::make_unique<DnnlRnnKernel>(info, std::move(s));
  };
  return def;
}

}  // namespace

void register_dnnl_rnn_kernels(KernelRegistry& r) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) r.add(rnn_def(op));
}

}  // namespace slim::cpu
