#include "slim/serve/batcher.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace slim::serve {
namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Stacks the requests' tensors of one input along the first dimension, then repeats the
// last row up to `total_rows` (padding).
Tensor stack_rows(const std::vector<std::unique_ptr<ScheduledRequest>>& batch,
                  const std::string& name, int64_t total_rows) {
  const Tensor& first = batch[0]->inputs.at(name);
  Shape shape = first.shape();
  shape[0] = total_rows;
  Tensor out(first.dtype(), shape);
  auto* const begin = static_cast<char*>(out.raw_data());
  char* dst = begin;
  for (const auto& r : batch) {
    const Tensor t = r->inputs.at(name).contiguous();
    std::memcpy(dst, t.raw_data(), t.nbytes());
    dst += t.nbytes();
  }
  const size_t row_bytes = out.nbytes() / size_t(total_rows);
  for (char* end = begin + out.nbytes(); dst < end; dst += row_bytes)
    std::memcpy(dst, dst - row_bytes, row_bytes);
  return out;
}

}  // namespace

std::vector<int64_t> batch_ladder(int64_t max_batch_size, const std::vector<int64_t>& preferred) {
  std::vector<int64_t> sizes(preferred.begin(), preferred.end());
  for (int64_t b = 1; b < max_batch_size; b *= 2) sizes.push_back(b);
  sizes.push_back(max_batch_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

ModelStats ModelStats::create(Metrics& m, const std::string& model, const std::string& version,
                              const BatchPolicy& p, EnergyLedger* ledger) {
  const Labels l{{"model", model}, {"version", version}};
  ModelStats s;
  s.success = &m.counter("slim_inference_request_success_total",
                         "Inference requests answered with outputs.", l);
  Labels rejected = l, failed = l;
  rejected.emplace_back("reason", "rejected");
  failed.emplace_back("reason", "model");
  const char* failure_help =
      "Inference requests that failed: rejected at the queue (full, timed out, unloading) "
      "or failed by the model.";
  s.failure_rejected = &m.counter("slim_inference_request_failure_total", failure_help, rejected);
  s.failure_other = &m.counter("slim_inference_request_failure_total", failure_help, failed);
  s.inference_count = &m.counter(
      "slim_inference_count_total",
      "Samples inferred (batch rows); divided by executions it is the mean batch size.", l);
  s.exec_count =
      &m.counter("slim_inference_exec_count_total", "Model executions (batches run).", l);
  s.queue_seconds = &m.counter("slim_inference_queue_duration_seconds_total",
                               "Time requests waited in the scheduler's queue.", l);
  s.compute_input_seconds = &m.counter("slim_inference_compute_input_duration_seconds_total",
                                       "Time spent stacking request inputs into batches.", l);
  s.compute_infer_seconds = &m.counter("slim_inference_compute_infer_duration_seconds_total",
                                       "Time the model computed.", l);
  s.compute_output_seconds = &m.counter("slim_inference_compute_output_duration_seconds_total",
                                        "Time spent splitting batch outputs into responses.", l);
  s.request_seconds = &m.histogram("slim_inference_request_duration_seconds",
                                   "Request latency from arrival to response, in the server.",
                                   exponential_buckets(50e-6, 2, 18), l);
  std::vector<double> sizes;
  for (int64_t b = 1; b <= std::max<int64_t>(1, p.max_batch_size); b *= 2)
    sizes.push_back(double(b));
  s.batch_size = &m.histogram("slim_inference_batch_size", "Rows per model execution.", sizes, l);
  for (uint32_t lv = 1; lv <= p.levels; ++lv) {
    Labels pl = l;
    pl.emplace_back("priority", std::to_string(lv));
    s.pending.push_back(
        &m.gauge("slim_inference_pending_requests",
                 "Requests waiting in the queue, per priority level (1 most urgent).", pl));
    if (ledger) s.energy.push_back(ledger->series(model, version, std::to_string(lv)));
  }
  s.ledger = ledger;
  return s;
}

DynamicBatcher::DynamicBatcher(std::string model, std::string version, BatchPolicy policy,
                               std::vector<std::shared_ptr<TensorModel>> instances,
                               ModelStats stats)
    : model_(std::move(model)),
      version_(std::move(version)),
      policy_(std::move(policy)),
      instances_(std::move(instances)),
      stats_(std::move(stats)),
      queues_(policy_.levels),
      delayed_(policy_.levels),
      busy_(instances_.size(), false) {
  if (instances_.empty())
    throw Error(ErrorCode::internal, "batcher for " + model_ + " has no instances");
  for (size_t i = 0; i < instances_.size(); ++i)
    threads_.emplace_back([this, i] { run_executor(i); });
  threads_.emplace_back([this] { run_reaper(); });
}

DynamicBatcher::~DynamicBatcher() {
  stop(false);
}

int64_t DynamicBatcher::pending() const {
  std::lock_guard lock(mu_);
  return queued_;
}

void DynamicBatcher::fail(std::unique_ptr<ScheduledRequest> r, const Error& e, bool rejected) {
  (rejected ? stats_.failure_rejected : stats_.failure_other)->inc();
  InferResult result;
  result.error = e;
  r->done(std::move(result));
}

void DynamicBatcher::enqueue(std::unique_ptr<ScheduledRequest> r) {
  std::unique_lock lock(mu_);
  if (stopping_) {
    lock.unlock();
    return fail(std::move(r),
                Error(ErrorCode::unavailable, "model '" + model_ + "' version " + version_ +
                                                  " is unloading and takes no new requests"),
                true);
  }
  const size_t l = r->level - 1;
  const uint32_t bound = policy_.queue_policy[l].max_queue_size;
  const int64_t limit = bound > 0 ? int64_t(bound) : policy_.max_queue_size;
  if (int64_t(queues_[l].size() + delayed_[l].size()) >= limit) {
    lock.unlock();
    return fail(
        std::move(r),
        Error(ErrorCode::resource_exhausted,
              "the queue of model '" + model_ + "' at priority level " + std::to_string(l + 1) +
                  " is full (" + std::to_string(limit) + " requests)"),
        true);
  }
  // Nothing queued, an instance free, and nothing to gain by waiting for company: run it on
  // the calling thread, which saves the two thread hand-offs of the queue.
  const bool waits_for_batch =
      policy_.dynamic && policy_.max_queue_delay_us > 0 && r->rows < policy_.max_batch_size;
  if (r->request.caller_may_run && queued_ == 0 && !waits_for_batch) {
    for (size_t i = 0; i < busy_.size(); ++i) {
      if (busy_[i]) continue;
      busy_[i] = true;
      lock.unlock();
      std::vector<std::unique_ptr<ScheduledRequest>> batch;
      batch.push_back(std::move(r));
      execute(*instances_[i], batch);
      lock.lock();
      busy_[i] = false;
      lock.unlock();
      cv_.notify_all();  // requests may have queued for this instance meanwhile
      return;
    }
  }
  stats_.pending[l]->add(1);
  queues_[l].push_back(std::move(r));
  ++queued_;
  lock.unlock();
  cv_.notify_all();
}

Clock::time_point DynamicBatcher::expire(std::vector<std::unique_ptr<ScheduledRequest>>* expired) {
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  // REJECT fails the request; DELAY moves it behind every other request of its level.
  for (size_t l = 0; l < queues_.size(); ++l) {
    auto& q = queues_[l];
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->deadline > now) {
        next = std::min(next, (*it)->deadline);
        ++it;
        continue;
      }
      if (policy_.queue_policy[l].timeout_action == QueuePolicy::TimeoutAction::delay) {
        (*it)->deadline = Clock::time_point::max();
        delayed_[l].push_back(std::move(*it));
      } else {
        expired->push_back(std::move(*it));
        --queued_;
        stats_.pending[l]->add(-1);
      }
      it = q.erase(it);
    }
  }
  return next;
}

void DynamicBatcher::run_reaper() {
  std::unique_lock lock(mu_);
  while (!(stopping_ && queued_ == 0)) {
    std::vector<std::unique_ptr<ScheduledRequest>> expired;
    const Clock::time_point next = expire(&expired);
    if (!expired.empty()) {
      lock.unlock();
      for (auto& r : expired) {
        const std::string waited =
            std::to_string(int64_t(seconds(Clock::now() - r->request.arrival) * 1e6));
        fail(std::move(r),
             Error(ErrorCode::unavailable, "request timed out in the queue of model '" + model_ +
                                               "' after " + waited + " us"),
             true);
      }
      lock.lock();
      cv_.notify_all();  // executors may be waiting to fill a batch that just lost requests
      continue;
    }
    if (next == Clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, next);
  }
}

std::vector<std::unique_ptr<ScheduledRequest>> DynamicBatcher::take_batch(Clock::time_point* wake) {
  const Clock::time_point now = Clock::now();
  *wake = Clock::time_point::max();
  // The most urgent request leads; delayed requests come after every level's regular ones.
  // A batch holds one level: a more urgent request is not slowed by less urgent rows
  // filling its batch (the rows it waits for are the batches in flight, nothing more).
  ScheduledRequest* lead = nullptr;
  size_t level = 0;
  for (auto* lists : {&queues_, &delayed_})
    for (size_t l = 0; l < lists->size() && !lead; ++l)
      if (!(*lists)[l].empty()) {
        lead = (*lists)[l].front().get();
        level = l;
      }
  if (!lead) return {};

  std::unordered_set<const ScheduledRequest*> chosen{lead};
  int64_t rows = lead->rows;
  Clock::time_point oldest = lead->request.arrival;
  bool full = !policy_.dynamic;
  if (policy_.dynamic) {
    for (auto* q : {&queues_[level], &delayed_[level]})
      for (auto& r : *q) {
        if (chosen.count(r.get()) || r->shape_key != lead->shape_key) continue;
        if (rows + r->rows > policy_.max_batch_size) {
          full = true;
          continue;
        }
        chosen.insert(r.get());
        rows += r->rows;
        oldest = std::min(oldest, r->request.arrival);
      }
    full = full || rows >= policy_.max_batch_size;
    const bool preferred =
        std::find(policy_.preferred_batch_size.begin(), policy_.preferred_batch_size.end(), rows) !=
        policy_.preferred_batch_size.end();
    const auto delay_end = oldest + std::chrono::microseconds(policy_.max_queue_delay_us);
    if (!full && !preferred && !stopping_ && now < delay_end) {
      *wake = std::min(*wake, delay_end);
      return {};
    }
  }

  std::vector<std::unique_ptr<ScheduledRequest>> batch;
  for (auto* q : {&queues_[level], &delayed_[level]})
    for (auto it = q->begin(); it != q->end();) {
      if (chosen.count(it->get())) {
        batch.push_back(std::move(*it));
        it = q->erase(it);
      } else {
        ++it;
      }
    }
  stats_.pending[level]->add(-double(batch.size()));
  queued_ -= int64_t(batch.size());
  return batch;
}

void DynamicBatcher::run_executor(size_t index) {
  std::unique_lock lock(mu_);
  for (;;) {
    Clock::time_point wake = Clock::time_point::max();
    // While a caller runs a request on this executor's instance (see enqueue), it waits.
    auto batch =
        busy_[index] ? std::vector<std::unique_ptr<ScheduledRequest>>{} : take_batch(&wake);
    if (stopping_ && queued_ == 0) cv_.notify_all();  // the other threads may exit now
    if (!batch.empty()) {
      busy_[index] = true;
      lock.unlock();
      execute(*instances_[index], batch);
      lock.lock();
      busy_[index] = false;
      continue;
    }
    if (stopping_ && queued_ == 0) return;
    if (wake == Clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, wake);
  }
}

void DynamicBatcher::execute(TensorModel& model,
                             std::vector<std::unique_ptr<ScheduledRequest>>& batch) {
  std::optional<EnergyLedger::Span> span;
  if (stats_.ledger) span.emplace(*stats_.ledger, energy_kind_);
  const Clock::time_point t0 = Clock::now();
  int64_t rows = 0;
  for (const auto& r : batch) {
    stats_.queue_seconds->inc(seconds(t0 - r->request.arrival));
    rows += r->rows;
  }
  int64_t run_rows = rows;
  if (!policy_.padded_sizes.empty())
    run_rows = *std::lower_bound(policy_.padded_sizes.begin(), policy_.padded_sizes.end(), rows);
  std::map<std::string, Tensor> inputs;
  if (batch.size() == 1 && run_rows == rows) {
    inputs = batch[0]->inputs;
  } else {
    for (const auto& [name, t] : batch[0]->inputs) inputs[name] = stack_rows(batch, name, run_rows);
  }
  const Clock::time_point t1 = Clock::now();
  std::map<std::string, Tensor> outputs;
  try {
    outputs = model.predict(inputs);
  } catch (const Error& e) {
    for (auto& r : batch) fail(std::move(r), e, false);
    return;
  } catch (const std::exception& e) {
    for (auto& r : batch) fail(std::move(r), Error(ErrorCode::internal, e.what()), false);
    return;
  }
  const Clock::time_point t2 = Clock::now();

  // Each request's rows of the outputs: views of the batch's tensors, no copy.
  std::vector<InferResult> results(batch.size());
  int64_t offset = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ScheduledRequest& r = *batch[i];
    const int64_t begin = offset;
    offset += r.rows;
    InferResponse& resp = results[i].response;
    resp.model = model_;
    resp.version = version_;
    resp.id = r.request.id;
    try {
      for (size_t k = 0; k < r.outputs.size(); ++k) {
        const std::string& name = r.outputs[k];
        auto it = outputs.find(name);
        if (it == outputs.end())
          throw Error(ErrorCode::internal,
                      "model '" + model_ + "' did not return output '" + name + "'");
        Tensor t = it->second;
        if (policy_.max_batch_size > 0) {
          if (!(t.rank() >= 1 && t.dim(0) == run_rows))
            throw Error(ErrorCode::internal, "model '" + model_ + "' returned " + t.describe() +
                                                 " for output '" + name + "' of a batch of " +
                                                 std::to_string(run_rows) + " rows");
          if (batch.size() > 1 || run_rows != rows) t = t.slice(0, begin, begin + r.rows);
        }
        if (!r.output_sample_dims[k].empty()) {
          Shape shape = r.output_sample_dims[k];
          if (policy_.max_batch_size > 0) shape.insert(shape.begin(), r.rows);
          t = t.contiguous().reshape(shape);
        }
        resp.outputs.emplace_back(name, std::move(t));
      }
    } catch (const Error& e) {
      results[i].error = e;
    }
  }
  // The counters are up to date before any client sees its response.
  const Clock::time_point t3 = Clock::now();
  if (span) {
    // Padding rows are the real rows' cost: the batch's energy goes to its requests by rows.
    const EnergyCost cost = span->finish();
    stats_.energy[batch[0]->level - 1].add(cost, double(batch.size()));
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i]->request.energy && !results[i].error) {
        const double share = double(batch[i]->rows) / double(rows);
        results[i].response.energy =
            RequestEnergy{cost.joules * share, cost.grams * share, stats_.ledger->source(), stats_.ledger->region()};
      }
  }
  stats_.exec_count->inc();
  stats_.inference_count->inc(double(rows));
  stats_.batch_size->observe(double(rows));
  stats_.compute_input_seconds->inc(seconds(t1 - t0));
  stats_.compute_infer_seconds->inc(seconds(t2 - t1));
  stats_.compute_output_seconds->inc(seconds(t3 - t2));
  for (size_t i = 0; i < batch.size(); ++i) {
    (results[i].error ? stats_.failure_other : stats_.success)->inc();
    if (!results[i].error)
      stats_.request_seconds->observe(
          std::chrono::duration<double>(t3 - batch[i]->request.arrival).count());
  }
  for (size_t i = 0; i < batch.size(); ++i) batch[i]->done(std::move(results[i]));
}

void DynamicBatcher::stop(bool drain) {
  std::vector<std::unique_ptr<ScheduledRequest>> dropped;
  {
    std::lock_guard lock(mu_);
    if (threads_.empty()) return;
    stopping_ = true;
    if (!drain) {
      for (auto* lists : {&queues_, &delayed_})
        for (size_t l = 0; l < lists->size(); ++l) {
          for (auto& r : (*lists)[l]) {
            stats_.pending[l]->add(-1);
            dropped.push_back(std::move(r));
          }
          (*lists)[l].clear();
        }
      queued_ = 0;
    }
  }
  cv_.notify_all();
  for (auto& r : dropped)
    fail(
        std::move(r),
        Error(ErrorCode::unavailable, "model '" + model_ + "' was unloaded before the request ran"),
        true);
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Requests that callers run themselves (see enqueue) finish before the batcher goes.
  std::unique_lock lock(mu_);
  cv_.wait(lock,
           [&] { return std::none_of(busy_.begin(), busy_.end(), [](bool b) { return b; }); });
}

}  // namespace slim::serve
