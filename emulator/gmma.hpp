// The layouts of Hopper's warpgroup-level matrix instructions (wgmma.mma_async), each defined once: the
// 64-bit shared-memory matrix descriptor, the canonical operand layouts it describes with their 16-byte-chunk
// swizzles, the fp32 accumulator fragment and the register fragment of an A operand. The emulated wgmma
// (sm90.cpp) uses them, and tests/test_fragments.cpp checks them against CuTe (make_gmma_desc, the GMMA
// layout atoms, Swizzle<B, 4, 3>, MMA_Traits of the SM90 GMMA atoms): a kernel's own descriptor helpers
// (cuda_v3_hopper/warpgroup.cuh) are not the reference.
//
// Terms (PTX ISA, "Matrix Descriptor Format" and "Shared Memory Matrix Layout"): an operand tile is M x K (A)
// or N x K (B). "K-major" stores the K direction contiguously, "MN-major" the M or N direction. Its unit is
// the 16-byte chunk: T = 16 / element_bytes elements. A swizzled layout is built from atoms of 8 rows of
// W chunks (W = 2, 4, 8 for the 32-, 64- and 128-byte swizzles; 1 for none), and the chunk index within a row
// is XORed with the row's index within the atom, computed from address bits (Swizzle<log2 W, 4, 3>).
#pragma once

#include <cstdint>

namespace flashlab::emulator::gmma {

// Descriptor bits 62-63.
enum class LayoutType : uint8_t { interleave = 0, swizzle_128b = 1, swizzle_64b = 2, swizzle_32b = 3 };

// 16-byte chunks per swizzle row: 1 (no swizzle), 2, 4, 8.
constexpr uint32_t chunks_per_row(LayoutType type) {
  switch (type) {
    case LayoutType::swizzle_128b:
      return 8;
    case LayoutType::swizzle_64b:
      return 4;
    case LayoutType::swizzle_32b:
      return 2;
    default:
      return 1;
  }
}

struct Descriptor {
  uint32_t start = 0;                // byte address in shared memory (bits 0-13, in 16-byte units)
  uint32_t leading_byte_offset = 0;  // bits 16-29, in 16-byte units
  uint32_t stride_byte_offset = 0;   // bits 32-45, in 16-byte units
  uint32_t base_offset = 0;          // bits 49-51
  LayoutType layout = LayoutType::interleave;
};

constexpr Descriptor decode(uint64_t bits) {
  Descriptor d;
  d.start = static_cast<uint32_t>(bits & 0x3fff) << 4;
  d.leading_byte_offset = static_cast<uint32_t>((bits >> 16) & 0x3fff) << 4;
  d.stride_byte_offset = static_cast<uint32_t>((bits >> 32) & 0x3fff) << 4;
  d.base_offset = static_cast<uint32_t>((bits >> 49) & 0x7);
  d.layout = static_cast<LayoutType>((bits >> 62) & 0x3);
  return d;
}

// Swizzle<B, 4, 3> on a byte address, with W = 2^B chunks a row: the 16-byte chunk bits [4, 4 + B) XOR the
// row bits [7, 7 + B). The identity for W = 1. TMA's swizzle modes are the same function (tensor_map.hpp).
constexpr uint32_t swizzle_chunks(uint32_t chunks, uint32_t address) {
  const uint32_t mask = chunks - 1;  // B one-bits
  return address ^ (((address >> 7) & mask) << 4);
}
constexpr uint32_t swizzle(LayoutType type, uint32_t address) {
  return swizzle_chunks(chunks_per_row(type), address);
}

enum class Major : uint8_t { k, mn };

// The byte address of element (mn, k) of an operand described by `d` (mn: the M or N index, k: the K index
// of one instruction), `element_bytes` wide. Canonical layouts, in 16-byte chunks, of the element split as
// mn = (row r < 8, group g) and k = (element e < T, chunk c) for K-major, and mn = (element e < T, chunk c <
// W, group g) and k = (row r < 8, group h) for MN-major:
//   K-major,  no swizzle:  r + g SBO + c LBO           K-major,  swizzled:  r W + g SBO + c
//   MN-major, no swizzle:  g SBO + r + h LBO           MN-major, swizzled:  c + g LBO + r W + h SBO
// then the address start + 16 chunks + e element_bytes, swizzled.
constexpr uint32_t element_address(const Descriptor& d, Major major, uint32_t element_bytes, uint32_t mn,
                                   uint32_t k) {
  const uint32_t t = 16 / element_bytes, w = chunks_per_row(d.layout);
  const uint32_t lbo = d.leading_byte_offset / 16, sbo = d.stride_byte_offset / 16;
  const bool swizzled = d.layout != LayoutType::interleave;
  uint32_t chunk = 0, element = 0;
  if (major == Major::k) {
    const uint32_t r = mn % 8, g = mn / 8, c = k / t;
    element = k % t;
    chunk = swizzled ? r * w + g * sbo + c : r + g * sbo + c * lbo;
  } else {
    const uint32_t c = (mn / t) % w, g = mn / (t * w), r = k % 8, h = k / 8;
    element = mn % t;
    chunk = swizzled ? c + g * lbo + r * w + h * sbo : g * sbo + r + h * lbo;
  }
  return swizzle(d.layout, d.start + 16 * chunk + element * element_bytes);
}

// The fp32 accumulator D (64 x N) of wgmma .m64nN: thread t (0-127) of the warpgroup, register r (0 to N/2 -
// 1). Warp w = t / 32 holds rows 16w to 16w + 15, like the 16 x 8 accumulator of mma.sync m16n8k16 repeated
// over N / 8 column blocks: {row, col} = {16w + lane/4 + 8 ((r/2) % 2), 8 (r/4) + 2 (lane % 4) + r % 2}.
struct Element {
  uint32_t row = 0, col = 0;
  constexpr bool operator==(const Element&) const = default;
};
constexpr Element accumulator(uint32_t thread, uint32_t reg) {
  const uint32_t warp = thread / 32, lane = thread % 32;
  return {16 * warp + lane / 4 + 8 * ((reg / 2) % 2), 8 * (reg / 4) + 2 * (lane % 4) + reg % 2};
}

// Matrix A (64 x K) from registers: four 32-bit registers a thread, each holding 4 / element_bytes elements,
// lowest bits first. For 16-bit inputs (K = 16), value v of register r is {16w + lane/4 + 8 (r % 2),
// 2 (lane % 4) + v + 8 (r / 2)}, mma.sync m16n8k16's A per warp; for 8-bit inputs (K = 32), {16w + lane/4 +
// 8 (r % 2), 4 (lane % 4) + v + 16 (r / 2)}.
constexpr Element a_fragment(uint32_t element_bytes, uint32_t thread, uint32_t reg, uint32_t value) {
  const uint32_t warp = thread / 32, lane = thread % 32;
  const uint32_t per_register = 4 / element_bytes;  // 2 or 4
  const uint32_t k_half = 4 * per_register;         // 8 or 16: the K offset of registers 2 and 3
  return {16 * warp + lane / 4 + 8 * (reg % 2), per_register * (lane % 4) + value + k_half * (reg / 2)};
}

}  // namespace flashlab::emulator::gmma
