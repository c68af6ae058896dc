#include "emulator/report.hpp"

#include <cstdio>

namespace flashlab::emulator {

std::string format_where(Where where) {
  std::string_view file = where.file_name();
  if (file.empty()) return "?";
  // Paths relative to the source tree: FLASHLAB_SOURCE_DIR is the project root (emulator/CMakeLists.txt).
  const std::string_view root = FLASHLAB_SOURCE_DIR "/";
  if (file.substr(0, root.size()) == root) file.remove_prefix(root.size());
  return std::string(file) + ":" + std::to_string(where.line());
}

std::string format_index(Index3 index) {
  return "(" + std::to_string(index.x) + ", " + std::to_string(index.y) + ", " + std::to_string(index.z) +
         ")";
}

namespace {

// "0-15, 17" from a sorted list.
std::string format_ranges(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(values[i]);
    if (j > i) out += "-" + std::to_string(values[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string format_lanes(unsigned bits) {
  std::vector<int> lanes;
  for (int lane = 0; lane < 32; ++lane)
    if ((bits >> lane & 1u) != 0) lanes.push_back(lane);
  return format_ranges(lanes);
}

std::string format_threads(const std::vector<int>& tids) {
  std::vector<int> warps;
  for (int tid : tids)
    if (warps.empty() || warps.back() != tid / 32) warps.push_back(tid / 32);
  return "threads " + format_ranges(tids) + " (warp" + (warps.size() > 1 ? "s " : " ") +
         format_ranges(warps) + ")";
}

void append(std::string& out, Mask mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask.bits);
  out += text;
}

void append(std::string& out, SyncPoint point) {
  if (point.operation == nullptr) {
    out += "none since the kernel started";
    return;
  }
  out += point.operation;
  out += " at ";
  out += format_where(point.where);
}

void append(std::string& out, Hex hex) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(hex.value));
  out += text;
}

}  // namespace flashlab::emulator

namespace flashlab::emulator {

std::string kernel_name(std::string_view pretty) {
  const std::string_view key = "Kernel = ";
  size_t begin = pretty.find(key);
  if (begin == std::string_view::npos) return std::string(pretty);
  begin += key.size();
  // The argument ends at the first ';' or ']' outside angle brackets.
  size_t end = begin;
  for (int depth = 0; end < pretty.size(); ++end) {
    const char c = pretty[end];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth == 0 && (c == ';' || c == ']')) break;
  }
  std::string name(pretty.substr(begin, end - begin));
  if (!name.empty() && name.front() == '&') name.erase(0, 1);
  // Drop every namespace qualifier, "a::b::{anonymous}::k<c::T, 64>" -> "k<T, 64>".
  std::string out;
  size_t word = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 2, "::") == 0) {
      out.erase(word);
      ++i;
      continue;
    }
    const char c = name[i];
    out += c;
    if (c == '<' || c == ',' || c == ' ' || c == '(') word = out.size();
  }
  return out;
}

}  // namespace flashlab::emulator
