// Warpgroup-level matrix multiply support: shared-memory matrix descriptors and the wgmma fence / commit /
// wait protocol (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"). The instructions
// themselves are in wgmma.cuh. The emulator decodes the descriptors built here by the PTX ISA's definition,
// checked against CuTe (emulator/gmma.hpp, tests/test_fragments.cpp), not by these helpers.
#pragma once

#include <cstdint>

#include "cuda_v3_hopper/pipeline.cuh"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

// A tile in shared memory as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes (64 16-bit
// elements), the 16-byte chunks of row r stored at chunk ^ (r % 8), in 1024-byte atoms of 8 rows. A head_dim
// wider than 64 is stored as several such column panels one after the other.
constexpr uint32_t kSwizzleRowBytes = 128;
constexpr uint32_t kSwizzleAtomBytes = 1024;

// The 64-bit wgmma matrix descriptor:
//   bits  0-13  start address >> 4
//   bits 16-29  leading dimension byte offset >> 4
//   bits 32-45  stride dimension byte offset >> 4
//   bits 49-51  base offset (0: every atom is 1024-byte aligned)
//   bits 62-63  swizzle mode (1 = 128-byte swizzle)
__device__ inline uint64_t make_smem_descriptor(const void* start, uint32_t leading_byte_offset,
                                                uint32_t stride_byte_offset) {
  const uint64_t address = smem_address(start);
  uint64_t descriptor = 0;
  descriptor |= (address & 0x3FFFF) >> 4;
  descriptor |= static_cast<uint64_t>((leading_byte_offset >> 4) & 0x3FFF) << 16;
  descriptor |= static_cast<uint64_t>((stride_byte_offset >> 4) & 0x3FFF) << 32;
  descriptor |= static_cast<uint64_t>(1) << 62;
  return descriptor;
}

// K-major operand (Q as A, K as B of S = Q K^T): the reduction dimension (head_dim) is contiguous. Rows
// repeat every 8 at the atom stride (SBO = 1024 B); the leading offset is unused with 128-byte swizzle when
// one instruction's K (16 elements = 32 bytes) lies inside a row. `k_step` selects columns 16*k_step .. +15.
__device__ inline uint64_t k_major_descriptor(const void* panels, uint32_t panel_bytes, int k_step) {
  const char* base = static_cast<const char*>(panels) + (k_step / 4) * panel_bytes + (k_step % 4) * 32;
  return make_smem_descriptor(base, 16, kSwizzleAtomBytes);
}

// MN-major operand (V as B of O += P V): V's tile is [keys][head_dim], so the N dimension (head_dim) is
// contiguous and the reduction dimension (keys) is strided. In the canonical MN-major 128-byte-swizzle layout
// the N direction repeats every 64 elements at the leading offset (LBO = one column panel) and K repeats
// every 8 rows at the stride offset (SBO = 1024 B). `k_step` selects keys 16*k_step .. +15: two whole atoms.
__device__ inline uint64_t mn_major_descriptor(const void* panels, uint32_t panel_bytes, int k_step) {
  const char* base = static_cast<const char*>(panels) + k_step * 16 * kSwizzleRowBytes;
  return make_smem_descriptor(base, panel_bytes, kSwizzleAtomBytes);
}

// Before the first wgmma of a batch: orders earlier register and shared-memory accesses of the warpgroup.
__device__ inline void wgmma_fence() {
#if defined(FLASHLAB_EMULATED)
  emulator::wgmma_fence();
#else
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

// Closes the batch of wgmma issued since the last commit into one group.
__device__ inline void wgmma_commit() {
#if defined(FLASHLAB_EMULATED)
  emulator::wgmma_commit_group();
#else
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ inline void wgmma_wait() {
#if defined(FLASHLAB_EMULATED)
  emulator::wgmma_wait_group(kPending);
#else
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving accesses of accumulator registers across an asynchronous wgmma: without it,
// ptxas may read them while the instruction still writes them and must serialize (warning C7513). A compiler
// matter only: the emulated body does nothing.
template <int kCount>
__device__ inline void pin_registers(float (&registers)[kCount]) {
#if defined(FLASHLAB_EMULATED)
  (void)registers;
#else
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
#endif
}

template <int kCount>
__device__ inline void pin_registers(uint32_t (&registers)[kCount]) {
#if defined(FLASHLAB_EMULATED)
  (void)registers;
#else
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(registers[i])::"memory");
#endif
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
