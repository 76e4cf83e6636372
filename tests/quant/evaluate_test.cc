// OutputComparison, the comparison behind `slim quantize --eval`, `slim certify` and the
// server's canary: values against hand-computed results.
#include "slim/quant/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "slim/core/error.h"

using namespace slim;
using namespace slim::quant;

TEST(OutputComparison, LogitsGiveTop1KlCosineAndLabelAccuracy) {
  // Two rows of two logits. Row 0 agrees; row 1's argmax moves from class 0 to class 1.
  const Tensor a = Tensor::from_vector<float>({2, 2}, {2, 0, 1, 0});
  const Tensor b = Tensor::from_vector<float>({2, 2}, {2, 0, 0, 1});
  OutputComparison c("y", OutputKind::logits);
  const int64_t labels[] = {0, 1};
  c.add(a, b, labels, 2);
  const OutputAgreement r = c.result();
  EXPECT_TRUE(r.classifier);
  EXPECT_EQ(r.rows, 2);
  EXPECT_EQ(r.top1_agree, 1);
  // KL(softmax(1,0) || softmax(0,1)) = (p - q) * log(p / q) summed = (2p - 1) * 1 with
  // p = sigmoid(1); row 0 adds nothing.
  const double p = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(r.kl_mean, (2 * p - 1) / 2, 1e-12);
  EXPECT_NEAR(r.cosine, 4.0 / std::sqrt(5.0 * 5.0), 1e-12);
  EXPECT_DOUBLE_EQ(r.max_abs, 1);
  EXPECT_DOUBLE_EQ(*r.accuracy_float, 0.5);
  EXPECT_DOUBLE_EQ(*r.accuracy_quantized, 1.0);
}

TEST(OutputComparison, NanOnOneSideIsAsFarOffAsCanBe) {
  OutputComparison c("y", OutputKind::values);
  c.add(Tensor::from_vector<float>({3}, {1, NAN, NAN}), Tensor::from_vector<float>({3}, {1, NAN, 2}));
  const OutputAgreement r = c.result();
  EXPECT_FALSE(r.classifier);
  EXPECT_TRUE(std::isinf(r.max_abs));
  EXPECT_TRUE(std::isnan(r.cosine));
  OutputComparison same("y", OutputKind::values);
  same.add(Tensor::from_vector<float>({2}, {1, NAN}), Tensor::from_vector<float>({2}, {1, NAN}));
  EXPECT_EQ(same.result().max_abs, 0);
  EXPECT_DOUBLE_EQ(same.result().cosine, 1);
}

TEST(OutputComparison, KindsFromShapesAndShapeMismatch) {
  EXPECT_EQ(guess_output_kind(Tensor(DType::f32, {4, 1, 3})), OutputKind::logits);
  EXPECT_EQ(guess_output_kind(Tensor(DType::f32, {4, 1})), OutputKind::values);
  EXPECT_EQ(guess_output_kind(Tensor(DType::f32, {4, 2, 3})), OutputKind::values);
  EXPECT_EQ(guess_output_kind(Tensor(DType::i64, {4})), OutputKind::labels);
  EXPECT_EQ(guess_output_kind(Tensor(DType::i64, {4, 2})), OutputKind::values);
  OutputComparison c("labels", OutputKind::labels);
  c.add(Tensor::from_vector<int64_t>({3}, {1, 2, 3}), Tensor::from_vector<int64_t>({3}, {1, 2, 4}));
  EXPECT_EQ(c.result().top1_agree, 2);
  try {
    c.add(Tensor(DType::f32, {2, 3}), Tensor(DType::f32, {2, 2}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "output 'labels': f32[2,3] in the first model, f32[2,2] in the second");
  }
}
