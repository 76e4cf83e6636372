// The calibrators and weight quantization against numpy references
// (tests/fixtures/quant_fixtures.py): histograms bin for bin, ranges, the candidates
// of the entropy and MSE searches, QuantizeLinear parameters, int8 weights.
#include "slim/quant/calibrators.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"
#include "slim/quant/statistics.h"

using namespace slim;
using namespace slim::quant;
using slim::forest::testing::fixture_dir;
using slim::forest::testing::fixture_names;

namespace {

std::string dir() {
  return fixture_dir("quant_fixtures.py");
}

nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// The tensor's statistics, fed in three uneven batches so bins merge as they widen.
TensorStats stats_of(const Tensor& x) {
  TensorStats s;
  const float* v = x.data<float>();
  const int64_t n = x.numel(), a = n / 7, b = n / 2;
  s.add(v, a);
  s.add(v + a, b - a);
  s.add(v + b, n - b);
  return s;
}

void expect_range(const Range& r, const nlohmann::json& want, const std::string& what) {
  EXPECT_DOUBLE_EQ(r.lo, want[0].get<double>()) << what;
  EXPECT_DOUBLE_EQ(r.hi, want[1].get<double>()) << what;
}

const std::pair<const char*, ActivationType> kTypes[] = {
    {"u8", {DType::u8, false}}, {"i8", {DType::i8, false}}, {"i8s", {DType::i8, true}}};

}  // namespace

TEST(Calibrators, MatchNumpyReferences) {
  for (const auto& name : fixture_names(dir())) {
    SCOPED_TRACE(name);
    const Tensor x = read_npy(dir() + "/calib/" + name + ".npy").contiguous();
    const auto ref = load_json(dir() + "/calib/" + name + ".json");
    const TensorStats s = stats_of(x);
    EXPECT_EQ(s.count, x.numel());
    EXPECT_DOUBLE_EQ(s.min, ref["min"].get<double>());
    EXPECT_DOUBLE_EQ(s.max, ref["max"].get<double>());
    EXPECT_EQ(s.hist.exponent(), ref["exponent"].get<int>());
    const Tensor counts = read_npy(dir() + "/calib/" + name + "_hist.npy");
    ASSERT_EQ(int64_t(s.hist.counts().size()), counts.numel());
    for (int64_t k = 0; k < counts.numel(); ++k)
      ASSERT_EQ(s.hist.counts()[size_t(k)], counts.data<double>()[k]) << "bin " << k;

    CalibratorOptions o;
    expect_range(calibrate(s, o, kTypes[0].second), nlohmann::json::array({ref["min"], ref["max"]}),
                 "minmax");
    o.method = CalibrationMethod::percentile;
    for (const auto& [p, want] : ref["percentile"].items()) {
      o.percentile = std::stod(p);
      expect_range(calibrate(s, o, kTypes[0].second), want, "percentile " + p);
    }
    // Entropy: the chosen candidate's divergence is numpy's smallest (a near-tie may be
    // decided by the order of a sum), and the range follows from it.
    const std::vector<double> abs = s.hist.abs_counts();
    for (int levels : {128, 256}) {
      const auto& e = ref["entropy"][std::to_string(levels)];
      const int bins = entropy_threshold_bins(abs, levels);
      if (e["divergence"].empty()) {
        EXPECT_EQ(bins, e["bins"].get<int>()) << "entropy " << levels;
        continue;
      }
      const double mine = e["divergence"][std::to_string(bins)].get<double>();
      const double best = e["divergence"][std::to_string(e["bins"].get<int>())].get<double>();
      EXPECT_LE(mine, best * (1 + 1e-9) + 1e-15)
          << "entropy " << levels << ": " << bins << " vs " << e["bins"];
    }
    o.method = CalibrationMethod::entropy;
    const bool nonneg = s.min >= 0;
    if (ref["entropy"][nonneg ? "256" : "128"]["bins"] ==
        entropy_threshold_bins(abs, nonneg ? 256 : 128))
      expect_range(calibrate(s, o, kTypes[0].second),
                   ref["entropy"][nonneg ? "256" : "128"]["range"], "entropy u8");
    if (ref["entropy"]["128"]["bins"] == entropy_threshold_bins(abs, 128))
      expect_range(calibrate(s, o, kTypes[2].second), ref["entropy"]["128"]["range"],
                   "entropy i8 symmetric");

    o.method = CalibrationMethod::mse;
    for (const auto& [tag, type] : kTypes) {
      const auto& m = ref["mse"][tag];
      const auto errors = m["errors"].get<std::vector<double>>();
      const Range r = calibrate(s, o, type);
      const double best = *std::min_element(errors.begin(), errors.end());
      // Which candidate slim chose: the one whose range it returned.
      const double absmax = std::max(std::fabs(s.min), std::fabs(s.max));
      bool found = false;
      for (size_t k = 0; k < errors.size(); ++k) {
        const double t = std::min(absmax * double(k + 1) / 256, absmax);
        if (r.lo == std::max(s.min, -t) && r.hi == std::min(s.max, t)) {
          EXPECT_LE(errors[k], best * (1 + 1e-9) + 1e-300) << "mse " << tag;
          found = true;
          break;
        }
      }
      EXPECT_TRUE(found) << "mse " << tag << ": [" << r.lo << ", " << r.hi << "] is no candidate";
      const auto [scale, zp] = quantization_params({s.min, s.max}, type);
      EXPECT_EQ(scale, ref["params"][tag][0].get<float>()) << tag;
      EXPECT_EQ(zp, ref["params"][tag][1].get<int>()) << tag;
    }
  }
}

TEST(Calibrators, HistogramsMergeExactly) {
  const Tensor x = read_npy(dir() + "/calib/heavy.npy").contiguous();
  const float* v = x.data<float>();
  TensorStats whole, a, b;
  whole.add(v, x.numel());
  a.add(v, 1000);
  b.add(v + 1000, x.numel() - 1000);
  a.merge(b);
  EXPECT_EQ(a.hist.exponent(), whole.hist.exponent());
  EXPECT_EQ(a.hist.counts(), whole.hist.counts());
  EXPECT_EQ(a.min, whole.min);
  EXPECT_EQ(a.max, whole.max);
}

TEST(Calibrators, NonFiniteValuesAreCountedApart) {
  const float v[] = {1.0f, NAN, -2.0f, INFINITY, 0.5f};
  TensorStats s;
  s.add(v, 5);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.nonfinite, 2);
  EXPECT_EQ(s.min, -2.0);
  EXPECT_EQ(s.max, 1.0);
}

TEST(Calibrators, WeightsMatchNumpy) {
  const std::string d = dir() + "/weights/";
  const Tensor w = read_npy(d + "w.npy");
  for (const auto& [axis, tag] :
       {std::pair{0, "axis0"}, std::pair{1, "axis1"}, std::pair{-1, "tensor"}}) {
    SCOPED_TRACE(tag);
    const QuantizedWeight q = quantize_weight(w, axis);
    const Tensor want = read_npy(d + "q_" + tag + ".npy");
    const Tensor scales = read_npy(d + "scale_" + std::string(tag) + ".npy");
    ASSERT_EQ(q.values.shape(), want.shape());
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_EQ(q.values.data<int8_t>()[i], want.data<int8_t>()[i]) << i;
    ASSERT_EQ(int64_t(q.scales.size()), scales.numel());
    for (int64_t c = 0; c < scales.numel(); ++c)
      EXPECT_EQ(q.scales[size_t(c)], scales.data<float>()[c]);
    const Tensor back = dequantize_weight(q);
    for (int64_t i = 0; i < w.numel(); ++i)
      EXPECT_NEAR(back.data<float>()[i], w.data<float>()[i],
                  0.5 * *std::max_element(q.scales.begin(), q.scales.end()));
  }
}

TEST(Calibrators, WidenedWeightScalesRoundAgain) {
  const Tensor w = Tensor::from_vector<float>({2, 3}, {0.5f, -1.0f, 0.25f, 1e-6f, -2e-6f, 0.0f});
  QuantizedWeight q = quantize_weight(w, 0);
  EXPECT_EQ(q.values.data<int8_t>()[4], -127);
  widen_weight_scale(w, q, 1, 1e-7f);
  EXPECT_EQ(q.scales[1], 1e-7f);
  EXPECT_EQ(q.values.data<int8_t>()[3], 10);
  EXPECT_EQ(q.values.data<int8_t>()[4], -20);
  widen_weight_scale(w, q, 1, 1e-9f);  // never narrows
  EXPECT_EQ(q.scales[1], 1e-7f);
  EXPECT_EQ(q.values.data<int8_t>()[1], -127);  // other channels untouched
}

TEST(Calibrators, FakeQuantizeRoundsHalfToEven) {
  const ActivationType u8{DType::u8, false};
  const QuantParams p{0.5f, 10};
  EXPECT_EQ(fake_quantize(0.25f, p, u8), 0.0f);     // 0.5 -> 0
  EXPECT_EQ(fake_quantize(0.75f, p, u8), 1.0f);     // 1.5 -> 2
  EXPECT_EQ(fake_quantize(-100.f, p, u8), -5.0f);   // saturates at 0 - 10
  EXPECT_EQ(fake_quantize(1000.f, p, u8), 122.5f);  // at 255 - 10
  EXPECT_EQ(parse_calibration_method("entropy"), CalibrationMethod::entropy);
  EXPECT_THROW(parse_calibration_method("kl"), Error);
}
