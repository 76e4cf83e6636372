#include "slim/trust/integrity_monitor.h"

#include <time.h>

#include <algorithm>
#include <vector>

#include "slim/core/error.h"
#include "slim/trust/digest.h"

namespace slim::trust {

namespace {
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

IntegrityMonitor::IntegrityMonitor(Callback on_violation, IntegrityMonitorOptions options)
    : callback_(std::move(on_violation)), options_(options) {
  if (!callback_) throw Error(ErrorCode::invalid_argument, "IntegrityMonitor needs a callback");
  if (!(options_.cpu_budget > 0 && options_.cpu_budget <= 1))
    throw Error(ErrorCode::invalid_argument, "IntegrityMonitor cpu_budget must be in (0, 1]");
  if (options_.slice_bytes == 0) options_.slice_bytes = size_t(1) << 20;
}

IntegrityMonitor::~IntegrityMonitor() { stop(); }

uint64_t IntegrityMonitor::add(std::string name, const void* data, size_t size) {
  return add(std::move(name), data, size, fast_checksum(data, size));
}

uint64_t IntegrityMonitor::add(std::string name, const void* data, size_t size, uint64_t expected) {
  if (!data && size) throw Error(ErrorCode::invalid_argument, "IntegrityMonitor: null region " + name);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  regions_[id] = Region{std::move(name), static_cast<const uint8_t*>(data), size, expected};
  return id;
}

void IntegrityMonitor::remove(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(region_id);
}

void IntegrityMonitor::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) return;
  stop_ = false;
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

void IntegrityMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

double IntegrityMonitor::cpu_seconds() const { return double(cpu_ns_.load()) * 1e-9; }

bool IntegrityMonitor::check_region_locked(uint64_t id, Region& r, int* mismatches) {
  const uint64_t actual = fast_checksum(r.data, r.size);
  if (actual == r.expected) {
    r.reported = false;
    return true;
  }
  ++*mismatches;
  if (!r.reported) {
    r.reported = true;
    callback_(IntegrityViolation{id, r.name, r.expected, actual});
  }
  return false;
}

int IntegrityMonitor::check_now() {
  std::lock_guard<std::mutex> lock(mu_);
  int mismatches = 0;
  for (auto& [id, r] : regions_) check_region_locked(id, r, &mismatches);
  return mismatches;
}

void IntegrityMonitor::run() {
  FastChecksum sum;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Snapshot ids: regions may come and go between slices, and a removed one is simply
    // skipped when its turn comes.
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : regions_) ids.push_back(id);
    for (uint64_t id : ids) {
      size_t offset = 0;
      sum.reset();
      for (;;) {
        if (stop_) return;
        auto it = regions_.find(id);
        if (it == regions_.end()) break;
        Region& r = it->second;
        const size_t n = std::min(options_.slice_bytes, r.size - offset);
        const int64_t t0 = thread_cpu_ns();
        sum.update(r.data + offset, n);
        offset += n;
        bytes_checked_ += n;
        bool done = offset >= r.size;
        if (done) {
          const uint64_t actual = sum.value();
          if (actual != r.expected) {
            if (!r.reported) {
              r.reported = true;
              IntegrityViolation v{id, r.name, r.expected, actual};
              // The callback may call back into the monitor (remove the region), so it
              // runs without the lock.
              lock.unlock();
              callback_(v);
              lock.lock();
            }
          } else if (regions_.count(id)) {
            regions_.at(id).reported = false;
          }
        }
        const int64_t used = thread_cpu_ns() - t0;
        cpu_ns_ += used;
        // Sleeping used*(1/budget - 1) after each slice keeps CPU/wall at the budget.
        const auto pause = std::chrono::nanoseconds(int64_t(double(used) * (1.0 / options_.cpu_budget - 1.0)));
        cv_.wait_for(lock, pause, [&] { return stop_; });
        if (done) break;
      }
    }
    ++passes_;
    cv_.wait_for(lock, options_.pass_interval, [&] { return stop_; });
  }
}

}  // namespace slim::trust
