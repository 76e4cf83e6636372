// Energy of served work (`slim serve --energy`): the meter is read around each batch of a
// tensor model and each step of a language model, and the window's energy above idle is
// attributed to that work by its CPU time; the counters go to the metrics per model,
// version and priority, and the process's idle and total energy apart at each scrape.
//
// The CPU time of a span is what a CpuTimeScope sees (the thread that runs it and the pool
// workers while they run its chunks) plus, for oneDNN's OpenMP threads, which no scope sees
// and which come and go as teams resize: a span that ran alone (no other batch or step
// started or ran during it) is charged the process's CPU time over the span; a span that
// overlapped others is charged what its scopes saw times the ratio of process CPU to scope
// CPU learnt from its kind's spans that ran alone, at most the process's CPU over the span.
// So two models running at once each get their own share, not half of the sum.
//
// Reading the meter costs several microseconds (the process CPU clock sums every thread of
// the server), too much for a batch of a micro-model, so a kind's spans are metered this
// way at most every kSampleSeconds (and until one has taught it its rate): the others
// read only their thread clocks and are charged their CPU time (times the kind's ratio)
// at the joules per CPU second its last metered spans showed (a moving average).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "slim/core/thread_pool.h"
#include "slim/energy/carbon.h"
#include "slim/energy/meter.h"
#include "slim/serve/metrics.h"

namespace slim::serve {

struct EnergyCost {
  double joules = 0, grams = 0;
};

class EnergyLedger {
 public:
  // Finds the meter (measuring its idle power over a second of sleep when it is a measured
  // one) and checks the carbon options; registers the process counters on `metrics`.
  EnergyLedger(const energy::MeterOptions& meter, const energy::CarbonOptions& carbon, Metrics& metrics);

  // "estimated", or "measured:" and the measured sources ("measured:powercap RAPL").
  const std::string& source() const { return source_; }
  const std::string& region() const { return carbon_.region(); }
  // The lines `slim serve` logs at start: the meter, why sources are not measured, idle, grid.
  std::vector<std::string> describe() const;

  // The counters of one model version at one priority.
  struct Series {
    Counter *joules = nullptr, *grams = nullptr, *requests = nullptr;
    void add(const EnergyCost& c, double requests) const;
  };
  Series series(const std::string& model, const std::string& version, const std::string& priority);

  // One kind of work (a model version's batches, a language model's steps): the ratio of
  // process CPU to scope CPU of its spans that ran alone.
  class Kind {
   private:
    friend class EnergyLedger;
    std::atomic<double> ratio_{0};  // 0: no span of this kind ran alone yet
    std::atomic<double> rate_{0};   // J per charged CPU second of metered spans; 0: none yet
    std::atomic<double> metered_at_{-1e9};  // steady seconds of the last metered span's start
  };
  static constexpr double kSampleSeconds = 0.01;

  // One batch or step on the calling thread: reads the meter and opens a CpuTimeScope at
  // construction; finish() closes both and returns the span's cost. A span dropped without
  // finish() (the work failed) charges nobody.
  class Span {
   public:
    Span(EnergyLedger& ledger, Kind& kind);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    EnergyCost finish();

   private:
    EnergyLedger& ledger_;
    Kind& kind_;
    CpuTimeAccount account_;
    std::optional<CpuTimeScope> scope_;
    energy::Reading start_;
    uint64_t ticket_ = 0;
    bool alone_ = false, open_ = true, metered_ = false;
  };

 private:
  double grams(double joules, double start_unix, double end_unix);
  void collect(Metrics& m);  // idle and process energy since the last scrape

  energy::EnergyMeter meter_;
  energy::CarbonModel carbon_;
  std::string source_, idle_from_;
  Metrics& metrics_;
  std::atomic<int> running_{0};        // spans open now
  std::atomic<uint64_t> started_{0};   // spans ever opened
  std::atomic<bool> series_warned_{false};
  std::mutex collect_mu_;
  energy::Reading last_;  // the reading of the last scrape
};

}  // namespace slim::serve
