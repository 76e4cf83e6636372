// The recurrent layers. Ref: values worked out by hand, the relations that tie the
// variants together (reverse = forward on reversed time, bidirectional = both stacked,
// batch-first = transposed, sequence_lens = a shorter run padded with zeros), the
// activations with their alpha/beta, and the errors. Cpu: the oneDNN kernels against ref
// on random weights for every direction, layout and set of outputs they claim, and the
// nodes they leave to ref with the reason. (tests/runtime/rnn_vs_ort.py compares both
// with ONNX Runtime.)
#include <gtest/gtest.h>

#include "runtime/cpu_test_util.h"
#include "runtime/ref_kernel_test_util.h"
#include "slim/runtime/model_summary.h"

namespace slim {
namespace {

using cpu_test::for_each_isa;
using cpu_test::random_f32;
using cpu_test::spec;
using ref_test::attr_f;
using ref_test::attr_floats;
using ref_test::attr_i;
using ref_test::attr_s;
using ref_test::Attrs;
using ref_test::run_op;
using ref_test::values;
using testing::error_of;
using testing::ModelBuilder;

int gates_of(const std::string& op) { return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1; }

Attribute strings(std::vector<std::string> v) {
  Attribute a;
  a.kind = Attribute::Kind::strings;
  a.strings = std::move(v);
  return a;
}

// Random inputs of one layer: X [T, N, I] (or [N, T, I]), W, R, B and, where asked,
// initial states and peepholes; an undefined tensor for each input left out.
struct Layer {
  std::string op;
  int64_t T = 4, N = 3, I = 5, H = 6, D = 1;
  bool batch_first = false;
  std::vector<Tensor> inputs;
  Layer(std::string op_, int64_t directions, bool batch_first_, uint64_t seed, bool states = true,
        bool peepholes = false, int64_t batch = 3)
      : op(std::move(op_)), N(batch), D(directions), batch_first(batch_first_) {
    const int64_t G = gates_of(op);
    const Shape state = batch_first ? Shape{N, D, H} : Shape{D, N, H};
    inputs = {random_f32(batch_first ? Shape{N, T, I} : Shape{T, N, I}, seed, -2, 2),
              random_f32({D, G * H, I}, seed + 1, -0.6f, 0.6f), random_f32({D, G * H, H}, seed + 2, -0.6f, 0.6f),
              random_f32({D, 2 * G * H}, seed + 3, -0.5f, 0.5f), Tensor(),
              states ? random_f32(state, seed + 4) : Tensor()};
    if (op == "LSTM") {
      inputs.push_back(states ? random_f32(state, seed + 5) : Tensor());
      inputs.push_back(peepholes ? random_f32({D, 3 * H}, seed + 6) : Tensor());
    }
  }
  int outputs() const { return op == "LSTM" ? 3 : 2; }
};

std::vector<Tensor> run_layer(const Layer& l, Attrs attrs) {
  attrs["hidden_size"] = attr_i(l.H);
  if (l.batch_first) attrs["layout"] = attr_i(1);
  return run_op(l.op, 14, l.inputs, attrs, l.outputs());
}

void expect_near(const Tensor& got, const std::vector<float>& want, double tol = 1e-6) {
  const std::vector<float> v = values<float>(got);
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], want[i], tol) << "at " << i;
}

TEST(RefRnn, ValuesByHand) {
  // One unit, one input: H_t = tanh(0.5 x_t + 0.25 H_{t-1} + 0.1 + 0.2).
  const Tensor x = ref_test::tensor<float>({3, 1, 1}, {1, -1, 2});
  const Tensor w = ref_test::tensor<float>({1, 1, 1}, {0.5f}), r = ref_test::tensor<float>({1, 1, 1}, {0.25f});
  const Tensor b = ref_test::tensor<float>({1, 2}, {0.1f, 0.2f});
  double h = 0;
  std::vector<float> ys;
  for (double xt : {1.0, -1.0, 2.0}) ys.push_back(float(h = std::tanh(0.5 * xt + 0.25 * h + 0.3)));
  auto out = run_op("RNN", 14, {x, w, r, b}, {{"hidden_size", attr_i(1)}}, 2);
  expect_near(out[0], ys);
  expect_near(out[1], {ys.back()});

  // An LSTM unit with peepholes, every gate weight 1 and gate biases i .1, o .2, f .3, c .4.
  const Tensor lw = ref_test::tensor<float>({1, 4, 1}, {1, 1, 1, 1}), lr = ref_test::tensor<float>({1, 4, 1}, {1, 1, 1, 1});
  const Tensor lb = ref_test::tensor<float>({1, 8}, {0.1f, 0.2f, 0.3f, 0.4f, 0, 0, 0, 0});
  const Tensor p = ref_test::tensor<float>({1, 3}, {0.5f, -0.5f, 0.25f});  // Pi, Po, Pf
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  double hh = 0, c = 0;
  for (double xt : {1.0, -1.0, 2.0}) {
    const double a = xt + hh;
    const double i = sig(a + 0.1 + 0.5 * c), f = sig(a + 0.3 + 0.25 * c);
    c = f * c + i * std::tanh(a + 0.4);
    hh = sig(a + 0.2 - 0.5 * c) * std::tanh(c);
  }
  auto lo = run_op("LSTM", 14, {x, lw, lr, lb, Tensor(), Tensor(), Tensor(), p}, {{"hidden_size", attr_i(1)}}, 3);
  expect_near(lo[1], {float(hh)});
  expect_near(lo[2], {float(c)});

  // GRU, linear_before_reset 0 and 1: weights 1, Wb z .1 r .2 h .3, Rb z 0 r 0 h .4.
  const Tensor gw = ref_test::tensor<float>({1, 3, 1}, {1, 1, 1}), gr = ref_test::tensor<float>({1, 3, 1}, {1, 1, 1});
  const Tensor gb = ref_test::tensor<float>({1, 6}, {0.1f, 0.2f, 0.3f, 0, 0, 0.4f});
  for (int lbr : {0, 1}) {
    double g = 0;
    for (double xt : {1.0, -1.0, 2.0}) {
      const double z = sig(xt + g + 0.1), rr = sig(xt + g + 0.2);
      const double cand = lbr ? std::tanh(xt + 0.3 + rr * (g + 0.4)) : std::tanh(xt + 0.3 + rr * g + 0.4);
      g = (1 - z) * cand + z * g;
    }
    auto go = run_op("GRU", 14, {x, gw, gr, gb}, {{"hidden_size", attr_i(1)}, {"linear_before_reset", attr_i(lbr)}}, 2);
    expect_near(go[1], {float(g)});
  }
}

// Output y of direction d ([T, D, N, H]) at time t and batch n.
std::vector<float> y_at(const Tensor& y, int64_t t, int64_t d, int64_t n) {
  const std::vector<float> v = values<float>(y);
  const int64_t D = y.dim(1), N = y.dim(2), H = y.dim(3);
  const auto at = v.begin() + ((t * D + d) * N + n) * H;
  return std::vector<float>(at, at + H);
}

TEST(RefRnn, ReverseBidirectionalAndBatchFirstAgree) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    SCOPED_TRACE(op);
    const Layer bi(op, 2, false, 11);
    const auto both = run_layer(bi, {{"direction", attr_s("bidirectional")}});
    // Each direction alone, from the bidirectional layer's weights and states.
    for (int64_t d = 0; d < 2; ++d) {
      Layer one(op, 1, false, 11);
      for (size_t i = 1; i < bi.inputs.size(); ++i) {
        if (!bi.inputs[i].defined() || i == 4) continue;
        const Tensor& full = bi.inputs[i];
        Shape s = full.shape();
        s[0] = 1;
        const int64_t n = full.numel() / 2;
        const std::vector<float> v = values<float>(full);
        one.inputs[i] = ref_test::tensor<float>(s, std::vector<float>(v.begin() + d * n, v.begin() + (d + 1) * n));
      }
      const auto single = run_layer(one, {{"direction", attr_s(d == 0 ? "forward" : "reverse")}});
      for (int64_t t = 0; t < bi.T; ++t)
        for (int64_t n = 0; n < bi.N; ++n) EXPECT_EQ(y_at(single[0], t, 0, n), y_at(both[0], t, d, n));
      // reverse on X equals forward on X reversed in time.
      if (d == 1) {
        Layer flipped = one;
        const std::vector<float> xv = values<float>(one.inputs[0]);
        std::vector<float> rv;
        for (int64_t t = one.T - 1; t >= 0; --t)
          rv.insert(rv.end(), xv.begin() + t * one.N * one.I, xv.begin() + (t + 1) * one.N * one.I);
        flipped.inputs[0] = ref_test::tensor<float>(one.inputs[0].shape(), rv);
        const auto fwd = run_layer(flipped, {});
        for (int64_t t = 0; t < bi.T; ++t)
          for (int64_t n = 0; n < bi.N; ++n) EXPECT_EQ(y_at(fwd[0], one.T - 1 - t, 0, n), y_at(single[0], t, 0, n));
        EXPECT_EQ(values<float>(fwd[1]), values<float>(single[1]));
      }
    }
    // Batch-first: the same numbers transposed.
    Layer bf = bi;
    bf.batch_first = true;
    const int64_t T = bi.T, N = bi.N, I = bi.I, H = bi.H;
    auto transpose01 = [](const Tensor& t) {  // [A, B, rest...] -> [B, A, rest...]
      const std::vector<float> v = values<float>(t);
      const int64_t a = t.dim(0), b = t.dim(1), rest = t.numel() / (a * b);
      std::vector<float> out(v.size());
      for (int64_t i = 0; i < a; ++i)
        for (int64_t j = 0; j < b; ++j) std::copy_n(v.begin() + (i * b + j) * rest, rest, out.begin() + (j * a + i) * rest);
      Shape s = t.shape();
      std::swap(s[0], s[1]);
      return ref_test::tensor<float>(s, out);
    };
    bf.inputs[0] = transpose01(bi.inputs[0]);
    for (size_t i : {5u, 6u})
      if (i < bf.inputs.size() && bf.inputs[i].defined()) bf.inputs[i] = transpose01(bi.inputs[i]);
    const auto bfo = run_layer(bf, {{"direction", attr_s("bidirectional")}});
    ASSERT_EQ(bfo[0].shape(), (Shape{N, T, 2, H}));
    (void)I;
    const std::vector<float> yb = values<float>(bfo[0]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < 2; ++d)
        for (int64_t n = 0; n < N; ++n) {
          const auto at = yb.begin() + ((n * T + t) * 2 + d) * H;
          EXPECT_EQ(std::vector<float>(at, at + H), y_at(both[0], t, d, n));
        }
    for (int k = 1; k < bi.outputs(); ++k) EXPECT_EQ(values<float>(bfo[size_t(k)]), values<float>(transpose01(both[size_t(k)])));
  }
}

TEST(RefRnn, SequenceLensPadWithZerosAndKeepTheLastValidState) {
  for (const char* op : {"RNN", "GRU", "LSTM"})
    for (const char* dir : {"forward", "reverse"}) {
      SCOPED_TRACE(std::string(op) + " " + dir);
      Layer full(op, 1, false, 21);
      full.inputs[4] = ref_test::tensor<int32_t>({3}, {4, 2, 0});
      const auto out = run_layer(full, {{"direction", attr_s(dir)}});
      // Batch entry 1 (length 2) equals a 2-step run of its own.
      Layer shorter(op, 1, false, 21);
      shorter.N = 1;
      auto slice = [&](const Tensor& t, int64_t steps) {  // [T, N, K] -> [steps, 1, K] of entry 1
        const std::vector<float> v = values<float>(t);
        const int64_t n = t.dim(1), k = t.dim(2);
        std::vector<float> out_v;
        for (int64_t s = 0; s < steps; ++s) out_v.insert(out_v.end(), v.begin() + (s * n + 1) * k, v.begin() + (s * n + 2) * k);
        return ref_test::tensor<float>({steps, 1, k}, out_v);
      };
      shorter.inputs[0] = slice(full.inputs[0], 2);
      for (size_t i : {5u, 6u})
        if (i < full.inputs.size()) shorter.inputs[i] = slice(full.inputs[i], 1);
      const auto part = run_layer(shorter, {{"direction", attr_s(dir)}});
      for (int64_t t = 0; t < 2; ++t) EXPECT_EQ(y_at(out[0], t, 0, 1), y_at(part[0], t, 0, 0));
      for (int64_t t = 2; t < 4; ++t) EXPECT_EQ(y_at(out[0], t, 0, 1), std::vector<float>(6, 0.f));
      for (int k = 1; k < full.outputs(); ++k) {
        const std::vector<float> s = values<float>(out[size_t(k)]);
        EXPECT_EQ(std::vector<float>(s.begin() + 6, s.begin() + 12), values<float>(part[size_t(k)]));
        // Length 0: zeros, as ONNX Runtime gives.
        EXPECT_EQ(std::vector<float>(s.begin() + 12, s.end()), std::vector<float>(6, 0.f));
      }
    }
}

TEST(RefRnn, ActivationsTakeAlphaAndBetaInOrder) {
  // RNN with W = 1, R = 0: Y = f(x), so each activation shows its formula directly.
  const std::vector<float> xs = {-2.f, -0.5f, 0.f, 0.3f, 1.5f};
  const Tensor x = ref_test::tensor<float>({5, 1, 1}, xs);
  const Tensor w = ref_test::tensor<float>({1, 1, 1}, {1}), r = ref_test::tensor<float>({1, 1, 1}, {0});
  struct Case {
    const char* name;
    std::vector<float> alpha, beta;
    double (*f)(double);
  };
  const Case cases[] = {
      {"Relu", {}, {}, [](double v) { return std::max(v, 0.0); }},
      {"Sigmoid", {}, {}, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"Affine", {2.f}, {0.5f}, [](double v) { return 2 * v + 0.5; }},
      {"Affine", {}, {}, [](double v) { return v; }},  // defaults 1 and 0
      {"LeakyRelu", {}, {}, [](double v) { return v >= 0 ? v : 0.01 * v; }},
      {"LeakyRelu", {0.2f}, {}, [](double v) { return v >= 0 ? v : 0.2 * v; }},
      {"ThresholdedRelu", {}, {}, [](double v) { return v > 1 ? v : 0; }},
      {"ThresholdedRelu", {0.25f}, {}, [](double v) { return v > 0.25 ? v : 0; }},
      {"ScaledTanh", {1.5f}, {0.5f}, [](double v) { return 1.5 * std::tanh(0.5 * v); }},
      {"HardSigmoid", {}, {}, [](double v) { return std::clamp(0.2 * v + 0.5, 0.0, 1.0); }},
      {"HardSigmoid", {0.5f}, {0.25f}, [](double v) { return std::clamp(0.5 * v + 0.25, 0.0, 1.0); }},
      {"Elu", {}, {}, [](double v) { return v >= 0 ? v : std::exp(v) - 1; }},
      {"Elu", {0.5f}, {}, [](double v) { return v >= 0 ? v : 0.5 * (std::exp(v) - 1); }},
      {"Softsign", {}, {}, [](double v) { return v / (1 + std::fabs(v)); }},
      {"Softplus", {}, {}, [](double v) { return std::log1p(std::exp(v)); }},
      {"tanh", {}, {}, [](double v) { return std::tanh(v); }},  // names compare case-insensitively
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " alpha " + std::to_string(c.alpha.size()));
    Attrs attrs{{"hidden_size", attr_i(1)}, {"activations", strings({c.name})}};
    if (!c.alpha.empty()) attrs["activation_alpha"] = attr_floats(c.alpha);
    if (!c.beta.empty()) attrs["activation_beta"] = attr_floats(c.beta);
    auto out = run_op("RNN", 14, {x, w, r}, attrs, 1);
    std::vector<float> want;
    for (float v : xs) want.push_back(float(c.f(v)));
    expect_near(out[0], want);
  }
  // The lists are consumed by the functions that take a value, in order: in a
  // bidirectional RNN [LeakyRelu, HardSigmoid], alpha = [a1, a2] and beta = [b2].
  const Tensor w2 = ref_test::tensor<float>({2, 1, 1}, {1, 1}), r2 = ref_test::tensor<float>({2, 1, 1}, {0, 0});
  auto out = run_op("RNN", 14, {x, w2, r2},
                    {{"hidden_size", attr_i(1)}, {"direction", attr_s("bidirectional")},
                     {"activations", strings({"LeakyRelu", "HardSigmoid"})},
                     {"activation_alpha", attr_floats({0.3f, 0.4f})}, {"activation_beta", attr_floats({0.1f})}},
                    1);
  for (int64_t t = 0; t < 5; ++t) {
    const double v = xs[size_t(t)];
    EXPECT_NEAR(y_at(out[0], t, 0, 0)[0], v >= 0 ? v : 0.3 * v, 1e-6);
    EXPECT_NEAR(y_at(out[0], t, 1, 0)[0], std::clamp(0.4 * v + 0.1, 0.0, 1.0), 1e-6);
  }
}

TEST(RefRnn, ClipBoundsEveryGateInputAndInputForgetCouplesGates) {
  // RNN with W = 10: clip 0.5 bounds the pre-activation, so Y = tanh(clamp(10 x)).
  const Tensor x = ref_test::tensor<float>({3, 1, 1}, {-1.f, 0.01f, 2.f});
  const Tensor w = ref_test::tensor<float>({1, 1, 1}, {10}), r = ref_test::tensor<float>({1, 1, 1}, {0});
  auto out = run_op("RNN", 14, {x, w, r}, {{"hidden_size", attr_i(1)}, {"clip", attr_f(0.5f)}}, 1);
  expect_near(out[0], {float(std::tanh(-0.5)), float(std::tanh(0.1)), float(std::tanh(0.5))});
  // input_forget: the forget gate is 1 - i whatever its own weights say.
  Layer l("LSTM", 1, false, 31);
  const auto coupled = run_layer(l, {{"input_forget", attr_i(1)}});
  std::vector<float> wv = values<float>(l.inputs[1]), rv = values<float>(l.inputs[2]);
  for (int64_t k = 2 * l.H * l.I; k < 3 * l.H * l.I; ++k) wv[size_t(k)] = 100.f;  // f block of W
  for (int64_t k = 2 * l.H * l.H; k < 3 * l.H * l.H; ++k) rv[size_t(k)] = -7.f;
  l.inputs[1] = ref_test::tensor<float>(l.inputs[1].shape(), wv);
  l.inputs[2] = ref_test::tensor<float>(l.inputs[2].shape(), rv);
  const auto changed = run_layer(l, {{"input_forget", attr_i(1)}});
  EXPECT_EQ(values<float>(coupled[0]), values<float>(changed[0]));
  EXPECT_NE(values<float>(run_layer(l, {})[0]), values<float>(changed[0]));
}

TEST(RefRnn, OpsetOneAndSevenReadTheirAttributes) {
  Layer l("GRU", 1, false, 41);
  // GRU-1 has no linear_before_reset (it is lbr 0); layout is opset 14's.
  const auto v14 = run_layer(l, {});
  const auto v1 = run_op("GRU", 1, l.inputs, {{"hidden_size", attr_i(l.H)}, {"output_sequence", attr_i(1)}}, 2);
  const auto v7 = run_op("GRU", 7, l.inputs, {{"hidden_size", attr_i(l.H)}}, 2);
  EXPECT_EQ(values<float>(v1[0]), values<float>(v14[0]));
  EXPECT_EQ(values<float>(v7[1]), values<float>(v14[1]));
  const auto lbr3 = run_op("GRU", 3, l.inputs, {{"hidden_size", attr_i(l.H)}, {"linear_before_reset", attr_i(1)}}, 2);
  EXPECT_EQ(values<float>(lbr3[1]), values<float>(run_layer(l, {{"linear_before_reset", attr_i(1)}})[1]));
}

TEST(RefRnn, ErrorsNameTheNodeAndTheProblem) {
  const Layer l("LSTM", 1, false, 51);
  auto err = [&](Attrs attrs, std::vector<Tensor> inputs = {}, ErrorCode* code = nullptr) {
    if (!attrs.count("hidden_size")) attrs["hidden_size"] = attr_i(l.H);
    return error_of([&] { run_op("LSTM", 14, inputs.empty() ? l.inputs : inputs, attrs, 3); }, code);
  };
  ErrorCode code{};
  EXPECT_EQ(err({{"direction", attr_s("sideways")}}, {}, &code),
            "LSTM node 'n0': attribute direction is 'sideways', expected forward, reverse or bidirectional");
  EXPECT_EQ(code, ErrorCode::invalid_model);
  EXPECT_EQ(err({{"layout", attr_i(2)}}), "LSTM node 'n0': attribute layout must be 0 or 1, got 2");
  EXPECT_EQ(err({{"hidden_size", attr_i(0)}}), "LSTM node 'n0': attribute hidden_size must be positive, got 0");
  EXPECT_EQ(err({{"clip", attr_f(-1)}}), "LSTM node 'n0': attribute clip must be positive, got -1.000000");
  EXPECT_EQ(err({{"activations", strings({"Sigmoid", "Tanh"})}}),
            "LSTM node 'n0': attribute activations has 2 entries, expected 3");
  EXPECT_NE(err({{"activations", strings({"Sigmoid", "Swish", "Tanh"})}}).find("activation 'Swish' in attribute activations is not one of"),
            std::string::npos);
  EXPECT_EQ(err({{"activations", strings({"ScaledTanh", "Tanh", "Tanh"})}}, {}, &code),
            "LSTM node 'n0': activation ScaledTanh needs its alpha and beta in attributes activation_alpha and "
            "activation_beta (it has no defaults)");
  EXPECT_EQ(code, ErrorCode::unsupported);
  EXPECT_EQ(err({{"hidden_size", attr_i(5)}}, {}, &code), "LSTM node 'n0': W must have shape [1,20,5], got f32[1,24,5]");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  std::vector<Tensor> in = l.inputs;
  in[4] = ref_test::tensor<int32_t>({3}, {1, 5, 2});
  EXPECT_EQ(err({}, in), "LSTM node 'n0': sequence_lens holds 5, outside [0, 4]");
  in[4] = ref_test::tensor<int32_t>({2}, {1, 1});
  EXPECT_EQ(err({}, in), "LSTM node 'n0': sequence_lens must have shape [3], got i32[2]");
  in = l.inputs;
  in[7] = random_f32({1, 4 * l.H}, 1);
  EXPECT_EQ(err({}, in), "LSTM node 'n0': P must have shape [1,18], got f32[1,24]");
  in = l.inputs;
  in[0] = random_f32({4, 3}, 1);
  EXPECT_EQ(err({}, in), "LSTM node 'n0': X must be 3-D, got f32[4,3]");
  EXPECT_EQ(error_of([&] { run_op("GRU", 14, {l.inputs[0], l.inputs[1], l.inputs[2]}, {}, 3); }),
            "GRU node 'n0': takes at most 6 inputs and 2 outputs");
}

TEST(RefRnn, FlopEstimateCountsBothProductsOfEveryStep) {
  // T 5, batch 3, input 4, hidden 6, 2 directions, 4 gates: 2 (4 + 6) per gate unit.
  Node n;
  n.op_type = "LSTM";
  n.inputs = {"X", "W", "R"};
  const std::map<std::string, Shape> shapes = {{"X", {5, 3, 4}}, {"W", {2, 24, 4}}, {"R", {2, 24, 6}}};
  const auto flops = estimate_node_flops(n, [&](const std::string& v) -> std::optional<Shape> { return shapes.at(v); });
  ASSERT_TRUE(flops.has_value());
  EXPECT_EQ(*flops, 2.0 * 5 * 3 * 2 * 24 * (4 + 6));
}

// --- cpu against ref ---

struct CpuCase {
  std::string op = "LSTM";
  std::string direction = "forward";
  bool batch_first = false, lbr = false, states = true, peepholes = false;
  int64_t N = 3;
  std::vector<bool> outputs = {true, true, true};
  std::vector<int32_t> lens;  // a constant sequence_lens
};

// One-node model of the layer with constant weights; X and the initial states are inputs.
Model cpu_case_model(const CpuCase& c, TensorMap* feeds, uint64_t seed, Layer* layer_out = nullptr) {
  Layer l(c.op, c.direction == "bidirectional" ? 2 : 1, c.batch_first, seed, c.states, c.peepholes, c.N);
  ModelBuilder b(14);
  static const char* const names[] = {"X", "W", "R", "B", "lens", "h0", "c0", "P"};
  std::vector<std::string> ins;
  if (!c.lens.empty()) l.inputs[4] = ref_test::tensor<int32_t>({c.N}, c.lens);
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    if (!l.inputs[i].defined()) {
      ins.push_back("");
      continue;
    }
    ins.push_back(names[i]);
    if (i == 0 || i == 5 || i == 6) {
      b.input(names[i], DType::f32, spec(l.inputs[i].shape()));
      (*feeds)[names[i]] = l.inputs[i];
    } else {
      b.initializer(names[i], l.inputs[i]);
    }
  }
  while (!ins.empty() && ins.back().empty()) ins.pop_back();
  std::vector<std::string> outs;
  static const char* const out_names[] = {"Y", "Y_h", "Y_c"};
  for (int k = 0; k < l.outputs(); ++k) {
    outs.push_back(c.outputs[size_t(k)] ? out_names[k] : "");
    if (c.outputs[size_t(k)]) b.output(out_names[k]);
  }
  while (!outs.empty() && outs.back().empty()) outs.pop_back();
  Node& n = b.node(c.op, ins, outs, "rnn");
  n.attrs["hidden_size"] = attr_i(l.H);
  n.attrs["direction"] = attr_s(c.direction);
  if (c.batch_first) n.attrs["layout"] = attr_i(1);
  if (c.lbr) n.attrs["linear_before_reset"] = attr_i(1);
  if (layer_out) *layer_out = l;
  return b.build();
}

TEST(CpuRnn, MatchesRefForEveryDirectionLayoutAndOutputSet) {
  struct Kind {
    const char* op;
    bool lbr;
  };
  const std::vector<std::vector<bool>> output_sets = {{true, true, true}, {true, false, false}, {false, true, false},
                                                      {false, false, true}, {false, true, true}};
  uint64_t seed = 1000;
  for (Kind k : {Kind{"LSTM", false}, Kind{"GRU", false}, Kind{"GRU", true}, Kind{"RNN", false}})
    for (const char* dir : {"forward", "reverse", "bidirectional"})
      for (bool bf : {false, true})
        for (int64_t n : {1, 3, 9})  // batches up to 8 run the own cells, larger ones oneDNN
          for (const auto& outs : output_sets) {
            CpuCase c;
            c.op = k.op;
            c.lbr = k.lbr;
            c.direction = dir;
            c.batch_first = bf;
            c.N = n;
            c.outputs = outs;
            c.states = seed % 2 == 0;
            c.peepholes = c.op == "LSTM" && seed % 3 == 0;
            if (c.op != "LSTM" && outs[2]) continue;
            if (c.op != "LSTM" && !outs[0] && !outs[1]) continue;
            SCOPED_TRACE(std::string(k.op) + (k.lbr ? " lbr " : " ") + dir + (bf ? " batch-first" : "") + " N=" +
                         std::to_string(n) + " outputs " + std::to_string(outs[0]) + std::to_string(outs[1]) +
                         std::to_string(outs[2]) + (c.states ? " states" : "") + (c.peepholes ? " peepholes" : ""));
            TensorMap feeds;
            const Model m = cpu_case_model(c, &feeds, ++seed);
            cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
          }
}

// The own cells on every instruction set (tests named CpuKernels also run on emulated
// CPUs): odd sizes padded to whole vectors, per-batch lengths, every kind and direction.
TEST(CpuKernels, RnnCellsMatchRefOnEveryIsa) {
  for_each_isa([] {
    uint64_t seed = 3000;
    for (const char* op : {"LSTM", "GRU", "GRU lbr", "RNN"})
      for (const char* dir : {"forward", "reverse", "bidirectional"})
        for (bool bf : {false, true}) {
          CpuCase c;
          c.op = std::string(op).substr(0, std::string(op).find(' '));
          c.lbr = std::string(op) == "GRU lbr";
          c.direction = dir;
          c.batch_first = bf;
          c.peepholes = c.op == "LSTM";
          // 20 rows of input projections go to oneDNN's matmul, 4 to the own tiles.
          c.N = seed % 2 ? 5 : 1;
          c.lens = c.N == 5 ? std::vector<int32_t>{4, 2, 0, 3, 4} : std::vector<int32_t>{3};
          SCOPED_TRACE(std::string(op) + " " + dir + (bf ? " batch-first" : ""));
          TensorMap feeds;
          const Model m = cpu_case_model(c, &feeds, ++seed);
          cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
        }
  });
}

TEST(CpuRnn, RunTimeInputsAndLengthsMatchRef) {
  // Weights fed as graph inputs go to oneDNN, packed at each run; sequence_lens fed at
  // run time runs on oneDNN where every length is full and on the node's ref kernel
  // otherwise.
  for (const char* op : {"LSTM", "GRU"}) {
    SCOPED_TRACE(op);
    Layer l(op, 2, false, 77, true, std::string(op) == "LSTM");
    ModelBuilder b(14);
    static const char* const names[] = {"X", "W", "R", "B", "lens", "h0", "c0", "P"};
    std::vector<std::string> ins;
    TensorMap feeds;
    for (size_t i = 0; i < l.inputs.size(); ++i) {
      ins.push_back(names[i]);
      const Tensor t = i == 4 ? ref_test::tensor<int32_t>({3}, {4, 4, 4}) : l.inputs[i];
      b.input(names[i], t.dtype(), spec(t.shape()));
      feeds[names[i]] = t;
    }
    b.output("Y").output("Y_h");
    b.node(op, ins, {"Y", "Y_h"}, "rnn").attrs["direction"] = attr_s("bidirectional");
    const Model m = b.build();
    cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
    feeds["lens"] = ref_test::tensor<int32_t>({3}, {2, 4, 0});
    cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
    feeds["W"] = random_f32(feeds["W"].shape(), 5);
    cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
  }
}

TEST(CpuRnn, LeavesWhatOneDnnCannotComputeToRef) {
  auto reason = [](const std::string& op, Attrs attrs, std::vector<int32_t> lens = {}) {
    CpuCase c;
    c.op = op;
    if (!lens.empty()) c.N = int64_t(lens.size());
    TensorMap feeds;
    Model m = cpu_case_model(c, &feeds, 5);
    Node& n = m.graph.nodes[0];
    for (auto& [k, v] : attrs) n.attrs[k] = v;
    if (!lens.empty()) {
      m.graph.initializers["lens"] = ref_test::tensor<int32_t>({int64_t(lens.size())}, lens);
      n.inputs[4] = "lens";
    }
    const std::string why = cpu_test::cpu_decline_reason(m, "rnn");
    // Whatever cpu declines, ref runs.
    if (!why.empty()) EXPECT_EQ(cpu_test::run_with(m, feeds, {"cpu", "ref"}).partition[0].provider, "ref");
    return why;
  };
  EXPECT_EQ(reason("LSTM", {{"clip", attr_f(3)}}), "clip is not supported by oneDNN's RNN primitives");
  EXPECT_EQ(reason("LSTM", {{"input_forget", attr_i(1)}}), "input_forget is not supported by oneDNN's LSTM");
  EXPECT_EQ(reason("LSTM", {{"activations", strings({"Sigmoid", "Relu", "Tanh"})}}),
            "activations other than Sigmoid, Tanh, Tanh");
  EXPECT_EQ(reason("GRU", {{"activations", strings({"HardSigmoid", "Tanh"})}}), "activations other than Sigmoid, Tanh");
  EXPECT_EQ(reason("RNN", {{"activations", strings({"Softsign"})}}),
            "activation other than Tanh, Sigmoid, Relu or LeakyRelu");
  // Per-batch lengths: the own cells (batch <= 8) take them, oneDNN (larger batches) not.
  EXPECT_EQ(reason("GRU", {}, {4, 2, 4}), "");
  EXPECT_EQ(reason("GRU", {}, {4, 4, 4, 4, 4, 4, 4, 4, 4}), "");
  EXPECT_EQ(reason("GRU", {}, {4, 4, 4, 4, 2, 4, 4, 4, 4}),
            "sequence_lens differs from the sequence length (oneDNN has no per-batch lengths)");
  // A node nobody can run fails with ref's message.
  CpuCase bad;
  TensorMap feeds;
  Model m = cpu_case_model(bad, &feeds, 3);
  m.graph.nodes[0].attrs["direction"] = attr_s("up");
  EXPECT_EQ(error_of([&] { cpu_test::run_with(m, feeds, {"cpu", "ref"}); }),
            "LSTM node 'rnn': attribute direction is 'up', expected forward, reverse or bidirectional");
  // The vanilla RNN's other activations run on oneDNN.
  for (const char* act : {"Sigmoid", "Relu", "LeakyRelu"}) {
    SCOPED_TRACE(act);
    CpuCase c;
    c.op = "RNN";
    TensorMap feeds;
    Model m = cpu_case_model(c, &feeds, 9);
    m.graph.nodes[0].attrs["activations"] = strings({act});
    m.graph.nodes[0].attrs["activation_alpha"] = attr_floats({0.3f});
    cpu_test::expect_matches_ref(m, feeds, "rnn", "cpu", 2e-6, 2e-5);
  }
}

}  // namespace
}  // namespace slim
