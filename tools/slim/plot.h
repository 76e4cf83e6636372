// PNG charts for the CLI's reports (cairo): bars by category (`slim report energy`) or
// points on two numeric axes, optionally joined (a Pareto front for `slim quantize`).
#pragma once

#include <string>
#include <vector>

namespace slim::cli::plot {

struct Series {
  std::string name;  // in the legend when the chart has several
  std::vector<double> x, y;
  bool joined = false;  // draw a line through the points in order
};

struct Chart {
  std::string title, x_label, y_label;
  // Bars: one per category, y from 0. Otherwise the series are drawn on x/y axes.
  std::vector<std::string> categories;
  std::vector<double> values;
  std::vector<Series> series;
  int width = 900, height = 520;
};

// Writes the chart; throws slim::Error (invalid_argument) naming the file when it cannot.
void write_png(const Chart& chart, const std::string& path);

}  // namespace slim::cli::plot
