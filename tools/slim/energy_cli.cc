#include "energy_cli.h"

namespace slim::cli {

std::vector<CLI::Option*> add_carbon_options(CLI::App* cmd, EnergyArgs* a) {
  std::vector<CLI::Option*> opts;
  opts.push_back(cmd->add_option(
      "--region", a->carbon.region,
      "Grid region for carbon: ISO 3166 alpha-3 country (FRA) or WORLD, EU, ... (default: "
      "SLIM_REGION, else WORLD; `slim energy regions` lists them)"));
  opts.push_back(cmd->add_option_function<double>(
      "--grid-intensity", [a](double g) { a->carbon.grid_intensity = g; },
      "Grid carbon intensity in gCO2e/kWh instead of the region's annual average"));
  opts.push_back(cmd->add_option("--grid-series", a->carbon.series_file,
                                 "CSV of timestamp,gCO2e/kWh (unix seconds or ISO 8601; hourly "
                                 "data): averaged over the work"));
  opts.push_back(
      cmd->add_option("--pue", a->carbon.pue, "Power usage effectiveness of the facility (>= 1)")
          ->capture_default_str());
  opts.push_back(cmd->add_option(
      "--cpu-model", a->cpu_model,
      "Estimate with this CPU's Cloud Carbon Footprint coefficients (\"Cascade Lake\"; "
      "default: the probed CPU's)"));
  return opts;
}

void add_energy_options(CLI::App* cmd, EnergyArgs* a) {
  auto* flag = cmd->add_flag(
      "--energy", a->on,
      "Report energy (measured with RAPL where readable, else estimated from CPU time) and "
      "carbon; idle power apart");
  for (auto* opt : add_carbon_options(cmd, a)) opt->needs(flag);
}

energy::MeterOptions meter_options(const EnergyArgs& a) {
  energy::MeterOptions o;
  if (!a.cpu_model.empty()) o.cpu_model = energy::CpuPowerModel::named(a.cpu_model);
  return o;
}

EnergyRun::EnergyRun(const EnergyArgs& a, double idle_seconds)
    : meter_(meter_options(a)), carbon_(a.carbon) {
  idle_from_ = energy::measure_idle_power(meter_, idle_seconds);
}

energy::EnergyReport EnergyRun::report(const energy::Reading& from,
                                       const energy::Reading& to) const {
  return energy::make_report(meter_, meter_.between(from, to), carbon_);
}

void EnergyRun::print_setup(FILE* out, int width) const {
  for (const auto& [label, text] : energy::describe_setup(meter_, carbon_, idle_from_))
    std::fprintf(out, "%-*s%s\n", width, label.empty() ? "" : (label + ":").c_str(), text.c_str());
}

std::string EnergyRun::per_unit(const energy::EnergyReport& r, double count,
                                const std::string& unit) {
  std::string s = energy::si(r.work_joules / count, "J") + " per " + unit;
  if (r.work_joules > 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " (%.4g %ss/J)", count / r.work_joules, unit.c_str());
    s += buf;
  }
  if (r.other_joules > 0) s += "; other processes " + energy::si(r.other_joules, "J") + " apart";
  return s;
}

std::string EnergyRun::carbon_line(const energy::EnergyReport& r, double count,
                                   const std::string& unit) {
  return energy::si(r.work_grams / count, "gCO2e") + " per " + unit + ", idle " +
         energy::si(r.idle_grams, "gCO2e");
}

nlohmann::json EnergyRun::setup_json() const {
  return {{"notes", meter_.notes()}, {"idle_from", idle_from_}};
}

}  // namespace slim::cli
