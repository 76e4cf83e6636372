// load_model_file: how a model file becomes the executors of a served model version.
#include "slim/serve/repository.h"

#include <gtest/gtest.h>

#include "onnx/onnx_test_util.h"
#include "slim/runtime/session_model.h"

namespace slim::serve {
namespace {

// y = Relu(x) for x f32[n,4], written to the test's temporary folder.
std::string write_relu_model() {
  onnx::ModelProto m = slim::test::make_model(13);
  onnx::GraphProto* g = m.mutable_graph();
  slim::test::add_input(g, "x", {0, 4})
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("n");
  slim::test::add_output(g, "y", {0, 4})
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("n");
  slim::test::add_node(g, "Relu", {"x"}, {"y"});
  const char* env = std::getenv("SLIM_TEST_TMP");
  const auto dir =
      std::filesystem::path(env ? env : std::filesystem::temp_directory_path() / "slim_test") /
      "serve" / "load_model_file";
  std::filesystem::create_directories(dir);
  const auto path = dir / "model.onnx";
  slim::test::write_file(path, slim::test::serialize(m));
  return path.string();
}

// A dynamic batcher forms every size from 1 to max_batch_size in any order. Each size
// gets a compiled plan on its second sighting and keeps it: with the session's default
// of 4 plans, sizes cycling through 1..8 would evict each other and never get one.
TEST(LoadModelFile, KeepsAPlanForEveryBatchSize) {
  int64_t memory = 0;
  std::string platform;
  auto models = load_model_file(write_relu_model(), 1, 1, 8, &memory, &platform);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(platform, "onnxruntime_onnx");
  const auto* model = dynamic_cast<const SessionModel*>(models[0].get());
  ASSERT_NE(model, nullptr);
  for (int pass = 0; pass < 3; ++pass)
    for (int64_t b = 1; b <= 8; ++b)
      EXPECT_EQ(model->predict({{"x", Tensor(DType::f32, {b, 4})}}).at("y").dim(0), b);
  EXPECT_EQ(model->session().num_specializations(), 8);
}

}  // namespace
}  // namespace slim::serve
