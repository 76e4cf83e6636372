#include "slim/energy/carbon.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "slim/core/error.h"

using namespace slim;
using namespace slim::energy;
namespace fs = std::filesystem;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const char* env = std::getenv("SLIM_TEST_TMP");
  const fs::path p = fs::path(env ? env : fs::temp_directory_path().string()) /
                     ("slim_carbon_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Carbon, RegionsComeFromTheBundledTable) {
  CarbonOptions o;
  o.region = "DEU";
  const CarbonModel m(o);
  EXPECT_EQ(m.g_per_kwh(0, 0), 342.06);
  EXPECT_DOUBLE_EQ(m.grams(3.6e6, 0, 0), 342.06);  // 1 kWh
  EXPECT_EQ(m.describe().rfind("DEU 342.06 g/kWh (Ember annual averages via @tgwf/co2@0.19.0", 0),
            0u)
      << m.describe();
  EXPECT_GT(grid_regions().size(), 200u);
}

TEST(Carbon, DefaultIsSlimRegionThenWorld) {
  unsetenv("SLIM_REGION");
  EXPECT_EQ(CarbonModel().region(), "WORLD");
  EXPECT_EQ(CarbonModel().g_per_kwh(0, 0), 472.94);
  setenv("SLIM_REGION", "fra", 1);
  EXPECT_EQ(CarbonModel().region(), "FRA");
  unsetenv("SLIM_REGION");
}

TEST(Carbon, IntensityAndPueOverrides) {
  CarbonOptions o;
  o.region = "FRA";
  o.grid_intensity = 100;
  o.pue = 1.2;
  const CarbonModel m(o);
  EXPECT_DOUBLE_EQ(m.grams(3.6e6 * 2, 0, 0), 2 * 100 * 1.2);
  EXPECT_EQ(m.describe(), "FRA 100 g/kWh (given), PUE 1.2");
}

TEST(Carbon, BadOptionsAreNamed) {
  CarbonOptions o;
  o.region = "Atlantis";
  EXPECT_EQ(error_of([&] {
              CarbonModel{o};
            }).rfind("unknown region 'ATLANTIS': give an ISO 3166 alpha-3", 0),
            0u);
  o.region = "";
  o.pue = 0.9;
  EXPECT_EQ(error_of([&] { CarbonModel{o}; }),
            "PUE must be a number >= 1 (facility power / IT power), got 0.9");
  o.pue = 1;
  o.grid_intensity = -3;
  EXPECT_EQ(error_of([&] { CarbonModel{o}; }), "grid intensity must be >= 0 g/kWh, got -3");
  o.series_file = "x.csv";
  EXPECT_EQ(error_of([&] { CarbonModel{o}; }),
            "give a grid intensity or a grid intensity series, not both");
}

TEST(Carbon, Timestamps) {
  EXPECT_EQ(parse_timestamp("1714568400"), 1714568400.0);
  EXPECT_EQ(parse_timestamp("2024-05-01T13:00:00Z"), 1714568400.0);
  EXPECT_EQ(parse_timestamp("2024-05-01 13:00"), 1714568400.0);
  EXPECT_EQ(parse_timestamp("2024-05-01T15:00:00+02:00"), 1714568400.0);
  EXPECT_EQ(parse_timestamp("2024-05-01T12:30:30.5-0030"), 1714568400.0 + 30.5);
  EXPECT_EQ(parse_timestamp("1970-01-01T00:00Z"), 0.0);
  EXPECT_EQ(parse_timestamp("yesterday"), std::nullopt);
  EXPECT_EQ(parse_timestamp("2024-13-01T00:00Z"), std::nullopt);
}

TEST(Carbon, SeriesIsAveragedOverTheWindowByTime) {
  const std::string f = write_file("series.csv",
                                   "timestamp,g_per_kwh\n"
                                   "2024-05-01T00:00:00Z,100\n"
                                   "# a comment\n"
                                   "2024-05-01T01:00:00Z,200\n"
                                   "2024-05-01T02:00:00Z,400\n");
  CarbonOptions o;
  o.series_file = f;
  const CarbonModel m(o);
  const double t0 = *parse_timestamp("2024-05-01T00:00:00Z");
  EXPECT_DOUBLE_EQ(m.g_per_kwh(t0 + 600, t0 + 600), 100);
  EXPECT_DOUBLE_EQ(m.g_per_kwh(t0 + 1800, t0 + 5400), 150);      // half an hour of each
  EXPECT_DOUBLE_EQ(m.g_per_kwh(t0 + 3600, t0 + 3 * 3600), 300);  // the last row holds one step
  EXPECT_DOUBLE_EQ(m.grams(3.6e6, t0 + 7200, t0 + 7300), 400);
  EXPECT_EQ(
      error_of([&] { m.g_per_kwh(t0 - 1, t0 + 1); }),
      "grid intensity series " + f +
          ": covers unix time 1714521600 to 1714532400, not the window 1714521599 to 1714521601");
  EXPECT_EQ(m.describe(), "WORLD grid intensity series " + f + ", PUE 1");
  fs::remove(f);
}

TEST(Carbon, BadSeriesFilesAreNamedWithTheLine) {
  const std::string bad = write_file("bad.csv", "2024-05-01T00:00Z,100\nnot a row\n");
  EXPECT_EQ(error_of([&] { read_grid_series(bad); }),
            bad + ":2: expected 'timestamp,g_per_kwh' (unix seconds or ISO 8601), got 'not a row'");
  const std::string order = write_file("order.csv", "200,1\n100,2\n");
  EXPECT_EQ(error_of([&] { read_grid_series(order); }), order + ":2: timestamps must increase");
  const std::string empty = write_file("empty.csv", "timestamp,g\n");
  EXPECT_EQ(error_of([&] { read_grid_series(empty); }),
            empty + ": no rows of 'timestamp,g_per_kwh'");
  EXPECT_EQ(error_of([&] { read_grid_series("/nonexistent/grid.csv"); }),
            "/nonexistent/grid.csv: cannot open the grid intensity series");
  for (const auto& f : {bad, order, empty}) fs::remove(f);
}
