#include "proto_tensor.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include "slim/core/error.h"

namespace slim {

namespace fs = std::filesystem;

namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// A sparse tensor is densified; past this size the dense copy is refused rather than
// letting a few bytes of file claim gigabytes of memory.
constexpr int64_t kMaxDensifiedBytes = int64_t(256) << 20;

struct Dims {
  Shape shape;
  int64_t numel = 1;
};

Dims checked_dims(const google::protobuf::RepeatedField<int64_t>& dims, size_t elem_size,
                  const std::string& what) {
  Dims d;
  d.shape.assign(dims.begin(), dims.end());
  for (int64_t v : d.shape) {
    check(v >= 0, ErrorCode::invalid_model,
          what + " has negative dimension " + std::to_string(v) + " in " + shape_str(d.shape));
    if (v != 0 && d.numel > std::numeric_limits<int64_t>::max() / int64_t(elem_size) / v)
      throw Error(ErrorCode::invalid_model, what + " dims " + shape_str(d.shape) + " are too large");
    d.numel *= v;
  }
  return d;
}

// Which typed repeated field ONNX stores each element type in.
enum class Field { float_data, int32_data, string_data, int64_data, double_data, uint64_data };

const char* field_name(Field f) {
  switch (f) {
    case Field::float_data: return "float_data";
    case Field::int32_data: return "int32_data";
    case Field::string_data: return "string_data";
    case Field::int64_data: return "int64_data";
    case Field::double_data: return "double_data";
    case Field::uint64_data: return "uint64_data";
  }
  return "?";
}

Field field_for(DType t) {
  switch (t) {
    case DType::f32: return Field::float_data;
    case DType::f64: return Field::double_data;
    case DType::i64: return Field::int64_data;
    case DType::u32:
    case DType::u64: return Field::uint64_data;
    default: return Field::int32_data;  // i32 and everything narrower, f16/bf16 as bits
  }
}

int field_size(const onnx::TensorProto& p, Field f) {
  switch (f) {
    case Field::float_data: return p.float_data_size();
    case Field::int32_data: return p.int32_data_size();
    case Field::string_data: return p.string_data_size();
    case Field::int64_data: return p.int64_data_size();
    case Field::double_data: return p.double_data_size();
    case Field::uint64_data: return p.uint64_data_size();
  }
  return 0;
}

constexpr Field kAllFields[] = {Field::float_data, Field::int32_data, Field::string_data,
                                Field::int64_data, Field::double_data, Field::uint64_data};

// Copies int32_data into a narrower type, refusing values that do not fit: a value
// that silently wrapped would change the model's meaning.
template <typename T>
void narrow_int32(const onnx::TensorProto& p, void* dst, int64_t lo, int64_t hi, DType dt,
                  const std::string& what) {
  T* out = static_cast<T*>(dst);
  for (int i = 0; i < p.int32_data_size(); ++i) {
    const int64_t v = p.int32_data(i);
    if (v < lo || v > hi)
      throw Error(ErrorCode::invalid_model,
                  what + " int32_data[" + std::to_string(i) + "] = " + std::to_string(v) +
                      " is out of range for " + std::string(dtype_name(dt)));
    out[i] = T(v);
  }
}

void copy_typed(const onnx::TensorProto& p, DType dt, void* dst, const std::string& what) {
  switch (dt) {
    case DType::f32:
      std::memcpy(dst, p.float_data().data(), size_t(p.float_data_size()) * 4);
      break;
    case DType::f64:
      std::memcpy(dst, p.double_data().data(), size_t(p.double_data_size()) * 8);
      break;
    case DType::i64:
      std::memcpy(dst, p.int64_data().data(), size_t(p.int64_data_size()) * 8);
      break;
    case DType::u64:
      std::memcpy(dst, p.uint64_data().data(), size_t(p.uint64_data_size()) * 8);
      break;
    case DType::u32: {
      auto* out = static_cast<uint32_t*>(dst);
      for (int i = 0; i < p.uint64_data_size(); ++i) {
        const uint64_t v = p.uint64_data(i);
        check(v <= std::numeric_limits<uint32_t>::max(), ErrorCode::invalid_model,
              what + " uint64_data[" + std::to_string(i) + "] = " + std::to_string(v) +
                  " is out of range for u32");
        out[i] = uint32_t(v);
      }
      break;
    }
    case DType::i32:
      std::memcpy(dst, p.int32_data().data(), size_t(p.int32_data_size()) * 4);
      break;
    case DType::i16: narrow_int32<int16_t>(p, dst, -32768, 32767, dt, what); break;
    case DType::u16: narrow_int32<uint16_t>(p, dst, 0, 65535, dt, what); break;
    case DType::i8: narrow_int32<int8_t>(p, dst, -128, 127, dt, what); break;
    case DType::u8: narrow_int32<uint8_t>(p, dst, 0, 255, dt, what); break;
    case DType::boolean: narrow_int32<uint8_t>(p, dst, 0, 1, dt, what); break;
    // 16-bit floats travel as their bit patterns, one per int32.
    case DType::f16:
    case DType::bf16: narrow_int32<uint16_t>(p, dst, 0, 65535, dt, what); break;
  }
}

// Kernels compare bools as bytes; any nonzero byte from a file is made exactly 1.
void normalize_bools(Tensor& t) {
  auto* b = static_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] ? 1 : 0;
}

uint64_t parse_u64(const std::string& s, const std::string& what) {
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  check(!s.empty() && ec == std::errc() && ptr == end, ErrorCode::invalid_model,
        what + " is " + in_quotes(s) + ", not a non-negative integer");
  return v;
}

Tensor external_tensor(onnx::TensorProto& p, DType dt, const Dims& dims, size_t nbytes,
                       TensorSource& src, const std::string& what, bool has_raw) {
  check(!src.base_dir.empty(), ErrorCode::invalid_model,
        what + " has external data, which is not allowed when the model is loaded from memory");
  check(!has_raw, ErrorCode::invalid_model,
        what + " has external data and raw_data at once");
  for (Field f : kAllFields)
    check(field_size(p, f) == 0, ErrorCode::invalid_model,
          what + " has external data and " + field_name(f) + " at once");
  std::string location;
  std::optional<uint64_t> offset, length;
  std::set<std::string> keys;
  for (const auto& kv : p.external_data()) {
    check(keys.insert(kv.key()).second, ErrorCode::invalid_model,
          what + " external data key " + in_quotes(kv.key()) + " appears twice");
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = parse_u64(kv.value(), what + " external data offset");
    else if (kv.key() == "length") length = parse_u64(kv.value(), what + " external data length");
  }
  check(!location.empty(), ErrorCode::invalid_model, what + " has external data without a location");
  check(location.find('\0') == std::string::npos, ErrorCode::invalid_model,
        what + " external data location contains a NUL byte");
  const fs::path loc(location);
  check(!loc.is_absolute() && !loc.has_root_name() && !loc.has_root_directory(),
        ErrorCode::invalid_model,
        what + " external data location " + in_quotes(location) +
            " is an absolute path; it must be relative to the model's folder");

  // Resolve symlinks as well as "..", so that neither can reach outside the folder.
  fs::path base, full;
  try {
    base = fs::weakly_canonical(fs::absolute(src.base_dir));
    full = fs::weakly_canonical(base / loc);
  } catch (const fs::filesystem_error& e) {
    throw Error(ErrorCode::invalid_model,
                what + " external data location " + in_quotes(location) + " cannot be resolved: " +
                    e.what());
  }
  const fs::path rel = full.lexically_relative(base);
  check(!rel.empty() && *rel.begin() != ".." && rel != ".", ErrorCode::invalid_model,
        what + " external data location " + in_quotes(location) + " escapes the model's folder " +
            in_quotes(base.string()));

  const std::string key = full.string();
  auto it = src.mapped.find(key);
  if (it == src.mapped.end()) {
    std::shared_ptr<const MappedFile> file;
    try {
      file = MappedFile::open(key);
    } catch (const Error& e) {
      throw Error(e.code() == ErrorCode::not_found ? ErrorCode::not_found : ErrorCode::invalid_model,
                  what + " external data: " + e.what());
    }
    it = src.mapped.emplace(key, std::move(file)).first;
  }
  const std::shared_ptr<const MappedFile>& file = it->second;

  const uint64_t off = offset.value_or(0);
  if (length)
    check(*length == nbytes, ErrorCode::invalid_model,
          what + " external data length " + std::to_string(*length) + " disagrees with " +
              std::string(dtype_name(dt)) + shape_str(dims.shape) + ", which needs " +
              std::to_string(nbytes) + " bytes");
  check(off <= file->size() && nbytes <= file->size() - off, ErrorCode::invalid_model,
        what + " external data [" + std::to_string(off) + ", " + std::to_string(off + nbytes) +
            ") reads past the end of " + in_quotes(location) + " (" + std::to_string(file->size()) +
            " bytes)");
  if (nbytes == 0) return Tensor(dt, dims.shape);
  const uint8_t* ptr = file->data() + off;
  // In place only when aligned like slim's own storage, since kernels rely on it.
  if (dt != DType::boolean && reinterpret_cast<uintptr_t>(ptr) % kTensorAlignment == 0)
    return Tensor::borrow(dt, dims.shape, const_cast<uint8_t*>(ptr), file);
  Tensor t(dt, dims.shape);
  std::memcpy(t.raw_data(), ptr, nbytes);
  if (dt == DType::boolean) normalize_bools(t);
  return t;
}

}  // namespace

std::string onnx_elem_type_name(int32_t elem_type) {
  static const char* const kNames[] = {
      "undefined", "float",    "uint8",          "int8",         "uint16",       "int16",
      "int32",     "int64",    "string",         "bool",         "float16",      "double",
      "uint32",    "uint64",   "complex64",      "complex128",   "bfloat16",     "float8e4m3fn",
      "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4",  "int4",         "float4e2m1"};
  if (elem_type >= 0 && size_t(elem_type) < std::size(kNames)) return kNames[elem_type];
  return "type " + std::to_string(elem_type);
}

std::optional<DType> dtype_from_onnx(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return DType::f32;
    case onnx::TensorProto::UINT8: return DType::u8;
    case onnx::TensorProto::INT8: return DType::i8;
    case onnx::TensorProto::UINT16: return DType::u16;
    case onnx::TensorProto::INT16: return DType::i16;
    case onnx::TensorProto::INT32: return DType::i32;
    case onnx::TensorProto::INT64: return DType::i64;
    case onnx::TensorProto::BOOL: return DType::boolean;
    case onnx::TensorProto::FLOAT16: return DType::f16;
    case onnx::TensorProto::DOUBLE: return DType::f64;
    case onnx::TensorProto::UINT32: return DType::u32;
    case onnx::TensorProto::UINT64: return DType::u64;
    case onnx::TensorProto::BFLOAT16: return DType::bf16;
    default: return std::nullopt;
  }
}

int32_t onnx_elem_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return onnx::TensorProto::FLOAT;
    case DType::u8: return onnx::TensorProto::UINT8;
    case DType::i8: return onnx::TensorProto::INT8;
    case DType::u16: return onnx::TensorProto::UINT16;
    case DType::i16: return onnx::TensorProto::INT16;
    case DType::i32: return onnx::TensorProto::INT32;
    case DType::i64: return onnx::TensorProto::INT64;
    case DType::boolean: return onnx::TensorProto::BOOL;
    case DType::f16: return onnx::TensorProto::FLOAT16;
    case DType::f64: return onnx::TensorProto::DOUBLE;
    case DType::u32: return onnx::TensorProto::UINT32;
    case DType::u64: return onnx::TensorProto::UINT64;
    case DType::bf16: return onnx::TensorProto::BFLOAT16;
  }
  return onnx::TensorProto::UNDEFINED;
}

onnx::TensorProto tensor_to_proto(const Tensor& tensor, const std::string& name) {
  onnx::TensorProto p;
  p.set_name(name);
  p.set_data_type(onnx_elem_type(tensor.dtype()));
  for (int64_t d : tensor.shape()) p.add_dims(d);
  const Tensor packed = tensor.contiguous();
  p.set_raw_data(static_cast<const char*>(packed.raw_data()), packed.nbytes());
  return p;
}

Tensor tensor_from_proto(onnx::TensorProto& p, TensorSource& src, const std::string& what,
                         const std::string_view* raw_outside) {
  const int32_t et = p.data_type();
  const std::optional<DType> dt = dtype_from_onnx(et);
  if (!dt) {
    // Types newer than the protos Debian ships (float8, 4-bit) are valid ONNX, just not
    // something slim computes with.
    if (et == 0) throw Error(ErrorCode::invalid_model, what + " has no data type");
    if (et < 0 || et > 23)
      throw Error(ErrorCode::invalid_model, what + " has unknown data type " + std::to_string(et));
    throw Error(ErrorCode::unsupported,
                what + " has type " + onnx_elem_type_name(et) + ", which slim does not support");
  }
  check(!p.has_segment(), ErrorCode::unsupported,
        what + " is stored in segments, which slim does not support");
  const size_t esize = dtype_size(*dt);
  const Dims dims = checked_dims(p.dims(), esize, what);
  const size_t nbytes = size_t(dims.numel) * esize;
  const std::string desc = std::string(dtype_name(*dt)) + shape_str(dims.shape);

  const bool has_raw = raw_outside || p.has_raw_data();
  if (p.data_location() == onnx::TensorProto::EXTERNAL)
    return external_tensor(p, *dt, dims, nbytes, src, what, has_raw);

  int typed_fields = 0;
  Field typed = Field::float_data;
  for (Field f : kAllFields)
    if (field_size(p, f) > 0) {
      check(typed_fields == 0, ErrorCode::invalid_model,
            what + " stores data in both " + field_name(typed) + " and " + field_name(f));
      ++typed_fields;
      typed = f;
    }
  if (has_raw) {
    check(typed_fields == 0, ErrorCode::invalid_model,
          what + " has both raw_data and " + field_name(typed));
    const std::string_view raw = raw_outside ? *raw_outside : std::string_view(p.raw_data());
    check(raw.size() == nbytes, ErrorCode::invalid_model,
          what + " raw_data has " + std::to_string(raw.size()) + " bytes, but " + desc + " needs " +
              std::to_string(nbytes));
    Tensor t(*dt, dims.shape);
    if (nbytes) std::memcpy(t.raw_data(), raw.data(), nbytes);  // little-endian, as ONNX
    if (*dt == DType::boolean) normalize_bools(t);
    if (!raw_outside) std::string().swap(*p.mutable_raw_data());
    return t;
  }
  if (typed_fields == 0) {
    check(dims.numel == 0, ErrorCode::invalid_model,
          what + " has no data, but " + desc + " needs " + std::to_string(dims.numel) + " values");
    return Tensor(*dt, dims.shape);
  }
  check(typed == field_for(*dt), ErrorCode::invalid_model,
        what + " is " + onnx_elem_type_name(et) + " but stores its values in " + field_name(typed) +
            " (expected " + field_name(field_for(*dt)) + ")");
  check(int64_t(field_size(p, typed)) == dims.numel, ErrorCode::invalid_model,
        what + " " + field_name(typed) + " has " + std::to_string(field_size(p, typed)) +
            " values, but " + desc + " needs " + std::to_string(dims.numel));
  Tensor t(*dt, dims.shape);
  copy_typed(p, *dt, t.raw_data(), what);
  return t;
}

Tensor tensor_from_sparse_proto(onnx::SparseTensorProto& p, TensorSource& src,
                                const std::string& what) {
  check(p.has_values(), ErrorCode::invalid_model, what + " has no values");
  Tensor values = tensor_from_proto(*p.mutable_values(), src, what + " values");
  const DType dt = values.dtype();
  const size_t esize = dtype_size(dt);
  const Dims dims = checked_dims(p.dims(), esize, what);
  check(values.rank() == 1, ErrorCode::invalid_model,
        what + " values must be 1-D, got " + shape_str(values.shape()));
  const int64_t nnz = values.dim(0);
  check(int64_t(dims.numel) * int64_t(esize) <= kMaxDensifiedBytes, ErrorCode::resource_exhausted,
        what + " would need " + std::to_string(dims.numel * int64_t(esize)) +
            " bytes as a dense tensor, over slim's limit of " + std::to_string(kMaxDensifiedBytes));
  Tensor indices;
  if (p.has_indices()) indices = tensor_from_proto(*p.mutable_indices(), src, what + " indices");
  const int rank = int(dims.shape.size());
  if (nnz > 0) {
    check(indices.defined() && indices.dtype() == DType::i64, ErrorCode::invalid_model,
          what + " indices must be an int64 tensor");
    const bool linear = indices.rank() == 1 && indices.dim(0) == nnz;
    const bool coords = indices.rank() == 2 && indices.dim(0) == nnz && indices.dim(1) == rank;
    check(linear || coords, ErrorCode::invalid_model,
          what + " indices have shape " + shape_str(indices.shape()) + ", expected [" +
              std::to_string(nnz) + "] or [" + std::to_string(nnz) + "," + std::to_string(rank) + "]");
  }
  Tensor dense(dt, dims.shape);
  if (nnz == 0) return dense;
  const Shape strides = contiguous_strides(dims.shape);
  const auto* idx = static_cast<const int64_t*>(indices.raw_data());
  const auto* in = static_cast<const uint8_t*>(values.raw_data());
  auto* out = static_cast<uint8_t*>(dense.raw_data());
  const bool linear = indices.rank() == 1;
  for (int64_t k = 0; k < nnz; ++k) {
    int64_t pos = 0;
    if (linear) {
      pos = idx[k];
      check(pos >= 0 && pos < dims.numel, ErrorCode::invalid_model,
            what + " index " + std::to_string(pos) + " is outside " + shape_str(dims.shape));
    } else {
      for (int d = 0; d < rank; ++d) {
        const int64_t c = idx[k * rank + d];
        check(c >= 0 && c < dims.shape[size_t(d)], ErrorCode::invalid_model,
              what + " index " + std::to_string(c) + " of entry " + std::to_string(k) +
                  " is outside dimension " + std::to_string(d) + " of " + shape_str(dims.shape));
        pos += c * strides[size_t(d)];
      }
    }
    std::memcpy(out + size_t(pos) * esize, in + size_t(k) * esize, esize);
  }
  return dense;
}

}  // namespace slim
