// Element type conversion between any two dtypes, with C++ conversion semantics
// (float to integer truncates toward zero; to bool is "!= 0"; to f16/bf16 rounds to
// nearest even). Used by Cast, by dtype boundaries between providers, and by loaders.
#pragma once

#include "slim/core/tensor.h"

namespace slim {

// A new contiguous tensor of dtype `to` (a shared view when the dtype already matches
// and the tensor is contiguous).
Tensor convert_dtype(const Tensor& t, DType to);

// Reads any numeric tensor's elements as int64 (for shape-like inputs) or double.
std::vector<int64_t> tensor_to_int64s(const Tensor& t);
std::vector<double> tensor_to_doubles(const Tensor& t);

}  // namespace slim
