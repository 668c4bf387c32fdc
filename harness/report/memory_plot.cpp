#include "harness/report/memory_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "harness/report/figure.hpp"
#include "harness/report/table.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

constexpr double kLeft = 60, kTop = 40, kPlotW = 420, kPlotH = 300, kBottom = 50;

// Memory on a log axis of whole decades around the data, the score on a linear one.
struct Axes {
  double d0 = 0, d1 = 1, pad = 0;
  double x(double memory) const { return kLeft + (std::log10(memory) - d0 + pad) / (d1 - d0 + 2 * pad) * kPlotW; }
  double y(double score) const { return kTop + (1 - std::clamp(score, 0.0, 1.0)) * kPlotH; }
};

Axes axes_for(const MemoryPlot& p, const std::string& stem) {
  double lo = INFINITY, hi = 0;
  for (const auto& s : p.series)
    for (const auto& pt : s.points) {
      if (!(pt.memory > 0)) fail("memory plot {}: series '{}' has memory {}, expected > 0", stem, s.label, pt.memory);
      lo = std::min(lo, pt.memory);
      hi = std::max(hi, pt.memory);
    }
  if (hi == 0) fail("memory plot {}: no points", stem);
  Axes a;
  a.d0 = std::floor(std::log10(lo));
  a.d1 = std::max(a.d0 + 1, std::ceil(std::log10(hi)));
  // A little room beyond the outer decades, so that points on them (the full cache at 100%) show whole.
  a.pad = 0.03 * (a.d1 - a.d0);
  return a;
}

// Grid, ticks, axes, their labels and the title.
void draw_frame(cairo_t* cr, const Axes& a, const std::string& title) {
  cairo_set_line_width(cr, 0.5);
  for (double d = a.d0; d <= a.d1; ++d) {
    for (int k = 1; k < 10 && d + std::log10(k) <= a.d1; ++k) {
      const double x = a.x(k * std::pow(10.0, d)), grey = k == 1 ? 0.75 : 0.92;
      cairo_set_source_rgb(cr, grey, grey, grey);
      cairo_move_to(cr, x, kTop);
      cairo_line_to(cr, x, kTop + kPlotH);
      cairo_stroke(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    figure_text(cr, a.x(std::pow(10.0, d)), kTop + kPlotH + 12, fmt::format("{:g}%", 100 * std::pow(10.0, d)), 10, 0.5);
  }
  for (int i = 0; i <= 4; ++i) {
    const double y = a.y(i / 4.0);
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_move_to(cr, kLeft, y);
    cairo_line_to(cr, kLeft + kPlotW, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    figure_text(cr, kLeft - 6, y, fmt::format("{}", 25 * i), 10, 1.0);
  }
  figure_frame(cr, kLeft, kTop, kPlotW, kPlotH, "KV memory, % of a full fp16 cache (log scale)", "Score", title);
}

void write_points_csv(const MemoryPlot& p, const std::string& path) {
  std::ofstream csv(path);
  csv << "method,memory_fp16_share,score,ci_low,ci_high,n\n";
  auto bound = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.4f}", v); };
  for (const auto& s : p.series)
    for (const auto& pt : s.points)
      csv << csv_field(s.label) << ',' << fmt::format("{:.6f},{:.4f}", pt.memory, pt.score) << ',' << bound(pt.low)
          << ',' << bound(pt.high) << ',' << pt.n << '\n';
  if (!csv) fail("{}: cannot write", path);
}

}  // namespace

void write_memory_plot(const MemoryPlot& p, const std::string& stem) {
  const Axes axes = axes_for(p, stem);
  size_t longest = 0;
  for (const auto& s : p.series) longest = std::max(longest, s.label.size());
  const double width = kLeft + kPlotW + 60 + 6.0 * double(longest);  // about 6 px a character at size 10
  const double height = std::max(kTop + kPlotH + kBottom, kTop + 18.0 * double(p.series.size()) + 20);
  write_figure(stem, width, height, [&](cairo_t* cr) {
    draw_frame(cr, axes, p.title);
    for (size_t i = 0; i < p.series.size(); ++i) {
      std::vector<ChartPoint> pts;
      for (const auto& pt : p.series[i].points) pts.push_back({pt.memory, pt.score, pt.low, pt.high});
      figure_series(
          cr, i, pts, [&](double m) { return axes.x(m); }, [&](double v) { return axes.y(v); }, kLeft + kPlotW + 30,
          kTop, p.series[i].label);
    }
  });
  write_points_csv(p, stem + ".csv");
}

}  // namespace kvb
