// Ref kernels that draw random numbers: RandomUniform, RandomNormal, their -Like forms
// and Bernoulli. The compiler never folds them (session.cc, is_nondeterministic). With a
// `seed` attribute every run draws the same values (a fresh MT19937 per run, like
// Dropout); without one each run is seeded from the OS. The ONNX spec leaves the values
// to the implementation, so they are not meant to match other runtimes.
#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

enum class Draw { uniform, normal, bernoulli };

class RandomOp final : public OpKernel {
 public:
  // `like`: the output takes its shape (and, without `dtype`, its dtype) from input 0.
  RandomOp(const Node& node, Draw draw, bool like) : draw_(draw), like_(like) {
    if (node.has_attr("seed")) seed_ = uint32_t(int64_t(node.attr_float("seed", 0)));
    a_ = node.attr_float(draw == Draw::normal ? "mean" : "low", 0.f);
    b_ = node.attr_float(draw == Draw::normal ? "scale" : "high", 1.f);
    if (node.has_attr("dtype") || !like) {
      const int64_t code = node.attr_int("dtype", 1);
      DType t{};
      if (!onnx_dtype_to_slim(code, &t) || (draw != Draw::bernoulli && !dtype_is_float(t)))
        throw Error(ErrorCode::invalid_model, node.describe() + ": dtype " + std::to_string(code) + " is not a " +
                                                  (draw == Draw::bernoulli ? "numeric or bool" : "floating-point") + " type slim supports");
      dtype_ = t;
    }
    if (!like) {
      if (!node.has_attr("shape")) throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'shape' is missing");
      shape_ = node.attr_ints("shape");
    }
  }
  void compute(KernelContext& ctx) const override {
    const Tensor* x = like_ ? &ctx.required_input(0) : nullptr;
    const Shape shape = x ? x->shape() : shape_;
    check_output_shape(ctx, shape);
    const DType dtype = dtype_ ? *dtype_ : x->dtype();
    if (draw_ != Draw::bernoulli && !dtype_is_float(dtype))
      ctx.fail(ErrorCode::invalid_argument, "output dtype " + std::string(dtype_name(dtype)) + " is not a floating-point type; set 'dtype'");
    UniformRng rng(seed_);
    std::vector<double> v(size_t(shape_numel(shape)));
    if (draw_ == Draw::bernoulli) {
      if (!dtype_is_float(x->dtype())) ctx.fail(ErrorCode::invalid_argument, "probabilities " + x->describe() + " are not floating-point");
      const std::vector<double> p = tensor_to_doubles(*x);
      for (size_t i = 0; i < v.size(); ++i) {
        if (!(p[i] >= 0 && p[i] <= 1))
          ctx.fail(ErrorCode::invalid_argument, "probability " + std::to_string(p[i]) + " at element " + std::to_string(i) + " is outside [0, 1]");
        v[i] = rng() < p[i] ? 1 : 0;
      }
    } else {
      for (double& d : v) d = draw_ == Draw::normal ? a_ + b_ * rng.normal() : a_ + (b_ - a_) * rng();
    }
    write_doubles(ctx.output(0, dtype, shape), v);
  }

 private:
  Draw draw_;
  bool like_;
  std::optional<uint32_t> seed_;
  double a_ = 0, b_ = 1;  // low/high or mean/scale
  std::optional<DType> dtype_;
  Shape shape_;
};

KernelFactory random_factory(Draw draw, bool like) {
  return [=](const Node& n, int64_t) -> std::unique_ptr<OpKernel> { return std::make_unique<RandomOp>(n, draw, like); };
}

}  // namespace

void register_random_kernels(KernelRegistry& r) {
  r.add({"RandomUniform", "", 1, INT_MAX, random_factory(Draw::uniform, false), {}});
  r.add({"RandomNormal", "", 1, INT_MAX, random_factory(Draw::normal, false), {}});
  r.add({"RandomUniformLike", "", 1, INT_MAX, random_factory(Draw::uniform, true), {}});
  r.add({"RandomNormalLike", "", 1, INT_MAX, random_factory(Draw::normal, true), {}});
  r.add({"Bernoulli", "", 15, INT_MAX, random_factory(Draw::bernoulli, true), {}});
}

}  // namespace slim::ref
