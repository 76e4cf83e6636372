// Ref kernels for signal processing, random draws and n-gram counting: DFT against a
// direct O(n^2) sum in double at lengths of every kind (powers of two, mixed radix,
// Bluestein), inverse(DFT(x)) == x, the opset-20 axis input, seeded random ops, Bernoulli,
// TfIdfVectorizer's weighting modes, and the error messages. STFT, DFT and
// MelWeightMatrix against numpy are cases of tests/fixtures/ref_math_cases.py.
#include <complex>
#include <random>

#include "runtime/ref_kernel_test_util.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::ref_test;

namespace {

using cd = std::complex<double>;

Tensor i64(int64_t v) { return Tensor::scalar<int64_t>(v); }

// A complex signal [1, n, 2] in f64 with components uniform in [-1, 1].
Tensor complex_signal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(size_t(2 * n));
  for (double& e : v) e = d(rng);
  return tensor<double>({1, n, 2}, v);
}

std::vector<cd> naive_dft(const std::vector<double>& pairs) {
  const int64_t n = int64_t(pairs.size() / 2);
  std::vector<cd> y(pairs.size() / 2);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < n; ++j)
      y[size_t(k)] += cd(pairs[size_t(2 * j)], pairs[size_t(2 * j + 1)]) * std::polar(1.0, -2 * M_PI * double(j * k % n) / double(n));
  return y;
}

}  // namespace

TEST(RefSignal, DftMatchesTheDirectSumAtEveryKindOfLength) {
  // Powers of two, mixed radix (3, 5, 7, 97), and lengths with a prime factor above 64
  // (134 = 2 * 67, 509, 4099), which go through Bluestein's convolution.
  for (int64_t n : {1, 2, 3, 5, 6, 7, 12, 25, 64, 97, 100, 128, 134, 400, 509, 512, 1000, 4099}) {
    const Tensor x = complex_signal(n, uint32_t(n));
    const std::vector<double> got = values<double>(run_op("DFT", 17, {x})[0]);
    const std::vector<cd> want = naive_dft(values<double>(x));
    double err = 0;
    for (int64_t k = 0; k < n; ++k)
      err = std::max(err, std::abs(cd(got[size_t(2 * k)], got[size_t(2 * k + 1)]) - want[size_t(k)]));
    EXPECT_LT(err, 1e-9) << "n = " << n;
  }
}

TEST(RefSignal, InverseDftRestoresTheSignal) {
  for (int64_t n : {7, 100, 400, 509, 512}) {
    std::mt19937 rng{uint32_t(n)};
    std::normal_distribution<double> d;
    std::vector<double> v(size_t(2 * n));
    for (double& e : v) e = d(rng);
    const Tensor x = tensor<double>({2, n, 1}, v);
    const Tensor y = run_op("DFT", 17, {x})[0];
    const std::vector<double> back = values<double>(run_op("DFT", 17, {y}, {{"inverse", attr_i(1)}})[0]);
    ASSERT_EQ(back.size(), 2 * v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(back[2 * i], v[i], 1e-12) << "n = " << n << " at " << i;
      EXPECT_NEAR(back[2 * i + 1], 0.0, 1e-12) << "n = " << n << " at " << i;
    }
  }
}

TEST(RefSignal, DftAxisIsAnInputFromOpset20) {
  const Tensor x = tensor<float>({2, 3, 4, 1}, arange_f(24));
  const Tensor by_attr = run_op("DFT", 17, {x}, {{"axis", attr_i(2)}, {"onesided", attr_i(1)}})[0];
  EXPECT_EQ(by_attr.shape(), (Shape{2, 3, 3, 2}));
  const Tensor by_input = run_op("DFT", 20, {x, Tensor(), i64(-2)}, {{"onesided", attr_i(1)}})[0];
  EXPECT_EQ(values<float>(by_input), values<float>(by_attr));
  // Without the input the axis is -2, the last signal dimension.
  EXPECT_EQ(values<float>(run_op("DFT", 20, {x}, {{"onesided", attr_i(1)}})[0]), values<float>(by_attr));
  // dft_length pads with zeros: a length-4 line [0, 1, 2, 3] padded to 6.
  const std::vector<float> padded = values<float>(run_op("DFT", 20, {x, i64(6), i64(2)})[0]);
  EXPECT_NEAR(padded[0], 6.f, 1e-5f);
  const cd x1 = std::polar(1.0, -2 * M_PI / 6) + 2.0 * std::polar(1.0, -4 * M_PI / 6) + 3.0 * std::polar(1.0, -M_PI);
  EXPECT_NEAR(padded[2], float(x1.real()), 1e-5f);
  EXPECT_NEAR(padded[3], float(x1.imag()), 1e-5f);
}

TEST(RefSignal, BadSignalInputsAndAttributesAreNamed) {
  const Tensor real = tensor<float>({1, 4, 1}, arange_f(4));
  const Tensor complex = tensor<float>({1, 4, 2}, arange_f(8));
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [] { run_op("DFT", 17, {tensor<float>({1, 4, 3}, arange_f(12))}); }),
            "DFT node 'n0': input f32[1,4,3] must have rank >= 2 and end in a dimension of 1 (real) or 2 (complex)");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("DFT", 17, {real}, {{"axis", attr_i(2)}}); }),
            "DFT node 'n0': axis 2 is outside [-3, -2] and [0, 1] for input f32[1,4,1]");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("DFT", 17, {complex}, {{"onesided", attr_i(1)}}); }),
            "DFT node 'n0': onesided needs a real input (last dimension 1), got f32[1,4,2]");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("DFT", 17, {real, i64(0)}); }),
            "DFT node 'n0': dft_length 0 is not positive");
  EXPECT_EQ(error_of(ErrorCode::unsupported, [] { run_op("DFT", 17, {tensor<int32_t>({1, 2, 1}, {1, 2})}); }),
            "DFT node 'n0': input of dtype i32 is not supported (float types only)");
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [&] { run_op("DFT", 17, {real}, {{"inverse", attr_i(2)}}); }),
            "DFT node 'n0': attribute 'inverse' must be 0 or 1, got 2");

  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("STFT", 17, {real, i64(1)}); }),
            "STFT node 'n0': needs a window or a frame_length");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("STFT", 17, {real, i64(1), tensor<float>({3}, {1, 1, 1}), i64(2)}); }),
            "STFT node 'n0': window f32[3] does not have frame_length 2 values");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("STFT", 17, {real, i64(1), Tensor(), i64(5)}); }),
            "STFT node 'n0': frame length 5 is outside [1, 4], the signal length");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("STFT", 17, {real, i64(0), Tensor(), i64(2)}); }),
            "STFT node 'n0': frame_step 0 is not positive");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("STFT", 17, {complex, i64(1), Tensor(), i64(2)}); }),
            "STFT node 'n0': onesided needs a real signal (last dimension 1), got f32[1,4,2]");
  // Two frames of 2 with step 2; a complex signal needs onesided = 0.
  EXPECT_EQ(run_op("STFT", 17, {complex, i64(2), Tensor(), i64(2)}, {{"onesided", attr_i(0)}})[0].shape(), (Shape{1, 2, 2, 2}));

  auto mel = [](int64_t bins, int64_t dft, int64_t rate, float lo, float hi) {
    return run_op("MelWeightMatrix", 17, {i64(bins), i64(dft), i64(rate), Tensor::scalar<float>(lo), Tensor::scalar<float>(hi)});
  };
  EXPECT_EQ(mel(4, 16, 8000, 0, 4000)[0].shape(), (Shape{9, 4}));
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { mel(4, 16, 8000, 0, 16000); }),
            "MelWeightMatrix node 'n0': upper_edge_hertz 16000.000000 maps past the last of 9 spectrogram bins (sample_rate 8000)");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { mel(4, 16, 8000, 300, 200); }),
            "MelWeightMatrix node 'n0': edges [300.000000, 200.000000] Hz are not 0 <= lower <= upper");
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [] { run_op("HannWindow", 17, {i64(4)}, {{"output_datatype", attr_i(9)}}); }),
            "HannWindow node 'n0': output_datatype 9 is not a numeric type slim supports");
}

TEST(RefRandom, SeededDrawsRepeatAndFollowTheirDistribution) {
  const Attrs uniform = {{"shape", attr_ints({20000})}, {"low", attr_f(-2)}, {"high", attr_f(3)}, {"seed", attr_f(5)}};
  const std::vector<float> u = values<float>(run_op("RandomUniform", 1, {}, uniform)[0]);
  EXPECT_EQ(u, values<float>(run_op("RandomUniform", 1, {}, uniform)[0]));
  double sum = 0;
  for (float v : u) {
    ASSERT_TRUE(v >= -2 && v < 3) << v;
    sum += v;
  }
  EXPECT_NEAR(sum / double(u.size()), 0.5, 0.05);

  const Tensor like = tensor<float>({100, 200}, std::vector<float>(20000, 0.f));
  const Tensor n = run_op("RandomNormalLike", 1, {like}, {{"mean", attr_f(1)}, {"scale", attr_f(2)}, {"dtype", attr_i(11)}})[0];
  ASSERT_EQ(n.dtype(), DType::f64);
  ASSERT_EQ(n.shape(), like.shape());
  double m = 0, sq = 0;
  for (double v : values<double>(n)) m += v, sq += v * v;
  m /= 20000;
  EXPECT_NEAR(m, 1.0, 0.05);
  EXPECT_NEAR(std::sqrt(sq / 20000 - m * m), 2.0, 0.05);

  // Unseeded draws differ from run to run.
  EXPECT_NE(values<float>(run_op("RandomUniformLike", 1, {like})[0]), values<float>(run_op("RandomUniformLike", 1, {like})[0]));

  EXPECT_EQ(error_of(ErrorCode::invalid_model, [] { run_op("RandomUniform", 1, {}); }),
            "RandomUniform node 'n0': attribute 'shape' is missing");
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [] { run_op("RandomNormal", 1, {}, {{"shape", attr_ints({2})}, {"dtype", attr_i(7)}}); }),
            "RandomNormal node 'n0': dtype 7 is not a floating-point type slim supports");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [] { run_op("RandomUniformLike", 1, {tensor<int64_t>({2}, {1, 2})}); }),
            "RandomUniformLike node 'n0': output dtype i64 is not a floating-point type; set 'dtype'");
}

TEST(RefRandom, BernoulliDrawsZeroOrOneWithTheGivenProbability) {
  std::vector<float> p(3000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = i < 1000 ? 0.f : i < 2000 ? 1.f : 0.25f;
  const Tensor y = run_op("Bernoulli", 15, {tensor<float>({3000}, p)}, {{"dtype", attr_i(6)}, {"seed", attr_f(1)}})[0];
  ASSERT_EQ(y.dtype(), DType::i32);
  const std::vector<int32_t> v = values<int32_t>(y);
  int ones = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i < 1000) EXPECT_EQ(v[i], 0);
    else if (i < 2000) EXPECT_EQ(v[i], 1);
    else ones += v[i];
  }
  EXPECT_NEAR(ones, 250, 60);
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [] { run_op("Bernoulli", 15, {tensor<double>({2}, {0.5, 1.5})}); }),
            "Bernoulli node 'n0': probability 1.500000 at element 1 is outside [0, 1]");
}

TEST(RefRandom, SessionsNeverFoldRandomOps) {
  slim::testing::ModelBuilder b(17);
  b.node("RandomUniform", {}, {"y"}).attrs["shape"] = attr_ints({64});
  b.output("y");
  const auto s = Session::compile(b.build());
  EXPECT_EQ(s->stats().folded_nodes, 0);
  EXPECT_NE(values<float>(s->run({}).at("y")), values<float>(s->run({}).at("y")));
}

TEST(RefNgram, TfIdfVectorizerCountsWeighsAndChecksItsPool) {
  // Pool: unigrams 2, 3; bigrams (5, 6), (7, 8); ngram_indexes put them at 3, 0, 1, 2.
  Attrs a = {{"min_gram_length", attr_i(1)},          {"max_gram_length", attr_i(2)},
             {"max_skip_count", attr_i(1)},           {"mode", attr_s("TF")},
             {"ngram_counts", attr_ints({0, 2})},     {"ngram_indexes", attr_ints({3, 0, 1, 2})},
             {"pool_int64s", attr_ints({2, 3, 5, 6, 7, 8})}, {"weights", attr_floats({0.5f, 2.f, 3.f, 4.f})}};
  // Row 0: 2 twice, 3 once, (5, 6) adjacent and (5, _, 6) one skip apart; row 1: (7, 8) once.
  const Tensor x = tensor<int64_t>({2, 6}, {2, 5, 6, 6, 2, 3, 7, 8, 1, 1, 1, 1});
  auto run = [&](const char* mode) {
    a["mode"] = attr_s(mode);
    return values<float>(run_op("TfIdfVectorizer", 9, {x}, a)[0]);
  };
  EXPECT_EQ(run("TF"), (std::vector<float>{1, 2, 0, 2, 0, 0, 1, 0}));
  EXPECT_EQ(run("IDF"), (std::vector<float>{2, 3, 0, 0.5f, 0, 0, 4, 0}));
  EXPECT_EQ(run("TFIDF"), (std::vector<float>{2, 6, 0, 1, 0, 0, 4, 0}));
  // A 1-D input gives a 1-D output.
  EXPECT_EQ(run_op("TfIdfVectorizer", 9, {tensor<int32_t>({3}, {2, 2, 3})}, a)[0].shape(), (Shape{4}));

  Attrs bad = a;
  bad["ngram_indexes"] = attr_ints({0, 1, 2});
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [&] { run_op("TfIdfVectorizer", 9, {x}, bad); }),
            "TfIdfVectorizer node 'n0': ngram_indexes has 3 entries for 4 n-grams");
  bad = a;
  bad["ngram_counts"] = attr_ints({0, 3});
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [&] { run_op("TfIdfVectorizer", 9, {x}, bad); }),
            "TfIdfVectorizer node 'n0': ngram_counts does not split pool_int64s into whole 2-grams");
  bad = a;
  bad["pool_strings"] = attr_s("a");
  EXPECT_EQ(error_of(ErrorCode::unsupported, [&] { run_op("TfIdfVectorizer", 9, {x}, bad); }),
            "TfIdfVectorizer node 'n0': attribute 'pool_strings' needs string tensors, which slim does not support");
  EXPECT_EQ(error_of(ErrorCode::invalid_argument, [&] { run_op("TfIdfVectorizer", 9, {tensor<float>({2}, {1, 2})}, a); }),
            "TfIdfVectorizer node 'n0': input f32[2] must be a 1-D or 2-D int32 or int64 tensor");
}
