#include "slim/onnx/value.h"

#include "slim/core/error.h"

namespace slim {

Value Value::sequence(std::vector<Tensor> items, std::optional<DType> elem) {
  if (!elem && !items.empty()) elem = items.front().dtype();
  for (const auto& t : items)
    if (!t.defined() || t.dtype() != *elem)
      throw Error(ErrorCode::invalid_argument, "a sequence holds tensors of one type: got " +
                                                   t.describe() + " in a sequence of " +
                                                   std::string(dtype_name(*elem)));
  Value v;
  v.kind_ = Kind::sequence;
  v.seq_ = std::make_shared<const Seq>(Seq{std::move(items), elem});
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::optional;
  return v;
}

Value Value::optional(Value element) {
  if (element.is_tensor() ? !element.tensor_.defined() : !element.is_sequence())
    throw Error(ErrorCode::invalid_argument,
                "an optional holds a tensor or a sequence, not " + element.describe());
  element.kind_ = Kind::optional;
  return element;
}

// Messages are built only on failure: tensor() is on every step's path.
void Value::expect(Kind kind) const {
  if (kind_ != kind)
    throw Error(ErrorCode::invalid_argument,
                std::string(kind == Kind::tensor ? "expected a tensor" : "expected a sequence") +
                    ", got " + describe());
}

const std::vector<Tensor>& Value::items() const {
  expect(Kind::sequence);
  return seq_->items;
}

std::optional<DType> Value::elem_dtype() const {
  expect(Kind::sequence);
  return seq_->elem;
}

bool Value::has_element() const {
  return kind_ == Kind::optional && (tensor_.defined() || seq_ != nullptr);
}

Value Value::element() const {
  if (kind_ != Kind::optional)
    throw Error(ErrorCode::invalid_argument, "expected an optional, got " + describe());
  check(has_element(), ErrorCode::invalid_argument, "the optional is empty");
  Value v = *this;
  v.kind_ = seq_ ? Kind::sequence : Kind::tensor;
  return v;
}

std::string Value::describe() const {
  auto seq_name = [&] {
    return "seq(" + (seq_->elem ? std::string(dtype_name(*seq_->elem)) : std::string("?")) + ")[" +
           std::to_string(seq_->items.size()) + " items]";
  };
  switch (kind_) {
    case Kind::tensor:
      return tensor_.defined() ? tensor_.describe() : "undefined";
    case Kind::sequence:
      return seq_name();
    case Kind::optional:
      if (!has_element()) return "optional(none)";
      return "optional(" + (seq_ ? seq_name() : tensor_.describe()) + ")";
  }
  return "?";
}

}  // namespace slim
