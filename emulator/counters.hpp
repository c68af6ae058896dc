// What a GPU profiler would count, counted by the emulator while counting is on (`flashlab profile`,
// tests/test_counters.cpp): every global byte a kernel's loads, stores, cp.async sources and TMA copies move,
// and the tensor-core instructions it issues with their FLOPs. Counts, not times: they say how much a kernel
// moves and computes, exactly and the same on every run and machine, and nothing about how long it takes.
//
// Definitions (those of NVIDIA's profiler where it has one):
// - Global bytes read and written: bytes of device memory (cudaMalloc'd) that kernel instructions request,
//   like the profiler's L1/L2 "bytes requested", not DRAM traffic: a re-read that an L2 would serve counts in
//   full, and two threads reading the same byte count it twice (bytes, not 32-byte sectors). Counted: each
//   thread's ld/st.global, cp.async's source bytes (src-size, not the zero-filled rest), TMA loads and stores
//   of the elements inside the tensor (out-of-bounds elements are filled or dropped without an access). Not
//   counted: atomics and the kernel parameter space.
// - mma.sync and wgmma: warp- and warpgroup-level instructions, one per instruction (not per thread).
// - Tensor FLOPs: 2 M N K for each of them (m16n8k16: 4096; wgmma m64nNkK: 128 N K).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashlab::emulator {

struct Counters {
  uint64_t launches = 0, blocks = 0;
  uint64_t global_read_bytes = 0, global_write_bytes = 0;
  uint64_t mma_sync = 0, wgmma = 0;
  double tensor_flops = 0;
  Counters& operator+=(const Counters& other);
};

// Counting covers every launch between start_counting() (which zeroes the counts) and stop_counting() (which
// returns them). Not nested; launches must not run concurrently with either call.
void start_counting();
Counters stop_counting();

// Whether counts are exact in this build: global loads and stores are seen through the compiler's
// instrumentation (emulator/memory.cpp), which the sanitizer build replaces.
bool counting_complete();

namespace count {  // called by the emulated operations while counting is on
void global(size_t bytes, bool write);
void block_started();
void launch_started();
void mma_sync();
void wgmma(int n, int k);
}  // namespace count

}  // namespace flashlab::emulator
