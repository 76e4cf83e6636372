// The meter's sources: each turns one kind of counter into cumulative joules per channel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "slim/energy/meter.h"

namespace slim::energy {

struct EnergyMeter::Source {
  virtual ~Source() = default;
  // Writes the joules of each channel since the source was opened to out[0..channels.size()).
  // seconds and cpu_seconds are the reading's clocks (the estimate and power x time use them).
  virtual void read(double seconds, double cpu_seconds, double* out) = 0;
  std::vector<Channel> channels;
};
using SourcePtr = std::unique_ptr<EnergyMeter::Source>;

// Each returns nullptr when it cannot be used and says why in notes (also what it skipped
// when it can be used).
SourcePtr open_powercap(const MeterOptions& options, std::vector<std::string>& notes);
SourcePtr open_perf_power(const MeterOptions& options, std::vector<std::string>& notes);
SourcePtr open_nvml(const MeterOptions& options, std::vector<std::string>& notes);
SourcePtr open_estimate(const MeterOptions& options, double seconds, double cpu_seconds);

double steady_seconds();
double process_cpu_seconds();
// "permission denied" etc. for a negative errno.
std::string errno_text(int negative_errno);

}  // namespace slim::energy
