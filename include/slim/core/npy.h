// NumPy .npy files (format versions 1.0-3.0), the exchange format for tensors on the
// command line: `slim run --input x=FILE.npy` reads them, `--output-dir` writes them.
#pragma once

#include <string>

#include "slim/core/tensor.h"

namespace slim {

// Reads a little-endian, C-ordered .npy file. Fortran order, big-endian data, object
// arrays and truncated files are invalid_argument errors naming the file.
Tensor read_npy(const std::string& path);
Tensor parse_npy(const void* data, size_t size, const std::string& name);
void write_npy(const std::string& path, const Tensor& tensor);
std::string encode_npy(const Tensor& tensor);

}  // namespace slim
