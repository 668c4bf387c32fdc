#include "harness/report/throughput_plot.hpp"

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

// Batch sizes on a log2 axis of whole powers around the data, tokens/s on a linear one from 0.
struct Axes {
  double p1 = 1, top = 1;  // the largest power of two shown, the largest tokens/s
  double x(double batch) const { return kLeft + (0.03 + 0.94 * std::log2(batch) / std::max(1.0, p1)) * kPlotW; }
  double y(double tps) const { return kTop + (1 - tps / top) * kPlotH; }
};

// A round step near a fifth of `hi`: 1, 2 or 5 times a power of ten.
double tick_step(double hi) {
  const double raw = hi / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

}  // namespace

void write_throughput_plot(const ThroughputPlot& p, const std::string& stem) {
  Axes a;
  double hi = 0;
  int widest = 1;
  for (const auto& s : p.series)
    for (const auto& pt : s.points) {
      if (pt.batch < 1 || !(pt.tokens_per_s >= 0))
        fail("throughput plot {}: series '{}' has batch {} at {} tokens/s", stem, s.label, pt.batch, pt.tokens_per_s);
      hi = std::max(hi, pt.tokens_per_s);
      widest = std::max(widest, pt.batch);
    }
  if (hi == 0) fail("throughput plot {}: no points", stem);
  a.p1 = std::ceil(std::log2(double(widest)));
  const double step = tick_step(hi);
  a.top = std::ceil(hi / step) * step;
  size_t longest = 0;
  for (const auto& s : p.series) longest = std::max(longest, s.label.size());
  const double width = kLeft + kPlotW + 60 + 6.0 * double(longest);  // about 6 px a character at size 10
  const double height = std::max(kTop + kPlotH + kBottom, kTop + 18.0 * double(p.series.size()) + 20);
  write_figure(stem, width, height, [&](cairo_t* cr) {
    cairo_set_line_width(cr, 0.5);
    for (int e = 0; e <= int(a.p1); ++e) {
      const double x = a.x(std::pow(2.0, e));
      cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
      cairo_move_to(cr, x, kTop);
      cairo_line_to(cr, x, kTop + kPlotH);
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, x, kTop + kPlotH + 12, fmt::format("{}", 1 << e), 10, 0.5);
    }
    for (double v = 0; v <= a.top + step / 2; v += step) {
      cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
      cairo_move_to(cr, kLeft, a.y(v));
      cairo_line_to(cr, kLeft + kPlotW, a.y(v));
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, kLeft - 6, a.y(v), fmt::format("{:g}", v), 10, 1.0);
    }
    figure_frame(cr, kLeft, kTop, kPlotW, kPlotH, "Batch size (sequences decoding together)",
                 "Decode tokens/s (whole batch)", p.title);
    for (size_t i = 0; i < p.series.size(); ++i) {
      std::vector<ChartPoint> pts;
      for (const auto& pt : p.series[i].points) pts.push_back({double(pt.batch), pt.tokens_per_s});
      figure_series(
          cr, i, pts, [&](double b) { return a.x(b); }, [&](double v) { return a.y(v); }, kLeft + kPlotW + 30, kTop,
          p.series[i].label);
    }
  });
  std::ofstream csv(stem + ".csv");
  csv << "cache,batch,decode_tokens_per_s\n";
  for (const auto& s : p.series)
    for (const auto& pt : s.points)
      csv << csv_field(s.label) << ',' << pt.batch << fmt::format(",{:.2f}\n", pt.tokens_per_s);
  if (!csv) fail("{}.csv: cannot write", stem);
}

}  // namespace kvb
