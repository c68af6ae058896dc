// A small SVG chart writer for `flashlab roofline` and `flashlab plot`: axes (linear or log), lines, labelled
// points and a legend, written as plain SVG that any browser shows. No plotting dependency.
#pragma once

#include <string>
#include <vector>

namespace flashlab::cli {

struct Point {
  double x = 0;
  double y = 0;
};

struct Axis {
  std::string label;
  bool log = true;
  double min = 0;  // the range drawn; Chart::render() widens an empty range
  double max = 0;
  std::vector<double> ticks;  // explicit tick positions (e.g. the sequence lengths); empty = automatic
};

struct Series {
  std::string name;  // legend entry ("" = none)
  std::vector<Point> points;
  bool line = true;     // join the points
  bool markers = true;  // draw a dot at each point
  bool dashed = false;
  std::string point_label;  // "" or a label written next to the last point (roofline: the implementation)
};

class Chart {
 public:
  Chart(std::string title, Axis x, Axis y) : title_(std::move(title)), x_(std::move(x)), y_(std::move(y)) {}
  // Series take colors in the order they are added.
  void add(Series series) { series_.push_back(std::move(series)); }
  // A note written under the plot area (assumptions, units).
  void note(std::string text) { notes_.push_back(std::move(text)); }
  // The axis ranges fitted to every point (padded), unless they were set.
  std::string render() const;

 private:
  std::string title_;
  Axis x_, y_;
  std::vector<Series> series_;
  std::vector<std::string> notes_;
};

// Escapes &, <, >, " for SVG text and attributes.
std::string xml_escape(const std::string& text);

// Writes `text` to `path`; throws Error naming the path when it cannot.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace flashlab::cli
