#include "harness/report/memory_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "harness/report/figure.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

constexpr double kLeft = 60, kTop = 40, kPlotW = 420, kPlotH = 300, kBottom = 50;

}  // namespace

void write_memory_plot(const MemoryPlot& p, const std::string& stem) {
  double lo = INFINITY, hi = 0;
  for (const auto& s : p.series)
    for (const auto& pt : s.points) {
      if (!(pt.memory > 0)) fail("memory plot {}: series '{}' has memory {}, expected > 0", stem, s.label, pt.memory);
      lo = std::min(lo, pt.memory);
      hi = std::max(hi, pt.memory);
    }
  if (hi == 0) fail("memory plot {}: no points", stem);
  // Whole decades around the data.
  const double d0 = std::floor(std::log10(lo)), d1 = std::max(d0 + 1, std::ceil(std::log10(hi)));
  size_t longest = 0;
  for (const auto& s : p.series) longest = std::max(longest, s.label.size());
  const double width = kLeft + kPlotW + 60 + 6.0 * double(longest);  // about 6 px a character at size 10
  const double height = std::max(kTop + kPlotH + kBottom, kTop + 18.0 * double(p.series.size()) + 20);
  // A little room beyond the outer decades, so that points on them (the full cache at 100%) show whole.
  const double pad = 0.03 * (d1 - d0);
  auto X = [&](double m) { return kLeft + (std::log10(m) - d0 + pad) / (d1 - d0 + 2 * pad) * kPlotW; };
  auto Y = [&](double s) { return kTop + (1 - std::clamp(s, 0.0, 1.0)) * kPlotH; };

  write_figure(stem, width, height, [&](cairo_t* cr) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    // Grid, ticks and axes.
    cairo_set_line_width(cr, 0.5);
    for (double d = d0; d <= d1; ++d) {
      for (int k = 1; k < 10 && d + std::log10(k) <= d1; ++k) {
        const double x = X(k * std::pow(10.0, d));
        cairo_set_source_rgb(cr, k == 1 ? 0.75 : 0.92, k == 1 ? 0.75 : 0.92, k == 1 ? 0.75 : 0.92);
        cairo_move_to(cr, x, kTop);
        cairo_line_to(cr, x, kTop + kPlotH);
        cairo_stroke(cr);
      }
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, X(std::pow(10.0, d)), kTop + kPlotH + 12, fmt::format("{:g}%", 100 * std::pow(10.0, d)), 10, 0.5);
    }
    for (int i = 0; i <= 4; ++i) {
      const double y = Y(i / 4.0);
      cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
      cairo_move_to(cr, kLeft, y);
      cairo_line_to(cr, kLeft + kPlotW, y);
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, kLeft - 6, y, fmt::format("{}", 25 * i), 10, 1.0);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, kLeft, kTop, kPlotW, kPlotH);
    cairo_stroke(cr);
    figure_text(cr, kLeft + kPlotW / 2, kTop + kPlotH + 32, "KV memory, % of a full fp16 cache (log scale)", 11, 0.5);
    figure_text(cr, 16, kTop + kPlotH / 2, "Score", 11, 0.5, -M_PI / 2);
    figure_text(cr, kLeft + kPlotW / 2, 18, p.title, 12, 0.5);
    // Series: a line through the points by memory, a dot at each, and the legend.
    for (size_t i = 0; i < p.series.size(); ++i) {
      auto pts = p.series[i].points;
      std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.memory < b.memory; });
      figure_colour(cr, i);
      cairo_set_line_width(cr, 1.5);
      for (size_t j = 0; j < pts.size(); ++j)
        (j ? cairo_line_to : cairo_move_to)(cr, X(pts[j].memory), Y(pts[j].score));
      cairo_stroke(cr);
      for (const auto& pt : pts) {
        cairo_arc(cr, X(pt.memory), Y(pt.score), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
        if (std::isnan(pt.low)) continue;
        cairo_set_line_width(cr, 1.0);  // the 95% interval, with short caps
        cairo_move_to(cr, X(pt.memory), Y(pt.low));
        cairo_line_to(cr, X(pt.memory), Y(pt.high));
        for (double end : {pt.low, pt.high}) {
          cairo_move_to(cr, X(pt.memory) - 3, Y(end));
          cairo_line_to(cr, X(pt.memory) + 3, Y(end));
        }
        cairo_stroke(cr);
      }
      const double ly = kTop + 18.0 * double(i) + 6;
      cairo_arc(cr, kLeft + kPlotW + 30, ly, 3.5, 0, 2 * M_PI);
      cairo_fill(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, kLeft + kPlotW + 40, ly, p.series[i].label, 10);
    }
  });

  std::ofstream csv(stem + ".csv");
  csv << "method,memory_fp16_share,score,ci_low,ci_high,n\n";
  auto bound = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.4f}", v); };
  for (const auto& s : p.series)
    for (const auto& pt : s.points)
      csv << '"' << s.label << '"' << ',' << fmt::format("{:.6f},{:.4f}", pt.memory, pt.score) << ',' << bound(pt.low)
          << ',' << bound(pt.high) << ',' << pt.n << '\n';
  if (!csv) fail("{}.csv: cannot write", stem);
}

}  // namespace kvb
