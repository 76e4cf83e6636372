// Differential tests of the ref provider's math kernels: tests/fixtures/ref_math_cases.py
// computes ~1,400 single-node cases independently in numpy (every dtype, axis and
// attribute combination, broadcasting, ties, legacy opsets) and this test runs each node
// through its ref kernel and compares: exact for integers and bools, within a tolerance
// for floats (wider for float16, whose kernels round once more than numpy's float64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slim/core/convert.h"
#include "slim/core/npy.h"
#include "slim/runtime/kernel.h"

using namespace slim;
namespace fs = std::filesystem;

namespace {

Attribute parse_attr(const nlohmann::json& j) {
  Attribute a;
  if (j.contains("i")) {
    a.kind = Attribute::Kind::i;
    a.i = j["i"].get<int64_t>();
  } else if (j.contains("f")) {
    a.kind = Attribute::Kind::f;
    a.f = j["f"].get<float>();
  } else if (j.contains("s")) {
    a.kind = Attribute::Kind::s;
    a.s = j["s"].get<std::string>();
  } else {
    a.kind = Attribute::Kind::ints;
    a.ints = j["ints"].get<std::vector<int64_t>>();
  }
  return a;
}

// Empty when equal; otherwise what differs.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return "got " + got.describe() + ", expected " + want.describe();
  if (!dtype_is_float(want.dtype())) {
    const std::vector<int64_t> g = tensor_to_int64s(got), w = tensor_to_int64s(want);
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] != w[i])
        return "element " + std::to_string(i) + ": got " + std::to_string(g[i]) + ", expected " +
               std::to_string(w[i]);
    return "";
  }
  const bool half = want.dtype() == DType::f16;
  const double rtol = half ? 2e-3 : 1e-4, atol = half ? 2e-3 : 1e-5;
  const std::vector<double> g = tensor_to_doubles(got), w = tensor_to_doubles(want);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (std::isinf(w[i]) && g[i] == w[i]) continue;
    if (!(std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i])))
      return "element " + std::to_string(i) + ": got " + std::to_string(g[i]) + ", expected " +
             std::to_string(w[i]);
  }
  return "";
}

TEST(RefMathGenerated, EveryCaseMatchesNumpy) {
  const char* src = std::getenv("SLIM_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "SLIM_SOURCE_DIR is not set (run through ctest)";
  const char* tmp = std::getenv("SLIM_TEST_TMP");
  const fs::path dir = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "ref_math_cases";
  fs::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " +
                          (fs::path(src) / "tests/fixtures/ref_math_cases.py").string() + " " +
                          dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  std::ifstream in(dir / "cases.json");
  ASSERT_TRUE(in) << "no cases.json in " << dir;
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_GT(cases.size(), 1000u);

  int passed = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    Node node;
    node.name = name;
    node.op_type = c["op"].get<std::string>();
    std::vector<Tensor> inputs;
    for (const auto& f : c["inputs"]) {
      inputs.push_back(f.is_null() ? Tensor() : read_npy((dir / f.get<std::string>()).string()));
      node.inputs.push_back(f.is_null() ? "" : "x" + std::to_string(inputs.size()));
    }
    std::vector<Tensor> want;
    for (const auto& f : c["outputs"]) {
      want.push_back(read_npy((dir / f.get<std::string>()).string()));
      node.outputs.push_back("y" + std::to_string(want.size()));
    }
    for (const auto& [key, value] : c["attrs"].items()) node.attrs[key] = parse_attr(value);
    const int64_t opset = c["opset"].get<int64_t>();

    std::string problem;
    try {
      const KernelDef* def = ref_kernel_registry().find(node.op_type, "", opset);
      if (!def)
        throw Error(ErrorCode::unsupported, "no ref kernel at opset " + std::to_string(opset));
      const auto kernel = def->factory(node, opset);
      std::vector<const Tensor*> ptrs;
      for (const auto& t : inputs) ptrs.push_back(&t);
      std::vector<Tensor> outs(want.size());
      KernelContext ctx(node, ptrs, &outs, nullptr, nullptr);
      kernel->compute(ctx);
      for (size_t i = 0; i < want.size() && problem.empty(); ++i) {
        problem = compare(outs[i], want[i]);
        if (!problem.empty()) problem = "output " + std::to_string(i) + ": " + problem;
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    EXPECT_EQ(problem, "") << name << " (" << node.op_type << " opset " << opset << ")";
    if (problem.empty()) ++passed;
  }
  EXPECT_EQ(passed, int(cases.size()));
  fs::remove_all(dir);
}

}  // namespace
