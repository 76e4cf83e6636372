// The cpu provider's Resize/Upsample against ref: nearest with every rounding rule and
// linear, every coordinate transformation, scales and sizes, up and down, odd sizes, 1-D
// to 5-D, leading axes, NaN/inf, on every instruction set; and the nodes it declines.
#include <gtest/gtest.h>

#include "runtime/cpu_test_util.h"

namespace slim {
namespace {

using cpu_test::expect_matches_ref;
using cpu_test::for_each_isa;
using cpu_test::random_f32;
using cpu_test::spec;
using testing::attr_float;
using testing::attr_int;
using testing::attr_ints;
using testing::attr_string;
using testing::ModelBuilder;

struct ResizeCase {
  Shape x;
  std::vector<float> scales;   // empty: sizes
  std::vector<int64_t> sizes;  // empty: scales
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  int64_t opset = 13;
  std::vector<float> roi = {};
  std::vector<int64_t> axes = {};
};

Model resize_model(const ResizeCase& c) {
  ModelBuilder b(c.opset);
  b.input("x", DType::f32, spec(c.x)).output("y");
  std::vector<std::string> ins = {"x", "", ""};
  if (!c.roi.empty()) {
    b.initializer("roi", Tensor::from_vector<float>({int64_t(c.roi.size())}, c.roi));
    ins[1] = "roi";
  }
  if (!c.scales.empty()) {
    b.initializer("scales", Tensor::from_vector<float>({int64_t(c.scales.size())}, c.scales));
    ins[2] = "scales";
  } else {
    b.initializer("sizes", Tensor::from_vector<int64_t>({int64_t(c.sizes.size())}, c.sizes));
    ins.push_back("sizes");
  }
  Node& n = b.node("Resize", ins, {"y"}, "rs");
  n.attrs["mode"] = attr_string(c.mode);
  n.attrs["coordinate_transformation_mode"] = attr_string(c.coord);
  if (!c.nearest.empty()) n.attrs["nearest_mode"] = attr_string(c.nearest);
  if (!c.axes.empty()) n.attrs["axes"] = attr_ints(c.axes);
  if (c.coord == "tf_crop_and_resize") n.attrs["extrapolation_value"] = attr_float(-7.5f);
  return b.build();
}

void check(const ResizeCase& c, uint64_t seed) {
  SCOPED_TRACE(shape_str(c.x) + " " + c.mode + " " + c.coord);
  // Bilinear 4-D resizes follow ONNX Runtime's float coordinates (a coordinate of 10 is
  // off by up to 5e-7 from ref's double one): a few 1e-6 on values of magnitude 4.
  const double tol = c.mode == "nearest" ? 0 : 5e-6;
  Tensor x = random_f32(c.x, seed, -4, 4);
  expect_matches_ref(resize_model(c), {{"x", x}}, "rs", "cpu", tol, tol * 10);
}

TEST(CpuKernels, ResizeNearestEveryRoundingAndCoordinateMode) {
  const std::vector<std::string> coords = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                           "tf_half_pixel_for_nn"};
  const std::vector<std::string> roundings = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  for_each_isa([&] {
    uint64_t seed = 1;
    for (const auto& coord : coords)
      for (const auto& rounding : roundings) {
        SCOPED_TRACE(coord + " " + rounding);
        ResizeCase c{{2, 3, 7, 11}, {1, 1, 2.f, 1.7f}, {}, "nearest", coord, rounding, 11};
        check(c, seed++);
        c.scales = {1, 1, 0.6f, 0.45f};  // downsampling
        check(c, seed++);
        c.scales = {};
        c.sizes = {2, 3, 16, 9};
        check(c, seed++);
      }
    // Integer factors (FPN upsampling), half_pixel_symmetric (opset 19), odd widths past
    // the vector lanes.
    check({{1, 5, 20, 37}, {1, 1, 8, 8}, {}, "nearest", "asymmetric", "floor"}, 50);
    check({{1, 2, 9, 33}, {1, 1, 2, 3}, {}, "nearest", "half_pixel_symmetric", "round_prefer_ceil", 19}, 51);
  });
}

TEST(CpuKernels, ResizeLinearEveryCoordinateMode) {
  const std::vector<std::string> coords = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"};
  for_each_isa([&] {
    uint64_t seed = 100;
    for (const auto& coord : coords) {
      SCOPED_TRACE(coord);
      ResizeCase c{{2, 3, 7, 11}, {1, 1, 2.f, 1.7f}, {}, "linear", coord};
      check(c, seed++);
      c.scales = {1, 1, 0.6f, 0.45f};
      check(c, seed++);
      c.scales = {};
      c.sizes = {2, 3, 1, 40};  // one output row
      check(c, seed++);
    }
    check({{1, 4, 13, 29}, {1, 1, 2.5f, 2}, {}, "linear", "half_pixel_symmetric", "", 19}, 120);
  });
}

TEST(CpuKernels, ResizeCropAndResizeExtrapolates) {
  for_each_isa([&] {
    // The roi reaches outside the input on both axes: those outputs take extrapolation_value.
    for (const char* mode : {"nearest", "linear"}) {
      SCOPED_TRACE(mode);
      ResizeCase c{{1, 2, 9, 10}, {1, 1, 1.5f, 2}, {}, mode, "tf_crop_and_resize", "round_prefer_floor", 13,
                   {0, 0, -0.2f, 0.1f, 1, 1, 0.9f, 1.3f}};
      check(c, 200);
    }
  });
}

TEST(CpuKernels, ResizeAnyRankAndAxes) {
  for_each_isa([&] {
    check({{37}, {2.5f}, {}, "linear", "half_pixel"}, 300);                               // 1-D
    check({{9, 14}, {}, {20, 5}, "nearest", "asymmetric", "floor"}, 301);                 // 2-D
    check({{1, 2, 5, 6, 7}, {1, 1, 1.6f, 2, 0.5f}, {}, "linear", "align_corners"}, 302);  // 3 spatial axes
    check({{2, 6, 5, 3}, {1, 0.5f, 1, 1}, {}, "linear", "half_pixel"}, 303);              // the channel axis
    check({{3, 4, 5}, {2, 1, 1}, {}, "nearest", "asymmetric", "floor"}, 304);             // only a leading axis
    // opset 18: axes and a sizes policy.
    ResizeCase c{{1, 3, 8, 12}, {}, {10, 10}, "linear", "half_pixel", "", 18, {}, {2, 3}};
    check(c, 305);
    ModelBuilder b(18);
    b.input("x", DType::f32, spec({1, 3, 8, 12})).output("y");
    b.initializer("sizes", Tensor::from_vector<int64_t>({2}, {10, 10}));
    Node& n = b.node("Resize", {"x", "", "", "sizes"}, {"y"}, "rs");
    n.attrs["axes"] = attr_ints({-2, -1});
    n.attrs["keep_aspect_ratio_policy"] = attr_string("not_larger");
    expect_matches_ref(b.build(), {{"x", random_f32({1, 3, 8, 12}, 306)}}, "rs", "cpu", 0, 0);
  });
}

TEST(CpuKernels, ResizeOlderFormsAndUpsample) {
  for_each_isa([&] {
    ModelBuilder r10(10);  // Resize-10: input 1 is scales, legacy rounding
    r10.input("x", DType::f32, spec({1, 2, 5, 7})).output("y");
    r10.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, 2.6f, 0.7f}));
    r10.node("Resize", {"x", "scales"}, {"y"}, "rs");
    expect_matches_ref(r10.build(), {{"x", random_f32({1, 2, 5, 7}, 400)}}, "rs", "cpu", 0, 0);

    ModelBuilder u9(9);
    u9.input("x", DType::f32, spec({1, 2, 5, 7})).output("y");
    u9.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, 2, 3}));
    u9.node("Upsample", {"x", "scales"}, {"y"}, "rs").attrs["mode"] = attr_string("linear");
    expect_matches_ref(u9.build(), {{"x", random_f32({1, 2, 5, 7}, 401)}}, "rs", "cpu", 1e-6, 1e-5);

    ModelBuilder u7(7);  // scales as an attribute
    u7.input("x", DType::f32, spec({1, 2, 5, 7})).output("y");
    u7.node("Upsample", {"x"}, {"y"}, "rs").attrs["scales"] = testing::attr_floats({1, 1, 2, 2});
    expect_matches_ref(u7.build(), {{"x", random_f32({1, 2, 5, 7}, 402)}}, "rs", "cpu", 0, 0);
  });
}

TEST(CpuKernels, ResizeKeepsNaNAndInfinities) {
  for_each_isa([&] {
    for (const char* mode : {"nearest", "linear"}) {
      SCOPED_TRACE(mode);
      const ResizeCase c{{1, 1, 6, 21}, {1, 1, 2, 2}, {}, mode, "asymmetric", "floor"};
      Tensor x = random_f32(c.x, 500);
      x.data<float>()[3] = NAN;
      x.data<float>()[30] = INFINITY;
      x.data<float>()[50] = -INFINITY;
      expect_matches_ref(resize_model(c), {{"x", x}}, "rs", "cpu", 1e-6, 1e-5);
    }
  });
}

TEST(CpuKernels, ResizeLargeSplitsOverThreads) {
  // Enough rows for both threads, with nearest rows copied from the row before.
  check({{1, 24, 40, 40}, {1, 1, 2, 2}, {}, "nearest", "asymmetric", "floor"}, 600);
  check({{1, 24, 40, 40}, {1, 1, 2, 2}, {}, "linear", "half_pixel"}, 601);
}

TEST(CpuKernels, ResizeScalesGivenAtRunTime) {
  // Scales as a graph input (as the backend tests give them): planned at the first run and
  // again whenever the values change; bad values fail at run time with ref's message.
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({1, 2, 6, 9})).input("s", DType::f32, spec({4})).output("y");
  b.node("Resize", {"x", "", "s"}, {"y"}, "rs").attrs["mode"] = attr_string("linear");
  SessionOptions cpu, ref;
  cpu.providers = {"cpu", "ref"};
  ref.providers = {"ref"};
  auto fast = Session::compile(b.build(), cpu);
  auto slow = Session::compile(b.build(), ref);
  EXPECT_EQ(fast->partition()[0].provider, "cpu");
  const Tensor x = random_f32({1, 2, 6, 9}, 700);
  for (const std::vector<float>& scales : std::vector<std::vector<float>>{{1, 1, 2, 0.5f}, {1, 1, 2, 0.5f}, {1, 2, 1.5f, 3}}) {
    const TensorMap in = {{"x", x}, {"s", Tensor::from_vector<float>({4}, scales)}};
    const Tensor got = fast->run(in).at("y"), want = slow->run(in).at("y");
    EXPECT_LE(cpu_test::worst_error(got, want, 1e-6, 1e-5), 1.0);
  }
  const std::string msg = testing::error_of(
      [&] { fast->run({{"x", x}, {"s", Tensor::from_vector<float>({4}, {1, 1, -2, 1})}}); });
  EXPECT_NE(msg.find("Resize node 'rs': scale -2.000000 is not positive"), std::string::npos) << msg;
}

TEST(CpuKernels, ResizeDeclinesWhatItDoesNotCover) {
  ResizeCase cubic{{1, 1, 4, 4}, {1, 1, 2, 2}, {}, "cubic"};
  EXPECT_EQ(cpu_test::cpu_decline_reason(resize_model(cubic), "rs"), "cubic mode is not implemented");

  ModelBuilder aa(18);
  aa.input("x", DType::f32, spec({1, 1, 8, 8})).output("y");
  aa.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, 0.5f, 0.5f}));
  Node& n = aa.node("Resize", {"x", "", "scales"}, {"y"}, "rs");
  n.attrs["mode"] = attr_string("linear");
  n.attrs["antialias"] = attr_int(1);
  EXPECT_EQ(cpu_test::cpu_decline_reason(aa.build(), "rs"), "antialias is not implemented");

  // A bad scales value declines with ref's message; ref then reports it at run time.
  ResizeCase bad{{1, 1, 4, 4}, {1, 1, 2}};
  EXPECT_EQ(cpu_test::cpu_decline_reason(resize_model(bad), "rs"), "scales has 3 values for 4 axes of [1,1,4,4]");
}

}  // namespace
}  // namespace slim
