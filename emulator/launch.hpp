// Running a kernel in the emulator: a grid of blocks spread over the host's OpenMP threads, each block's
// threads run as fibers on one of them (block.hpp). The launch helper (common/cuda/launch.cuh) builds a
// Launch from a kernel and its arguments in emulated builds; nothing else calls run().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "emulator/device.hpp"

namespace flashlab::emulator {

struct Launch {
  std::string kernel;                    // the kernel's name with its template arguments, for messages
  const void* kernel_address = nullptr;  // identifies the kernel's attributes (cudaFuncSetAttribute)
  Index3 grid;
  Index3 block;
  size_t dynamic_shared_bytes = 0;
  // Runs the kernel for the calling emulated thread: body(parameters), where `parameters` holds the launch's
  // arguments. Kernel code may read those bytes: they stand for the GPU's parameter space.
  void (*body)(const void* parameters) = nullptr;
  const void* parameters = nullptr;
  size_t parameter_bytes = 0;
};

// Runs every block. A launch configuration a GPU would refuse throws flashlab::ExecutionError, as the GPU's
// refusal does; what goes wrong inside the kernel throws flashlab::ExecutionError with the first error,
// naming the kernel, block, warp, lane and operation.
void run(const Launch& launch);

// The device the emulator presents (cudaGetDeviceProperties): Hopper's limits, sm_90.
struct DeviceLimits {
  static constexpr int compute_major = 9, compute_minor = 0;
  static constexpr int sm_count = 132;
  static constexpr int max_threads_per_block = 1024;
  static constexpr int max_threads_per_sm = 2048;
  static constexpr int max_blocks_per_sm = 32;
  static constexpr int registers_per_sm = 65536;
  static constexpr size_t shared_per_block = 48 * 1024;         // without opting in
  static constexpr size_t shared_per_block_optin = 227 * 1024;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  static constexpr size_t shared_per_sm = 228 * 1024;
  static constexpr size_t reserved_shared_per_block = 1024;
  static constexpr size_t l2_bytes = 50 * 1024 * 1024;
  static constexpr size_t global_bytes = size_t(80) << 30;
};

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), as the launch checks it.
void set_max_dynamic_shared(const void* kernel_address, size_t bytes);
size_t max_dynamic_shared(const void* kernel_address);

// How threads are scheduled between synchronization points. In order (the default): each runnable thread
// runs in thread order until it waits. Shuffled: a seeded random runnable thread runs next, and a thread is
// also preempted at random between its shared-memory accesses, so that results which depend on a missing
// barrier change from run to run; and the grid's blocks start in a seeded random order (floating-point
// atomics from several blocks then add up in another order). The default comes from
// FLASHLAB_EMULATOR_SCHEDULE ("in-order" or "shuffled:SEED"). Shuffled, a TMA load in flight lands at each
// scheduling point with probability 1 / tma_landing_odds: the PTX ISA bounds no bulk copy's latency, and a
// test may slow them (odds in the thousands) so that a kernel's other threads run far ahead of its loads.
struct ScheduleSetting {
  bool shuffled = false;
  uint64_t seed = 0;
  int tma_landing_odds = 4;
  std::string describe() const;  // "in-order", "shuffled:SEED", or "shuffled:SEED, TMA landing 1/ODDS"
};
ScheduleSetting schedule();
void set_schedule(const ScheduleSetting& setting);

// Whether the emulator sees every load and store of kernel code (the race detector, bounds and poison
// checks): true unless the build's sanitizer replaced the instrumentation it relies on (an ASan build).
bool memory_tracking();

}  // namespace flashlab::emulator
