// Value: what an ONNX value holds at run time: a tensor, a sequence of tensors, or an
// optional (empty, or holding a tensor or a sequence). Tensors are the common case and
// convert implicitly; a sequence's list of tensors is immutable and shared by copies.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/tensor.h"

namespace slim {

class Value {
 public:
  enum class Kind : uint8_t { tensor, sequence, optional };

  Value() = default;                             // undefined: defined() == false
  Value(Tensor t) : tensor_(std::move(t)) {}     // NOLINT(google-explicit-constructor)
  // A sequence; `elem` is its element type, needed when it is empty.
  static Value sequence(std::vector<Tensor> items, std::optional<DType> elem = std::nullopt);
  static Value none();                   // an empty optional
  static Value optional(Value element);  // an optional holding a tensor or a sequence

  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::tensor; }
  bool is_sequence() const { return kind_ == Kind::sequence; }
  bool is_optional() const { return kind_ == Kind::optional; }
  bool defined() const { return kind_ != Kind::tensor || tensor_.defined(); }

  // The tensor of a tensor value; invalid_argument for any other kind.
  const Tensor& tensor() const {
    if (kind_ != Kind::tensor) expect(Kind::tensor);
    return tensor_;
  }
  Tensor& tensor() {
    if (kind_ != Kind::tensor) expect(Kind::tensor);
    return tensor_;
  }
  // A sequence's tensors and element type (nullopt: an empty sequence of unknown type).
  const std::vector<Tensor>& items() const;
  std::optional<DType> elem_dtype() const;
  // An optional's element: has_element() is false for an empty one, and element() of an
  // empty one is invalid_argument.
  bool has_element() const;
  Value element() const;

  // The same value with every tensor t in it (the tensor, the sequence's, the optional's)
  // replaced by fn(t); shares what fn returns unchanged.
  template <typename Fn>
  Value map_tensors(Fn&& fn) const;

  std::string describe() const;  // "f32[2,3]", "seq(f32)[3 items]", "optional(none)"

 private:
  struct Seq {
    std::vector<Tensor> items;
    std::optional<DType> elem;
  };
  [[gnu::cold]] void expect(Kind kind) const;  // invalid_argument unless of that kind
  Kind kind_ = Kind::tensor;
  Tensor tensor_;                    // a tensor, or the tensor an optional holds
  std::shared_ptr<const Seq> seq_;  // a sequence, or the sequence an optional holds
};

template <typename Fn>
Value Value::map_tensors(Fn&& fn) const {
  Value out = *this;
  if (tensor_.defined()) out.tensor_ = fn(tensor_);
  if (seq_) {
    std::vector<Tensor> items;
    bool changed = false;
    items.reserve(seq_->items.size());
    for (const auto& t : seq_->items) {
      items.push_back(fn(t));
      changed = changed || items.back().storage() != t.storage();
    }
    if (changed) out.seq_ = std::make_shared<const Seq>(Seq{std::move(items), seq_->elem});
  }
  return out;
}

}  // namespace slim
