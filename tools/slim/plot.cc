#include "plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "slim/core/error.h"

namespace slim::cli::plot {
namespace {

struct Rgb {
  double r, g, b;
};
constexpr Rgb kPalette[] = {{0.12, 0.47, 0.71}, {1.0, 0.50, 0.05}, {0.17, 0.63, 0.17},
                            {0.84, 0.15, 0.16}, {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / 5, mag = std::pow(10, std::floor(std::log10(raw)));
  const double step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3.5 ? 2 : raw / mag < 7.5 ? 5 : 10);
  std::vector<double> out;
  for (double t = std::floor(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(t);
  if (out.back() < hi) out.push_back(out.back() + step);
  return out;
}

void text(cairo_t* cr, const std::string& s, double x, double y, double align_x, double align_y,
          double size, bool bold = false, double angle = 0) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_move_to(cr, -e.x_bearing - e.width * align_x, -e.y_bearing - e.height * align_y);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

struct Frame {
  double left, top, right, bottom;  // the plot area in pixels
  double x0, x1, y0, y1;            // the data range it shows
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (right - left); }
  double py(double y) const { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
};

// Axis lines, y ticks and grid, and with `x_ticks` the x ticks too.
void axes(cairo_t* cr, const Frame& f, const std::vector<double>& y_ticks, const std::vector<double>* x_ticks) {
  cairo_set_line_width(cr, 1);
  for (double t : y_ticks) {
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, f.left, f.py(t));
    cairo_line_to(cr, f.right, f.py(t));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, number(t), f.left - 6, f.py(t), 1, 0.5, 11);
  }
  if (x_ticks)
    for (double t : *x_ticks) {
      cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
      cairo_move_to(cr, f.px(t), f.top);
      cairo_line_to(cr, f.px(t), f.bottom);
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
      text(cr, number(t), f.px(t), f.bottom + 6, 0.5, 0, 11);
    }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_move_to(cr, f.left, f.top);
  cairo_line_to(cr, f.left, f.bottom);
  cairo_line_to(cr, f.right, f.bottom);
  cairo_stroke(cr);
}

void bars(cairo_t* cr, const Chart& c, Frame f) {
  const size_t n = c.categories.size();
  f.x0 = 0;
  f.x1 = double(n);
  f.y0 = 0;
  const double top = n ? *std::max_element(c.values.begin(), c.values.end()) : 1;
  const std::vector<double> yt = ticks(0, top > 0 ? top : 1);
  f.y1 = yt.back();
  axes(cr, f, yt, nullptr);
  const double slot = (f.right - f.left) / double(std::max<size_t>(n, 1));
  for (size_t i = 0; i < n; ++i) {
    const Rgb& col = kPalette[0];
    const double x = f.left + slot * (double(i) + 0.15), w = slot * 0.7;
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_rectangle(cr, x, f.py(c.values[i]), w, f.bottom - f.py(c.values[i]));
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text(cr, number(c.values[i]), x + w / 2, f.py(c.values[i]) - 4, 0.5, 1, 11);
    // Category names slanted so that long ones do not overlap.
    text(cr, c.categories[i], x + w / 2, f.bottom + 8, 1, 0, 11, false, -M_PI / 6);
  }
}

void points(cairo_t* cr, const Chart& c, Frame f) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = y0 = 0, x1 = y1 = 1;
  const std::vector<double> xt = ticks(x0, x1), yt = ticks(y0, y1);
  f.x0 = xt.front(), f.x1 = xt.back(), f.y0 = yt.front(), f.y1 = yt.back();
  axes(cr, f, yt, &xt);
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& s = c.series[k];
    const Rgb& col = kPalette[k % std::size(kPalette)];
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_set_line_width(cr, 2);
    if (s.joined && s.x.size() > 1) {
      for (size_t i = 0; i < s.x.size(); ++i)
        (i ? cairo_line_to : cairo_move_to)(cr, f.px(s.x[i]), f.py(s.y[i]));
      cairo_stroke(cr);
    }
    for (size_t i = 0; i < s.x.size(); ++i) {
      cairo_arc(cr, f.px(s.x[i]), f.py(s.y[i]), 4, 0, 2 * M_PI);
      cairo_fill(cr);
    }
    if (c.series.size() > 1) {
      const double y = f.top + 8 + 18 * double(k);
      cairo_rectangle(cr, f.right - 150, y - 5, 10, 10);
      cairo_fill(cr);
      cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
      text(cr, s.name, f.right - 134, y, 0, 0.5, 11);
    }
  }
}

}  // namespace

void write_png(const Chart& c, const std::string& path) {
  check(c.values.size() == c.categories.size(), ErrorCode::internal, "plot: one value per category");
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, c.width, c.height);
  cairo_t* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const bool bar = !c.categories.empty();
  const Frame f{84, 48, double(c.width) - 24, double(c.height) - (bar ? 120 : 56), 0, 1, 0, 1};
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text(cr, c.title, c.width / 2.0, 16, 0.5, 0, 15, true);
  text(cr, c.y_label, 18, (f.top + f.bottom) / 2, 0.5, 0.5, 12, false, -M_PI / 2);
  text(cr, c.x_label, (f.left + f.right) / 2, c.height - 8.0, 0.5, 1, 12);
  bar ? bars(cr, c, f) : points(cr, c, f);
  cairo_destroy(cr);
  const cairo_status_t st = cairo_surface_write_to_png(surface, path.c_str());
  cairo_surface_destroy(surface);
  if (st != CAIRO_STATUS_SUCCESS)
    throw Error(ErrorCode::invalid_argument,
                "cannot write the chart '" + path + "': " + cairo_status_to_string(st));
}

}  // namespace slim::cli::plot
