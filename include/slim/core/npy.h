// NumPy .npy files (format versions 1.0-3.0), the exchange format for tensors on the
// command line: `slim run --input x=FILE.npy` reads them, `--output-dir` writes them.
// .npz archives (numpy.savez: a zip of .npy members) hold named sets of them, such as a
// served model's reference inputs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "slim/core/tensor.h"

namespace slim {

// Reads a little-endian, C-ordered .npy file. Fortran order, big-endian data, object
// arrays and truncated files are invalid_argument errors naming the file.
Tensor read_npy(const std::string& path);
Tensor parse_npy(const void* data, size_t size, const std::string& name);
void write_npy(const std::string& path, const Tensor& tensor);
std::string encode_npy(const Tensor& tensor);

// The arrays of an .npz archive in archive order, each named by its member without
// ".npy". Members must be stored (numpy.savez); compressed ones (numpy.savez_compressed),
// encrypted ones, a damaged zip directory or a bad member are invalid_argument errors
// naming the file and member.
std::vector<std::pair<std::string, Tensor>> read_npz(const std::string& path);
std::vector<std::pair<std::string, Tensor>> parse_npz(const void* data, size_t size, const std::string& name);

}  // namespace slim
