// Runtime integrity of loaded weights: regions of memory (mapped or packed weights) are
// registered with a checksum, and a background thread re-checks them slice by slice
// within a CPU budget, reporting any mismatch through a callback (the server turns it
// into an integrity.violation audit event and marks the model unhealthy).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace slim::trust {

struct IntegrityViolation {
  uint64_t region_id;
  std::string name;
  uint64_t expected;  // XXH3-64 at registration
  uint64_t actual;
};

struct IntegrityMonitorOptions {
  // Fraction of one core the checker may use on average (0.01 = 1%). It sleeps after
  // each slice long enough that its own thread CPU time stays within this share.
  double cpu_budget = 0.01;
  size_t slice_bytes = size_t(1) << 20;
  // Pause between two complete passes over all regions.
  std::chrono::milliseconds pass_interval{1000};
};

class IntegrityMonitor {
 public:
  using Callback = std::function<void(const IntegrityViolation&)>;

  IntegrityMonitor(Callback on_violation, IntegrityMonitorOptions options = {});
  ~IntegrityMonitor();  // stops the thread
  IntegrityMonitor(const IntegrityMonitor&) = delete;
  IntegrityMonitor& operator=(const IntegrityMonitor&) = delete;

  // Registers [data, data+size) with its current checksum. The memory must stay valid
  // until remove() returns (remove waits for a check in progress).
  uint64_t add(std::string name, const void* data, size_t size);
  // Registers with a checksum computed earlier (e.g. right after signature verification),
  // so corruption between load and registration is caught too.
  uint64_t add(std::string name, const void* data, size_t size, uint64_t expected);
  void remove(uint64_t region_id);

  void start();  // begins background checking; idempotent
  void stop();

  // Checks every region now on the calling thread; reports through the callback and
  // returns the number of mismatching regions.
  int check_now();

  uint64_t passes() const { return passes_.load(); }           // completed background passes
  uint64_t bytes_checked() const { return bytes_checked_.load(); }
  double cpu_seconds() const;  // CPU time the background thread has used

 private:
  struct Region {
    std::string name;
    const uint8_t* data;
    size_t size;
    uint64_t expected;
    bool reported = false;  // report each corruption once, not on every pass
  };
  void run();
  bool check_region_locked(uint64_t id, Region& r, int* mismatches);

  Callback callback_;
  IntegrityMonitorOptions options_;
  std::mutex mu_;  // guards regions_ and every read of region memory
  std::condition_variable cv_;
  std::map<uint64_t, Region> regions_;
  uint64_t next_id_ = 1;
  std::thread thread_;
  bool stop_ = false;
  bool running_ = false;
  std::atomic<uint64_t> passes_{0}, bytes_checked_{0};
  std::atomic<int64_t> cpu_ns_{0};
};

}  // namespace slim::trust
