#include "tools/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/error.hpp"

namespace flashlab::cli {

namespace {

constexpr double kWidth = 980, kHeight = 600;
constexpr double kLeft = 80, kTop = 48, kRight = 260, kBottom = 64, kNoteLine = 16;
// Tableau 10: distinguishable, and readable by most color-blind readers.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

std::string tick_label(double value) {
  char text[32];
  if (value != 0 && (std::fabs(value) >= 1e6 || std::fabs(value) < 1e-3))
    std::snprintf(text, sizeof text, "%.0e", value);
  else
    std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// Fits an unset range to the data: whole decades on a log axis, [0, 1.1 max] on a linear one.
Axis fitted(Axis axis, const std::vector<double>& values) {
  if (axis.max > axis.min && (!axis.log || axis.min > 0)) return axis;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values)
    if (std::isfinite(v) && (!axis.log || v > 0)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(lo <= hi)) lo = 1, hi = 10;  // nothing to show: any visible range
  if (axis.log) {
    axis.min = std::pow(10.0, std::floor(std::log10(lo)));
    axis.max = std::pow(10.0, std::ceil(std::log10(hi)));
    if (axis.max <= axis.min) axis.max = axis.min * 10;
  } else {
    axis.min = std::min(0.0, lo);
    axis.max = hi > axis.min ? hi + 0.1 * (hi - axis.min) : axis.min + 1;
  }
  return axis;
}

// Position of `value` on an axis as a fraction of its length, 0 at min and 1 at max.
double fraction(const Axis& axis, double value) {
  if (axis.log)
    return (std::log10(value) - std::log10(axis.min)) / (std::log10(axis.max) - std::log10(axis.min));
  return (value - axis.min) / (axis.max - axis.min);
}

std::vector<double> ticks_of(const Axis& axis) {
  if (!axis.ticks.empty()) return axis.ticks;
  std::vector<double> ticks;
  if (axis.log) {
    const int decades = static_cast<int>(std::lround(std::log10(axis.max / axis.min)));
    for (double decade = axis.min; decade <= axis.max * 1.0001; decade *= 10)
      for (double step : {1.0, 2.0, 5.0})
        if ((step == 1.0 || decades <= 3) && decade * step <= axis.max * 1.0001)
          ticks.push_back(decade * step);
    return ticks;
  }
  const double raw = (axis.max - axis.min) / 6;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = magnitude * (raw / magnitude < 2 ? 2 : raw / magnitude < 5 ? 5 : 10);
  for (double t = std::ceil(axis.min / step) * step; t <= axis.max + 1e-9 * step; t += step)
    ticks.push_back(t);
  return ticks;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Chart::render() const {
  std::vector<double> xs, ys;
  for (const Series& s : series_)
    for (const Point& p : s.points) xs.push_back(p.x), ys.push_back(p.y);
  const Axis x = fitted(x_, xs), y = fitted(y_, ys);
  const double height = kHeight + kNoteLine * static_cast<double>(notes_.size());
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double v) { return kLeft + plot_w * fraction(x, v); };
  auto py = [&](double v) { return kTop + plot_h * (1 - fraction(y, v)); };
  auto inside = [&](const Point& p) {
    return std::isfinite(p.x) && std::isfinite(p.y) && (!x.log || p.x > 0) && (!y.log || p.y > 0) &&
           p.x >= x.min * (1 - 1e-9) && p.x <= x.max * (1 + 1e-9) && p.y >= y.min * (1 - 1e-9) &&
           p.y <= y.max * (1 + 1e-9);
  };

  // Point labels, in pixels: each beside its series' last point, placed from the top of the chart down and
  // moved down until it clears the labels above it, so that close points keep their labels in their order.
  std::vector<Point> label_at(series_.size());
  std::vector<size_t> labelled;
  for (size_t n = 0; n < series_.size(); ++n) {
    const Series& s = series_[n];
    for (auto p = s.points.rbegin(); p != s.points.rend() && !s.point_label.empty(); ++p)
      if (inside(*p)) {
        label_at[n] = {px(p->x) + 7, py(p->y) - 7};
        labelled.push_back(n);
        break;
      }
  }
  std::stable_sort(labelled.begin(), labelled.end(),
                   [&](size_t a, size_t b) { return label_at[a].y < label_at[b].y; });
  // A label's width, estimated at 6.2 px a character of the 11 px font: two labels collide when their spans
  // overlap; a label moved down is checked again against every label above it.
  auto label_width = [&](size_t n) { return 6.2 * static_cast<double>(series_[n].point_label.size()); };
  for (size_t k = 0; k < labelled.size(); ++k) {
    Point& at = label_at[labelled[k]];
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t above = 0; above < k; ++above) {
        const Point& other = label_at[labelled[above]];
        const bool overlap =
            other.x < at.x + label_width(labelled[k]) && at.x < other.x + label_width(labelled[above]);
        if (overlap && other.y + 13 > at.y && other.y - 13 < at.y) at.y = other.y + 13, moved = true;
      }
    }
  }
  // The legend is as wide as its longest name (7 px a character of the 12 px font), at least kRight.
  size_t longest = 0;
  for (const Series& s : series_) longest = std::max(longest, s.name.size());
  const double width = kLeft + plot_w + std::max(kRight, 46 + 7.0 * static_cast<double>(longest));

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kLeft << "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">" << xml_escape(title_)
      << "</text>\n";
  // Grid and tick labels.
  for (double t : ticks_of(x)) {
    if (t < x.min || t > x.max * 1.0001) continue;
    svg << "<line x1=\"" << number(px(t)) << "\" y1=\"" << kTop << "\" x2=\"" << number(px(t)) << "\" y2=\""
        << kTop + plot_h << "\" stroke=\"#e4e4e4\"/>\n";
    svg << "<text x=\"" << number(px(t)) << "\" y=\"" << kTop + plot_h + 16 << "\" text-anchor=\"middle\">"
        << tick_label(t) << "</text>\n";
  }
  for (double t : ticks_of(y)) {
    if (t < y.min || t > y.max * 1.0001) continue;
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(py(t)) << "\" x2=\"" << kLeft + plot_w << "\" y2=\""
        << number(py(t)) << "\" stroke=\"#e4e4e4\"/>\n";
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << number(py(t) + 4) << "\" text-anchor=\"end\">"
        << tick_label(t) << "</text>\n";
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\"" << plot_h
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kTop + plot_h + 40 << "\" text-anchor=\"middle\">"
      << xml_escape(x.label) << "</text>\n";
  svg << "<text transform=\"translate(22 " << kTop + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << xml_escape(y.label) << "</text>\n";

  // Series: lines, markers, point labels, legend entries.
  double legend_y = kTop + 8;
  for (size_t n = 0; n < series_.size(); ++n) {
    const Series& s = series_[n];
    const char* color = kPalette[n % std::size(kPalette)];
    std::vector<Point> shown;
    for (const Point& p : s.points)
      if (inside(p)) shown.push_back(p);
    svg << "<g class=\"series\" data-name=\"" << xml_escape(s.name) << "\">\n";
    if (s.line && shown.size() > 1) {
      svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\""
          << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (const Point& p : shown) svg << number(px(p.x)) << "," << number(py(p.y)) << " ";
      svg << "\"/>\n";
    }
    if (s.markers)
      for (const Point& p : shown)
        svg << "<circle cx=\"" << number(px(p.x)) << "\" cy=\"" << number(py(p.y)) << "\" r=\"4\" fill=\""
            << color << "\"><title>" << xml_escape(s.name) << ": (" << p.x << ", " << p.y
            << ")</title></circle>\n";
    if (!s.point_label.empty() && !shown.empty())
      svg << "<text x=\"" << number(label_at[n].x) << "\" y=\"" << number(label_at[n].y)
          << "\" font-size=\"11\" fill=\"" << color << "\">" << xml_escape(s.point_label) << "</text>\n";
    svg << "</g>\n";
    if (s.name.empty()) continue;
    const double lx = kLeft + plot_w + 16;
    if (s.line)
      svg << "<line x1=\"" << lx << "\" y1=\"" << legend_y << "\" x2=\"" << lx + 22 << "\" y2=\"" << legend_y
          << "\" stroke=\"" << color << "\" stroke-width=\"2\""
          << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n";
    if (s.markers)
      svg << "<circle cx=\"" << lx + 11 << "\" cy=\"" << legend_y << "\" r=\"4\" fill=\"" << color
          << "\"/>\n";
    svg << "<text x=\"" << lx + 30 << "\" y=\"" << legend_y + 4 << "\">" << xml_escape(s.name) << "</text>\n";
    legend_y += 18;
  }
  for (size_t n = 0; n < notes_.size(); ++n)
    svg << "<text x=\"" << kLeft << "\" y=\"" << kHeight - 8 + kNoteLine * static_cast<double>(n)
        << "\" font-size=\"11\" fill=\"#555\">" << xml_escape(notes_[n]) << "</text>\n";
  svg << "</svg>\n";
  return svg.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  if (!file) fail("cannot write '", path, "'");
  file << text;
  if (!file) fail("cannot write '", path, "'");
}

}  // namespace flashlab::cli
