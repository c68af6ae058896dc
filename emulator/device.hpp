// What emulated kernel code calls: the CUDA built-ins (emulator/include/ maps threadIdx, __syncthreads,
// __shfl_xor_sync, ... onto these) and the emulated bodies of the PTX wrappers (common/cuda/ptx.cuh,
// cuda_v3_hopper/*.cuh). Each function acts for the calling emulated thread, which the emulator knows: they
// may only be called from inside a kernel launched by emulator::launch().
//
// Collective operations (barriers, shuffles, votes, ldmatrix, mma) are rendezvous: the calling thread waits,
// as a suspended fiber, until every thread the operation names has arrived, and the last one to arrive
// carries the operation out for all. A thread named by an operation that exits, or waits for something else
// forever, is an error that names both; so is an access the emulator can prove wrong (out of bounds, a race,
// reading an asynchronous copy before it has been waited for). An error ends the launch with a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>

namespace flashlab::emulator {

using Where = std::source_location;

struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};

// ---- Who am I (threadIdx, blockIdx, blockDim, gridDim) ----
Index3 thread_index();
Index3 block_index();
Index3 block_dim();
Index3 grid_dim();

// ---- Block-level synchronization (bar.sync, bar.arrive, bar.red) ----
// __syncthreads() is barrier 0 with every thread of the block; `threads` is a multiple of 32 otherwise.
void barrier_sync(unsigned id, unsigned threads, Where where = Where::current());
void barrier_arrive(unsigned id, unsigned threads, Where where = Where::current());
void sync_threads(Where where = Where::current());
// __syncthreads_count / _and / _or: a block barrier that also counts the threads whose predicate is true.
int sync_threads_count(bool predicate, Where where = Where::current());

// ---- Warp-level operations (the lanes named by `mask` meet) ----
void sync_warp(unsigned mask, Where where = Where::current());
enum class ShuffleMode { idx, up, down, bfly };
// shfl.sync: `lane_operand` and `clamp` are PTX's b and c operands (c packs the segment mask and the clamp
// value, as the CUDA intrinsics build it from `width`).
uint32_t shuffle(ShuffleMode mode, unsigned mask, uint32_t value, unsigned lane_operand, unsigned clamp,
                 Where where = Where::current());
enum class VoteMode { ballot, all, any };
unsigned vote(VoteMode mode, unsigned mask, bool predicate, Where where = Where::current());

// ---- Shared memory ----
// The block's dynamic shared memory (the launch's third <<<>>> argument), aligned to `alignment`.
void* dynamic_shared_memory(size_t alignment);
// __cvta_generic_to_shared and back: the address in the shared window that PTX instructions take.
uint32_t shared_address(const void* generic, Where where = Where::current());
void* shared_pointer(uint32_t address, size_t bytes, Where where = Where::current());

// ---- sm_80: asynchronous copies, ldmatrix, mma.sync ----
// cp.async.{ca,cg}.shared.global [dst], [src], copy_bytes, source_bytes: copies source_bytes and zero-fills
// the rest. The destination reads as poison until the cp.async.wait_group that completes the copy.
void cp_async(void* shared_destination, const void* global_source, int copy_bytes, int source_bytes,
              Where where = Where::current());
void cp_async_commit_group();
// cp.async.wait_group: completes every committed group of this thread but the newest `pending`.
void cp_async_wait_group(int pending, Where where = Where::current());
// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: registers[m] receives this lane's part of matrix m.
void ldmatrix(uint32_t* registers, int matrices, bool transpose, const void* shared_row,
              Where where = Where::current());
// The same with the row's address in the shared window, the operand as PTX takes it. Like a pointer's, the
// address is checked only for the lanes whose rows the instruction reads (the ISA ignores the others').
void ldmatrix(uint32_t* registers, int matrices, bool transpose, uint32_t shared_row,
              Where where = Where::current());
enum class MmaInput { f16, bf16 };
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: d = a * b + c with the fragment maps of
// emulator/fragments.hpp.
void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c, MmaInput input,
                  Where where = Where::current());

// ---- sm_90a: warpgroups, wgmma, mbarriers, TMA, setmaxnreg (warpgroup.cpp, tma.cpp) ----
// A warpgroup is four consecutive warps starting at a multiple of four; its .sync.aligned operations are
// rendezvous of all 128 threads at the same operation.

// wgmma.fence.sync.aligned: orders the warpgroup's register accesses before the wgmma.mma_async that follow.
// The emulator requires one before the first wgmma.mma_async after every wgmma.commit_group (it cannot see
// register accesses, so it asks for the fence wherever some could have happened).
void wgmma_fence(Where where = Where::current());
// wgmma.commit_group.sync.aligned: the wgmma.mma_async issued since the last commit become one group.
void wgmma_commit_group(Where where = Where::current());
// wgmma.wait_group.sync.aligned N: completes every committed group but the newest `pending`; a completed
// wgmma's result reaches its accumulator registers only then (before, they read as NaN).
void wgmma_wait_group(int pending, Where where = Where::current());
enum class WgmmaInput { f16, bf16, e4m3 };
struct WgmmaShape {
  int n = 0;  // 8 to 256, a multiple of 8
  WgmmaInput input = WgmmaInput::bf16;
  bool a_from_registers = false;
  bool transpose_a = false, transpose_b = false;  // imm-trans-a/b: 1 = the operand is MN-major
  int scale_a = 1, scale_b = 1;                   // imm-scale-a/b: 1 or -1
};
// wgmma.mma_async.sync.aligned.m64nNkK.f32: D (64 x N) = A (64 x K) B (K x N) + (scale_d ? D : 0), K = 16
// for f16/bf16 and 32 for e4m3. `accumulators` are this thread's N / 2 registers of D (emulator/gmma.hpp's
// accumulator layout); A comes from `a_registers` (four per thread) or the descriptor `a_descriptor`, B from
// `b_descriptor` (gmma.hpp: descriptors and canonical layouts).
void wgmma(float* accumulators, const WgmmaShape& shape, const uint32_t* a_registers, uint64_t a_descriptor,
           uint64_t b_descriptor, bool scale_d, Where where = Where::current());
// setmaxnreg.{inc,dec}.sync.aligned.u32 count: the warpgroup's registers per thread become `count`, from and
// to the block's pool. The pool starts as what the launch allotted, `launch_registers` a thread for every
// thread of the block (the count ptxas reports for the kernel, which the kernel states and the build checks);
// an increase waits until the pool can supply it.
void setmaxnreg(bool increase, uint32_t count, uint32_t launch_registers, Where where = Where::current());

// mbarrier.init.shared::cta.b64 [barrier], count.
void mbarrier_init(void* barrier, uint32_t count, Where where = Where::current());
// fence.mbarrier_init.release.cluster.
void fence_mbarrier_init(Where where = Where::current());
// mbarrier.arrive[.expect_tx].shared::cta.b64 _, [barrier] (, tx_bytes): one arrival, after announcing
// `expect_tx_bytes` of transactions to the current phase (0: a plain arrive).
void mbarrier_arrive(void* barrier, uint32_t expect_tx_bytes, Where where = Where::current());
// A loop on mbarrier.try_wait.parity.shared::cta.b64 until it succeeds: returns once the phase of parity
// `parity` has completed (a waiting thread yields to the others).
void mbarrier_wait_parity(void* barrier, uint32_t parity, Where where = Where::current());

// cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes [destination],
// [map, {coordinates}], [barrier]: the box at `coordinates` (rank of them, innermost first) lands in shared
// memory, and its bytes on the barrier, some time later; the destination reads as poison until then.
void tma_load(void* destination, const void* tensor_map, void* barrier, const int32_t* coordinates, int rank,
              Where where = Where::current());
// cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group [map, {coordinates}], [source]: the box is read from
// shared memory (which must not change until cp.async.bulk.wait_group.read) and written to global memory,
// elements out of the tensor's bounds dropped.
void tma_store(const void* tensor_map, const void* source, const int32_t* coordinates, int rank,
               Where where = Where::current());
void bulk_commit_group(Where where = Where::current());
// cp.async.bulk.wait_group.read N: the stores of every committed group but the newest `pending` have read
// their shared memory.
void bulk_wait_group_read(int pending, Where where = Where::current());
// fence.proxy.async.shared::cta: this thread's earlier ordinary shared-memory writes become visible to the
// async proxy (the TMA and wgmma reads that are ordered after the fence).
void fence_proxy_async(Where where = Where::current());

// ---- Atomics (global or shared memory; relaxed, like CUDA's atomicAdd) ----
// `where` groups the lanes' atomics on global memory into warp instructions for the counters.
int atomic_add(int* address, int value, Where where = Where::current());
unsigned atomic_add(unsigned* address, unsigned value, Where where = Where::current());
float atomic_add(float* address, float value, Where where = Where::current());
int atomic_max(int* address, int value, Where where = Where::current());
int atomic_min(int* address, int value, Where where = Where::current());
int atomic_exchange(int* address, int value, Where where = Where::current());
int atomic_compare_exchange(int* address, int compare, int value, Where where = Where::current());
// red.global.add.v2.f32 and .v4.f32: address[i] += values[i] for i < width (2 or 4), each an atomic add of
// its own (the PTX ISA's vector red), counted as one access of the whole vector. The address must be global
// memory aligned to the vector's bytes (8 or 16); anything else stops the kernel.
void red_add_f32_vector(float* address, const float* values, int width, Where where = Where::current());

// ---- Special functions ----
// ex2.approx.f32 (and .ftz): 2^x. The emulator computes it correctly rounded; the hardware's result is
// within 2 ulp of it (PTX ISA), so emulated and GPU results can differ in the last bits.
float ex2_approx(float x, bool flush_subnormals);

}  // namespace flashlab::emulator
