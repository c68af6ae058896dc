// Small kernels that exercise one Hopper (sm_90a) instruction each, for tests/test_emulator_sm90.cpp: wgmma
// from shared memory and from registers, TMA loads and stores, mbarrier phases, setmaxnreg. Built for the
// emulator, and for the GPU when the build has CUDA, so that where an sm_90 GPU is present the emulator's
// semantics are compared with the hardware's on the same kernels. They use the Hopper stage's own instruction
// wrappers (cuda_v3_hopper/*.cuh); their expected results come from the PTX ISA's definitions, spelled out in
// the test.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cuda/target.hpp"

namespace flashlab::testing::kernels {

// What a deliberately broken Hopper kernel does wrong (emulator only: on a GPU these hang, fault or compute
// garbage).
enum class HopperMistake {
  none,
  wgmma_without_fence,           // wgmma.mma_async with no wgmma.fence before it
  accumulator_read_before_wait,  // the accumulators read between commit and wait: the result is not there yet
  accumulator_written_in_flight,  // an accumulator written between commit and wait
  operand_overwritten_in_flight,  // a shared-memory operand overwritten between commit and wait
  descriptor_base_offset,         // a descriptor with a base offset (not modelled: refused)
  exit_with_wgmma_in_flight,      // the warpgroup returns with a committed wgmma not waited for
  mbarrier_over_arrival,          // arrives again while the phase waits only for transaction bytes
  mbarrier_wrong_parity,          // waits for the parity of a phase that never comes: a deadlock
  mbarrier_expect_tx_short,       // announces 128 bytes fewer than the TMA load delivers
  mbarrier_used_before_init,      // another thread waits on the barrier with no barrier after its init
  tma_misaligned_destination,     // a TMA load into shared memory not aligned to 128 bytes
  tma_store_without_proxy_fence,  // ordinary stores, then a TMA store of them without fence.proxy.async
  tma_store_exit_before_read,     // the storing thread returns before cp.async.bulk.wait_group.read
  tma_store_negative_corner,      // a TMA store of a box whose top-left corner is at (-8, -8)
  setmaxnreg_pool_too_small,      // the consumer asks more registers than the producer freed: waits forever
  setmaxnreg_out_of_range,        // setmaxnreg to 20 registers (the range is 24 to 256, in steps of 8)
};

FLASHLAB_FOR_EACH_TARGET(
    // One warpgroup, wgmma with both operands in shared memory (bf16, K-major, 128-byte swizzle, as TMA loads
    // them): D (64 x 128) = A (64 x 64) B^T (B: 128 x 64), four chained k16 instructions. A and B are bf16
    // bits, row-major; D comes back row-major. `mistake` is none on a GPU.
    std::vector<float> wgmma_ss(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                HopperMistake mistake);
    // One warpgroup, wgmma with A from registers (bf16, 64 x 16, each thread's fragment as the PTX ISA lays
    // it out) and B from shared memory MN-major (16 x 64, rows of 64 contiguous N): D (64 x 64) = A B.
    std::vector<float> wgmma_rs(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b);
    // The same with e4m3 inputs (k32): A 64 x 32 from registers, B 128 x 32 K-major from shared memory
    // (rows of 128 bytes, the first 32 used): D (64 x 128) = A B^T. A and B are e4m3 codes.
    std::vector<float> wgmma_rs_e4m3(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);
    // A TMA load of the box of 64 x 32 16-bit elements at (column, row) of a rows x columns tensor (128-byte
    // swizzle), read back from shared memory byte for byte as it landed; then a TMA store of the same box,
    // unchanged, to (max(column, 0), max(row, 0)) of a zeroed tensor of the same shape (a store's corner
    // cannot be negative), which comes back in `stored`.
    std::vector<uint16_t> tma_box(const std::vector<uint16_t>& tensor, int rows, int columns, int column,
                                  int row, std::vector<uint16_t>& stored);
    // Warp 1 of a 64-thread block arrives on an mbarrier of count 32 in `rounds` rounds, writing the round
    // into shared memory before each arrival; warp 0 waits for each phase by parity and reads what was
    // written: the values it saw, one per round (and first, what waiting for parity 1 on the fresh barrier
    // returned at once with: -1).
    std::vector<int> mbarrier_rounds(int rounds);
    // A kernel of two warpgroups that moves registers with setmaxnreg (24 for the first, 240 for the second,
    // with 168 a thread at launch), then computes a sum with them: 256 threads' tids summed.
    int setmaxnreg_handover();
    // Runs a broken kernel (emulator builds only).
    void hopper_mistake(HopperMistake mistake);)

}  // namespace flashlab::testing::kernels
