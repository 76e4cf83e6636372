// A read-only memory map of a whole file. GGUF weights, .slimf forests and ONNX
// external data are used in place from the map instead of being read into memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace slim {

class MappedFile {
 public:
  // Throws not_found when the file cannot be opened, invalid_argument for a directory.
  // `populate` maps every page up front (one kernel call instead of a fault per page),
  // for files that will be read whole right away, such as a checksummed .slimf.
  static std::shared_ptr<const MappedFile> open(const std::string& path, bool populate = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace slim
