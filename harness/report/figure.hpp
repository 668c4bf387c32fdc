#pragma once
// What every report figure shares: cairo drawing written as PNG (2x) and SVG, and text placement.
#include <cairo.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace kvb {

// Calls draw(cr) on a white width x height canvas (sans-serif text) for <stem>.png (at twice the resolution) and
// <stem>.svg.
void write_figure(const std::string& stem, double width, double height, const std::function<void(cairo_t*)>& draw);

// The plot area's frame at (left, top), w x h, its axis labels below and to the left, the title above.
void figure_frame(cairo_t* cr, double left, double top, double w, double h, const std::string& x_label,
                  const std::string& y_label, const std::string& title);

// Legend entry i of a column starting at (x, top): a dot in the i-th colour and the label beside it.
void figure_legend_entry(cairo_t* cr, double x, double top, size_t i, const std::string& label);

// A point of a line chart in data units, with its 95% interval as a vertical bar (NaN: none).
struct ChartPoint {
  double x = 0, y = 0;
  double low = std::nan(""), high = std::nan("");
};
// Series i in the i-th colour: a line through its points in order of x, a dot at each with its
// interval; `px`, `py` map data to the canvas. Its legend entry goes in the column at (legend_x, top).
void figure_series(cairo_t* cr, size_t i, std::vector<ChartPoint> points, const std::function<double(double)>& px,
                   const std::function<double(double)>& py, double legend_x, double top, const std::string& label);

// Sets the i-th categorical colour (Tableau 10, cycled): one series or method per colour.
void figure_colour(cairo_t* cr, size_t i);

// Text at (x, y): `align` 0 left, 0.5 centred, 1 right, vertically centred, rotated by `angle`.
void figure_text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = 0.0,
                 double angle = 0.0);

}  // namespace kvb
