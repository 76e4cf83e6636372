// Helpers for tests that run one ref kernel at a time: build a one-node graph by hand,
// create the kernel registered for it at one opset, compute, and compare.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/test_graphs.h"
#include "slim/core/convert.h"
#include "slim/runtime/kernel.h"

namespace slim::ref_test {

using Attrs = std::map<std::string, Attribute>;

// The attribute builders of test_graphs.h under the short names these tests use.
inline constexpr auto attr_i = &testing::attr_int;
inline constexpr auto attr_f = &testing::attr_float;
inline constexpr auto attr_s = &testing::attr_string;
inline constexpr auto attr_ints = &testing::attr_ints;
inline constexpr auto attr_floats = &testing::attr_floats;
inline constexpr auto attr_t = &testing::attr_tensor;

// An undefined Tensor() among `inputs` marks an omitted optional input.
inline Node make_node(const std::string& op, const std::vector<Tensor>& inputs, int num_outputs,
                      Attrs attrs) {
  Node n;
  n.name = "n0";
  n.op_type = op;
  for (size_t i = 0; i < inputs.size(); ++i)
    n.inputs.push_back(inputs[i].defined() ? "in" + std::to_string(i) : "");
  for (int i = 0; i < num_outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// The ref kernel of `node` at `opset`, built as compile would (attribute errors surface here).
inline std::unique_ptr<OpKernel> make_kernel(const Node& node, int64_t opset) {
  const KernelDef* def = ref_kernel_registry().find(node.op_type, "", opset);
  if (!def)
    throw Error(ErrorCode::unsupported,
                "no ref kernel for " + node.op_type + " at opset " + std::to_string(opset));
  return def->factory(node, opset);
}

// Runs op at `opset` on `inputs` and returns its outputs.
inline std::vector<Tensor> run_op(const std::string& op, int64_t opset,
                                  const std::vector<Tensor>& inputs, Attrs attrs = {},
                                  int num_outputs = 1) {
  const Node node = make_node(op, inputs, num_outputs, std::move(attrs));
  const std::unique_ptr<OpKernel> kernel = make_kernel(node, opset);
  std::vector<const Tensor*> in;
  for (const Tensor& t : inputs) in.push_back(&t);
  std::vector<Tensor> outs(static_cast<size_t>(num_outputs));
  KernelContext ctx(node, in, &outs, nullptr, nullptr);
  kernel->compute(ctx);
  return outs;
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

template <typename T>
Tensor tensor(Shape shape, std::vector<T> v) {
  return Tensor::from_vector<T>(std::move(shape), v);
}

inline std::vector<float> arange_f(int64_t n, float start = 0, float step = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + step * float(i);
  return v;
}

// The message of the slim::Error that fn throws, with its code checked.
template <typename Fn>
std::string error_of(ErrorCode code, Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

inline void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                            float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.f, std::fabs(want[i]))) << "at " << i;
}

}  // namespace slim::ref_test
