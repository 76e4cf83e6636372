// Unit tests of the ref provider's convolution, pooling, resize and quantization
// kernels, run one node at a time. Expected values come from independent numpy
// implementations (direct loops for conv/pool, the ONNX backend-test generator's
// interpolate_nd for Resize), computed offline and pasted with the recipe beside them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "slim/core/convert.h"
#include "runtime/ref_kernel_test_util.h"
#include "slim/runtime/kernel.h"

namespace slim {
namespace {

using namespace ref_test;

// x = (arange(100) % 7 - 3) / 2 as [1,4,5,5]; w = (arange(72) % 5 - 2) / 4 as [4,2,3,3].
Tensor conv_x() {
  std::vector<float> v(100);
  for (int i = 0; i < 100; ++i) v[size_t(i)] = float(i % 7 - 3) / 2;
  return tensor<float>({1, 4, 5, 5}, v);
}
Tensor conv_w(int64_t m) {
  std::vector<float> v(size_t(m * 18));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i) % 5 - 2) / 4;
  return tensor<float>({m, 2, 3, 3}, v);
}

TEST(RefNnConv, GroupedStridedAsymmetricPadsWithBias) {
  const auto y = run_op("Conv", 11, {conv_x(), conv_w(4), tensor<float>({4}, {0.5f, -1, 2, 0})},
                        {{"group", attr_i(2)}, {"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 0, 0, 1})}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 4, 2, 2}));
  expect_near_all(values<float>(y[0]), {0.5, -1.0, -2.125, 4.125, -1.5, -1.375, 3.75, -2.125, 2.875, 0.125, -0.25,
                                        4.125, -1.625, 1.625, 4.75, 0.125});
}

TEST(RefNnConv, DilatedPaddedMatchesDirectLoop) {
  const Tensor x = run_op("Slice", 13, {conv_x(), tensor<int64_t>({1}, {0}), tensor<int64_t>({1}, {2}),
                                        tensor<int64_t>({1}, {1})})[0];
  const auto y = run_op("Conv", 11, {x, conv_w(2)},
                        {{"dilations", attr_ints({2, 2})}, {"pads", attr_ints({2, 2, 2, 2})}, {"kernel_shape", attr_ints({3, 3})}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 2, 5, 5}));
  expect_near_all(values<float>(y[0]),
                  {1.0,   -0.375, -0.5,  -0.25,  -0.25,  1.125, 1.5,   1.0,    -0.25, 0.625,  -1.625, -0.875, 1.375,
                   2.375, 1.125,  -1.125, -1.25, -2.375, -1.125, 0.75, 2.625, 0.75,   -1.5,  -1.375, -1.25,  -1.0,
                   -1.375, -1.125, -0.625, 1.0,  1.5,    1.125,  -1.25, -1.25, -1.375, 0.0,    0.0,   2.0,    0.125,
                   -1.25, 1.125,  1.5,    1.0,   -0.25,  0.625,  -1.375, -1.0, 0.75,   0.625, -0.25});
}

TEST(RefNnConv, AutoPadSameUpperAndLowerPlaceTheOddPad) {
  // 1-D, kernel 2 of ones: SAME_UPPER pads at the end, SAME_LOWER at the start.
  const Tensor x = tensor<float>({1, 1, 3}, {1, 2, 4});
  const Tensor w = tensor<float>({1, 1, 2}, {1, 1});
  EXPECT_EQ(values<float>(run_op("Conv", 11, {x, w}, {{"auto_pad", attr_s("SAME_UPPER")}})[0]),
            (std::vector<float>{3, 6, 4}));
  EXPECT_EQ(values<float>(run_op("Conv", 11, {x, w}, {{"auto_pad", attr_s("SAME_LOWER")}})[0]),
            (std::vector<float>{1, 3, 6}));
  EXPECT_EQ(run_op("Conv", 11, {x, w}, {{"auto_pad", attr_s("VALID")}, {"strides", attr_ints({2})}})[0].shape(),
            (Shape{1, 1, 1}));
}

TEST(RefNnConv, ThreeDimensionalAndF64) {
  // A 2x2x2 kernel of ones over a 2x2x2 cube sums it: 0+1+...+7 = 28.
  std::vector<double> xv(8);
  for (int i = 0; i < 8; ++i) xv[size_t(i)] = i;
  const auto y = run_op("Conv", 11, {tensor<double>({1, 1, 2, 2, 2}, xv), tensor<double>({1, 1, 2, 2, 2}, std::vector<double>(8, 1.0))});
  EXPECT_EQ(y[0].dtype(), DType::f64);
  EXPECT_EQ(values<double>(y[0]), (std::vector<double>{28}));
}

TEST(RefNnConv, BadShapesAndAttributesAreErrorsNamingTheNode) {
  std::string msg = error_of(ErrorCode::invalid_argument, [] {
    run_op("Conv", 11, {conv_x(), conv_w(4)}, {{"group", attr_i(3)}});
  });
  EXPECT_NE(msg.find("Conv node 'n0'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("group 3"), std::string::npos) << msg;
  msg = error_of(ErrorCode::invalid_model, [] { run_op("Conv", 11, {conv_x(), conv_w(4)}, {{"auto_pad", attr_s("SAME")}}); });
  EXPECT_NE(msg.find("auto_pad"), std::string::npos) << msg;
  msg = error_of(ErrorCode::invalid_model, [] { run_op("Conv", 11, {conv_x(), conv_w(4)}, {{"strides", attr_ints({0, 1})}}); });
  EXPECT_NE(msg.find("strides"), std::string::npos) << msg;
  error_of(ErrorCode::invalid_argument, [] {
    run_op("Conv", 11, {tensor<float>({1, 1, 2, 2}, {1, 2, 3, 4}), tensor<float>({1, 1, 3, 3}, std::vector<float>(9, 1))});
  });
}

TEST(RefNnConvTranspose, GroupedStridedWithOutputPaddingMatchesAdjointLoop) {
  // xt = arange(18) % 4 - 1 as [1,2,3,3]; wt = arange(18) % 3 - 0.5 as [2,1,3,3].
  std::vector<float> xv(18), wv(18);
  for (int i = 0; i < 18; ++i) {
    xv[size_t(i)] = float(i % 4 - 1);
    wv[size_t(i)] = float(i % 3) - 0.5f;
  }
  const auto y = run_op("ConvTranspose", 11, {tensor<float>({1, 2, 3, 3}, xv), tensor<float>({2, 1, 3, 3}, wv)},
                        {{"group", attr_i(2)}, {"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 0, 1, 1})},
                         {"output_padding", attr_ints({1, 1})}});
  ASSERT_EQ(y[0].shape(), (Shape{1, 2, 6, 7}));
  expect_near_all(values<float>(y[0]),
                  {0.5,  -0.5, -1.5, 0.0,  -0.5, 0.5,  1.5,  -0.5, 0.5,  2.0,  -0.5, -2.0, 0.5,  1.5,  -1.0, 1.0,  3.5,
                   -0.5, -1.5, 0.0,  0.0,  -1.5, 1.5,  4.0,  0.5,  2.0,  -0.5, -1.5, -0.5, 0.5,  0.5,  1.0,  3.5,  -0.5,
                   -1.5, -0.5, 0.5,  0.5,  1.0,  3.5,  -0.5, -1.5, 0.0,  0.0,  -0.5, 0.5,  0.5,  1.0,  3.0,  0.5,  -0.5,
                   -2.0, 0.5,  0.0,  1.5,  4.5,  0.5,  -0.5, -1.5, 0.0,  -0.5, 0.5,  1.5,  -0.5, 0.5,  2.0,  -0.5, -2.0,
                   0.5,  1.5,  -1.0, 1.0,  3.5,  -0.5, -1.5, 0.0,  0.0,  -1.0, 1.0,  3.5,  -0.5, -1.5, 0.0,  0.0});
}

TEST(RefNnConvTranspose, OutputShapeDecidesThePadding) {
  // 1-D: x=[1,2], kernel [1,1], stride 2 gives the full output [1,1,2,2]; asking for 5
  // values pads one extra zero at the end, asking for 3 trims the larger half first.
  const Tensor x = tensor<float>({1, 1, 2}, {1, 2});
  const Tensor w = tensor<float>({1, 1, 2}, {1, 1});
  EXPECT_EQ(values<float>(run_op("ConvTranspose", 11, {x, w}, {{"strides", attr_ints({2})}})[0]),
            (std::vector<float>{1, 1, 2, 2}));
  EXPECT_EQ(values<float>(run_op("ConvTranspose", 11, {x, w}, {{"strides", attr_ints({2})}, {"output_shape", attr_ints({5})}})[0]),
            (std::vector<float>{1, 1, 2, 2, 0}));
  EXPECT_EQ(values<float>(run_op("ConvTranspose", 11, {x, w}, {{"strides", attr_ints({2})}, {"output_shape", attr_ints({3})}})[0]),
            (std::vector<float>{1, 2, 2}));
  EXPECT_EQ(values<float>(run_op("ConvTranspose", 11, {x, w}, {{"strides", attr_ints({2})}, {"auto_pad", attr_s("SAME_UPPER")}})[0]),
            (std::vector<float>{1, 1, 2, 2}));
}

Tensor i64s_for_roi() { return tensor<int64_t>({1}, {0}); }

// xp = (arange(60) * 7 % 11) as [2,1,5,6].
Tensor pool_x() {
  std::vector<float> v(60);
  for (int i = 0; i < 60; ++i) v[size_t(i)] = float(i * 7 % 11);
  return tensor<float>({2, 1, 5, 6}, v);
}

TEST(RefNnPool, AveragePoolCountIncludePadCeilMode) {
  const auto y = run_op("AveragePool", 11, {pool_x()},
                        {{"kernel_shape", attr_ints({3, 3})}, {"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 1, 1, 1})},
                         {"count_include_pad", attr_i(1)}, {"ceil_mode", attr_i(1)}});
  ASSERT_EQ(y[0].shape(), (Shape{2, 1, 3, 4}));
  expect_near_all(values<float>(y[0]), {2.3333333f, 3.7777777f, 3.3333333f, 0.33333334f, 3.3333333f, 5.111111f, 4.4444447f,
                                        2.6666667f, 2.1111112f, 3.4444444f, 3.0f, 2.0f, 2.7777777f, 3.2222223f, 2.7777777f,
                                        0.6666667f, 4.0f, 4.888889f, 5.4444447f, 3.1666667f, 1.3333334f, 2.888889f,
                                        3.6666667f, 2.3333333f});
}

TEST(RefNnPool, AveragePoolExcludesPadByDefault) {
  const auto y = run_op("AveragePool", 11, {pool_x()},
                        {{"kernel_shape", attr_ints({3, 3})}, {"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 1, 1, 1})}});
  ASSERT_EQ(y[0].shape(), (Shape{2, 1, 3, 3}));
  expect_near_all(values<float>(y[0]), {5.25f, 5.6666665f, 5.0f, 5.0f, 5.111111f, 4.4444447f, 4.75f, 5.1666665f, 4.5f,
                                        6.25f, 4.8333335f, 4.1666665f, 6.0f, 4.888889f, 5.4444447f, 3.0f, 4.3333335f, 5.5f});
}

TEST(RefNnPool, MaxPoolIndicesInBothStorageOrdersAndUnpoolRoundTrip) {
  // [1,1,2,3] = [[1,9,2],[8,3,7]], 2x2 windows with stride 1: maxima 9 (at 1) and 9 (at 1),
  // then [9, 7]: 9 at flat 1 and 7 at flat 5 (row-major) / h + w*H = 1*1+... column-major.
  const Tensor x = tensor<float>({1, 1, 2, 3}, {1, 9, 2, 8, 3, 7});
  auto y = run_op("MaxPool", 12, {x}, {{"kernel_shape", attr_ints({2, 2})}}, 2);
  EXPECT_EQ(values<float>(y[0]), (std::vector<float>{9, 9}));
  EXPECT_EQ(values<int64_t>(y[1]), (std::vector<int64_t>{1, 1}));
  y = run_op("MaxPool", 12, {x}, {{"kernel_shape", attr_ints({1, 2})}}, 2);
  EXPECT_EQ(values<float>(y[0]), (std::vector<float>{9, 9, 8, 7}));
  EXPECT_EQ(values<int64_t>(y[1]), (std::vector<int64_t>{1, 1, 3, 5}));
  const auto cm = run_op("MaxPool", 12, {x}, {{"kernel_shape", attr_ints({1, 2})}, {"storage_order", attr_i(1)}}, 2);
  // Column-major flat index of (h, w) in a 2x3 plane is h + 2 * w.
  EXPECT_EQ(values<int64_t>(cm[1]), (std::vector<int64_t>{2, 2, 1, 5}));
  // MaxUnpool puts each maximum back where the row-major indices say.
  const auto u = run_op("MaxUnpool", 11, {y[0], y[1]}, {{"kernel_shape", attr_ints({1, 2})}});
  EXPECT_EQ(u[0].shape(), (Shape{1, 1, 2, 3}));
  EXPECT_EQ(values<float>(u[0]), (std::vector<float>{0, 9, 0, 8, 0, 7}));
}

TEST(RefNnPool, MaxPoolCeilModeDilationAndUint8) {
  const Tensor x = tensor<uint8_t>({1, 1, 5}, {3, 200, 7, 1, 250});
  // Dilation 2, kernel 2: windows {0,2}, {1,3}, {2,4} with stride 1.
  auto y = run_op("MaxPool", 12, {x}, {{"kernel_shape", attr_ints({2})}, {"dilations", attr_ints({2})}});
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{7, 200, 250}));
  // Kernel 2 stride 2 over 5: floor gives 2 windows, ceil_mode adds the partial third.
  y = run_op("MaxPool", 12, {x}, {{"kernel_shape", attr_ints({2})}, {"strides", attr_ints({2})}, {"ceil_mode", attr_i(1)}});
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{200, 7, 250}));
}

TEST(RefNnPool, LpAndGlobalPools) {
  const Tensor x = tensor<float>({1, 2, 2}, {3, -4, 1, 2});
  auto y = run_op("LpPool", 18, {x}, {{"kernel_shape", attr_ints({2})}, {"p", attr_i(2)}});
  expect_near_all(values<float>(y[0]), {5.f, std::sqrt(5.f)});
  expect_near_all(values<float>(run_op("GlobalAveragePool", 1, {x})[0]), {-0.5f, 1.5f});
  expect_near_all(values<float>(run_op("GlobalMaxPool", 1, {x})[0]), {3.f, 2.f});
  expect_near_all(values<float>(run_op("GlobalLpPool", 2, {x}, {{"p", attr_i(1)}})[0]), {7.f, 3.f});
  EXPECT_EQ(run_op("GlobalAveragePool", 1, {x})[0].shape(), (Shape{1, 2, 1}));
}

TEST(RefNnPool, MissingKernelShapeAndBadIndicesAreErrors) {
  error_of(ErrorCode::invalid_model, [] { run_op("MaxPool", 12, {pool_x()}); });
  const std::string msg = error_of(ErrorCode::invalid_argument, [] {
    run_op("MaxUnpool", 11, {tensor<float>({1, 1, 1, 1}, {1}), tensor<int64_t>({1, 1, 1, 1}, {4})},
           {{"kernel_shape", attr_ints({2, 2})}});
  });
  EXPECT_NE(msg.find("index 4"), std::string::npos) << msg;
}

TEST(RefNnPool, RoiAlignAverageMaxAndLegacyCoordinates) {
  // X(row, col) = 3 * row + col is linear, so every bilinear sample is exact.
  const Tensor x = tensor<float>({1, 1, 3, 3}, arange_f(9));
  const Tensor rois = tensor<float>({1, 4}, {0, 0, 2, 2});
  const Tensor batch = i64s_for_roi();
  // half_pixel: the region starts at -0.5; a 2x2 sample grid hits rows/cols {0, 1}: mean of 0,1,3,4.
  EXPECT_EQ(values<float>(run_op("RoiAlign", 16, {x, rois, batch})[0]), (std::vector<float>{2}));
  // Opset 10 (output_half_pixel): samples at {0.5, 1.5}, mean 3 * 1 + 1.
  EXPECT_EQ(values<float>(run_op("RoiAlign", 10, {x, rois, batch})[0]), (std::vector<float>{4}));
  // max with one sample at (0.5, 0.5): the largest weighted corner is 0.25 * 4.
  EXPECT_EQ(values<float>(run_op("RoiAlign", 16, {x, rois, batch}, {{"mode", attr_s("max")}, {"sampling_ratio", attr_i(1)}})[0]),
            (std::vector<float>{1}));
  EXPECT_EQ(run_op("RoiAlign", 16, {x, rois, batch}, {{"output_height", attr_i(2)}, {"output_width", attr_i(3)}})[0].shape(),
            (Shape{1, 1, 2, 3}));
  const std::string msg = error_of(ErrorCode::invalid_argument, [&] {
    run_op("RoiAlign", 16, {x, rois, tensor<int64_t>({1}, {1})});
  });
  EXPECT_NE(msg.find("batch index 1"), std::string::npos) << msg;
}

// xr = [[1..4],[5..8],[9..12]] resized to 5x3; expected values from onnx's
// backend/test/case/node/resize.py interpolate_nd with output_size [1,1,5,3].
Tensor resize_x() { return tensor<float>({1, 1, 3, 4}, arange_f(12, 1)); }
Tensor sizes_5x3() { return tensor<int64_t>({4}, {1, 1, 5, 3}); }

TEST(RefNnResize, LinearHalfPixelAndPytorchHalfPixel) {
  const std::vector<float> want = {1.1666666f, 2.5f, 3.8333333f, 2.7666667f, 4.1f, 5.4333334f, 5.1666665f, 6.5f,
                                   7.8333335f, 7.5666666f, 8.9f, 10.233334f, 9.166667f, 10.5f, 11.833333f};
  expect_near_all(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()}, {{"mode", attr_s("linear")}})[0]), want);
  expect_near_all(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()},
                                       {{"mode", attr_s("linear")}, {"coordinate_transformation_mode", attr_s("pytorch_half_pixel")}})[0]),
                  want);
}

TEST(RefNnResize, CubicWithCoefficientAndExcludeOutside) {
  expect_near_all(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()}, {{"mode", attr_s("cubic")}})[0]),
                  {0.7421574f, 2.116f, 3.4898427f, 2.3901575f, 3.764f, 5.1378427f, 5.1261573f, 6.5f, 7.8738427f, 7.8621573f,
                   9.236f, 10.609842f, 9.510158f, 10.884f, 12.257843f});
  expect_near_all(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()},
                                       {{"mode", attr_s("cubic")}, {"cubic_coeff_a", attr_f(-0.5f)}, {"exclude_outside", attr_i(1)}})[0]),
                  {0.80095786f, 2.1981132f, 3.5952685f, 2.3267252f, 3.7238805f, 5.121036f, 5.1028447f, 6.5f, 7.8971553f,
                   7.878964f, 9.276119f, 10.673275f, 9.404732f, 10.801887f, 12.199042f});
}

TEST(RefNnResize, NearestModes) {
  EXPECT_EQ(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()})[0]),
            (std::vector<float>{1, 2, 4, 1, 2, 4, 5, 6, 8, 9, 10, 12, 9, 10, 12}));
  EXPECT_EQ(values<float>(run_op("Resize", 13, {resize_x(), Tensor(), Tensor(), sizes_5x3()},
                                 {{"nearest_mode", attr_s("ceil")}, {"coordinate_transformation_mode", attr_s("asymmetric")}})[0]),
            (std::vector<float>{1, 3, 4, 5, 7, 8, 9, 11, 12, 9, 11, 12, 9, 11, 12}));
  // Upsample (opset 9) and Resize-10 use the legacy asymmetric floor rule.
  const Tensor x = tensor<float>({1, 2}, {1, 2});
  const Tensor scales = tensor<float>({2}, {1, 2.5f});
  EXPECT_EQ(values<float>(run_op("Upsample", 9, {x, scales})[0]), (std::vector<float>{1, 1, 1, 2, 2}));
  EXPECT_EQ(values<float>(run_op("Resize", 10, {x, scales})[0]), (std::vector<float>{1, 1, 1, 2, 2}));
  EXPECT_EQ(values<float>(run_op("Upsample", 7, {x}, {{"scales", attr_floats({1, 2})}})[0]), (std::vector<float>{1, 1, 2, 2}));
}

TEST(RefNnResize, TfCropAndResizeExtrapolates) {
  const Tensor roi = tensor<float>({8}, {0, 0, 0.2f, -0.2f, 1, 1, 0.9f, 0.9f});
  const auto y = run_op("Resize", 13, {resize_x(), roi, Tensor(), tensor<int64_t>({4}, {1, 1, 3, 3})},
                        {{"mode", attr_s("linear")}, {"coordinate_transformation_mode", attr_s("tf_crop_and_resize")},
                         {"extrapolation_value", attr_f(-7)}});
  expect_near_all(values<float>(y[0]), {-7.0f, 3.65f, 5.3f, -7.0f, 6.45f, 8.1f, -7.0f, 9.25f, 10.9f});
}

TEST(RefNnResize, ScalesAxesAndAspectPolicy) {
  // scales floor the output size: 3 * 0.6 = 1.8 -> 1, 4 * 1.5 = 6.
  auto y = run_op("Resize", 13, {resize_x(), Tensor(), tensor<float>({4}, {1, 1, 0.6f, 1.5f})});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 1, 6}));
  // Opset 18 axes: sizes only for the last two axes; not_larger keeps the aspect ratio
  // with the smaller scale min(6/3, 4/4) = 1 -> 3x4 unchanged.
  y = run_op("Resize", 18, {resize_x(), Tensor(), Tensor(), tensor<int64_t>({2}, {6, 4})},
             {{"axes", attr_ints({2, 3})}, {"keep_aspect_ratio_policy", attr_s("not_larger")}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 3, 4}));
  y = run_op("Resize", 18, {resize_x(), Tensor(), Tensor(), tensor<int64_t>({2}, {6, 4})},
             {{"axes", attr_ints({2, 3})}, {"keep_aspect_ratio_policy", attr_s("not_smaller")}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 6, 8}));
}

TEST(RefNnResize, AntialiasWidensTheFilterWhenDownscaling) {
  // x = (arange(30) * 7 % 13) as [5,6], scales 0.5; expected from interpolate_nd with the
  // ONNX reference's antialias coefficients (a footprint of 2/scale resp. 4/scale
  // neighbours, triangle resp. cubic filter evaluated at scale * distance, normalized).
  std::vector<float> xv(30);
  for (int i = 0; i < 30; ++i) xv[size_t(i)] = float(i * 7 % 13);
  const Tensor x = tensor<float>({5, 6}, xv);
  const Tensor scales = tensor<float>({2}, {0.5f, 0.5f});
  auto y = run_op("Resize", 18, {x, Tensor(), scales}, {{"mode", attr_s("linear")}, {"antialias", attr_i(1)}});
  ASSERT_EQ(y[0].shape(), (Shape{2, 3}));
  expect_near_all(values<float>(y[0]), {4.015625f, 5.5625f, 7.109375f, 5.78125f, 5.5f, 6.03125f});
  y = run_op("Resize", 18, {x, Tensor(), scales}, {{"mode", attr_s("cubic")}, {"antialias", attr_i(1)}});
  expect_near_all(values<float>(y[0]), {3.889465f, 5.654739f, 7.273621f, 5.648819f, 5.655594f, 6.166611f});
}

TEST(RefNnResize, BadArgumentsAreErrors) {
  error_of(ErrorCode::invalid_argument, [] {
    run_op("Resize", 13, {resize_x(), Tensor(), tensor<float>({4}, {1, 1, 2, 2}), sizes_5x3()});
  });
  error_of(ErrorCode::invalid_argument, [] { run_op("Resize", 13, {resize_x(), Tensor(), tensor<float>({2}, {2, 2})}); });
  error_of(ErrorCode::invalid_model, [] { run_op("Resize", 13, {resize_x()}, {{"mode", attr_s("bicubic")}}); });
  error_of(ErrorCode::invalid_model, [] {
    run_op("Resize", 13, {resize_x()}, {{"coordinate_transformation_mode", attr_s("half_pixel_symmetric")}});
  });
}

TEST(RefNnGridSample, ModesAndPaddingWithAlignedCorners) {
  // X = [[1,2],[3,4]]; grid points (x, y): corner (-1,-1), centre (0,0), (1,-1), and
  // (3,0) which lies outside: zeros gives 0, border clamps x to column 1 (y=0 is row 0.5:
  // (2+4)/2), reflection folds x=2 back to column 0 ((1+3)/2).
  const Tensor x = tensor<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor grid = tensor<float>({1, 1, 4, 2}, {-1, -1, 0, 0, 1, -1, 3, 0});
  auto run = [&](const char* mode, const char* padding) {
    return values<float>(run_op("GridSample", 16, {x, grid},
                                {{"align_corners", attr_i(1)}, {"mode", attr_s(mode)}, {"padding_mode", attr_s(padding)}})[0]);
  };
  EXPECT_EQ(run("bilinear", "zeros"), (std::vector<float>{1, 2.5f, 2, 0}));
  EXPECT_EQ(run("bilinear", "border"), (std::vector<float>{1, 2.5f, 2, 3}));
  EXPECT_EQ(run("bilinear", "reflection"), (std::vector<float>{1, 2.5f, 2, 2}));
  // Nearest rounds half to even: the centre (0.5, 0.5) picks pixel (0, 0).
  EXPECT_EQ(run("nearest", "zeros"), (std::vector<float>{1, 1, 2, 0}));
  error_of(ErrorCode::invalid_model, [&] { run("linear", "zeros"); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("GridSample", 16, {x, tensor<float>({1, 1, 1, 3}, {0, 0, 0})}); });
}

TEST(RefNnQuant, QuantizeRoundsHalfToEvenAndSaturates) {
  const Tensor x = tensor<float>({6}, {0, 1.5f, 2.5f, -1, 300, 3.5f});
  auto y = run_op("QuantizeLinear", 13, {x, Tensor::scalar<float>(1), Tensor::scalar<uint8_t>(10)});
  EXPECT_EQ(y[0].dtype(), DType::u8);
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{10, 12, 12, 9, 255, 14}));
  // Without a zero point the output is u8 with zero point 0.
  EXPECT_EQ(values<uint8_t>(run_op("QuantizeLinear", 10, {x, Tensor::scalar<float>(2)})[0]),
            (std::vector<uint8_t>{0, 1, 1, 0, 150, 2}));
}

TEST(RefNnQuant, PerAxisQuantizeAndDequantize) {
  const Tensor x = tensor<float>({2, 3}, {-200, 0.4f, 127.5f, 1, -1.25f, 63});
  const auto q = run_op("QuantizeLinear", 13, {x, tensor<float>({2}, {1, 0.5f}), tensor<int8_t>({2}, {0, -1})},
                        {{"axis", attr_i(0)}});
  EXPECT_EQ(values<int8_t>(q[0]), (std::vector<int8_t>{-128, 0, 127, 1, -3, 125}));
  const auto d = run_op("DequantizeLinear", 13, {tensor<uint8_t>({2, 2}, {0, 255, 10, 20}), tensor<float>({2}, {0.5f, 2}),
                                                 tensor<uint8_t>({2}, {10, 20})});
  EXPECT_EQ(values<float>(d[0]), (std::vector<float>{-5, 470, 0, 0}));
  // Opset 10 has no per-axis form.
  error_of(ErrorCode::invalid_argument, [] {
    run_op("DequantizeLinear", 10, {tensor<uint8_t>({2, 2}, {0, 255, 10, 20}), tensor<float>({2}, {0.5f, 2})});
  });
  error_of(ErrorCode::invalid_argument, [&] {
    run_op("QuantizeLinear", 13, {x, tensor<float>({3}, {1, 1, 1}), tensor<int8_t>({3}, {0, 0, 0})}, {{"axis", attr_i(0)}});
  });
}

TEST(RefNnQuant, DynamicQuantizeLinear) {
  // numpy: lo=-3, hi=2.55, scale=(hi-lo)/255, zp=rint(-lo/scale)=138, y=clip(rint(x/scale)+zp).
  const auto y = run_op("DynamicQuantizeLinear", 11, {tensor<float>({4}, {0, 2, -3, 2.55f})}, {}, 3);
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{138, 230, 0, 255}));
  EXPECT_FLOAT_EQ(values<float>(y[1])[0], 5.55f / 255.f);
  EXPECT_EQ(values<uint8_t>(y[2])[0], 138);
}

TEST(RefNnQuant, QLinearMatMulRequantizes) {
  // numpy: acc = (a-100) @ (b-128); y = clip(rint(float32(acc) * (0.05*0.02/0.1)) + 7, 0, 255).
  const auto y = run_op("QLinearMatMul", 10,
                        {tensor<uint8_t>({2, 3}, {0, 50, 255, 128, 3, 77}), Tensor::scalar<float>(0.05f), Tensor::scalar<uint8_t>(100),
                         tensor<uint8_t>({3, 2}, {10, 200, 0, 255, 128, 64}), Tensor::scalar<float>(0.02f), Tensor::scalar<uint8_t>(128),
                         Tensor::scalar<float>(0.1f), Tensor::scalar<uint8_t>(7)});
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{189, 0, 98, 0}));
}

TEST(RefNnQuant, ConvIntegerAndQLinearConv) {
  std::vector<uint8_t> xv(9);
  for (int i = 0; i < 9; ++i) xv[size_t(i)] = uint8_t(i + 1);
  auto y = run_op("ConvInteger", 10, {tensor<uint8_t>({1, 1, 3, 3}, xv), tensor<uint8_t>({1, 1, 2, 2}, {2, 2, 2, 2}),
                                      Tensor::scalar<uint8_t>(1), Tensor::scalar<uint8_t>(1)});
  EXPECT_EQ(y[0].dtype(), DType::i32);
  EXPECT_EQ(values<int32_t>(y[0]), (std::vector<int32_t>{8, 12, 20, 24}));
  // numpy: acc = sum((X-100) * W[m]) + bias[m]; y = clip(rint(float32(acc) * (0.5*w_scale[m]/0.2)) + 5, 0, 255).
  for (auto& v : xv) v = uint8_t(v * 20);
  y = run_op("QLinearConv", 10,
             {tensor<uint8_t>({1, 1, 3, 3}, xv), Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(100),
              tensor<int8_t>({2, 1, 2, 2}, {1, -2, 3, 4, -5, 6, 0, -1}), tensor<float>({2}, {0.25f, 0.5f}),
              tensor<int8_t>({2}, {0, 0}), Tensor::scalar<float>(0.2f), Tensor::scalar<uint8_t>(5),
              tensor<int32_t>({2}, {10, -20})});
  EXPECT_EQ(values<uint8_t>(y[0]), (std::vector<uint8_t>{0, 74, 224, 255, 30, 30, 30, 30}));
}

}  // namespace
}  // namespace slim
