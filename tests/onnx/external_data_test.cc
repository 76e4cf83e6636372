#include <unistd.h>

#include <cstring>

#include "onnx/onnx_test_util.h"

using namespace slim;
using namespace slim::test;
using TP = onnx::TensorProto;
namespace fs = std::filesystem;

namespace {

// A model with one float initializer "w" of `numel` values stored externally.
onnx::ModelProto external_model(const std::string& location, int64_t numel,
                                std::optional<int64_t> offset, std::optional<int64_t> length) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* t = g->add_initializer();
  t->set_name("w");
  t->set_data_type(TP::FLOAT);
  t->add_dims(numel);
  t->set_data_location(TP::EXTERNAL);
  auto add_kv = [&](const std::string& k, const std::string& v) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  };
  add_kv("location", location);
  if (offset) add_kv("offset", std::to_string(*offset));
  if (length) add_kv("length", std::to_string(*length));
  add_node(g, "Identity", {"w"}, {"y"}, "id");
  add_output(g, "y", {numel});
  return m;
}

// weights.bin: 256 floats 0, 1, 2, ...
std::string weights_bytes() {
  std::vector<float> v(256);
  for (int i = 0; i < 256; ++i) v[size_t(i)] = float(i);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

Model load_from_dir(const fs::path& dir, const onnx::ModelProto& m) {
  write_file(dir / "model.onnx", serialize(m));
  return OnnxImporter::load_file((dir / "model.onnx").string());
}

}  // namespace

TEST(OnnxExternalData, AlignedOffsetIsMappedInPlace) {
  auto dir = temp_dir("ext_aligned");
  write_file(dir / "weights.bin", weights_bytes());
  Model model = load_from_dir(dir, external_model("weights.bin", 16, 64 * 4, 64));
  const Tensor& w = model.graph.initializers.at("w");
  ASSERT_EQ(w.shape(), (Shape{16}));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<const float*>(w.raw_data())[i], float(64 + i));
  EXPECT_FALSE(w.storage()->owned());  // borrowed from the map
}

TEST(OnnxExternalData, UnalignedOffsetIsCopied) {
  auto dir = temp_dir("ext_unaligned");
  write_file(dir / "weights.bin", weights_bytes());
  Model model = load_from_dir(dir, external_model("weights.bin", 3, 5 * 4, std::nullopt));
  const Tensor& w = model.graph.initializers.at("w");
  EXPECT_TRUE(w.storage()->owned());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.raw_data()) % kTensorAlignment, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(static_cast<const float*>(w.raw_data())[i], float(5 + i));
}

TEST(OnnxExternalData, SubfolderAndNoOffset) {
  auto dir = temp_dir("ext_subdir");
  fs::create_directories(dir / "data");
  write_file(dir / "data" / "w.bin", weights_bytes());
  Model model = load_from_dir(dir, external_model("data/w.bin", 256, std::nullopt, 1024));
  const Tensor& w = model.graph.initializers.at("w");
  EXPECT_EQ(static_cast<const float*>(w.raw_data())[255], 255.f);
  // "a/../w.bin" stays inside the folder and is fine.
  write_file(dir / "w.bin", weights_bytes());
  Model again = load_from_dir(dir, external_model("data/../w.bin", 2, 8, std::nullopt));
  EXPECT_EQ(static_cast<const float*>(again.graph.initializers.at("w").raw_data())[0], 2.f);
}

TEST(OnnxExternalData, EscapingPathsAreRejected) {
  auto root = temp_dir("ext_escape");
  fs::create_directories(root / "model");
  write_file(root / "secret.bin", weights_bytes());
  expect_error([&] { load_from_dir(root / "model", external_model("../secret.bin", 4, 0, 16)); },
               ErrorCode::invalid_model,
               {"model.onnx", "initializer 'w'", "'../secret.bin'", "escapes the model's folder"});
  expect_error([&] { load_from_dir(root / "model", external_model("sub/../../secret.bin", 4, 0, 16)); },
               ErrorCode::invalid_model, {"escapes the model's folder"});
  expect_error(
      [&] { load_from_dir(root / "model", external_model((root / "secret.bin").string(), 4, 0, 16)); },
      ErrorCode::invalid_model, {"initializer 'w'", "absolute path"});
  // A symlink inside the folder that points outside it escapes too.
  fs::create_symlink(root / "secret.bin", root / "model" / "link.bin");
  expect_error([&] { load_from_dir(root / "model", external_model("link.bin", 4, 0, 16)); },
               ErrorCode::invalid_model, {"'link.bin'", "escapes the model's folder"});
  expect_error([&] { load_from_dir(root / "model", external_model(".", 4, 0, 16)); },
               ErrorCode::invalid_model, {"escapes the model's folder"});
}

TEST(OnnxExternalData, ReadsPastTheEndAreRejected) {
  auto dir = temp_dir("ext_bounds");
  write_file(dir / "weights.bin", weights_bytes());  // 1024 bytes
  expect_error([&] { load_from_dir(dir, external_model("weights.bin", 16, 1000, 64)); },
               ErrorCode::invalid_model,
               {"model.onnx", "initializer 'w'", "[1000, 1064)", "past the end", "1024 bytes"});
  expect_error([&] { load_from_dir(dir, external_model("weights.bin", 300, std::nullopt, std::nullopt)); },
               ErrorCode::invalid_model, {"past the end"});
  expect_error([&] { load_from_dir(dir, external_model("weights.bin", 1, INT64_MAX, std::nullopt)); },
               ErrorCode::invalid_model, {"past the end"});
}

TEST(OnnxExternalData, BadKeysAndLengths) {
  auto dir = temp_dir("ext_keys");
  write_file(dir / "weights.bin", weights_bytes());
  expect_error([&] { load_from_dir(dir, external_model("weights.bin", 4, 0, 12)); },
               ErrorCode::invalid_model, {"initializer 'w'", "length 12 disagrees", "f32[4]", "16 bytes"});
  expect_error([&] { load_from_dir(dir, external_model("", 4, 0, 16)); }, ErrorCode::invalid_model,
               {"without a location"});
  auto m = external_model("weights.bin", 4, 0, 16);
  m.mutable_graph()->mutable_initializer(0)->mutable_external_data(1)->set_value("-8");
  expect_error([&] { load_from_dir(dir, m); }, ErrorCode::invalid_model,
               {"external data offset", "'-8'", "not a non-negative integer"});
  auto m2 = external_model("weights.bin", 4, 0, 16);
  m2.mutable_graph()->mutable_initializer(0)->add_float_data(1);
  expect_error([&] { load_from_dir(dir, m2); }, ErrorCode::invalid_model,
               {"external data and float_data"});
}

TEST(OnnxExternalData, MissingFileIsNotFound) {
  auto dir = temp_dir("ext_missing");
  expect_error([&] { load_from_dir(dir, external_model("nope.bin", 4, 0, 16)); }, ErrorCode::not_found,
               {"model.onnx", "initializer 'w'", "nope.bin"});
}

TEST(OnnxExternalData, ForbiddenWhenLoadedFromMemory) {
  expect_load_error(external_model("weights.bin", 4, 0, 16), ErrorCode::invalid_model,
                    {"test.onnx", "initializer 'w'", "loaded from memory"});
}

TEST(OnnxExternalData, SharedFileIsMappedOnce) {
  auto dir = temp_dir("ext_shared");
  write_file(dir / "weights.bin", weights_bytes());
  auto m = external_model("weights.bin", 16, 0, 64);
  auto* t2 = m.mutable_graph()->add_initializer();
  *t2 = m.graph().initializer(0);
  t2->set_name("w2");
  t2->mutable_external_data(1)->set_value("128");
  add_node(m.mutable_graph(), "Identity", {"w2"}, {"y2"});
  add_output(m.mutable_graph(), "y2", {16});
  Model model = load_from_dir(dir, m);
  const Tensor& a = model.graph.initializers.at("w");
  const Tensor& b = model.graph.initializers.at("w2");
  EXPECT_EQ(static_cast<const float*>(b.raw_data())[0], 32.f);
  EXPECT_EQ(static_cast<const uint8_t*>(b.raw_data()) - static_cast<const uint8_t*>(a.raw_data()), 128);
}
