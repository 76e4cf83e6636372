// The cpu provider's own kernels (elementwise, activations, Softmax, LayerNormalization,
// reductions, Transpose/Concat/Slice/Gather) against ref, on every instruction set this
// machine has (AVX-512, AVX2, scalar), with odd sizes that leave vector tails.
#include <gtest/gtest.h>

#include "runtime/cpu_test_util.h"
#include "slim/core/cpu_features.h"
#include "slim/core/dispatch.h"
#include "slim/core/error.h"
#include "slim/runtime/provider.h"

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

TEST(CpuKernels, IsaCanBeLoweredButNotRaised) {
  const Isa active = active_isa();
  set_isa_limit("scalar");
  EXPECT_EQ(active_isa(), Isa::scalar);
  EXPECT_FALSE(isa_enabled(Isa::avx2));
  try {
    set_isa_limit("sse9");
    ADD_FAILURE() << "an unknown instruction set was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'sse9' is no instruction set"), std::string::npos) << e.what();
  }
  // Levels of the other architecture, or above this CPU's, are refused.
  for (Isa isa : {Isa::avx2, Isa::avx512, Isa::neon}) {
    if (isa != hardware_isa() && !(hardware_isa() == Isa::avx512 && isa == Isa::avx2)) {
      EXPECT_THROW(set_isa_limit(isa), Error) << isa_name(isa);
    }
  }
  set_isa_limit(active);
  EXPECT_EQ(active_isa(), active);
}

TEST(CpuKernels, ActivationsMatchRef) {
  struct Case {
    std::string op;
    int64_t opset;
    std::string attr;
    float value;
  };
  const std::vector<Case> cases = {
      {"Relu", 14, "", 0},      {"LeakyRelu", 16, "alpha", 0.07f}, {"Sigmoid", 13, "", 0},
      {"Tanh", 13, "", 0},      {"Erf", 13, "", 0},                {"Gelu", 20, "", 0},
      {"HardSwish", 14, "", 0}, {"HardSigmoid", 6, "alpha", 0.3f}, {"Exp", 13, "", 0},
      {"Neg", 13, "", 0},       {"Abs", 13, "", 0},                {"Sqrt", 13, "", 0},
      {"Log", 13, "", 0},
  };
  for_each_isa([&] {
    for (const auto& c : cases) {
      SCOPED_TRACE(c.op);
      // Wide range (exp saturation, erf tails) and a tail of 5 after the vectors.
      for (float range : {0.3f, 4.f, 30.f}) {
        ModelBuilder b(c.opset);
        b.input("x", DType::f32, spec({3, 71})).output("y");
        Node& n = b.node(c.op, {"x"}, {"y"}, "act");
        if (!c.attr.empty()) n.attrs[c.attr] = attr_float(c.value);
        Tensor x = random_f32({3, 71}, 5, -range, range);
        x.data<float>()[7] = 0.f;
        x.data<float>()[8] = -0.f;
        expect_matches_ref(b.build(), {{"x", x}}, "act", "cpu", 2e-6, 2e-5);
      }
    }
    ModelBuilder g(20);
    g.input("x", DType::f32, spec({1000})).output("y");
    g.node("Gelu", {"x"}, {"y"}, "act").attrs["approximate"] = attr_string("tanh");
    expect_matches_ref(g.build(), {{"x", random_f32({1000}, 9, -6, 6)}}, "act", "cpu", 2e-6, 2e-5);
  });
}

TEST(CpuKernels, ActivationsKeepNaNAndInfinities) {
  for_each_isa([&] {
    for (const char* op : {"Sigmoid", "Tanh", "Erf", "Exp", "Relu"}) {
      SCOPED_TRACE(op);
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({20})).output("y");
      b.node(op, {"x"}, {"y"}, "act");
      Tensor x = random_f32({20}, 3, -2, 2);
      x.data<float>()[1] = NAN;
      x.data<float>()[17] = INFINITY;
      x.data<float>()[18] = -INFINITY;
      expect_matches_ref(b.build(), {{"x", x}}, "act", "cpu", 2e-6, 2e-5);
    }
  });
}

TEST(CpuKernels, BinaryOpsBroadcastLikeNumpy) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{37}, {37}},          {{4, 37}, {37}},          {{4, 1, 5}, {3, 1}},       {{2, 3, 4, 5}, {3, 1, 1}},
      {{1}, {7, 9}},         {{7, 1}, {1, 9}},         {{2, 1, 3, 1}, {1, 4, 1, 5}}, {{}, {5, 3}},
      {{6, 100000}, {100000}}, {{3, 200000}, {3, 1}}, {{9, 0}, {0}},
  };
  for_each_isa([&] {
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        SCOPED_TRACE(std::string(op) + " case " + std::to_string(i));
        ModelBuilder b;
        b.input("a", DType::f32, spec(shapes[i].first)).input("b", DType::f32, spec(shapes[i].second)).output("y");
        b.node(op, {"a", "b"}, {"y"}, "bin");
        const TensorMap in{{"a", random_f32(shapes[i].first, 1 + i, 0.5f, 2.f)},
                           {"b", random_f32(shapes[i].second, 2 + i, 0.5f, 2.f)}};
        // The arithmetic is exact in float: cpu and ref agree bit for bit.
        expect_matches_ref(b.build(), in, "bin", "cpu", 0, 0);
      }
    }
  });
}

TEST(CpuKernels, MaxMinBroadcastAndLetNaNWin) {
  for_each_isa([&] {
    for (const char* op : {"Max", "Min"}) {
      for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{3, 37}, {3, 37}}, {{2, 3, 37}, {1}}, {{4, 1}, {1, 21}}}) {
        SCOPED_TRACE(std::string(op) + " " + shape_str(sa) + " " + shape_str(sb));
        ModelBuilder b(13);
        b.input("a", DType::f32, spec(sa)).input("b", DType::f32, spec(sb)).output("y");
        b.node(op, {"a", "b"}, {"y"}, "mm");
        Tensor x = random_f32(sa, 3, -2, 2), z = random_f32(sb, 4, -2, 2);
        x.data<float>()[1] = NAN;
        x.data<float>()[2] = -0.f;
        if (z.numel() > 3) z.data<float>()[3] = NAN;
        expect_matches_ref(b.build(), {{"a", x}, {"b", z}}, "mm", "cpu", 0, 0);
      }
    }
  });
  ModelBuilder three(13);  // variadic Max of three stays with ref
  three.input("a", DType::f32, spec({4})).output("y");
  three.node("Max", {"a", "a", "a"}, {"y"}, "mm");
  EXPECT_EQ(cpu_test::cpu_decline_reason(three.build(), "mm"), "expects two inputs");
}

// Small integers of any dtype, so that operands are often equal; floats get a NaN.
Tensor small_values(DType dt, const Shape& shape, uint64_t seed) {
  Tensor t(dt, shape);
  std::mt19937_64 rng(seed);
  visit_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int v = int(rng() % 5) - (std::is_signed_v<T> || !std::is_integral_v<T> ? 2 : 0);
      if constexpr (std::is_same_v<T, bool>) p[i] = v % 2 != 0;
      else p[i] = T(float(v) / (std::is_integral_v<T> ? 1.f : 2.f));
    }
    if constexpr (!std::is_integral_v<T>)
      if (t.numel() > 3) p[3] = T(NAN);
  });
  return t;
}

TEST(CpuKernels, ComparisonsAndLogicalOpsMatchRef) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{37}, {37}}, {{4, 37}, {37}}, {{4, 1, 5}, {3, 1}}, {{}, {5, 70}}, {{2, 1, 3, 1}, {1, 4, 1, 5}}, {{3, 67}, {}},
      {{9, 0}, {0}},
  };
  const std::vector<DType> numeric = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i8,  DType::u8,
                                      DType::i16, DType::u16, DType::i32, DType::u32, DType::i64, DType::u64};
  std::vector<std::pair<const char*, std::vector<DType>>> ops = {
      {"Equal", numeric}, {"Less", numeric}, {"Greater", numeric}, {"LessOrEqual", numeric},
      {"GreaterOrEqual", numeric}, {"And", {DType::boolean}}, {"Or", {DType::boolean}}, {"Xor", {DType::boolean}}};
  ops[0].second.push_back(DType::boolean);
  for_each_isa([&] {
    for (const auto& [op, dtypes] : ops)
      for (DType dt : dtypes)
        for (size_t i = 0; i < shapes.size(); ++i) {
          SCOPED_TRACE(std::string(op) + " " + std::string(dtype_name(dt)) + " case " + std::to_string(i));
          ModelBuilder b(16);
          b.input("a", dt, spec(shapes[i].first)).input("b", dt, spec(shapes[i].second)).output("y");
          b.node(op, {"a", "b"}, {"y"}, "cmp");
          expect_matches_ref(b.build(), {{"a", small_values(dt, shapes[i].first, 1 + i)}, {"b", small_values(dt, shapes[i].second, 7 + i)}},
                             "cmp");
        }
    for (const Shape& s : {Shape{}, Shape{3, 67}}) {
      ModelBuilder b(16);
      b.input("a", DType::boolean, spec(s)).output("y");
      b.node("Not", {"a"}, {"y"}, "not");
      expect_matches_ref(b.build(), {{"a", small_values(DType::boolean, s, 3)}}, "not");
    }
  });
  ModelBuilder mixed(16);  // the type constraint ties the inputs; ref names the problem
  mixed.input("a", DType::f32, spec({4})).input("b", DType::i64, spec({4})).output("y");
  mixed.node("Equal", {"a", "b"}, {"y"}, "cmp");
  EXPECT_EQ(cpu_test::cpu_decline_reason(mixed.build(), "cmp"), "inputs have different dtypes");
  ModelBuilder booleans(16);
  booleans.input("a", DType::boolean, spec({4})).input("b", DType::boolean, spec({4})).output("y");
  booleans.node("Less", {"a", "b"}, {"y"}, "cmp");
  EXPECT_EQ(cpu_test::cpu_decline_reason(booleans.build(), "cmp"), "input 0 is bool");
}

TEST(CpuKernels, SoftmaxLogSoftmaxLayerNorm) {
  for_each_isa([&] {
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      SCOPED_TRACE(op);
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({5, 3, 37})).output("y");
      b.node(op, {"x"}, {"y"}, "sm");
      Tensor x = random_f32({5, 3, 37}, 4, -20, 20);
      x.data<float>()[3] = -INFINITY;  // a masked position
      expect_matches_ref(b.build(), {{"x", x}}, "sm", "cpu", 1e-6, 1e-5);

      ModelBuilder old(11);  // opset < 13: rows are the 2-D coercion at axis 1
      old.input("x", DType::f32, spec({5, 3, 37})).output("y");
      old.node(op, {"x"}, {"y"}, "sm");
      expect_matches_ref(old.build(), {{"x", random_f32({5, 3, 37}, 5, -3, 3)}}, "sm", "cpu", 1e-6, 1e-5);
    }
    ModelBuilder nl(13);  // axis 1 of 3 at opset 13: not rows, ref runs it
    nl.input("x", DType::f32, spec({2, 3, 4})).output("y");
    nl.node("Softmax", {"x"}, {"y"}, "sm").attrs["axis"] = attr_int(1);
    EXPECT_EQ(cpu_test::cpu_decline_reason(nl.build(), "sm"), "softmax over an axis other than the last");

    for (bool bias : {true, false}) {
      ModelBuilder b(17);
      b.input("x", DType::f32, spec({4, 6, 45})).output("y");
      b.initializer("s", random_f32({6, 45}, 6)).initializer("b", random_f32({6, 45}, 7));
      std::vector<std::string> ins = {"x", "s"};
      if (bias) ins.push_back("b");
      Node& n = b.node("LayerNormalization", ins, {"y"}, "ln");
      n.attrs["axis"] = attr_int(-2);
      n.attrs["epsilon"] = attr_float(1e-3f);
      expect_matches_ref(b.build(), {{"x", random_f32({4, 6, 45}, 8, -3, 5)}}, "ln", "cpu", 1e-5, 1e-4);
    }
  });
}

TEST(CpuKernels, ReduceSumAndMean) {
  struct Case {
    std::string op;
    int64_t opset;
    Shape x, axes;
    int64_t keepdims;
    std::string want;  // provider
  };
  const std::vector<Case> cases = {
      {"ReduceMean", 13, {4, 5, 33}, {-1}, 1, "cpu"},    {"ReduceMean", 13, {4, 5, 33}, {1, 2}, 0, "cpu"},
      {"ReduceMean", 13, {4, 5, 33}, {0}, 1, "cpu"},     {"ReduceSum", 13, {4, 1, 5, 33}, {0, 1}, 0, "cpu"},
      {"ReduceSum", 13, {2, 7, 300}, {}, 1, "cpu"},      {"ReduceMean", 18, {6, 260}, {1}, 1, "cpu"},
      {"ReduceSum", 11, {6, 7, 8}, {1}, 1, "ref"},       {"ReduceMean", 13, {2, 3, 4}, {0, 2}, 1, "ref"},
      {"ReduceSum", 13, {300, 3}, {0}, 0, "cpu"},
      {"ReduceMax", 13, {4, 5, 33}, {2}, 1, "cpu"},      {"ReduceMin", 18, {4, 5, 33}, {1, 2}, 0, "cpu"},
      {"ReduceMax", 13, {300, 3}, {0}, 0, "cpu"},        {"ReduceMin", 13, {7, 20}, {}, 0, "cpu"},
  };
  for_each_isa([&] {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      SCOPED_TRACE(c.op + " case " + std::to_string(i));
      ModelBuilder b(c.opset);
      b.input("x", DType::f32, spec(c.x)).output("y");
      const bool axes_input = c.op == "ReduceSum" ? c.opset >= 13 : c.opset >= 18;
      Tensor x = random_f32(c.x, 20 + i);
      if (c.op == "ReduceMax" || c.op == "ReduceMin") x.data<float>()[5] = NAN;  // NaN wins its group
      std::vector<std::string> ins = {"x"};
      if (axes_input && !c.axes.empty()) {
        b.initializer("axes", Tensor::from_vector<int64_t>({int64_t(c.axes.size())}, c.axes));
        ins.push_back("axes");
      }
      Node& n = b.node(c.op, ins, {"y"}, "red");
      if (!axes_input && !c.axes.empty()) n.attrs["axes"] = attr_ints(c.axes);
      n.attrs["keepdims"] = attr_int(c.keepdims);
      expect_matches_ref(b.build(), {{"x", x}}, "red", c.want, 1e-5, 1e-4);
    }
  });
}

TEST(CpuKernels, TransposeConcatSliceGather) {
  {
    ModelBuilder b;
    b.input("x", DType::f32, spec({2, 3, 5, 7})).output("y");
    b.node("Transpose", {"x"}, {"y"}, "t").attrs["perm"] = attr_ints({0, 2, 3, 1});
    expect_matches_ref(b.build(), {{"x", random_f32({2, 3, 5, 7}, 1)}}, "t", "cpu", 0, 0);
    ModelBuilder r;  // default perm reverses; int64 data moves as bytes
    r.input("x", DType::i64, spec({3, 4, 2})).output("y");
    r.node("Transpose", {"x"}, {"y"}, "t");
    std::vector<int64_t> v(24);
    for (int i = 0; i < 24; ++i) v[size_t(i)] = i * 7 - 30;
    expect_matches_ref(r.build(), {{"x", Tensor::from_vector<int64_t>({3, 4, 2}, v)}}, "t", "cpu", 0, 0);
  }
  {
    ModelBuilder b;
    b.input("a", DType::f32, spec({2, 3, 4})).input("b", DType::f32, spec({2, 5, 4})).output("y");
    b.initializer("c", random_f32({2, 1, 4}, 3));
    b.node("Concat", {"a", "c", "b"}, {"y"}, "cat").attrs["axis"] = attr_int(-2);
    expect_matches_ref(b.build(), {{"a", random_f32({2, 3, 4}, 1)}, {"b", random_f32({2, 5, 4}, 2)}}, "cat", "cpu", 0, 0);
  }
  for (const int64_t n : {1, 3}) {
    // One outer row: the Relus write into their parts of the Concat's output (the second
    // part starts 16 x 4 floats in, an aligned offset), which then copies nothing; the
    // third input is a graph input and is copied. Three rows: every input is copied.
    SCOPED_TRACE("outer rows " + std::to_string(n));
    ModelBuilder b;
    b.input("a", DType::f32, spec({n, 16, 4})).input("b", DType::f32, spec({n, 8, 4})).output("y");
    b.node("Relu", {"a"}, {"ra"}, "relu_a");
    b.node("Neg", {"b"}, {"nb"}, "neg_b");
    b.node("Concat", {"ra", "nb", "a"}, {"cat"}, "cat").attrs["axis"] = attr_int(1);
    b.node("Sigmoid", {"cat"}, {"y"}, "sig");
    const Model m = b.build();
    const TensorMap in = {{"a", random_f32({n, 16, 4}, 1)}, {"b", random_f32({n, 8, 4}, 2)}};
    expect_matches_ref(m, in, "cat", "cpu", 1e-6, 1e-6);
    EXPECT_EQ(Session::compile(m)->stats().memory.in_place_values, n == 1 ? 2 : 0);
  }
  {
    struct Case {
      std::vector<int64_t> starts, ends, axes, steps;
    };
    const std::vector<Case> cases = {
        {{1, 0}, {3, 100}, {0, 2}, {}},          {{-1}, {-1000}, {1}, {-2}},
        {{0, 2, 1}, {5, 7, 9}, {0, 1, 2}, {2, 3, 1}}, {{4}, {2}, {0}, {1}},
        {{-3, 8}, {100, 0}, {-1, 1}, {1, -3}},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("slice case " + std::to_string(i));
      const Case& c = cases[i];
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({5, 7, 9})).output("y");
      auto vec = [](const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>({int64_t(v.size())}, v); };
      b.initializer("s", vec(c.starts)).initializer("e", vec(c.ends)).initializer("a", vec(c.axes));
      std::vector<std::string> ins = {"x", "s", "e", "a"};
      if (!c.steps.empty()) {
        b.initializer("p", vec(c.steps));
        ins.push_back("p");
      }
      b.node("Slice", ins, {"y"}, "sl");
      expect_matches_ref(b.build(), {{"x", random_f32({5, 7, 9}, 30 + i)}}, "sl", "cpu", 0, 0);
      if (!c.steps.empty()) continue;
      ModelBuilder old(9);  // before opset 10: attributes, no steps
      old.input("x", DType::f32, spec({5, 7, 9})).output("y");
      Node& n = old.node("Slice", {"x"}, {"y"}, "sl");
      n.attrs["starts"] = attr_ints(c.starts);
      n.attrs["ends"] = attr_ints(c.ends);
      n.attrs["axes"] = attr_ints(c.axes);
      expect_matches_ref(old.build(), {{"x", random_f32({5, 7, 9}, 40 + i)}}, "sl", "cpu", 0, 0);
    }
  }
  {
    ModelBuilder b;
    b.input("x", DType::f32, spec({4, 6, 3})).input("i", DType::i64, spec({2, 3})).output("y");
    b.node("Gather", {"x", "i"}, {"y"}, "g").attrs["axis"] = attr_int(1);
    const Tensor idx = Tensor::from_vector<int64_t>({2, 3}, {0, 5, -1, 2, -6, 3});
    expect_matches_ref(b.build(), {{"x", random_f32({4, 6, 3}, 40)}, {"i", idx}}, "g", "cpu", 0, 0);

    SessionOptions o;
    o.providers = {"cpu"};
    auto s = Session::compile(b.build(), o);
    ErrorCode code{};
    const std::string msg = testing::error_of(
        [&] { s->run({{"x", random_f32({4, 6, 3}, 41)}, {"i", Tensor::from_vector<int64_t>({2, 3}, {0, 1, 2, 6, 0, 0})}}); },
        &code);
    EXPECT_EQ(code, ErrorCode::invalid_argument);
    EXPECT_NE(msg.find("Gather node 'g': index 6 is out of range for an axis of size 6"), std::string::npos) << msg;
  }
}

TEST(CpuKernels, ClipMatchesRef) {
  for_each_isa([&] {
    Tensor x = random_f32({3, 45}, 11, -5, 5);
    x.data<float>()[2] = NAN;
    x.data<float>()[9] = INFINITY;
    x.data<float>()[10] = -INFINITY;
    // Opset 11+: optional bound inputs, constant or given at run time; a missing one does not clip.
    for (int bounds = 0; bounds < 4; ++bounds) {
      SCOPED_TRACE("bounds " + std::to_string(bounds));
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({3, 45})).input("hi", DType::f32, spec({})).output("y");
      b.initializer("lo", Tensor::from_vector<float>({}, {-1.5f}));
      std::vector<std::string> ins = {"x", bounds & 1 ? "lo" : "", bounds & 2 ? "hi" : ""};
      while (!ins.empty() && ins.back().empty()) ins.pop_back();
      b.node("Clip", ins, {"y"}, "clip");
      expect_matches_ref(b.build(), {{"x", x}, {"hi", Tensor::from_vector<float>({}, {2.25f})}}, "clip", "cpu", 0, 0);
    }
    ModelBuilder crossed(13);  // min > max: every element becomes max
    crossed.input("x", DType::f32, spec({3, 45})).output("y");
    crossed.initializer("lo", Tensor::from_vector<float>({}, {1.f})).initializer("hi", Tensor::from_vector<float>({}, {-1.f}));
    crossed.node("Clip", {"x", "lo", "hi"}, {"y"}, "clip");
    expect_matches_ref(crossed.build(), {{"x", x}}, "clip", "cpu", 0, 0);
    ModelBuilder old(6);  // attributes; the default bounds are the float range
    old.input("x", DType::f32, spec({3, 45})).output("y");
    old.node("Clip", {"x"}, {"y"}, "clip").attrs["max"] = attr_float(0.5f);
    expect_matches_ref(old.build(), {{"x", x}}, "clip", "cpu", 0, 0);
  });
  ModelBuilder b(13);  // a bound of more than one element fails at run time, naming the node
  b.input("x", DType::f32, spec({4})).input("lo", DType::f32, spec({2})).output("y");
  b.node("Clip", {"x", "lo"}, {"y"}, "clip");
  SessionOptions o;
  o.providers = {"cpu"};
  auto s = Session::compile(b.build(), o);
  const std::string msg = testing::error_of([&] { s->run({{"x", random_f32({4}, 1)}, {"lo", random_f32({2}, 2)}}); });
  EXPECT_NE(msg.find("Clip node 'clip': min must be a one-element f32 tensor, got f32[2]"), std::string::npos) << msg;
}

TEST(CpuKernels, PowBySquareAndSquareRootMatchesRef) {
  for_each_isa([&] {
    for (float e : {2.f, 0.5f}) {
      SCOPED_TRACE(e);
      ModelBuilder b(13);
      b.input("x", DType::f32, spec({3, 37})).output("y");
      b.initializer("e", Tensor::from_vector<float>({1}, {e}));
      b.node("Pow", {"x", "e"}, {"y"}, "pow");
      Tensor x = random_f32({3, 37}, 13, -4, 9);
      x.data<float>()[1] = -0.f;
      x.data<float>()[2] = -INFINITY;
      x.data<float>()[3] = INFINITY;
      x.data<float>()[4] = NAN;
      expect_matches_ref(b.build(), {{"x", x}}, "pow", "cpu", 0, 2e-7);
    }
  });
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({4})).output("y");
  b.initializer("e", Tensor::scalar<float>(3.f));
  b.node("Pow", {"x", "e"}, {"y"}, "pow");
  EXPECT_EQ(cpu_test::cpu_decline_reason(b.build(), "pow"), "exponent 3.000000");
}

TEST(CpuKernels, BatchNormalizationMatchesRef) {
  for_each_isa([&] {
    for (const Shape& shape : std::vector<Shape>{{2, 5, 7, 9}, {3, 4}, {1, 6, 33}, {2, 3, 2, 3, 5}}) {
      SCOPED_TRACE(shape_str(shape));
      const int64_t c = shape[1];
      ModelBuilder b(15);
      b.input("x", DType::f32, spec(shape)).input("mean", DType::f32, spec({c})).output("y");
      b.initializer("scale", random_f32({c}, 1)).initializer("bias", random_f32({c}, 2));
      b.initializer("var", random_f32({c}, 3, 0.1f, 2.f));
      b.node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn").attrs["epsilon"] =
          attr_float(1e-3f);
      expect_matches_ref(b.build(), {{"x", random_f32(shape, 4, -3, 3)}, {"mean", random_f32({c}, 5)}}, "bn", "cpu",
                         1e-6, 1e-5);
    }
  });
  ModelBuilder t(15);  // training mode stays with ref
  t.input("x", DType::f32, spec({2, 3, 4})).output("y");
  for (const char* n : {"s", "b", "m", "v"}) t.initializer(n, random_f32({3}, 1, 0.5f, 1.f));
  t.node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"}, "bn").attrs["training_mode"] = attr_int(1);
  EXPECT_EQ(cpu_test::cpu_decline_reason(t.build(), "bn"), "training_mode");
}

TEST(CpuKernels, PadEveryModeMatchesRef) {
  struct Case {
    std::string mode;
    std::vector<int64_t> pads, axes;
    int64_t opset = 19;
  };
  const std::vector<Case> cases = {
      {"constant", {0, 1, 2, 1, 0, 3}},  {"edge", {1, 0, 5, 0, 2, 1}},     {"reflect", {0, 2, 3, 0, 1, 3}},
      {"wrap", {1, 1, 4, 0, 2, 5}},      {"constant", {0, -1, 2, 0, 1, -3}},  // negative pads crop
      {"reflect", {2, 3}, {-1}, 18},      {"constant", {1, 0, 0, 2}, {0, 2}, 18},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i) + " " + c.mode);
    ModelBuilder b(c.opset);
    b.input("x", DType::f32, spec({2, 3, 7})).output("y");
    b.initializer("pads", Tensor::from_vector<int64_t>({int64_t(c.pads.size())}, c.pads));
    b.initializer("value", Tensor::scalar<float>(-2.5f));
    std::vector<std::string> ins = {"x", "pads", "value"};
    if (!c.axes.empty()) {
      b.initializer("axes", Tensor::from_vector<int64_t>({int64_t(c.axes.size())}, c.axes));
      ins.push_back("axes");
    }
    b.node("Pad", ins, {"y"}, "pad").attrs["mode"] = attr_string(c.mode);
    expect_matches_ref(b.build(), {{"x", random_f32({2, 3, 7}, 50 + i)}}, "pad", "cpu", 0, 0);
  }
  ModelBuilder old(2);  // attributes; an int64 input copies as bytes
  old.input("x", DType::i64, spec({3, 4})).output("y");
  old.node("Pad", {"x"}, {"y"}, "pad").attrs["pads"] = attr_ints({1, 2, 0, 1});
  std::vector<int64_t> v(12);
  for (int k = 0; k < 12; ++k) v[size_t(k)] = k * 3 - 7;
  expect_matches_ref(old.build(), {{"x", Tensor::from_vector<int64_t>({3, 4}, v)}}, "pad", "cpu", 0, 0);
}

TEST(CpuKernels, LargeTensorsSplitOverThreadsGiveTheSameResult) {
  ModelBuilder b(13);
  b.input("x", DType::f32, spec({600, 1031})).input("z", DType::f32, spec({1031})).output("y").output("s");
  b.node("Add", {"x", "z"}, {"a"}, "add");
  b.node("Sigmoid", {"a"}, {"y"}, "sig");
  b.node("Softmax", {"a"}, {"s"}, "sm");
  expect_matches_ref(b.build(), {{"x", random_f32({600, 1031}, 1)}, {"z", random_f32({1031}, 2)}}, "sig", "cpu", 2e-6,
                     2e-5);
}

}  // namespace
}  // namespace slim
