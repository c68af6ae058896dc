// flashlab layout NAME [--trans] [--n N] [--bytes B] [--svg FILE]: which lane and register hold which element
// of a tensor-core fragment, and where a swizzle puts each 16-byte chunk of shared memory. The maps are the
// emulator's own (emulator/fragments.hpp, emulator/gmma.hpp), the ones tests/test_fragments.cpp checks
// against CuTe and the PTX ISA: what this prints is what the emulator executes.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "emulator/fragments.hpp"
#include "emulator/gmma.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/svg.hpp"

namespace flashlab::cli {

namespace {

namespace fragments = emulator::fragments;
namespace gmma = emulator::gmma;

// One matrix of cells: its name, what a cell says, and the owner that colours it (a lane or a thread).
struct Grid {
  std::string title;
  int rows = 0, cols = 0;
  int colours = 32;  // owners modulo this many hues

  std::vector<std::string> text;  // row-major
  std::vector<int> owner;         // row-major; -1: none
  Grid(std::string name, int r, int c)
      : title(std::move(name)), rows(r), cols(c), text(size_t(r) * c), owner(size_t(r) * c, -1) {}
  void set(int row, int col, std::string cell, int who) {
    text[size_t(row) * cols + col] = std::move(cell);
    owner[size_t(row) * cols + col] = who;
  }
};

struct Layout {
  std::string title;
  std::vector<std::string> legend;  // lines printed under the title
  std::vector<Grid> grids;
};

std::string lane_register(int lane, const char* operand, int reg, int half) {
  std::string cell = std::to_string(lane) + ":" + operand + std::to_string(reg);
  if (half >= 0) cell += half == 0 ? "l" : "h";
  return cell;
}

Layout mma16816() {
  namespace m = fragments::m16n8k16;
  Layout layout{"mma.sync.aligned.m16n8k16 (f16/bf16 in, f32 accumulate): D = A B + C",
                {"cell = lane:register, and for 16-bit elements the register's low (l) or high (h) half",
                 "colour = lane; the lanes of a quad (4g .. 4g+3) share rows g and g+8 of A, C and D"},
                {}};
  Grid a("A (16 x 16, row-major)", m::M, m::K), b("B (16 x 8, column-major: rows are k)", m::K, m::N),
      c("C and D (16 x 8, f32)", m::M, m::N);
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < m::a_registers; ++reg)
      for (int half = 0; half < 2; ++half) {
        const auto e = m::a(lane, reg, half);
        a.set(e.row, e.col, lane_register(lane, "a", reg, half), lane);
      }
    for (int reg = 0; reg < m::b_registers; ++reg)
      for (int half = 0; half < 2; ++half) {
        const auto e = m::b(lane, reg, half);
        b.set(e.row, e.col, lane_register(lane, "b", reg, half), lane);
      }
    for (int reg = 0; reg < m::c_registers; ++reg) {
      const auto e = m::c(lane, reg);
      c.set(e.row, e.col, lane_register(lane, "c", reg, -1), lane);
    }
  }
  layout.grids = {a, b, c};
  return layout;
}

Layout ldmatrix(bool transpose) {
  namespace l = fragments::ldmatrix;
  Layout layout{std::string("ldmatrix.sync.aligned.m8n8.x4") + (transpose ? ".trans" : "") + ".shared.b16",
                {"four 8 x 8 matrices of 16-bit elements; lane 8m + r gives the address of row r of matrix m",
                 "cell = the lane whose register m receives the element, and its low (l) or high (h) half",
                 transpose ? "with .trans lane l receives column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1"
                           : "without .trans lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1"},
                {}};
  for (int matrix = 0; matrix < 4; ++matrix) {
    Grid grid("matrix " + std::to_string(matrix) + " -> register " + std::to_string(matrix) +
                  " (rows from lanes " + std::to_string(l::address_lane(matrix, 0)) + "-" +
                  std::to_string(l::address_lane(matrix, 7)) + ")",
              l::rows, l::cols);
    for (int lane = 0; lane < 32; ++lane)
      for (int half = 0; half < 2; ++half) {
        const auto e = l::element(lane, half, transpose);
        grid.set(e.row, e.col, std::to_string(lane) + (half == 0 ? "l" : "h"), lane);
      }
    layout.grids.push_back(grid);
  }
  return layout;
}

Layout wgmma(int n) {
  Layout layout{"wgmma.mma_async m64n" + std::to_string(n) + " (a warpgroup of 128 threads)",
                {"cell = thread:register (threads 0-127 of the warpgroup; warp w holds rows 16w .. 16w+15)",
                 "A from registers: four 32-bit registers a thread, 2 (16-bit) or 4 (e4m3) elements each, "
                 "lowest bits first (value v)"},
                {}};
  Grid accumulator("the f32 accumulator D (64 x " + std::to_string(n) + ")", 64, n);
  Grid a16("A from registers, f16/bf16 (64 x 16): thread:register.value", 64, 16);
  Grid a8("A from registers, e4m3 (64 x 32): thread:register.value", 64, 32);
  for (uint32_t thread = 0; thread < 128; ++thread) {
    for (uint32_t reg = 0; reg < uint32_t(n) / 2; ++reg) {
      const auto e = gmma::accumulator(thread, reg);
      accumulator.set(int(e.row), int(e.col), std::to_string(thread) + ":" + std::to_string(reg),
                      int(thread));
    }
    for (uint32_t reg = 0; reg < 4; ++reg) {
      for (uint32_t value = 0; value < 2; ++value) {
        const auto e = gmma::a_fragment(2, thread, reg, value);
        a16.set(int(e.row), int(e.col),
                std::to_string(thread) + ":" + std::to_string(reg) + "." + std::to_string(value),
                int(thread));
      }
      for (uint32_t value = 0; value < 4; ++value) {
        const auto e = gmma::a_fragment(1, thread, reg, value);
        a8.set(int(e.row), int(e.col),
               std::to_string(thread) + ":" + std::to_string(reg) + "." + std::to_string(value), int(thread));
      }
    }
  }
  layout.grids = {accumulator, a16, a8};
  return layout;
}

Layout swizzle(int bytes) {
  const gmma::LayoutType type = bytes == 128  ? gmma::LayoutType::swizzle_128b
                                : bytes == 64 ? gmma::LayoutType::swizzle_64b
                                : bytes == 32 ? gmma::LayoutType::swizzle_32b
                                              : gmma::LayoutType::interleave;
  const int chunks = static_cast<int>(gmma::chunks_per_row(type));
  Layout layout{
      std::to_string(bytes) + "-byte swizzle (Swizzle<" + std::to_string(__builtin_ctz(chunks)) +
          ", 4, 3>: address bits 4.. XOR bits 7..), as wgmma descriptors and TMA use it",
      {"rows of " + std::to_string(bytes) + " bytes (" + std::to_string(chunks) +
           " 16-byte chunks) from a 1024-byte-aligned base; 8 rows make one repeat",
       "cell = where logical chunk c of row r is stored: its chunk within the row, and the 4 banks of "
       "4 bytes it occupies",
       "every element of a chunk goes with it; the 8 rows' chunk c (one ldmatrix, one column of a "
       "K-major tile) land on distinct banks where the swizzle spreads them"},
      {}};
  Grid grid("logical (row, chunk) -> stored chunk and banks", 8, chunks);
  grid.colours = chunks;
  for (int row = 0; row < 8; ++row)
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const uint32_t logical = static_cast<uint32_t>(row * bytes + chunk * 16);
      const uint32_t stored = gmma::swizzle(type, logical);
      const int stored_chunk = static_cast<int>(stored % uint32_t(bytes)) / 16;
      const int bank = static_cast<int>(stored / 4 % 32);
      grid.set(
          row, chunk,
          "c" + std::to_string(stored_chunk) + " b" + std::to_string(bank) + "-" + std::to_string(bank + 3),
          stored_chunk);
    }
  layout.grids = {grid};
  return layout;
}

void print_text(const Layout& layout) {
  std::printf("%s\n", layout.title.c_str());
  for (const std::string& line : layout.legend) std::printf("  %s\n", line.c_str());
  for (const Grid& grid : layout.grids) {
    size_t width = 3;
    for (const std::string& cell : grid.text) width = std::max(width, cell.size());
    std::printf("\n%s\n%4s", grid.title.c_str(), "");
    for (int col = 0; col < grid.cols; ++col) std::printf(" %*d", int(width), col);
    std::printf("\n");
    for (int row = 0; row < grid.rows; ++row) {
      std::printf("%4d", row);
      for (int col = 0; col < grid.cols; ++col)
        std::printf(" %*s", int(width), grid.text[size_t(row) * grid.cols + col].c_str());
      std::printf("\n");
    }
  }
}

// The grids one under the other, each cell coloured by its owner (32 hues, so lanes of a warp differ).
std::string render_svg(const Layout& layout) {
  size_t longest = 3, longest_line = layout.title.size();
  int widest = 0;
  for (const Grid& grid : layout.grids) {
    for (const std::string& cell : grid.text) longest = std::max(longest, cell.size());
    widest = std::max(widest, grid.cols);
  }
  for (const std::string& line : layout.legend) longest_line = std::max(longest_line, line.size());
  const double cell_w = 10.0 + 6.8 * double(longest), cell_h = 18, left = 40;
  double y = 30 + 16.0 * double(layout.legend.size()) + 20;
  std::string body;
  char buffer[256];
  for (const Grid& grid : layout.grids) {
    std::snprintf(buffer, sizeof buffer, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"13\" font-weight=\"bold\">",
                  left, y);
    body += buffer + xml_escape(grid.title) + "</text>\n";
    y += 8;
    for (int col = 0; col < grid.cols; ++col) {
      std::snprintf(
          buffer, sizeof buffer,
          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\" text-anchor=\"middle\">%d</text>\n",
          left + (col + 0.5) * cell_w, y + 10, col);
      body += buffer;
    }
    y += 14;
    for (int row = 0; row < grid.rows; ++row) {
      std::snprintf(
          buffer, sizeof buffer,
          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\" text-anchor=\"end\">%d</text>\n",
          left - 4, y + row * cell_h + 13, row);
      body += buffer;
      for (int col = 0; col < grid.cols; ++col) {
        const size_t at = size_t(row) * grid.cols + col;
        const int owner = grid.owner[at];
        const int hue = owner < 0 ? 0 : (owner % grid.colours) * 360 / grid.colours;
        std::snprintf(
            buffer, sizeof buffer,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">",
            left + col * cell_w, y + row * cell_h, cell_w, cell_h,
            owner < 0 ? "#eee" : ("hsl(" + std::to_string(hue) + ",70%,82%)").c_str(),
            left + (col + 0.5) * cell_w, y + row * cell_h + 13);
        body += buffer + xml_escape(grid.text[at]) + "</text>\n";
      }
    }
    y += grid.rows * cell_h + 30;
  }
  // Wide enough for the grids and for the title and legend lines (about 8 px a character of the 12-15 px
  // font).
  const double width = left + std::max(widest * cell_w, 8.0 * double(longest_line)) + 20, height = y;
  std::snprintf(
      buffer, sizeof buffer,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"monospace\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  std::string svg = buffer;
  svg += "<text x=\"" + std::to_string(int(left)) + "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" +
         xml_escape(layout.title) + "</text>\n";
  for (size_t n = 0; n < layout.legend.size(); ++n)
    svg += "<text x=\"" + std::to_string(int(left)) + "\" y=\"" + std::to_string(42 + 16 * int(n)) +
           "\" font-size=\"12\" fill=\"#333\">" + xml_escape(layout.legend[n]) + "</text>\n";
  return svg + body + "</svg>\n";
}

int layout_command(const std::vector<std::string>& argv) {
  const Args args(argv, {"--n", "--bytes", "--svg"}, {"--trans"});
  if (args.positional().size() != 1)
    fail("layout needs one of: mma16816, ldmatrix [--trans], wgmma [--n N], swizzle [--bytes 32|64|128]");
  const std::string& name = args.positional()[0];
  Layout layout;
  if (name == "mma16816") {
    layout = mma16816();
  } else if (name == "ldmatrix") {
    layout = ldmatrix(args.has("--trans"));
  } else if (name == "wgmma") {
    const int64_t n = args.get_int("--n", 16);
    if (n < 8 || n > 256 || n % 8 != 0) fail("--n (", n, ") must be a multiple of 8 from 8 to 256");
    layout = wgmma(static_cast<int>(n));
  } else if (name == "swizzle") {
    const int64_t bytes = args.get_int("--bytes", 128);
    if (bytes != 32 && bytes != 64 && bytes != 128) fail("--bytes (", bytes, ") must be 32, 64 or 128");
    layout = swizzle(static_cast<int>(bytes));
  } else {
    fail("unknown layout '", name, "' (mma16816, ldmatrix, wgmma, swizzle)");
  }
  if (name != "ldmatrix" && args.has("--trans")) fail("--trans applies to ldmatrix only");
  if (name != "wgmma" && args.has("--n")) fail("--n applies to wgmma only");
  if (name != "swizzle" && args.has("--bytes")) fail("--bytes applies to swizzle only");
  print_text(layout);
  if (const auto svg = args.get("--svg")) {
    write_text_file(*svg, render_svg(layout));
    std::printf("\nwrote %s\n", svg->c_str());
  }
  return 0;
}

const CommandRegistration layout{
    {"layout", "flashlab layout mma16816|ldmatrix [--trans]|wgmma [--n N]|swizzle [--bytes B] [--svg FILE]",
     layout_command}};

}  // namespace

}  // namespace flashlab::cli
