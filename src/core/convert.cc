#include "slim/core/convert.h"

#include <type_traits>

#include "slim/core/dispatch.h"

namespace slim {

namespace {
template <typename To, typename From>
To convert_one(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>)
      return float(v) != 0.f;
    else
      return v != From(0);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<From, double>) return To(float(v));
    else return To(float(v));
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(float(v));
  } else {
    return static_cast<To>(v);
  }
}
}  // namespace

Tensor convert_dtype(const Tensor& t, DType to) {
  const Tensor src = t.contiguous();
  if (src.dtype() == to) return src;
  Tensor out(to, src.shape());
  const int64_t n = src.numel();
  visit_dtype(src.dtype(), [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    const From* in = static_cast<const From*>(src.raw_data());
    visit_dtype(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      To* o = static_cast<To*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) o[i] = convert_one<To, From>(in[i]);
    });
  });
  return out;
}

std::vector<int64_t> tensor_to_int64s(const Tensor& t) {
  const Tensor c = convert_dtype(t, DType::i64);
  const int64_t* p = c.data<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

std::vector<double> tensor_to_doubles(const Tensor& t) {
  const Tensor c = convert_dtype(t, DType::f64);
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

}  // namespace slim
