#pragma once
// What every report figure shares: cairo drawing written as PNG (2x) and SVG, and text placement.
#include <cairo.h>

#include <functional>
#include <string>

namespace kvb {

// Calls draw(cr) on a width x height canvas for <stem>.png (at twice the resolution) and <stem>.svg.
void write_figure(const std::string& stem, double width, double height, const std::function<void(cairo_t*)>& draw);

// Sets the i-th categorical colour (Tableau 10, cycled): one series or method per colour.
void figure_colour(cairo_t* cr, size_t i);

// Text at (x, y): `align` 0 left, 0.5 centred, 1 right, vertically centred, rotated by `angle`.
void figure_text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = 0.0,
                 double angle = 0.0);

}  // namespace kvb
