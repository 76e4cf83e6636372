// Sequences and optionals: Session::run_values with sequence inputs and outputs,
// run() refusing them, sequences that outlive the arena bytes of their tensors, and the
// errors of positions out of range.
#include <gtest/gtest.h>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

SessionOptions ref_only() {
  SessionOptions o;
  o.num_threads = 1;
  o.providers = {"ref"};
  return o;
}

ValueInfo sequence_input(const std::string& name) {
  ValueInfo vi;
  vi.name = name;
  vi.onnx_type = "seq(tensor(float))";
  return vi;
}

// y = seq[pos] for a sequence input and a position input.
std::unique_ptr<Session> sequence_at_session() {
  ModelBuilder b;
  b.model().graph.inputs.push_back(sequence_input("seq"));
  b.input("pos", DType::i64, std::vector<DimSpec>{}).output("y");
  b.node("SequenceAt", {"seq", "pos"}, {"y"}, "at");
  return Session::compile(b.build(), ref_only());
}

Value two_items() { return Value::sequence({f32({2}, {1, 2}), f32({1}, {3})}); }

}  // namespace

TEST(Sequences, SequenceAtCountsFromEitherEnd) {
  auto s = sequence_at_session();
  for (auto [pos, want] : {std::pair<int64_t, std::vector<double>>{0, {1, 2}}, {1, {3}}, {-1, {3}}, {-2, {1, 2}}}) {
    ValueMap out = s->run_values({{"seq", two_items()}, {"pos", Tensor::scalar<int64_t>(pos)}});
    EXPECT_EQ(values_of(out.at("y").tensor()), want);
  }
  // run() takes tensors only.
  EXPECT_EQ(error_of([&] { s->run({{"pos", Tensor::scalar<int64_t>(0)}}); }),
            "missing input 'seq' (expected seq(tensor(float)))");
}

TEST(Sequences, PositionsOutOfRangeAreErrors) {
  auto s = sequence_at_session();
  ErrorCode code{};
  EXPECT_EQ(error_of([&] { s->run_values({{"seq", two_items()}, {"pos", Tensor::scalar<int64_t>(2)}}); }, &code),
            "SequenceAt node 'at': position 2 is out of range [-2, 1] for a sequence of 2 tensors");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { s->run_values({{"seq", two_items()}, {"pos", Tensor::scalar<int64_t>(-3)}}); }),
            "SequenceAt node 'at': position -3 is out of range [-2, 1] for a sequence of 2 tensors");
  EXPECT_EQ(error_of([&] {
              s->run_values({{"seq", Value::sequence({}, DType::f32)}, {"pos", Tensor::scalar<int64_t>(0)}});
            }),
            "SequenceAt node 'at': position 0 is out of range: the sequence is empty");
  // The input's declared kind is checked like a tensor's dtype.
  EXPECT_EQ(error_of([&] { s->run_values({{"seq", f32({1}, {1})}, {"pos", Tensor::scalar<int64_t>(0)}}); }, &code),
            "input 'seq': expected seq(tensor(float)), got f32[1]");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
}

TEST(Sequences, RunRefusesSequenceOutputsAndRunValuesReturnsThem) {
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<DimSpec>{2}).output("seq").output("n");
  b.node("SplitToSequence", {"x"}, {"seq"}).attrs["keepdims"] = attr_int(0);
  b.node("SequenceLength", {"seq"}, {"n"});
  auto s = Session::compile(b.build(), ref_only());
  const Tensor x = f32({2}, {5, 6});
  EXPECT_EQ(error_of([&] { s->run({{"x", x}}); }),
            "output 'seq' is seq(f32)[2 items], not a tensor: Session::run_values returns it");
  EXPECT_EQ(values_of(s->run({{"x", x}}, {"n"}).at("n")), (std::vector<double>{2}));
  ValueMap out = s->run_values({{"x", x}});
  ASSERT_TRUE(out.at("seq").is_sequence());
  ASSERT_EQ(out.at("seq").items().size(), 2u);
  EXPECT_EQ(out.at("seq").items()[1].shape(), Shape{});
  EXPECT_EQ(values_of(out.at("seq").items()[1]), (std::vector<double>{6}));
  // Outputs never share memory with the caller's inputs.
  EXPECT_NE(out.at("seq").items()[0].storage(), x.storage());
}

TEST(Sequences, ASequenceKeepsItsTensorsWhenTheArenaIsReused) {
  // a = -x goes into a sequence at step 2; the arena bytes of a are free after that step
  // and c, d reuse them before the sequence is read again.
  ModelBuilder b;
  b.input("x", DType::f32, std::vector<DimSpec>{4}).output("y");
  b.initializer("zero", Tensor::scalar<int64_t>(0));
  b.node("Neg", {"x"}, {"a"});
  b.node("SequenceConstruct", {"a"}, {"s"});
  b.node("Abs", {"x"}, {"bb"});
  b.node("Neg", {"bb"}, {"c"});
  b.node("Neg", {"c"}, {"d"});
  b.node("SequenceAt", {"s", "zero"}, {"e"});
  b.node("Add", {"e", "d"}, {"y"});
  auto s = Session::compile(b.build(), ref_only());
  EXPECT_GT(s->stats().memory.planned_values, 0);
  EXPECT_EQ(values_of(s->run({{"x", f32({4}, {1, -2, 3, -4})}}).at("y")), (std::vector<double>{0, 4, 0, 8}));
}

TEST(Sequences, OptionalsHoldATensorASequenceOrNothing) {
  ModelBuilder b;
  ValueInfo opt;
  opt.name = "o";
  opt.onnx_type = "optional(tensor(float))";
  b.model().graph.inputs.push_back(opt);
  b.output("has").output("o2");
  b.node("OptionalHasElement", {"o"}, {"has"});
  b.node("Identity", {"o"}, {"o2"});
  auto s = Session::compile(b.build(), ref_only());
  ValueMap out = s->run_values({{"o", Value::none()}});
  EXPECT_EQ(values_of(out.at("has").tensor()), (std::vector<double>{0}));
  EXPECT_TRUE(out.at("o2").is_optional());
  EXPECT_FALSE(out.at("o2").has_element());
  out = s->run_values({{"o", Value::optional(f32({1}, {7}))}});
  EXPECT_EQ(values_of(out.at("has").tensor()), (std::vector<double>{1}));
  EXPECT_EQ(values_of(out.at("o2").element().tensor()), (std::vector<double>{7}));

  ModelBuilder g;
  g.model().graph.inputs.push_back(opt);
  g.output("t");
  g.node("OptionalGetElement", {"o"}, {"t"}, "get");
  s = Session::compile(g.build(), ref_only());
  EXPECT_EQ(error_of([&] { s->run_values({{"o", Value::none()}}); }),
            "OptionalGetElement node 'get': the optional is empty");
}
