// OnnxExporter round trips and upgrade_opset: an old model and its upgrade give the same
// outputs, bit for bit, and operators without a rewrite are refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"
#include "slim/onnx/exporter.h"
#include "slim/onnx/importer.h"
#include "slim/onnx/opset_upgrade.h"
#include "slim/runtime/session.h"

using namespace slim;
using slim::forest::testing::env_or;
using slim::forest::testing::fixture_dir;
using slim::forest::testing::read_text;
namespace fs = std::filesystem;

namespace {

std::string fixtures() {
  return fixture_dir("quant_fixtures.py");
}

std::string scratch_file(const std::string& name) {
  const fs::path d =
      fs::path(env_or("SLIM_TEST_TMP", "/tmp")) / ("quant_export_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

TensorMap run(const Model& m, const TensorMap& feeds) {
  SessionOptions o;
  o.providers = {"ref"};
  return Session::compile(m, o)->run(feeds);
}

void expect_same(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.dtype(), u.dtype()) << name;
    const Tensor x = t.contiguous(), y = u.contiguous();
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << name;
  }
}

}  // namespace

TEST(OnnxExporter, RoundTripKeepsTheModel) {
  const std::string src = fixtures() + "/models/cnn.onnx";
  const Model m = OnnxImporter::load_file(src);
  const std::string out = scratch_file("cnn_copy.onnx");
  OnnxExporter::save_file(m, out);
  Model back = OnnxImporter::load_file(out);
  ASSERT_EQ(back.graph.nodes.size(), m.graph.nodes.size());
  for (size_t i = 0; i < m.graph.nodes.size(); ++i) {
    EXPECT_EQ(back.graph.nodes[i].name, m.graph.nodes[i].name);
    EXPECT_EQ(back.graph.nodes[i].inputs, m.graph.nodes[i].inputs);
    EXPECT_EQ(back.graph.nodes[i].attrs.size(), m.graph.nodes[i].attrs.size());
  }
  EXPECT_EQ(back.opsets, m.opsets);
  EXPECT_EQ(back.ir_version, m.ir_version);
  EXPECT_EQ(back.producer_name, "quant_fixtures");
  EXPECT_EQ(back.graph.value_info.size(), 1u);
  const std::string bytes = read_text(out);
  EXPECT_NE(bytes.find("slim tests"), std::string::npos);
  const Tensor x = read_npy(fixtures() + "/models/cnn_held/x.npy").slice(0, 0, 2).contiguous();
  back.path.clear();
  expect_same(run(m, {{"x", x}}), run(back, {{"x", x}}));

  // New nodes are written from the IR, with their attributes; dropped ones disappear.
  Model edited = m;
  auto& nodes = edited.graph.nodes;
  nodes.erase(nodes.begin() + 2);  // relu1
  nodes[2].inputs[0] = "bn1";      // conv2 reads the BatchNorm
  Node lrelu{"leaky", "LeakyRelu", "", {"probs"}, {"y"}, {}};
  lrelu.attrs["alpha"].kind = Attribute::Kind::f;
  lrelu.attrs["alpha"].f = 0.25f;
  nodes.push_back(lrelu);
  edited.graph.outputs = {
      ValueInfo{"y", DType::f32, std::vector<Dim>{Dim{-1, "n"}, Dim{10, ""}}, ""}};
  const std::string out2 = scratch_file("cnn_edited.onnx");
  OnnxExporter::save_file(edited, out2);
  const Model e = OnnxImporter::load_file(out2);
  EXPECT_EQ(e.graph.nodes.size(), m.graph.nodes.size());
  EXPECT_EQ(e.graph.nodes.back().attr_float("alpha", 0), 0.25f);
  EXPECT_EQ(e.graph.outputs[0].describe(), "f32[n,10]");
  for (const auto& n : e.graph.nodes) EXPECT_NE(n.name, "relu1");
}

TEST(OpsetUpgrade, OutputsStayTheSame) {
  const Tensor x = read_npy(fixtures() + "/upgrade/x.npy");
  for (const char* name : {"opset9", "opset11"}) {
    SCOPED_TRACE(name);
    const Model m = OnnxImporter::load_file(fixtures() + "/upgrade/" + name + ".onnx");
    Model up = m;
    upgrade_opset(up, 13);
    EXPECT_EQ(up.opset(""), 13);
    EXPECT_GE(up.ir_version, 7);
    for (const auto& n : up.graph.nodes) {
      EXPECT_NE(n.op_type, "Dropout");
      EXPECT_NE(n.op_type, "Scatter");
      if (n.op_type == "Slice" || n.op_type == "Squeeze" || n.op_type == "Split" ||
          n.op_type == "Clip") {
        EXPECT_TRUE(n.attrs.empty() || n.op_type == "Split") << n.describe();
      }
    }
    expect_same(run(m, {{"x", x}}), run(up, {{"x", x}}));
    // Written out and read back, it is still that model.
    const std::string out = scratch_file(std::string(name) + "_13.onnx");
    OnnxExporter::save_file(up, out);
    Model back = OnnxImporter::load_file(out);
    expect_same(run(m, {{"x", x}}), run(back, {{"x", x}}));
  }
  Model up = OnnxImporter::load_file(fixtures() + "/upgrade/upsample.onnx");
  try {
    upgrade_opset(up, 13);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_EQ(std::string(e.what()),
              fixtures() +
                  "/upgrade/upsample.onnx: cannot raise the opset from 9 to 13: "
                  "Upsample node 'Upsample_0' changed meaning and has no rewrite");
  }
}
