// A read-only memory map of a whole file. GGUF weights, .slimf forests and ONNX
// external data are used in place from the map instead of being read into memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
  // The same interface over a private read-only copy of the file in anonymous memory
  // that asks for transparent huge pages (MADV_HUGEPAGE). For weights streamed through
  // on every token: with 4 KiB file pages each 4 KiB of a weight stream costs a TLB miss,
  // which slowed LLM decode by 13-19% against 2 MiB pages. Costs a read of the file at
  // load and memory outside the page cache.
  // `prepare`, when given, may rewrite the copy in place before it is made read-only (the
  // LLM loader repacks weights for its kernels this way, without a second copy).
  static std::shared_ptr<const MappedFile> read_resident(
      const std::string& path, const std::function<void(const MappedFile& file, uint8_t* data)>& prepare = {});
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, size_t mapped)
      : path_(std::move(path)), data_(data), size_(size), mapped_(mapped) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
  size_t mapped_;  // bytes of the mapping (read_resident rounds up to whole huge pages)
};

}  // namespace slim
