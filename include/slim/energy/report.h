// What a window of work cost, in the one form every front door prints and writes to JSON
// (bench, generate, kv-bench, later serve metrics and `slim report energy`): this
// process's energy above idle, idle power apart, the work of other processes apart (a
// machine-wide meter sees them), and the carbon of each.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "slim/energy/carbon.h"
#include "slim/energy/meter.h"

namespace slim::energy {

struct EnergyReport {
  Basis basis = Basis::estimated;
  std::string source;  // EnergyMeter::describe()
  double seconds = 0, cpu_seconds = 0;
  double work_joules = 0;   // this process, above idle
  double other_joules = 0;  // other processes, above idle (measured meters only)
  double idle_joules = 0, idle_watts = 0;
  double work_grams = 0, idle_grams = 0;  // gCO2e
  std::string region;
  double g_per_kwh = 0, pue = 1;
  std::string carbon;  // CarbonModel::describe()
};

EnergyReport make_report(const EnergyMeter& meter, const Energy& window, const CarbonModel& carbon);

// {"basis", "source", "seconds", "cpu_seconds", "work_j", "other_j", "idle_j", "idle_w",
//  "work_gco2e", "idle_gco2e", "region", "g_per_kwh", "pue", "carbon"}; with `count` > 0
// also "<unit>s", "j_per_<unit>", "<unit>s_per_j" and "gco2e_per_<unit>".
nlohmann::json to_json(const EnergyReport& report, double count = 0, const std::string& unit = "");

// Sets a measured meter's idle power from `seconds` of this thread sleeping (nothing for an
// estimate) and says where the idle power comes from, for describe_setup.
std::string measure_idle_power(EnergyMeter& meter, double seconds);
// What a front door prints before its numbers, as (label, text) lines: the meter, a
// "not measured" line per note (empty label), the idle power and where it comes from, the grid.
std::vector<std::pair<std::string, std::string>> describe_setup(const EnergyMeter& meter,
                                                                const CarbonModel& carbon,
                                                                const std::string& idle_from);

// "1.23 mJ", "456 uJ", "7.8 kJ": three significant digits with an SI prefix.
std::string si(double value, const std::string& unit);

}  // namespace slim::energy
