// Small kernels that exercise one CUDA feature each, for tests/test_emulator.cpp: built for the emulator, and
// for the GPU when the build has CUDA, so that where a GPU is present the emulator's semantics are compared
// with the hardware's on the same kernels. Each function runs its kernel on host inputs and returns host
// outputs; a kernel that goes wrong throws flashlab::Error (in the emulator: with what the emulator found).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cuda/target.hpp"

namespace flashlab::testing::kernels {

enum class Shuffle { idx, up, down, bfly };
enum class Vote { ballot, all, any };

// What a deliberately broken kernel does wrong (emulator only: on a GPU these hang, fault or race).
enum class Mistake {
  none,
  missing_syncthreads,      // threads read a neighbour's shared-memory write with no barrier between
  missing_syncwarp,         // lanes read a neighbour's write with no __syncwarp between
  shuffle_instead_of_sync,  // a shuffle between write and read: it exchanges registers, it orders nothing
  early_exit_at_barrier,    // half the block returns before a __syncthreads the other half reaches
  crossed_named_barriers,   // two warps wait at different named barriers that each need both
  mismatched_collective,    // half a warp shuffles, the other half votes
  exited_lane_in_mask,      // lane 31 returns, the others shuffle with a full mask
  shared_out_of_bounds,     // reads one float past the dynamic shared memory
  global_out_of_bounds,     // reads one element past the end of an allocation
  uninitialized_shared,     // reads shared memory nobody wrote
  cp_async_without_wait,    // reads a cp.async destination before cp.async.wait_group
  write_after_reads,        // one thread overwrites a word the others read, with no barrier after their reads
  write_after_many_reads,   // the same, after more readers than a read set holds in place
  bytes_then_word,          // 4 threads write a word's bytes (no race); a fifth reads it with no barrier
};

// Per lane, a byte offset (access_pattern).
struct AccessOffsets {
  int bytes[32];
};

FLASHLAB_FOR_EACH_TARGET(
    // __shfl_*_sync(mask, lane * 10 + 7, b, width) for every lane of one warp; lanes outside `mask` write -1.
    std::vector<int> shuffle(Shuffle mode, unsigned mask, int b, int width);
    // __ballot_sync / __all_sync / __any_sync over one warp with predicate (lane is in `true_lanes`).
    std::vector<unsigned> vote(Vote mode, unsigned mask, unsigned true_lanes);
    // __syncthreads_count, _and, _or over a block of `threads`, predicate thread % modulus == 0.
    std::vector<int> syncthreads_reductions(int threads, int modulus);
    // ldmatrix.x{matrices}[.trans] of `shared` (16-bit values, row r of matrix m at rows[m * 8 + r] * 8):
    // the 32 lanes' registers, lane-major. The rows' addresses as generic pointers, or as shared-window
    // addresses.
    std::vector<uint32_t> ldmatrix(int matrices, bool transpose, const std::vector<uint16_t>& shared,
                                   const std::vector<int>& rows, bool window_address);
    // mma.sync m16n8k16: the 32 lanes' registers a[4], b[2], c[4] in, d[4] out (lane-major).
    std::vector<float> mma(bool bf16, const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                           const std::vector<float>& c);
    // `blocks` blocks of `threads`: each thread adds (1, 2) (b + 1) in block b, or with `width` 4 (1, 2, 3,
    // 4) (b + 1), to vector thread % vectors of `vectors` vectors of `width` floats, starting at 0, with one
    // red.global.add.v2.f32 or .v4.f32; returns the sums. The vectors start `first` floats into their
    // buffer: 1 misaligns them (a mistake: the emulator stops it).
    std::vector<float> red_vectors(int width, int blocks, int threads, int vectors, int first = 0);
    // A device allocation of `bytes` (cuda::DeviceBuffer), freed at once: what a failed one throws; and
    // whether CUDA's last error is set (cudaPeekAtLastError), which the next launch's check would report.
    void allocate(std::size_t bytes); bool error_pending();
    // cp.async of `source` (16-byte chunks, chunk i with src-size sizes[i]) into shared memory, committed in
    // one group and waited for, then read back.
    std::vector<float> cp_async(const std::vector<float>& source, const std::vector<int>& sizes);
    // One warp: lane l reads `width` (4, 8 or 16) bytes at byte offset offsets.bytes[l] of `floats` floats
    // 0, 1, 2, ... in global memory or, if `shared`, in a copy in shared memory; returns each lane's sum.
    std::vector<float> access_pattern(bool shared, int width, const AccessOffsets& offsets, int floats);
    // A block of `threads` that writes shared memory, synchronizes as it should and reads a neighbour's value
    // (mistake none), or makes `mistake`; returns what each thread read.
    std::vector<float> neighbours(int threads, Mistake mistake);
    // A launch of a kernel with `threads` threads and `shared_bytes` of dynamic shared memory, after opting
    // in to `opt_in_bytes` (0: not at all).
    void launch_configuration(int threads, int shared_bytes, int opt_in_bytes);
    // Each thread of `blocks` blocks of 64 appends its index to a global list (atomicAdd): the order the
    // schedule ran them in.
    std::vector<int> arrival_order(int blocks);)

}  // namespace flashlab::testing::kernels
