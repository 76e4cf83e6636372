#include "slim/core/dtype.h"

#include "slim/core/error.h"

namespace slim {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: case DType::u64: return 8;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    case DType::i8: case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i16: return "i16";
    case DType::u16: return "u16";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::i64: return "i64";
    case DType::u64: return "u64";
    case DType::boolean: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},     {"float32", DType::f32}, {"float", DType::f32},
      {"f16", DType::f16},     {"float16", DType::f16}, {"bf16", DType::bf16},
      {"bfloat16", DType::bf16}, {"f64", DType::f64},   {"float64", DType::f64},
      {"double", DType::f64},  {"i8", DType::i8},       {"int8", DType::i8},
      {"u8", DType::u8},       {"uint8", DType::u8},    {"i16", DType::i16},
      {"int16", DType::i16},   {"u16", DType::u16},     {"uint16", DType::u16},
      {"i32", DType::i32},     {"int32", DType::i32},   {"u32", DType::u32},
      {"uint32", DType::u32},  {"i64", DType::i64},     {"int64", DType::i64},
      {"u64", DType::u64},     {"uint64", DType::u64},  {"bool", DType::boolean},
  };
  for (const auto& a : kAliases)
    if (a.name == name) return a.t;
  throw Error(ErrorCode::invalid_argument, "unknown dtype '" + std::string(name) + "'");
}

bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

bool dtype_is_integer(DType t) { return !dtype_is_float(t) && t != DType::boolean; }

bool dtype_is_signed(DType t) {
  return dtype_is_float(t) || t == DType::i8 || t == DType::i16 || t == DType::i32 ||
         t == DType::i64;
}

}  // namespace slim
