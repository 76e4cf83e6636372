#include "slim/energy/carbon.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "energy/tables.h"
#include "slim/core/error.h"

namespace slim::energy {

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\"");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\"") - a + 1);
}

std::optional<double> parse_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Days since 1970-01-01 of a proleptic Gregorian date.
int64_t days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  return era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

const std::vector<GridRegion>& grid_regions() {
  static const std::vector<GridRegion> regions = [] {
    std::vector<GridRegion> v;
    for (size_t i = 0; i < tables::kNumGridRows; ++i)
      v.push_back({tables::kGridRows[i].region, tables::kGridRows[i].g_per_kwh});
    return v;
  }();
  return regions;
}

const char* grid_source() {
  return tables::kGridSource;
}

std::optional<double> parse_timestamp(const std::string& text) {
  const std::string s = trim(text);
  if (auto v = parse_number(s)) return v;
  int y, mo, d, h, mi, used = 0;
  char sep;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c%2d:%2d%n", &y, &mo, &d, &sep, &h, &mi, &used) != 6 ||
      (sep != 'T' && sep != ' ') || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59)
    return std::nullopt;
  double sec = 0;
  size_t pos = size_t(used);
  if (pos < s.size() && s[pos] == ':') {
    size_t end = pos + 1;
    while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.'))
      ++end;
    const auto v = parse_number(s.substr(pos + 1, end - pos - 1));
    if (!v || *v < 0 || *v >= 61) return std::nullopt;
    sec = *v;
    pos = end;
  }
  const std::string zone = s.substr(pos);
  double offset = 0;
  if (!zone.empty() && zone != "Z") {
    int zh = 0, zm = 0;
    if ((zone[0] != '+' && zone[0] != '-') ||
        !(std::sscanf(zone.c_str() + 1, "%2d:%2d", &zh, &zm) == 2 ||
          std::sscanf(zone.c_str() + 1, "%2d%2d", &zh, &zm) == 2))
      return std::nullopt;
    offset = (zone[0] == '-' ? -1 : 1) * (zh * 3600.0 + zm * 60.0);
  }
  return double(days_from_civil(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 + sec - offset;
}

std::vector<std::pair<double, double>> read_grid_series(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::not_found, path + ": cannot open the grid intensity series");
  std::vector<std::pair<double, double>> rows;
  int n = 0;
  bool first = true;
  for (std::string line; std::getline(f, line);) {
    ++n;
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    const size_t comma = line.find(',');
    std::optional<double> t, g;
    if (comma != std::string::npos) {
      t = parse_timestamp(line.substr(0, comma));
      g = parse_number(trim(line.substr(comma + 1)));
    }
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (!t || !g) {
      if (first && comma != std::string::npos && !g) {  // a header row
        first = false;
        continue;
      }
      throw Error(ErrorCode::invalid_argument,
                  where + "expected 'timestamp,g_per_kwh' (unix seconds or ISO 8601), got '" +
                      trim(line) + "'");
    }
    first = false;
    if (*g < 0) throw Error(ErrorCode::invalid_argument, where + "negative grid intensity");
    if (!rows.empty() && *t <= rows.back().first)
      throw Error(ErrorCode::invalid_argument, where + "timestamps must increase");
    rows.push_back({*t, *g});
  }
  if (rows.empty())
    throw Error(ErrorCode::invalid_argument, path + ": no rows of 'timestamp,g_per_kwh'");
  return rows;
}

CarbonModel::CarbonModel(const CarbonOptions& o) : pue_(o.pue) {
  if (!(o.pue >= 1.0) || !std::isfinite(o.pue))
    throw Error(ErrorCode::invalid_argument,
                "PUE must be a number >= 1 (facility power / IT power), got " + fmt_g(o.pue));
  if (o.grid_intensity && !o.series_file.empty())
    throw Error(ErrorCode::invalid_argument,
                "give a grid intensity or a grid intensity series, not both");
  region_ = o.region;
  if (region_.empty())
    if (const char* env = std::getenv("SLIM_REGION")) region_ = env;
  region_ = upper(trim(region_.empty() ? "WORLD" : region_));
  if (o.grid_intensity) {
    if (!(*o.grid_intensity >= 0) || !std::isfinite(*o.grid_intensity))
      throw Error(ErrorCode::invalid_argument,
                  "grid intensity must be >= 0 g/kWh, got " + fmt_g(*o.grid_intensity));
    g_per_kwh_ = *o.grid_intensity;
    source_ = "given";
    return;
  }
  if (!o.series_file.empty()) {
    series_ = read_grid_series(o.series_file);
    series_file_ = o.series_file;
    source_ = "series " + o.series_file;
    return;
  }
  const auto& regions = grid_regions();
  auto it = std::find_if(regions.begin(), regions.end(),
                         [&](const GridRegion& r) { return r.code == region_; });
  if (it == regions.end()) {
    std::string aggregates;
    for (const auto& r : regions)
      if (r.code.size() != 3) aggregates += (aggregates.empty() ? "" : ", ") + r.code;
    throw Error(ErrorCode::invalid_argument,
                "unknown region '" + region_ +
                    "': give an ISO 3166 alpha-3 country code (FRA, USA, IND) or one of " +
                    aggregates + " (`slim energy regions` lists them), or --grid-intensity G/KWH");
  }
  g_per_kwh_ = it->g_per_kwh;
  source_ = grid_source();
}

double CarbonModel::g_per_kwh(double start, double end) const {
  if (series_.empty()) return g_per_kwh_;
  // Each row holds until the next; the last for one more step (for ever in a one-row file).
  const double last_end =
      series_.size() == 1 ? INFINITY : 2 * series_.back().first - series_[series_.size() - 2].first;
  if (start < series_.front().first || end > last_end) {
    char buf[160];
    std::snprintf(buf, sizeof buf, ": covers unix time %.0f to %.0f, not the window %.0f to %.0f",
                  series_.front().first, last_end, start, end);
    throw Error(ErrorCode::invalid_argument, "grid intensity series " + series_file_ + buf);
  }
  size_t i = size_t(std::upper_bound(series_.begin(), series_.end(), start,
                                     [](double t, const auto& row) { return t < row.first; }) -
                    series_.begin()) -
             1;
  if (end <= start) return series_[i].second;
  double sum = 0;
  for (double t = start; t < end; ++i) {
    const double next = std::min(end, i + 1 < series_.size() ? series_[i + 1].first : end);
    sum += series_[i].second * (next - t);
    t = next;
  }
  return sum / (end - start);
}

double CarbonModel::grams(double joules, double start, double end) const {
  return joules / 3.6e6 * g_per_kwh(start, end) * pue_;
}

std::string CarbonModel::describe() const {
  const std::string pue = ", PUE " + fmt_g(pue_);
  if (!series_.empty()) return region_ + " grid intensity series " + series_file_ + pue;
  return region_ + " " + fmt_g(g_per_kwh_) + " g/kWh (" + source_ + ")" + pue;
}

}  // namespace slim::energy
