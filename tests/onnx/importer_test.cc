#include <cstring>

#include "onnx/onnx_test_util.h"
#include "slim/core/half.h"

using namespace slim;
using namespace slim::test;
using TP = onnx::TensorProto;

namespace {

// A model whose only initializer is `t` (named "w"), read by an Identity node.
onnx::ModelProto model_with_tensor(const TP& t) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  *g->add_initializer() = t;
  g->mutable_initializer(0)->set_name("w");
  add_node(g, "Identity", {"w"}, {"y"}, "id");
  add_output(g, "y");
  return m;
}

Tensor load_tensor(const TP& t) {
  Model m = load(model_with_tensor(t));
  return m.graph.initializers.at("w");
}

TP tensor_proto(int type, const std::vector<int64_t>& dims) {
  TP t;
  t.set_data_type(type);
  for (int64_t d : dims) t.add_dims(d);
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  std::vector<T> out(size_t(t.numel()));
  std::memcpy(out.data(), t.raw_data(), t.nbytes());
  return out;
}

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

// ---- tensor data encodings ----------------------------------------------------------

TEST(OnnxTensorData, FloatData) {
  TP t = tensor_proto(TP::FLOAT, {2, 2});
  for (float v : {1.5f, -2.f, 0.f, 3.25f}) t.add_float_data(v);
  Tensor w = load_tensor(t);
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.shape(), (Shape{2, 2}));
  EXPECT_EQ(values_of<float>(w), (std::vector<float>{1.5f, -2.f, 0.f, 3.25f}));
}

TEST(OnnxTensorData, DoubleInt64Uint64Data) {
  TP d = tensor_proto(TP::DOUBLE, {3});
  for (double v : {1e300, -0.5, 7.0}) d.add_double_data(v);
  EXPECT_EQ(values_of<double>(load_tensor(d)), (std::vector<double>{1e300, -0.5, 7.0}));

  TP i = tensor_proto(TP::INT64, {2});
  i.add_int64_data(INT64_MIN);
  i.add_int64_data(42);
  Tensor ti = load_tensor(i);
  EXPECT_EQ(ti.dtype(), DType::i64);
  EXPECT_EQ(values_of<int64_t>(ti), (std::vector<int64_t>{INT64_MIN, 42}));

  TP u = tensor_proto(TP::UINT64, {2});
  u.add_uint64_data(UINT64_MAX);
  u.add_uint64_data(1);
  EXPECT_EQ(values_of<uint64_t>(load_tensor(u)), (std::vector<uint64_t>{UINT64_MAX, 1}));

  TP u32 = tensor_proto(TP::UINT32, {2});
  u32.add_uint64_data(4294967295u);
  u32.add_uint64_data(3);
  Tensor tu = load_tensor(u32);
  EXPECT_EQ(tu.dtype(), DType::u32);
  EXPECT_EQ(values_of<uint32_t>(tu), (std::vector<uint32_t>{4294967295u, 3}));
}

TEST(OnnxTensorData, Int32DataForNarrowTypes) {
  TP i32 = tensor_proto(TP::INT32, {2});
  i32.add_int32_data(INT32_MIN);
  i32.add_int32_data(INT32_MAX);
  EXPECT_EQ(values_of<int32_t>(load_tensor(i32)), (std::vector<int32_t>{INT32_MIN, INT32_MAX}));

  TP i8 = tensor_proto(TP::INT8, {3});
  for (int v : {-128, 0, 127}) i8.add_int32_data(v);
  Tensor t8 = load_tensor(i8);
  EXPECT_EQ(t8.dtype(), DType::i8);
  EXPECT_EQ(values_of<int8_t>(t8), (std::vector<int8_t>{-128, 0, 127}));

  TP u8 = tensor_proto(TP::UINT8, {2});
  for (int v : {0, 255}) u8.add_int32_data(v);
  EXPECT_EQ(values_of<uint8_t>(load_tensor(u8)), (std::vector<uint8_t>{0, 255}));

  TP i16 = tensor_proto(TP::INT16, {2});
  for (int v : {-32768, 32767}) i16.add_int32_data(v);
  EXPECT_EQ(values_of<int16_t>(load_tensor(i16)), (std::vector<int16_t>{-32768, 32767}));

  TP u16 = tensor_proto(TP::UINT16, {2});
  for (int v : {0, 65535}) u16.add_int32_data(v);
  EXPECT_EQ(values_of<uint16_t>(load_tensor(u16)), (std::vector<uint16_t>{0, 65535}));

  TP b = tensor_proto(TP::BOOL, {3});
  for (int v : {1, 0, 1}) b.add_int32_data(v);
  Tensor tb = load_tensor(b);
  EXPECT_EQ(tb.dtype(), DType::boolean);
  EXPECT_EQ(values_of<uint8_t>(tb), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(OnnxTensorData, HalfAndBfloat16BitsInInt32Data) {
  const std::vector<float> vals = {1.0f, -2.5f, 65504.f, 0.0001f};
  TP h = tensor_proto(TP::FLOAT16, {4});
  for (float v : vals) h.add_int32_data(f32_to_f16(v));
  Tensor th = load_tensor(h);
  EXPECT_EQ(th.dtype(), DType::f16);
  auto hb = values_of<uint16_t>(th);
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(hb[i], f32_to_f16(vals[i]));
  EXPECT_EQ(f16_to_f32(hb[1]), -2.5f);

  TP bf = tensor_proto(TP::BFLOAT16, {4});
  for (float v : vals) bf.add_int32_data(f32_to_bf16(v));
  Tensor tbf = load_tensor(bf);
  EXPECT_EQ(tbf.dtype(), DType::bf16);
  auto bb = values_of<uint16_t>(tbf);
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(bb[i], f32_to_bf16(vals[i]));
  EXPECT_EQ(bf16_to_f32(bb[0]), 1.0f);
}

TEST(OnnxTensorData, RawDataEveryDtype) {
  struct Case {
    int type;
    DType dtype;
    std::string bytes;
  };
  std::vector<Case> cases = {
      {TP::FLOAT, DType::f32, raw_bytes<float>({1.f, -1.f, 0.5f})},
      {TP::DOUBLE, DType::f64, raw_bytes<double>({1.0, 2.0, -3.0})},
      {TP::FLOAT16, DType::f16, raw_bytes<uint16_t>({f32_to_f16(1), f32_to_f16(2), f32_to_f16(-3)})},
      {TP::BFLOAT16, DType::bf16, raw_bytes<uint16_t>({f32_to_bf16(1), f32_to_bf16(2), 0})},
      {TP::INT8, DType::i8, raw_bytes<int8_t>({-1, 2, -3})},
      {TP::UINT8, DType::u8, raw_bytes<uint8_t>({1, 200, 3})},
      {TP::INT16, DType::i16, raw_bytes<int16_t>({-1000, 2, 3})},
      {TP::UINT16, DType::u16, raw_bytes<uint16_t>({60000, 2, 3})},
      {TP::INT32, DType::i32, raw_bytes<int32_t>({-100000, 2, 3})},
      {TP::UINT32, DType::u32, raw_bytes<uint32_t>({4000000000u, 2, 3})},
      {TP::INT64, DType::i64, raw_bytes<int64_t>({-(int64_t(1) << 40), 2, 3})},
      {TP::UINT64, DType::u64, raw_bytes<uint64_t>({uint64_t(1) << 63, 2, 3})},
      {TP::BOOL, DType::boolean, raw_bytes<uint8_t>({1, 0, 1})},
  };
  for (const auto& c : cases) {
    TP t = tensor_proto(c.type, {3});
    t.set_raw_data(c.bytes);
    Tensor w = load_tensor(t);
    EXPECT_EQ(w.dtype(), c.dtype) << dtype_name(c.dtype);
    EXPECT_EQ(w.shape(), (Shape{3}));
    ASSERT_EQ(w.nbytes(), c.bytes.size());
    EXPECT_EQ(std::memcmp(w.raw_data(), c.bytes.data(), c.bytes.size()), 0) << dtype_name(c.dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w.raw_data()) % kTensorAlignment, 0u);
  }
}

TEST(OnnxTensorData, RawBoolNonzeroBytesBecomeOne) {
  TP t = tensor_proto(TP::BOOL, {3});
  t.set_raw_data(std::string("\x00\x07\x01", 3));
  EXPECT_EQ(values_of<uint8_t>(load_tensor(t)), (std::vector<uint8_t>{0, 1, 1}));
}

TEST(OnnxTensorData, ScalarAndEmptyTensors) {
  TP s = tensor_proto(TP::FLOAT, {});
  s.add_float_data(4.5f);
  Tensor ts = load_tensor(s);
  EXPECT_EQ(ts.rank(), 0);
  EXPECT_EQ(values_of<float>(ts), (std::vector<float>{4.5f}));

  TP e = tensor_proto(TP::INT64, {0, 3});
  Tensor te = load_tensor(e);
  EXPECT_EQ(te.shape(), (Shape{0, 3}));
  EXPECT_EQ(te.numel(), 0);
}

TEST(OnnxTensorData, SizeMismatchesAreInvalidModel) {
  TP raw = tensor_proto(TP::FLOAT, {2, 3});
  raw.set_raw_data(std::string(20, '\0'));
  expect_load_error(model_with_tensor(raw), ErrorCode::invalid_model,
                    {"test.onnx", "initializer 'w'", "raw_data has 20 bytes", "f32[2,3] needs 24"});

  TP typed = tensor_proto(TP::INT64, {4});
  typed.add_int64_data(1);
  expect_load_error(model_with_tensor(typed), ErrorCode::invalid_model,
                    {"initializer 'w'", "int64_data has 1 values", "needs 4"});

  TP none = tensor_proto(TP::FLOAT, {2});
  expect_load_error(model_with_tensor(none), ErrorCode::invalid_model,
                    {"initializer 'w'", "has no data"});

  TP neg = tensor_proto(TP::FLOAT, {-1, 2});
  expect_load_error(model_with_tensor(neg), ErrorCode::invalid_model,
                    {"initializer 'w'", "negative dimension -1"});

  TP huge = tensor_proto(TP::FLOAT, {int64_t(1) << 40, int64_t(1) << 40});
  huge.add_float_data(1);
  expect_load_error(model_with_tensor(huge), ErrorCode::invalid_model,
                    {"initializer 'w'", "too large"});
}

TEST(OnnxTensorData, WrongOrConflictingFieldsAreInvalidModel) {
  TP wrong = tensor_proto(TP::FLOAT, {1});
  wrong.add_int64_data(1);
  expect_load_error(model_with_tensor(wrong), ErrorCode::invalid_model,
                    {"initializer 'w'", "float but stores its values in int64_data"});

  TP both = tensor_proto(TP::FLOAT, {1});
  both.add_float_data(1);
  both.set_raw_data(std::string(4, '\0'));
  expect_load_error(model_with_tensor(both), ErrorCode::invalid_model,
                    {"both raw_data and float_data"});

  TP two = tensor_proto(TP::FLOAT, {1});
  two.add_float_data(1);
  two.add_double_data(1);
  expect_load_error(model_with_tensor(two), ErrorCode::invalid_model,
                    {"both float_data and double_data"});
}

TEST(OnnxTensorData, OutOfRangeNarrowValuesAreInvalidModel) {
  TP i8 = tensor_proto(TP::INT8, {2});
  i8.add_int32_data(1);
  i8.add_int32_data(200);
  expect_load_error(model_with_tensor(i8), ErrorCode::invalid_model,
                    {"initializer 'w'", "int32_data[1] = 200", "out of range for i8"});

  TP b = tensor_proto(TP::BOOL, {1});
  b.add_int32_data(2);
  expect_load_error(model_with_tensor(b), ErrorCode::invalid_model, {"out of range for bool"});

  TP h = tensor_proto(TP::FLOAT16, {1});
  h.add_int32_data(70000);
  expect_load_error(model_with_tensor(h), ErrorCode::invalid_model, {"out of range for f16"});

  TP u32 = tensor_proto(TP::UINT32, {1});
  u32.add_uint64_data(uint64_t(1) << 32);
  expect_load_error(model_with_tensor(u32), ErrorCode::invalid_model, {"out of range for u32"});
}

TEST(OnnxTensorData, UnsupportedTypesNameTheTensor) {
  TP s = tensor_proto(TP::STRING, {1});
  s.add_string_data("hello");
  expect_load_error(model_with_tensor(s), ErrorCode::unsupported,
                    {"test.onnx", "initializer 'w'", "type string"});

  TP c = tensor_proto(TP::COMPLEX64, {1});
  c.add_float_data(1);
  c.add_float_data(2);
  expect_load_error(model_with_tensor(c), ErrorCode::unsupported, {"initializer 'w'", "complex64"});

  TP f8 = tensor_proto(17, {1});  // FLOAT8E4M3FN, newer than Debian's protos
  f8.set_raw_data(std::string(1, '\0'));
  expect_load_error(model_with_tensor(f8), ErrorCode::unsupported, {"initializer 'w'", "float8e4m3fn"});

  TP unknown = tensor_proto(99, {1});
  expect_load_error(model_with_tensor(unknown), ErrorCode::invalid_model,
                    {"initializer 'w'", "unknown data type 99"});

  TP undefined = tensor_proto(TP::UNDEFINED, {1});
  expect_load_error(model_with_tensor(undefined), ErrorCode::invalid_model,
                    {"initializer 'w'", "no data type"});
}

TEST(OnnxTensorData, SegmentedTensorsAreUnsupported) {
  TP t = tensor_proto(TP::FLOAT, {1});
  t.add_float_data(1);
  t.mutable_segment()->set_begin(0);
  t.mutable_segment()->set_end(1);
  expect_load_error(model_with_tensor(t), ErrorCode::unsupported, {"initializer 'w'", "segments"});
}

TEST(OnnxTensorData, SparseInitializerIsDensified) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* sp = g->add_sparse_initializer();
  sp->add_dims(2);
  sp->add_dims(3);
  auto* vals = sp->mutable_values();
  vals->set_name("s");
  vals->set_data_type(TP::FLOAT);
  vals->add_dims(2);
  vals->add_float_data(5);
  vals->add_float_data(7);
  auto* idx = sp->mutable_indices();
  idx->set_data_type(TP::INT64);
  idx->add_dims(2);
  idx->add_int64_data(1);
  idx->add_int64_data(5);
  add_node(g, "Identity", {"s"}, {"y"});
  add_output(g, "y");
  Model model = load(m);
  Tensor s = model.graph.initializers.at("s");
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of<float>(s), (std::vector<float>{0, 5, 0, 0, 0, 7}));

  // Per-dimension coordinates, and an index outside the shape.
  idx->clear_dims();
  idx->clear_int64_data();
  idx->add_dims(2);
  idx->add_dims(2);
  for (int64_t v : {0, 2, 1, 0}) idx->add_int64_data(v);
  Tensor s2 = load(m).graph.initializers.at("s");
  EXPECT_EQ(values_of<float>(s2), (std::vector<float>{0, 0, 5, 7, 0, 0}));
  idx->set_int64_data(1, 3);
  expect_load_error(m, ErrorCode::invalid_model, {"sparse initializer 's'", "outside dimension 1"});
}

// ---- Constant nodes and attributes ------------------------------------------------

TEST(OnnxImporter, ConstantNodesKeepTheirValueAttribute) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* c1 = add_node(g, "Constant", {}, {"a"}, "c_float");
  auto* a1 = c1->add_attribute();
  a1->set_name("value_float");
  a1->set_type(onnx::AttributeProto::FLOAT);
  a1->set_f(2.5f);
  auto* c2 = add_node(g, "Constant", {}, {"b"}, "c_ints");
  auto* a2 = c2->add_attribute();
  a2->set_name("value_ints");
  a2->set_type(onnx::AttributeProto::INTS);
  a2->add_ints(3);
  a2->add_ints(-4);
  auto* c3 = add_node(g, "Constant", {}, {"c"}, "c_tensor");
  auto* a3 = c3->add_attribute();
  a3->set_name("value");
  a3->set_type(onnx::AttributeProto::TENSOR);
  a3->mutable_t()->set_data_type(TP::INT64);
  a3->mutable_t()->add_dims(1);
  a3->mutable_t()->add_int64_data(9);
  auto* c4 = add_node(g, "Constant", {}, {"d"}, "c_string");
  auto* a4 = c4->add_attribute();
  a4->set_name("value_string");
  a4->set_type(onnx::AttributeProto::STRING);
  a4->set_s("hi");
  add_node(g, "Concat", {"a", "b", "c", "d"}, {"y"}, "cat");
  add_output(g, "y");
  Model model = load(m);
  ASSERT_EQ(model.graph.nodes.size(), 5u);
  EXPECT_EQ(model.graph.nodes[0].op_type, "Constant");
  EXPECT_EQ(model.graph.nodes[0].attr_float("value_float", 0), 2.5f);
  EXPECT_EQ(model.graph.nodes[1].attr_ints("value_ints"), (std::vector<int64_t>{3, -4}));
  const Tensor* t = model.graph.nodes[2].attr_tensor("value");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(values_of<int64_t>(*t), (std::vector<int64_t>{9}));
  EXPECT_EQ(model.graph.nodes[3].attr_string("value_string", ""), "hi");

  // Two values on one Constant is malformed.
  auto* extra = c1->add_attribute();
  extra->set_name("value_int");
  extra->set_type(onnx::AttributeProto::INT);
  extra->set_i(1);
  expect_load_error(m, ErrorCode::invalid_model,
                    {"Constant node 'c_float'", "exactly one value attribute, has 2"});
}

TEST(OnnxImporter, ConstantSparseValueBecomesDenseValue) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* c = add_node(g, "Constant", {}, {"y"}, "c");
  auto* a = c->add_attribute();
  a->set_name("sparse_value");
  a->set_type(onnx::AttributeProto::SPARSE_TENSOR);
  auto* sp = a->mutable_sparse_tensor();
  sp->add_dims(4);
  sp->mutable_values()->set_data_type(TP::INT32);
  sp->mutable_values()->add_dims(1);
  sp->mutable_values()->add_int32_data(-6);
  sp->mutable_indices()->set_data_type(TP::INT64);
  sp->mutable_indices()->add_dims(1);
  sp->mutable_indices()->add_int64_data(2);
  add_output(g, "y");
  Model model = load(m);
  const Tensor* t = model.graph.nodes[0].attr_tensor("value");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(values_of<int32_t>(*t), (std::vector<int32_t>{0, 0, -6, 0}));
  EXPECT_FALSE(model.graph.nodes[0].has_attr("sparse_value"));
}

TEST(OnnxImporter, AttributesOfEveryKind) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  auto* n = add_node(g, "Custom", {"x"}, {"y"}, "n");
  n->set_domain("com.microsoft");
  auto* op = m.add_opset_import();
  op->set_domain("com.microsoft");
  op->set_version(1);
  using AP = onnx::AttributeProto;
  auto add = [&](const std::string& name, AP::AttributeType type) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  add("f", AP::FLOAT)->set_f(0.25f);
  add("i", AP::INT)->set_i(-7);
  add("s", AP::STRING)->set_s(std::string("a\0b", 3));
  auto* t = add("t", AP::TENSOR)->mutable_t();
  t->set_data_type(TP::FLOAT);
  t->add_float_data(1.f);
  auto* fs = add("fs", AP::FLOATS);
  fs->add_floats(1.f);
  fs->add_floats(2.f);
  auto* is = add("is", AP::INTS);
  is->add_ints(5);
  auto* ss = add("ss", AP::STRINGS);
  ss->add_strings("p");
  ss->add_strings("q");
  auto* ts = add("ts", AP::TENSORS);
  for (int k = 0; k < 2; ++k) {
    auto* tt = ts->add_tensors();
    tt->set_data_type(TP::INT8);
    tt->add_int32_data(k);
  }
  auto* gs = add("gs", AP::GRAPHS);
  for (int k = 0; k < 2; ++k) {
    auto* sub = gs->add_graphs();
    sub->set_name("sub" + std::to_string(k));
    add_node(sub, "Identity", {"x"}, {"z" + std::to_string(k)});
    add_output(sub, "z" + std::to_string(k));
  }
  // Before IR version 2 attributes carried no type; the set field decides.
  auto* legacy = n->add_attribute();
  legacy->set_name("legacy");
  legacy->set_i(11);
  add_output(g, "y");

  Model model = load(m);
  const Node& node = model.graph.nodes[0];
  EXPECT_EQ(node.domain, "com.microsoft");
  EXPECT_EQ(node.attr_float("f", 0), 0.25f);
  EXPECT_EQ(node.attr_int("i", 0), -7);
  EXPECT_EQ(node.attr_string("s", ""), std::string("a\0b", 3));
  EXPECT_EQ(values_of<float>(*node.attr_tensor("t")), std::vector<float>{1.f});
  EXPECT_EQ(node.attr_floats("fs"), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(node.attr_ints("is"), std::vector<int64_t>{5});
  EXPECT_EQ(node.attr_strings("ss"), (std::vector<std::string>{"p", "q"}));
  ASSERT_EQ(node.attr("ts")->tensors.size(), 2u);
  EXPECT_EQ(node.attr("ts")->tensors[1].dtype(), DType::i8);
  EXPECT_EQ(values_of<int8_t>(node.attr("ts")->tensors[1]), std::vector<int8_t>{1});
  ASSERT_EQ(node.attr("gs")->graphs.size(), 2u);
  EXPECT_EQ(node.attr("gs")->graphs[1]->name, "sub1");
  EXPECT_EQ(node.attr("gs")->graphs[1]->nodes[0].inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(node.attr_int("legacy", 0), 11);
  EXPECT_EQ(node.attr("legacy")->kind, Attribute::Kind::i);
}

TEST(OnnxImporter, BadAttributes) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  auto* n = add_node(g, "Relu", {"x"}, {"y"}, "r");
  add_output(g, "y");
  auto* a = n->add_attribute();
  a->set_name("alpha");
  expect_load_error(m, ErrorCode::invalid_model, {"Relu node 'r'", "attribute 'alpha'", "neither a type nor a value"});
  a->set_type(onnx::AttributeProto::FLOAT);
  auto* b = n->add_attribute();
  *b = *a;
  expect_load_error(m, ErrorCode::invalid_model, {"Relu node 'r'", "attribute 'alpha' twice"});
  b->set_name("beta");
  b->set_ref_attr_name("outer");
  expect_load_error(m, ErrorCode::invalid_model, {"attribute 'beta'", "function attribute 'outer'"});
  b->clear_ref_attr_name();
  b->set_type(onnx::AttributeProto::TYPE_PROTO);
  expect_load_error(m, ErrorCode::invalid_model, {"attribute 'beta'", "a type attribute without a type"});
}

// ---- graph structure -----------------------------------------------------------------

TEST(OnnxImporter, InputsOutputsSymbolicDimsAndOverridableInputs) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* x = add_input(g, "x", {});
  auto* shape = x->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->add_dim()->set_dim_param("batch");
  shape->add_dim()->set_dim_value(3);
  shape->add_dim();  // neither value nor name: unknown
  shape->add_dim()->set_dim_value(-1);  // "any size" from some converters: unknown
  add_input(g, "bias", {3});
  add_initializer(g, "bias", {3}, {1, 2, 3});
  add_initializer(g, "scale", {3}, {4, 5, 6});
  add_node(g, "Add", {"x", "bias"}, {"t"});
  add_node(g, "Mul", {"t", "scale"}, {"y"});
  add_output(g, "y", {})->mutable_type()->mutable_tensor_type()->clear_shape();
  Model model = load(m);
  ASSERT_EQ(model.graph.inputs.size(), 1u);
  const ValueInfo& xi = model.graph.inputs[0];
  EXPECT_EQ(xi.name, "x");
  EXPECT_EQ(xi.dtype, DType::f32);
  EXPECT_EQ(xi.onnx_type, "float");
  ASSERT_TRUE(xi.shape);
  ASSERT_EQ(xi.shape->size(), 4u);
  EXPECT_EQ((*xi.shape)[0].param, "batch");
  EXPECT_FALSE((*xi.shape)[0].is_fixed());
  EXPECT_EQ((*xi.shape)[1].value, 3);
  EXPECT_FALSE((*xi.shape)[2].is_fixed());
  EXPECT_EQ((*xi.shape)[2].param, "");
  EXPECT_FALSE((*xi.shape)[3].is_fixed());
  EXPECT_EQ(xi.describe(), "f32[batch,3,?,?]");
  EXPECT_FALSE(xi.static_shape());
  ASSERT_EQ(model.graph.overridable_inputs.size(), 1u);
  EXPECT_EQ(model.graph.overridable_inputs[0].name, "bias");
  EXPECT_EQ(model.graph.initializers.size(), 2u);
  ASSERT_EQ(model.graph.outputs.size(), 1u);
  EXPECT_FALSE(model.graph.outputs[0].shape);
  // Unnamed nodes are named after their op and index.
  EXPECT_EQ(model.graph.nodes[0].name, "Add_0");
  EXPECT_EQ(model.graph.nodes[1].name, "Mul_1");
  EXPECT_EQ(model.producer_name, "slim-test");
  EXPECT_EQ(model.ir_version, 8);
}

TEST(OnnxImporter, GeneratedNamesDoNotCollide) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"a"}, "Relu_1");
  add_node(g, "Relu", {"a"}, {"y"});
  add_output(g, "y");
  Model model = load(m);
  EXPECT_EQ(model.graph.nodes[0].name, "Relu_1");
  EXPECT_EQ(model.graph.nodes[1].name, "Relu_1_1");
}

TEST(OnnxImporter, NonTensorValueTypesKeepTheirOnnxType) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  auto* s = g->add_input();
  s->set_name("seq");
  s->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(TP::INT64);
  add_input(g, "str", {2}, TP::STRING);
  add_node(g, "SequenceLength", {"seq"}, {"n"});
  add_node(g, "Identity", {"str"}, {"y"});
  add_output(g, "n", {}, TP::INT64);
  add_output(g, "y", {2}, TP::STRING);
  Model model = load(m);
  EXPECT_EQ(model.graph.inputs[0].onnx_type, "seq(tensor(int64))");
  EXPECT_FALSE(model.graph.inputs[0].dtype);
  EXPECT_EQ(model.graph.inputs[1].onnx_type, "string");
  EXPECT_FALSE(model.graph.inputs[1].dtype);
}

TEST(OnnxImporter, OpsetImportsPerDomain) {
  auto m = make_model(13);
  auto* op = m.add_opset_import();
  op->set_domain("ai.onnx.ml");
  op->set_version(3);
  auto* g = m.mutable_graph();
  add_input(g, "x");
  auto* n = add_node(g, "Relu", {"x"}, {"y"}, "r");
  n->set_domain("ai.onnx");
  add_output(g, "y");
  Model model = load(m);
  EXPECT_EQ(model.opset(""), 13);
  EXPECT_EQ(model.opset("ai.onnx.ml"), 3);
  EXPECT_EQ(model.opset("com.microsoft"), 0);
  EXPECT_EQ(model.graph.nodes[0].domain, "");

  m.mutable_opset_import(0)->set_domain("ai.onnx");
  EXPECT_EQ(load(m).opset(""), 13);

  auto* dup = m.add_opset_import();
  dup->set_domain("");
  dup->set_version(11);
  expect_load_error(m, ErrorCode::invalid_model, {"test.onnx", "domain 'ai.onnx' is imported twice"});
  m.mutable_opset_import()->RemoveLast();
  m.mutable_opset_import(1)->set_version(0);
  expect_load_error(m, ErrorCode::invalid_model, {"opset import of 'ai.onnx.ml'", "invalid version 0"});
}

TEST(OnnxImporter, OldIrVersionWithoutOpsetImportMeansOpset1) {
  auto m = make_model();
  m.clear_opset_import();
  m.set_ir_version(2);
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"});
  add_output(g, "y");
  EXPECT_EQ(load(m).opset(""), 1);
  m.set_ir_version(7);
  expect_load_error(m, ErrorCode::invalid_model, {"Relu node 'Relu_0'", "imports no opset"});
}

TEST(OnnxImporter, UnknownDomainsAreInvalid) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Frob", {"x"}, {"y"}, "f")->set_domain("com.example");
  add_output(g, "y");
  expect_load_error(m, ErrorCode::invalid_model, {"test.onnx", "Frob node 'f'", "unknown domain 'com.example'"});
  for (const char* d : {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft"})
    EXPECT_TRUE(is_known_onnx_domain(d)) << d;
  EXPECT_FALSE(is_known_onnx_domain("com.example"));
}

TEST(OnnxValidation, UndefinedInput) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Add", {"x", "ghost"}, {"y"}, "add1");
  add_output(g, "y");
  expect_load_error(m, ErrorCode::invalid_model,
                    {"test.onnx", "Add node 'add1'", "input 'ghost'", "not defined"});
}

TEST(OnnxValidation, OptionalEmptyInputsAreFine) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Clip", {"x", "", ""}, {"y"}, "clip");
  add_output(g, "y");
  Model model = load(m);
  EXPECT_EQ(model.graph.nodes[0].num_present_inputs(), 1);
}

TEST(OnnxValidation, DuplicateProducers) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"}, "first");
  add_node(g, "Neg", {"x"}, {"y"}, "second");
  add_output(g, "y");
  expect_load_error(m, ErrorCode::invalid_model,
                    {"test.onnx", "value 'y' is produced twice", "Relu node 'first'", "Neg node 'second'"});

  auto m2 = make_model();
  auto* g2 = m2.mutable_graph();
  add_input(g2, "x");
  add_node(g2, "Relu", {"x"}, {"x"}, "inplace");
  add_output(g2, "x");
  expect_load_error(m2, ErrorCode::invalid_model,
                    {"Relu node 'inplace'", "output 'x'", "also a graph input"});
}

TEST(OnnxValidation, Cycles) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Add", {"x", "c"}, {"a"}, "n_a");
  add_node(g, "Relu", {"a"}, {"b"}, "n_b");
  add_node(g, "Neg", {"b"}, {"c"}, "n_c");
  add_output(g, "c");
  expect_load_error(m, ErrorCode::invalid_model, {"test.onnx", "cycle through 3 nodes", "Add node 'n_a'"});

  auto m2 = make_model();
  auto* g2 = m2.mutable_graph();
  add_node(g2, "Relu", {"s"}, {"s"}, "self");
  add_output(g2, "s");
  expect_load_error(m2, ErrorCode::invalid_model, {"Relu node 'self'", "its own output"});
}

TEST(OnnxValidation, OutputsNobodyProduces) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"}, "r");
  add_output(g, "y");
  add_output(g, "z");
  expect_load_error(m, ErrorCode::invalid_model, {"test.onnx", "graph output 'z' is not produced"});
  // A graph input may be passed straight through as an output.
  m.mutable_graph()->mutable_output()->RemoveLast();
  add_output(m.mutable_graph(), "x");
  EXPECT_EQ(load(m).graph.outputs.size(), 2u);
}

TEST(OnnxValidation, DuplicatesAndNamelessValues) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"});
  add_output(g, "y");
  expect_load_error(m, ErrorCode::invalid_model, {"graph input 'x' is listed twice"});
  g->mutable_input()->RemoveLast();
  add_initializer(g, "w", {1}, {1});
  add_initializer(g, "w", {1}, {2});
  expect_load_error(m, ErrorCode::invalid_model, {"initializer 'w' is defined twice"});
  g->mutable_initializer()->RemoveLast();
  g->mutable_initializer(0)->clear_name();
  expect_load_error(m, ErrorCode::invalid_model, {"initializer 0 has no name"});
  g->mutable_initializer(0)->set_name("w");
  g->mutable_node(0)->clear_op_type();
  expect_load_error(m, ErrorCode::invalid_model, {"has no op_type"});
}

TEST(OnnxValidation, TopologicalOrderIsStable) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  // File order: d(c), b(x), c(b), a(x), e(a,d). Valid order keeping file order where
  // possible: b, c, d, a, e -> indices 1, 2, 0, 3, 4.
  add_node(g, "Relu", {"c"}, {"d"}, "d");
  add_node(g, "Relu", {"x"}, {"b"}, "b");
  add_node(g, "Relu", {"b"}, {"c"}, "c");
  add_node(g, "Relu", {"x"}, {"a"}, "a");
  add_node(g, "Add", {"a", "d"}, {"y"}, "e");
  add_output(g, "y");
  Model model = load(m);
  EXPECT_EQ(validate_graph(model.graph, "t"), (std::vector<size_t>{1, 2, 0, 3, 4}));

  // Already sorted: file order is kept exactly.
  auto m2 = make_model();
  auto* g2 = m2.mutable_graph();
  add_input(g2, "x");
  add_node(g2, "Relu", {"x"}, {"p"});
  add_node(g2, "Neg", {"x"}, {"q"});
  add_node(g2, "Add", {"p", "q"}, {"y"});
  add_output(g2, "y");
  EXPECT_EQ(validate_graph(load(m2).graph, "t"), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(validate_graph(Graph{}, "empty"), std::vector<size_t>{});
}

namespace {
// y = If(cond) then (x_outer + 1 via inner node) else (x_outer); the inner graphs read
// `h`, produced by an outer node that comes after the If in the file.
onnx::ModelProto model_with_if(bool define_h) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "cond", {}, TP::BOOL);
  add_input(g, "x");
  auto* if_node = add_node(g, "If", {"cond"}, {"y"}, "branch");
  using AP = onnx::AttributeProto;
  auto* then_a = if_node->add_attribute();
  then_a->set_name("then_branch");
  then_a->set_type(AP::GRAPH);
  auto* tg = then_a->mutable_g();
  tg->set_name("then");
  add_node(tg, "Neg", {"h"}, {"t_out"}, "inner_neg");
  add_output(tg, "t_out");
  auto* else_a = if_node->add_attribute();
  else_a->set_name("else_branch");
  else_a->set_type(AP::GRAPH);
  auto* eg = else_a->mutable_g();
  eg->set_name("else");
  add_output(eg, "h");  // an outer value as the branch's output
  if (define_h) add_node(g, "Relu", {"x"}, {"h"}, "make_h");
  add_output(g, "y");
  return m;
}
}  // namespace

TEST(OnnxValidation, SubgraphOuterScopeValuesCountAsUses) {
  Model model = load(model_with_if(true));
  ASSERT_EQ(model.graph.nodes.size(), 2u);
  const Attribute* then_branch = model.graph.nodes[0].attr("then_branch");
  ASSERT_TRUE(then_branch && then_branch->g);
  EXPECT_EQ(then_branch->g->nodes[0].name, "inner_neg");
  // make_h (index 1) must run before the If (index 0), though the If comes first.
  EXPECT_EQ(validate_graph(model.graph, "t"), (std::vector<size_t>{1, 0}));

  expect_load_error(model_with_if(false), ErrorCode::invalid_model,
                    {"test.onnx", "If node 'branch'", "'h'", "not defined"});
}

TEST(OnnxValidation, ErrorsInsideSubgraphsNameTheScope) {
  auto m = model_with_if(true);
  auto* tg = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
  add_node(tg, "Relu", {"t_out"}, {"t_out"}, "dup");
  expect_load_error(m, ErrorCode::invalid_model,
                    {"test.onnx", "If node 'branch'", "then_branch", "'t_out' is produced twice"});
}

// ---- bytes that are not a model --------------------------------------------------------

TEST(OnnxImporter, GarbageAndTruncatedBytes) {
  expect_error([] { OnnxImporter::load_bytes("\xff\xff\xff\xff garbage", 13, "junk.onnx", ""); },
               ErrorCode::invalid_model, {"junk.onnx", "cannot parse"});
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_initializer(g, "w", {64}, std::vector<float>(64, 1.f));
  add_node(g, "Add", {"x", "w"}, {"y"});
  add_output(g, "y");
  const std::string bytes = serialize(m);
  expect_error([&] { OnnxImporter::load_bytes(bytes.data(), bytes.size() - 7, "cut.onnx", ""); },
               ErrorCode::invalid_model, {"cut.onnx", "cannot parse"});
  expect_error([] { OnnxImporter::load_bytes("", 0, "empty.onnx", ""); }, ErrorCode::invalid_model,
               {"empty.onnx", "ir_version"});
  auto no_graph = make_model();
  no_graph.clear_graph();
  expect_load_error(no_graph, ErrorCode::invalid_model, {"has no graph"});
}

TEST(OnnxImporter, OverTwoGiBInOneMessageIsRefusedBeforeReading) {
  // Only the size is looked at: protobuf cannot parse a message this large, and the
  // error says how such models are stored instead.
  const char byte = 0;
  expect_error([&] { OnnxImporter::load_bytes(&byte, size_t(1) << 31, "huge.onnx", ""); },
               ErrorCode::invalid_model, {"huge.onnx", "2 GiB", "external data"});
}

TEST(OnnxImporter, MissingFileIsNotFound) {
  expect_error([] { OnnxImporter::load_file("/nonexistent/slim/model.onnx"); }, ErrorCode::not_found,
               {"/nonexistent/slim/model.onnx"});
}

TEST(OnnxImporter, LoadFileRecordsPath) {
  auto dir = temp_dir("load_file");
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"});
  add_output(g, "y");
  write_file(dir / "m.onnx", serialize(m));
  Model model = OnnxImporter::load_file((dir / "m.onnx").string());
  EXPECT_EQ(model.path, (dir / "m.onnx").string());
  EXPECT_EQ(model.graph.nodes.size(), 1u);
}

// The main graph's raw_data is read in place from the file, outside protobuf's parse.
// Protobuf's merge rules still hold: a graph field that appears twice is one graph whose
// initializers are those of both, in order, and of two raw_data fields the last counts.
TEST(OnnxImporter, WeightsReadInPlaceFollowProtobufMergeRules) {
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", {2});
  add_initializer(g, "a", {2}, {1.f, 2.f});  // float_data: parsed by protobuf
  add_node(g, "Add", {"x", "a"}, {"s"});
  add_node(g, "Add", {"s", "b"}, {"y"});
  add_output(g, "y", {2});
  TP first;
  first.set_name("b");
  first.set_data_type(TP::FLOAT);
  first.add_dims(2);
  first.set_raw_data(raw_bytes<float>({7.f, 8.f}));
  TP second;
  second.set_raw_data(raw_bytes<float>({3.f, -4.f}));
  // graph (field 7) { initializer (field 5) { first, then second's raw_data (field 9) } }
  const std::string tensor = first.SerializeAsString() + second.SerializeAsString();
  auto len = [](size_t n) {
    std::string out;
    for (; n >= 0x80; n >>= 7) out.push_back(char(uint8_t(n) | 0x80));
    out.push_back(char(n));
    return out;
  };
  const std::string graph = std::string(1, char(5 << 3 | 2)) + len(tensor.size()) + tensor;
  const std::string bytes = serialize(m) + std::string(1, char(7 << 3 | 2)) + len(graph.size()) + graph;
  onnx::ModelProto parsed;  // protobuf's own reading of these bytes
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.graph().initializer_size(), 2);
  EXPECT_EQ(parsed.graph().initializer(1).raw_data(), raw_bytes<float>({3.f, -4.f}));
  Model model = OnnxImporter::load_bytes(bytes.data(), bytes.size(), "test.onnx", "");
  EXPECT_EQ(values_of<float>(model.graph.initializers.at("a")), (std::vector<float>{1.f, 2.f}));
  const Tensor& b = model.graph.initializers.at("b");
  EXPECT_EQ(values_of<float>(b), (std::vector<float>{3.f, -4.f}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw_data()) % kTensorAlignment, 0u);
  // Cut inside the weights: protobuf's error, whichever way the file is read.
  expect_error([&] { OnnxImporter::load_bytes(bytes.data(), bytes.size() - 3, "test.onnx", ""); },
               ErrorCode::invalid_model, {"test.onnx", "cannot parse"});
}

TEST(OnnxImporter, LargeModelOver64MiB) {
  // Protobuf's default limit is 64 MiB; a 72 MiB initializer must still load.
  auto m = make_model();
  auto* g = m.mutable_graph();
  add_input(g, "x", {18 * 1024 * 1024});
  auto* t = g->add_initializer();
  t->set_name("big");
  t->set_data_type(TP::FLOAT);
  t->add_dims(18 * 1024 * 1024);
  std::string raw(size_t(18) * 1024 * 1024 * 4, '\0');
  std::memcpy(raw.data() + raw.size() - 4, "\x00\x00\x80\x3f", 4);  // last = 1.0f
  t->set_raw_data(std::move(raw));
  add_node(g, "Add", {"x", "big"}, {"y"});
  add_output(g, "y", {18 * 1024 * 1024});
  Model model = load(m);
  const Tensor& big = model.graph.initializers.at("big");
  EXPECT_EQ(big.numel(), 18 * 1024 * 1024);
  EXPECT_EQ(static_cast<const float*>(big.raw_data())[big.numel() - 1], 1.0f);
}
