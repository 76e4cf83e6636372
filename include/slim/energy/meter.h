// Energy meters. A meter is read around any piece of work; two readings make the energy of
// that window, with idle power apart, and attribute() splits a window over concurrent work
// by CPU time. Sources are found once, in this order: Linux powercap RAPL (package and
// DRAM), the perf `power` PMU, then Cloud Carbon Footprint's estimate from CPU time where
// nothing can be read; NVIDIA GPUs through NVML (loaded at run time) when asked for. Every
// channel says whether it is measured or estimated, and from what.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slim/energy/power_model.h"

namespace slim::energy {

enum class Basis { measured, estimated };
const char* basis_name(Basis basis);

// One energy counter of a meter.
struct Channel {
  std::string name;    // "package-0", "dram-0", "gpu-0", "cpu", "memory"
  std::string source;  // "powercap RAPL", "perf power PMU", "NVML: NVIDIA H200", "Cloud Carbon
                       // Footprint ..."
  Basis basis = Basis::estimated;
  // Power drawn with no work: measured by EnergyMeter::measure_idle, or the model's
  // (vCPUs x min watts for the estimated CPU, 0 for memory).
  double idle_watts = 0;
};

struct MeterOptions {
  std::string powercap_root = "/sys/class/powercap";
  std::string perf_pmu = "/sys/bus/event_source/devices/power";
  std::string nvml_library = "libnvidia-ml.so.1";
  bool measured = true;  // false: the estimate only
  bool gpus = false;     // also NVIDIA GPUs through NVML (machine-wide, so off for CPU work)
  std::optional<CpuPowerModel> cpu_model;  // for the estimate; default: CpuPowerModel::detect()
  int vcpus = 0;                           // for the estimate; 0: available_vcpus()
  // Opens a counter file (returns an fd or -errno). Tests simulate permission errors that
  // root would not see; default ::open.
  std::function<int(const char* path)> open_file;
};

// A snapshot of a meter: cumulative joules per channel since the meter was made.
struct Reading {
  double seconds = 0;           // steady clock
  double unix_seconds = 0;      // system clock (for hourly grid intensities)
  double cpu_seconds = 0;       // this process's CPU time
  double busy_cpu_seconds = 0;  // the machine's busy CPU time (measured meters; else cpu_seconds)
  std::vector<double> joules;
};

// The energy of the window between two readings.
struct Energy {
  double seconds = 0, cpu_seconds = 0, busy_cpu_seconds = 0;
  double start_unix = 0, end_unix = 0;
  std::vector<double> joules;  // per channel
  std::vector<double>
      idle_joules;  // per channel: idle watts x seconds, at most the channel's joules
  double total() const;
  double idle() const;
  double work() const { return total() - idle(); }  // above idle, by every process
};

class EnergyMeter {
 public:
  explicit EnergyMeter(MeterOptions options = {});
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  const std::vector<Channel>& channels() const { return channels_; }
  Basis basis() const;  // measured when every channel is
  // "measured: powercap RAPL (package-0, dram-0)" or "estimated: CPU time x ...".
  std::string describe() const;
  // Why each measured source that was tried is not used ("powercap RAPL: .../energy_uj:
  // permission denied ..."); empty when the first one works.
  const std::vector<std::string>& notes() const { return notes_; }

  Reading read();
  void read(Reading& into);  // reuses into's storage: no allocation once sized
  Energy between(const Reading& from, const Reading& to) const;

  // Sets the idle power of the measured channels from `seconds` of this thread sleeping
  // (the caller keeps other work off meanwhile); estimated channels keep the model's.
  void measure_idle(double seconds);
  double idle_watts() const;  // all channels

  struct Source;

 private:
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<Channel> channels_;
  std::vector<std::string> notes_;
  bool machine_cpu_ = false;  // read /proc/stat: the counters see the whole machine
  int stat_fd_ = -1;
  std::mutex mu_;
};

// A window's energy split over pieces of work that ran in it, by their CPU seconds
// (CpuTimeAccount): each gets work() x its CPU seconds / the busy CPU seconds of the window
// (or their sum, when larger). `other` is the rest of the work (threads and processes not
// listed); idle power stays apart.
struct Attribution {
  std::vector<double> joules;
  double other = 0, idle = 0;
};
Attribution attribute(const Energy& window, std::span<const double> cpu_seconds);

}  // namespace slim::energy
