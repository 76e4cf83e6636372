// Measures how much CPU the IntegrityMonitor's background thread really uses against
// its budget, and how long a full pass over the registered memory takes.
//   bench/trust/monitor_budget.sh [BUILD_DIR]   (env: MB=256 SECONDS=10 BUDGET=0.01)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "slim/trust/integrity_monitor.h"

int main() {
  const size_t mb = std::getenv("MB") ? std::strtoul(std::getenv("MB"), nullptr, 10) : 256;
  const double secs = std::getenv("SECONDS") ? std::atof(std::getenv("SECONDS")) : 10;
  const double budget = std::getenv("BUDGET") ? std::atof(std::getenv("BUDGET")) : 0.01;
  std::vector<uint8_t> weights(mb << 20);
  for (size_t i = 0; i < weights.size(); i += 4096) weights[i] = uint8_t(i >> 12);
  int violations = 0;
  slim::trust::IntegrityMonitorOptions o;
  o.cpu_budget = budget;
  o.pass_interval = std::chrono::milliseconds(0);
  slim::trust::IntegrityMonitor monitor([&](const slim::trust::IntegrityViolation&) { ++violations; }, o);
  monitor.add("weights", weights.data(), weights.size());
  const auto t0 = std::chrono::steady_clock::now();
  monitor.start();
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  monitor.stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = monitor.cpu_seconds();
  const double gb = double(monitor.bytes_checked()) / 1e9;
  std::printf("region %zu MiB, budget %.2f%% of one core, %.1f s wall\n", mb, budget * 100, wall);
  std::printf("checker CPU %.3f s = %.3f%% of one core; checked %.2f GB (%.1f MB/s while running,"
              " %.0f MB/s per CPU second); %llu full passes; %d violations\n",
              cpu, 100 * cpu / wall, gb, gb * 1e3 / wall, cpu > 0 ? gb * 1e3 / cpu : 0.0,
              (unsigned long long)monitor.passes(), violations);
  return violations == 0 ? 0 : 1;
}
