// Type dispatch over slim's dtypes: visit_dtype(t, fn) calls fn with a value of the C++
// element type (f16/bf16 are visited as the Half/BFloat16 wrappers below), so generic
// code is written once as a template and instantiated for every dtype.
#pragma once

#include <cstdint>

#include "slim/core/dtype.h"
#include "slim/core/error.h"
#include "slim/core/half.h"

namespace slim {

// 16-bit float storage types with float conversion, for generic code.
struct Half {
  uint16_t bits;
  Half() = default;
  Half(float f) : bits(f32_to_f16(f)) {}
  operator float() const { return f16_to_f32(bits); }
};
struct BFloat16 {
  uint16_t bits;
  BFloat16() = default;
  BFloat16(float f) : bits(f32_to_bf16(f)) {}
  operator float() const { return bf16_to_f32(bits); }
};

template <typename T> struct TypeTag { using type = T; };

template <typename Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(TypeTag<float>{});
    case DType::f16: return fn(TypeTag<Half>{});
    case DType::bf16: return fn(TypeTag<BFloat16>{});
    case DType::f64: return fn(TypeTag<double>{});
    case DType::i8: return fn(TypeTag<int8_t>{});
    case DType::u8: return fn(TypeTag<uint8_t>{});
    case DType::i16: return fn(TypeTag<int16_t>{});
    case DType::u16: return fn(TypeTag<uint16_t>{});
    case DType::i32: return fn(TypeTag<int32_t>{});
    case DType::u32: return fn(TypeTag<uint32_t>{});
    case DType::i64: return fn(TypeTag<int64_t>{});
    case DType::u64: return fn(TypeTag<uint64_t>{});
    case DType::boolean: return fn(TypeTag<bool>{});
  }
  throw Error(ErrorCode::internal, "visit_dtype: bad dtype");
}

}  // namespace slim
