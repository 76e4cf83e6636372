#include "slim/energy/report.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace slim::energy {

EnergyReport make_report(const EnergyMeter& meter, const Energy& w, const CarbonModel& carbon) {
  EnergyReport r;
  r.basis = meter.basis();
  r.source = meter.describe();
  r.seconds = w.seconds;
  r.cpu_seconds = w.cpu_seconds;
  const double process_cpu = w.cpu_seconds;
  const Attribution a = attribute(w, std::span<const double>(&process_cpu, 1));
  r.work_joules = a.joules[0];
  r.other_joules = a.other;
  r.idle_joules = a.idle;
  r.idle_watts = meter.idle_watts();
  r.work_grams = carbon.grams(r.work_joules, w.start_unix, w.end_unix);
  r.idle_grams = carbon.grams(r.idle_joules, w.start_unix, w.end_unix);
  r.region = carbon.region();
  r.g_per_kwh = carbon.g_per_kwh(w.start_unix, w.end_unix);
  r.pue = carbon.pue();
  r.carbon = carbon.describe();
  return r;
}

nlohmann::json to_json(const EnergyReport& r, double count, const std::string& unit) {
  nlohmann::json j = {{"basis", basis_name(r.basis)},
                      {"source", r.source},
                      {"seconds", r.seconds},
                      {"cpu_seconds", r.cpu_seconds},
                      {"work_j", r.work_joules},
                      {"other_j", r.other_joules},
                      {"idle_j", r.idle_joules},
                      {"idle_w", r.idle_watts},
                      {"work_gco2e", r.work_grams},
                      {"idle_gco2e", r.idle_grams},
                      {"region", r.region},
                      {"g_per_kwh", r.g_per_kwh},
                      {"pue", r.pue},
                      {"carbon", r.carbon}};
  if (count > 0) {
    if (count == std::floor(count) && count < 9e15)
      j[unit + "s"] = int64_t(count);
    else
      j[unit + "s"] = count;
    j["j_per_" + unit] = r.work_joules / count;
    j[unit + "s_per_j"] =
        r.work_joules > 0 ? nlohmann::json(count / r.work_joules) : nlohmann::json(nullptr);
    j["gco2e_per_" + unit] = r.work_grams / count;
  }
  return j;
}

std::string measure_idle_power(EnergyMeter& meter, double seconds) {
  if (meter.basis() != Basis::measured) return "the model's: vCPUs x min watts";
  meter.measure_idle(seconds);
  char buf[64];
  std::snprintf(buf, sizeof buf, "measured over %g s of sleep before the work", seconds);
  return buf;
}

std::vector<std::pair<std::string, std::string>> describe_setup(const EnergyMeter& meter,
                                                                const CarbonModel& carbon,
                                                                const std::string& idle_from) {
  std::vector<std::pair<std::string, std::string>> lines = {{"energy", meter.describe()}};
  for (const auto& n : meter.notes()) lines.emplace_back("", "  not measured: " + n);
  lines.emplace_back("idle power",
                     si(meter.idle_watts(), "W") + " (" + idle_from + "), reported apart from the work");
  lines.emplace_back("grid", carbon.describe());
  return lines;
}

std::string si(double v, const std::string& unit) {
  static const struct {
    double scale;
    const char* prefix;
  } steps[] = {{1e12, "T"}, {1e9, "G"},  {1e6, "M"},  {1e3, "k"},
               {1, ""},     {1e-3, "m"}, {1e-6, "u"}, {1e-9, "n"}};
  char buf[48];
  if (v == 0 || !std::isfinite(v)) {
    std::snprintf(buf, sizeof buf, "%g %s", v, unit.c_str());
    return buf;
  }
  for (const auto& s : steps)
    if (std::fabs(v) >= s.scale * 0.9995 || s.scale == 1e-9) {
      std::snprintf(buf, sizeof buf, "%.3g %s%s", v / s.scale, s.prefix, unit.c_str());
      return buf;
    }
  return buf;
}

}  // namespace slim::energy
