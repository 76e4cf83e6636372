// Tensor: a typed, shaped view of memory. Storage is either owned (64-byte aligned,
// zero-initialized) or borrowed (a caller's buffer, a memory-mapped file), and views
// share storage through strides and an offset, so slicing and permuting never copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slim/core/dtype.h"
#include "slim/core/error.h"

namespace slim {

using Shape = std::vector<int64_t>;

inline constexpr size_t kTensorAlignment = 64;

// Number of elements of a shape; throws invalid_argument on a negative dim or overflow.
int64_t shape_numel(const Shape& shape);
// "[1,3,224,224]"
std::string shape_str(const Shape& shape);
// Row-major element strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// Memory behind one or more tensors. Owned storage frees its buffer; borrowed storage
// keeps an optional owner (e.g. a mapped file) alive instead.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes);  // aligned, zeroed
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes,
                                         std::shared_ptr<const void> owner = nullptr);
  // Large freed buffers are kept for reuse (up to 1 GiB); this hands them back to the
  // kernel (a server short of memory) and returns how many bytes that was.
  static size_t release_cached();
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool owned() const { return owned_; }

 private:
  Storage(void* data, size_t bytes, bool owned, std::shared_ptr<const void> owner)
      : data_(data), bytes_(bytes), owned_(owned), owner_(std::move(owner)) {}
  void* data_;
  size_t mapped_ = 0;  // large owned buffers: bytes of their own mapping (see allocate)
  void* map_base_ = nullptr;
  size_t bytes_;
  bool owned_;
  std::shared_ptr<const void> owner_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false
  Tensor(DType dtype, Shape shape);  // owned, contiguous, zero-filled

  // A contiguous tensor over memory the caller keeps alive (or that `owner` keeps alive).
  static Tensor borrow(DType dtype, Shape shape, void* data,
                       std::shared_ptr<const void> owner = nullptr);
  template <typename T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values);
  template <typename T>
  static Tensor scalar(T value) { return from_vector<T>({}, {value}); }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int rank() const { return int(shape_.size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;  // address of the first element
  template <typename T>
  T* data() const {
    check_type(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }

  // Views sharing this tensor's storage.
  Tensor view(Shape shape, Shape strides, int64_t offset_elems) const;
  Tensor reshape(Shape shape) const;  // needs a contiguous tensor; -1 infers one dim
  Tensor permute(const std::vector<int>& perm) const;
  Tensor slice(int axis, int64_t begin, int64_t end) const;

  Tensor contiguous() const;  // this tensor when already contiguous, else a packed copy
  Tensor clone() const;       // always a new owned, contiguous copy
  void copy_from(const Tensor& src);  // same dtype and shape; any strides on both sides

  std::string describe() const;  // "f32[1,3,224,224]"

 private:
  void check_type(DType t) const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;  // in elements
  int64_t numel_ = 0;
};

template <typename T>
Tensor Tensor::from_vector(Shape shape, const std::vector<T>& values) {
  Tensor t(dtype_of<T>(), std::move(shape));
  check(int64_t(values.size()) == t.numel(), ErrorCode::invalid_argument,
        "from_vector: " + std::to_string(values.size()) + " values for shape " +
            shape_str(t.shape()));
  T* p = static_cast<T*>(t.raw_data());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace slim
