// TMA (the Tensor Memory Accelerator) copies whole tiles between global and shared memory, described by a
// tensor map built on the host (ws_launch.cu). One thread issues a copy; loads complete on an mbarrier
// (complete_tx), stores complete in bulk groups. Coordinates past the tensor's bounds read as zero and are
// not written: that is what handles ragged sequence tails.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda_v3_hopper/pipeline.cuh"

namespace flashlab::hopper {

// Loads the box at (c0, c1, c2, c3) of a 4-D tensor map (head_dim, seqlen, heads, batch) into shared memory.
__device__ inline void tma_load_4d(void* destination, const CUtensorMap* map, uint64_t* barrier, int32_t c0,
                                   int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Stores a shared-memory box to (c0, c1, c2, c3); rows past the tensor's bounds are dropped.
__device__ inline void tma_store_4d(const CUtensorMap* map, const void* source, int32_t c0, int32_t c1,
                                    int32_t c2, int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_address(source)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ inline void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until the committed stores have finished reading shared memory (so the block may exit or reuse it).
__device__ inline void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

}  // namespace flashlab::hopper
