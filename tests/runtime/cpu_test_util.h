// Helpers for the cpu provider tests: random f32 tensors, one-node models, and a check
// that a model compiled with providers cpu,ref gives ref's outputs while the cpu provider
// really ran the node (or declined it for the expected reason).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/test_graphs.h"
#include "slim/core/cpu_features.h"
#include "slim/runtime/session.h"

namespace slim::cpu_test {

// Static dims of a shape, as the graph builders take them.
inline std::vector<testing::DimSpec> spec(const Shape& s) {
  std::vector<testing::DimSpec> out;
  for (int64_t d : s) out.emplace_back(d);
  return out;
}

// Runs `body` once per instruction set the CPU runs at or below the active one,
// restoring that one after.
inline void for_each_isa(const std::function<void()>& body) {
  const Isa active = active_isa();
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::neon, Isa::scalar}) {
    if (!isa_enabled(isa)) continue;
    set_isa_limit(isa);
    SCOPED_TRACE(std::string("isa ") + isa_name(isa));
    body();
    set_isa_limit(active);
  }
}

inline Tensor random_f32(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::f32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

// Largest |a - b| / (atol + rtol * |b|) over all elements; NaN positions must match.
inline double worst_error(const Tensor& a, const Tensor& b, double atol, double rtol) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return 1e30;
  if (a.dtype() != DType::f32) {
    return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0 ? 0.0 : 1e30;
  }
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(pa[i]) || std::isnan(pb[i])) {
      if (std::isnan(pa[i]) != std::isnan(pb[i])) return 1e30;
      continue;
    }
    if (std::isinf(pa[i]) || std::isinf(pb[i])) {
      if (pa[i] != pb[i]) return 1e30;
      continue;
    }
    worst = std::max(worst, std::fabs(double(pa[i]) - double(pb[i])) / (atol + rtol * std::fabs(double(pb[i]))));
  }
  return worst;
}

struct CpuRun {
  std::vector<NodeAssignment> partition;
  TensorMap outputs;
};

inline CpuRun run_with(const Model& m, const TensorMap& inputs, std::vector<std::string> providers) {
  SessionOptions o;
  o.providers = std::move(providers);
  o.num_threads = 2;
  auto s = Session::compile(m, o);
  return {s->partition(), s->run(inputs)};
}

// Compiles with cpu,ref and with ref alone; every output must agree within tolerance,
// and the node named `node` must have gone to `want_provider`.
inline void expect_matches_ref(const Model& m, const TensorMap& inputs, const std::string& node,
                               const std::string& want_provider = "cpu", double atol = 1e-5,
                               double rtol = 1e-4) {
  const CpuRun fast = run_with(m, inputs, {"cpu", "ref"});
  const CpuRun ref = run_with(m, inputs, {"ref"});
  bool found = false;
  for (const auto& a : fast.partition) {
    if (a.node != node) continue;
    found = true;
    std::string why;
    for (const auto& d : a.declined) why += d + "; ";
    EXPECT_EQ(a.provider, want_provider) << node << " declined: " << why;
  }
  EXPECT_TRUE(found) << "node " << node << " not in the compiled graph";
  ASSERT_EQ(fast.outputs.size(), ref.outputs.size());
  for (const auto& [name, t] : ref.outputs) {
    ASSERT_TRUE(fast.outputs.count(name)) << name;
    EXPECT_LE(worst_error(fast.outputs.at(name), t, atol, rtol), 1.0) << "output " << name;
  }
}

// The reason the cpu provider gave for declining `node` ("" when it took the node).
inline std::string cpu_decline_reason(const Model& m, const std::string& node) {
  SessionOptions o;
  o.providers = {"cpu", "ref"};
  auto s = Session::compile(m, o);
  for (const auto& a : s->partition()) {
    if (a.node != node) continue;
    for (const auto& d : a.declined)
      if (d.rfind("cpu: ", 0) == 0) return d.substr(5);
    return "";
  }
  return "(node not found)";
}

}  // namespace slim::cpu_test
