// Session::run: input validation, output selection, outputs that never share memory
// with the session, views into the arena, repeated and concurrent runs, and equality
// with a direct evaluation on random graphs.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <thread>

#include "runtime/test_graphs.h"
#include "slim/runtime/session.h"

using namespace slim;
using namespace slim::testing;

namespace {

std::unique_ptr<Session> relu_session(std::vector<DimSpec> shape) {
  ModelBuilder b;
  b.input("x", DType::f32, shape).output("y");
  b.node("Relu", {"x"}, {"y"});
  return Session::compile(b.build(), test_options());
}

}  // namespace

TEST(SessionRun, RejectsInputsThatContradictTheModel) {
  auto s = relu_session({1, 3, 4});
  ErrorCode code{};
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {1, 3})}}); }, &code),
            "input 'x': expected f32[1,3,4], got f32[1,3]");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {1, 3, 5})}}); }),
            "input 'x': expected f32[1,3,4], got f32[1,3,5]");
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::i64, {1, 3, 4})}}); }),
            "input 'x': expected f32[1,3,4], got i64[1,3,4]");
  EXPECT_EQ(error_of([&] { s->run({}); }, &code), "missing input 'x' (expected f32[1,3,4])");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] {
              s->run({{"x", Tensor(DType::f32, {1, 3, 4})}, {"z", Tensor(DType::f32, {1})}});
            }),
            "unknown input 'z' (model inputs: x)");
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {1, 3, 4})}}, {"nope"}); }, &code),
            "unknown output 'nope' (model outputs: y)");
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor()}}); }), "input 'x': tensor is undefined");
}

TEST(SessionRun, SymbolicDimsAcceptAnySize) {
  auto s = relu_session({"batch", 2});
  for (int64_t n : {1, 4}) {
    auto out = s->run({{"x", Tensor(DType::f32, {n, 2})}});
    EXPECT_EQ(out.at("y").shape(), (Shape{n, 2}));
  }
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {3, 3})}}); }),
            "input 'x': expected f32[batch,2], got f32[3,3]");
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {6})}}); }),
            "input 'x': expected f32[batch,2], got f32[6]");
}

TEST(SessionRun, UnrankedInputsTakeAnyShape) {
  ModelBuilder b;
  b.input("x", DType::f32, std::nullopt).output("y");
  b.node("Relu", {"x"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(s->run({{"x", f32({2, 1, 2}, {1, -1, 2, -2})}}).at("y").shape(), (Shape{2, 1, 2}));
}

TEST(SessionRun, OverridableInitializersMayBeGivenOrNot) {
  ModelBuilder b;
  b.input("x", DType::f32, {{3}}).output("y");
  b.initializer("w", f32({3}, {1, 2, 3}), /*overridable=*/true);
  b.node("Add", {"x", "w"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  ASSERT_EQ(s->inputs().size(), 1u);  // run() needs only x
  EXPECT_FALSE(s->compiled_graph().nodes.empty()) << "an overridable initializer was folded";
  const Tensor x = f32({3}, {10, 10, 10});
  EXPECT_EQ(values_of(s->run({{"x", x}}).at("y")), (std::vector<double>{11, 12, 13}));
  EXPECT_EQ(values_of(s->run({{"x", x}, {"w", f32({3}, {0, 0, -10})}}).at("y")),
            (std::vector<double>{10, 10, 0}));
  EXPECT_EQ(error_of([&] { s->run({{"x", x}, {"w", f32({2}, {0, 0})}}); }),
            "input 'w': expected f32[3], got f32[2]");
  EXPECT_EQ(error_of([&] { s->run({{"x", x}, {"v", f32({3}, {0, 0, 0})}}); }),
            "unknown input 'v' (model inputs: x; overridable initializers: w)");
}

TEST(SessionRun, ReturnsRequestedOutputsOnly) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("a").output("b");
  b.node("Relu", {"x"}, {"r"});
  b.node("Tick", {"r"}, {"a"});
  b.node("Add", {"x", "x"}, {"t"});
  b.node("Tick", {"t"}, {"b"});
  auto s = Session::compile(b.build(), test_options());
  int64_t before = test_kernel_calls();
  auto out = s->run({{"x", f32({2}, {-1, 2})}}, {"b"});
  EXPECT_EQ(test_kernel_calls() - before, 2) << "steps only output 'a' needs were run";
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(values_of(out.at("b")), (std::vector<double>{-2, 4}));
  before = test_kernel_calls();
  out = s->run({{"x", f32({2}, {-1, 2})}});
  EXPECT_EQ(test_kernel_calls() - before, 4);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(values_of(out.at("a")), (std::vector<double>{0, 2}));
}

TEST(SessionRun, OutputsNeverShareMemoryWithTheSession) {
  ModelBuilder b;
  b.input("x", DType::f32, {{4}}).output("passthrough").output("weights").output("view");
  b.initializer("w", f32({4}, {1, 2, 3, 4}));
  b.initializer("shape", i64({2}, {2, 2}));
  b.node("Identity", {"x"}, {"passthrough"});
  b.node("Identity", {"w"}, {"weights"});
  b.node("Relu", {"x"}, {"r"});
  // A view of an arena buffer, returned as a graph output.
  b.node("Reshape", {"r", "shape"}, {"view"});
  SessionOptions o = test_options();
  o.fold_constants = false;  // keep the Identity of the initializer a real node
  auto s = Session::compile(b.build(), o);
  EXPECT_EQ(s->stats().memory.planned_values, 1);  // r

  const Tensor x = f32({4}, {1, -2, 3, -4});
  auto first = s->run({{"x", x}});
  EXPECT_NE(first.at("passthrough").raw_data(), x.raw_data());
  first.at("weights").data<float>()[0] = 100;
  first.at("passthrough").data<float>()[0] = 100;
  EXPECT_EQ(x.data<float>()[0], 1);

  auto second = s->run({{"x", f32({4}, {5, 6, 7, 8})}});
  EXPECT_EQ(values_of(second.at("weights")), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(values_of(second.at("view")), (std::vector<double>{5, 6, 7, 8}));
  // The first run's result survived the second run, which reused the arena.
  EXPECT_EQ(values_of(first.at("view")), (std::vector<double>{1, 0, 3, 0}));
  EXPECT_EQ(first.at("view").shape(), (Shape{2, 2}));
}

TEST(SessionRun, ViewsIntoTheArenaSurviveBufferReuse) {
  // r is planned; v views r's bytes and is read after several more same-sized values
  // were written. Statically the compiler sees the alias and keeps r's bytes; with a
  // run-time shape (`shape` given as an input) the session must copy the view instead.
  for (bool static_shape : {true, false}) {
    ModelBuilder b;
    b.input("x", DType::f32, {{8}}).output("y");
    if (static_shape)
      b.initializer("shape", i64({2}, {2, 4}));
    else
      b.input("shape", DType::i64, {{2}});
    b.node("Relu", {"x"}, {"r"});
    b.node("Reshape", {"r", "shape"}, {"v"});
    b.node("Add", {"x", "x"}, {"a1"});
    b.node("Add", {"a1", "x"}, {"a2"});
    b.node("Add", {"a2", "x"}, {"a3"});
    b.node("Reshape", {"a3", "shape"}, {"a4"});
    b.node("Add", {"a4", "v"}, {"y"});
    auto s = Session::compile(b.build(), test_options());
    TensorMap in = {{"x", f32({8}, {1, -1, 2, -2, 3, -3, 4, -4})}};
    if (!static_shape) in["shape"] = i64({2}, {2, 4});
    const auto y = values_of(s->run(in).at("y"));
    const std::vector<double> expect = {5, -4, 10, -8, 15, -12, 20, -16};
    EXPECT_EQ(y, expect) << (static_shape ? "static" : "dynamic");
    EXPECT_GT(s->stats().memory.planned_values, 0);
  }
}

TEST(SessionRun, ConcurrentRunsAreSerialized) {
  ModelBuilder b;
  b.input("x", DType::f32, {{256}}).output("y");
  b.node("Relu", {"x"}, {"a"});
  b.node("Add", {"a", "x"}, {"c"});
  b.node("Mul", {"c", "a"}, {"d"});
  b.node("Sub", {"d", "x"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 25; ++iter) {
        std::vector<float> xs(256);
        for (int i = 0; i < 256; ++i) xs[size_t(i)] = float((i * 7 + t * 13 + iter) % 11) - 5;
        const auto y = values_of(s->run({{"x", f32({256}, xs)}}).at("y"));
        for (int i = 0; i < 256; ++i) {
          const float x = xs[size_t(i)], a = std::max(0.f, x);
          if (y[size_t(i)] != double((a + x) * a - x)) ++mismatches;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(SessionRun, RandomGraphsMatchDirectEvaluation) {
  // Random DAGs of elementwise ops over [4,8] (with [8] and [1,8] constants that
  // broadcast), evaluated once by the session and once directly in this test. Exact
  // equality: both apply the same float operations in the same order.
  std::mt19937 rng(42);
  const char* kOps[] = {"Add", "Mul", "Sub", "Relu"};
  for (int trial = 0; trial < 40; ++trial) {
    ModelBuilder b;
    std::map<std::string, std::vector<float>> direct;  // values broadcast to [4,8]
    std::vector<std::string> names;
    std::uniform_real_distribution<float> uni(-2.f, 2.f);
    TensorMap inputs;
    for (int i = 0; i < 2; ++i) {
      const std::string name = "in" + std::to_string(i);
      std::vector<float> v(32);
      for (auto& e : v) e = uni(rng);
      b.input(name, DType::f32, {{4, 8}});
      inputs[name] = f32({4, 8}, v);
      direct[name] = v;
      names.push_back(name);
    }
    for (int i = 0; i < 2; ++i) {
      const std::string name = "c" + std::to_string(i);
      std::vector<float> v(8);
      for (auto& e : v) e = uni(rng);
      b.initializer(name, f32(i == 0 ? Shape{8} : Shape{1, 8}, v));
      std::vector<float> full(32);
      for (int k = 0; k < 32; ++k) full[size_t(k)] = v[size_t(k % 8)];
      direct[name] = full;
      names.push_back(name);
    }
    // Values of the full [4,8] shape; constants and what derives only from constants
    // are smaller, and only full values become graph outputs.
    std::vector<std::string> full = {"in0", "in1"};
    const int num_nodes = 3 + int(rng() % 25);
    for (int n = 0; n < num_nodes; ++n) {
      const std::string op = kOps[rng() % 4];
      const std::string x =
          n == num_nodes - 1 ? full[rng() % full.size()] : names[rng() % names.size()];
      const std::string y = names[rng() % names.size()];
      const std::string out = "v" + std::to_string(n);
      std::vector<float> r(32);
      for (int k = 0; k < 32; ++k) {
        const float a = direct[x][size_t(k)], c = direct[y][size_t(k)];
        r[size_t(k)] = op == "Add" ? a + c : op == "Mul" ? a * c : op == "Sub" ? a - c
                                                                              : std::max(0.f, a);
      }
      if (op == "Relu")
        b.node(op, {x}, {out});
      else
        b.node(op, {x, y}, {out});
      direct[out] = r;
      names.push_back(out);
      auto is_full = [&](const std::string& v) {
        return std::find(full.begin(), full.end(), v) != full.end();
      };
      if (is_full(x) || (op != "Relu" && is_full(y))) full.push_back(out);
    }
    std::vector<std::string> outs = {names.back()};
    for (int k = 0; k < 2; ++k) {
      const std::string extra = full[rng() % full.size()];
      if (std::find(outs.begin(), outs.end(), extra) == outs.end()) outs.push_back(extra);
    }
    for (const auto& o : outs) b.output(o);

    for (bool optimize : {true, false}) {
      SessionOptions opt = test_options();
      opt.fold_constants = optimize;
      opt.plan_memory = optimize;
      auto s = Session::compile(b.build(), opt);
      for (int rep = 0; rep < 2; ++rep) {
        const TensorMap got = s->run(inputs);
        ASSERT_EQ(got.size(), outs.size());
        for (const auto& o : outs) {
          const auto& want = direct[o];
          const auto have = values_of(got.at(o));
          ASSERT_EQ(have.size(), 32u) << o << " has shape " << got.at(o).describe();
          for (size_t k = 0; k < 32; ++k)
            ASSERT_EQ(float(have[k]), want[k]) << "trial " << trial << " output " << o << "[" << k
                                               << "] optimize=" << optimize << " rep " << rep;
        }
      }
    }
  }
}

TEST(SessionRun, LoadReportsMissingFiles) {
  ErrorCode code{};
  const std::string msg =
      error_of([&] { Session::load("/nonexistent/dir/model.onnx", test_options()); }, &code);
  EXPECT_NE(msg.find("/nonexistent/dir/model.onnx"), std::string::npos) << msg;
}

TEST(SessionRun, GraphOutputsMayBeInputsOrInitializers) {
  ModelBuilder b;
  b.input("x", DType::f32, {{2}}).output("x").output("w").output("y");
  b.initializer("w", f32({2}, {7, 8}));
  b.node("Add", {"x", "w"}, {"y"});
  auto s = Session::compile(b.build(), test_options());
  const Tensor x = f32({2}, {1, 2});
  auto out = s->run({{"x", x}});
  EXPECT_EQ(values_of(out.at("x")), (std::vector<double>{1, 2}));
  EXPECT_EQ(values_of(out.at("w")), (std::vector<double>{7, 8}));
  EXPECT_EQ(values_of(out.at("y")), (std::vector<double>{8, 10}));
  out.at("w").data<float>()[0] = -1;
  out.at("x").data<float>()[0] = -1;
  EXPECT_EQ(x.data<float>()[0], 1);
  EXPECT_EQ(values_of(s->run({{"x", x}}).at("y")), (std::vector<double>{8, 10}));
}

TEST(SessionRun, RepeatedShapesOfSymbolicInputsGetTheirOwnPlan) {
  ModelBuilder b;
  b.input("x", DType::f32, {{"n", 4}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  b.node("Shape", {"r"}, {"s"});
  b.node("Relu", {"r"}, {"r2"});
  b.node("Relu", {"r2"}, {"r3"});
  b.node("Reshape", {"r3", "s"}, {"y"});
  auto check_runs = [&](Session& s, int64_t n) {
    std::vector<float> xs(static_cast<size_t>(n * 4));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(i % 3) - 1;
    const int64_t before = test_kernel_calls();
    const Tensor y = s.run({{"x", f32({n, 4}, xs)}}).at("y");
    const int64_t calls = test_kernel_calls() - before;
    EXPECT_EQ(y.shape(), (Shape{n, 4}));
    const auto ys = values_of(y);
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(ys[i], std::max(0.f, xs[i]));
    return calls;
  };

  auto s = Session::compile(b.build(), test_options());
  EXPECT_EQ(s->stats().memory.planned_values, 0);
  EXPECT_EQ(check_runs(*s, 2), 5);  // the general plan runs every node
  EXPECT_EQ(s->num_specializations(), 0);
  check_runs(*s, 2);  // second sighting of n=2: compiled for it
  EXPECT_EQ(s->num_specializations(), 1);
  EXPECT_EQ(check_runs(*s, 2), 4);  // Shape is folded there
  EXPECT_EQ(s->last_run_stats().folded_nodes, 1);
  EXPECT_EQ(s->last_run_stats().memory.planned_values, 3);
  EXPECT_EQ(check_runs(*s, 3), 5);  // another shape: the general plan again
  EXPECT_EQ(s->last_run_stats().memory.planned_values, 0);
  EXPECT_EQ(check_runs(*s, 2), 4);
  // Errors still speak of the model's own dims.
  EXPECT_EQ(error_of([&] { s->run({{"x", Tensor(DType::f32, {2, 5})}}); }),
            "input 'x': expected f32[n,4], got f32[2,5]");

  SessionOptions off = test_options();
  off.shape_specializations = 0;
  auto general = Session::compile(b.build(), off);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(check_runs(*general, 2), 5);
  EXPECT_EQ(general->num_specializations(), 0);
}

TEST(SessionRun, SpecializationsAreBoundedAndRecentlyUsedStay) {
  ModelBuilder b;
  b.input("x", DType::f32, {{"n"}}).output("y");
  b.node("Relu", {"x"}, {"r"});
  b.node("Relu", {"r"}, {"y"});
  SessionOptions o = test_options();
  o.shape_specializations = 2;
  auto s = Session::compile(b.build(), o);
  auto run = [&](int64_t n) {
    const Tensor y = s->run({{"x", Tensor(DType::f32, {n})}}).at("y");
    EXPECT_EQ(y.shape(), Shape{n});
  };
  for (int64_t n : {1, 1, 2, 2}) run(n);
  EXPECT_EQ(s->num_specializations(), 2);
  run(1);  // still kept
  EXPECT_EQ(s->num_specializations(), 2);
  for (int64_t n : {3, 3}) run(n);  // evicts n=2, the least recently used
  EXPECT_EQ(s->num_specializations(), 3);
  run(1);
  EXPECT_EQ(s->num_specializations(), 3);  // n=1 survived
  for (int64_t n : {2, 2}) run(n);  // n=2 was evicted: compiled again
  EXPECT_EQ(s->num_specializations(), 4);
}
