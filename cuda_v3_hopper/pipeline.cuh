// Synchronization for the warp-specialized pipeline, one wrapper per PTX instruction (PTX ISA sections
// "mbarrier", "setmaxnreg", "membar/fence"): the transaction barriers that TMA completes and the register
// hand-over between producer and consumer warpgroups. The named barriers of ping-pong scheduling are
// common/cuda/ptx.cuh's barrier_sync / barrier_arrive. Every wrapper has two bodies (common/cuda/target.hpp):
// the inline PTX for the GPU and the emulator's execution of the instruction (emulator/device.hpp).
#pragma once

#include <cstdint>

#include "common/cuda/ptx.cuh"
#include "common/cuda/target.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

// The shared-window address that PTX's shared-memory operands take (32 bits).
__device__ inline uint32_t smem_address(const void* pointer) {
  return ptx::shared_address(pointer);
}

// --- mbarrier: a 64-bit shared-memory barrier with a phase bit ---
// A phase completes when `count` arrivals have happened and every expected transaction byte has landed; then
// the phase bit flips. Waiting names the parity of the phase waited for, so a stage reused every kStages
// iterations waits with parity (iteration / kStages) & 1.

__device__ inline void mbarrier_init(uint64_t* barrier, uint32_t count) {
#if defined(FLASHLAB_EMULATED)
  emulator::mbarrier_init(barrier, count);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)), "r"(count) : "memory");
#endif
}

// Makes this thread's mbarrier initializations visible across the cluster (to the async proxy and the other
// threads) before any copy or arrival uses them; a __syncthreads still orders them for the block's threads.
__device__ inline void fence_barrier_init() {
#if defined(FLASHLAB_EMULATED)
  emulator::fence_mbarrier_init();
#else
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
#if defined(FLASHLAB_EMULATED)
  emulator::mbarrier_arrive(barrier, bytes);
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)),
               "r"(bytes)
               : "memory");
#endif
}

__device__ inline void mbarrier_arrive(uint64_t* barrier) {
#if defined(FLASHLAB_EMULATED)
  emulator::mbarrier_arrive(barrier, 0);
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier)) : "memory");
#endif
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so waiting for
// parity 1 returns at once: producers start with parity 1 on the "empty" barriers (every stage starts free).
__device__ inline void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
#if defined(FLASHLAB_EMULATED)
  emulator::mbarrier_wait_parity(barrier, parity);
#else
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
#endif
}

// The ring of kStages shared-memory stages the producer fills and the consumers drain. Iteration i (the i-th
// key block of the CTA) uses stage i % kStages, for the (i / kStages + 1)-th time. Each stage has a "full"
// barrier (completed by TMA when the block has landed) and an "empty" one (completed by the consumers when
// they are done with it); every use of a stage completes one phase of each.
template <int kStages>
struct Ring {
  __device__ static int stage(int iteration) { return iteration % kStages; }

  // The parity a consumer waits for on stage(iteration)'s full barrier: the phase this use completes.
  // (`iteration` is [[maybe_unused]] for the exercise's skeleton, which leaves it unread.)
  __device__ static uint32_t full_parity([[maybe_unused]] int iteration) {
    uint32_t parity = 0;
    // EXERCISE BEGIN mbarrier-phase
    // teaches: mbarrier phases around a ring of stages: iteration i's use of stage i % kStages completes
    //   phase i / kStages of its barriers, and a wait names the parity of the phase it waits for; the
    //   producer's first pass finds every stage free
    // difficulty: 3
    // grades: cuda_v3_hopper/(ws|fp8)$
    // docs: docs/05-cuda-v3-hopper.md#The schedule, in words
    // hint: an mbarrier counts phases, and a wait names the parity of the phase it waits for; each use of a
    //   stage completes one phase of its barriers
    // hint2: use i of stage i % kStages is phase i / kStages of that stage's barriers. The producer waits for
    //   the consumers' release of the previous use; on its first pass there was none, so that wait must
    //   return at once
    // hint3: phases count 0, 1, 2, ... and a wait names only the low bit (mbarrier_wait above: a fresh
    //   barrier is in phase 0, so a wait for parity 1 returns at once). A consumer waits for the phase that
    //   the loads of this use complete. The producer, before it refills a stage, waits for the consumers'
    //   release of the previous use; on the first pass there was none.
    parity = (iteration / kStages) & 1;
    // EXERCISE END mbarrier-phase
    return parity;
  }

  // The parity the producer waits for on stage(iteration)'s empty barrier before refilling it: the release
  // of the stage's previous use.
  __device__ static uint32_t empty_parity([[maybe_unused]] int iteration) {
    uint32_t parity = 0;
    // EXERCISE BEGIN mbarrier-phase
    parity = full_parity(iteration) ^ 1;
    // EXERCISE END mbarrier-phase
    return parity;
  }
};

// --- Register reallocation between warpgroups ---
// The producer warpgroup gives registers back (it only issues copies) and the consumer warpgroups take them
// (their accumulators live in registers), through the block's register pool. Needs __launch_bounds__(threads,
// 1), or ptxas ignores it (C7508). kLaunchRegisters is what every thread has at launch, the count ptxas
// gives the kernel: the emulator starts the pool from it (an increase the pool cannot supply waits forever on
// a GPU), and the build checks ptxas's count against it (cuda_v3_hopper/check_registers.py).

template <uint32_t kRegisters, uint32_t kLaunchRegisters>
__device__ inline void setmaxnreg_dec() {
#if defined(FLASHLAB_EMULATED)
  emulator::setmaxnreg(false, kRegisters, kLaunchRegisters);
#else
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}

template <uint32_t kRegisters, uint32_t kLaunchRegisters>
__device__ inline void setmaxnreg_inc() {
#if defined(FLASHLAB_EMULATED)
  emulator::setmaxnreg(true, kRegisters, kLaunchRegisters);
#else
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}

// Orders this thread's ordinary shared-memory writes before later reads by the async proxy (TMA, wgmma).
__device__ inline void fence_proxy_async_shared() {
#if defined(FLASHLAB_EMULATED)
  emulator::fence_proxy_async();
#else
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
