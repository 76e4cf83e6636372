// Ref kernels that produce shapes or tensors made from shapes: Shape, Size,
// ConstantOfShape and Range. Their outputs usually feed shape inputs of later nodes, so
// the compiler folds them whenever their inputs are static.
#include <cmath>
#include <cstring>

#include "runtime/ref/ref_kernels.h"
#include "runtime/ref/ref_util.h"

namespace slim::ref {

namespace {

class ShapeOp final : public OpKernel {
 public:
  ShapeOp(const Node& node, int64_t opset) {
    if (opset >= 15) {
      start_ = node.attr_int("start", 0);
      has_end_ = node.has_attr("end");
      end_ = node.attr_int("end", 0);
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& x = ctx.required_input(0);
    const int64_t r = x.rank();
    // Out-of-range start/end clamp to [0, rank] rather than fail (opset 15 semantics).
    auto clamp_axis = [r](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + r : a, 0, r); };
    const int64_t start = clamp_axis(start_);
    const int64_t end = has_end_ ? clamp_axis(end_) : r;
    const int64_t n = std::max<int64_t>(end - start, 0);
    Tensor& out = ctx.output(0, DType::i64, {n});
    int64_t* o = out.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = x.shape()[size_t(start + i)];
  }

 private:
  int64_t start_ = 0, end_ = 0;
  bool has_end_ = false;
};

void size_op(KernelContext& ctx) {
  const Tensor& x = ctx.required_input(0);
  *ctx.output(0, DType::i64, {}).data<int64_t>() = x.numel();
}

class ConstantOfShape final : public OpKernel {
 public:
  ConstantOfShape(const Node& node, int64_t) {
    if (const Tensor* v = node.attr_tensor("value")) {
      if (!v->defined() || v->numel() != 1)
        throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'value' must hold one element");
      value_ = v->contiguous();
    } else {
      value_ = Tensor::scalar<float>(0.f);
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor& shape_t = ctx.required_input(0);
    if (shape_t.rank() != 1)
      ctx.fail(ErrorCode::invalid_argument, "shape input " + shape_t.describe() + " is not 1-D");
    const std::vector<int64_t> dims = tensor_to_int64s(shape_t);
    for (int64_t d : dims)
      if (d < 0) ctx.fail(ErrorCode::invalid_argument, "shape " + shape_str(dims) + " has a negative dim");
    check_output_shape(ctx, dims);
    Tensor& out = ctx.output(0, value_.dtype(), dims);
    const size_t es = out.element_size();
    char* o = static_cast<char*>(out.raw_data());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(o + size_t(i) * es, value_.raw_data(), es);
  }

 private:
  Tensor value_;
};

void range_op(KernelContext& ctx) {
  const Tensor* in[3] = {&ctx.required_input(0), &ctx.required_input(1), &ctx.required_input(2)};
  const char* names[3] = {"start", "limit", "delta"};
  for (int i = 0; i < 3; ++i) {
    if (in[i]->numel() != 1)
      ctx.fail(ErrorCode::invalid_argument, std::string(names[i]) + " must be a scalar, got " + in[i]->describe());
    if (in[i]->dtype() != in[0]->dtype())
      ctx.fail(ErrorCode::invalid_argument, "start, limit and delta differ in dtype");
  }
  visit_dtype(in[0]->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      ctx.fail(ErrorCode::invalid_argument, "Range of bool");
    } else {
      const T start = static_cast<const T*>(in[0]->contiguous().raw_data())[0];
      const T limit = static_cast<const T*>(in[1]->contiguous().raw_data())[0];
      const T delta = static_cast<const T*>(in[2]->contiguous().raw_data())[0];
      if (double(delta) == 0) ctx.fail(ErrorCode::invalid_argument, "delta is 0");
      const double count = std::ceil((double(limit) - double(start)) / double(delta));
      if (count > 1e12) ctx.fail(ErrorCode::resource_exhausted, "Range of " + std::to_string(count) + " elements");
      const int64_t n = count > 0 ? int64_t(count) : 0;
      Tensor& out = ctx.output(0, in[0]->dtype(), {n});
      T* o = static_cast<T*>(out.raw_data());
      // Repeated addition, as the ONNX definition loops, so float rounding matches.
      T v = start;
      for (int64_t i = 0; i < n; ++i) {
        o[i] = v;
        if (i + 1 == n) break;  // the step past the last value may not be representable
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(float(v) + float(delta));
        else v = T(v + delta);
      }
    }
  });
}

}  // namespace

void register_shape_kernels(KernelRegistry& r) {
  r.add({"Shape", "", 1, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<ShapeOp>(n, o);
         }, {}});
  r.add({"Size", "", 1, INT_MAX, simple_kernel(size_op), {}});
  r.add({"ConstantOfShape", "", 9, INT_MAX, [](const Node& n, int64_t o) -> std::unique_ptr<OpKernel> {
           return std::make_unique<ConstantOfShape>(n, o);
         }, {0}});
  r.add({"Range", "", 11, INT_MAX, simple_kernel(range_op), {0, 1, 2}});
}

}  // namespace slim::ref
