// The text of the emulator's messages (internal to emulator/). Errors inside a kernel end the block by
// abandoning the failing fiber's stack, so their text is composed from parts that own no memory (strings,
// numbers, locations, and the small tags below) inside compose(): nothing on an abandoned stack may own
// memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "emulator/device.hpp"

namespace flashlab::emulator {

struct Mask {  // printed as a hexadecimal lane mask, 0xffffffff
  unsigned bits;
};
struct Lanes {  // printed as a list of lane ranges, "0-15, 17"
  unsigned bits;
};
struct Hex {  // printed in hexadecimal, 0x4c0
  uint64_t value;
};
struct SyncPoint {        // a thread's last synchronization: "__syncthreads at cuda_v1/split_k.cu:187"
  const char* operation;  // nullptr: none since the kernel started
  Where where;
};

std::string format_where(Where where);   // "cuda_v2/split_q.cu:80", relative to the source tree
std::string format_index(Index3 index);  // "(1, 0, 2)"
std::string format_lanes(unsigned bits);
std::string format_threads(const std::vector<int>& tids);  // "threads 0-63 (warps 0-1)"

inline void append(std::string& out, std::string_view text) {
  out += text;
}
inline void append(std::string& out, const char* text) {
  out += text;
}
inline void append(std::string& out, Where where) {
  out += format_where(where);
}
inline void append(std::string& out, Index3 index) {
  out += format_index(index);
}
inline void append(std::string& out, Lanes lanes) {
  out += format_lanes(lanes.bits);
}
void append(std::string& out, Mask mask);
void append(std::string& out, SyncPoint point);
void append(std::string& out, Hex hex);
template <typename Integer>
requires std::is_integral_v<Integer>
void append(std::string& out, Integer value) {
  out += std::to_string(value);
}

template <typename... Parts>
std::string compose(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}

}  // namespace flashlab::emulator
