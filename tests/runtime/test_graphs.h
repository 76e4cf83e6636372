// Small in-memory models for runtime tests: ModelBuilder assembles a Model node by node
// (no .onnx file needed), and test_kernel_registry() is a tiny "test" provider so session
// tests do not depend on the ref kernels. Kernel authors may use ModelBuilder freely.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/error.h"
#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"
#include "slim/runtime/kernel.h"
#include "slim/runtime/session.h"

namespace slim::testing {

// One dim of an input shape: a number is fixed, a string is symbolic.
struct DimSpec {
  Dim dim;
  DimSpec(int64_t v) { dim.value = v; }
  DimSpec(int v) { dim.value = v; }
  DimSpec(const char* param) { dim.param = param; }
};

inline std::vector<Dim> dims(const std::vector<DimSpec>& specs) {
  std::vector<Dim> out;
  for (const auto& s : specs) out.push_back(s.dim);
  return out;
}

inline Attribute attr_int(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::i;
  a.i = v;
  return a;
}
inline Attribute attr_float(float v) {
  Attribute a;
  a.kind = Attribute::Kind::f;
  a.f = v;
  return a;
}
inline Attribute attr_ints(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::ints;
  a.ints = std::move(v);
  return a;
}
inline Attribute attr_floats(std::vector<float> v) {
  Attribute a;
  a.kind = Attribute::Kind::floats;
  a.floats = std::move(v);
  return a;
}
inline Attribute attr_string(std::string v) {
  Attribute a;
  a.kind = Attribute::Kind::s;
  a.s = std::move(v);
  return a;
}
inline Attribute attr_tensor(Tensor t) {
  Attribute a;
  a.kind = Attribute::Kind::t;
  a.t = std::move(t);
  return a;
}

// The message of the slim::Error fn throws ("(no error)" when it throws none); its code
// goes to *code when given.
inline std::string error_of(const std::function<void()>& fn, ErrorCode* code = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "(no error)";
}

inline Tensor f32(Shape shape, std::vector<float> v) { return Tensor::from_vector<float>(shape, v); }
inline Tensor i64(Shape shape, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(shape, v);
}

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17, std::string name = "test_graph") {
    model_.ir_version = 8;
    model_.opsets[""] = opset;
    model_.graph.name = std::move(name);
  }

  // A graph input; `shape` absent means rank unknown.
  ModelBuilder& input(const std::string& name, std::optional<DType> dtype,
                      std::optional<std::vector<DimSpec>> shape) {
    model_.graph.inputs.push_back(info(name, dtype, shape));
    return *this;
  }
  ModelBuilder& output(const std::string& name, std::optional<DType> dtype = std::nullopt,
                       std::optional<std::vector<DimSpec>> shape = std::nullopt) {
    model_.graph.outputs.push_back(info(name, dtype, shape));
    return *this;
  }
  // An initializer; `overridable` also declares it as an input run() may replace.
  ModelBuilder& initializer(const std::string& name, Tensor t, bool overridable = false) {
    if (overridable) {
      std::vector<DimSpec> shape;
      for (int64_t d : t.shape()) shape.emplace_back(d);
      model_.graph.overridable_inputs.push_back(info(name, t.dtype(), shape));
    }
    model_.graph.initializers[name] = std::move(t);
    return *this;
  }
  // Adds a node (named "<op>_<index>" when `name` is empty) and returns it, so a test can
  // set attributes: b.node("Reshape", {"x", "s"}, {"y"}).attrs["allowzero"] = attr_int(1);
  Node& node(const std::string& op_type, std::vector<std::string> inputs,
             std::vector<std::string> outputs, std::string name = "",
             std::string domain = "") {
    Node n;
    n.op_type = op_type;
    n.domain = std::move(domain);
    n.inputs = std::move(inputs);
    n.outputs = std::move(outputs);
    n.name = name.empty() ? op_type + "_" + std::to_string(model_.graph.nodes.size()) : name;
    model_.graph.nodes.push_back(std::move(n));
    return model_.graph.nodes.back();
  }
  ModelBuilder& opset(const std::string& domain, int64_t version) {
    model_.opsets[domain] = version;
    return *this;
  }

  Model& model() { return model_; }
  Model build() const { return model_; }

 private:
  static ValueInfo info(const std::string& name, std::optional<DType> dtype,
                        const std::optional<std::vector<DimSpec>>& shape) {
    ValueInfo vi;
    vi.name = name;
    vi.dtype = dtype;
    if (shape) vi.shape = dims(*shape);
    return vi;
  }
  Model model_;
};

// Row-major values of a tensor as doubles (any numeric dtype used by the test kernels).
inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out;
  Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype()) {
      case DType::f32: out.push_back(c.data<float>()[i]); break;
      case DType::i64: out.push_back(double(c.data<int64_t>()[i])); break;
      case DType::boolean: out.push_back(c.data<bool>()[i] ? 1.0 : 0.0); break;
      default: throw Error(ErrorCode::internal, "values_of: dtype not used by the tests");
    }
  }
  return out;
}

// How often test kernels ran, so tests can tell folded nodes from executed ones.
inline std::atomic<int64_t>& test_kernel_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

namespace detail {

// Numpy broadcasting over f32 or i64, enough for the test provider's Add/Mul/Sub/Div.
template <typename T, typename Op>
void broadcast_binary(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.required_input(0);
  const Tensor& b = ctx.required_input(1);
  const int rank = std::max(a.rank(), b.rank());
  Shape out_shape(size_t(rank), 1);
  auto dim_at = [&](const Tensor& t, int d) {
    const int k = d - (rank - t.rank());
    return k < 0 ? int64_t(1) : t.shape()[size_t(k)];
  };
  for (int d = 0; d < rank; ++d) {
    const int64_t x = dim_at(a, d), y = dim_at(b, d);
    if (x != y && x != 1 && y != 1)
      ctx.fail(ErrorCode::invalid_argument,
               "cannot broadcast " + shape_str(a.shape()) + " with " + shape_str(b.shape()));
    out_shape[size_t(d)] = x == 1 ? y : x;
  }
  Tensor& out = ctx.output(0, a.dtype(), out_shape);
  const Shape os = contiguous_strides(out_shape);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t coord = (i / os[size_t(d)]) % std::max<int64_t>(out_shape[size_t(d)], 1);
      const int64_t da = dim_at(a, d), db = dim_at(b, d);
      if (da != 1) ia += coord * sa;
      if (db != 1) ib += coord * sb;
      sa *= da;
      sb *= db;
    }
    po[i] = op(pa[ia], pb[ib]);
  }
}

template <typename Op>
KernelFactory binary_kernel(Op op) {
  return simple_kernel([op](KernelContext& ctx) {
    ++test_kernel_calls();
    const Tensor& a = ctx.required_input(0);
    const Tensor& b = ctx.required_input(1);
    if (a.dtype() != b.dtype())
      ctx.fail(ErrorCode::invalid_model, "input dtypes differ");
    if (a.dtype() == DType::f32)
      broadcast_binary<float>(ctx, op);
    else if (a.dtype() == DType::i64)
      broadcast_binary<int64_t>(ctx, op);
    else
      ctx.fail(ErrorCode::unsupported, "test kernels take f32 or i64");
  });
}

}  // namespace detail

// The "test" provider: Add Mul Sub Div Relu Identity Shape Size Reshape NonZero, plus
// Tick (a copy that counts its runs), Flaky (fails on inputs of ones, like an index
// check that a probe run with made-up data trips over) and WithBody (a copy that carries
// a subgraph attribute). Registered on first use.
inline const KernelRegistry& test_kernel_registry() {
  static const KernelRegistry* registry = [] {
    auto* r = new KernelRegistry("test");
    r->add({"Add", "", 1, INT_MAX, detail::binary_kernel([](auto x, auto y) { return x + y; }), {}});
    r->add({"Mul", "", 1, INT_MAX, detail::binary_kernel([](auto x, auto y) { return x * y; }), {}});
    r->add({"Sub", "", 1, INT_MAX, detail::binary_kernel([](auto x, auto y) { return x - y; }), {}});
    r->add({"Div", "", 1, INT_MAX, detail::binary_kernel([](auto x, auto y) { return x / y; }), {}});
    r->add({"Relu", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              Tensor& y = ctx.output(0, DType::f32, x.shape());
              for (int64_t i = 0; i < x.numel(); ++i)
                y.data<float>()[i] = std::max(0.f, x.data<float>()[i]);
            }), {}});
    // Identity and Reshape return views of their input, as real kernels may.
    r->add({"Identity", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              ctx.set_output(0, ctx.required_input(0));
            }), {}});
    r->add({"Reshape", "", 5, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              const Tensor& s = ctx.required_input(1);
              Shape shape(s.data<int64_t>(), s.data<int64_t>() + s.numel());
              for (size_t i = 0; i < shape.size(); ++i)
                if (shape[i] == 0 && int(i) < x.rank()) shape[i] = x.shape()[i];
              ctx.set_output(0, x.reshape(shape));
            }), {1}});
    r->add({"Shape", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              Tensor& y = ctx.output(0, DType::i64, {int64_t(x.rank())});
              for (int d = 0; d < x.rank(); ++d) y.data<int64_t>()[d] = x.shape()[size_t(d)];
            }), {}});
    r->add({"Size", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              ctx.output(0, DType::i64, {}).data<int64_t>()[0] = ctx.required_input(0).numel();
            }), {}});
    r->add({"NonZero", "", 9, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              std::vector<int64_t> hits;
              for (int64_t i = 0; i < x.numel(); ++i)
                if (x.data<float>()[i] != 0.f) hits.push_back(i);
              const Shape strides = contiguous_strides(x.shape());
              Tensor& y = ctx.output(0, DType::i64, {int64_t(x.rank()), int64_t(hits.size())});
              for (int d = 0; d < x.rank(); ++d)
                for (size_t k = 0; k < hits.size(); ++k)
                  y.data<int64_t>()[size_t(d) * hits.size() + k] =
                      (hits[k] / strides[size_t(d)]) % x.shape()[size_t(d)];
            }), {0}});
    r->add({"Tick", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              ctx.output(0, x.dtype(), x.shape()).copy_from(x);
            }), {}});
    r->add({"Flaky", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              bool all_ones = x.numel() > 0;
              for (int64_t i = 0; i < x.numel(); ++i) all_ones &= x.data<float>()[i] == 1.f;
              if (all_ones) ctx.fail(ErrorCode::invalid_argument, "all inputs are one");
              ctx.output(0, x.dtype(), x.shape()).copy_from(x);
            }), {}});
    // Stands in for If/Loop: it owns a subgraph attribute (which may read outer values)
    // and copies its input.
    r->add({"WithBody", "", 1, INT_MAX, simple_kernel([](KernelContext& ctx) {
              ++test_kernel_calls();
              const Tensor& x = ctx.required_input(0);
              ctx.output(0, x.dtype(), x.shape()).copy_from(x);
            }), {}});
    register_provider(r);
    return r;
  }();
  return *registry;
}

// Session options that select the test provider.
inline SessionOptions test_options() {
  test_kernel_registry();
  SessionOptions o;
  o.providers = {"test"};
  o.num_threads = 1;
  return o;
}

}  // namespace slim::testing
