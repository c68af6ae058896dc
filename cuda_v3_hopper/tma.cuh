// TMA (the Tensor Memory Accelerator) copies whole tiles between global and shared memory, described by a
// tensor map built on the host (ws_launch.cu, fp8_launch.cu). One thread issues a copy; loads complete on an
// mbarrier (complete_tx), stores complete in bulk groups. Coordinates past the tensor's bounds read as zero
// and are not written: that is what handles ragged sequence tails. One wrapper per instruction, each with its
// GPU and emulated body (common/cuda/target.hpp).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda_v3_hopper/pipeline.cuh"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

// Loads the box at (c0, c1, c2, c3) of a 4-D tensor map (head_dim, seqlen, heads, batch) into shared memory.
__device__ inline void tma_load_4d(void* destination, const CUtensorMap* map, uint64_t* barrier, int32_t c0,
                                   int32_t c1, int32_t c2, int32_t c3) {
#if defined(FLASHLAB_EMULATED)
  const int32_t coordinates[4] = {c0, c1, c2, c3};
  emulator::tma_load(destination, map, barrier, coordinates, 4);
#else
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

// Loads the box at (c0, c1, c2) of a 3-D tensor map (the FP8 kernel's k-major V: keys in tile, head_dim,
// tile).
__device__ inline void tma_load_3d(void* destination, const CUtensorMap* map, uint64_t* barrier, int32_t c0,
                                   int32_t c1, int32_t c2) {
#if defined(FLASHLAB_EMULATED)
  const int32_t coordinates[3] = {c0, c1, c2};
  emulator::tma_load(destination, map, barrier, coordinates, 3);
#else
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// Stores a shared-memory box to (c0, c1, c2, c3); rows past the tensor's bounds are dropped.
__device__ inline void tma_store_4d(const CUtensorMap* map, const void* source, int32_t c0, int32_t c1,
                                    int32_t c2, int32_t c3) {
#if defined(FLASHLAB_EMULATED)
  const int32_t coordinates[4] = {c0, c1, c2, c3};
  emulator::tma_store(map, source, coordinates, 4);
#else
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_address(source)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#endif
}

__device__ inline void tma_store_commit() {
#if defined(FLASHLAB_EMULATED)
  emulator::bulk_commit_group();
#else
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Waits until the committed stores have finished reading shared memory (so the block may exit or reuse it).
__device__ inline void tma_store_wait_read() {
#if defined(FLASHLAB_EMULATED)
  emulator::bulk_wait_group_read(0);
#else
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
