// Private helpers of the ref provider's math kernels (elementwise, reductions, norms,
// matmul, losses): dtype classes, the compute type of each storage type, kernels built
// from lambdas, and broadcasting plans.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/ref/ref_util.h"
#include "slim/core/dispatch.h"

namespace slim::ref {

// f16/bf16 are computed in float and rounded back; every other type computes as itself.
template <typename T>
struct ComputeTypeOf {
  using type = T;
};
template <>
struct ComputeTypeOf<Half> {
  using type = float;
};
template <>
struct ComputeTypeOf<BFloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeTypeOf<T>::type;

template <typename T>
inline constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                 std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
inline constexpr bool kIsBool = std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool kIsSignedInt = std::is_integral_v<T>&& std::is_signed_v<T> && !kIsBool<T>;
template <typename T>
inline constexpr bool kIsUnsignedInt = std::is_integral_v<T>&& std::is_unsigned_v<T> && !kIsBool<T>;

// Dtype classes an op accepts, as a bit mask (checked at compile time to instantiate
// only the valid combinations, and at run time to reject the others by name).
enum TypeClass : int {
  kFloat = 1,
  kSigned = 2,
  kUnsigned = 4,
  kBool = 8,
  kInt = kSigned | kUnsigned,
  kNumeric = kFloat | kInt,
  kAll = kNumeric | kBool,
};

template <typename T>
constexpr bool in_class(int mask) {
  return ((mask & kFloat) && kIsFloat<T>) || ((mask & kSigned) && kIsSignedInt<T>) ||
         ((mask & kUnsigned) && kIsUnsignedInt<T>) || ((mask & kBool) && kIsBool<T>);
}

[[noreturn]] inline void fail_dtype(const KernelContext& ctx, DType t, const char* what) {
  ctx.fail(ErrorCode::unsupported,
           std::string(what) + " of dtype " + std::string(dtype_name(t)) + " is not supported");
}

// Calls fn(TypeTag<T>) for a dtype in `Mask`, fails naming the node for the others.
template <int Mask, typename Fn>
void visit_class(const KernelContext& ctx, DType t, const char* what, Fn&& fn) {
  visit_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (in_class<T>(Mask)) {
      fn(tag);
    } else {
      fail_dtype(ctx, t, what);
    }
  });
}

// Element pointers of a contiguous tensor for any storage type (Half/BFloat16 included,
// which Tensor::data<T> cannot name).
template <typename T>
const T* elems(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* elems_mut(Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// A kernel whose compute is a lambda holding the attributes the factory parsed.
template <typename Fn>
std::unique_ptr<OpKernel> make_kernel(Fn fn) {
  struct K final : OpKernel {
    explicit K(Fn f) : f(std::move(f)) {}
    void compute(KernelContext& ctx) const override { f(ctx); }
    Fn f;
  };
  return std::make_unique<K>(std::move(fn));
}

// Output shape of several broadcast inputs and, per input, the flat source index of each
// output element (empty when the input already has the output shape).
struct BroadcastPlan {
  Shape out_shape;
  std::vector<std::vector<int64_t>> maps;
  int64_t numel = 0;

  BroadcastPlan(const KernelContext& ctx, const std::vector<const Tensor*>& inputs) {
    std::vector<Shape> shapes;
    for (const Tensor* t : inputs) shapes.push_back(t->shape());
    out_shape = broadcast_shapes(ctx, shapes);
    numel = shape_numel(out_shape);
    for (const Tensor* t : inputs)
      maps.push_back(t->shape() == out_shape ? std::vector<int64_t>{}
                                             : broadcast_index_map(t->shape(), out_shape));
  }
  int64_t src(size_t input, int64_t k) const {
    return maps[input].empty() ? k : maps[input][size_t(k)];
  }
};

// Integer arithmetic that wraps like two's complement instead of overflowing (UB).
template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(U(a) + U(b)));
}
template <typename T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(U(a) - U(b)));
}
template <typename T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // Unsigned types narrower than int promote to int, whose multiply can overflow.
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  return T(U(W(U(a)) * W(U(b))));
}

// The ONNX TensorProto data type enum value of `to` attributes (Cast, EyeLike, ...).
inline bool onnx_dtype_to_slim(int64_t onnx_type, DType* out) {
  switch (onnx_type) {
    case 1:
      *out = DType::f32;
      return true;
    case 2:
      *out = DType::u8;
      return true;
    case 3:
      *out = DType::i8;
      return true;
    case 4:
      *out = DType::u16;
      return true;
    case 5:
      *out = DType::i16;
      return true;
    case 6:
      *out = DType::i32;
      return true;
    case 7:
      *out = DType::i64;
      return true;
    case 9:
      *out = DType::boolean;
      return true;
    case 10:
      *out = DType::f16;
      return true;
    case 11:
      *out = DType::f64;
      return true;
    case 12:
      *out = DType::u32;
      return true;
    case 13:
      *out = DType::u64;
      return true;
    case 16:
      *out = DType::bf16;
      return true;
    default:
      return false;
  }
}

// Any element type as double (Half/BFloat16 go through float).
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return double(float(v));
  else
    return double(v);
}

// Splits a shape around an axis into (outer, axis length, inner) for loops over one axis.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
  AxisSplit(const Shape& s, int axis) {
    for (int i = 0; i < axis; ++i) outer *= s[size_t(i)];
    n = s.empty() ? 1 : s[size_t(axis)];
    for (size_t i = size_t(axis) + 1; i < s.size(); ++i) inner *= s[i];
  }
};

}  // namespace slim::ref
