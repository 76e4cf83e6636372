// Conversion of ONNX TensorProto / SparseTensorProto messages into slim tensors: every
// data encoding ONNX allows (raw_data, the typed repeated fields, external files), with
// sizes checked against the dims before anything is allocated or read.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "slim/core/mapped_file.h"
#include "slim/core/tensor.h"

namespace slim {

// Where the tensors of one file come from. External data is resolved against base_dir
// ("" forbids external data); each external file is mapped once and shared.
struct TensorSource {
  std::string file;      // names the model or .pb file in messages
  std::string base_dir;
  std::map<std::string, std::shared_ptr<const MappedFile>> mapped;  // by canonical path
};

// "float", "int64", "bfloat16", "float8e4m3fn", ... ("type N" for numbers ONNX lacks).
std::string onnx_elem_type_name(int32_t elem_type);
// The slim dtype of an ONNX element type; nullopt for string, complex, float8, 4-bit.
std::optional<DType> dtype_from_onnx(int32_t elem_type);
// The ONNX element type of a slim dtype (the inverse of dtype_from_onnx).
int32_t onnx_elem_type(DType dtype);
// A tensor as a TensorProto named `name`, its elements in raw_data (little-endian).
onnx::TensorProto tensor_to_proto(const Tensor& tensor, const std::string& name);

// Converts a tensor; `what` names it in errors ("model.onnx: initializer 'w'"). Data
// stored in the message (raw_data) is released once copied, to keep peak memory low.
// External data whose offset is 64-byte aligned is used in place from a read-only map.
// `raw`, when given, is the message's raw_data kept out of the parsed message (a model's
// weights read in place from the file, OnnxImporter::load_bytes); the message then holds
// no raw_data of its own.
Tensor tensor_from_proto(onnx::TensorProto& proto, TensorSource& source, const std::string& what,
                         const std::string_view* raw = nullptr);
// Densifies a sparse tensor (COO indices, linear or per-dimension).
Tensor tensor_from_sparse_proto(onnx::SparseTensorProto& proto, TensorSource& source,
                                const std::string& what);

}  // namespace slim
