// Shared pieces of the cpu provider: kernel group registration, the oneDNN engine and
// thread control, the fused-activation mapping, and the claim helpers that decline
// nodes the provider does not cover (with a reason for `slim inspect --partition`).
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>

#include <optional>
#include <string>
#include <vector>

#include "slim/runtime/fused_ops.h"
#include "slim/runtime/kernel.h"

namespace slim::cpu {

void register_dnnl_conv_kernels(KernelRegistry& r);    // dnnl_conv.cc
void register_dnnl_matmul_kernels(KernelRegistry& r);  // dnnl_matmul.cc
void register_dnnl_pool_kernels(KernelRegistry& r);    // dnnl_pool.cc
void register_dnnl_rnn_kernels(KernelRegistry& r);     // dnnl_rnn.cc
void register_elementwise_kernels(KernelRegistry& r);  // elementwise.cc
void register_resize_kernels(KernelRegistry& r);       // resize.cc
void register_tensor_kernels(KernelRegistry& r);       // tensor.cc
void register_matmul_nbits_kernels(KernelRegistry& r); // matmul_nbits.cc
void register_contrib_kernels(KernelRegistry& r);      // contrib.cc
void register_quantize_kernels(KernelRegistry& r);     // quantize.cc
void register_dnnl_int8_kernels(KernelRegistry& r);    // dnnl_int8.cc

// The process-wide oneDNN CPU engine.
const dnnl::engine& dnnl_engine();

// Debian's libdnnl runs its primitives on OpenMP. Each execute first limits OpenMP to
// the size of slim's pool (SessionOptions::num_threads), so the two never run more
// threads than asked for; slim's pool is idle while a oneDNN primitive runs. A primitive
// (and a loop of the provider's own, parallel_items) gets one thread per `per_thread`
// units of its `work`, at least one: work that takes a core less than some 50 us runs
// on the calling thread alone, since a parallel region's fork and barrier cost more than
// they save there, and on a busy machine the barrier waits milliseconds for a thread
// without a core (at 2 threads on a loaded 2-core machine, silero-vad-v4's 0.1-0.5M
// multiply-add convolutions made a 0.4 ms run take 240 ms, and openWakeWord's mel
// front end took 100-140 ms with its 76K-element elementwise nodes split, 10-24 ms
// without).
inline constexpr int64_t kMacsPerThread = int64_t(2) << 20;
inline constexpr int64_t kElementsPerThread = int64_t(1) << 18;  // elementwise math, reorders
inline constexpr int64_t kBytesPerThread = int64_t(1) << 19;     // copies
void limit_dnnl_threads(const KernelContext& ctx, int64_t work, int64_t per_thread);
// oneDNN plans a primitive's threads when the primitive is created, from OpenMP's thread
// count at that moment: kernels call this, with the work they execute with, before
// creating primitives, so they plan for the compiling session's count (Session::compile
// sets slim's pool to it).
void limit_dnnl_threads_at_build(int64_t work, int64_t per_thread);

// Calls fn(begin, end) over [0, n) items of `cost` units each (bytes or elements: tasks
// of fewer than `grain` units are not worth a thread), split over the session's thread
// count. The provider's own kernels run on the same OpenMP threads as oneDNN's
// primitives: on slim's pool they competed with OpenMP workers still spinning after the
// primitive before them, and two threads were slower than one.
template <typename Fn>
void parallel_items(const KernelContext& ctx, int64_t n, int64_t cost, int64_t grain, Fn&& fn) {
  const int threads = int(std::min<int64_t>(ctx.pool().num_threads(), n * std::max<int64_t>(cost, 1) / grain));
  if (threads < 2 || n < 2) {
    fn(int64_t(0), n);
    return;
  }
  limit_dnnl_threads(ctx, n * std::max<int64_t>(cost, 1), grain);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    fn(n * t / nt, n * (t + 1) / nt);
  }
}

// A convolution's geometry from its attributes and static shapes, in oneDNN's terms:
// dilations count from 0, pads are resolved from auto_pad (and, for ConvTranspose, from
// output_padding / output_shape). Returns why oneDNN cannot run it (ref then runs the
// node and reports any real error in its attributes). dnnl_conv.cc.
struct ConvGeometry {
  int64_t group = 1;
  Shape x, w, y;
  Shape stride, dil, pad_l, pad_r;
};
std::optional<std::string> conv_geometry(const Node& node, const Shape& x, const Shape& w, bool transposed,
                                         ConvGeometry* g);

dnnl::memory::dims to_dims(const Shape& s);
// A plain f32 memory descriptor: row-major, or with explicit element strides.
dnnl::memory::desc plain_md(const Shape& dims);
dnnl::memory::desc strided_md(const Shape& dims, const Shape& strides);
// A memory of this layout in a tensor buffer of slim's own (Storage::allocate: large
// buffers on huge pages, reused after free), kept alive by `keep`, instead of oneDNN's
// allocator: the packed weights and private layouts a kernel owns are activation- or
// weight-sized, and faulting them in 4 KiB at a time dominated compile time.
dnnl::memory owned_memory(const dnnl::memory::desc& md, const dnnl::engine& eng,
                          std::vector<std::shared_ptr<Storage>>& keep);

// Working memory for one kernel's compute on the calling thread, at least `bytes`,
// 64-byte aligned. A session runs its steps one at a time, so every kernel that runs on a
// thread can share one buffer (grown to the largest request, kept for the thread's life)
// instead of each holding its own: the 8-bit convolutions of a 1024x1024 network would
// otherwise keep gigabytes of source and sum buffers. A kernel must not call it again
// (or run another kernel) while it uses the buffer.
void* thread_scratch(size_t bytes);

// Names a oneDNN memory layout for OpKernel::private_output_layout: a hash of its
// descriptor (shape, strides, blocking), never 0.
uint64_t layout_tag(const dnnl::memory::desc& md);
// oneDNN's blocked channel layout at the level it was held to (see dnnl_engine): nChw16c
// with AVX-512, nChw8c below (AVX2's kernels, pooling among them, block by 8; held to
// AVX2, convolutions chose nChw8c and pooling, handed plain NCHW, ran oneDNN's reference
// loop: SqueezeNet's three MaxPools 0.9 ms -> 58 ms).
int64_t blocked_channels();
dnnl::memory::format_tag blocked_layout();
// The oneDNN format a private layout of a 4-D f32 value of shape s is, when it is one that
// layout-agnostic kernels (Concat, pooling) read: channels-last (nhwc) or, when the
// channels are a multiple of blocked_channels(), blocked_layout().
std::optional<dnnl::memory::format_tag> channel_layout(const Shape& s, uint64_t layout);
dnnl::memory::desc f32_md(const Shape& s, dnnl::memory::format_tag f);

// For elementwise kernels whose output element depends on the same element of one 4-D
// input alone (activations, Clip, a binary op with a one-element operand): they read
// that input in a neighbour's channel layout as it is (channel_layout: the same bytes as
// plain, in another order) and offer it on for their output, so a convolution, an
// activation oneDNN cannot fuse and the next convolution keep their layout. When the
// output's readers take plain only, the result is computed into a buffer in the input's
// layout and reordered.
class ChannelPassThrough {
 public:
  void set_shape(const Shape& s) { shape_ = s; }
  bool accepts(uint64_t layout) const { return channel_layout(shape_, layout).has_value(); }
  void use_input(uint64_t layout) { in_ = layout; }
  uint64_t offer() const { return in_; }
  void use_output(uint64_t layout) { out_ = layout; }
  // Where the elementwise results go: y itself, or the buffer finish() reorders into y.
  float* target(Tensor& y) const;
  void finish(const KernelContext& ctx, Tensor& y) const;

 private:
  Shape shape_;
  uint64_t in_ = 0, out_ = 0;
  mutable std::vector<std::shared_ptr<Storage>> keep_;
  mutable dnnl::memory buf_, dst_;
  mutable dnnl::reorder reorder_;
  mutable dnnl::stream stream_;
};

// Adds the activation, output affine and clamp as eltwise post-ops (none adds nothing).
void append_activation(dnnl::post_ops& ops, const ActivationSpec& a);

// Claim helpers: decline unless input i is present with a known f32 dtype / static shape.
// They return the reason, or nullopt when the condition holds.
std::optional<std::string> need_f32(const KernelBuildInfo& info, int i);
std::optional<std::string> need_static(const KernelBuildInfo& info, int i);
// All present inputs f32 with static shapes.
std::optional<std::string> need_all_f32_static(const KernelBuildInfo& info);

// Runs a oneDNN call and turns its exception into a slim::Error naming the node.
template <typename Fn>
auto dnnl_call(const Node& node, const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::internal, node.describe() + ": oneDNN " + what + " failed: " + e.what());
  }
}

// The output shape the kernel was built for; a different one at run time means compile
// and run disagree, which is slim's bug, not the caller's.
void check_input_shape(const KernelContext& ctx, int i, const Shape& expected,
                       DType dtype = DType::f32);

}  // namespace slim::cpu
