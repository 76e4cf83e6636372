// DynamicBatcher: the scheduler of one served model version. Requests wait in one queue
// per priority level (level 1 the most urgent, Triton's convention); each executor (one
// per instance) takes the most urgent request, adds requests of its level with the same
// sample shape up to max_batch_size, waits at most max_queue_delay for a fuller batch
// unless it already has a preferred size, runs the model once on the rows stacked along
// the first dimension, and hands each request its rows of the outputs as views of the
// batch's output tensors (no copy). A request that finds nothing queued, an instance free
// and no reason to wait for a fuller batch runs at once on the calling thread, when the
// front door allows it (InferRequest::caller_may_run). It never parses a protocol.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "slim/core/tensor_model.h"
#include "slim/serve/energy_ledger.h"
#include "slim/serve/inference.h"
#include "slim/serve/metrics.h"
#include "slim/serve/model_config.h"

namespace slim::serve {

struct BatchPolicy {
  int64_t max_batch_size = 0;  // 0: every request runs alone, inputs as they are
  bool dynamic = false;        // merge requests (dynamic_batching configured)
  std::vector<int64_t> preferred_batch_size;
  uint64_t max_queue_delay_us = 0;
  uint32_t levels = 1;
  uint32_t default_level = 1;
  std::vector<QueuePolicy> queue_policy;  // per level, index level - 1
  int64_t max_queue_size = 4096;          // per level when its policy sets none
  // When set, a batch of n rows runs padded (with copies of its last row) to the smallest
  // of these sizes >= n, ascending and ending at max_batch_size: an ONNX session compiles
  // a plan per input shape, so the sizes it sees are kept few (see batch_ladder).
  std::vector<int64_t> padded_sizes;
};

// The batch sizes a padded batcher runs: powers of two below max_batch_size, the
// preferred sizes, and max_batch_size itself.
std::vector<int64_t> batch_ladder(int64_t max_batch_size, const std::vector<int64_t>& preferred);

// The series of one model version, created when it loads.
struct ModelStats {
  Counter* success = nullptr;
  Counter* failure_rejected = nullptr;  // refused at the queue: full, timed out, shut down
  Counter* failure_other = nullptr;     // the model failed
  Counter* inference_count = nullptr;   // samples (batch rows) inferred
  Counter* exec_count = nullptr;        // model executions (batches)
  Counter* queue_seconds = nullptr;
  Counter* compute_input_seconds = nullptr;
  Counter* compute_infer_seconds = nullptr;
  Counter* compute_output_seconds = nullptr;
  Histogram* request_seconds = nullptr;
  Histogram* batch_size = nullptr;
  std::vector<Gauge*> pending;  // per level
  EnergyLedger* ledger = nullptr;             // slim serve --energy
  std::vector<EnergyLedger::Series> energy;   // per level, with a ledger

  // The series of `model` `version` in `m` (labels model, version; priority for pending
  // and energy).
  static ModelStats create(Metrics& m, const std::string& model, const std::string& version, const BatchPolicy& p,
                           EnergyLedger* ledger = nullptr);
};

// A request after the server validated it: inputs in the model's own shapes, outputs the
// model's names, how many rows it brings (1 when the model does not batch).
struct ScheduledRequest {
  InferRequest request;
  InferCallback done;
  std::map<std::string, Tensor> inputs;
  std::vector<std::string> outputs;  // model output names, in response order
  std::vector<Shape> output_sample_dims;  // per output: the dims after the batch dim the
                                          // response shows (the config's), empty: as is
  int64_t rows = 1;
  uint32_t level = 1;
  Clock::time_point deadline = Clock::time_point::max();
  std::string shape_key;  // requests batch together only when their keys match
};

class DynamicBatcher {
 public:
  // `instances`: one model per executor thread (several may be the same object when the
  // model is safe to call from several threads at once).
  DynamicBatcher(std::string model, std::string version, BatchPolicy policy,
                 std::vector<std::shared_ptr<TensorModel>> instances, ModelStats stats);
  ~DynamicBatcher();  // stop(false)

  // Queues the request or fails it at once: `resource_exhausted` when its level's queue
  // is full, `unavailable` after stop(). Its callback runs exactly once either way.
  void enqueue(std::unique_ptr<ScheduledRequest> r);
  // Stops taking requests. drain = true: the executors finish every queued request first;
  // false: queued requests fail with `unavailable`. Returns when the executors are done.
  void stop(bool drain);
  int64_t pending() const;

 private:
  struct Executor;
  void run_executor(size_t index);
  // Answers requests whose queue timeout passed, even while every executor is busy.
  void run_reaper();
  // With mu_ held: takes out the expired REJECT requests, moves expired DELAY ones behind
  // their level; returns the next deadline.
  Clock::time_point expire(std::vector<std::unique_ptr<ScheduledRequest>>* expired);
  // With mu_ held: the next batch; empty when it should wait (until *wake).
  std::vector<std::unique_ptr<ScheduledRequest>> take_batch(Clock::time_point* wake);
  void execute(TensorModel& model, std::vector<std::unique_ptr<ScheduledRequest>>& batch);
  void fail(std::unique_ptr<ScheduledRequest> r, const Error& e, bool rejected);

  const std::string model_, version_;
  const BatchPolicy policy_;
  std::vector<std::shared_ptr<TensorModel>> instances_;
  ModelStats stats_;
  EnergyLedger::Kind energy_kind_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Per level: requests in arrival order, and requests whose DELAY timeout passed
  // (served only when the level has nothing else).
  std::vector<std::deque<std::unique_ptr<ScheduledRequest>>> queues_, delayed_;
  std::vector<bool> busy_;  // per instance: running a batch (its executor's or a caller's)
  int64_t queued_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // executors, then the reaper
};

}  // namespace slim::serve
