// GGUF (v2 and v3), the file format llama.cpp models ship in. GgufFile memory-maps a file
// and validates the header, every metadata value and every tensor's type, shape, offset
// and size before anything uses them; GgufWriter writes a file llama.cpp loads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/mapped_file.h"
#include "slim/llm/ggml_types.h"

namespace slim::llm {

enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

// One metadata value. Integers are held in `integer` (u64 values above INT64_MAX keep
// their bit pattern), floats in `number`; arrays of numbers in `integers`/`numbers`, arrays
// of strings in `strings`. Nested arrays are validated and skipped (count kept).
struct GgufValue {
  GgufValueType type = GgufValueType::u32;
  GgufValueType array_type = GgufValueType::u32;  // element type when type == array
  int64_t integer = 0;
  double number = 0;
  std::string string;
  uint64_t array_size = 0;
  std::vector<int64_t> integers;
  std::vector<double> numbers;
  std::vector<std::string> strings;
  // Where the encoded value (type tag included) lies in the file, so a writer can copy it.
  uint64_t raw_offset = 0, raw_size = 0;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type_id = 0;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  uint64_t offset = 0;        // relative to the data section
  uint64_t size = 0;          // bytes
  GgmlType type() const { return GgmlType(type_id); }
  int64_t elements() const;
  int64_t rows() const { return elements() / dims[0]; }
};

class GgufFile {
 public:
  // Throws not_found for a missing file and invalid_model (naming the file and the field)
  // for anything malformed.
  // `resident` reads the file into huge-page-backed memory (MappedFile::read_resident)
  // instead of mapping it: for weights read on every token. `rewrite` (resident only) is
  // called once per tensor with its bytes in the copy, after the whole file has been
  // validated, and may change them in place: tensor_data() then returns what it wrote.
  using TensorRewrite = std::function<void(const GgufTensorInfo& t, uint8_t* data)>;
  static std::shared_ptr<const GgufFile> open(const std::string& path, bool resident = false,
                                              const TensorRewrite& rewrite = {});

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<std::string>& metadata_order() const { return metadata_order_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: not_found when missing (unless a default is given), invalid_model when
  // the value has the wrong type or does not fit.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  const GgufTensorInfo& tensor(const std::string& name) const;  // not_found if absent
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return data_ + t.offset; }
  const MappedFile& file() const { return *file_; }

 private:
  GgufFile() = default;
  void parse(const MappedFile& m);

  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<std::string> metadata_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  const uint8_t* data_ = nullptr;
};

// Writes a GGUF v3 file: metadata first, then tensor infos, then aligned tensor data.
class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_u32_array(const std::string& key, const std::vector<uint32_t>& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  // Copies a value exactly as another GGUF file encodes it.
  void copy_value(const std::string& key, const GgufFile& src, const GgufValue& value);
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                  std::vector<uint8_t> data);
  // Throws invalid_argument when the file cannot be written.
  void write(const std::string& path) const;

 private:
  void set_raw(const std::string& key, std::string encoded);
  std::vector<std::pair<std::string, std::string>> kvs_;  // key, encoded type + value
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
  };
  std::vector<Tensor> tensors_;
};

}  // namespace slim::llm
