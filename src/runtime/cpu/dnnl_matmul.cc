// MatMul, Gemm, slim:FusedMatMul and slim:FusedGemm on oneDNN's matmul primitive. The
// primitive is created at compile time for the static shapes; a constant B (the usual
// weight matrix) is packed once into the layout oneDNN chooses, a variable one (attention
// scores) is read in place. Gemm's alpha is an output scale, beta * C a constant
// prescaled at compile time and added as a binary post-op, like the fused residual.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_common.h"

namespace slim::cpu {
namespace {

using dnnl::memory;

enum class Kind { matmul, gemm, fused_matmul, fused_gemm };

struct MatMulSetup {
  Kind kind = Kind::matmul;
  Shape a, b, y;            // ONNX shapes
  Shape a_md, b_md, y_md;   // oneDNN dims (same rank, 1-D operands promoted)
  Shape a_str, b_str;       // element strides of A and B in their ONNX buffers
  bool b_constant = false;
  float alpha = 1.f, beta = 1.f;
  int c_input = -1;         // Gemm's C or FusedMatMul's bias: input 2
  Shape c_md;               // its oneDNN dims
  bool c_prescaled = false; // beta * C computed at compile time (kept in c_value)
  int z_input = -1;         // residual: input 3
  ActivationSpec act;
};

std::optional<std::string> matmul_setup(const KernelBuildInfo& info, Kind kind, MatMulSetup* s) {
  const Node& node = info.node;
  const bool gemm = kind == Kind::gemm || kind == Kind::fused_gemm;
  const bool fused = kind == Kind::fused_matmul || kind == Kind::fused_gemm;
  for (int i = 0; i < int(info.inputs.size()); ++i) {
    if (!info.input(i).present) continue;
    if (auto r = need_f32(info, i)) return r;
    if (auto r = need_static(info, i)) return r;
  }
  if (!info.has_input(0) || !info.has_input(1)) return std::string("missing A or B");
  if (info.inputs.size() > (fused ? 4u : gemm ? 3u : 2u)) return std::string("too many inputs");
  s->kind = kind;
  s->a = *info.input(0).shape;
  s->b = *info.input(1).shape;
  s->b_constant = info.input(1).constant != nullptr;
  for (int64_t v : s->a)
    if (v < 1) return std::string("empty A");
  for (int64_t v : s->b)
    if (v < 1) return std::string("empty B");
  if (gemm) {
    if (s->a.size() != 2 || s->b.size() != 2) return std::string("Gemm operands must be matrices");
    const bool ta = node.attr_int("transA", 0) != 0, tb = node.attr_int("transB", 0) != 0;
    s->alpha = node.attr_float("alpha", 1.f);
    s->beta = node.attr_float("beta", 1.f);
    const int64_t m = ta ? s->a[1] : s->a[0], k = ta ? s->a[0] : s->a[1];
    const int64_t kb = tb ? s->b[1] : s->b[0], n = tb ? s->b[0] : s->b[1];
    if (k != kb) return std::string("inner dimensions differ");
    s->a_md = {m, k};
    s->b_md = {k, n};
    s->a_str = ta ? Shape{1, m} : Shape{k, 1};
    s->b_str = tb ? Shape{1, k} : Shape{n, 1};
    s->y = {m, n};
    s->y_md = s->y;
  } else {
    if (s->a.empty() || s->b.empty()) return std::string("scalar operand");
    Shape a = s->a, b = s->b;
    const bool a1 = a.size() == 1, b1 = b.size() == 1;
    if (a1) a.insert(a.begin(), 1);
    if (b1) b.push_back(1);
    const size_t rank = std::max(a.size(), b.size());
    if (rank > 12) return std::string("rank above oneDNN's 12");
    while (a.size() < rank) a.insert(a.begin(), 1);
    while (b.size() < rank) b.insert(b.begin(), 1);
    if (a[rank - 1] != b[rank - 2]) return std::string("inner dimensions differ");
    Shape y(rank);
    for (size_t d = 0; d + 2 < rank; ++d) {
      if (a[d] != b[d] && a[d] != 1 && b[d] != 1) return std::string("batch dims do not broadcast");
      y[d] = std::max(a[d], b[d]);
    }
    y[rank - 2] = a[rank - 2];
    y[rank - 1] = b[rank - 1];
    s->a_md = a;
    s->b_md = b;
    s->a_str = contiguous_strides(a);
    s->b_str = contiguous_strides(b);
    s->y_md = y;
    // numpy's result: the broadcast batch dims, then M and N unless promoted from 1-D.
    const size_t batch = std::max(s->a.size() - (a1 ? 1 : 2), s->b.size() - (b1 ? 1 : 2));
    Shape out(y.end() - int64_t(batch) - 2, y.end() - 2);
    if (!a1) out.push_back(y[rank - 2]);
    if (!b1) out.push_back(y[rank - 1]);
    s->y = out;
    // A weight matrix B shared by every batch of a contiguous A (a transformer's
    // projections): one product of [batch * M, K] by [K, N], which oneDNN blocks better
    // than a batch of small ones (BERT's feed-forward at 8 x 128 tokens: 72-77 -> 87-94
    // GMAC/s).
    if (rank > 2 && std::all_of(b.begin(), b.end() - 2, [](int64_t v) { return v == 1; })) {
      const int64_t rows = shape_numel(Shape(a.begin(), a.end() - 1));
      s->a_md = {rows, a[rank - 1]};
      s->b_md = {b[rank - 2], b[rank - 1]};
      s->y_md = {rows, y[rank - 1]};
      s->a_str = contiguous_strides(s->a_md);
      s->b_str = contiguous_strides(s->b_md);
    }
  }
  const int64_t n = s->y_md.back();
  const size_t yr = s->y_md.size();
  if (info.has_input(2)) {
    s->c_input = 2;
    const Shape c = *info.input(2).shape;
    if (kind == Kind::fused_matmul) {
      if (shape_numel(c) != n || (!c.empty() && c.back() != n)) return std::string("bias is not a vector over the last axis");
      s->c_md = Shape(yr, 1);
      s->c_md.back() = n;
    } else {
      // C broadcasts to [M, N]: a row vector stays one, anything else is expanded (at
      // compile time when constant) so oneDNN sees a layout it supports.
      if (c.size() > 2) return std::string("C has rank above 2");
      Shape c2 = c;
      while (c2.size() < 2) c2.insert(c2.begin(), 1);
      for (size_t d = 0; d < 2; ++d)
        if (c2[d] != 1 && c2[d] != s->y[d]) return std::string("C does not broadcast to the output");
      const bool row = c2[0] == 1;
      s->c_md = row ? Shape{1, n} : s->y;
      if (info.input(2).constant) {
        s->c_prescaled = true;
        s->c_md = row ? Shape{1, n} : s->y;
      } else if (s->beta != 1.f || c2 != s->c_md) {
        return std::string("variable C needs beta 1 and a [N] or [M,N] shape");
      }
    }
  }
  if (fused) {
    if (info.has_input(3)) {
      if (*info.input(3).shape != s->y) return std::string("residual shape differs from the output");
      s->z_input = 3;
    }
    ActivationSpec a;
    if (!parse_fused_activation(node, &a))
      return std::string("unknown activation");
    s->act = a;
  }
  return std::nullopt;
}

// beta * C broadcast to `dims` (a [1,N] row or the full [M,N]).
Tensor prescaled_c(const Tensor& c, float beta, const Shape& dims) {
  Tensor out(DType::f32, dims);
  const Tensor cc = c.contiguous();
  const float* src = cc.data<float>();
  float* dst = out.data<float>();
  Shape c2 = cc.shape();
  while (c2.size() < 2) c2.insert(c2.begin(), 1);
  for (int64_t i = 0; i < dims[0]; ++i)
    for (int64_t j = 0; j < dims[1]; ++j)
      dst[i * dims[1] + j] = beta * src[(c2[0] == 1 ? 0 : i) * c2[1] + (c2[1] == 1 ? 0 : j)];
  return out;
}

class DnnlMatMulKernel final : public OpKernel {
 public:
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = DType::f32;
    *shape = s_.y;
    return i == 0;
  }
  DnnlMatMulKernel(const KernelBuildInfo& info, MatMulSetup s) : s_(std::move(s)) {
    limit_dnnl_threads_at_build(macs(), kMacsPerThread);
    dnnl_call(info.node, "matmul setup", [&] { setup(info); return 0; });
  }

  void compute(KernelContext& ctx) const override {
    check_input_shape(ctx, 0, s_.a);
    limit_dnnl_threads(ctx, macs(), kMacsPerThread);
    Tensor& y = ctx.output(0, DType::f32, s_.y);
    dnnl_call(ctx.node(), "matmul", [&] {
      a_mem_.set_data_handle(ctx.required_input(0).raw_data());
      y_mem_.set_data_handle(y.raw_data());
      if (!s_.b_constant) {
        check_input_shape(ctx, 1, s_.b);
        b_mem_.set_data_handle(ctx.required_input(1).raw_data());
      }
      if (s_.c_input >= 0 && !s_.c_prescaled) c_mem_.set_data_handle(ctx.required_input(s_.c_input).raw_data());
      if (s_.z_input >= 0) {
        check_input_shape(ctx, s_.z_input, s_.y);
        z_mem_.set_data_handle(ctx.required_input(s_.z_input).raw_data());
      }
      prim_.execute(stream_, args_);
      stream_.wait();
      return 0;
    });
  }

 private:
  void setup(const KernelBuildInfo& info) {
    const auto& eng = dnnl_engine();
    stream_ = dnnl::stream(eng);
    const memory::desc a_md = strided_md(s_.a_md, s_.a_str);
    const memory::desc b_user_md = strided_md(s_.b_md, s_.b_str);
    const memory::desc y_md = plain_md(s_.y_md);
    const memory::desc b_md =
        s_.b_constant ? memory::desc(to_dims(s_.b_md), memory::data_type::f32, memory::format_tag::any)
                      : b_user_md;
    dnnl::post_ops ops;
    int index = 0;
    memory::desc bias_md;
    if (s_.c_input >= 0) {
      if (s_.kind == Kind::fused_matmul) {
        bias_md = plain_md(s_.c_md);
      } else {
        ops.append_binary(dnnl::algorithm::binary_add, plain_md(s_.c_md));
        c_arg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1;
        ++index;
      }
    }
    if (s_.z_input >= 0) {
      ops.append_binary(dnnl::algorithm::binary_add, y_md);
      z_arg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1;
      ++index;
    }
    append_activation(ops, s_.act);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    if (s_.alpha != 1.f) attr.set_output_scales(0, {s_.alpha});
    dnnl::matmul::desc d = s_.kind == Kind::fused_matmul && s_.c_input >= 0
                               ? dnnl::matmul::desc(a_md, b_md, bias_md, y_md)
                               : dnnl::matmul::desc(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(d, attr, eng);
    prim_ = dnnl::matmul(pd);
    a_mem_ = memory(a_md, eng, DNNL_MEMORY_NONE);
    y_mem_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    if (s_.b_constant) {
      b_mem_ = owned_memory(pd.weights_desc(), eng, buffers_);
      memory user(b_user_md, eng, info.input(1).constant->raw_data());
      dnnl::reorder(user, b_mem_).execute(stream_, user, b_mem_);
      stream_.wait();
    } else {
      b_mem_ = memory(b_user_md, eng, DNNL_MEMORY_NONE);
    }
    if (s_.c_input >= 0) {
      if (s_.kind == Kind::fused_matmul) {
        c_arg_ = DNNL_ARG_BIAS;
        c_mem_ = memory(bias_md, eng, DNNL_MEMORY_NONE);
      } else if (s_.c_prescaled) {
        c_value_ = prescaled_c(*info.input(2).constant, s_.beta, s_.c_md);
        c_mem_ = memory(plain_md(s_.c_md), eng, c_value_.raw_data());
      } else {
        c_mem_ = memory(plain_md(s_.c_md), eng, DNNL_MEMORY_NONE);
      }
    }
    if (s_.z_input >= 0) z_mem_ = memory(y_md, eng, DNNL_MEMORY_NONE);
    // The memories are handles: a run sets their data and executes with these.
    args_ = {{DNNL_ARG_SRC, a_mem_}, {DNNL_ARG_WEIGHTS, b_mem_}, {DNNL_ARG_DST, y_mem_}};
    if (s_.c_input >= 0) args_.emplace(c_arg_, c_mem_);
    if (s_.z_input >= 0) args_.emplace(z_arg_, z_mem_);
  }

  // Multiply-adds: each output element is a dot product of length K.
  int64_t macs() const { return shape_numel(s_.y) * s_.a_md.back(); }

  MatMulSetup s_;
  dnnl::primitive prim_;
  mutable memory a_mem_, b_mem_, y_mem_, c_mem_, z_mem_;
  std::unordered_map<int, memory> args_;
  std::vector<std::shared_ptr<Storage>> buffers_;  // behind b_mem_
  int c_arg_ = 0, z_arg_ = 0;
  Tensor c_value_;
  mutable dnnl::stream stream_;
};

KernelDef matmul_def(const std::string& op, const std::string& domain, int64_t since, Kind kind) {
  KernelDef def;
  def.op_type = op;
  def.domain = domain;
  def.since_version = since;
  def.claim = [kind](const KernelBuildInfo& info) {
    MatMulSetup s;
    if (auto why = matmul_setup(info, kind, &s)) return Claim::no(*why);
    return Claim::yes();
  };
  def.build = [kind](const KernelBuildInfo& info) -> std::unique_ptr<OpKernel> {
    MatMulSetup s;
    if (auto why = matmul_setup(info, kind, &s))
      throw Error(ErrorCode::internal, info.node.describe() + ": cpu kernel built for a node it declines: " + *why);
    return std::make_unique<DnnlMatMulKernel>(info, std::move(s));
  };
  return def;
}

}  // namespace

void register_dnnl_matmul_kernels(KernelRegistry& r) {
  r.add(matmul_def("MatMul", "", 1, Kind::matmul));
  // Gemm before opset 7 has the `broadcast` attribute semantics; ref keeps those.
  r.add(matmul_def("Gemm", "", 7, Kind::gemm));
  r.add(matmul_def("FusedMatMul", kFusedDomain, kFusedOpset, Kind::fused_matmul));
  r.add(matmul_def("FusedGemm", kFusedDomain, kFusedOpset, Kind::fused_gemm));
}

}  // namespace slim::cpu
