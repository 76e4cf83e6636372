// Element types of slim tensors, with their sizes and names. The set covers what ONNX
// models, GGUF files and tree ensembles exchange with the outside world.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slim {

enum class DType : uint8_t { f32, f16, bf16, f64, i8, u8, i16, u16, i32, u32, i64, u64, boolean };

inline constexpr int kNumDTypes = 13;

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "i64", "bool", ...
// Parses a name from dtype_name() (also numpy-style aliases "float32", "int64", "bool").
// Throws invalid_argument for an unknown name.
DType parse_dtype(std::string_view name);
bool dtype_is_float(DType t);    // f32 f16 bf16 f64
bool dtype_is_integer(DType t);  // signed and unsigned integers (not bool)
bool dtype_is_signed(DType t);

// Maps a C++ element type to its DType: dtype_of<float>() == DType::f32.
// f16 and bf16 have no C++ type; they are stored as uint16_t bit patterns.
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int8_t>() { return DType::i8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::i16; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::u32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::u64; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

}  // namespace slim
