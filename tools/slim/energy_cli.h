// --energy and its options for the commands that report energy (bench, forest bench,
// generate, kv-bench): one meter and one carbon model per run, the setup lines every such
// command prints, and the JSON they write.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "slim/energy/carbon.h"
#include "slim/energy/meter.h"
#include "slim/energy/report.h"

namespace slim::cli {

struct EnergyArgs {
  bool on = false;
  energy::CarbonOptions carbon;
  std::string cpu_model;  // a CCF microarchitecture instead of the probed CPU's
};

// --energy, --region, --grid-intensity, --grid-series, --pue, --cpu-model.
void add_energy_options(CLI::App* cmd, EnergyArgs* args);
// The carbon and CPU-model options alone (for `slim energy`).
std::vector<CLI::Option*> add_carbon_options(CLI::App* cmd, EnergyArgs* args);

class EnergyRun {
 public:
  // Finds the meter and checks the carbon options; a measured meter then measures idle
  // power over `idle_seconds` of sleep before the work.
  explicit EnergyRun(const EnergyArgs& args, double idle_seconds = 1.0);

  energy::EnergyMeter& meter() { return meter_; }
  energy::EnergyReport report(const energy::Reading& from, const energy::Reading& to) const;

  // "energy:", "  not measured: ...", "idle power:" and "grid:" lines, labels padded to `width`.
  void print_setup(FILE* out, int width) const;
  // "1.23 mJ per token (812 tokens/J)"
  static std::string per_unit(const energy::EnergyReport& r, double count, const std::string& unit);
  // "162 ugCO2e per token, idle 1.2 mgCO2e"
  static std::string carbon_line(const energy::EnergyReport& r, double count,
                                 const std::string& unit);
  // {"notes": [...], "idle_basis": ...}: what the window reports do not repeat.
  nlohmann::json setup_json() const;

 private:
  energy::EnergyMeter meter_;
  energy::CarbonModel carbon_;
  std::string idle_from_;
};

energy::MeterOptions meter_options(const EnergyArgs& args);

}  // namespace slim::cli
