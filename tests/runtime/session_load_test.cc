// Session::load end to end: an .onnx file written with the ONNX protobuf API, imported,
// compiled and run with the test provider.
#include <gtest/gtest.h>

#include "onnx/onnx_test_util.h"
#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

std::filesystem::path runtime_temp_dir(const std::string& name) {
  const char* env = std::getenv("SLIM_TEST_TMP");
  std::filesystem::path root = env ? env : std::filesystem::temp_directory_path() / "slim_test";
  std::filesystem::path dir = root / "runtime" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST(SessionLoad, RunsAModelFile) {
  onnx::ModelProto m = slim::test::make_model(13);
  onnx::GraphProto* g = m.mutable_graph();
  auto* x = slim::test::add_input(g, "x", {0, 4});
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("n");
  slim::test::add_output(g, "y", {0, 2, 2});
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)
      ->set_dim_param("n");
  slim::test::add_initializer(g, "bias", {4}, {1, 2, 3, 4});
  // The Constant's value is the Reshape target [-1, 2, 2].
  auto* c = slim::test::add_node(g, "Constant", {}, {"target"}, "target_const");
  auto* attr = c->add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto::TENSOR);
  auto* t = attr->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(3);
  for (int64_t v : {-1, 2, 2}) t->add_int64_data(v);
  slim::test::add_node(g, "Add", {"x", "bias"}, {"sum"});
  slim::test::add_node(g, "Relu", {"sum"}, {"r"});
  slim::test::add_node(g, "Identity", {"sum"}, {"unused"});
  slim::test::add_node(g, "Reshape", {"r", "target"}, {"y"});

  const auto dir = runtime_temp_dir("load");
  const auto path = dir / "model.onnx";
  slim::test::write_file(path, slim::test::serialize(m));

  auto s = Session::load(path.string(), test_options());
  EXPECT_EQ(s->model().path, path.string());
  EXPECT_EQ(s->stats().nodes_in, 5);
  EXPECT_EQ(s->stats().nodes_out, 3);
  EXPECT_EQ(s->stats().dead_nodes, 1);
  EXPECT_EQ(s->stats().folded_nodes, 1);
  ASSERT_EQ(s->inputs().size(), 1u);
  EXPECT_EQ(s->inputs()[0].describe(), "f32[n,4]");

  auto out = s->run({{"x", Tensor::from_vector<float>({2, 4}, {-5, 0, 1, -1, 0, 0, 0, 0})}});
  EXPECT_EQ(out.at("y").shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values_of(out.at("y")), (std::vector<double>{0, 2, 4, 3, 1, 2, 3, 4}));
  EXPECT_EQ(s->run({{"x", Tensor(DType::f32, {3, 4})}}).at("y").shape(), (Shape{3, 2, 2}));
}

TEST(SessionLoad, BadFilesAreErrorsNamingTheFile) {
  const auto dir = runtime_temp_dir("bad");
  const auto path = dir / "garbage.onnx";
  slim::test::write_file(path, std::string("\x08\x07this is not a model\xff\xff", 24));
  try {
    Session::load(path.string(), test_options());
    FAIL() << "garbage loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_model) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}
