#include "runtime/cpu/cpu_common.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <omp.h>

#include <cstdlib>
#include <string>

#include "slim/core/cpu_features.h"
#include "slim/core/thread_pool.h"

namespace slim::cpu {

namespace {
Isa g_dnnl_isa = Isa::scalar;  // the level oneDNN was held to (set with the engine)

#if defined(__x86_64__)
// AVX-VNNI: CPUID leaf 7, sub-leaf 1, EAX bit 4 (GCC 12's __builtin_cpu_supports("avxvnni")
// did not see it on a Sapphire Rapids).
bool cpu_has_avx_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 4) & 1;
}
#endif
}  // namespace

const dnnl::engine& dnnl_engine() {
  static const dnnl::engine engine = [] {
    g_dnnl_isa = active_isa();
    // oneDNN picks its kernels by cpuid on its own: hold it to slim's level, so that
    // SLIM_ISA / --isa covers the whole provider. It takes a limit only before its first
    // primitive, so the level active at the first compile stays for the process.
#if defined(__x86_64__)
    // At AVX2 a CPU with AVX-VNNI (vpdpbusd on 256-bit registers: Alder Lake, Sapphire
    // Rapids and later) keeps it: its u8 x s8 products are summed in int32 without the
    // int16 saturation of vpmaddubsw, so the 8-bit kernels need not split their weights
    // (half the work). SLIM_AVX_VNNI=0 holds oneDNN to plain AVX2 (that path's tests).
    const Isa isa = active_isa();
    if (isa != Isa::avx512) {
      const char* no_vnni = std::getenv("SLIM_AVX_VNNI");
      const bool vnni =
          isa == Isa::avx2 && cpu_has_avx_vnni() && !(no_vnni && std::string(no_vnni) == "0");
      dnnl::set_max_cpu_isa(isa == Isa::avx2
                                ? (vnni ? dnnl::cpu_isa::avx2_vnni : dnnl::cpu_isa::avx2)
                                : dnnl::cpu_isa::sse41);
    }
#endif
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

namespace {
// omp_set_num_threads sets the calling thread's value; skip the call when unchanged.
void limit_openmp(int n) {
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

int threads_for(int pool_threads, int64_t work, int64_t per_thread) {
  return int(std::clamp<int64_t>(work / per_thread, 1, std::max(pool_threads, 1)));
}
}  // namespace

void limit_dnnl_threads(const KernelContext& ctx, int64_t work, int64_t per_thread) {
  limit_openmp(threads_for(ctx.pool().num_threads(), work, per_thread));
}

void limit_dnnl_threads_at_build(int64_t work, int64_t per_thread) {
  limit_openmp(threads_for(num_threads(), work, per_thread));
}

dnnl::memory::dims to_dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

dnnl::memory::desc plain_md(const Shape& dims) {
  return strided_md(dims, contiguous_strides(dims));
}

dnnl::memory owned_memory(const dnnl::memory::desc& md, const dnnl::engine& eng,
                          std::vector<std::shared_ptr<Storage>>& keep) {
  keep.push_back(Storage::allocate(md.get_size()));
  return dnnl::memory(md, eng, keep.back()->data());
}

void* thread_scratch(size_t bytes) {
  thread_local std::shared_ptr<Storage> buffer;
  if (!buffer || buffer->bytes() < bytes) {
    buffer.reset();  // the old one first: peak memory is the new size, not both
    buffer = Storage::allocate(bytes);
  }
  return buffer->data();
}

dnnl::memory::desc strided_md(const Shape& dims, const Shape& strides) {
  return dnnl::memory::desc(to_dims(dims), dnnl::memory::data_type::f32, to_dims(strides));
}

void append_activation(dnnl::post_ops& ops, const ActivationSpec& a) {
  using A = dnnl::algorithm;
  switch (a.kind) {
    case Activation::none: break;
    case Activation::relu: ops.append_eltwise(1.f, A::eltwise_relu, 0.f, 0.f); break;
    case Activation::leaky_relu: ops.append_eltwise(1.f, A::eltwise_relu, a.p0, 0.f); break;
    case Activation::clip: ops.append_eltwise(1.f, A::eltwise_clip_v2, a.p0, a.p1); break;
    case Activation::sigmoid: ops.append_eltwise(1.f, A::eltwise_logistic, 0.f, 0.f); break;
    case Activation::hard_swish: ops.append_eltwise(1.f, A::eltwise_hardswish, 0.f, 0.f); break;
    case Activation::silu: ops.append_eltwise(1.f, A::eltwise_swish, 1.f, 0.f); break;
    case Activation::gelu: ops.append_eltwise(1.f, A::eltwise_gelu_erf, 0.f, 0.f); break;
    case Activation::gelu_tanh: ops.append_eltwise(1.f, A::eltwise_gelu_tanh, 0.f, 0.f); break;
    case Activation::tanh: ops.append_eltwise(1.f, A::eltwise_tanh, 0.f, 0.f); break;
  }
  if (a.has_affine()) ops.append_eltwise(1.f, A::eltwise_linear, a.scale, a.shift);
  if (a.has_clamp()) ops.append_eltwise(1.f, A::eltwise_clip_v2, a.lo, a.hi);
}

std::optional<std::string> need_f32(const KernelBuildInfo& info, int i) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return "input " + std::to_string(i) + " is missing";
  if (!in.dtype) return "dtype of input " + std::to_string(i) + " is unknown";
  if (*in.dtype != DType::f32)
    return "input " + std::to_string(i) + " is " + std::string(dtype_name(*in.dtype)) + ", only f32 is implemented";
  return std::nullopt;
}

std::optional<std::string> need_static(const KernelBuildInfo& info, int i) {
  const NodeInputInfo& in = info.input(i);
  if (!in.present) return "input " + std::to_string(i) + " is missing";
  if (!in.shape) return "shape of input " + std::to_string(i) + " is dynamic";
  return std::nullopt;
}

std::optional<std::string> need_all_f32_static(const KernelBuildInfo& info) {
  for (int i = 0; i < int(info.inputs.size()); ++i) {
    if (!info.input(i).present) continue;
    if (auto r = need_f32(info, i)) return r;
    if (auto r = need_static(info, i)) return r;
  }
  return std::nullopt;
}

void check_input_shape(const KernelContext& ctx, int i, const Shape& expected, DType dtype) {
  const Tensor& t = ctx.required_input(i);
  if (t.dtype() != dtype || t.shape() != expected)
    ctx.fail(ErrorCode::internal, "cpu kernel was compiled for input " + std::to_string(i) + " " +
                                      std::string(dtype_name(dtype)) + shape_str(expected) +
                                      " but got " + t.describe());
}

// Names a oneDNN memory layout: a hash of its descriptor (shape, strides, blocking).
uint64_t layout_tag(const dnnl::memory::desc& md) {
  const auto* p = reinterpret_cast<const unsigned char*>(&md.data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof md.data; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h | 1;  // never 0, which means "no private layout"
}

dnnl::memory::desc f32_md(const Shape& s, dnnl::memory::format_tag f) {
  return dnnl::memory::desc(to_dims(s), dnnl::memory::data_type::f32, f);
}

int64_t blocked_channels() {
  dnnl_engine();
  return g_dnnl_isa == Isa::avx512 ? 16 : 8;
}

dnnl::memory::format_tag blocked_layout() {
  return blocked_channels() == 16 ? dnnl::memory::format_tag::nChw16c : dnnl::memory::format_tag::nChw8c;
}

std::optional<dnnl::memory::format_tag> channel_layout(const Shape& s, uint64_t layout) {
  if (s.size() != 4) return std::nullopt;
  if (layout == layout_tag(f32_md(s, dnnl::memory::format_tag::nhwc))) return dnnl::memory::format_tag::nhwc;
  if (s[1] % blocked_channels() == 0 && layout == layout_tag(f32_md(s, blocked_layout()))) return blocked_layout();
  return std::nullopt;
}

float* ChannelPassThrough::target(Tensor& y) const {
  if (in_ == out_) return y.data<float>();
  if (!buf_) {
    const auto& eng = dnnl_engine();
    stream_ = dnnl::stream(eng);
    buf_ = owned_memory(f32_md(shape_, *channel_layout(shape_, in_)), eng, keep_);
    dst_ = dnnl::memory(plain_md(shape_), eng, DNNL_MEMORY_NONE);
    reorder_ = dnnl::reorder(buf_, dst_);
  }
  return static_cast<float*>(buf_.get_data_handle());
}

void ChannelPassThrough::finish(const KernelContext& ctx, Tensor& y) const {
  if (in_ == out_) return;
  limit_dnnl_threads(ctx, shape_numel(shape_), kElementsPerThread);
  dnnl_call(ctx.node(), "reorder to plain", [&] {
    dst_.set_data_handle(y.raw_data());
    reorder_.execute(stream_, buf_, dst_);
    stream_.wait();
    return 0;
  });
}

}  // namespace slim::cpu
