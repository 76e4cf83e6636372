// Carbon: gCO2e = kWh x grid intensity x PUE. The intensity is a region's annual average
// from the bundled table (Ember's, as CO2.js publishes them), a fixed value, or a time
// series (CSV of timestamp, g/kWh: hourly data a user has) averaged over the window.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace slim::energy {

struct GridRegion {
  std::string code;  // ISO 3166 alpha-3 ("FRA") or an aggregate ("WORLD", "EU")
  double g_per_kwh = 0;
};
const std::vector<GridRegion>& grid_regions();  // the bundled table, by code
const char* grid_source();                      // its source, package version and years

struct CarbonOptions {
  std::string region;                    // empty: SLIM_REGION, else WORLD
  std::optional<double> grid_intensity;  // g/kWh: replaces the region's average
  std::string series_file;  // CSV rows "timestamp,g_per_kwh" (unix seconds or ISO 8601)
  double pue = 1.0;         // power usage effectiveness of the facility, >= 1
};

class CarbonModel {
 public:
  // Validates everything (unknown region, bad PUE, unreadable or unsorted series) up front.
  explicit CarbonModel(const CarbonOptions& options = {});

  // Grams CO2e of `joules` used from `start_unix` to `end_unix` (the series is averaged
  // over that span, weighted by time; a fixed intensity ignores it).
  double grams(double joules, double start_unix, double end_unix) const;
  double g_per_kwh(double start_unix, double end_unix) const;
  double pue() const { return pue_; }
  const std::string& region() const { return region_; }
  // "FRA 44.18 g/kWh (Ember annual averages via ...), PUE 1"
  std::string describe() const;

 private:
  std::string region_, source_;
  double g_per_kwh_ = 0, pue_ = 1;
  std::vector<std::pair<double, double>> series_;  // (unix seconds, g/kWh), increasing
  std::string series_file_;
};

// Parses a time series file; exposed for tests. Errors name the file and line.
std::vector<std::pair<double, double>> read_grid_series(const std::string& path);
// Unix seconds of "1714567200", "2024-05-01T13:00:00Z", "2024-05-01 13:00+02:00" (no zone
// means UTC); nullopt when it is none of these.
std::optional<double> parse_timestamp(const std::string& text);

}  // namespace slim::energy
