#include "harness/report/figure.hpp"

#include <cairo-svg.h>

#include <algorithm>
#include <cmath>

#include "harness/util/error.hpp"

namespace kvb {

void figure_text(cairo_t* cr, double x, double y, const std::string& s, double size, double align, double angle) {
  cairo_save(cr);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_move_to(cr, -e.width * align, e.height / 2);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

namespace {

// A white canvas and the figures' font.
void blank(cairo_t* cr) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

}  // namespace

void figure_frame(cairo_t* cr, double left, double top, double w, double h, const std::string& x_label,
                  const std::string& y_label, const std::string& title) {
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_line_width(cr, 0.5);
  cairo_rectangle(cr, left, top, w, h);
  cairo_stroke(cr);
  figure_text(cr, left + w / 2, top + h + 32, x_label, 11, 0.5);
  figure_text(cr, 16, top + h / 2, y_label, 11, 0.5, -M_PI / 2);
  figure_text(cr, left + w / 2, 18, title, 12, 0.5);
}

void figure_legend_entry(cairo_t* cr, double x, double top, size_t i, const std::string& label) {
  const double y = top + 18.0 * double(i) + 6;
  figure_colour(cr, i);
  cairo_arc(cr, x, y, 3.5, 0, 2 * M_PI);
  cairo_fill(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  figure_text(cr, x + 10, y, label, 10);
}

void figure_series(cairo_t* cr, size_t i, std::vector<ChartPoint> points, const std::function<double(double)>& px,
                   const std::function<double(double)>& py, double legend_x, double top, const std::string& label) {
  std::sort(points.begin(), points.end(), [](const auto& l, const auto& r) { return l.x < r.x; });
  figure_colour(cr, i);
  cairo_set_line_width(cr, 1.5);
  for (size_t j = 0; j < points.size(); ++j) (j ? cairo_line_to : cairo_move_to)(cr, px(points[j].x), py(points[j].y));
  cairo_stroke(cr);
  for (const auto& pt : points) {
    const double x = px(pt.x);
    cairo_arc(cr, x, py(pt.y), 3.5, 0, 2 * M_PI);
    cairo_fill(cr);
    if (std::isnan(pt.low)) continue;
    cairo_set_line_width(cr, 1.0);  // with short caps
    cairo_move_to(cr, x, py(pt.low));
    cairo_line_to(cr, x, py(pt.high));
    for (double end : {pt.low, pt.high}) {
      cairo_move_to(cr, x - 3, py(end));
      cairo_line_to(cr, x + 3, py(end));
    }
    cairo_stroke(cr);
  }
  figure_legend_entry(cr, legend_x, top, i, label);
}

void write_figure(const std::string& stem, double width, double height, const std::function<void(cairo_t*)>& draw) {
  cairo_surface_t* png = cairo_image_surface_create(CAIRO_FORMAT_RGB24, int(width) * 2, int(height) * 2);
  cairo_t* cr = cairo_create(png);
  cairo_scale(cr, 2, 2);
  blank(cr);
  draw(cr);
  cairo_destroy(cr);
  const auto st = cairo_surface_write_to_png(png, (stem + ".png").c_str());
  cairo_surface_destroy(png);
  if (st != CAIRO_STATUS_SUCCESS) fail("{}.png: cannot write ({})", stem, cairo_status_to_string(st));

  cairo_surface_t* svg = cairo_svg_surface_create((stem + ".svg").c_str(), width, height);
  cr = cairo_create(svg);
  blank(cr);
  draw(cr);
  cairo_destroy(cr);
  cairo_surface_finish(svg);
  const auto sst = cairo_surface_status(svg);
  cairo_surface_destroy(svg);
  if (sst != CAIRO_STATUS_SUCCESS) fail("{}.svg: cannot write ({})", stem, cairo_status_to_string(sst));
}

void figure_colour(cairo_t* cr, size_t i) {
  static const unsigned colours[] = {0x4E79A7, 0xF28E2B, 0xE15759, 0x76B7B2, 0x59A14F,
                                     0xEDC948, 0xB07AA1, 0xFF9DA7, 0x9C755F, 0xBAB0AC};
  const unsigned c = colours[i % 10];
  cairo_set_source_rgb(cr, ((c >> 16) & 0xFF) / 255.0, ((c >> 8) & 0xFF) / 255.0, (c & 0xFF) / 255.0);
}

}  // namespace kvb
