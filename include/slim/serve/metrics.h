// Metrics: counters, gauges and histograms with labels, rendered in the Prometheus text
// exposition format (version 0.0.4). Series are created when a model loads and kept by
// pointer, so the request path only does atomic adds.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace slim::serve {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  // For collectors that copy a total kept elsewhere (the kernel's CPU time of the process).
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending; +Inf implied
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound (+Inf last), the sum and the count, read together.
  void snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound, +Inf last (not cumulative)
  std::atomic<double> sum_{0};
};

class Metrics {
 public:
  // The series of family `name` with these labels, created on first use. The family's
  // help and type are fixed by its first registration; the reference stays valid until
  // remove_series() drops it.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& bounds, const Labels& labels = {});
  // Drops every series whose labels include all of `match` (a model version unloading).
  void remove_series(const Labels& match);
  // Runs before each render (process CPU and memory gauges are read then).
  void add_collector(std::function<void(Metrics&)> collect);
  std::string render();

 private:
  enum class Kind { counter, gauge, histogram };
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> c;
    std::unique_ptr<Gauge> g;
    std::unique_ptr<Histogram> h;
  };
  struct Family {
    Kind kind;
    std::string help;
    std::map<std::string, Series> series;  // by rendered label set
  };
  Series& series(const std::string& name, const std::string& help, Kind kind, const Labels& labels);

  std::mutex mu_;
  std::map<std::string, Family> families_;
  std::vector<std::function<void(Metrics&)>> collectors_;
};

// Bucket bounds: `count` bounds from `start`, each `factor` times the one before.
std::vector<double> exponential_buckets(double start, double factor, int count);

}  // namespace slim::serve
