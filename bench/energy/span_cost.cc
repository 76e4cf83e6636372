// What `slim serve --energy` adds to each batch, in process: a loop of EnergyLedger spans
// around no work (two meter readings, a CpuTimeScope, the attribution and three counter
// adds) with N idle threads beside it, since the process CPU clock that every reading
// takes sums the CPU time of every thread (a server has about a hundred).
//   energy_span_cost [SPANS] [IDLE_THREADS]   (default 200000 100)
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "slim/serve/energy_ledger.h"

int main(int argc, char** argv) {
  using namespace slim;
  const int spans = argc > 1 ? std::atoi(argv[1]) : 200000, idle = argc > 2 ? std::atoi(argv[2]) : 100;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < idle; ++i)
    threads.emplace_back([&] {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stop; });
    });
  serve::Metrics metrics;
  serve::EnergyLedger ledger(energy::MeterOptions{}, energy::CarbonOptions{}, metrics);
  serve::EnergyLedger::Kind kind;
  const serve::EnergyLedger::Series series = ledger.series("model", "1", "1");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < spans; ++i) {
    serve::EnergyLedger::Span span(ledger, kind);
    series.add(span.finish(), 1);
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%.2f us per span (%d spans, %d idle threads; meter: %s)\n", us / spans, spans, idle,
              ledger.source().c_str());
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
}
