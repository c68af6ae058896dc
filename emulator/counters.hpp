// What a GPU profiler would count, counted by the emulator while counting is on (`flashlab profile`,
// tests/test_counters.cpp): every global byte a kernel's loads, stores, cp.async sources and TMA copies move;
// for every warp-level memory instruction, the 32-byte sectors (global) or shared-memory wavefronts it needs
// against the fewest its bytes could need; barriers; and the tensor-core instructions with their FLOPs.
// Counts, not times: they say how much a kernel moves and computes, and how well its accesses are laid out,
// exactly and the same on every run and machine, and nothing about how long it takes.
//
// Definitions (those of NVIDIA's profiler, "Kernel Profiling Guide", where it has one):
// - Global bytes read and written: bytes of device memory (cudaMalloc'd) that kernel instructions request,
//   like the profiler's L1/L2 "bytes requested", not DRAM traffic: a re-read that an L2 would serve counts in
//   full, and two threads reading the same byte count it twice. Counted: each thread's ld/st.global,
//   cp.async's source bytes (src-size, not the zero-filled rest), TMA loads and stores of the elements inside
//   the tensor (out-of-bounds elements are filled or dropped without an access). Counted apart: the bytes of
//   device memory that atomics read, modify and write (atomicAdd, red.global.add, ...), one element each, and
//   their warp-level instructions' sectors (a vector red is one access of its whole vector). Not counted: the
//   kernel parameter space.
// - A warp-level memory instruction: the accesses of a warp's lanes at one instruction. A GPU runs a warp's
//   lanes together; the emulator runs them one after another, so it groups the n-th access of each lane at
//   one site (the instrumented instruction, or an emulated operation's source line) since the warp last met
//   at a synchronization point (a barrier, a full-warp collective, a warpgroup collective) into one
//   instruction. This is exact for converged code and for loops whose lanes run different trip counts; lanes
//   that take different branches to one site in between are grouped as if converged. ldmatrix (a warp
//   collective), wgmma and TMA (one per warpgroup or thread) are counted as they are issued.
// - Sectors (global): the distinct 32-byte aligned segments an instruction's lanes touch; ideal: the fewest
//   that hold the distinct bytes they touch, ceil(bytes / 32). A coalesced 4-byte load of 32 lanes: 4 of 4; a
//   load at a 128-byte stride: 32 of 4; all lanes at one address: 1 of 1.
// - Wavefronts (shared): shared memory has 32 banks of 4 bytes and serves one 4-byte word of each bank per
//   wavefront. An instruction whose lanes access w bytes each is served in phases of 128 / w lanes (all 32
//   for w <= 4, half-warps for 8, quarter-warps for 16: lanes 0-7, 8-15, ...); a phase needs as many
//   wavefronts as the most distinct words it touches in any one bank (lanes on one word share it: a
//   broadcast). Ideal: one wavefront per phase that has an active lane; the excess is the bank conflicts.
//   ldmatrix is such a 16-byte access by the lanes that supply row addresses (each phase one 8 x 8 matrix); a
//   wgmma operand in shared memory is read as core matrices (8 rows of 16 bytes, one phase each); a TMA copy
//   writes or reads whole 128-byte lines (bytes / 128 wavefronts, ideal by definition). The hardware's
//   exceptions (the uniform- address cases of 8- and 16-byte loads that need fewer) are not modelled.
// - Access widths are those the host compiler's instrumentation sees (emulator/memory.cpp), which for plain
//   loads and stores may split or merge what nvcc would issue as one instruction; cp.async, ldmatrix, wgmma
//   and TMA have the widths of their PTX.
// - Barriers: bar.sync, bar.arrive and __syncthreads per warp (one per warp that reaches it); mbarrier waits
//   per thread (mbarrier.try_wait.parity until the phase completes counts once).
// - mma.sync and wgmma: warp- and warpgroup-level instructions, one per instruction (not per thread).
// - Tensor FLOPs: 2 M N K for each of them (m16n8k16: 4096; wgmma m64nNkK: 128 N K).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace flashlab::emulator {

// The kinds of warp-level memory instruction counted: the first four in sectors, the rest in wavefronts.
enum class Access : uint8_t {
  global_load,      // ld.global
  global_store,     // st.global
  cp_async_global,  // cp.async's read of its source
  global_atomic,    // atom.global and red.global (an atomic on shared memory is not counted)
  shared_load,      // ld.shared
  shared_store,     // st.shared
  ldmatrix,
  cp_async_shared,  // cp.async's write of its destination
  tma_shared,       // a TMA load's write or store's read of its box
  wgmma_operand,    // wgmma's reads of A and B in shared memory
};
inline constexpr int kAccessKinds = 10;
const char* access_name(Access kind);  // "ld.global", "ldmatrix", ...
constexpr bool counts_sectors(Access kind) {
  return kind <= Access::global_atomic;
}

struct AccessCounts {
  uint64_t instructions = 0;
  uint64_t units = 0;  // sectors or wavefronts
  uint64_t ideal = 0;  // the fewest the same bytes could need
  AccessCounts& operator+=(const AccessCounts& other);
};

struct Counters {
  uint64_t launches = 0, blocks = 0;
  uint64_t global_read_bytes = 0, global_write_bytes = 0;
  uint64_t global_atomic_bytes = 0;
  AccessCounts access[kAccessKinds];
  uint64_t barriers = 0, mbarrier_waits = 0;
  uint64_t mma_sync = 0, wgmma = 0;
  double tensor_flops = 0;
  const AccessCounts& operator[](Access kind) const { return access[static_cast<int>(kind)]; }
  Counters& operator+=(const Counters& other);
};

// One lane's part of a warp-level memory instruction.
struct LaneAccess {
  int lane = 0;
  uint64_t address = 0;  // a global byte address, or a shared one
  uint32_t bytes = 0;
};
// The definitions above, for one instruction (instructions = 1).
AccessCounts sectors(std::span<const LaneAccess> lanes);
AccessCounts wavefronts(std::span<const LaneAccess> lanes);

// Counting covers every launch between start_counting() (which zeroes the counts) and stop_counting() (which
// returns them). Not nested; launches must not run concurrently with either call.
void start_counting();
Counters stop_counting();
bool counting();

// Whether counts are exact in this build: global loads and stores are seen through the compiler's
// instrumentation (emulator/memory.cpp), which the sanitizer build replaces.
bool counting_complete();

namespace count {  // called by the emulated operations while counting is on
void global(size_t bytes, bool write);
void global_atomic(size_t bytes);
void block_started();
void block_ended();
void launch_started();
void mma_sync();
void wgmma(int n, int k);
void barrier(int warps);
void mbarrier_wait();
// A lane's access at `site` (a code address or a source line), grouped with the other lanes' into warp
// instructions when the warp next meets (warp_met) or the block ends.
void lane_access(int warp, int lane, uint64_t site, Access kind, uint64_t address, uint32_t bytes);
void warp_met(int warp);
// One warp-level instruction whose counts are known at issue.
void instruction(Access kind, const AccessCounts& counts);
}  // namespace count

}  // namespace flashlab::emulator
