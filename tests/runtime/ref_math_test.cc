// Unit tests of the ref provider's math kernels (elementwise, reductions, softmax, matmul,
// einsum, normalizations, losses, Det), invoked directly through the kernel registry.
// Expected values were computed with numpy (float64) offline and pasted as literals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "slim/core/convert.h"
#include "slim/core/dispatch.h"
#include "runtime/ref_kernel_test_util.h"
#include "slim/runtime/kernel.h"

using namespace slim;

namespace {

using namespace ref_test;

// Runs one node of `op` at `opset` on `inputs` (an undefined Tensor is an omitted input).
std::vector<Tensor> run(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
                        const Attrs& attrs = {}, int n_out = 1) {
  return run_op(op, opset, inputs, attrs, n_out);
}

Tensor run1(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
            const Attrs& attrs = {}) {
  return run(op, opset, inputs, attrs)[0];
}

Tensor f32(Shape s, std::vector<float> v) {
  return Tensor::from_vector<float>(std::move(s), v);
}
Tensor f64(Shape s, std::vector<double> v) {
  return Tensor::from_vector<double>(std::move(s), v);
}
Tensor i64(Shape s, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(std::move(s), v);
}
Tensor i32(Shape s, std::vector<int32_t> v) {
  return Tensor::from_vector<int32_t>(std::move(s), v);
}

std::vector<float> iota_f(int n, float start = 0, float step = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = start + step * float(i);
  return v;
}

void expect_close(const Tensor& t, const Shape& shape, const std::vector<double>& want,
                  double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(t.shape(), shape) << t.describe();
  const std::vector<double> got = tensor_to_doubles(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
      continue;
    }
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << "at " << i;
  }
}

template <typename T>
void expect_exact(const Tensor& t, DType dtype, const Shape& shape, const std::vector<T>& want) {
  ASSERT_EQ(t.dtype(), dtype) << t.describe();
  ASSERT_EQ(t.shape(), shape) << t.describe();
  const T* p = static_cast<const T*>(t.raw_data());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(p[i], want[i]) << "at " << i;
}

// Runs fn and returns the slim::Error it throws (fails the test when none is thrown).
template <typename Fn>
Error error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no slim::Error thrown";
  return Error(ErrorCode::internal, "");
}

// ---------------------------------------------------------------- elementwise

TEST(RefMathElementwise, AddBroadcastsAndIntegersWrap) {
  const Tensor a = i32({2, 1}, {std::numeric_limits<int32_t>::max(), 5});
  const Tensor b = i32({3}, {1, 2, 3});
  expect_exact<int32_t>(
      run1("Add", 14, {a, b}), DType::i32, {2, 3},
      {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::min() + 1,
       std::numeric_limits<int32_t>::min() + 2, 6, 7, 8});
  expect_close(run1("Sub", 14, {f32({2}, {1.5f, 2}), f32({}, {0.5f})}), {2}, {1.0, 1.5});
}

TEST(RefMathElementwise, IntegerDivTruncatesAndRejectsZero) {
  expect_exact<int64_t>(run1("Div", 14, {i64({4}, {7, -7, 7, -7}), i64({4}, {2, 2, -2, -2})}),
                        DType::i64, {4}, {3, -3, -3, 3});
  const Error e = error_of([] { run1("Div", 14, {i64({1}, {1}), i64({1}, {0})}); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("Div node 'n0'"), std::string::npos) << e.what();
}

TEST(RefMathElementwise, ModFollowsFmodAttribute) {
  const Tensor a = i32({6}, {-4, 7, 5, 4, -7, 8});
  const Tensor b = i32({6}, {2, -3, 8, -2, 3, 5});
  // numpy.mod and numpy.fmod of the same operands.
  expect_exact<int32_t>(run1("Mod", 13, {a, b}), DType::i32, {6}, {0, -2, 5, 0, 2, 3});
  expect_exact<int32_t>(run1("Mod", 13, {a, b}, {{"fmod", attr_i(1)}}), DType::i32, {6},
                        {0, 1, 5, 0, -1, 3});
  expect_close(run1("Mod", 13, {f32({2}, {-4.5f, 7.5f}), f32({2}, {2, -2})}, {{"fmod", attr_i(1)}}),
               {2}, {-0.5, 1.5});
  EXPECT_EQ(error_of([] {
              run1("Mod", 13, {f32({1}, {1}), f32({1}, {2})});
            }).code(),
            ErrorCode::invalid_model);
}

TEST(RefMathElementwise, PowMixedTypes) {
  expect_exact<int32_t>(run1("Pow", 15, {i32({3}, {2, -3, 5}), i64({3}, {10, 3, 0})}), DType::i32,
                        {3}, {1024, -27, 1});
  expect_exact<int32_t>(run1("Pow", 15, {i32({3}, {1, 2, 3}), f32({3}, {1, 2, 3})}), DType::i32,
                        {3}, {1, 4, 27});
  expect_close(run1("Pow", 15, {f32({3}, {4, 2, 9}), i64({1}, {2})}), {3}, {16, 4, 81});
  expect_close(run1("Pow", 15, {f32({2}, {4, 9}), f32({}, {0.5f})}), {2}, {2, 3});
}

TEST(RefMathElementwise, UnaryMathAndActivations) {
  const Tensor x = f32({5}, {-3, -0.5f, 0, 0.5f, 3});
  // numpy: 1 / (1 + exp(-x)), log1p(exp(x)), and Gelu from math.erf / math.tanh.
  expect_close(run1("Sigmoid", 13, {x}), {5},
               {0.047425873, 0.377540669, 0.5, 0.622459331, 0.952574127});
  expect_close(run1("Softplus", 1, {x}), {5},
               {0.048587352, 0.474076984, 0.693147181, 0.974076984, 3.048587352});
  expect_close(
      run1("Gelu", 20, {x}), {5},
      {-0.00404969409489031, -0.15426876936299344, 0.0, 0.34573123063700656, 2.99595030590511});
  expect_close(
      run1("Gelu", 20, {x}, {{"approximate", attr_s("tanh")}}), {5},
      {-0.0036373920817729943, -0.15428599017485606, 0.0, 0.34571400982514394, 2.996362607918227});
  expect_close(run1("LeakyRelu", 16, {x}, {{"alpha", attr_f(0.1f)}}), {5},
               {-0.3, -0.05, 0, 0.5, 3});
  expect_close(run1("HardSigmoid", 6, {x}), {5}, {0, 0.4, 0.5, 0.6, 1});
  expect_close(run1("HardSwish", 14, {x}), {5},
               {0, -0.5 * 0.41666666666, 0, 0.5 * 0.5833333333, 3});
  expect_close(run1("ThresholdedRelu", 10, {x}, {{"alpha", attr_f(0.4f)}}), {5}, {0, 0, 0, 0.5, 3});
  expect_close(run1("Shrink", 9, {x}, {{"bias", attr_f(1)}, {"lambd", attr_f(0.5f)}}), {5},
               {-2, 0, 0, 0, 2});
  // Round halves to even.
  expect_close(run1("Round", 11, {f32({6}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.6f})}), {6},
               {0, 2, 2, -0, -2, 3});
  expect_exact<int8_t>(run1("Relu", 14, {Tensor::from_vector<int8_t>({3}, {-5, 0, 7})}), DType::i8,
                       {3}, {0, 0, 7});
  expect_exact<int8_t>(run1("Abs", 13, {Tensor::from_vector<int8_t>({2}, {-128, -3})}), DType::i8,
                       {2}, {-128, 3});
}

TEST(RefMathElementwise, HalfComputesInFloatAndRoundsBack) {
  Tensor h(DType::f16, {3});
  uint16_t* p = static_cast<uint16_t*>(h.raw_data());
  p[0] = f32_to_f16(1.0f);
  p[1] = f32_to_f16(4.0f);
  p[2] = f32_to_f16(-2.0f);
  const Tensor y = run1("Sqrt", 13, {h});
  ASSERT_EQ(y.dtype(), DType::f16);
  const uint16_t* q = static_cast<const uint16_t*>(y.raw_data());
  EXPECT_EQ(f16_to_f32(q[0]), 1.0f);
  EXPECT_EQ(f16_to_f32(q[1]), 2.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(q[2])));
}

TEST(RefMathElementwise, IsInfAndIsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = f32({4}, {inf, -inf, std::nanf(""), 1});
  expect_exact<bool>(run1("IsInf", 10, {x}), DType::boolean, {4}, {true, true, false, false});
  expect_exact<bool>(run1("IsInf", 10, {x}, {{"detect_positive", attr_i(0)}}), DType::boolean, {4},
                     {false, true, false, false});
  expect_exact<bool>(run1("IsNaN", 13, {x}), DType::boolean, {4}, {false, false, true, false});
}

TEST(RefMathElementwise, ComparisonsLogicAndBits) {
  const Tensor a = f32({2, 2}, {1, 2, 3, 4});
  const Tensor b = f32({2}, {2, 3});
  expect_exact<bool>(run1("Less", 13, {a, b}), DType::boolean, {2, 2}, {true, true, false, false});
  expect_exact<bool>(run1("GreaterOrEqual", 16, {a, b}), DType::boolean, {2, 2},
                     {false, false, true, true});
  expect_exact<bool>(run1("Equal", 13, {a, b}), DType::boolean, {2, 2},
                     {false, false, false, false});
  const Tensor t = Tensor::from_vector<bool>({4}, {true, true, false, false});
  const Tensor u = Tensor::from_vector<bool>({4}, {true, false, true, false});
  expect_exact<bool>(run1("Xor", 7, {t, u}), DType::boolean, {4}, {false, true, true, false});
  expect_exact<bool>(run1("Not", 1, {t}), DType::boolean, {4}, {false, false, true, true});
  const Tensor x = Tensor::from_vector<uint8_t>({3}, {16, 4, 1});
  const Tensor s = Tensor::from_vector<uint8_t>({3}, {1, 2, 9});
  expect_exact<uint8_t>(run1("BitShift", 11, {x, s}, {{"direction", attr_s("RIGHT")}}), DType::u8,
                        {3}, {8, 1, 0});
  expect_exact<uint8_t>(run1("BitShift", 11, {x, s}, {{"direction", attr_s("LEFT")}}), DType::u8,
                        {3}, {32, 16, 0});
  const Error e = error_of([&] { run1("BitShift", 11, {x, s}, {{"direction", attr_s("UP")}}); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_model);
  EXPECT_NE(std::string(e.what()).find("BitShift node 'n0'"), std::string::npos) << e.what();
  expect_exact<int32_t>(run1("BitwiseXor", 18, {i32({2}, {12, -1}), i32({2}, {10, 5})}), DType::i32,
                        {2}, {6, -6});
}

TEST(RefMathElementwise, VariadicBroadcastAndNaN) {
  const Tensor a = f32({3}, {1, std::nanf(""), 3});
  const Tensor b = f32({2, 1}, {2, 0});
  expect_close(run1("Max", 13, {a, b}), {2, 3},
               {2, std::numeric_limits<double>::quiet_NaN(), 3, 1,
                std::numeric_limits<double>::quiet_NaN(), 3});
  expect_close(run1("Mean", 13, {f32({2}, {1, 2}), f32({2}, {3, 4}), f32({1}, {5})}), {2},
               {3, 11.0 / 3});
  expect_exact<int64_t>(run1("Sum", 13, {i64({2}, {1, 2}), i64({2}, {3, 4}), i64({}, {10})}),
                        DType::i64, {2}, {14, 16});
  expect_close(run1("Min", 13, {f32({2}, {1, 5})}), {2}, {1, 5});
}

TEST(RefMathElementwise, WhereAndPRelu) {
  const Tensor c = Tensor::from_vector<bool>({2, 1}, {true, false});
  expect_exact<int64_t>(run1("Where", 16, {c, i64({3}, {1, 2, 3}), i64({}, {-1})}), DType::i64,
                        {2, 3}, {1, 2, 3, -1, -1, -1});
  expect_close(run1("PRelu", 16, {f32({2, 2}, {-1, 2, -3, 4}), f32({2}, {0.5f, 0.25f})}), {2, 2},
               {-0.5, 2, -1.5, 4});
  EXPECT_EQ(error_of([] {
              run1("PRelu", 16, {f32({2}, {1, 2}), f32({2, 2}, {1, 2, 3, 4})});
            }).code(),
            ErrorCode::invalid_argument);
}

TEST(RefMathElementwise, LegacyBroadcastBeforeOpset7) {
  // Opset 6 with broadcast=1 and axis=1: B (3) aligns with A's dim 1, not its last dim.
  const Tensor a = f32({2, 3, 2}, iota_f(12));
  const Tensor b = f32({3}, {100, 200, 300});
  expect_close(run1("Add", 6, {a, b}, {{"broadcast", attr_i(1)}, {"axis", attr_i(1)}}), {2, 3, 2},
               {100, 101, 202, 203, 304, 305, 106, 107, 208, 209, 310, 311});
  expect_close(run1("Div", 6, {a, b}, {{"broadcast", attr_i(1)}, {"axis", attr_i(-2)}}), {2, 3, 2},
               {0, 0.01, 0.01, 0.015, 4 / 300.0, 5 / 300.0, 0.06, 0.07, 0.04, 0.045, 10 / 300.0,
                11 / 300.0});
  // PRelu-6 applies a channel-sized slope along dim 1 (PyTorch's multi-parameter export).
  expect_close(run1("PRelu", 6, {f32({1, 2, 2}, {-1, -2, -3, 4}), f32({2}, {0.5f, 0.25f})}),
               {1, 2, 2}, {-0.5, -1, -0.75, 4});
}

TEST(RefMathElementwise, ClipAttributesBeforeOpset11InputsAfter) {
  const Tensor x = f32({4}, {-2, 0.5f, 3, 10});
  expect_close(run1("Clip", 6, {x}, {{"min", attr_f(0)}, {"max", attr_f(2)}}), {4}, {0, 0.5, 2, 2});
  expect_close(run1("Clip", 6, {x}, {{"max", attr_f(1)}}), {4}, {-2, 0.5, 1, 1});
  expect_close(run1("Clip", 13, {x, Tensor(), f32({}, {3})}), {4}, {-2, 0.5, 3, 3});
  expect_close(run1("Clip", 13, {x, f32({}, {0})}), {4}, {0, 0.5, 3, 10});
  expect_exact<int8_t>(run1("Clip", 13,
                            {Tensor::from_vector<int8_t>({3}, {-100, 5, 100}),
                             Tensor::scalar<int8_t>(-10), Tensor::scalar<int8_t>(10)}),
                       DType::i8, {3}, {-10, 5, 10});
}

TEST(RefMathElementwise, CastTruncatesAndCastLike) {
  const Tensor x = f32({4}, {-2.7f, -0.5f, 0.9f, 3.99f});
  expect_exact<int32_t>(run1("Cast", 13, {x}, {{"to", attr_i(6)}}), DType::i32, {4}, {-2, 0, 0, 3});
  expect_exact<bool>(run1("Cast", 13, {f32({2}, {0, 0.1f})}, {{"to", attr_i(9)}}), DType::boolean,
                     {2}, {false, true});
  const Tensor y = run1("CastLike", 15, {x, f64({}, {0})});
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_EQ(error_of([&] {
              run1("Cast", 13, {x}, {{"to", attr_i(8)}});
            }).code(),
            ErrorCode::unsupported);
  EXPECT_EQ(error_of([&] { run1("Cast", 13, {x}); }).code(), ErrorCode::invalid_model);
}

// ---------------------------------------------------------------- reductions

TEST(RefMathReduce, AxesAttributeVersusInput) {
  const Tensor x = f32({2, 3, 4}, iota_f(24, 1));
  // numpy: x.sum(axis=(0, 2)).
  expect_close(run1("ReduceSum", 11, {x}, {{"axes", attr_ints({0, -1})}, {"keepdims", attr_i(0)}}),
               {3}, {68, 100, 132});
  expect_close(run1("ReduceSum", 13, {x, i64({2}, {0, 2})}, {{"keepdims", attr_i(0)}}), {3},
               {68, 100, 132});
  expect_close(run1("ReduceSum", 13, {x, i64({2}, {0, 2})}), {1, 3, 1}, {68, 100, 132});
  // Empty axes: reduce everything, or nothing with noop_with_empty_axes.
  expect_close(run1("ReduceSum", 13, {x, i64({0}, {})}), {1, 1, 1}, {300});
  expect_close(run1("ReduceSum", 13, {x, i64({0}, {})}, {{"noop_with_empty_axes", attr_i(1)}}),
               {2, 3, 4}, std::vector<double>(tensor_to_doubles(x)));
  expect_close(run1("ReduceMean", 13, {x}, {{"axes", attr_ints({1})}}), {2, 1, 4},
               {5, 6, 7, 8, 17, 18, 19, 20});
  expect_close(run1("ReduceMean", 18, {x, i64({1}, {1})}), {2, 1, 4}, {5, 6, 7, 8, 17, 18, 19, 20});
  // The attribute form is rejected where axes became an input.
  EXPECT_EQ(error_of([&] {
              run1("ReduceMean", 18, {x}, {{"axes", attr_ints({1})}});
            }).code(),
            ErrorCode::invalid_model);
  EXPECT_EQ(error_of([&] {
              run1("ReduceSum", 13, {x, i64({2}, {1, 1})});
            }).code(),
            ErrorCode::invalid_model);
}

TEST(RefMathReduce, EveryReduceOp) {
  const Tensor x = f32({2, 3, 4}, iota_f(24, 1));
  const Attrs axis2 = {{"axes", attr_ints({2})}, {"keepdims", attr_i(0)}};
  expect_close(run1("ReduceProd", 13, {x}, axis2), {2, 3},
               {24.0, 1680.0, 11880.0, 43680.0, 116280.0, 255024.0});
  expect_close(run1("ReduceMax", 13, {x}, axis2), {2, 3}, {4, 8, 12, 16, 20, 24});
  expect_close(run1("ReduceMin", 13, {x}, axis2), {2, 3}, {1, 5, 9, 13, 17, 21});
  expect_close(run1("ReduceL1", 13, {f32({2, 2}, {-1, 2, -3, 4})}, {{"keepdims", attr_i(0)}}), {},
               {10});
  expect_close(run1("ReduceL2", 13, {x}, {{"keepdims", attr_i(0)}}), {}, {70});
  expect_close(
      run1("ReduceSumSquare", 13, {f32({2, 2}, {-1, 2, -3, 4})}, {{"axes", attr_ints({0})}}),
      {1, 2}, {10, 20});
  expect_close(run1("ReduceLogSum", 13, {f32({2}, {1, 2})}), {1}, {std::log(3.0)});
  // numpy: log(exp(x).sum(axis=1)).
  expect_close(
      run1("ReduceLogSumExp", 13, {x}, {{"axes", attr_ints({1})}, {"keepdims", attr_i(0)}}), {2, 4},
      {9.018479302594658, 10.018479302594658, 11.018479302594658, 12.018479302594656,
       21.018479302594656, 22.018479302594656, 23.018479302594656, 24.018479302594656});
  // Large inputs must not overflow exp.
  expect_close(run1("ReduceLogSumExp", 18, {f32({2}, {1000, 1000})}), {1}, {1000 + std::log(2.0)});
  expect_exact<int64_t>(run1("ReduceSum", 13, {i64({3}, {5, -2, 7})}), DType::i64, {1}, {10});
}

TEST(RefMathReduce, ArgMaxArgMin) {
  const Tensor x = f32({2, 3}, {2, 5, 5, 7, 1, 7});
  expect_exact<int64_t>(run1("ArgMax", 13, {x}, {{"axis", attr_i(1)}}), DType::i64, {2, 1}, {1, 0});
  expect_exact<int64_t>(
      run1("ArgMax", 13, {x}, {{"axis", attr_i(-1)}, {"select_last_index", attr_i(1)}}), DType::i64,
      {2, 1}, {2, 2});
  expect_exact<int64_t>(run1("ArgMin", 13, {x}, {{"keepdims", attr_i(0)}}), DType::i64, {3},
                        {0, 1, 0});
}

TEST(RefMathReduce, TopKTiesAndDirections) {
  const Tensor x = f32({2, 4}, {3, 1, 3, 2, 0, 5, 5, 1});
  auto out = run("TopK", 11, {x, i64({1}, {3})}, {}, 2);
  expect_close(out[0], {2, 3}, {3, 3, 2, 5, 5, 1});
  expect_exact<int64_t>(out[1], DType::i64, {2, 3}, {0, 2, 3, 1, 2, 3});
  out = run("TopK", 11, {x, i64({1}, {2})}, {{"largest", attr_i(0)}}, 2);
  expect_close(out[0], {2, 2}, {1, 2, 0, 1});
  expect_exact<int64_t>(out[1], DType::i64, {2, 2}, {1, 3, 0, 3});
  out = run("TopK", 1, {x}, {{"k", attr_i(1)}, {"axis", attr_i(0)}}, 2);
  expect_close(out[0], {1, 4}, {3, 5, 5, 2});
  const Error e = error_of([&] { run("TopK", 11, {x, i64({1}, {5})}, {}, 2); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("K = 5"), std::string::npos) << e.what();
}

TEST(RefMathReduce, TopKOnAMillionElementsEqualsAFullSort) {
  // Few distinct values, so most comparisons are ties decided by the index; NaNs rank
  // above every number when largest and below when smallest.
  const int64_t n = 1000000;
  std::mt19937 rng(11);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = rng() % 1000 == 0 ? std::numeric_limits<float>::quiet_NaN() : float(rng() % 5000) - 2500.f;
  const Tensor x = f32({1, n}, v);
  for (const bool largest : {true, false}) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const float va = v[size_t(a)], vb = v[size_t(b)];
      if (std::isnan(va) != std::isnan(vb)) return largest == std::isnan(va);
      if (!std::isnan(va) && va != vb) return largest ? va > vb : va < vb;
      return a < b;
    });
    for (const int64_t k : {int64_t(100), n / 2}) {
      const auto out = run("TopK", 11, {x, i64({1}, {k})}, {{"largest", attr_i(largest)}}, 2);
      ASSERT_EQ(out[1].shape(), (Shape{1, k}));
      const int64_t* idx = out[1].data<int64_t>();
      const float* val = out[0].data<float>();
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(idx[j], order[size_t(j)]) << "largest " << largest << " k " << k << " at " << j;
        ASSERT_TRUE(val[j] == v[size_t(idx[j])] || (std::isnan(val[j]) && std::isnan(v[size_t(idx[j])])));
      }
    }
  }
}

TEST(RefMathReduce, CumSumExclusiveReverse) {
  const Tensor x = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_close(run1("CumSum", 14, {x, i32({}, {1})}), {2, 3}, {1, 3, 6, 4, 9, 15});
  expect_close(run1("CumSum", 14, {x, i64({}, {0})}, {{"exclusive", attr_i(1)}}), {2, 3},
               {0, 0, 0, 1, 2, 3});
  expect_close(run1("CumSum", 14, {x, i64({}, {-1})}, {{"reverse", attr_i(1)}}), {2, 3},
               {6, 5, 3, 15, 11, 6});
  expect_close(
      run1("CumSum", 14, {x, i64({}, {1})}, {{"reverse", attr_i(1)}, {"exclusive", attr_i(1)}}),
      {2, 3}, {5, 3, 0, 11, 6, 0});
}

TEST(RefMathReduce, SoftmaxAxisSemanticsByOpset) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = float(i) / 7.0f;
  const Tensor x = f32({2, 3, 4}, v);
  // Opset 13: along axis 1 only (numpy on the 3-D array).
  const Tensor y13 = run1("Softmax", 13, {x}, {{"axis", attr_i(1)}});
  expect_close(y13, {2, 3, 4},
               {0.169304724, 0.169304724, 0.169304724, 0.169304724, 0.299803952, 0.299803952,
                0.299803952, 0.299803952, 0.530891324, 0.530891324, 0.530891324, 0.530891324,
                0.169304724, 0.169304724, 0.169304724, 0.169304724, 0.299803952, 0.299803952,
                0.299803952, 0.299803952, 0.530891324, 0.530891324, 0.530891324, 0.530891324});
  // Opset 11: the input is coerced to (2, 12) and normalized over all 12.
  const Tensor y11 = run1("Softmax", 11, {x});
  const std::vector<double> got = tensor_to_doubles(y11);
  const double want11[6] = {0.03373047405873204,  0.03891029413537079, 0.04488555325563615,
                            0.051778403012202004, 0.05972975320644764, 0.0689021524526818};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[size_t(i)], want11[i], 1e-7);
  const Tensor lsm = run1("LogSoftmax", 13, {f32({2}, {1000, 1000})});
  expect_close(lsm, {2}, {-std::log(2.0), -std::log(2.0)});
  expect_close(run1("Hardmax", 13, {f32({2, 3}, {1, 3, 3, 0, -1, 2})}), {2, 3}, {0, 1, 0, 0, 0, 1});
}

// ---------------------------------------------------------------- matmul and einsum

TEST(RefMathMatMul, BatchBroadcastAndVectors) {
  const Tensor a = f32({2, 1, 2, 3}, iota_f(12, -5));
  const Tensor b = f32({3, 3, 2}, iota_f(18, 0, 0.5f));
  // numpy: a @ b.
  expect_close(run1("MatMul", 13, {a, b}), {2, 3, 2, 2},
               {-10.0, -16.0, -1.0, -2.5, -46.0, -52.0, -10.0, -11.5, -82.0, -88.0, -19.0, -20.5,
                8.0,   11.0,  17.0, 24.5, 26.0,  29.0,  62.0,  69.5,  44.0,  47.0,  107.0, 114.5});
  expect_close(run1("MatMul", 13, {b, f32({2}, {1, -1})}), {3, 3}, std::vector<double>(9, -0.5));
  expect_close(run1("MatMul", 13, {f32({3}, {1, 2, 3}), b}), {3, 2},
               {8.0, 11.0, 26.0, 29.0, 44.0, 47.0});
  const Error e = error_of([&] { run1("MatMul", 13, {a, a}); });
  EXPECT_NE(std::string(e.what()).find("inner dimensions"), std::string::npos) << e.what();
}

TEST(RefMathMatMul, GemmTransposeAndBroadcastC) {
  const Tensor a = f32({3, 2}, iota_f(6));
  const Tensor b = f32({4, 2}, iota_f(8, -3));
  const Tensor c = f32({4}, {1, 2, 3, 4});
  // numpy: 0.5 * a @ b.T + 2 * c.
  expect_close(run1("Gemm", 13, {a, b, c},
                    {{"transB", attr_i(1)}, {"alpha", attr_f(0.5f)}, {"beta", attr_f(2)}}),
               {3, 4}, {1.0, 4.0, 7.0, 10.0, -4.0, 3.0, 10.0, 17.0, -9.0, 2.0, 13.0, 24.0});
  // transA on the transposed copy gives the same product; C omitted.
  const Tensor at = f32({2, 3}, {0, 2, 4, 1, 3, 5});
  const Tensor y =
      run1("Gemm", 13, {at, b, Tensor()}, {{"transA", attr_i(1)}, {"transB", attr_i(1)}});
  expect_close(y, {3, 4}, {-2.0, 0.0, 2.0, 4.0, -12.0, -2.0, 8.0, 18.0, -22.0, -4.0, 14.0, 32.0});
  EXPECT_EQ(error_of([&] {
              run1("Gemm", 13, {a, b, f32({3}, {1, 2, 3})}, {{"transB", attr_i(1)}});
            }).code(),
            ErrorCode::invalid_argument);
}

TEST(RefMathMatMul, MatMulIntegerZeroPoints) {
  const Tensor a = Tensor::from_vector<uint8_t>({4, 3}, {11, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0});
  const Tensor b = Tensor::from_vector<uint8_t>({3, 2}, {1, 4, 2, 5, 3, 6});
  expect_exact<int32_t>(run1("MatMulInteger", 10, {a, b, Tensor::scalar<uint8_t>(12)}), DType::i32,
                        {4, 2}, {-38, -83, -44, -98, -50, -113, -56, -128});
  expect_exact<int32_t>(run1("MatMulInteger", 10,
                             {a, b, Tensor::from_vector<uint8_t>({4}, {1, 2, 3, 4}),
                              Tensor::from_vector<uint8_t>({2}, {1, 2})}),
                        DType::i32, {4, 2}, {10, 46, 4, 28, -2, 10, -8, -8});
}

TEST(RefMathEinsum, DiagonalTraceEllipsisImplicit) {
  std::vector<double> v(18);
  for (int i = 0; i < 18; ++i) v[size_t(i)] = i;
  const Tensor x = f64({2, 3, 3}, v);
  expect_close(run1("Einsum", 12, {x}, {{"equation", attr_s("bii->bi")}}), {2, 3},
               {0, 4, 8, 9, 13, 17});
  std::vector<double> first(v.begin(), v.begin() + 9);
  expect_close(run1("Einsum", 12, {f64({3, 3}, first)}, {{"equation", attr_s("ii")}}), {}, {12});
  std::vector<double> yv(24), zv(20);
  for (int i = 0; i < 24; ++i) yv[size_t(i)] = i - 7;
  for (int i = 0; i < 20; ++i) zv[size_t(i)] = i / 3.0;
  const Tensor y = f64({2, 3, 4}, yv), z = f64({4, 5}, zv);
  const Tensor e = run1("Einsum", 12, {y, z}, {{"equation", attr_s("...ij,jk->...ik")}});
  ASSERT_EQ(e.shape(), (Shape{2, 3, 5}));
  const std::vector<double> got = tensor_to_doubles(e);
  // numpy.einsum('...ij,jk->...ik', y, z).ravel()[:8]
  const double want[8] = {-46.66666666666667,
                          -54.0,
                          -61.33333333333333,
                          -68.66666666666666,
                          -76.0,
                          -6.666666666666667,
                          -8.666666666666666,
                          -10.666666666666668};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got[size_t(i)], want[i], 1e-9);
  // Implicit output: labels used once, in alphabetical order ("ba" transposes).
  EXPECT_EQ(
      run1("Einsum", 12, {f64({3, 4}, std::vector<double>(12, 1))}, {{"equation", attr_s("ba")}})
          .shape(),
      (Shape{4, 3}));
  expect_close(run1("Einsum", 12, {f64({2}, {1, 2}), f64({3}, {3, 4, 5})},
                    {{"equation", attr_s("i,j->ij")}}),
               {2, 3}, {3, 4, 5, 6, 8, 10});
  expect_close(run1("Einsum", 12, {f64({2, 2}, {1, 2, 3, 4})}, {{"equation", attr_s("ij->")}}), {},
               {10});
  const Error bad = error_of([] {
    run1("Einsum", 12, {f64({2}, {1, 2})}, {{"equation", attr_s("i->j")}});
  });
  EXPECT_EQ(bad.code(), ErrorCode::invalid_model);
  EXPECT_NE(std::string(bad.what()).find("Einsum node 'n0'"), std::string::npos) << bad.what();
}

// ---------------------------------------------------------------- normalizations

const std::vector<double> kNormX = {0.0,
                                    0.25,
                                    0.7071067811865476,
                                    1.299038105676658,
                                    2.0,
                                    2.795084971874737,
                                    3.674234614174767,
                                    4.630064794363033,
                                    5.656854249492381,
                                    6.75,
                                    7.905694150420949,
                                    9.120718173477348};

TEST(RefMathNorm, BatchNormInferenceAndTraining) {
  const Tensor x = f64({2, 3, 2}, kNormX);
  const Tensor s = f64({3}, {1.0, 0.5, 2.0}), b = f64({3}, {0.1, -0.2, 0.3});
  const Tensor m = f64({3}, {0.5, 1.0, 1.5}), v = f64({3}, {1.0, 2.0, 0.5});
  expect_close(
      run1("BatchNormalization", 15, {x, s, b, m, v}), {2, 3, 2},
      {-0.3999975000187499, -0.14999875000937493, -0.3035531317107681, -0.09427432813527714,
       1.7141994204496, 3.963016833316478, 3.274218743120729, 4.230044144193937, 1.4464424933056381,
       1.832926913600393, 18.4178579102054, 21.8544304486828});
  const auto out =
      run("BatchNormalization", 15, {x, s, b, m, v}, {{"training_mode", attr_i(1)}}, 3);
  expect_close(out[0], {2, 3, 2},
               {-0.9464483980004162, -0.8241182867868684, -0.7491228422769862, -0.6368897753976743,
                -1.9288214307297296, -1.4159674651590062, 0.8514297179062501, 1.3191369668810349,
                0.18937342521587314, 0.3966391924587875, 1.880530741214453, 2.6642581546742816});
  expect_close(out[1], {3}, {0.663857485213445, 1.2603249784088897, 1.8955374323943261});
  expect_close(out[2], {3}, {1.3176497601818116, 2.4954090993463325, 1.4113890985660633});
}

TEST(RefMathNorm, LayerInstanceGroupNorm) {
  const Tensor x = f64({2, 3, 2}, kNormX);
  std::vector<double> sc(6), bb(6);
  for (int i = 0; i < 6; ++i) {
    sc[size_t(i)] = 0.5 + 0.2 * i;
    bb[size_t(i)] = -1 + 0.4 * i;
  }
  const auto ln = run("LayerNormalization", 17, {x, f64({3, 2}, sc), f64({3, 2}, bb)},
                      {{"axis", attr_i(1)}}, 3);
  expect_close(ln[0], {2, 3, 2},
               {-1.598892235326685, -1.2600868126159188, -0.6293826900334434, 0.33883360121377537,
                1.692834609794869, 3.4765047056108216, -1.7017705163582821, -1.2234142282760634,
                -0.5056057623372571, 0.47178596871770195, 1.7274705790615932, 3.278997297029235});
  EXPECT_EQ(ln[1].dtype(), DType::f32);  // stash_type float
  expect_close(ln[1], {2, 1, 1}, {1.1752049764563237, 6.289594330321413});
  expect_close(ln[2], {2, 1, 1}, {1.0192132390939421, 0.5366531510183534});
  expect_close(
      run1("InstanceNormalization", 6, {x, f64({3}, {1.0, 0.5, 2.0}), f64({3}, {0.1, -0.2, 0.3})}),
      {2, 3, 2},
      {-0.8996801535181259, 1.099680153518126, -0.6999714622209456, 0.29997146222094584,
       -1.699936727893683, 2.299936727893685, -0.8999781095718062, 1.099978109571807,
       -0.6999916317825787, 0.29999163178257954, -1.6999729054815653, 2.2999729054815594});
  std::vector<double> g(8);
  for (int i = 0; i < 8; ++i) g[size_t(i)] = i * i / 10.0;
  expect_close(run1("GroupNormalization", 18,
                    {f64({1, 4, 2}, g), f64({2}, {2.0, 0.5}), f64({2}, {1.0, -1.0})},
                    {{"num_groups", attr_i(2)}}),
               {1, 4, 2},
               {-0.9999183723445162, -0.42851312310322576, 1.2857026246206456, 4.1427288708270975,
                -1.6280896336283093, -1.26339242700542, -0.8176513966885552, -0.29086654267771506});
}

TEST(RefMathNorm, LrnLpMvn) {
  expect_close(run1("LRN", 13, {f32({1, 4, 1, 2}, iota_f(8, -3))},
                    {{"size", attr_i(3)}, {"alpha", attr_f(0.1f)}, {"bias", attr_f(2)}}),
               {1, 4, 1, 2},
               {-1.5890540361717174, -1.133015774008788, -0.5240795089499246, 0.0,
                0.5240795089499246, 0.9584146563694087, 1.5890540361717174, 1.9168293127388174},
               1e-5);
  const Tensor w = f64({2, 3}, {1, -2, 3, 4, 5, -6});
  expect_close(
      run1("LpNormalization", 1, {w}, {{"p", attr_i(1)}, {"axis", attr_i(0)}}), {2, 3},
      {0.2, -0.2857142857142857, 0.3333333333333333, 0.8, 0.7142857142857143, -0.6666666666666666});
  expect_close(run1("LpNormalization", 1, {w}), {2, 3},
               {0.2672612419124244, -0.5345224838248488, 0.8017837257372732, 0.4558423058385518,
                0.5698028822981898, -0.6837634587578276});
  std::vector<double> z(8);
  for (int i = 0; i < 8; ++i) z[size_t(i)] = i * i;
  expect_close(run1("MeanVarianceNormalization", 13, {f64({2, 2, 1, 2}, z)}), {2, 2, 1, 2},
               {-0.9999999999047618, -0.9047619046757369, -1.098520835357333, -0.8305889242945689,
                0.5238095237596372, 1.3809523808208617, 0.6162433954443575, 1.3128663642075442});
  EXPECT_EQ(error_of([] {
              run1("LRN", 13, {f32({1, 1, 1, 1}, {1})});
            }).code(),
            ErrorCode::invalid_model);
}

// ---------------------------------------------------------------- losses and Det

TEST(RefMathLoss, NllReductionsWeightsIgnoreIndex) {
  // log-probabilities (N=2, C=3, d=2).
  const Tensor lp = f64({2, 3, 2}, {-1.6094379124341003, -1.203972804325936, -0.6931471805599453,
                                    -2.3025850929940455, -1.203972804325936, -0.5108256237659907,
                                    -2.3025850929940455, -0.35667494393873245, -0.5108256237659907,
                                    -1.6094379124341003, -1.203972804325936, -2.3025850929940455});
  const Tensor t = i64({2, 2}, {0, 2, 1, 2});
  const Tensor w = f64({3}, {1.0, 2.0, 0.5});
  const Attrs ii = {{"ignore_index", attr_i(1)}};
  Attrs none = ii, sum = ii;
  none["reduction"] = attr_s("none");
  sum["reduction"] = attr_s("sum");
  expect_close(run1("NegativeLogLikelihoodLoss", 13, {lp, t, w}, none), {2, 2},
               {1.6094379124341003, 0.25541281188299536, 0.0, 1.1512925464970227});
  expect_close(run1("NegativeLogLikelihoodLoss", 13, {lp, t, w}, sum), {}, {3.0161432708141183});
  expect_close(run1("NegativeLogLikelihoodLoss", 13, {lp, t, w}, ii), {}, {1.5080716354070591});
  const Error e = error_of([&] {
    run1("NegativeLogLikelihoodLoss", 13, {lp, i64({2, 2}, {0, 3, 1, 2})});
  });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("target 3"), std::string::npos) << e.what();
}

TEST(RefMathLoss, SoftmaxCrossEntropyWithLogProb) {
  const auto out =
      run("SoftmaxCrossEntropyLoss", 13,
          {f32({2, 3}, {1.0f, 2.0f, 0.5f, 0.1f, -1.0f, 3.0f}), i64({2}, {1, 2})}, {}, 2);
  expect_close(out[0], {}, {0.26757150153421794});
  expect_close(out[1], {2, 3},
               {-1.4643687841079447, -0.4643687841079447, -1.9643687841079447, -2.970774218960491,
                -4.070774218960491, -0.07077421896049119});
}

TEST(RefMathDet, BatchedLu) {
  expect_close(
      run1("Det", 11, {f64({2, 3, 3}, {2, 1, 0, 1, 3, 1, 0, 1, 4, 0, 1, 2, 1, 0, 3, 4, -3, 8})}),
      {2}, {18, -2}, 1e-12, 1e-12);
}

// Bad attributes are invalid_model errors naming the node when the kernel is created,
// before any input is seen.
TEST(RefMathRegistry, AttributeErrorsSurfaceAtCompileTime) {
  const auto compile_error = [](const std::string& op, int64_t opset, const Attrs& attrs) {
    const Node node = make_node(op, {f32({1}, {1})}, 1, attrs);
    return error_of([&] { make_kernel(node, opset); });
  };
  const struct {
    const char* op;
    int64_t opset;
    Attrs attrs;
    const char* needle;
  } cases[] = {
      {"Gelu", 20, {{"approximate", attr_s("fast")}}, "approximate"},
      {"Mod", 13, {{"fmod", attr_i(2)}}, "fmod"},
      {"LayerNormalization", 17, {{"stash_type", attr_i(3)}}, "stash_type"},
      {"GroupNormalization", 18, {}, "num_groups"},
      {"LpNormalization", 1, {{"p", attr_i(3)}}, "p must be"},
      {"SoftmaxCrossEntropyLoss", 13, {{"reduction", attr_s("avg")}}, "reduction"},
      {"Einsum", 12, {{"equation", attr_s("ij,j->k")}}, "output label"},
      {"Einsum", 12, {{"equation", attr_s("i.j")}}, "lone '.'"},
      {"Celu", 12, {{"alpha", attr_f(0)}}, "alpha"},
      {"TopK", 1, {}, "'k'"},
      {"LeakyRelu", 16, {{"alpha", attr_i(1)}}, "alpha"},  // wrong attribute kind
  };
  for (const auto& c : cases) {
    const Error e = compile_error(c.op, c.opset, c.attrs);
    EXPECT_EQ(e.code(), ErrorCode::invalid_model) << c.op;
    EXPECT_NE(std::string(e.what()).find(std::string(c.op) + " node 'n0'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
  }
}

TEST(RefMathElementwise, CastOpset1TakesATypeName) {
  expect_exact<int64_t>(run1("Cast", 1, {f32({2}, {2.9f, -2.9f})}, {{"to", attr_s("INT64")}}),
                        DType::i64, {2}, {2, -2});
  EXPECT_EQ(error_of([] {
              run1("Cast", 1, {f32({1}, {1})}, {{"to", attr_s("STRING")}});
            }).code(),
            ErrorCode::unsupported);
}

TEST(RefMathRegistry, OpsetRangesAndShapeInputs) {
  const KernelRegistry& r = ref_kernel_registry();
  ASSERT_NE(r.find("ReduceSum", "", 13), nullptr);
  EXPECT_EQ(r.find("ReduceSum", "", 13)->shape_inputs, std::vector<int>{1});
  EXPECT_TRUE(r.find("ReduceSum", "", 11)->shape_inputs.empty());
  EXPECT_EQ(r.find("ReduceMax", "", 18)->shape_inputs, std::vector<int>{1});
  EXPECT_EQ(r.find("TopK", "", 11)->shape_inputs, std::vector<int>{1});
  // First opset of each op whose introduction is later than 1 (from the ONNX operator docs).
  const std::pair<const char*, int64_t> since[] = {{"Gelu", 20},
                                                   {"Mish", 18},
                                                   {"BitwiseAnd", 18},
                                                   {"GroupNormalization", 18},
                                                   {"LayerNormalization", 17},
                                                   {"CastLike", 15},
                                                   {"HardSwish", 14},
                                                   {"NegativeLogLikelihoodLoss", 12},
                                                   {"SoftmaxCrossEntropyLoss", 12},
                                                   {"Einsum", 12},
                                                   {"Celu", 12},
                                                   {"LessOrEqual", 12},
                                                   {"CumSum", 11},
                                                   {"Det", 11},
                                                   {"Round", 11},
                                                   {"BitShift", 11},
                                                   {"Mod", 10},
                                                   {"MatMulInteger", 10},
                                                   {"IsInf", 10},
                                                   {"ThresholdedRelu", 10},
                                                   {"Erf", 9},
                                                   {"Sign", 9},
                                                   {"Where", 9},
                                                   {"IsNaN", 9},
                                                   {"Shrink", 9},
                                                   {"Asinh", 9},
                                                   {"MeanVarianceNormalization", 9},
                                                   {"Sin", 7}};
  for (const auto& [op, first] : since) {
    EXPECT_EQ(r.find(op, "", first - 1), nullptr) << op;
    EXPECT_NE(r.find(op, "", first), nullptr) << op;
    EXPECT_NE(r.find(op, "", 21), nullptr) << op;
  }
}

}  // namespace
