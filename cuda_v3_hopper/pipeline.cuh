// Synchronization for the warp-specialized pipeline, in inline PTX (PTX ISA sections "mbarrier", "bar",
// "setmaxnreg"): the transaction barriers that TMA completes, the named barriers of ping-pong scheduling, and
// the register hand-over between producer and consumer warpgroups.
#pragma once

#include <cstdint>

namespace flashlab::hopper {

__device__ inline uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// --- mbarrier: a 64-bit shared-memory barrier with a phase bit ---
// A phase completes when `count` arrivals have happened and every expected transaction byte has landed; then
// the phase bit flips. Waiting names the parity of the phase waited for, so a stage reused every kStages
// iterations waits with parity (iteration / kStages) & 1.

__device__ inline void mbarrier_init(uint64_t* barrier, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the async proxy (TMA) before any copy signals them.
__device__ inline void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)),
               "r"(bytes)
               : "memory");
}

__device__ inline void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier)) : "memory");
}

// Spins until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so waiting for
// parity 1 returns at once: producers start with parity 1 on the "empty" barriers (every stage starts free).
__device__ inline void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(smem_address(barrier)), "r"(parity)
        : "memory");
  } while (done == 0);
}

// --- Named barriers (bar.sync / bar.arrive with an id): barrier 0 is __syncthreads ---

__device__ inline void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Counts toward the barrier without waiting: "you may go" from one warpgroup to another.
__device__ inline void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// --- Register reallocation between warpgroups ---
// The producer warpgroup gives registers back (it only issues copies) and the consumer warpgroups take them
// (their accumulators live in registers). Needs __launch_bounds__(threads, 1), or ptxas ignores it (C7508).

template <uint32_t kRegisters>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <uint32_t kRegisters>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Orders this thread's ordinary shared-memory writes before later reads by the async proxy (TMA, wgmma).
__device__ inline void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace flashlab::hopper
