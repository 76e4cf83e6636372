#include "slim/core/tensor.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <vector>

namespace slim {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorCode::invalid_argument, "negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw Error(ErrorCode::invalid_argument, "shape " + shape_str(shape) + " is too large");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

namespace {

// Large tensor buffers: mappings of their own, aligned to 2 MiB and advised to use
// transparent huge pages, so a first touch faults in 2 MiB instead of 4 KiB (compiling a
// large-batch CNN used to spend most of its time in 4 KiB page faults, about 10 us each
// in a VM), and the kernel's zero pages make a memset unnecessary. Freed mappings are
// kept for reuse (up to kCacheBytes), because tensors of the same sizes come and go on
// every run and a fresh mapping would fault all its pages in again.
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kCacheBytes = size_t(1) << 30;

struct Mapping {
  void* base;
  size_t mapped;  // bytes of the whole mapping
  void* data;     // 2 MiB-aligned start within it
  size_t usable;  // bytes from data to the end
};

struct MappingCache {
  std::mutex mu;
  std::vector<Mapping> free;
  size_t bytes = 0;
};

MappingCache& mapping_cache() {
  static MappingCache* c = new MappingCache();  // never destroyed: tensors may outlive statics
  return *c;
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kTensorAlignment - 1) /
                         kTensorAlignment * kTensorAlignment;
  auto fail = [&] {
    return Error(ErrorCode::resource_exhausted, "cannot allocate " + std::to_string(bytes) + " bytes for a tensor");
  };
  if (rounded >= kHuge) {
    const size_t need = (rounded + kHuge - 1) / kHuge * kHuge;
    Mapping m{};
    bool reused = false;
    {
      MappingCache& c = mapping_cache();
      std::lock_guard<std::mutex> lock(c.mu);
      size_t best = c.free.size();
      for (size_t i = 0; i < c.free.size(); ++i)
        if (c.free[i].usable >= need && c.free[i].usable <= 2 * need &&
            (best == c.free.size() || c.free[i].usable < c.free[best].usable))
          best = i;
      if (best < c.free.size()) {
        m = c.free[best];
        c.free.erase(c.free.begin() + std::ptrdiff_t(best));
        c.bytes -= m.mapped;
        reused = true;
      }
    }
    if (reused) {
      std::memset(m.data, 0, rounded);
    } else {
      const size_t mapped = need + kHuge;
      void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) throw fail();
      const uintptr_t at = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) / kHuge * kHuge;
      m = {base, mapped, reinterpret_cast<void*>(at), mapped - (at - reinterpret_cast<uintptr_t>(base))};
      ::madvise(m.data, m.usable, MADV_HUGEPAGE);  // advisory
    }
    auto s = std::shared_ptr<Storage>(new Storage(m.data, bytes, true, nullptr));
    s->map_base_ = m.base;
    s->mapped_ = m.mapped;
    return s;
  }
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (!p) throw fail();
  std::memset(p, 0, rounded);
  return std::shared_ptr<Storage>(new Storage(p, bytes, true, nullptr));
}

size_t Storage::release_cached() {
  std::vector<Mapping> free;
  {
    MappingCache& c = mapping_cache();
    std::lock_guard<std::mutex> lock(c.mu);
    free.swap(c.free);
    c.bytes = 0;
  }
  size_t bytes = 0;
  for (const Mapping& m : free) {
    ::munmap(m.base, m.mapped);
    bytes += m.mapped;
  }
  return bytes;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes,
                                         std::shared_ptr<const void> owner) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, false, std::move(owner)));
}

Storage::~Storage() {
  if (owned_ && mapped_) {
    MappingCache& c = mapping_cache();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.bytes + mapped_ <= kCacheBytes) {
        c.free.push_back({map_base_, mapped_, data_,
                          mapped_ - (reinterpret_cast<uintptr_t>(data_) - reinterpret_cast<uintptr_t>(map_base_))});
        c.bytes += mapped_;
        return;
      }
    }
    ::munmap(map_base_, mapped_);
  } else if (owned_) {
    std::free(data_);
  }
}

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = shape_numel(shape_);
  if (size_t(numel_) > std::numeric_limits<size_t>::max() / dtype_size(dtype))
    throw Error(ErrorCode::invalid_argument, "tensor " + shape_str(shape_) + " is too large");
  strides_ = contiguous_strides(shape_);
  storage_ = Storage::allocate(nbytes());
}

Tensor Tensor::borrow(DType dtype, Shape shape, void* data, std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.strides_ = contiguous_strides(t.shape_);
  t.storage_ = Storage::borrow(data, t.nbytes(), std::move(owner));
  return t;
}

int64_t Tensor::dim(int axis) const {
  const int r = rank();
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    throw Error(ErrorCode::invalid_argument, "axis " + std::to_string(axis) + " out of range for " + describe());
  return shape_[size_t(axis)];
}

bool Tensor::is_contiguous() const {
  if (numel_ <= 1) return true;
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

void Tensor::check_type(DType t) const {
  const bool ok = t == dtype_ ||
                  (t == DType::u16 && (dtype_ == DType::f16 || dtype_ == DType::bf16));
  if (!ok)
    throw Error(ErrorCode::internal, "tensor of dtype " + std::string(dtype_name(dtype_)) +
                                         " accessed as " + std::string(dtype_name(t)));
}

Tensor Tensor::view(Shape shape, Shape strides, int64_t offset_elems) const {
  check(defined(), ErrorCode::internal, "view of an undefined tensor");
  check(shape.size() == strides.size(), ErrorCode::internal, "view: shape/strides rank differ");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.offset_ = offset_ + offset_elems;
  t.numel_ = shape_numel(t.shape_);
  // Bounds: the largest element reached must lie inside the storage.
  if (t.numel_ > 0) {
    int64_t lo = t.offset_, hi = t.offset_;
    for (size_t i = 0; i < t.shape_.size(); ++i) {
      const int64_t reach = (t.shape_[i] - 1) * t.strides_[i];
      (reach < 0 ? lo : hi) += reach;
    }
    const int64_t elems = int64_t(storage_->bytes() / dtype_size(dtype_));
    check(lo >= 0 && hi < elems, ErrorCode::internal, "view outside its storage");
  }
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  check(is_contiguous(), ErrorCode::internal, "reshape of a non-contiguous tensor");
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw Error(ErrorCode::invalid_argument, "reshape: more than one -1 in " + shape_str(shape));
      infer = int(i);
    } else {
      if (shape[i] < 0) throw Error(ErrorCode::invalid_argument, "reshape: bad shape " + shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel_ % known != 0)
      throw Error(ErrorCode::invalid_argument,
                  "reshape: cannot infer -1 of " + shape_str(shape) + " from " + describe());
    shape[size_t(infer)] = numel_ / known;
  }
  if (shape_numel(shape) != numel_)
    throw Error(ErrorCode::invalid_argument,
                "reshape: " + describe() + " to " + shape_str(shape) + " changes the element count");
  Shape st = contiguous_strides(shape);
  return view(std::move(shape), std::move(st), 0);
}

Tensor Tensor::permute(const std::vector<int>& perm) const {
  check(int(perm.size()) == rank(), ErrorCode::invalid_argument, "permute: wrong rank");
  Shape sh(perm.size()), st(perm.size());
  std::vector<bool> seen(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    check(perm[i] >= 0 && perm[i] < rank() && !seen[size_t(perm[i])], ErrorCode::invalid_argument,
          "permute: invalid permutation");
    seen[size_t(perm[i])] = true;
    sh[i] = shape_[size_t(perm[i])];
    st[i] = strides_[size_t(perm[i])];
  }
  return view(std::move(sh), std::move(st), 0);
}

Tensor Tensor::slice(int axis, int64_t begin, int64_t end) const {
  const int r = rank();
  if (axis < 0) axis += r;
  check(axis >= 0 && axis < r, ErrorCode::invalid_argument, "slice: bad axis");
  check(0 <= begin && begin <= end && end <= shape_[size_t(axis)], ErrorCode::invalid_argument,
        "slice: range out of bounds");
  Shape sh = shape_;
  sh[size_t(axis)] = end - begin;
  return view(std::move(sh), strides_, begin * strides_[size_t(axis)]);
}

namespace {
// Copies a strided source into a strided destination, element by element, innermost
// dimension in a tight loop.
void strided_copy(const char* src, const Shape& sst, char* dst, const Shape& dstst,
                  const Shape& shape, size_t esize) {
  const size_t r = shape.size();
  if (r == 0) {
    std::memcpy(dst, src, esize);
    return;
  }
  std::vector<int64_t> idx(r, 0);
  const int64_t inner = shape[r - 1];
  const int64_t s_in = sst[r - 1] * int64_t(esize), d_in = dstst[r - 1] * int64_t(esize);
  while (true) {
    int64_t so = 0, doff = 0;
    for (size_t i = 0; i + 1 < r; ++i) {
      so += idx[i] * sst[i];
      doff += idx[i] * dstst[i];
    }
    const char* s = src + so * int64_t(esize);
    char* d = dst + doff * int64_t(esize);
    if (s_in == int64_t(esize) && d_in == int64_t(esize)) {
      std::memcpy(d, s, size_t(inner) * esize);
    } else {
      for (int64_t k = 0; k < inner; ++k) std::memcpy(d + k * d_in, s + k * s_in, esize);
    }
    int i = int(r) - 2;
    while (i >= 0) {
      if (++idx[size_t(i)] < shape[size_t(i)]) break;
      idx[size_t(i)] = 0;
      --i;
    }
    if (i < 0) return;
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (src.dtype_ != dtype_ || src.shape_ != shape_)
    throw Error(ErrorCode::internal, "copy_from: " + src.describe() + " into " + describe());
  if (numel_ == 0) return;
  if (is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  strided_copy(static_cast<const char*>(src.raw_data()), src.strides_,
               static_cast<char*>(raw_data()), strides_, shape_, element_size());
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  check(defined(), ErrorCode::internal, "clone of an undefined tensor");
  Tensor t(dtype_, shape_);
  t.copy_from(*this);
  return t;
}

std::string Tensor::describe() const {
  if (!defined()) return "<undefined>";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

}  // namespace slim
