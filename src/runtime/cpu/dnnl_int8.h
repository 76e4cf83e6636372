// 8-bit convolutions and matrix products on oneDNN, exact in int32 on every CPU: the
// engine of the cpu provider's ConvInteger, MatMulInteger and slim:DynamicQuantizeConv,
// and what quantized models built by `slim quantize` run on.
//
// oneDNN's 8-bit kernels take an unsigned source with a zero point and signed weights
// without one. Other weights are split as w - w_zp = w8 + comp[oc]: w8 signed 8-bit
// (w - 128 for uint8 weights, w for int8 ones) goes to oneDNN, and comp[oc] (128 - w_zp,
// or -w_zp) times the window sum of (x - x_zp) is added to its int32 sums afterwards. A
// signed source is shifted to unsigned (x + 128, x_zp + 128).
// Without VNNI oneDNN multiplies with vpmaddubsw, which adds pairs of u8 x s8 products in
// int16 and saturates (on random uint8 data nearly every sum came out wrong). There each w8
// is split into halves hi + lo within [-64, 64], so no pair can saturate, and the
// source's channels (the matrix's K) are read twice: half the speed, the same sums.
// Weights that are pair-safe already (every |w8| <= 64: a pair's sum is at most
// 2 * 255 * 64 = 32640 < 32767, e.g. the 7-bit weights of `slim quantize --reduce-range`)
// are not split, and at plain AVX2 the direct convolution runs on them with vpmaddubsw +
// vpmaddwd in place of vpdpbusd: full speed, the same sums. A layer with one |w8| > 64 is
// split as before.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cpu/cpu_common.h"
#include "runtime/cpu/quantize.h"

namespace slim::cpu {

// The instruction that sums u8 x s8 products exactly in int32 (vpdpbusd) at the level
// oneDNN runs: AVX-512 VNNI (amx: with AMX tiles too), AVX-VNNI at AVX2 (unless
// SLIM_AVX_VNNI=0), or none: oneDNN then multiplies with vpmaddubsw, whose int16 pair sums
// saturate, and the weights are split unless pair-safe. Where there is one, slim's direct
// convolution (Int8Conv) runs requantized convolutions of one group on it (with AMX only
// those reducing fewer than 64 bytes per output, where AMX's tiles are mostly padding);
// at plain AVX2 it runs them on pair-safe weights with vpmaddubsw + vpmaddwd.
enum class Int8Dot { none, avx_vnni, avx512_vnni, amx };
Int8Dot int8_dot();

// Where the int32 sums of an 8-bit product go, in the layout ONNX gives the output (NCHW
// for a convolution, row-major [rows, N] for a matrix product): as they are (ConvInteger,
// MatMulInteger), dequantized in the order of the Cast, Mul, Add and Relu nodes this
// replaces: y = relu(float(sum) * scale[c] + bias[c]), each step rounded to f32, or
// requantized as QLinearConv/QLinearMatMul (ref and ONNX Runtime):
// q = saturate(round_half_even(float(sum + qbias[c]) * scale[c]) + zero_point), with
// scale[c] = x_scale * w_scale[c] / y_scale.
struct Int8Output {
  int32_t* sums = nullptr;
  float* values = nullptr;
  void* bytes = nullptr;           // requantized: uint8, or int8 when bytes_signed
  const float* scale = nullptr;    // one per output channel
  const float* bias = nullptr;     // one per output channel, or none
  const int32_t* qbias = nullptr;  // requantized: one per output channel, or none
  // Requantized: scale and qbias repeat with this period (a multiple of the channels and
  // of 16, so rows of fewer channels than vector lanes run as one vectorized run), or 0.
  int64_t period = 0;
  int32_t zero_point = 0;
  bool bytes_signed = false;
  bool relu = false;
  bool channels_last = false;  // values in NHWC instead of NCHW (convolutions)
  // Requantized: then each byte mapped through this 256-entry table (slim:QLinearConvLookup:
  // the activation after the convolution), rows at a time while they are in cache.
  const uint8_t* table = nullptr;
  // Requantized: then (slim:QLinearConvAdd) those bytes, at add_a's scale and zero point,
  // added to `residual` (bytes of the output's shape, NHWC, at add_b's) as slim:QLinearAdd
  // adds them, into bytes at add_c's, rows at a time while they are in cache.
  const uint8_t* residual = nullptr;
  QParams add_a, add_b, add_c;
};

// The private layout tag of 8-bit NHWC bytes of a 4-D NCHW shape: what QLinearConv hands
// on to its neighbours (and slim:QLookup passes through).
uint64_t int8_nhwc_layout(const Shape& nchw, DType t);

// A one-input 8-bit kernel of 4-D tensors that keeps its input's layout: it reads a
// neighbour's channels-last bytes (int8_nhwc_layout) and then writes channels-last itself
// (MaxPool, nearest Resize and DepthToSpace of bytes); compute() reads cl_x_ and cl_y_.
class ByteLayoutKernel : public OpKernel {
 public:
  ByteLayoutKernel(DType t, const Shape& x, const Shape& y)
      : t_(t),
        x_shape_(x),
        y_shape_(y),
        nhwc_x_(int8_nhwc_layout(x, t)),
        nhwc_y_(int8_nhwc_layout(y, t)) {}
  bool static_output(int i, DType* dtype, Shape* shape) const override {
    *dtype = t_;
    *shape = y_shape_;
    return i == 0;
  }
  bool accepts_private_input(int i, uint64_t layout) const override {
    return i == 0 && layout == nhwc_x_;
  }
  void use_private_input(int i, uint64_t) override { cl_x_ = i == 0; }
  uint64_t private_output_layout(int i) const override { return i == 0 && cl_x_ ? nhwc_y_ : 0; }
  void use_private_output(int i, uint64_t) override { cl_y_ = i == 0; }

 protected:
  const DType t_;
  const Shape x_shape_, y_shape_;
  bool cl_x_ = false, cl_y_ = false;

 private:
  const uint64_t nhwc_x_, nhwc_y_;
};

// A 2-D convolution (4-D tensors) with 8-bit weights [OC, IC / group, kh, kw], constant.
class Int8Conv {
 public:
  // w_zero_point: none, one value, or one per output channel, of w's type; `out`: what
  // run() writes, i32 sums, f32 values or u8/i8 requantized bytes.
  Int8Conv(const Node& node, const ConvGeometry& g, const Tensor& w, const Tensor* w_zero_point,
           bool signed_source, DType out);
  ~Int8Conv();
  // Working memory run() needs (thread_scratch: no kernel holds buffers of its own).
  size_t scratch_bytes() const;
  // x: the source (uint8 or int8 as built), NCHW, or NHWC when x_channels_last.
  void run(const KernelContext& ctx, const void* x, bool x_channels_last, int32_t x_zero_point,
           const Int8Output& out, void* scratch) const;
  const ConvGeometry& geometry() const { return g_; }
  // The path taken (for tests): weights split into halves; slim's direct convolution.
  bool split() const;
  bool direct() const;

 private:
  struct State;
  ConvGeometry g_;
  std::unique_ptr<State> s_;
};

// A matrix product A [rows, K] x B [K, N] with B constant 8-bit.
class Int8MatMul {
 public:
  // b_zero_point: none, one value, or one per column of B, of B's type.
  Int8MatMul(const Node& node, int64_t rows, const Tensor& b, const Tensor* b_zero_point,
             bool signed_a);
  ~Int8MatMul();
  size_t scratch_bytes() const;
  void run(const KernelContext& ctx, const void* a, int32_t a_zero_point, const Int8Output& out,
           void* scratch) const;
  bool split() const;  // weights split into halves (for tests)

 private:
  struct State;
  int64_t rows_, k_, n_;
  std::unique_ptr<State> s_;
};

}  // namespace slim::cpu
