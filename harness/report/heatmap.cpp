#include "harness/report/heatmap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include "harness/report/figure.hpp"
#include "harness/report/table.hpp"
#include "harness/util/error.hpp"

namespace kvb {

Rgb heatmap_colour(double s) {
  // Linear segmented colormap #F0496E -> #EBB839 -> #0CD79F.
  const Rgb lo{0xF0, 0x49, 0x6E}, mid{0xEB, 0xB8, 0x39}, hi{0x0C, 0xD7, 0x9F};
  s = std::clamp(s, 0.0, 1.0);
  const Rgb& a = s < 0.5 ? lo : mid;
  const Rgb& b = s < 0.5 ? mid : hi;
  const double t = s < 0.5 ? s / 0.5 : (s - 0.5) / 0.5;
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

namespace {

constexpr double kCell = 28, kTop = 70, kBottom = 70, kBar = 70;

// Room for the row labels at font size 10 (about 6 px a character) and the axis title.
double left_margin(const Heatmap& h) {
  size_t longest = 0;
  for (const auto& r : h.rows) longest = std::max(longest, r.size());
  return std::max(90.0, 48.0 + 6.0 * double(longest));
}

// Labels, cells and colour bar side by side.
double plot_width(const Heatmap& h) { return left_margin(h) + double(h.cols.size()) * h.cell_width + kBar + 20; }

void draw(cairo_t* cr, const Heatmap& h, double width, double height) {
  const size_t R = h.rows.size(), C = h.cols.size();
  // The plot is centred under the titles, which set the width when there are few columns.
  const double x0 = (width - plot_width(h)) / 2, kLeft = x0 + left_margin(h), W = h.cell_width;
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < C; ++c) {
      const double x = kLeft + double(c) * W, y = kTop + double(r) * kCell;
      const double v = h.cells[r][c];
      if (std::isnan(v)) {
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
      } else {
        const Rgb col = heatmap_colour(v);
        cairo_set_source_rgb(cr, col.r / 255, col.g / 255, col.b / 255);
      }
      cairo_rectangle(cr, x, y, W, kCell);
      cairo_fill_preserve(cr);
      cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
      cairo_set_line_width(cr, 0.5);
      cairo_stroke(cr);
      if (h.annotate && !std::isnan(v)) {
        cairo_set_source_rgb(cr, 0, 0, 0);
        figure_text(cr, x + W / 2, y + kCell / 2, fmt::format("{:.1f}", 100 * v), 10, 0.5);
      }
    }
  cairo_set_source_rgb(cr, 0, 0, 0);
  for (size_t c = 0; c < C; ++c)
    figure_text(cr, kLeft + (double(c) + 0.5) * W, kTop + double(R) * kCell + 8, h.cols[c], 10, 1.0, -M_PI / 4);
  for (size_t r = 0; r < R; ++r) figure_text(cr, kLeft - 6, kTop + (double(r) + 0.5) * kCell, h.rows[r], 10, 1.0);
  figure_text(cr, kLeft + double(C) * W / 2, height - 18, h.x_label, 12, 0.5);
  figure_text(cr, x0 + 22, kTop + double(R) * kCell / 2, h.y_label, 12, 0.5, -M_PI / 2);
  figure_text(cr, width / 2, 18, h.title, 13, 0.5);
  if (!h.subtitle.empty()) figure_text(cr, width / 2, 36, h.subtitle, 11, 0.5);
  figure_text(cr, width / 2, h.subtitle.empty() ? 40 : 54, h.caption, 11, 0.5);
  // Colour bar.
  const double bx = kLeft + double(C) * W + 20, bh = double(R) * kCell;
  for (int i = 0; i < 100; ++i) {
    const Rgb col = heatmap_colour(1.0 - i / 99.0);
    cairo_set_source_rgb(cr, col.r / 255, col.g / 255, col.b / 255);
    cairo_rectangle(cr, bx, kTop + bh * i / 100.0, 14, bh / 100.0 + 0.5);
    cairo_fill(cr);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  for (double v : {0.0, 0.5, 1.0}) figure_text(cr, bx + 18, kTop + bh * (1 - v), fmt::format("{:.1f}", v), 10);
  figure_text(cr, bx + 50, kTop + bh / 2, "Score", 11, 0.5, -M_PI / 2);
}

}  // namespace

void write_heatmap(const Heatmap& h, const std::string& stem, const std::string& csv_stem) {
  if (h.cells.size() != h.rows.size())
    fail("heatmap {}: {} rows of cells for {} row labels", stem, h.cells.size(), h.rows.size());
  // Wide enough for the titles however few columns there are.
  const double width = std::max(plot_width(h), 560.0);
  const double height = kTop + double(h.rows.size()) * kCell + kBottom;

  write_figure(stem, width, height, [&](cairo_t* cr) { draw(cr, h, width, height); });

  const std::string csv_path = (csv_stem.empty() ? stem : csv_stem) + ".csv";
  std::ofstream csv(csv_path);
  std::string corner = h.y_label;
  for (char& ch : corner) ch = ch == ' ' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  csv << corner;
  for (const auto& c : h.cols) csv << ',' << csv_field(c);
  csv << '\n';
  for (size_t r = 0; r < h.rows.size(); ++r) {
    csv << csv_field(h.rows[r]);
    for (double v : h.cells[r]) csv << ',' << (std::isnan(v) ? std::string() : fmt::format("{:.4f}", v));
    csv << '\n';
  }
  if (!csv) fail("{}: cannot write", csv_path);
}

}  // namespace kvb
