// Ref kernels of the fused ops (slim:FusedConv, FusedGemm, FusedMatMul,
// DynamicQuantizeConv). They are the oracle for every provider's fused kernels, so they
// compute exactly what the unfused chain does: the base op by its own ref kernel, then each elementwise step rounded to
// f32 in the order the graph had them (bias, residual, activation, output scale and shift).
#include "runtime/ref/ref_kernels.h"
#include "slim/core/convert.h"
#include "slim/core/error.h"
#include "slim/runtime/fused_ops.h"
#include "slim/runtime/provider.h"

namespace slim::ref {

namespace {

class FusedKernel final : public OpKernel {
 public:
  // `base` is the ai.onnx op computed first; `base_inputs` how many of the fused node's
  // inputs it takes; a MatMul's bias (input 2) is added afterwards instead. Given what
  // compile knows of the inputs (`info`), the base kernel is built from it, so the fused
  // node's output shape is the base kernel's inferred one.
  FusedKernel(const Node& node, const char* base, int base_inputs, int64_t base_opset,
              const KernelBuildInfo* info = nullptr)
      : base_node_(node), separate_bias_(std::string(base) == "MatMul") {
    const std::vector<float> params = node.attr_floats("activation_params");
    if (!parse_fused_activation(node, &activation_))
      throw Error(ErrorCode::invalid_model, node.describe() + ": unknown activation '" +
                                                node.attr_string("activation", "") +
                                                "' or wrong number of activation_params (" +
                                                std::to_string(params.size()) + ")");
    if (node.inputs.size() > 4)
      throw Error(ErrorCode::invalid_model, node.describe() + ": takes at most 4 inputs, got " +
                                                std::to_string(node.inputs.size()));
    base_node_.op_type = base;
    base_node_.domain = "";
    base_node_.attrs.erase("activation");
    base_node_.attrs.erase("activation_params");
    base_node_.attrs.erase("output_scale");
    base_node_.attrs.erase("output_shift");
    if (base_node_.inputs.size() > size_t(base_inputs))
      base_node_.inputs.resize(size_t(base_inputs));
    const KernelDef* def = ref_kernel_registry().find(base, "", base_opset);
    if (!def)
      throw Error(ErrorCode::internal,
                  node.describe() + ": no ref kernel for " + std::string(base));
    if (!info) {
      base_kernel_ = def->factory(base_node_, base_opset);
      return;
    }
    KernelBuildInfo base_info{base_node_, base_opset, info->inputs};
    base_info.inputs.resize(std::min(base_info.inputs.size(), base_node_.inputs.size()));
    base_kernel_ = build_kernel(*def, base_info);
  }

  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;  // the only dtype the epilogue computes
    return i == 0 && base_kernel_->static_output(0, dtype, shape) && *dtype == DType::f32;
  }

  void compute(KernelContext& ctx) const override {
    std::vector<const Tensor*> ins;
    for (size_t k = 0; k < base_node_.inputs.size(); ++k) ins.push_back(ctx.input(int(k)));
    std::vector<Tensor> outs(1);
    KernelContext base_ctx(base_node_, ins, &outs, nullptr, &ctx.pool());
    base_kernel_->compute(base_ctx);
    const Tensor y = outs[0].contiguous();
    if (y.dtype() != DType::f32)
      ctx.fail(ErrorCode::unsupported, "fused ops compute f32 only, got " + y.describe());
    const Tensor* bias = separate_bias_ ? ctx.input(2) : nullptr;
    const Tensor* z = ctx.input(3);
    const int64_t n = y.rank() > 0 ? y.shape().back() : 1;
    if (bias && (bias->dtype() != DType::f32 || bias->rank() != 1 || bias->numel() != n))
      ctx.fail(ErrorCode::invalid_argument,
               "bias must be f32[" + std::to_string(n) + "], got " + bias->describe());
    if (z && (z->dtype() != DType::f32 || z->shape() != y.shape()))
      ctx.fail(ErrorCode::invalid_argument,
               "residual must be " + y.describe() + ", got " + z->describe());
    Tensor& out = ctx.output(0, DType::f32, y.shape());
    const float* py = y.data<float>();
    const float* pb = bias ? bias->data<float>() : nullptr;
    const float* pz = z ? z->data<float>() : nullptr;
    float* po = out.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      float v = py[i];
      if (pb) v += pb[i % n];
      if (pz) v += pz[i];
      po[i] = apply_fused_epilogue(activation_, v);
    }
  }

 private:
  Node base_node_;  // the base op's node; its kernel may keep a reference to it
  bool separate_bias_;
  ActivationSpec activation_;
  std::unique_ptr<OpKernel> base_kernel_;
};

KernelDef fused_def(const char* op, const char* base, int base_inputs, int64_t base_opset) {
  KernelFactory f = [base, base_inputs, base_opset](const Node& n,
                                                    int64_t) -> std::unique_ptr<OpKernel> {
    return std::make_unique<FusedKernel>(n, base, base_inputs, base_opset);
  };
  KernelDef def{op, kFusedDomain, kFusedOpset, INT_MAX, f, {}};
  def.build = [base, base_inputs, base_opset](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<FusedKernel>(info.node, base, base_inputs, base_opset, &info);
  };
  return def;
}

// slim:DynamicQuantizeConv: the ref DynamicQuantizeLinear and ConvInteger kernels, then
// the Cast, Mul and Add the node replaces and its activation, each rounded to f32:
// act(float(sum) * (x_scale * w_scale[oc]) + bias[oc]).
class DynamicQuantizeConvKernel final : public OpKernel {
 public:
  DynamicQuantizeConvKernel(const Node& node, const KernelBuildInfo* info) : conv_node_(node) {
    if (!parse_fused_activation(node, &activation_))
      throw Error(ErrorCode::invalid_model, node.describe() + ": unknown activation '" +
                                                node.attr_string("activation", "") + "'");
    if (node.inputs.size() < 4 || node.inputs.size() > 5)
      throw Error(ErrorCode::invalid_model, node.describe() +
                                                ": takes 4 or 5 inputs (x, w, w_zero_point, w_scale, [bias]), got " +
                                                std::to_string(node.inputs.size()));
    quant_node_.op_type = "DynamicQuantizeLinear";
    quant_node_.name = node.name;
    quant_node_.inputs = {node.inputs[0]};
    quant_node_.outputs = {"q", "s", "z"};
    conv_node_.op_type = "ConvInteger";
    conv_node_.domain = "";
    for (const char* a : {"activation", "activation_params", "output_scale", "output_shift", "output_min", "output_max"})
      conv_node_.attrs.erase(a);
    conv_node_.inputs = {"q", node.inputs[1], "z", node.inputs[2]};
    conv_node_.outputs = {"sums"};
    const auto& r = ref_kernel_registry();
    quant_ = r.find("DynamicQuantizeLinear", "", 11)->factory(quant_node_, 11);
    const KernelDef* conv = r.find("ConvInteger", "", 10);
    if (!info) {
      conv_ = conv->factory(conv_node_, 10);
      return;
    }
    // Built with what compile knows, the ConvInteger kernel infers the output shape.
    KernelBuildInfo conv_info{conv_node_, 10, {}};
    conv_info.inputs = {info->input(0), info->input(1), NodeInputInfo{}, info->input(2)};
    conv_info.inputs[0].dtype = DType::u8;
    conv_info.inputs[0].constant = nullptr;
    conv_info.inputs[2].present = true;
    conv_info.inputs[2].dtype = DType::u8;
    conv_info.inputs[2].shape = Shape{};
    conv_ = build_kernel(*conv, conv_info);
  }

  bool static_output(int i, DType* dtype, Shape* shape) const override {
    if (i != 0 || !conv_->static_output(0, dtype, shape)) return false;
    *dtype = DType::f32;
    return true;
  }

  void compute(KernelContext& ctx) const override {
    std::vector<Tensor> q(3), sums(1);
    const std::vector<const Tensor*> quant_in{ctx.input(0)};
    KernelContext quant_ctx(quant_node_, quant_in, &q, nullptr, &ctx.pool());
    quant_->compute(quant_ctx);
    const std::vector<const Tensor*> conv_in{&q[0], ctx.input(1), &q[2], ctx.input(2)};
    KernelContext conv_ctx(conv_node_, conv_in, &sums, nullptr, &ctx.pool());
    conv_->compute(conv_ctx);
    const Tensor& acc = sums[0];
    const int64_t m = acc.shape()[1], plane = acc.numel() / std::max<int64_t>(1, acc.shape()[0] * m);
    const Tensor& w_scale = ctx.required_input(3);
    const Tensor* bias = ctx.input(4);
    for (const Tensor* t : {&w_scale, bias})
      if (t && (t->dtype() != DType::f32 || (t->numel() != 1 && t->numel() != m) || (t == bias && t->numel() != m)))
        ctx.fail(ErrorCode::invalid_argument, (t == bias ? "bias " : "w_scale ") + t->describe() +
                                                  " must be f32 with one value per output channel");
    const float x_scale = q[1].data<float>()[0];
    Tensor& out = ctx.output(0, DType::f32, acc.shape());
    for (int64_t i = 0; i < acc.numel(); ++i) {
      const int64_t c = i / plane % m;
      const float scale = x_scale * w_scale.data<float>()[w_scale.numel() == 1 ? 0 : c];
      // volatile: the product is rounded before the bias is added, never one FMA.
      volatile float product = float(acc.data<int32_t>()[i]) * scale;
      float v = product;
      if (bias) v = v + bias->data<float>()[c];
      out.data<float>()[i] = apply_fused_epilogue(activation_, v);
    }
  }

 private:
  Node quant_node_, conv_node_;
  ActivationSpec activation_;
  std::unique_ptr<OpKernel> quant_, conv_;
};

KernelDef dynamic_quantize_conv_def() {
  KernelDef def{"DynamicQuantizeConv", kFusedDomain, kFusedOpset, INT_MAX,
                [](const Node& n, int64_t) -> std::unique_ptr<OpKernel> {
                  return std::make_unique<DynamicQuantizeConvKernel>(n, nullptr);
                },
                {}};
  def.build = [](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    return std::make_unique<DynamicQuantizeConvKernel>(info.node, &info);
  };
  return def;
}

// slim:QLookup: Y[i] = T[X[i]'s byte].
class QLookupKernel final : public OpKernel {
 public:
  void compute(KernelContext& ctx) const override {
    const Tensor x = ctx.required_input(0).contiguous();
    const Tensor& t = ctx.required_input(1);
    if ((x.dtype() != DType::u8 && x.dtype() != DType::i8) ||
        (t.dtype() != DType::u8 && t.dtype() != DType::i8) || t.numel() != 256)
      ctx.fail(ErrorCode::invalid_argument, "takes 8-bit X and a table of 256 8-bit values, got " +
                                                x.describe() + " and " + t.describe());
    const Tensor tc = t.contiguous();
    const auto* table = static_cast<const uint8_t*>(tc.raw_data());
    const auto* in = static_cast<const uint8_t*>(x.raw_data());
    auto* out = static_cast<uint8_t*>(ctx.output(0, t.dtype(), x.shape()).raw_data());
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = table[in[i]];
  }
};

// slim:QLinearAdd / slim:QLinearMul: ref's DequantizeLinear of A and B, the Add or Mul,
// and QuantizeLinear, as the nodes they replace.
class QLinearBinaryKernel final : public OpKernel {
 public:
  explicit QLinearBinaryKernel(const Node& node) {
    if (node.inputs.size() != 8)
      throw Error(ErrorCode::invalid_model, node.describe() + ": takes 8 inputs (A, A_scale, A_zero_point, "
                                                              "B, B_scale, B_zero_point, C_scale, C_zero_point)");
    const auto& r = ref_kernel_registry();
    for (int k = 0; k < 2; ++k) {
      dq_node_[k].op_type = "DequantizeLinear";
      dq_node_[k].inputs = {"x", "s", "z"};
      dq_node_[k].outputs = {"y"};
      dq_[k] = r.find("DequantizeLinear", "", 19)->factory(dq_node_[k], 19);
    }
    op_node_.op_type = node.op_type == "QLinearAdd" ? "Add" : "Mul";
    op_node_.inputs = {"a", "b"};
    op_node_.outputs = {"c"};
    op_ = r.find(op_node_.op_type, "", 14)->factory(op_node_, 14);
    q_node_.op_type = "QuantizeLinear";
    q_node_.inputs = {"x", "s", "z"};
    q_node_.outputs = {"y"};
    q_ = r.find("QuantizeLinear", "", 19)->factory(q_node_, 19);
  }
  void compute(KernelContext& ctx) const override {
    std::vector<Tensor> f(2), c(1), y(1);
    for (int k = 0; k < 2; ++k) {
      std::vector<Tensor> out(1);
      const std::vector<const Tensor*> in{ctx.input(3 * k), ctx.input(3 * k + 1), ctx.input(3 * k + 2)};
      KernelContext dq(dq_node_[k], in, &out, nullptr, &ctx.pool());
      dq_[k]->compute(dq);
      f[size_t(k)] = out[0];
    }
    const std::vector<const Tensor*> op_in{&f[0], &f[1]}, q_in{&c[0], ctx.input(6), ctx.input(7)};
    KernelContext op(op_node_, op_in, &c, nullptr, &ctx.pool());
    op_->compute(op);
    KernelContext q(q_node_, q_in, &y, nullptr, &ctx.pool());
    q_->compute(q);
    ctx.set_output(0, y[0]);
  }

 private:
  Node dq_node_[2], op_node_, q_node_;
  std::unique_ptr<OpKernel> dq_[2], op_, q_;
};

// slim:QLinearConvLookup, slim:QLinearConvAdd and slim:QLinearMulAdd (fused_ops.h): ref's
// QLinearConv of the first nine inputs (slim:QLinearMul of the first eight), then each byte
// through the table (the convolutions' input 9; the Add's may be ""), then (the Adds) ref's
// slim:QLinearAdd of those bytes and the last seven inputs.
class QLinearEpilogueKernel final : public OpKernel {
 public:
  explicit QLinearEpilogueKernel(const Node& node)
      : mul_(node.op_type == "QLinearMulAdd"), add_(node.op_type != "QLinearConvLookup") {
    const size_t want = add_ ? (mul_ ? 15 : 17) : 10;
    if (node.inputs.size() != want)
      throw Error(ErrorCode::invalid_model,
                  node.describe() + ": takes " + std::to_string(want) + " inputs (fused_ops.h)");
    base_node_ = node;
    base_node_.inputs.resize(mul_ ? 8 : 9);
    if (mul_) {
      base_node_.op_type = "QLinearMul";
      base_ = std::make_unique<QLinearBinaryKernel>(base_node_);
    } else {
      base_node_.op_type = "QLinearConv";
      base_node_.domain.clear();
      while (!base_node_.inputs.empty() && base_node_.inputs.back().empty())
        base_node_.inputs.pop_back();
      base_ = ref_kernel_registry().find("QLinearConv", "", 10)->factory(base_node_, 10);
    }
    if (add_) {
      add_node_.op_type = "QLinearAdd";
      add_node_.domain = kFusedDomain;
      add_node_.inputs.assign(8, "");
      add_node_.outputs = node.outputs;
      binary_ = std::make_unique<QLinearBinaryKernel>(add_node_);
    }
  }
  void compute(KernelContext& ctx) const override {
    std::vector<const Tensor*> in;
    for (size_t i = 0; i < base_node_.inputs.size(); ++i) in.push_back(ctx.input(int(i)));
    std::vector<Tensor> out(1);
    KernelContext c(base_node_, in, &out, nullptr, &ctx.pool());
    base_->compute(c);
    Tensor y = out[0].contiguous();
    if (const Tensor* t = mul_ ? nullptr : add_ ? ctx.input(9) : &ctx.required_input(9)) {
      if ((t->dtype() != DType::u8 && t->dtype() != DType::i8) || t->numel() != 256)
        ctx.fail(ErrorCode::invalid_argument,
                 "the table must be 256 8-bit values, got " + t->describe());
      const Tensor tc = t->contiguous();
      const auto* table = static_cast<const uint8_t*>(tc.raw_data());
      const auto* src = static_cast<const uint8_t*>(y.raw_data());
      Tensor mapped(t->dtype(), y.shape());
      auto* dst = static_cast<uint8_t*>(mapped.raw_data());
      for (int64_t i = 0; i < y.numel(); ++i) dst[i] = table[src[i]];
      y = mapped;
    }
    if (!add_) {
      ctx.set_output(0, y);
      return;
    }
    std::vector<const Tensor*> add_in = {&y};
    const int from = mul_ ? 8 : 10;
    for (int i = from; i < from + 7; ++i) add_in.push_back(ctx.input(i));
    std::vector<Tensor> sum(1);
    KernelContext a(add_node_, add_in, &sum, nullptr, &ctx.pool());
    binary_->compute(a);
    ctx.set_output(0, sum[0]);
  }

 private:
  bool mul_, add_;
  Node base_node_, add_node_;
  std::unique_ptr<OpKernel> base_, binary_;
};

// slim:QLinearGlobalAveragePool (fused_ops.h): int32 sums per channel, requantized once.
class QLinearGlobalAveragePoolKernel final : public OpKernel {
 public:
  void compute(KernelContext& ctx) const override {
    const Tensor x = ctx.required_input(0).contiguous();
    if ((x.dtype() != DType::u8 && x.dtype() != DType::i8) || x.rank() < 3)
      ctx.fail(ErrorCode::invalid_argument, "takes 8-bit X [N, C, spatial...], got " + x.describe());
    auto scale_at = [&](int i) {
      const Tensor s = ctx.required_input(i).contiguous();
      if (s.dtype() != DType::f32 || s.numel() != 1)
        ctx.fail(ErrorCode::invalid_argument, "scales are f32 scalars, got " + s.describe());
      return s.data<float>()[0];
    };
    auto zero_at = [&](int i) { return ctx.input(i) ? tensor_to_int64s(*ctx.input(i)).at(0) : 0; };
    const Tensor* yz = ctx.input(4);
    const DType yt = yz ? yz->dtype() : DType::u8;
    Shape ys = x.shape();
    std::fill(ys.begin() + 2, ys.end(), 1);
    uint8_t* y = static_cast<uint8_t*>(ctx.output(0, yt, ys).raw_data());
    const int64_t rows = ys[0] * ys[1], n = rows ? x.numel() / rows : 0;
    const float scale = scale_at(1) / (scale_at(3) * float(n));
    const int64_t xz = zero_at(2), z = zero_at(4);
    const int64_t lo = yt == DType::i8 ? -128 : 0, hi = yt == DType::i8 ? 127 : 255;
    const auto* in = static_cast<const uint8_t*>(x.raw_data());
    for (int64_t r = 0; r < rows; ++r) {
      int64_t sum = -n * xz;
      for (int64_t i = 0; i < n; ++i)
        sum += x.dtype() == DType::i8 ? int64_t(int8_t(in[r * n + i])) : int64_t(in[r * n + i]);
      y[r] = uint8_t(std::clamp<int64_t>(int64_t(std::nearbyint(float(sum) * scale)) + z, lo, hi));
    }
  }
};

KernelDef simple_fused_def(const char* op, std::function<std::unique_ptr<OpKernel>(const Node&)> make) {
  return KernelDef{op, kFusedDomain, kFusedOpset, INT_MAX,
                   [make](const Node& n, int64_t) -> std::unique_ptr<OpKernel> { return make(n); },
                   {}};
}

}  // namespace

void register_fused_kernels(KernelRegistry& r) {
  // Base opsets: the current definitions (Gemm without the legacy broadcast attribute).
  r.add(fused_def("FusedConv", "Conv", 3, 11));
  r.add(fused_def("FusedGemm", "Gemm", 3, 13));
  r.add(fused_def("FusedMatMul", "MatMul", 2, 13));
  r.add(dynamic_quantize_conv_def());
  r.add(simple_fused_def("QLookup", [](const Node&) { return std::make_unique<QLookupKernel>(); }));
  r.add(simple_fused_def("QLinearGlobalAveragePool",
                         [](const Node&) { return std::make_unique<QLinearGlobalAveragePoolKernel>(); }));
  for (const char* op : {"QLinearConvLookup", "QLinearConvAdd", "QLinearMulAdd"})
    r.add(simple_fused_def(
        op, [](const Node& n) { return std::make_unique<QLinearEpilogueKernel>(n); }));
  for (const char* op : {"QLinearAdd", "QLinearMul"})
    r.add(simple_fused_def(op, [](const Node& n) { return std::make_unique<QLinearBinaryKernel>(n); }));
}

}  // namespace slim::ref
