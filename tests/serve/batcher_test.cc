// DynamicBatcher: merging, splitting, priorities, queue bounds, timeouts and shutdown,
// checked on a small model that doubles its input and records every batch it ran.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "slim/serve/batcher.h"

namespace slim::serve {
namespace {

// y = 2 * x for x f32 [N, W]. Each batch's first value and row count are recorded; while
// the gate is closed, predict() waits, so a test can queue requests behind a running batch.
class GatedDoubler : public TensorModel {
 public:
  std::vector<TensorSpec> input_specs() const override { return {{"x", DType::f32, {-1, -1}}}; }
  std::vector<TensorSpec> output_specs() const override { return {{"y", DType::f32, {-1, -1}}}; }
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& inputs) const override {
    const Tensor& x = inputs.at("x");
    std::unique_lock lock(mu_);
    ++started_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    batches_.push_back({x.dim(0), x.data<float>()[0]});
    Tensor y(DType::f32, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = 2 * x.data<float>()[i];
    return {{"y", y}};
  }
  void close() { std::lock_guard l(mu_); open_ = false; }
  void open() { std::lock_guard l(mu_); open_ = true; cv_.notify_all(); }
  void wait_started(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return started_ >= n; });
  }
  std::vector<std::pair<int64_t, float>> batches() const { std::lock_guard l(mu_); return batches_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool open_ = true;
  mutable int started_ = 0;
  mutable std::vector<std::pair<int64_t, float>> batches_;
};

struct Harness {
  Metrics metrics;
  std::shared_ptr<GatedDoubler> model = std::make_shared<GatedDoubler>();
  BatchPolicy policy;
  std::unique_ptr<DynamicBatcher> batcher;

  std::vector<std::thread> blockers;

  explicit Harness(BatchPolicy p) : policy(std::move(p)) {
    if (policy.queue_policy.empty()) policy.queue_policy.assign(policy.levels, QueuePolicy{});
    batcher = std::make_unique<DynamicBatcher>("m", "1", policy, std::vector<std::shared_ptr<TensorModel>>{model},
                                               ModelStats::create(metrics, "m", "1", policy));
  }
  ~Harness() {
    for (auto& t : blockers) t.join();
  }
  // A request that finds the batcher idle runs on the submitting thread: the blocker is
  // submitted from a thread of its own and holds the (closed) model until the test opens it.
  std::future<InferResult> block(float value, uint32_t level = 1) {
    auto promise = std::make_shared<std::promise<InferResult>>();
    auto f = promise->get_future();
    const int started = int(model->batches().size()) + 1;
    blockers.emplace_back([this, promise, value, level] { promise->set_value(submit(value, 1, level).get()); });
    model->wait_started(started);
    return f;
  }
  // Queues `rows` rows of width 2 filled with `value`, at `level`; the future holds the result.
  std::future<InferResult> submit(float value, int64_t rows = 1, uint32_t level = 1, int64_t width = 2,
                                  uint64_t timeout_us = 0) {
    auto promise = std::make_shared<std::promise<InferResult>>();
    auto r = std::make_unique<ScheduledRequest>();
    r->request.caller_may_run = true;
    r->inputs["x"] = Tensor::from_vector<float>({rows, width}, std::vector<float>(size_t(rows * width), value));
    r->outputs = {"y"};
    r->output_sample_dims = {{}};
    r->rows = rows;
    r->level = level;
    r->shape_key = std::to_string(width);
    if (timeout_us) r->deadline = Clock::now() + std::chrono::microseconds(timeout_us);
    r->done = [promise](InferResult&& res) { promise->set_value(std::move(res)); };
    auto f = promise->get_future();
    batcher->enqueue(std::move(r));
    return f;
  }
};

BatchPolicy batching(int64_t max_batch, uint32_t levels = 1) {
  BatchPolicy p;
  p.max_batch_size = max_batch;
  p.dynamic = true;
  p.max_queue_delay_us = 0;
  p.levels = levels;
  return p;
}

TEST(Batcher, MergesQueuedRequestsAndGivesEachItsRows) {
  Harness h(batching(16));
  h.model->close();
  auto first = h.block(100);  // runs alone and holds the model
  std::vector<std::future<InferResult>> rest;
  for (int i = 0; i < 5; ++i) rest.push_back(h.submit(float(i), 2));
  h.model->open();
  ASSERT_FALSE(first.get().error);
  for (int i = 0; i < 5; ++i) {
    InferResult r = rest[size_t(i)].get();
    ASSERT_FALSE(r.error) << r.error->what();
    const Tensor& y = r.response.outputs.at(0).second;
    EXPECT_EQ(y.shape(), (Shape{2, 2}));
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(y.data<float>()[k], 2.0f * float(i));
  }
  const auto b = h.model->batches();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].first, 10);  // five requests of two rows ran as one batch
  EXPECT_EQ(h.metrics.counter("slim_inference_exec_count_total", "", {{"model", "m"}, {"version", "1"}}).value(), 2);
  EXPECT_EQ(h.metrics.counter("slim_inference_count_total", "", {{"model", "m"}, {"version", "1"}}).value(), 11);
}

TEST(Batcher, BatchesStopAtMaxBatchSizeAndMatchingShapes) {
  Harness h(batching(4));
  h.model->close();
  auto first = h.block(100);
  auto a = h.submit(1, 3), b = h.submit(2, 3), c = h.submit(3, 1, 1, /*width=*/5), d = h.submit(4, 1);
  h.model->open();
  for (auto* f : {&first, &a, &b, &c, &d}) ASSERT_FALSE(f->get().error);
  // 3 + 1 rows fill the batch; 3 rows wait for the next; the width-5 request never joins.
  const auto batches = h.model->batches();
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[1], (std::pair<int64_t, float>{4, 1}));
  EXPECT_EQ(batches[2], (std::pair<int64_t, float>{3, 2}));
  EXPECT_EQ(batches[3], (std::pair<int64_t, float>{1, 3}));
}

TEST(Batcher, PadsBatchesToTheLadderAndReturnsOnlyRealRows) {
  EXPECT_EQ(batch_ladder(12, {6}), (std::vector<int64_t>{1, 2, 4, 6, 8, 12}));
  EXPECT_EQ(batch_ladder(1, {}), (std::vector<int64_t>{1}));
  BatchPolicy p = batching(8);
  p.padded_sizes = batch_ladder(8, {});
  Harness h(p);
  InferResult r = h.submit(5, 3).get();
  ASSERT_FALSE(r.error);
  const Tensor& y = r.response.outputs.at(0).second;
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  for (int64_t k = 0; k < y.numel(); ++k) EXPECT_EQ(y.data<float>()[k], 10.0f);
  EXPECT_EQ(h.model->batches().at(0), (std::pair<int64_t, float>{4, 5}));  // the model ran 4 rows
  EXPECT_EQ(h.metrics.counter("slim_inference_count_total", "", {{"model", "m"}, {"version", "1"}}).value(), 3);
}

TEST(Batcher, MoreUrgentLevelsRunFirst) {
  BatchPolicy p = batching(1, 3);
  Harness h(p);
  h.model->close();
  auto first = h.block(100, 3);
  auto low1 = h.submit(31, 1, 3), low2 = h.submit(32, 1, 3), mid = h.submit(21, 1, 2), high = h.submit(11, 1, 1);
  h.model->open();
  for (auto* f : {&first, &low1, &low2, &mid, &high}) ASSERT_FALSE(f->get().error);
  std::vector<float> order;
  for (const auto& b : h.model->batches()) order.push_back(b.second);
  EXPECT_EQ(order, (std::vector<float>{100, 11, 21, 31, 32}));
}

TEST(Batcher, ABatchHoldsOneLevel) {
  Harness h(batching(8, 2));
  h.model->close();
  auto first = h.block(100, 2);
  auto low1 = h.submit(21, 1, 2), low2 = h.submit(22, 1, 2), high = h.submit(11, 1, 1);
  h.model->open();
  for (auto* f : {&first, &low1, &low2, &high}) ASSERT_FALSE(f->get().error);
  const auto b = h.model->batches();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[1], (std::pair<int64_t, float>{1, 11}));  // the urgent request alone, not filled with level 2
  EXPECT_EQ(b[2], (std::pair<int64_t, float>{2, 21}));
}

TEST(Batcher, FullQueueRejectsAtOnce) {
  BatchPolicy p = batching(1, 2);
  p.queue_policy = {QueuePolicy{}, QueuePolicy{}};
  p.queue_policy[1].max_queue_size = 2;
  Harness h(p);
  h.model->close();
  auto first = h.block(0, 2);
  auto q1 = h.submit(1, 1, 2), q2 = h.submit(2, 1, 2);
  auto refused = h.submit(3, 1, 2);
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  InferResult r = refused.get();
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), ErrorCode::resource_exhausted);
  EXPECT_STREQ(r.error->what(), "the queue of model 'm' at priority level 2 is full (2 requests)");
  auto urgent = h.submit(4, 1, 1);  // another level has its own bound
  h.model->open();
  for (auto* f : {&first, &q1, &q2, &urgent}) EXPECT_FALSE(f->get().error);
  EXPECT_EQ(h.metrics.counter("slim_inference_request_failure_total", "",
                              {{"model", "m"}, {"version", "1"}, {"reason", "rejected"}}).value(), 1);
}

TEST(Batcher, TimeoutRejectsOrDelays) {
  BatchPolicy p = batching(1, 2);
  p.queue_policy = {QueuePolicy{}, QueuePolicy{}};
  p.queue_policy[0].timeout_action = QueuePolicy::TimeoutAction::delay;
  Harness h(p);
  h.model->close();
  auto first = h.block(0, 2);
  auto rejected = h.submit(1, 1, 2, 2, 1000);
  auto delayed = h.submit(2, 1, 1, 2, 1000);
  auto later = h.submit(3, 1, 1);
  InferResult r = rejected.get();  // fails while the executor is still busy
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), ErrorCode::unavailable);
  EXPECT_NE(std::string(r.error->what()).find("request timed out in the queue of model 'm'"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  h.model->open();
  for (auto* f : {&first, &delayed, &later}) EXPECT_FALSE(f->get().error);
  std::vector<float> order;
  for (const auto& b : h.model->batches()) order.push_back(b.second);
  EXPECT_EQ(order, (std::vector<float>{0, 3, 2}));  // the delayed request went behind its level
}

TEST(Batcher, StopDrainsOrFailsQueuedRequests) {
  for (bool drain : {true, false}) {
    Harness h(batching(1));
    h.model->close();
    auto first = h.block(0);
    auto queued = h.submit(1);
    std::thread stopper([&] { h.batcher->stop(drain); });
    if (!drain) {
      InferResult r = queued.get();
      ASSERT_TRUE(r.error);
      EXPECT_EQ(r.error->code(), ErrorCode::unavailable);
    }
    h.model->open();
    stopper.join();
    EXPECT_FALSE(first.get().error);
    if (drain) {
      EXPECT_FALSE(queued.get().error);
    }
    auto after = h.submit(2);
    InferResult r = after.get();
    ASSERT_TRUE(r.error);
    EXPECT_EQ(r.error->code(), ErrorCode::unavailable);
  }
}

TEST(Metrics, RendersPrometheusText) {
  Metrics m;
  m.counter("a_total", "A \"count\"\nline two", {{"model", "x\"y"}}).inc(3);
  m.gauge("g", "a gauge").set(1.5);
  auto& h = m.histogram("h_seconds", "latency", {0.1, 1}, {{"model", "x"}});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5);
  EXPECT_EQ(m.render(),
            "# HELP a_total A \"count\"\\nline two\n# TYPE a_total counter\na_total{model=\"x\\\"y\"} 3\n"
            "# HELP g a gauge\n# TYPE g gauge\ng 1.5\n"
            "# HELP h_seconds latency\n# TYPE h_seconds histogram\n"
            "h_seconds_bucket{model=\"x\",le=\"0.1\"} 1\nh_seconds_bucket{model=\"x\",le=\"1\"} 2\n"
            "h_seconds_bucket{model=\"x\",le=\"+Inf\"} 3\nh_seconds_sum{model=\"x\"} 5.55\n"
            "h_seconds_count{model=\"x\"} 3\n");
  m.remove_series({{"model", "x"}});
  EXPECT_EQ(m.render().find("h_seconds_bucket"), std::string::npos);
}

}  // namespace
}  // namespace slim::serve
