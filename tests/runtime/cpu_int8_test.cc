// The cpu provider's 8-bit kernels against ref, which computes in int64: ConvInteger and
// MatMulInteger (uint8 and int8 sources and weights, zero points none / one / per output
// channel, groups, strides, dilations, odd shapes) must give ref's int32 sums exactly, and
// slim:DynamicQuantizeConv the unfused chain's values bit for bit. The data saturates
// int16 pair sums (sources near 255, weights at the ends of their range): oneDNN's kernels
// without VNNI would get them wrong, so ctest also runs this suite with SLIM_ISA=avx2 and
// SLIM_ISA=scalar, where the kernels split the weights (dnnl_int8.h). Also the
// vectorized Cast, QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "runtime/cpu/dnnl_int8.h"
#include "runtime/cpu/quantize.h"
#include "runtime/cpu_test_util.h"
#include "slim/core/convert.h"
#include "slim/runtime/fused_ops.h"

namespace slim {
namespace {

using cpu_test::expect_matches_ref;
using cpu_test::random_f32;
using cpu_test::run_with;
using cpu_test::spec;
using testing::attr_int;
using testing::attr_ints;
using testing::ModelBuilder;

// 8-bit values that make int16 pair sums overflow: mostly near the ends of the range.
Tensor extreme_8bit(DType t, const Shape& shape, uint64_t seed) {
  Tensor out(t, shape);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int r = int(rng() % 256), v = r < 96 ? 255 - r % 8 : r < 192 ? r % 8 : r;
    if (t == DType::u8)
      out.data<uint8_t>()[i] = uint8_t(v);
    else
      out.data<int8_t>()[i] = int8_t(v - 128);
  }
  return out;
}

Tensor scalar_8bit(DType t, int v) {
  return t == DType::u8 ? Tensor::from_vector<uint8_t>({}, {uint8_t(v)})
                        : Tensor::from_vector<int8_t>({}, {int8_t(v)});
}

struct ConvCase {
  Shape x;  // N, C, H, W
  int64_t oc = 8, kh = 3, kw = 3, group = 1;
  Shape strides = {1, 1}, dilations = {1, 1}, pads = {1, 1, 1, 1};
  DType xt = DType::u8, wt = DType::u8;
  int w_zp = -1;  // -1: none; else a scalar; per_channel: one per output channel
  bool per_channel = false;
  int x_zp = 0;
  bool x_zp_input = false;  // the source's zero point fed at run time
};

Model conv_integer_model(const ConvCase& c) {
  ModelBuilder b(13);
  b.input("x", c.xt, spec(c.x)).output("y");
  b.initializer(
      "w", extreme_8bit(c.wt, {c.oc, c.x[1] / c.group, c.kh, c.kw}, uint64_t(c.oc * 7 + c.x[1])));
  std::vector<std::string> in = {"x", "w", "", ""};
  if (c.x_zp_input) {
    b.input("xz", c.xt, spec({}));
    in[2] = "xz";
  } else if (c.x_zp != 0) {
    b.initializer("xz", scalar_8bit(c.xt, c.x_zp));
    in[2] = "xz";
  }
  if (c.per_channel) {
    Tensor z = extreme_8bit(c.wt, {c.oc}, 99);
    b.initializer("wz", z);
    in[3] = "wz";
  } else if (c.w_zp >= 0) {
    b.initializer("wz", scalar_8bit(c.wt, c.w_zp));
    in[3] = "wz";
  }
  while (!in.empty() && in.back().empty()) in.pop_back();
  Node& n = b.node("ConvInteger", in, {"y"}, "conv");
  n.attrs["strides"] = attr_ints(c.strides);
  n.attrs["dilations"] = attr_ints(c.dilations);
  n.attrs["pads"] = attr_ints(c.pads);
  n.attrs["group"] = attr_int(c.group);
  return b.build();
}

TEST(CpuInt8, ConvIntegerGivesRefsSumsExactly) {
  std::vector<ConvCase> cases;
  auto add = [&](ConvCase c) { cases.push_back(c); };
  add({{1, 3, 9, 7}});  // an image's 3 channels
  add({{2, 16, 6, 5}, 16, 3, 3, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}, DType::u8, DType::u8, 143});
  add({{1, 17, 7, 8}, 33, 3, 3, 1, {2, 2}, {1, 1}, {1, 0, 1, 2}, DType::u8, DType::u8, 0, true});
  add({{1, 8, 11, 9}, 7, 3, 3, 1, {1, 1}, {2, 3}, {2, 3, 2, 3}, DType::u8, DType::i8, 5});
  add({{1, 12, 6, 6},
       6,
       3,
       3,
       3,
       {1, 1},
       {1, 1},
       {1, 1, 1, 1},
       DType::i8,
       DType::u8,
       128,
       false,
       -7});
  add({{1, 5, 6, 7}, 9, 1, 1, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}, DType::i8, DType::i8, -1, false, 3});
  add({{1, 4, 8, 8}, 4, 5, 3, 2, {2, 1}, {1, 1}, {2, 1, 2, 1}, DType::u8, DType::i8, 0, true});
  // Depthwise: never split (oneDNN's depthwise kernels widen to 32 bits before multiplying).
  add({{1, 24, 7, 9}, 24, 3, 3, 24, {1, 1}, {1, 1}, {1, 1, 1, 1}, DType::u8, DType::u8, 131});
  add({{1, 20, 6, 11}, 20, 5, 5, 20, {2, 2}, {1, 1}, {2, 2, 2, 2}, DType::i8, DType::i8, 0, true, -9});
  ConvCase runtime_zp{{1, 32, 10, 10}, 64};
  runtime_zp.w_zp = 121;
  runtime_zp.x_zp_input = true;
  add(runtime_zp);
  for (const ConvCase& c : cases) {
    SCOPED_TRACE("x " + shape_str(c.x) + " oc " + std::to_string(c.oc) + " group " +
                 std::to_string(c.group));
    TensorMap in = {{"x", extreme_8bit(c.xt, c.x, 5)}};
    if (c.x_zp_input) in["xz"] = scalar_8bit(c.xt, 201);
    expect_matches_ref(conv_integer_model(c), in, "conv");
  }
}

TEST(CpuInt8, MatMulIntegerGivesRefsSumsExactly) {
  struct Case {
    Shape a;
    int64_t n;
    DType at, bt;
    int b_zp;  // -1 none, -2 per column
    int a_zp;
  };
  for (const Case& c : std::vector<Case>{{{7, 33}, 17, DType::u8, DType::u8, 128, 3},
                                         {{2, 3, 64}, 48, DType::u8, DType::i8, -1, 250},
                                         {{5, 19}, 3, DType::i8, DType::u8, -2, -4},
                                         {{1, 256}, 64, DType::i8, DType::i8, 2, 0}}) {
    SCOPED_TRACE("A " + shape_str(c.a) + " N " + std::to_string(c.n));
    ModelBuilder b(13);
    b.input("a", c.at, spec(c.a)).output("y");
    b.initializer("b", extreme_8bit(c.bt, {c.a.back(), c.n}, 3));
    b.initializer("az", scalar_8bit(c.at, c.a_zp));
    std::vector<std::string> in = {"a", "b", "az"};
    if (c.b_zp == -2) b.initializer("bz", extreme_8bit(c.bt, {c.n}, 4));
    if (c.b_zp != -1) {
      if (c.b_zp >= 0) b.initializer("bz", scalar_8bit(c.bt, c.b_zp));
      in.push_back("bz");
    }
    b.node("MatMulInteger", in, {"y"}, "mm");
    expect_matches_ref(b.build(), {{"a", extreme_8bit(c.at, c.a, 8)}}, "mm");
  }
}

// DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(x_scale * w_scale) -> Add(bias) ->
// Relu, as ONNX Runtime's quantizer writes it.
void add_quantized_conv(ModelBuilder& b, const std::string& x, const std::string& y, int64_t c,
                        int64_t oc, uint64_t seed, bool bias, bool relu, bool per_channel_scale,
                        int64_t dilation = 1) {
  const std::string p = y + "_";
  b.initializer(p + "w", extreme_8bit(DType::u8, {oc, c, 3, 3}, seed));
  b.initializer(p + "wz", scalar_8bit(DType::u8, 131));
  b.initializer(p + "ws", per_channel_scale ? random_f32({oc, 1, 1}, seed + 1, 0.001f, 0.01f)
                                            : Tensor::from_vector<float>({}, {0.0037f}));
  b.node("DynamicQuantizeLinear", {x}, {p + "q", p + "s", p + "z"});
  b.node("Mul", {p + "s", p + "ws"}, {p + "scale"});
  Node& conv =
      b.node("ConvInteger", {p + "q", p + "w", p + "z", p + "wz"}, {p + "sums"}, y + "_conv");
  conv.attrs["pads"] = attr_ints({dilation, dilation, dilation, dilation});
  conv.attrs["dilations"] = attr_ints({dilation, dilation});
  b.node("Cast", {p + "sums"}, {p + "f"}).attrs["to"] = attr_int(1);
  const std::string scaled = bias || relu ? p + "scaled" : y;
  b.node("Mul", {p + "f", p + "scale"}, {scaled});
  std::string v = scaled;
  if (bias) {
    // As ORT's quantizer writes it: the bias vector reshaped at run time, so it is a
    // constant only once compile has folded the Reshape.
    b.initializer(p + "b", random_f32({oc}, seed + 2));
    b.initializer(p + "bshape", Tensor::from_vector<int64_t>({4}, {1, oc, 1, 1}));
    b.node("Reshape", {p + "b", p + "bshape"}, {p + "b4"});
    const std::string out = relu ? p + "biased" : y;
    b.node("Add", {v, p + "b4"}, {out});
    v = out;
  }
  if (relu) b.node("Relu", {v}, {y});
}

// The fused nodes (with the bias Add and the Relu) must give what ref's unfused nodes give,
// to the bit; `others` nodes are left beside them.
void expect_fused_equals_unfused(const Model& m, const TensorMap& in, int64_t fused_nodes,
                                 int64_t others = 0) {
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  o.num_threads = 2;
  auto fast = Session::compile(m, o);
  int64_t fused = 0;
  for (const auto& a : fast->partition()) {
    EXPECT_EQ(a.provider, "cpu") << a.node;
    fused += a.op == "slim:DynamicQuantizeConv";
  }
  EXPECT_EQ(fused, fused_nodes);
  EXPECT_EQ(int64_t(fast->partition().size()), fused_nodes + others);
  SessionOptions r;
  r.providers = {"ref"};
  r.optimize = false;
  const TensorMap want = Session::compile(m, r)->run(in), got = fast->run(in);
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.at(name).shape(), t.shape()) << name;
    const float *a = got.at(name).data<float>(), *w = t.data<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (std::memcmp(a + i, w + i, 4) != 0 && ++bad <= 3)
        ADD_FAILURE() << name << "[" << i << "]: " << a[i] << " vs ref " << w[i];
    EXPECT_EQ(bad, 0) << name;
  }
}

TEST(CpuInt8, DynamicQuantizeConvEqualsTheUnfusedChainBitForBit) {
  for (bool per_channel : {false, true})
    for (bool bias : {false, true})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(per_channel ? "per-channel" : "per-tensor") +
                     (bias ? " bias" : "") + (relu ? " relu" : ""));
        ModelBuilder b(13);
        b.input("x", DType::f32, spec({1, 19, 9, 11})).output("y");
        add_quantized_conv(b, "x", "y", 19, 21, 40, bias, relu, per_channel);
        expect_fused_equals_unfused(b.build(), {{"x", random_f32({1, 19, 9, 11}, 41, -3.f, 5.f)}},
                                    1);
      }
}

TEST(CpuInt8, ChainsOfQuantizedConvolutionsRunChannelsLast) {
  // conv -> conv (dilated) -> MaxPool -> conv, and a graph output in between: the
  // kernels hand each other NHWC where every reader takes it, NCHW elsewhere.
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({2, 3, 16, 12})).output("y").output("b");
  add_quantized_conv(b, "x", "a", 3, 16, 50, true, true, false);
  add_quantized_conv(b, "a", "b", 16, 32, 60, true, true, true, 2);
  Node& pool = b.node("MaxPool", {"b"}, {"p"});
  pool.attrs["kernel_shape"] = attr_ints({2, 2});
  pool.attrs["strides"] = attr_ints({2, 2});
  add_quantized_conv(b, "p", "y", 32, 8, 70, false, false, false);
  expect_fused_equals_unfused(b.build(), {{"x", random_f32({2, 3, 16, 12}, 51, -1.f, 1.f)}}, 3, 1);
}

TEST(CpuInt8, DynamicQuantizeConvOfAnAllZeroSourceIsTheBias) {
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({1, 4, 5, 5})).output("y");
  add_quantized_conv(b, "x", "y", 4, 6, 80, true, false, false);
  expect_fused_equals_unfused(b.build(), {{"x", Tensor(DType::f32, {1, 4, 5, 5})}}, 1);
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  Tensor nan(DType::f32, {1, 4, 5, 5});
  nan.data<float>()[7] = NAN;
  EXPECT_EQ(testing::error_of([&] {
              Session::compile(b.build(), o)->run({{"x", nan}});
            }),
            "DynamicQuantizeConv node 'y_conv': input contains NaN");
}

// QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias) with per-channel
// or per-tensor weights, as QOperator files and fuse_qdq write it.
struct QConvCase {
  Shape x;
  int64_t oc, k, group;
  DType xt, wt, yt;
  bool per_channel, bias;
  Shape strides = {1, 1}, dilations = {1, 1}, pads = {};  // pads: k / 2 all round
};

void add_qlinear_params(ModelBuilder& b, const std::string& p, DType xt, DType yt, int64_t oc,
                        DType wt, bool per_channel, uint64_t seed) {
  b.initializer(p + "xs", Tensor::from_vector<float>({}, {0.031f}));
  b.initializer(p + "xz", scalar_8bit(xt, xt == DType::u8 ? 121 : -9));
  b.initializer(p + "ws", per_channel ? random_f32({oc}, seed, 0.002f, 0.02f)
                                      : Tensor::from_vector<float>({}, {0.0071f}));
  // Symmetric int8 weights (zero point 0) as quantizers write them; uint8 ones with 128.
  Tensor wz = wt == DType::u8 ? Tensor(DType::u8, {per_channel ? oc : 1})
                              : Tensor(DType::i8, {per_channel ? oc : 1});
  if (wt == DType::u8) std::fill_n(wz.data<uint8_t>(), wz.numel(), uint8_t(128));
  if (!per_channel) wz = wz.reshape({});
  b.initializer(p + "wz", wz);
  b.initializer(p + "ys", Tensor::from_vector<float>({}, {0.55f}));
  b.initializer(p + "yz", scalar_8bit(yt, yt == DType::u8 ? 97 : 3));
}

TEST(CpuInt8, QLinearConvAndMatMulGiveRefsBytesExactly) {
  const std::vector<QConvCase> cases = {
      {{1, 3, 9, 7}, 16, 3, 1, DType::u8, DType::i8, DType::u8, true, true},
      {{2, 16, 6, 5}, 16, 3, 16, DType::u8, DType::i8, DType::u8, true, true},  // depthwise
      {{1, 17, 7, 8}, 33, 1, 1, DType::i8, DType::i8, DType::i8, false, false},
      {{1, 12, 6, 6}, 6, 3, 3, DType::u8, DType::u8, DType::i8, true, true},
      // fewer output channels than vector lanes: requantized in runs of lcm(oc, 16)
      {{1, 8, 5, 9}, 8, 3, 8, DType::u8, DType::i8, DType::u8, true, true},
      {{1, 5, 4, 7}, 3, 1, 1, DType::i8, DType::i8, DType::i8, true, false},
      // 1x1 over more sums than 512 KiB: run in bands of rows (36 of 72 here)
      {{1, 8, 72, 64}, 40, 1, 1, DType::u8, DType::i8, DType::u8, true, true},
      {{1, 9, 72, 64}, 40, 1, 1, DType::i8, DType::i8, DType::i8, false, false},
      // Where vpdpbusd is exact (AVX-512 VNNI, AVX-VNNI) slim's direct kernel runs these:
      // blocks of 4 vectors and a narrower last one, strides, channels not a multiple of 4
      {{1, 5, 11, 13}, 70, 3, 1, DType::u8, DType::i8, DType::u8, true, true, {2, 2}},
      // batches, a 1x1 convolution with strides, a source copied from NCHW
      {{2, 36, 9, 10}, 36, 1, 1, DType::u8, DType::i8, DType::u8, true, true, {2, 2}},
      // dilations and uneven padding, an int8 source, uint8 weights (zero point 128)
      {{1, 7, 12, 12},
       24,
       3,
       1,
       DType::i8,
       DType::u8,
       DType::i8,
       false,
       true,
       {1, 1},
       {2, 2},
       {2, 1, 2, 3}},
      // one output channel (oneDNN's kernel); a padded 5x5 with stride 3
      {{1, 12, 6, 6}, 1, 3, 1, DType::u8, DType::i8, DType::u8, true, true},
      {{1, 16, 14, 9}, 48, 5, 1, DType::u8, DType::i8, DType::u8, true, false, {3, 3}},
      // fewer output pixels than a tile (SE's 1x1 convolutions on [N, C, 1, 1])
      {{1, 8, 2, 2}, 16, 3, 1, DType::u8, DType::i8, DType::u8, true, true},
      {{1, 40, 1, 1}, 24, 1, 1, DType::u8, DType::i8, DType::u8, true, true},
      // depthwise (slim's kernel at AVX2, oneDNN's at AVX-512): 5x5, strides, dilations,
      // uneven padding, an int8 source, channels not a multiple of 16
      {{1, 20, 13, 11}, 20, 5, 20, DType::i8, DType::i8, DType::u8, true, true, {2, 2}},
      {{1, 40, 9, 10},
       40,
       3,
       40,
       DType::u8,
       DType::u8,
       DType::i8,
       false,
       true,
       {1, 1},
       {2, 2},
       {2, 1, 2, 3}},
      {{1, 72, 3, 2}, 72, 3, 72, DType::u8, DType::i8, DType::u8, true, false},
  };
  for (const QConvCase& c : cases) {
    SCOPED_TRACE("x " + shape_str(c.x) + " group " + std::to_string(c.group));
    ModelBuilder b(13);
    b.input("x", c.xt, spec(c.x)).output("y");
    add_qlinear_params(b, "", c.xt, c.yt, c.oc, c.wt, c.per_channel, 7);
    b.initializer("w", extreme_8bit(c.wt, {c.oc, c.x[1] / c.group, c.k, c.k}, 3));
    std::vector<std::string> in = {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz"};
    if (c.bias) {
      Tensor bias(DType::i32, {c.oc});
      for (int64_t i = 0; i < c.oc; ++i) bias.data<int32_t>()[i] = int32_t(i * 977 - 9000);
      b.initializer("b", bias);
      in.push_back("b");
    }
    Node& n = b.node("QLinearConv", in, {"y"}, "conv");
    n.attrs["pads"] =
        attr_ints(c.pads.empty() ? Shape{c.k / 2, c.k / 2, c.k / 2, c.k / 2} : c.pads);
    n.attrs["strides"] = attr_ints(c.strides);
    n.attrs["dilations"] = attr_ints(c.dilations);
    n.attrs["group"] = attr_int(c.group);
    expect_matches_ref(b.build(), {{"x", extreme_8bit(c.xt, c.x, 5)}}, "conv", "cpu", 0, 0);
  }
  for (DType at : {DType::u8, DType::i8})
    for (bool per_channel : {false, true}) {
      ModelBuilder b(13);
      b.input("a", at, spec({2, 5, 37})).output("y");
      add_qlinear_params(b, "", at, DType::u8, 19, DType::i8, per_channel, 9);
      b.initializer("w", extreme_8bit(DType::i8, {37, 19}, 4));
      b.node("QLinearMatMul", {"a", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"y"}, "mm");
      expect_matches_ref(b.build(), {{"a", extreme_8bit(at, {2, 5, 37}, 6)}}, "mm", "cpu", 0, 0);
    }
}

// QLinearConvs hand each other channels-last bytes: the direct kernel reads them as they
// are (unsigned, channels in quads, no padding) or copies them (int8, 37 channels, padded).
TEST(CpuInt8, ChainsOfQLinearConvsOfAnyWidthGiveRefsBytes) {
  for (DType t : {DType::u8, DType::i8})
    for (int64_t mid : {37, 40}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(mid) + " channels");
      const Shape xs = {1, 6, 10, 11};
      ModelBuilder b(13);
      b.input("x", DType::u8, spec(xs)).output("y");
      auto qconv = [&](const std::string& x, const std::string& y, DType xt, DType yt, int64_t ic,
                       int64_t oc, int64_t k, uint64_t seed) {
        add_qlinear_params(b, y, xt, yt, oc, DType::i8, true, seed);
        b.initializer(y + "w", extreme_8bit(DType::i8, {oc, ic, k, k}, seed));
        Tensor bias(DType::i32, {oc});
        for (int64_t i = 0; i < oc; ++i) bias.data<int32_t>()[i] = int32_t(i * 131 - 700);
        b.initializer(y + "b", bias);
        Node& n = b.node(
            "QLinearConv",
            {x, y + "xs", y + "xz", y + "w", y + "ws", y + "wz", y + "ys", y + "yz", y + "b"}, {y},
            y);
        n.attrs["pads"] = attr_ints({k / 2, k / 2, k / 2, k / 2});
      };
      qconv("x", "c1", DType::u8, t, 6, mid, 3, 21);
      qconv("c1", "c2", t, t, mid, 12, 1, 22);
      qconv("c2", "y", t, DType::u8, 12, 9, 3, 23);
      expect_matches_ref(b.build(), {{"x", extreme_8bit(DType::u8, xs, 24)}}, "c2", "cpu", 0, 0);
    }
}

// Pair-safe 8-bit weights (dnnl_int8.h): every w8 in [-64, 64], most at ±64 in groups of
// 4 reduced values (+s, +s, -s, -s), so that with all-255 sources each pair of u8 x s8
// products sums to ±32640, the most vpmaddubsw's int16 holds, and the group to 0. The
// reduced index of element i is (i / inner) % period. `over`: one w8 is 65 (not pair-safe),
// its pair's other 64, whose products with 255 would sum past int16's 32767 unsplit.
// uint8 weights are w8 + 128 (zero point 128).
Tensor pair_safe_8bit(DType t, const Shape& shape, int64_t inner, int64_t period, uint64_t seed,
                      bool over = false) {
  Tensor out(t, shape);
  std::mt19937_64 rng(seed);
  const int64_t at = out.numel() / 2 / (inner * period) * (inner * period);  // reduced index 0
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t r = (i / inner) % period;
    const int s = (i / inner / period + i % inner) % 2 ? 64 : -64;
    int v = r % 4 < 2 ? s : -s;
    if (rng() % 4 == 0) v = int(rng() % 129) - 64;
    if (over && i == at) v = 65;
    if (over && i == at + inner) v = 64;
    if (t == DType::u8)
      out.data<uint8_t>()[i] = uint8_t(v + 128);
    else
      out.data<int8_t>()[i] = int8_t(v);
  }
  return out;
}

// A source of one value: 255 (uint8) or 127 (int8, which the kernels shift to 255).
Tensor all_max_8bit(DType t, const Shape& shape) {
  Tensor out(t, shape);
  std::fill_n(static_cast<uint8_t*>(out.raw_data()), out.numel(), t == DType::u8 ? 255 : 127);
  return out;
}

// Without VNNI pair-safe weights are not split: oneDNN's vpmaddubsw kernels (ConvInteger,
// MatMulInteger, QLinear convolutions outside the direct kernel) and, at plain AVX2, the
// direct convolution's vpmaddubsw + vpmaddwd kernel must still give ref's sums and bytes
// exactly, at the saturation edge (±64 against all-255 sources). One w8 of 65 splits the
// layer as before, exact too. ctest runs this at avx512, avx2, avx2 without AVX-VNNI and
// scalar.
TEST(CpuInt8, PairSafeWeightsGiveRefsBytesUnsplit) {
  struct Case {
    Shape x;
    int64_t oc, k;
    DType xt, wt;
    Shape strides = {1, 1};
  };
  // The direct kernel at plain AVX2: 3 x 3 tiles (vectors in threes), 2 x 5 and a last
  // block of 1, 1 x 10; channels not a multiple of 4, an int8 source, uint8 weights,
  // strides, batches; oneDNN's kernels, not split either: a 1x1 convolution, under 32
  // bytes per output.
  const std::vector<Case> cases = {
      {{1, 16, 9, 11}, 24, 3, DType::u8, DType::i8},
      {{2, 40, 7, 6}, 36, 3, DType::u8, DType::i8},
      {{1, 40, 7, 6}, 20, 1, DType::u8, DType::i8},
      {{1, 13, 10, 9}, 8, 3, DType::i8, DType::i8, {2, 2}},
      {{1, 8, 6, 7}, 16, 3, DType::u8, DType::u8},
      {{1, 3, 9, 9}, 16, 3, DType::u8, DType::i8},
  };
  for (const Case& c : cases)
    for (bool over : {false, true})
      for (bool all_max : {true, false}) {
        SCOPED_TRACE("x " + shape_str(c.x) + " oc " + std::to_string(c.oc) +
                     (over ? " one w8 of 65" : "") + (all_max ? " all-max source" : ""));
        const Shape ws = {c.oc, c.x[1], c.k, c.k};
        const Tensor w = pair_safe_8bit(c.wt, ws, c.k * c.k, c.x[1], uint64_t(c.oc), over);
        const Tensor x = all_max ? all_max_8bit(c.xt, c.x) : extreme_8bit(c.xt, c.x, 5);
        ModelBuilder b(13);
        b.input("x", c.xt, spec(c.x)).output("y");
        add_qlinear_params(b, "", c.xt, DType::u8, c.oc, c.wt, true, 7);
        b.initializer("w", w);
        Tensor bias(DType::i32, {c.oc});
        for (int64_t i = 0; i < c.oc; ++i) bias.data<int32_t>()[i] = int32_t(i * 977 - 9000);
        b.initializer("b", bias);
        Node& n = b.node("QLinearConv", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"}, {"y"},
                         "conv");
        n.attrs["pads"] = attr_ints({c.k / 2, c.k / 2, c.k / 2, c.k / 2});
        n.attrs["strides"] = attr_ints(c.strides);
        expect_matches_ref(b.build(), {{"x", x}}, "conv", "cpu", 0, 0);
        // The int32 sums as they are (ConvInteger: oneDNN's kernels, no direct one).
        ModelBuilder s(13);
        s.input("x", c.xt, spec(c.x)).output("y");
        s.initializer("w", w);
        s.initializer("xz", scalar_8bit(c.xt, c.xt == DType::u8 ? 3 : -9));
        std::vector<std::string> in = {"x", "w", "xz"};
        if (c.wt == DType::u8) {
          s.initializer("wz", scalar_8bit(DType::u8, 128));
          in.push_back("wz");
        }
        Node& ci = s.node("ConvInteger", in, {"y"}, "conv");
        ci.attrs["pads"] = attr_ints({c.k / 2, c.k / 2, c.k / 2, c.k / 2});
        ci.attrs["strides"] = attr_ints(c.strides);
        expect_matches_ref(s.build(), {{"x", x}}, "conv", "cpu", 0, 0);
      }
  for (DType at : {DType::u8, DType::i8})
    for (bool over : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(at)) + (over ? " one w8 of 65" : ""));
      const Shape as = {2, 5, 68};
      const Tensor w = pair_safe_8bit(DType::i8, {68, 24}, 24, 68, 11, over);
      ModelBuilder b(13);
      b.input("a", at, spec(as)).output("y");
      add_qlinear_params(b, "", at, DType::u8, 24, DType::i8, true, 9);
      b.initializer("w", w);
      b.node("QLinearMatMul", {"a", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"y"}, "mm");
      expect_matches_ref(b.build(), {{"a", all_max_8bit(at, as)}}, "mm", "cpu", 0, 0);
      ModelBuilder s(13);
      s.input("a", at, spec(as)).output("y");
      s.initializer("w", w);
      s.node("MatMulInteger", {"a", "w"}, {"y"}, "mm");
      expect_matches_ref(s.build(), {{"a", all_max_8bit(at, as)}}, "mm", "cpu", 0, 0);
      expect_matches_ref(s.build(), {{"a", extreme_8bit(at, as, 12)}}, "mm", "cpu", 0, 0);
    }
}

// The path the kernels take: without VNNI pair-safe weights are not split (one w8 of 65
// is), and at plain AVX2 the direct convolution runs them (k x k ones: 1x1 ones stay on
// oneDNN); with VNNI nothing is split.
TEST(CpuInt8, PairSafeWeightsTakeTheUnsplitPaths) {
  const Shape xs = {1, 16, 9, 11}, ws = {24, 16, 3, 3};
  Node n;
  n.name = "conv";
  n.op_type = "QLinearConv";
  n.attrs["pads"] = attr_ints({1, 1, 1, 1});
  cpu::ConvGeometry g;
  ASSERT_FALSE(cpu::conv_geometry(n, xs, ws, false, &g).has_value());
  const bool none = cpu::int8_dot() == cpu::Int8Dot::none;
  const unsigned isa = unsigned(dnnl::get_effective_cpu_isa()),
                 avx2 = unsigned(dnnl::cpu_isa::avx2);
  const bool plain_avx2 = none && (isa & avx2) == avx2;
  for (bool over : {false, true}) {
    SCOPED_TRACE(over ? "one w8 of 65" : "pair-safe");
    const Tensor w = pair_safe_8bit(DType::i8, ws, 9, 16, 1, over);
    const cpu::Int8Conv conv(n, g, w, nullptr, false, DType::u8);
    EXPECT_EQ(conv.split(), none && over);
    if (none) {
      EXPECT_EQ(conv.direct(), plain_avx2 && !over);
    }
    const cpu::Int8Conv sums(n, g, w, nullptr, false, DType::i32);
    EXPECT_EQ(sums.split(), none && over);
    EXPECT_FALSE(sums.direct());
    Node n1 = n;
    n1.attrs["pads"] = attr_ints({0, 0, 0, 0});
    cpu::ConvGeometry g1;
    ASSERT_FALSE(cpu::conv_geometry(n1, {1, 40, 7, 6}, {20, 40, 1, 1}, false, &g1).has_value());
    const cpu::Int8Conv one(n1, g1, pair_safe_8bit(DType::i8, {20, 40, 1, 1}, 1, 40, 2, over),
                            nullptr, false, DType::u8);
    EXPECT_EQ(one.split(), none && over);
    if (plain_avx2) {
      EXPECT_FALSE(one.direct());
    }
    const Tensor b = pair_safe_8bit(DType::i8, {68, 24}, 24, 68, 11, over);
    const cpu::Int8MatMul mm(n, 10, b, nullptr, false);
    EXPECT_EQ(mm.split(), none && over);
  }
}

// Q(x) -> DQ -> Conv(DQ(w), DQ(int32 bias)) -> Q -> DQ -> depthwise Conv -> Q -> DQ ->
// MatMul(DQ(w)) -> Q -> DQ: fuse_qdq makes three QLinear nodes of it, computed as ref's
// QLinear kernels compute them (ONNX Runtime's optimized run). The file as written (ref,
// no passes) rounds the f32 products once more: the bytes may differ by one step there.
TEST(CpuInt8, QdqConvolutionsAndMatMulBecomeQLinearOps) {
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({1, 8, 10, 12})).output("y");
  auto qdq = [&](const std::string& v, float s, int z, DType t) {
    b.initializer(v + "_s", Tensor::from_vector<float>({}, {s}));
    b.initializer(v + "_z", scalar_8bit(t, z));
    b.node("QuantizeLinear", {v, v + "_s", v + "_z"}, {v + "_q"});
    b.node("DequantizeLinear", {v + "_q", v + "_s", v + "_z"}, {v + "_dq"});
    return v + "_dq";
  };
  auto weights = [&](const std::string& w, const Shape& shape, int64_t axis, uint64_t seed) {
    const int64_t ch = shape[size_t(axis)];
    b.initializer(w, extreme_8bit(DType::i8, shape, seed));
    b.initializer(w + "_s", random_f32({ch}, seed + 1, 0.001f, 0.01f));
    b.initializer(w + "_z", Tensor(DType::i8, {ch}));
    b.node("DequantizeLinear", {w, w + "_s", w + "_z"}, {w + "_dq"}).attrs["axis"] = attr_int(axis);
    return w + "_dq";
  };
  const std::string x = qdq("x", 0.02f, 128, DType::u8);
  const std::string w1 = weights("w1", {16, 8, 3, 3}, 0, 11);
  // The bias at scale x_scale * w_scale, as quantizers write it.
  const Tensor s1 = b.model().graph.initializers.at("w1_s");
  Tensor bs(DType::f32, {16});
  Tensor bq(DType::i32, {16});
  for (int64_t c = 0; c < 16; ++c) {
    bs.data<float>()[c] = 0.02f * s1.data<float>()[c];
    bq.data<int32_t>()[c] = int32_t(c * 311 - 2500);
  }
  b.initializer("b1", bq).initializer("b1_s", bs);
  b.node("DequantizeLinear", {"b1", "b1_s"}, {"b1_dq"}).attrs["axis"] = attr_int(0);
  Node& c1 = b.node("Conv", {x, w1, "b1_dq"}, {"c1"}, "conv1");
  c1.attrs["pads"] = attr_ints({1, 1, 1, 1});
  const std::string c1q = qdq("c1", 0.05f, 3, DType::i8);
  // Between them a Relu on bytes (a slim:QLookup, folded into the convolution before it),
  // whose result a second graph output also reads (so it writes plain NCHW bytes).
  b.node("Relu", {c1q}, {"r1"});
  const std::string h = qdq("r1", 0.05f, -128, DType::i8);
  b.output("h");
  b.node("Identity", {h}, {"h"});
  Node& c2 = b.node("Conv", {h, weights("w2", {16, 1, 3, 3}, 0, 21)}, {"c2"}, "conv2");
  c2.attrs["group"] = attr_int(16);
  c2.attrs["strides"] = attr_ints({2, 2});
  const std::string h2 = qdq("c2", 0.04f, 100, DType::u8);
  b.node("MatMul", {h2, weights("w3", {5, 7}, 1, 31)}, {"m"}, "mm");
  b.node("Identity", {qdq("m", 0.01f, 128, DType::u8)}, {"y"});
  const Model m = b.build();
  const TensorMap in = {{"x", random_f32({1, 8, 10, 12}, 3, -2.f, 2.f)}};
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  auto fast = Session::compile(m, o);
  std::map<std::string, int> ops;
  for (const auto& a : fast->partition()) {
    EXPECT_EQ(a.provider, "cpu") << a.node;
    ++ops[a.op];
  }
  // The Relu's table folded into the first convolution (fuse_qlinear_conv_lookup).
  EXPECT_EQ(ops["QLinearConv"], 1);
  EXPECT_EQ(ops["slim:QLinearConvLookup"], 1);
  EXPECT_EQ(ops["QLinearMatMul"], 1);
  EXPECT_EQ(ops["slim:QLookup"], 0);
  SessionOptions r;
  r.providers = {"ref"};
  r.optimize = false;
  const Tensor got = fast->run(in).at("y"), want = Session::compile(m, r)->run(in).at("y");
  ASSERT_EQ(got.shape(), want.shape());
  int64_t moved = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float d = std::fabs(got.data<float>()[i] - want.data<float>()[i]);
    EXPECT_LE(d, 0.01f * 2.5f) << i;  // the last layer's step plus what one step before moves
    moved += d > 0;
  }
  EXPECT_LT(moved, got.numel() / 4);
}

// DequantizeLinear -> elementwise op -> QuantizeLinear stays on bytes (fuse_qdq_elementwise):
// HardSwish written out (Add, Mul, Div, as PaddleOCR exports it) becomes one slim:QLookup,
// the squeeze-excitation product with its [N, C, 1, 1] gate and the residual Add after it
// slim:QLinearMulAdd; every byte equals the unfused nodes' on ref.
TEST(CpuInt8, QdqElementwiseChainsStayOnBytesExactly) {
  for (DType t : {DType::u8, DType::i8}) {
    ModelBuilder b(13);
    b.input("x", DType::f32, spec({2, 8, 9, 13})).output("y");
    const int z0 = t == DType::u8 ? 128 : 0;
    auto qdq = [&](const std::string& v, float s, int z) {
      b.initializer(v + "_s", Tensor::from_vector<float>({}, {s}));
      b.initializer(v + "_z", scalar_8bit(t, z));
      b.node("QuantizeLinear", {v, v + "_s", v + "_z"}, {v + "_q"});
      b.node("DequantizeLinear", {v + "_q", v + "_s", v + "_z"}, {v + "_dq"});
      return v + "_dq";
    };
    b.initializer("three", Tensor::from_vector<float>({}, {3.f}));
    b.initializer("six", Tensor::from_vector<float>({}, {6.f}));
    const std::string x = qdq("x", 0.031f, z0);
    b.node("Add", {x, "three"}, {"a"});
    b.node("Mul", {x, qdq("a", 0.027f, z0 - 100)}, {"m"});
    b.node("Div", {qdq("m", 0.07f, z0 - 20), "six"}, {"hs"});
    const std::string hs = qdq("hs", 0.013f, z0 - 30);
    b.node("GlobalAveragePool", {hs}, {"pool"});
    b.node("HardSigmoid", {qdq("pool", 0.01f, z0)}, {"gate"}).attrs["alpha"] =
        testing::attr_float(0.2f);
    b.node("Mul", {hs, qdq("gate", 1.f / 255, z0 - 128)}, {"se"});
    b.node("Add", {qdq("se", 0.011f, z0 + 5), x}, {"res"});
    b.node("Identity", {qdq("res", 0.04f, z0 - 7)}, {"y"});
    const Model m = b.build();
    const TensorMap in = {{"x", random_f32({2, 8, 9, 13}, 5, -5.f, 5.f)}};
    SessionOptions o;
    o.providers = {"cpu", "ref"};
    auto fast = Session::compile(m, o);
    std::map<std::string, int> ops;
    for (const auto& a : fast->partition()) {
      EXPECT_EQ(a.provider, "cpu") << a.node;
      ++ops[a.op];
    }
    EXPECT_EQ(ops["slim:QLookup"], 2);  // HardSwish; HardSigmoid
    // The SE product and the residual Add after it (its only reader): one node.
    EXPECT_EQ(ops["slim:QLinearMulAdd"], 1);
    EXPECT_EQ(ops["slim:QLinearMul"] + ops["slim:QLinearAdd"], 0);
    EXPECT_EQ(ops["slim:QLinearGlobalAveragePool"], 1);
    EXPECT_EQ(ops["Mul"] + ops["Add"] + ops["Div"] + ops["HardSigmoid"] + ops["GlobalAveragePool"], 0);
    SessionOptions r;
    r.providers = {"ref"};
    r.optimize = false;
    const Tensor got = fast->run(in).at("y"), want = Session::compile(m, r)->run(in).at("y");
    ASSERT_EQ(got.shape(), want.shape());
    for (int64_t i = 0; i < got.numel(); ++i)
      ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
  }
}

// slim:QLinearGlobalAveragePool on NCHW bytes and on a QLinearConv's channels-last bytes
// (the sums of 8-bit extremes, requantized once) equals ref's to the byte.
TEST(CpuInt8, QLinearGlobalAveragePoolGivesRefsBytesExactly) {
  for (DType t : {DType::u8, DType::i8})
    for (bool after_conv : {false, true}) {
      SCOPED_TRACE(std::string(t == DType::u8 ? "u8" : "i8") + (after_conv ? " after a conv" : ""));
      const Shape s = {2, 21, 7, 9};
      ModelBuilder b(13);
      b.opset(kFusedDomain, kFusedOpset);
      b.input("x", t, spec(s)).output("y");
      std::string x = "x";
      if (after_conv) {
        add_qlinear_params(b, "", t, t, 21, DType::i8, true, 3);
        b.initializer("w", extreme_8bit(DType::i8, {21, 1, 3, 3}, 8));
        Node& c = b.node("QLinearConv", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"c"});
        c.attrs["pads"] = attr_ints({1, 1, 1, 1});
        c.attrs["group"] = attr_int(21);
        x = "c";
      }
      b.initializer("ps", Tensor::from_vector<float>({}, {0.037f}));
      b.initializer("pz", scalar_8bit(t, t == DType::u8 ? 131 : -5));
      b.initializer("gs", Tensor::from_vector<float>({}, {0.021f}));
      b.initializer("gz", scalar_8bit(t, t == DType::u8 ? 120 : 9));
      b.node("QLinearGlobalAveragePool", {x, "ps", "pz", "gs", "gz"}, {"y"}, "gap", kFusedDomain);
      expect_matches_ref(b.build(), {{"x", extreme_8bit(t, s, 12)}}, "gap", "cpu", 0, 0);
    }
}

// The scale (v_s) and zero point (v_z) initializers of per-tensor bytes v of type t.
void add_qparams(ModelBuilder& b, const std::string& v, DType t, float scale, int zp) {
  b.initializer(v + "_s", Tensor::from_vector<float>({}, {scale}));
  b.initializer(v + "_z", scalar_8bit(t, zp));
}

// A test model's Q/DQ nodes with add_qparams' parameters of v: dq(v) dequantizes v (once;
// later calls reuse its output), q(f, v) quantizes f into v.
struct QdqNodes {
  ModelBuilder& b;
  std::set<std::string> dequantized = {};
  std::string dq(const std::string& v) {
    if (dequantized.insert(v).second)
      b.node("DequantizeLinear", {v, v + "_s", v + "_z"}, {v + "_dq"});
    return v + "_dq";
  }
  std::string q(const std::string& f, const std::string& v) {
    b.node("QuantizeLinear", {f, v + "_s", v + "_z"}, {v});
    return v;
  }
};

// QLinearConv x -> y, k x k with same padding, int8 weights with per-channel scales; the
// bytes' parameters are x_s/x_z and y_s/y_z (add_qparams).
void add_qconv(ModelBuilder& b, const std::string& x, const std::string& y, int64_t ic, int64_t oc,
               int64_t k, uint64_t seed) {
  b.initializer(y + "_w", extreme_8bit(DType::i8, {oc, ic, k, k}, seed));
  b.initializer(y + "_ws", random_f32({oc}, seed + 1, 0.0005f, 0.002f));
  b.initializer(y + "_wz", Tensor(DType::i8, {oc}));
  Node& c =
      b.node("QLinearConv",
             {x, x + "_s", x + "_z", y + "_w", y + "_ws", y + "_wz", y + "_s", y + "_z"}, {y});
  c.attrs["pads"] = attr_ints({k / 2, k / 2, k / 2, k / 2});
}

// Between QLinearConvs the 8-bit chain stays channels-last and on bytes: residual Adds of
// two channels-last inputs, an Add of a channels-last and a plain input, the SE product
// with its [N, C, 1, 1] gate (whose result a graph output also reads: written plain),
// nearest Resizes (one requantizing, one at its input's scale: no table) and a Concat of
// differently scaled inputs (fuse_qdq_movement). Every byte equals the unfused nodes' on
// ref, for uint8 and int8 activations.
TEST(CpuInt8, QdqChainsBetweenQLinearConvsStayChannelsLastExactly) {
  for (DType t : {DType::u8, DType::i8}) {
    SCOPED_TRACE(t == DType::u8 ? "u8" : "i8");
    ModelBuilder b(13);
    const Shape xs = {1, 8, 6, 10}, x2s = {1, 16, 6, 10};
    b.input("x", t, spec(xs)).input("x2", t, spec(x2s)).output("y").output("se_out");
    const int z0 = t == DType::u8 ? 128 : 0;
    auto params = [&](const std::string& v, float s, int z) { add_qparams(b, v, t, s, z); };
    QdqNodes qdq{b};
    params("x", 0.031f, z0 - 3);
    params("x2", 0.05f, z0 + 11);
    params("c1", 0.09f, z0 - 40);
    params("c2", 0.07f, z0 + 20);
    add_qconv(b, "x", "c1", 8, 16, 3, 41);
    add_qconv(b, "x", "c2", 8, 16, 1, 43);
    params("a", 0.12f, z0 - 10);
    b.node("Add", {qdq.dq("c1"), qdq.dq("c2")}, {"a_f"});
    qdq.q("a_f", "a");  // both inputs channels-last
    params("m", 0.1f, z0 + 2);
    b.node("Add", {qdq.dq("c2"), qdq.dq("x2")}, {"m_f"});
    qdq.q("m_f", "m");  // channels-last and plain
    params("g", 0.01f, z0);
    b.node("GlobalAveragePool", {qdq.dq("a")}, {"g_f"});
    qdq.q("g_f", "g");
    params("se", 0.2f, z0 - 1);
    b.node("Mul", {qdq.dq("a"), qdq.dq("g")}, {"se_f"});
    qdq.q("se_f", "se");
    b.node("Identity", {"se"}, {"se_out"});
    b.initializer("scales", Tensor::from_vector<float>({4}, {1.f, 1.f, 2.f, 2.f}));
    params("r1", 0.23f, z0 + 7);
    b.node("Resize", {qdq.dq("se"), "", "scales"}, {"r1_f"}).attrs["mode"] =
        testing::attr_string("nearest");
    qdq.q("r1_f", "r1");
    b.initializer("sizes", Tensor::from_vector<int64_t>({4}, {1, 16, 12, 20}));
    params("r2", 0.1f, z0 + 2);  // m's parameters: no table
    b.node("Resize", {qdq.dq("m"), "", "", "sizes"}, {"r2_f"}).attrs["mode"] =
        testing::attr_string("nearest");
    qdq.q("r2_f", "r2");
    params("cat", 0.15f, z0 - 5);
    b.node("Concat", {qdq.dq("r1"), qdq.dq("r2")}, {"cat_f"}).attrs["axis"] = attr_int(1);
    qdq.q("cat_f", "cat");
    params("y", 0.3f, z0 + 1);
    add_qconv(b, "cat", "y", 32, 5, 1, 47);
    const Model m = b.build();
    const TensorMap in = {{"x", extreme_8bit(t, xs, 51)}, {"x2", extreme_8bit(t, x2s, 52)}};
    SessionOptions o;
    o.providers = {"cpu", "ref"};
    auto fast = Session::compile(m, o);
    std::map<std::string, int> ops;
    for (const auto& a : fast->partition()) {
      EXPECT_EQ(a.provider, "cpu") << a.node;
      ++ops[a.op];
    }
    // The residual Add of c1 (c1's only reader) folded into it (fuse_residual_qlinear_add).
    EXPECT_EQ(ops["slim:QLinearAdd"], 1);
    EXPECT_EQ(ops["slim:QLinearConvAdd"], 1);
    EXPECT_EQ(ops["slim:QLinearMul"], 1);
    EXPECT_EQ(ops["Resize"], 2);
    EXPECT_EQ(ops["Concat"], 1);
    EXPECT_EQ(ops["QuantizeLinear"] + ops["DequantizeLinear"], 0);
    SessionOptions r;
    r.providers = {"ref"};
    r.optimize = false;
    const TensorMap got = fast->run(in), want = Session::compile(m, r)->run(in);
    for (const char* name : {"y", "se_out"}) {
      const Tensor& g = got.at(name);
      const Tensor& w = want.at(name);
      ASSERT_EQ(g.shape(), w.shape()) << name;
      ASSERT_EQ(g.dtype(), w.dtype()) << name;
      for (int64_t i = 0; i < g.numel(); ++i)
        ASSERT_EQ(static_cast<const uint8_t*>(g.raw_data())[i],
                  static_cast<const uint8_t*>(w.raw_data())[i])
            << name << " " << i;
    }
  }
}

// DepthToSpace of 8-bit bytes (where fuse_qdq sends a ConvTranspose's blocks): plain bytes,
// a QLinearConv's channels-last bytes written plain, and channels-last on to the next
// QLinearConv, in DCR and CRD mode: ref's bytes exactly.
TEST(CpuInt8, DepthToSpaceOfBytesGivesRefsBytes) {
  for (DType t : {DType::u8, DType::i8})
    for (const char* mode : {"DCR", "CRD"})
      for (int chain = 0; chain < 3; ++chain) {
        SCOPED_TRACE(std::string(mode) + " chain " + std::to_string(chain));
        const Shape in_shape = chain > 0 ? Shape{2, 8, 3, 5} : Shape{2, 12, 3, 5};
        ModelBuilder b(13);
        b.input("x", t, spec(in_shape)).output("y");
        std::string x = "x";
        if (chain > 0) {
          add_qlinear_params(b, "", t, t, 12, DType::i8, true, 3);
          b.initializer("w", extreme_8bit(DType::i8, {12, 8, 1, 1}, 8));
          b.node("QLinearConv", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"c"});
          x = "c";
        }
        const std::string d = chain == 2 ? "d" : "y";
        Node& n = b.node("DepthToSpace", {x}, {d}, "d2s");
        n.attrs["blocksize"] = attr_int(2);
        n.attrs["mode"] = testing::attr_string(mode);
        if (chain == 2) {
          add_qlinear_params(b, "p", t, t, 4, DType::i8, true, 5);
          b.initializer("pxs", Tensor::from_vector<float>({}, {0.55f}));  // c's scale
          b.initializer("pxz", scalar_8bit(t, t == DType::u8 ? 97 : 3));
          b.initializer("pw", extreme_8bit(DType::i8, {4, 3, 1, 1}, 9));
          b.node("QLinearConv", {"d", "pxs", "pxz", "pw", "pws", "pwz", "pys", "pyz"}, {"y"});
        }
        expect_matches_ref(b.build(), {{"x", extreme_8bit(t, in_shape, 13)}}, "d2s", "cpu", 0, 0);
      }
}

// DQ(x) -> ConvTranspose(DQ(w), DQ(int32 bias)) -> Q with kernel = stride (PP-OCR's DB
// head upsampling twice, 2x2 and then 3x3 here) becomes a 1x1 QLinearConv and a
// DepthToSpace (fuse_qdq): ONNX Runtime's QLinearConvTranspose sums, requantized once. The
// file as written (ref, no passes) rounds the f32 products once more: a step at most.
TEST(CpuInt8, QdqConvTransposeBecomesQLinearConvAndDepthToSpace) {
  ModelBuilder b(13);
  const Shape xs = {1, 8, 5, 7};
  b.input("x", DType::f32, spec(xs)).output("y");
  auto qdq = [&](const std::string& v, float s, int z) {
    b.initializer(v + "_s", Tensor::from_vector<float>({}, {s}));
    b.initializer(v + "_z", scalar_8bit(DType::u8, z));
    b.node("QuantizeLinear", {v, v + "_s", v + "_z"}, {v + "_q"});
    b.node("DequantizeLinear", {v + "_q", v + "_s", v + "_z"}, {v + "_dq"});
    return v + "_dq";
  };
  auto weights = [&](const std::string& w, const Shape& shape, bool per_channel, uint64_t seed) {
    const int64_t ch = per_channel ? shape[1] : 1;
    b.initializer(w, extreme_8bit(DType::i8, shape, seed));
    b.initializer(w + "_s", per_channel ? random_f32({ch}, seed + 1, 0.001f, 0.01f)
                                        : Tensor::from_vector<float>({}, {0.004f}));
    b.initializer(w + "_z", per_channel ? Tensor(DType::i8, {ch}) : Tensor(DType::i8, {}));
    b.node("DequantizeLinear", {w, w + "_s", w + "_z"}, {w + "_dq"}).attrs["axis"] = attr_int(1);
    return w + "_dq";
  };
  const std::string x = qdq("x", 0.02f, 128);
  const std::string w1 = weights("w1", {8, 6, 2, 2}, true, 11);
  const Tensor s1 = b.model().graph.initializers.at("w1_s");
  Tensor bs(DType::f32, {6});
  Tensor bq(DType::i32, {6});
  for (int64_t c = 0; c < 6; ++c) {
    bs.data<float>()[c] = 0.02f * s1.data<float>()[c];
    bq.data<int32_t>()[c] = int32_t(c * 411 - 1200);
  }
  b.initializer("b1", bq).initializer("b1_s", bs);
  b.node("DequantizeLinear", {"b1", "b1_s"}, {"b1_dq"}).attrs["axis"] = attr_int(0);
  Node& t1 = b.node("ConvTranspose", {x, w1, "b1_dq"}, {"t1"}, "deconv1");
  t1.attrs["strides"] = attr_ints({2, 2});
  t1.attrs["kernel_shape"] = attr_ints({2, 2});
  const std::string h = qdq("t1", 0.05f, 60);
  Node& t2 =
      b.node("ConvTranspose", {h, weights("w2", {6, 1, 3, 3}, false, 21)}, {"t2"}, "deconv2");
  t2.attrs["strides"] = attr_ints({3, 3});
  b.node("Identity", {qdq("t2", 0.03f, 128)}, {"y"});
  const Model m = b.build();
  const TensorMap in = {{"x", random_f32(xs, 3, -2.f, 2.f)}};
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  auto fast = Session::compile(m, o);
  std::map<std::string, int> ops;
  for (const auto& a : fast->partition()) {
    EXPECT_EQ(a.provider, "cpu") << a.node;
    ++ops[a.op];
  }
  EXPECT_EQ(ops["QLinearConv"], 2);
  EXPECT_EQ(ops["DepthToSpace"], 2);
  EXPECT_EQ(ops["ConvTranspose"], 0);
  SessionOptions r;
  r.providers = {"ref"};
  r.optimize = false;
  const Tensor got = fast->run(in).at("y"), want = Session::compile(m, r)->run(in).at("y");
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.shape(), Shape({1, 1, 30, 42}));
  int64_t moved = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float d = std::fabs(got.data<float>()[i] - want.data<float>()[i]);
    EXPECT_LE(d, 0.03f * 2.5f) << i;
    moved += d > 0;
  }
  EXPECT_LT(moved, got.numel() / 4);
}

// A QuantizeLinear read by a QLinearConv writes its bytes channels-last (a quantized CNN's
// input): ref's bytes exactly.
TEST(CpuInt8, QuantizeLinearIntoQLinearConvGivesRefsBytes) {
  for (DType t : {DType::u8, DType::i8}) {
    const Shape xs = {2, 3, 9, 11};
    ModelBuilder b(13);
    b.input("x", DType::f32, spec(xs)).output("y");
    add_qlinear_params(b, "", t, t, 16, DType::i8, true, 3);
    b.node("QuantizeLinear", {"x", "xs", "xz"}, {"xq"}, "q");
    b.initializer("w", extreme_8bit(DType::i8, {16, 3, 3, 3}, 8));
    Node& c = b.node("QLinearConv", {"xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"y"});
    c.attrs["pads"] = attr_ints({1, 1, 1, 1});
    expect_matches_ref(b.build(), {{"x", random_f32(xs, 4, -4.f, 4.f)}}, "q", "cpu", 0, 0);
  }
}

// A QLinearConv whose only reader is an activation's table (DQ -> HardSigmoid -> Q, a
// slim:QLookup) becomes slim:QLinearConvLookup: the bytes mapped as they are requantized,
// here from uint8 to int8, by a banded 1x1 convolution (also read by a graph output: written
// plain) and a 3x3 one (channels-last into the next QLinearConv): ref's bytes.
TEST(CpuInt8, QLinearConvWithItsActivationTableGivesRefsBytes) {
  for (int64_t k : {1, 3}) {
    SCOPED_TRACE("kernel " + std::to_string(k));
    const Shape xs = {1, 8, 72, 64};
    ModelBuilder b(13);
    b.input("x", DType::u8, spec(xs)).output("y");
    if (k == 1) b.output("a_out");  // then the table's bytes go out plain too
    add_qlinear_params(b, "", DType::u8, DType::u8, 40, DType::i8, true, 3);
    b.initializer("w", extreme_8bit(DType::i8, {40, 8, k, k}, 8));
    Node& c = b.node("QLinearConv", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"c"});
    c.attrs["pads"] = attr_ints({k / 2, k / 2, k / 2, k / 2});
    b.node("DequantizeLinear", {"c", "ys", "yz"}, {"cf"});
    b.node("HardSigmoid", {"cf"}, {"hf"});
    b.initializer("as", Tensor::from_vector<float>({}, {1.f / 255}));
    b.initializer("az", scalar_8bit(DType::i8, -128));
    b.node("QuantizeLinear", {"hf", "as", "az"}, {"a"});
    if (k == 1) b.node("Identity", {"a"}, {"a_out"});
    add_qlinear_params(b, "p", DType::i8, DType::u8, 4, DType::i8, true, 5);
    b.initializer("pw", extreme_8bit(DType::i8, {4, 40, 1, 1}, 9));
    b.node("QLinearConv", {"a", "as", "az", "pw", "pws", "pwz", "pys", "pyz"}, {"y"});
    const Model m = b.build();
    const TensorMap in = {{"x", extreme_8bit(DType::u8, xs, 13)}};
    SessionOptions o;
    o.providers = {"cpu", "ref"};
    auto fast = Session::compile(m, o);
    std::map<std::string, int> ops;
    for (const auto& a : fast->partition()) {
      EXPECT_EQ(a.provider, "cpu") << a.node;
      ++ops[a.op];
    }
    EXPECT_EQ(ops["slim:QLinearConvLookup"], 1);
    EXPECT_EQ(ops["slim:QLookup"], 0);
    SessionOptions r;
    r.providers = {"ref"};
    r.optimize = false;
    const TensorMap got = fast->run(in), want = Session::compile(m, r)->run(in);
    for (const char* name : {"y", "a_out"}) {
      if (!got.count(name)) continue;
      const Tensor& g = got.at(name);
      const Tensor& w = want.at(name);
      ASSERT_EQ(g.shape(), w.shape()) << name;
      ASSERT_EQ(g.dtype(), w.dtype()) << name;
      for (int64_t i = 0; i < g.numel(); ++i)
        ASSERT_EQ(static_cast<const uint8_t*>(g.raw_data())[i],
                  static_cast<const uint8_t*>(w.raw_data())[i])
            << name << " " << i;
    }
  }
}

// The ops of the cpu session (every node on cpu), and its outputs against the unoptimized
// graph's on ref: the same bytes.
std::map<std::string, int> cpu_ops(const Session& s) {
  std::map<std::string, int> ops;
  for (const auto& a : s.partition()) {
    EXPECT_EQ(a.provider, "cpu") << a.node;
    ++ops[a.op];
  }
  return ops;
}

void expect_bytes_of_ref(const Model& m, const TensorMap& in, Session& fast) {
  SessionOptions r;
  r.providers = {"ref"};
  r.optimize = false;
  const TensorMap got = fast.run(in), want = Session::compile(m, r)->run(in);
  for (const auto& [name, w] : want) {
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), w.shape()) << name;
    ASSERT_EQ(g.dtype(), w.dtype()) << name;
    for (int64_t i = 0; i < g.numel(); ++i)
      ASSERT_EQ(static_cast<const uint8_t*>(g.raw_data())[i],
                static_cast<const uint8_t*>(w.raw_data())[i])
          << name << " " << i;
  }
}

// DQ(v) -> Neg -> Q into graph output y at v's scale and the mirrored zero point: a
// bijection of the bytes (a slim:QLookup that reads them channels-last and writes y NCHW),
// so every byte of v reaches the comparison unchanged in information.
void negate_to_output(ModelBuilder& b, const std::string& v, DType t, float scale, int zp,
                      const std::string& y) {
  add_qparams(b, y, t, scale, t == DType::u8 ? 255 - zp : -1 - zp);
  b.node("DequantizeLinear", {v, v + "_s", v + "_z"}, {v + "_negf"});
  b.node("Neg", {v + "_negf"}, {y + "_f"});
  b.node("QuantizeLinear", {y + "_f", y + "_s", y + "_z"}, {y});
}

// DequantizeLinear -> MaxPool -> QuantizeLinear becomes a MaxPool of the bytes
// (fuse_qdq_movement): at equal scales and zero points alone, else with the requantizing
// table after it (bytes of a graph input) or folded into the QLinearConv before it. Pads,
// strides, dilations and ceil_mode; 13 channels (a masked AVX-512 tail); channels-last from
// a QLinearConv and on (to a table's slim:QLookup, which writes NCHW), and NCHW (a graph
// input, or a graph output also reading the pool).
TEST(CpuInt8, QdqMaxPoolRunsOnBytesExactly) {
  struct Pool {
    Shape k, strides, dilations, pads;
    int64_t ceil = 0;
  };
  const std::vector<Pool> pools = {{{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1},
                                   {{2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0},
                                   {{3, 2}, {1, 1}, {2, 1}, {1, 0, 2, 1}, 0}};
  for (DType t : {DType::u8, DType::i8})
    for (bool after_conv : {false, true})
      for (bool requantize : {false, true})
        for (size_t pi = 0; pi < pools.size(); ++pi) {
          SCOPED_TRACE(std::string(t == DType::u8 ? "u8" : "i8") + (after_conv ? " conv" : "") +
                       (requantize ? " requantized" : "") + " pool " + std::to_string(pi));
          const Pool& pool = pools[pi];
          const Shape xs = {2, 13, 9, 11};
          ModelBuilder b(13);
          b.input("x", t, spec(xs)).output("y");
          // The pool's output also read by a graph output: written NCHW.
          if (pi == 1) b.output("p_out");
          const int z0 = t == DType::u8 ? 128 : 0;
          auto params = [&](const std::string& v, float s, int z) { add_qparams(b, v, t, s, z); };
          params("x", 0.031f, z0 - 3);
          std::string src = "x";
          if (after_conv) {
            params("c", 0.09f, z0 - 40);
            add_qconv(b, "x", "c", 13, 13, 3, 41);
            src = "c";
          }
          if (requantize)
            params("p", 0.07f, z0 + 9);
          else
            params("p", after_conv ? 0.09f : 0.031f, after_conv ? z0 - 40 : z0 - 3);
          b.node("DequantizeLinear", {src, src + "_s", src + "_z"}, {"d"});
          Node& mp = b.node("MaxPool", {"d"}, {"m"});
          mp.attrs["kernel_shape"] = attr_ints(pool.k);
          mp.attrs["strides"] = attr_ints(pool.strides);
          mp.attrs["dilations"] = attr_ints(pool.dilations);
          mp.attrs["pads"] = attr_ints(pool.pads);
          mp.attrs["ceil_mode"] = attr_int(pool.ceil);
          b.node("QuantizeLinear", {"m", "p_s", "p_z"}, {"p"});
          if (pi == 1) b.node("Identity", {"p"}, {"p_out"});
          if (requantize)
            negate_to_output(b, "p", t, 0.07f, z0 + 9, "y");
          else
            negate_to_output(b, "p", t, after_conv ? 0.09f : 0.031f, after_conv ? z0 - 40 : z0 - 3,
                             "y");
          const Model m = b.build();
          const TensorMap in = {{"x", extreme_8bit(t, xs, 51)}};
          SessionOptions o;
          o.providers = {"cpu", "ref"};
          auto fast = Session::compile(m, o);
          auto ops = cpu_ops(*fast);
          EXPECT_EQ(ops["MaxPool"], 1);
          EXPECT_EQ(ops["QuantizeLinear"] + ops["DequantizeLinear"], 0);
          // The Neg's table, after the requantizing one composed into it (fuse_qdq_movement:
          // a QLookup read only by another) unless the pool's bytes also go out (pool 1).
          EXPECT_EQ(ops["slim:QLookup"], requantize && !after_conv && pi == 1 ? 2 : 1);
          EXPECT_EQ(ops["slim:QLinearConvLookup"], requantize && after_conv ? 1 : 0);
          expect_bytes_of_ref(m, in, *fast);
        }
}

// A QLinearConv (or its activation's slim:QLinearConvLookup) whose only reader is a residual
// slim:QLinearAdd becomes slim:QLinearConvAdd (fuse_residual_qlinear_add): the Add in the
// requantizing epilogue. The residual comes channels-last from another QLinearConv or NCHW
// from a graph input; the sum goes on channels-last (to a table) or out NCHW; 13
// channels, uint8 and int8, a 1x1 convolution over enough sums to run in bands; every
// scale different. Ref's bytes of the unfused nodes.
TEST(CpuInt8, QLinearConvWithItsResidualAddGivesRefsBytes) {
  for (DType t : {DType::u8, DType::i8})
    for (bool residual_conv : {false, true})
      for (bool relu : {false, true})
        for (int64_t k : {1, 3}) {
          SCOPED_TRACE(std::string(t == DType::u8 ? "u8" : "i8") +
                       (residual_conv ? " conv residual" : "") + (relu ? " relu" : "") +
                       " kernel " + std::to_string(k));
          const Shape xs = k == 1 ? Shape{1, 7, 72, 64} : Shape{2, 7, 9, 11};
          const Shape ys = {xs[0], 13, xs[2], xs[3]};
          ModelBuilder b(13);
          b.input("x", t, spec(xs)).output("y");
          if (!residual_conv) b.input("r", t, spec(ys));
          if (k == 3) b.output("s_out");  // the sum also goes out: NCHW
          const int z0 = t == DType::u8 ? 128 : 0;
          auto params = [&](const std::string& v, float s, int z) { add_qparams(b, v, t, s, z); };
          params("x", 0.031f, z0 - 3);
          params("r", 0.05f, z0 + 11);
          if (residual_conv) add_qconv(b, "x", "r", 7, 13, 1, 43);
          params("c", 0.09f, z0 - 40);
          add_qconv(b, "x", "c", 7, 13, k, 41);
          std::string a = "c";
          if (relu) {
            b.node("DequantizeLinear", {"c", "c_s", "c_z"}, {"c_f"});
            b.node("Relu", {"c_f"}, {"h_f"});
            params("h", 0.045f, z0 - 128);
            b.node("QuantizeLinear", {"h_f", "h_s", "h_z"}, {"h"});
            a = "h";
          }
          b.node("DequantizeLinear", {a, a + "_s", a + "_z"}, {"a_f"});
          b.node("DequantizeLinear", {"r", "r_s", "r_z"}, {"r_f"});
          b.node("Add", {"a_f", "r_f"}, {"s_f"});
          params("s", 0.12f, z0 - 10);
          b.node("QuantizeLinear", {"s_f", "s_s", "s_z"}, {"s"});
          if (k == 3) b.node("Identity", {"s"}, {"s_out"});
          negate_to_output(b, "s", t, 0.12f, z0 - 10, "y");
          const Model m = b.build();
          TensorMap in = {{"x", extreme_8bit(t, xs, 51)}};
          if (!residual_conv) in["r"] = extreme_8bit(t, ys, 52);
          SessionOptions o;
          o.providers = {"cpu", "ref"};
          auto fast = Session::compile(m, o);
          auto ops = cpu_ops(*fast);
          EXPECT_EQ(ops["slim:QLinearConvAdd"], 1);
          EXPECT_EQ(ops["slim:QLinearAdd"] + ops["slim:QLinearConvLookup"], 0);
          EXPECT_EQ(ops["slim:QLookup"], 1);  // the Neg
          EXPECT_EQ(ops["QuantizeLinear"] + ops["DequantizeLinear"], 0);
          expect_bytes_of_ref(m, in, *fast);
        }
}

// x + x * gate, the shortcut around a squeeze-excitation gate (PP-OCR's detector's RSE
// layers): the slim:QLinearMul read only by the residual slim:QLinearAdd becomes
// slim:QLinearMulAdd (fuse_residual_qlinear_add). x a QLinearConv's channels-last bytes
// (read by the pool, the product and the Add) or a graph input's NCHW ones; the gate
// [N, C, 1, 1] or a full second tensor; the sum on channels-last (to a table) or, read by a
// graph output too, NCHW. Ref's bytes of the unfused nodes. Gated images of 256 pixels or
// more run through per-channel tables below AVX-512 (17 x 16; runtime_int8_avx2 and
// runtime_int8_scalar), smaller ones element by element (9 x 11).
TEST(CpuInt8, QLinearMulWithItsResidualAddGivesRefsBytes) {
  for (DType t : {DType::u8, DType::i8})
    for (bool after_conv : {false, true})
      for (bool gated : {false, true})
        for (const Shape& xs : {Shape{2, 13, 9, 11}, Shape{2, 13, 17, 16}}) {
          SCOPED_TRACE(std::string(t == DType::u8 ? "u8" : "i8") + (after_conv ? " conv" : "") +
                       (gated ? " gated " : " full ") + shape_str(xs));
          ModelBuilder b(13);
          b.input("x", t, spec(xs)).output("y");
          if (!gated) b.input("f", t, spec(xs));
          if (gated) b.output("s_out");  // the sum also goes out: NCHW
          const int z0 = t == DType::u8 ? 128 : 0;
          auto params = [&](const std::string& v, float s, int z) { add_qparams(b, v, t, s, z); };
          QdqNodes qdq{b};
          params("x", 0.031f, z0 - 3);
          params("f", 0.02f, z0 + 30);
          std::string src = "x";
          if (after_conv) {
            params("c", 0.09f, z0 - 40);
            add_qconv(b, "x", "c", 13, 13, 3, 41);
            src = "c";
          }
          std::string other = "f";
          if (gated) {
            // A gate byte of its own for most channels (a table each in the lookups).
            params("g", 0.1f, z0);
            b.node("GlobalAveragePool", {qdq.dq(src)}, {"g_f"});
            qdq.q("g_f", "g");
            params("gate", 1.f / 255, z0 - 128);
            b.node("HardSigmoid", {qdq.dq("g")}, {"gate_f"}).attrs["alpha"] =
                testing::attr_float(0.04f);
            other = qdq.q("gate_f", "gate");
          }
          params("m", 0.05f, z0 + 5);
          b.node("Mul", {qdq.dq(src), qdq.dq(other)}, {"m_f"});
          qdq.q("m_f", "m");
          params("s", 0.11f, z0 - 9);
          b.node("Add", {qdq.dq(src), qdq.dq("m")}, {"s_f"});
          qdq.q("s_f", "s");
          if (gated) b.node("Identity", {"s"}, {"s_out"});
          negate_to_output(b, "s", t, 0.11f, z0 - 9, "y");
          const Model m = b.build();
          TensorMap in = {{"x", extreme_8bit(t, xs, 51)}};
          if (!gated) in["f"] = extreme_8bit(t, xs, 53);
          SessionOptions o;
          o.providers = {"cpu", "ref"};
          auto fast = Session::compile(m, o);
          auto ops = cpu_ops(*fast);
          EXPECT_EQ(ops["slim:QLinearMulAdd"], 1);
          EXPECT_EQ(ops["slim:QLinearMul"] + ops["slim:QLinearAdd"], 0);
          EXPECT_EQ(ops["QuantizeLinear"] + ops["DequantizeLinear"], 0);
          expect_bytes_of_ref(m, in, *fast);
        }
}

// A Concat of 8-bit bytes along channels takes channels-last inputs (QLinearConvs' bytes)
// and hands channels-last bytes on (to a table's slim:QLookup); with a plain input among them
// (a graph input) or a plain reader (a graph output), oneDNN's byte reorders place each
// input in NCHW. Inputs at different scales are requantized by tables (fuse_qdq_movement).
TEST(CpuInt8, ConcatOfBytesStaysChannelsLastExactly) {
  for (DType t : {DType::u8, DType::i8})
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(std::string(t == DType::u8 ? "u8" : "i8") + " variant " +
                   std::to_string(variant));
      const Shape xs = {2, 7, 9, 11};
      ModelBuilder b(13);
      b.input("x", t, spec(xs)).output("y");
      if (variant == 1) b.input("e", t, spec({2, 3, 9, 11}));
      if (variant == 2) b.output("cat_out");
      const int z0 = t == DType::u8 ? 128 : 0;
      auto params = [&](const std::string& v, float s, int z) { add_qparams(b, v, t, s, z); };
      params("x", 0.031f, z0 - 3);
      params("c1", 0.09f, z0 - 40);
      params("c2", 0.07f, z0 + 20);
      params("e", 0.05f, z0 + 11);
      params("cat", 0.09f, z0 - 40);  // c1's: no table for it
      add_qconv(b, "x", "c1", 7, 13, 3, 41);
      add_qconv(b, "x", "c2", 7, 5, 1, 43);
      std::vector<std::string> parts = {"c1", "c2"};
      if (variant == 1) parts.push_back("e");
      std::vector<std::string> floats;
      for (const auto& p : parts) {
        b.node("DequantizeLinear", {p, p + "_s", p + "_z"}, {p + "_f"});
        floats.push_back(p + "_f");
      }
      b.node("Concat", floats, {"cat_f"}).attrs["axis"] = attr_int(1);
      b.node("QuantizeLinear", {"cat_f", "cat_s", "cat_z"}, {"cat"});
      if (variant == 2) b.node("Identity", {"cat"}, {"cat_out"});
      negate_to_output(b, "cat", t, 0.09f, z0 - 40, "y");
      const Model m = b.build();
      TensorMap in = {{"x", extreme_8bit(t, xs, 51)}};
      if (variant == 1) in["e"] = extreme_8bit(t, {2, 3, 9, 11}, 53);
      SessionOptions o;
      o.providers = {"cpu", "ref"};
      auto fast = Session::compile(m, o);
      auto ops = cpu_ops(*fast);
      EXPECT_EQ(ops["Concat"], 1);
      EXPECT_EQ(ops["QuantizeLinear"] + ops["DequantizeLinear"], 0);
      expect_bytes_of_ref(m, in, *fast);
    }
}

TEST(CpuInt8, QuantizationKernelsMatchRef) {
  const Shape s = {2, 3, 5, 7};
  Tensor x = random_f32(s, 90, -4.f, 4.f);
  // Quotients at and next to half-way points, where multiplying by 1 / scale could round
  // differently from dividing (the kernel divides there).
  for (int64_t i = 0; i < 120; ++i) x.data<float>()[i] = (float(i) * 0.5f - 30.f) * 0.031f;
  for (int64_t i = 120; i < 150; ++i)
    x.data<float>()[i] = std::nextafter((float(i) * 0.5f - 60.f) * 0.031f, 1e9f);
  x.data<float>()[150] = 1e30f;  // saturates
  for (DType t : {DType::u8, DType::i8})
    for (bool per_axis : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (per_axis ? " per axis" : " per tensor"));
      ModelBuilder b(13);
      b.input("x", DType::f32, spec(s)).output("q").output("d");
      b.initializer("scale", per_axis ? random_f32({3}, 91, 0.01f, 0.05f)
                                      : Tensor::from_vector<float>({}, {0.031f}));
      b.initializer(
          "zp", per_axis ? extreme_8bit(t, {3}, 92) : scalar_8bit(t, t == DType::u8 ? 131 : -3));
      b.node("QuantizeLinear", {"x", "scale", "zp"}, {"q"}, "quantize");
      b.node("DequantizeLinear", {"q", "scale", "zp"}, {"d"}, "dequantize");
      expect_matches_ref(b.build(), {{"x", x}}, "quantize", "cpu", 0, 0);
      expect_matches_ref(b.build(), {{"x", x}}, "dequantize", "cpu", 0, 0);
    }
  ModelBuilder b(13);
  b.input("x", DType::f32, spec(s)).output("q").output("scale").output("zp");
  b.node("DynamicQuantizeLinear", {"x"}, {"q", "scale", "zp"}, "dql");
  expect_matches_ref(b.build(), {{"x", random_f32(s, 93, -0.7f, 3.f)}}, "dql", "cpu", 0, 0);
}

// The vectorized 256-entry lookups (AVX-512 VBMI's permutes; AVX2's 16 rows of 16, each
// row's lookup xor-ed onto the ones before it) against the table itself: every byte value
// at every position of a vector, tails of every length, and the output over the input.
TEST(CpuInt8, ByteLookupsGiveTheTablesBytes) {
  std::mt19937 rng(7);
  std::vector<uint8_t> x(256 * 32 + 31);
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t((i * 37 + i / 256) & 255);
  cpu_test::for_each_isa([&] {
    for (int t = 0; t < 4; ++t) {
      uint8_t table[256];
      for (int v = 0; v < 256; ++v)
        table[v] = t == 0 ? uint8_t(v) : t == 1 ? uint8_t(255 - v) : uint8_t(rng());
      for (int64_t n : {int64_t(x.size()), int64_t(31), int64_t(33), int64_t(64 + 17)}) {
        std::vector<uint8_t> y(size_t(n), 0), in_place(x.begin(), x.begin() + n);
        cpu::lookup_bytes(table, x.data(), y.data(), n);
        cpu::lookup_bytes(table, in_place.data(), in_place.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(int(y[size_t(i)]), int(table[x[size_t(i)]])) << "table " << t << " at " << i;
          ASSERT_EQ(int(in_place[size_t(i)]), int(table[x[size_t(i)]])) << "in place, at " << i;
        }
      }
    }
  });
}

TEST(CpuInt8, CastsMatchRef) {
  const Shape s = {3, 37};
  Tensor f = random_f32(s, 100, -70000.f, 70000.f);
  f.data<float>()[0] = 1e-7f;    // an f16 subnormal
  f.data<float>()[1] = 65520.f;  // rounds to inf
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::f32, DType::f16}, {DType::f16, DType::f32}, {DType::i32, DType::f32},
      {DType::u8, DType::f32},  {DType::i8, DType::f32},  {DType::f32, DType::f32}};
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    ModelBuilder b(13);
    b.input("x", from, spec(s)).output("y");
    b.node("Cast", {"x"}, {"y"}, "cast").attrs["to"] = attr_int(to == DType::f16 ? 10 : 1);
    Tensor x = from == DType::f32   ? f
               : from == DType::i32 ? convert_dtype(f, DType::i32)
               : from == DType::f16 ? convert_dtype(f, DType::f16)
                                    : extreme_8bit(from, s, 101);
    expect_matches_ref(b.build(), {{"x", x}}, "cast", "cpu", 0, 0);
  }
}

}  // namespace
}  // namespace slim
