#include "slim/llm/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "slim/core/error.h"

namespace slim::llm {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;

// Bounds-checked little-endian reader over the mapped file; every read names the file
// and the field being read when it runs past the end.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      throw Error(ErrorCode::invalid_model, path_ + ": truncated while reading " + what + " at byte " +
                                                std::to_string(pos_) + " (needs " + std::to_string(n) +
                                                " bytes, " + std::to_string(remaining()) + " left)");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " length");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }
  void skip(uint64_t n, const std::string& what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

int scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    default: return 0;
  }
}

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
    case GgufValueType::boolean: return true;
    default: return false;
  }
}

// Reads a scalar of type t into integer or number.
void read_scalar(Cursor& c, GgufValueType t, int64_t* integer, double* number, const std::string& what) {
  switch (t) {
    case GgufValueType::u8: *integer = c.read<uint8_t>(what); return;
    case GgufValueType::i8: *integer = c.read<int8_t>(what); return;
    case GgufValueType::u16: *integer = c.read<uint16_t>(what); return;
    case GgufValueType::i16: *integer = c.read<int16_t>(what); return;
    case GgufValueType::u32: *integer = c.read<uint32_t>(what); return;
    case GgufValueType::i32: *integer = c.read<int32_t>(what); return;
    case GgufValueType::u64: *integer = int64_t(c.read<uint64_t>(what)); return;
    case GgufValueType::i64: *integer = c.read<int64_t>(what); return;
    case GgufValueType::f32: *number = c.read<float>(what); return;
    case GgufValueType::f64: *number = c.read<double>(what); return;
    case GgufValueType::boolean: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) throw Error(ErrorCode::invalid_model, what + ": boolean byte is " + std::to_string(b));
      *integer = b;
      return;
    }
    default: throw Error(ErrorCode::internal, "read_scalar: not a scalar");
  }
}

void read_value(Cursor& c, GgufValueType type, GgufValue& v, const std::string& what, int depth) {
  v.type = type;
  if (type == GgufValueType::string) {
    v.string = c.read_string(what);
    return;
  }
  if (type != GgufValueType::array) {
    if (scalar_size(type) == 0)
      throw Error(ErrorCode::invalid_model, what + ": unknown value type " + std::to_string(uint32_t(type)));
    read_scalar(c, type, &v.integer, &v.number, what);
    return;
  }
  if (depth > 2) throw Error(ErrorCode::invalid_model, what + ": arrays nested too deeply");
  const uint32_t et = c.read<uint32_t>(what + " element type");
  if (et > uint32_t(GgufValueType::f64))
    throw Error(ErrorCode::invalid_model, what + ": unknown array element type " + std::to_string(et));
  v.array_type = GgufValueType(et);
  const uint64_t n = c.read<uint64_t>(what + " element count");
  v.array_size = n;
  const int es = scalar_size(v.array_type);
  if (es > 0) {
    if (n > c.remaining() / uint64_t(es))
      throw Error(ErrorCode::invalid_model, what + ": array of " + std::to_string(n) +
                                                " elements runs past the end of the file");
    if (is_integer(v.array_type)) {
      v.integers.resize(size_t(n));
      double unused;
      for (uint64_t i = 0; i < n; ++i) read_scalar(c, v.array_type, &v.integers[i], &unused, what);
    } else {
      v.numbers.resize(size_t(n));
      int64_t unused;
      for (uint64_t i = 0; i < n; ++i) read_scalar(c, v.array_type, &unused, &v.numbers[i], what);
    }
  } else if (v.array_type == GgufValueType::string) {
    // Each string takes at least its 8-byte length.
    if (n > c.remaining() / 8)
      throw Error(ErrorCode::invalid_model, what + ": array of " + std::to_string(n) +
                                                " strings runs past the end of the file");
    v.strings.resize(size_t(n));
    for (uint64_t i = 0; i < n; ++i) v.strings[i] = c.read_string(what + "[" + std::to_string(i) + "]");
  } else {  // nested arrays: validate and skip
    if (n > c.remaining() / 12)
      throw Error(ErrorCode::invalid_model, what + ": nested array count " + std::to_string(n) + " too large");
    for (uint64_t i = 0; i < n; ++i) {
      GgufValue inner;
      read_value(c, GgufValueType::array, inner, what + "[" + std::to_string(i) + "]", depth + 1);
    }
  }
}

std::string type_name(GgufValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) <= 12 ? names[uint32_t(t)] : "?";
}

}  // namespace

int64_t GgufTensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path, bool resident, const TensorRewrite& rewrite) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  if (!resident) {
    f->file_ = MappedFile::open(path);
    f->parse(*f->file_);
    return f;
  }
  bool parsed = false;
  f->file_ = MappedFile::read_resident(path, [&](const MappedFile& m, uint8_t* data) {
    f->parse(m);
    parsed = true;
    if (rewrite)
      for (const GgufTensorInfo& t : f->tensors_) rewrite(t, data + (f->data_ - m.data()) + t.offset);
  });
  if (!parsed) f->parse(*f->file_);  // an empty file: parse reports it
  return f;
}

void GgufFile::parse(const MappedFile& m) {
  const std::string& p = m.path();
  Cursor c(p, m.data(), m.size());
  if (m.size() < 24 || c.read<uint32_t>("magic") != kGgufMagic)
    throw Error(ErrorCode::invalid_model, p + ": not a GGUF file (bad magic)");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw Error(ErrorCode::unsupported, p + ": GGUF version " + std::to_string(version_) +
                                             " (slim reads versions 2 and 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
  // at least 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    throw Error(ErrorCode::invalid_model, p + ": metadata count " + std::to_string(n_kv) + " exceeds the file size");
  if (n_tensors > c.remaining() / 32)
    throw Error(ErrorCode::invalid_model, p + ": tensor count " + std::to_string(n_tensors) + " exceeds the file size");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string(p + ": metadata key #" + std::to_string(i));
    const std::string what = p + ": metadata '" + key + "'";
    GgufValue v;
    v.raw_offset = c.pos();
    const uint32_t t = c.read<uint32_t>(what + " type");
    if (t > uint32_t(GgufValueType::f64))
      throw Error(ErrorCode::invalid_model, what + ": unknown value type " + std::to_string(t));
    read_value(c, GgufValueType(t), v, what, 0);
    v.raw_size = c.pos() - v.raw_offset;
    if (metadata_.count(key)) throw Error(ErrorCode::invalid_model, what + ": duplicate key");
    metadata_order_.push_back(key);
    metadata_.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!is_integer(a->type) || a->type == GgufValueType::boolean || a->integer <= 0 ||
        a->integer > (1 << 20) || (a->integer & (a->integer - 1)) != 0)
      throw Error(ErrorCode::invalid_model, p + ": general.alignment must be a power of two, got " +
                                                std::to_string(a->integer));
    alignment_ = uint64_t(a->integer);
  }

  tensors_.resize(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo& t = tensors_[i];
    t.name = c.read_string(p + ": tensor #" + std::to_string(i) + " name");
    const std::string what = p + ": tensor '" + t.name + "'";
    const uint32_t nd = c.read<uint32_t>(what + " dimension count");
    if (nd == 0 || nd > kMaxDims)
      throw Error(ErrorCode::invalid_model, what + ": " + std::to_string(nd) + " dimensions (1 to 4 allowed)");
    int64_t elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t dim = c.read<uint64_t>(what + " dimension");
      if (dim == 0 || dim > uint64_t(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(elements, int64_t(dim), &elements))
        throw Error(ErrorCode::invalid_model, what + ": bad dimension " + std::to_string(dim));
      t.dims.push_back(int64_t(dim));
    }
    t.type_id = c.read<uint32_t>(what + " type");
    t.offset = c.read<uint64_t>(what + " offset");
    const GgmlTypeInfo* info = ggml_type_info(t.type_id);
    if (!info)
      throw Error(ErrorCode::unsupported, what + ": unknown tensor type " + std::to_string(t.type_id));
    if (t.dims[0] % info->block_elems != 0)
      throw Error(ErrorCode::invalid_model, what + ": row length " + std::to_string(t.dims[0]) +
                                                " is not a multiple of the " + std::string(info->name) +
                                                " block size " + std::to_string(info->block_elems));
    int64_t bytes;
    if (__builtin_mul_overflow(elements / info->block_elems, info->block_bytes, &bytes))
      throw Error(ErrorCode::invalid_model, what + ": size overflows");
    t.size = uint64_t(bytes);
    if (t.offset % alignment_ != 0)
      throw Error(ErrorCode::invalid_model, what + ": offset " + std::to_string(t.offset) +
                                                " is not a multiple of the alignment " + std::to_string(alignment_));
    if (tensor_index_.count(t.name)) throw Error(ErrorCode::invalid_model, what + ": duplicate tensor name");
    tensor_index_[t.name] = size_t(i);
  }

  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > m.size() && n_tensors > 0)
    throw Error(ErrorCode::invalid_model, p + ": tensor data section starts past the end of the file");
  const uint64_t data_size = data_start <= m.size() ? m.size() - data_start : 0;
  data_ = m.data() + std::min<uint64_t>(data_start, m.size());
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.size > data_size - t.offset)
      throw Error(ErrorCode::invalid_model, p + ": tensor '" + t.name + "' (" + std::to_string(t.size) +
                                                " bytes at data offset " + std::to_string(t.offset) +
                                                ") runs past the end of the file");
  }
  // Overlapping tensors mean a corrupt offset table.
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->size > by_offset[i]->offset)
      throw Error(ErrorCode::invalid_model, p + ": tensors '" + by_offset[i - 1]->name + "' and '" +
                                                by_offset[i]->name + "' overlap");
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(ErrorCode::not_found, path() + ": metadata '" + key + "' is missing");
  if (!is_integer(v->type) || v->type == GgufValueType::boolean)
    throw Error(ErrorCode::invalid_model, path() + ": metadata '" + key + "' is a " + type_name(v->type) +
                                              ", expected an integer");
  return v->integer;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(ErrorCode::not_found, path() + ": metadata '" + key + "' is missing");
  if (v->type == GgufValueType::f32 || v->type == GgufValueType::f64) return v->number;
  if (is_integer(v->type) && v->type != GgufValueType::boolean) return double(v->integer);
  throw Error(ErrorCode::invalid_model, path() + ": metadata '" + key + "' is a " + type_name(v->type) +
                                            ", expected a number");
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error(ErrorCode::not_found, path() + ": metadata '" + key + "' is missing");
  if (v->type != GgufValueType::string)
    throw Error(ErrorCode::invalid_model, path() + ": metadata '" + key + "' is a " + type_name(v->type) +
                                              ", expected a string");
  return v->string;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type != GgufValueType::boolean)
    throw Error(ErrorCode::invalid_model, path() + ": metadata '" + key + "' is a " + type_name(v->type) +
                                              ", expected a bool");
  return v->integer != 0;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw Error(ErrorCode::not_found, path() + ": tensor '" + name + "' is missing");
  return *t;
}

// ---- writer ----

namespace {
template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}
}  // namespace

void GgufWriter::set_raw(const std::string& key, std::string encoded) {
  for (auto& kv : kvs_)
    if (kv.first == key) {
      kv.second = std::move(encoded);
      return;
    }
  kvs_.emplace_back(key, std::move(encoded));
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::u32));
  put(s, v);
  set_raw(key, std::move(s));
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::i32));
  put(s, v);
  set_raw(key, std::move(s));
}
void GgufWriter::set_f32(const std::string& key, float v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::f32));
  put(s, v);
  set_raw(key, std::move(s));
}
void GgufWriter::set_bool(const std::string& key, bool v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::boolean));
  put<uint8_t>(s, v ? 1 : 0);
  set_raw(key, std::move(s));
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::string));
  put_string(s, v);
  set_raw(key, std::move(s));
}
void GgufWriter::set_u32_array(const std::string& key, const std::vector<uint32_t>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::array));
  put<uint32_t>(s, uint32_t(GgufValueType::u32));
  put<uint64_t>(s, v.size());
  for (uint32_t x : v) put(s, x);
  set_raw(key, std::move(s));
}
void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufValueType::array));
  put<uint32_t>(s, uint32_t(GgufValueType::string));
  put<uint64_t>(s, v.size());
  for (const std::string& x : v) put_string(s, x);
  set_raw(key, std::move(s));
}
void GgufWriter::copy_value(const std::string& key, const GgufFile& src, const GgufValue& value) {
  set_raw(key, std::string(reinterpret_cast<const char*>(src.file().data() + value.raw_offset),
                           size_t(value.raw_size)));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                            std::vector<uint8_t> data) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (dims.empty() || dims.size() > 4 || int64_t(data.size()) != ggml_row_bytes(type, dims[0]) * (n / dims[0]))
    throw Error(ErrorCode::internal, "GgufWriter: tensor '" + name + "' data size does not match its shape");
  tensors_.push_back({name, type, std::move(dims), std::move(data)});
}

void GgufWriter::write(const std::string& path) const {
  constexpr uint64_t kAlign = 32;
  std::string head;
  put<uint32_t>(head, kGgufMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const auto& [key, enc] : kvs_) {
    put_string(head, key);
    head += enc;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, uint64_t(d));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset += (t.data.size() + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, '\0');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(ErrorCode::invalid_argument, path + ": cannot open for writing");
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  static const char zeros[kAlign] = {};
  for (const auto& t : tensors_) {
    ok = ok && std::fwrite(t.data.data(), 1, t.data.size(), f) == t.data.size();
    const size_t pad = (kAlign - t.data.size() % kAlign) % kAlign;
    ok = ok && std::fwrite(zeros, 1, pad, f) == pad;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw Error(ErrorCode::resource_exhausted, path + ": write failed (disk full?)");
}

}  // namespace slim::llm
