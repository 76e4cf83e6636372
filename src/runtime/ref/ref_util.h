// Small helpers that ref kernels share: axis normalization, numpy broadcasting, and
// reading shape-like input tensors.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "slim/core/convert.h"
#include "slim/core/dispatch.h"
#include "slim/runtime/kernel.h"

namespace slim::ref {

// Normalizes a possibly negative axis into [0, rank); fails naming the node otherwise.
int normalize_axis(const KernelContext& ctx, int64_t axis, int rank);
int normalize_axis(const Node& node, int64_t axis, int rank);

// Numpy-style multidirectional broadcast of shapes; fails naming the node.
Shape broadcast_shapes(const KernelContext& ctx, const std::vector<Shape>& shapes);

// For each output element (row-major over `out`), the flat index into an input of shape
// `in` broadcast to `out` (in's rank <= out's rank).
std::vector<int64_t> broadcast_index_map(const Shape& in, const Shape& out);

// Strides (in elements) of `in` broadcast to `out`: 0 on broadcast dims.
Shape broadcast_strides(const Shape& in, const Shape& out);

// Fails (invalid_argument naming the node) unless `shape` is a shape a tensor can have:
// no negative dim and no overflow in its element count or its strides. Empty tensors
// count too, since their strides multiply the other dims.
void check_output_shape(const KernelContext& ctx, const Shape& shape);

// Writes values computed in double (or int64) into an output of any dtype, converting
// each element (f16/bf16 through float; integers by C++ conversion).
void write_doubles(Tensor& out, const std::vector<double>& v);
void write_ints(Tensor& out, const std::vector<int64_t>& v);

// Numpy matmul geometry: 1-D operands are promoted (and the promoted dim dropped from the
// output), leading dims broadcast as batch dims.
struct MatMulPlan {
  int64_t m = 0, k = 0, n = 0;
  Shape out_shape;
  int64_t batches = 1;
  std::vector<int64_t> a_batch, b_batch;  // per output batch, the batch index into A / B

  MatMulPlan(const KernelContext& ctx, const Shape& a_in, const Shape& b_in);
};

// Output dtypes and shapes of a node, computed from what compile knows of its inputs (every
// present input has a dtype and a static shape when this is called). Malformed inputs
// throw through ctx.fail, which leaves the outputs to the run.
using OutputInference =
    std::function<std::vector<std::pair<DType, Shape>>(const KernelBuildInfo& info, const KernelContext& ctx)>;

// def with a build step that infers the node's output shapes, so that compile does not run
// the kernel once on probe inputs to learn them: for the convolutions and matrix
// products such a probe was a full-size scalar forward pass (a 1024x1024 segmentation
// network spent over ten minutes compiling in it).
KernelDef with_inferred_outputs(KernelDef def, OutputInference infer);

// MT19937 drawing doubles in [0, 1) the way numpy's legacy RandomState does (53 bits from
// two 32-bit words), so a seeded Dropout reproduces the ONNX reference masks; normals by
// Marsaglia's polar method, as numpy's legacy gauss. Unseeded, it starts from the OS.
class UniformRng {
 public:
  explicit UniformRng(std::optional<uint32_t> seed) : rng_(seed ? *seed : std::random_device{}()) {}
  double operator()() {
    const uint32_t a = rng_() >> 5, b = rng_() >> 6;
    return (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
  }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double x1, x2, r2;
    do {
      x1 = 2 * (*this)() - 1;
      x2 = 2 * (*this)() - 1;
      r2 = x1 * x1 + x2 * x2;
    } while (r2 >= 1.0 || r2 == 0.0);
    const double f = std::sqrt(-2.0 * std::log(r2) / r2);
    spare_ = f * x1;
    has_spare_ = true;
    return f * x2;
  }

 private:
  std::mt19937 rng_;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace slim::ref
