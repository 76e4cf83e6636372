// Loads real models from the ONNX backend test data that Debian's libonnx-testdata
// installs (system data, present wherever scripts/setup.sh ran).
#include <algorithm>

#include "onnx/onnx_test_util.h"

using namespace slim;
using namespace slim::test;
namespace fs = std::filesystem;

namespace {

const fs::path kTestData = "/usr/share/libonnx-testdata/data";

fs::path node_case(const std::string& name) { return kTestData / "node" / name; }

#define REQUIRE_TESTDATA()                                                   \
  if (!fs::exists(kTestData / "node")) GTEST_SKIP() << "libonnx-testdata is not installed"

const ValueInfo* find_input(const Model& m, const std::string& name) {
  for (const auto& v : m.graph.inputs)
    if (v.name == name) return &v;
  return nullptr;
}

}  // namespace

TEST(OnnxTestData, AddModelInputsAndOutputs) {
  REQUIRE_TESTDATA();
  Model m = OnnxImporter::load_file((node_case("test_add") / "model.onnx").string());
  ASSERT_EQ(m.graph.inputs.size(), 2u);
  EXPECT_EQ(m.graph.inputs[0].name, "x");
  EXPECT_EQ(m.graph.inputs[0].describe(), "f32[3,4,5]");
  EXPECT_EQ(m.graph.inputs[1].describe(), "f32[3,4,5]");
  ASSERT_EQ(m.graph.outputs.size(), 1u);
  EXPECT_EQ(m.graph.outputs[0].name, "sum");
  ASSERT_EQ(m.graph.nodes.size(), 1u);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Add");
  EXPECT_EQ(m.graph.nodes[0].name, "Add_0");  // unnamed in the file
  EXPECT_GE(m.opset(""), 7);

  std::string name;
  Tensor x = read_tensor_pb((node_case("test_add") / "test_data_set_0" / "input_0.pb").string(), &name);
  EXPECT_EQ(name, "x");
  EXPECT_EQ(x.dtype(), DType::f32);
  EXPECT_EQ(x.shape(), (Shape{3, 4, 5}));
}

TEST(OnnxTestData, ConvAttributesAndInputs) {
  REQUIRE_TESTDATA();
  Model m = OnnxImporter::load_file(
      (node_case("test_conv_with_strides_and_asymmetric_padding") / "model.onnx").string());
  const ValueInfo* x = find_input(m, "x");
  const ValueInfo* w = find_input(m, "W");
  ASSERT_TRUE(x && w);
  EXPECT_EQ(x->describe(), "f32[1,1,7,5]");
  EXPECT_EQ(w->describe(), "f32[1,1,3,3]");
  const Node& conv = m.graph.nodes.at(0);
  EXPECT_EQ(conv.op_type, "Conv");
  EXPECT_EQ(conv.attr_ints("strides"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(conv.attr_ints("pads"), (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_EQ(conv.attr_ints("kernel_shape"), (std::vector<int64_t>{3, 3}));
}

TEST(OnnxTestData, IfModelHasBranchSubgraphs) {
  REQUIRE_TESTDATA();
  Model m = OnnxImporter::load_file((node_case("test_if") / "model.onnx").string());
  ASSERT_EQ(m.graph.nodes.size(), 1u);
  const Node& n = m.graph.nodes[0];
  EXPECT_EQ(n.op_type, "If");
  ASSERT_NE(n.attr("then_branch"), nullptr);
  ASSERT_TRUE(n.attr("then_branch")->g);
  ASSERT_TRUE(n.attr("else_branch")->g);
  EXPECT_EQ(n.attr("then_branch")->g->outputs.size(), 1u);
  const ValueInfo* cond = find_input(m, "cond");
  ASSERT_TRUE(cond);
  EXPECT_EQ(cond->dtype, DType::boolean);
}

TEST(OnnxTestData, Float16CastCaseReadsHalfTensors) {
  REQUIRE_TESTDATA();
  const fs::path dir = node_case("test_cast_FLOAT_to_FLOAT16");
  Model m = OnnxImporter::load_file((dir / "model.onnx").string());
  EXPECT_EQ(m.graph.outputs.at(0).dtype, DType::f16);
  Tensor in = read_tensor_pb((dir / "test_data_set_0" / "input_0.pb").string());
  Tensor out = read_tensor_pb((dir / "test_data_set_0" / "output_0.pb").string());
  EXPECT_EQ(in.dtype(), DType::f32);
  EXPECT_EQ(out.dtype(), DType::f16);
  EXPECT_EQ(in.shape(), out.shape());
}

// Every model of the backend test data is valid ONNX: each must load, or be refused as
// unsupported (string tensors and the like), never called invalid or crash. The same
// holds for every input/output .pb tensor.
TEST(OnnxTestData, EveryBackendModelLoadsOrIsUnsupported) {
  REQUIRE_TESTDATA();
  int loaded = 0, unsupported = 0, tensors = 0;
  std::vector<std::string> failures;
  std::vector<fs::path> models;
  for (const auto& e : fs::recursive_directory_iterator(kTestData))
    if (e.path().filename() == "model.onnx") models.push_back(e.path());
  std::sort(models.begin(), models.end());
  for (const auto& path : models) {
    Model m;
    try {
      m = OnnxImporter::load_file(path.string());
      validate_graph(m.graph, path.string());
      ++loaded;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::unsupported) ++unsupported;
      else failures.push_back(e.what());
      continue;
    }
    for (const auto& set : fs::directory_iterator(path.parent_path())) {
      if (!set.is_directory()) continue;
      for (const auto& pb : fs::directory_iterator(set.path())) {
        // input_3.pb belongs to the model's fourth input; sequences and optionals are
        // stored as other protos than TensorProto and are not read here.
        const std::string stem = pb.path().stem().string();
        const bool is_input = stem.rfind("input_", 0) == 0;
        if (pb.path().extension() != ".pb" || (!is_input && stem.rfind("output_", 0) != 0))
          continue;
        const size_t index = std::stoul(stem.substr(is_input ? 6 : 7));
        const auto& values = is_input ? m.graph.inputs : m.graph.outputs;
        if (index >= values.size() || values[index].onnx_type.find('(') != std::string::npos)
          continue;
        try {
          Tensor t = read_tensor_pb(pb.path().string());
          // ONNX 1.12 wrote bfloat16 test data as uint16 tensors (numpy has no bfloat16).
          const bool bf16_as_u16 = values[index].dtype == DType::bf16 && t.dtype() == DType::u16;
          if (values[index].dtype && !bf16_as_u16) {
            EXPECT_EQ(t.dtype(), *values[index].dtype) << pb.path();
          }
          ++tensors;
        } catch (const Error& e) {
          if (e.code() != ErrorCode::unsupported) failures.push_back(e.what());
        }
      }
    }
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GT(loaded, 1000);
  EXPECT_GT(tensors, 2000);
  std::cout << loaded << " models loaded, " << unsupported << " unsupported, " << tensors
            << " tensors read\n";
}
