// TMA tensor maps in the emulator. On a GPU, cuTensorMapEncodeTiled (libcuda) encodes a tiled view of a
// global tensor into an opaque 128-byte CUtensorMap that the TMA unit reads; without a driver, the emulator's
// encoder checks the same parameters and records them in its own form in those 128 bytes (TensorMap below),
// which its cp.async.bulk.tensor reads back (tma.cpp). emulator/include/cuda.h and cudaTypedefs.h declare the
// driver's types; cudaGetDriverEntryPointByVersion hands out encode_tensor_map_tiled.
#pragma once

#include <cstdint>
#include <string>

#include "emulator/gmma.hpp"

namespace flashlab::emulator::tma {

// CU_TENSOR_MAP_SWIZZLE_*: 0 none, 1 32B, 2 64B, 3 128B.
constexpr uint32_t swizzle_span_bytes(uint32_t swizzle) {
  return swizzle == 0 ? 0u : 16u << swizzle;
}

// Where byte `offset` of a box lands in shared memory (the box's bytes in row-major order, its innermost
// dimension contiguous): at destination + offset, with the swizzle applied to the address as wgmma's
// canonical layouts apply it (gmma.hpp: Swizzle<B, 4, 3> with 2^B 16-byte chunks per span).
constexpr uint32_t shared_address(uint32_t swizzle, uint32_t destination, uint32_t offset) {
  return swizzle == 0 ? destination + offset
                      : gmma::swizzle_chunks(swizzle_span_bytes(swizzle) / 16, destination + offset);
}

// The emulated twin of a CUtensorMap, stored in its 128 bytes.
struct TensorMap {
  static constexpr uint32_t kMagic = 0x464c544d;  // "FLTM": written by the emulator's encoder
  uint32_t magic = 0;
  uint8_t rank = 0;
  uint8_t element_bytes = 0;
  uint8_t data_type = 0;  // CUtensorMapDataType
  uint8_t swizzle = 0;    // CUtensorMapSwizzle
  uint8_t nan_fill = 0;   // CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA: out-of-bounds floats read NaN
  uint8_t box[5] = {};    // box size - 1 per dimension (1 to 256)
  uint64_t base = 0;
  uint32_t dims_minus_one[5] = {};  // global size - 1 per dimension (1 to 2^32)
  uint64_t strides[4] = {};         // bytes between consecutive indices of dimensions 1 to rank - 1
};
static_assert(sizeof(TensorMap) <= 128, "a CUtensorMap is 128 bytes");

// Encodes `map` into the 128 bytes at `destination`, or says why the driver would refuse the parameters
// (empty when it accepts them). Element strides other than 1 and interleaved layouts are refused as not
// emulated (the kernels use neither).
std::string encode(void* destination, uint32_t data_type, uint32_t rank, const void* base,
                   const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                   const uint32_t* element_strides, uint32_t interleave, uint32_t swizzle, uint32_t oob_fill);

}  // namespace flashlab::emulator::tma
