// Models written by python3-onnx (onnx.helper, numpy_helper, save_model with external
// data) must load to exactly the values numpy holds: the reference writer checks the
// reader on every encoding it produces.
#include <unistd.h>

#include <cstring>

#include "onnx/onnx_test_util.h"
#include "slim/core/npy.h"

using namespace slim;
using namespace slim::test;
namespace fs = std::filesystem;

namespace {

fs::path fixtures() {
  static const fs::path dir = [] {
    // SLIM_SOURCE_DIR when ctest passes it; else this file's own location.
    const char* src = std::getenv("SLIM_SOURCE_DIR");
    const fs::path root = src ? fs::path(src) : fs::path(__FILE__).parent_path().parent_path().parent_path();
    fs::path script = root / "tests/fixtures/make_onnx_importer_fixtures.py";
    // ctest runs each test in its own process, maybe at the same time: one folder each.
    fs::path out = temp_dir("python_fixtures_" + std::to_string(::getpid()));
    const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + out.string() + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return out;
  }();
  return dir;
}

DType dtype_for_tag(const std::string& name) {
  const std::string tag = name.substr(name.find('_') + 1);
  return tag == "bool" ? DType::boolean : parse_dtype(tag);
}

void expect_initializers_match(const Model& model, const fs::path& expected_dir) {
  int checked = 0;
  for (const auto& e : fs::directory_iterator(expected_dir)) {
    const std::string name = e.path().stem().string();
    if (name == "constant_value") continue;
    SCOPED_TRACE(name);
    Tensor want = read_npy(e.path().string());
    auto it = model.graph.initializers.find(name);
    ASSERT_NE(it, model.graph.initializers.end());
    const Tensor& got = it->second;
    EXPECT_EQ(got.dtype(), name == "big_f32" ? DType::f32 : dtype_for_tag(name));
    EXPECT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0);
    ++checked;
  }
  EXPECT_EQ(checked, 27);
  const Node& constant = model.graph.nodes.back();
  ASSERT_EQ(constant.op_type, "Constant");
  const Tensor* value = constant.attr_tensor("value");
  ASSERT_NE(value, nullptr);
  Tensor want = read_npy((expected_dir / "constant_value.npy").string());
  ASSERT_EQ(value->nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(value->raw_data(), want.raw_data(), want.nbytes()), 0);
}

}  // namespace

TEST(OnnxPythonFixtures, EveryEncodingOnnxHelperWrites) {
  Model model = OnnxImporter::load_file((fixtures() / "encodings.onnx").string());
  EXPECT_EQ(model.producer_name, "make_onnx_importer_fixtures");
  EXPECT_EQ(model.opset(""), 17);
  ASSERT_EQ(model.graph.inputs.size(), 1u);
  EXPECT_EQ(model.graph.inputs[0].describe(), "f32[batch,4]");
  expect_initializers_match(model, fixtures() / "expected");
}

TEST(OnnxPythonFixtures, ExternalDataSavedByOnnx) {
  Model model = OnnxImporter::load_file((fixtures() / "external" / "model.onnx").string());
  expect_initializers_match(model, fixtures() / "expected");
  // save_model moved the raw tensors (and the Constant's value) into weights.bin.
  EXPECT_TRUE(fs::exists(fixtures() / "external" / "weights.bin"));

  // The same bytes without their folder cannot resolve the external data.
  std::ifstream f(fixtures() / "external" / "model.onnx", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  expect_error([&] { OnnxImporter::load_bytes(bytes.data(), bytes.size(), "mem.onnx", ""); },
               ErrorCode::invalid_model, {"mem.onnx", "external data"});
}

TEST(OnnxPythonFixtures, ModelLocalFunctionFromOnnxHelper) {
  Model model = OnnxImporter::load_file((fixtures() / "functions.onnx").string());
  EXPECT_EQ(model.ir_version, 8);
  EXPECT_EQ(model.opset("local"), 1);
  // Two calls of a four-node body (Constant, Mul, Sigmoid, Mul).
  ASSERT_EQ(model.graph.nodes.size(), 8u);
  std::vector<std::string> ops;
  for (const auto& n : model.graph.nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Constant", "Mul", "Sigmoid", "Mul", "Constant", "Mul",
                                           "Sigmoid", "Mul"}));
  EXPECT_EQ(model.graph.nodes[0].name, "g1/Constant_0");
  EXPECT_FLOAT_EQ(model.graph.nodes[0].attr_float("value_float", 0), 1.702f);
  EXPECT_FLOAT_EQ(model.graph.nodes[4].attr_float("value_float", 0), 1.5f);
  EXPECT_EQ(model.graph.nodes[1].inputs, (std::vector<std::string>{"x", "g1/k"}));
  EXPECT_EQ(model.graph.nodes[3].outputs, std::vector<std::string>{"h"});
  EXPECT_EQ(model.graph.nodes[5].inputs, (std::vector<std::string>{"h", "g2/k"}));
  EXPECT_EQ(model.graph.nodes[7].outputs, std::vector<std::string>{"y"});
  EXPECT_EQ(validate_graph(model.graph, "functions.onnx").size(), 8u);
}
