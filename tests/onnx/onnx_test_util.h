// Helpers the ONNX importer tests share: building ModelProtos with the protobuf API,
// serializing them, and asserting on slim::Error codes and messages.
#pragma once

#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "slim/core/error.h"
#include "slim/onnx/importer.h"

namespace slim::test {

// A minimal valid model: opset 17, one graph.
inline onnx::ModelProto make_model(int64_t opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("slim-test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  m.mutable_graph()->set_name("g");
  return m;
}

inline onnx::ValueInfoProto* add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
                                       const std::string& name, int elem_type,
                                       const std::vector<int64_t>& dims) {
  auto* v = list->Add();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
  return v;
}

inline onnx::ValueInfoProto* add_input(onnx::GraphProto* g, const std::string& name,
                                       const std::vector<int64_t>& dims = {2},
                                       int elem_type = onnx::TensorProto::FLOAT) {
  return add_value(g->mutable_input(), name, elem_type, dims);
}

inline onnx::ValueInfoProto* add_output(onnx::GraphProto* g, const std::string& name,
                                        const std::vector<int64_t>& dims = {2},
                                        int elem_type = onnx::TensorProto::FLOAT) {
  return add_value(g->mutable_output(), name, elem_type, dims);
}

inline onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op,
                                 const std::vector<std::string>& inputs,
                                 const std::vector<std::string>& outputs,
                                 const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  if (!name.empty()) n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

inline onnx::TensorProto* add_initializer(onnx::GraphProto* g, const std::string& name,
                                          const std::vector<int64_t>& dims,
                                          const std::vector<float>& values) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  for (float v : values) t->add_float_data(v);
  return t;
}

inline std::string serialize(const onnx::ModelProto& m) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  return bytes;
}

inline Model load(const onnx::ModelProto& m, const std::string& base_dir = "") {
  const std::string bytes = serialize(m);
  return OnnxImporter::load_bytes(bytes.data(), bytes.size(), "test.onnx", base_dir);
}

// Runs fn, expects a slim::Error with `code` whose message contains every fragment.
inline void expect_error(const std::function<void()>& fn, ErrorCode code,
                         const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected " << error_code_name(code) << " error, got none";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
  }
}

inline void expect_load_error(const onnx::ModelProto& m, ErrorCode code,
                              const std::vector<std::string>& fragments,
                              const std::string& base_dir = "") {
  expect_error([&] { load(m, base_dir); }, code, fragments);
}

// A fresh directory for one test's files.
inline std::filesystem::path temp_dir(const std::string& name) {
  const char* env = std::getenv("SLIM_TEST_TMP");
  std::filesystem::path root = env ? env : std::filesystem::temp_directory_path() / "slim_test";
  std::filesystem::path dir = root / "onnx" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

}  // namespace slim::test
