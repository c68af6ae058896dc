// cuda_v2's backward pass: FlashAttention-2's Algorithm 2 on tensor cores (docs/08-backward.md, "On the
// GPU"). Plain C++, like split_q.hpp: the registration (split_q.cpp) sizes the scratch and calls the
// launchers of both builds without nvcc.
//
// Four kernels:
//   dot_kernel        D_i = rowsum(dO_i * O_i) per query row (Algorithm 2 line 4), and dQ's fp32 accumulator
//                     zeroed;
//   backward_kernel   one thread block per (K/V tile j, kv head, batch), looping over the query heads of its
//                     group and the Q tiles that see tile j: P recomputed from the forward's LSE, dV_j and
//                     dK_j accumulated in registers, dQ_i's share added to the accumulator with fp32 atomics
//                     (or, in the deterministic mode, stored as tile j's partial); with 64 query rows a
//                     step over 128 keys, backward_64x128_kernel in FlashAttention-2's warp layout
//                     (backward_64x128.cu);
//   dq_kernel         dQ from the accumulator (or the partials summed in order of j), in the input format;
//   exact_kernel      where a gradient came out NaN or Inf, that row again pair by pair over the pairs that
//                     see each other only, so that a special value reaches what it reaches in the reference
//                     (docs/08, "NaN and Inf"); it reads one flag and stops when none did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cuda/int_lengths.hpp"
#include "common/cuda/target.hpp"
#include "common/cuda/tile_order.hpp"
#include "common/registry.hpp"
#include "cuda_v2/dq_tile.hpp"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

// The backward's tiles: keys per thread block and query rows per inner step. cuda_v2/split_q's backward takes
// 32 rows a step over 64 keys a block (4 warps of 16 keys); cuda_v2/split_q_bwd128's 32 over 128 (8 warps of
// 16 keys), FlashAttention-2's key tile at d 128, so that each Q tile's copy, barriers and dQ atomics serve
// twice the keys; cuda_v2/split_q_bwd64x128's 64 over 128 (8 warps in FlashAttention-2's layout,
// backward_64x128.cu), FlashAttention-2's whole tile at d 128, so that they also serve twice the rows.
inline constexpr int kBackwardBlockN = 64;
inline constexpr int kBackwardWideBlockN = 128;
inline constexpr int kBackwardBlockM = 32;
inline constexpr int kBackwardWideBlockM = 64;

struct SplitQBackwardParams {
  SplitQParams forward;  // Q, K, V, O, LSE, lengths, mask, sizes, strides, scale and masks of the forward
  const void* d_out = nullptr;  // dO, the strides of O
  void* dq = nullptr;           // the strides of Q
  void* dk = nullptr;           // dK and dV: the strides of K and V
  void* dv = nullptr;
  float* d_sum = nullptr;  // D [batch, heads_q, seqlen_q]
  // fp32 dQ [batch, heads_q, seqlen_q, head_dim]; with `deterministic`, one such partial per K/V tile,
  // [kv_tiles][batch, heads_q, seqlen_q, head_dim]; with `dq_tiled`, [batch, heads_q, Q tiles of 64 rows],
  // each tile in DqFragmentTile's order (dq_tile.hpp).
  float* dq_accum = nullptr;
  int* nonfinite = nullptr;       // raised when a gradient written is NaN or Inf (exact_kernel's cue)
  int block_n = kBackwardBlockN;  // keys a thread block: kBackwardBlockN, or kBackwardWideBlockN (bf16, d 64
                                  // or 128, no score modification or dropout, dQ by atomics)
  int block_m = kBackwardBlockM;  // query rows a step: kBackwardBlockM, or kBackwardWideBlockM (with
                                  // kBackwardWideBlockN keys only)
  bool deterministic = false;
  // The main kernel's grid: (key tile, kv head, batch). With `longest_first`
  // (cuda_v2/split_q_bwd64x128_longest_first, the 64 x 128 kernel only) it is one-dimensional, block i
  // computing key tile order.mirrored(i): common/cuda/tile_order.hpp hands out the last row block first, and
  // mirrored that is the first key tile, which under a causal mask is the longest (fewer Q tiles see later
  // keys), so the long blocks start first. The launcher sets both (split_q_bwd_longest_first_order).
  bool longest_first = false;
  cuda::TileOrder order;
  // dQ's accumulator in the fragments' order (cuda_v2/split_q_bwd64x128_tiled_dq, the 64 x 128 kernel in the
  // grid's order only): each 64-row Q tile's fp32 dQ as the kernel's threads hold it (dq_tile.hpp), added
  // with one red.global.add.v4.f32 per accumulator, where in row order a lane adds pairs to four rows.
  bool dq_tiled = false;
};

// split_q_bwd64x128_longest_first's order: the backward's key tiles of 128 keys, per (batch, kv head) pair,
// in sections of pairs whose Q, dO and fp32 dQ accumulator (what every key tile of a pair reads or adds to)
// fit in L2 together; `section` > 0 sets the pairs a section instead (at most every pair).
cuda::TileOrder split_q_bwd_longest_first_order(const SplitQParams& forward, int section = 0);

// Key tiles of the backward (its grid's x extent).
inline int backward_kv_tiles(const Problem& p, int block_n = kBackwardBlockN) {
  return static_cast<int>((p.seqlen_k + block_n - 1) / block_n);
}

// Where the backward's scratch lies in its workspace, in bytes from its start: the int lengths, D, the
// special-value flag, and dQ's accumulator (or partials; `dq_tiled`, in whole tiles of 64 rows) at a 256-byte
// boundary, cudaMalloc's alignment, so that a warp's adds meet whole 32-byte sectors and 128-byte lines (16
// bytes past one, each 32 bytes a quad of lanes adds straddled two sectors).
struct BackwardScratch {
  size_t d_sum = 0, nonfinite = 0, dq_accum = 0, bytes = 0;
};
inline BackwardScratch backward_scratch(const Problem& p, bool deterministic, int block_n = kBackwardBlockN,
                                        bool dq_tiled = false) {
  const size_t rows = static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q);
  constexpr int kTileRows = DqFragmentTile::kRows;
  const size_t tiled_rows =
      static_cast<size_t>(p.batch * p.heads_q * ((p.seqlen_q + kTileRows - 1) / kTileRows * kTileRows));
  const size_t accumulators = static_cast<size_t>(deterministic ? backward_kv_tiles(p, block_n) : 1);
  BackwardScratch s;
  s.d_sum = cuda::int_lengths_bytes(p);
  s.nonfinite = s.d_sum + (rows * 4 + 15) / 16 * 16;
  s.dq_accum = (s.nonfinite + 4 + 255) / 256 * 256;
  s.bytes = s.dq_accum + accumulators * (dq_tiled ? tiled_rows : rows) * static_cast<size_t>(p.head_dim) * 4;
  return s;
}
inline size_t backward_workspace_bytes(const Problem& p, bool deterministic, int block_n = kBackwardBlockN,
                                       bool dq_tiled = false) {
  return backward_scratch(p, deterministic, block_n, dq_tiled).bytes;
}

// exact_kernel's grid: each of its threads reads the flag, then (when it is up) each block takes every
// kExactBlocks-th row.
inline constexpr int kExactBlocks = 64, kExactThreads = 128;

// The global traffic of the backward (the atomic mode, the registered one) on a problem without an explicit
// mask or per-batch lengths (their reads are left out, as in the forward's models): K and V once per key
// tile, Q, dO, LSE and D once per (query head, Q tile that sees the tile), dK and dV written once, the pre-
// and post-kernels' rows; and apart, the bytes dQ's atomic adds read, modify and write. With block_m query
// rows a step and block_n keys a block; `dq_tiled`, dQ's accumulator in the fragments' order, whose adds
// cover a last Q tile's rows past the sequence too. tests/test_counters.cpp holds the kernels to it.
struct BackwardTraffic {
  double bytes = 0;
  double atomic_bytes = 0;
};
BackwardTraffic backward_traffic(const Problem& problem, int block_n = kBackwardBlockN,
                                 int block_m = kBackwardBlockM, bool dq_tiled = false);

// Throws flashlab::Error naming the field when the backward cannot run these parameters.
void check_split_q_backward(const SplitQBackwardParams& params);

// What the backward supports beyond the forward's rules ("" or the reason, naming the field): with 64 keys a
// block, and with 128.
std::string split_q_backward_supports(const Problem& problem);
std::string split_q_bwd128_backward_supports(const Problem& problem);
std::string split_q_bwd64x128_backward_supports(const Problem& problem);
std::string split_q_bwd64x128_longest_first_backward_supports(const Problem& problem);
std::string split_q_bwd64x128_tiled_dq_backward_supports(const Problem& problem);
std::string split_q_bwd64x128_tiled_dq_longest_first_backward_supports(const Problem& problem);

FLASHLAB_FOR_EACH_TARGET(
    // The three kernels, enqueued on `stream`.
    void split_q_backward(const SplitQBackwardParams& params, cudaStream_t stream);
    // The registry's launchers: the problem on the backward's device tensors, scratch
    // (backward_workspace_bytes) in tensors.forward.workspace, on the default stream; dQ by atomics, or
    // deterministic (partials per key tile summed in a fixed order).
    void launch_split_q_backward(const Problem& problem, const BackwardTensors& tensors);
    void launch_split_q_backward_deterministic(const Problem& problem, const BackwardTensors& tensors);
    // The same with 128 keys a block (cuda_v2/split_q_bwd128's), dQ by atomics.
    void launch_split_q_bwd128_backward(const Problem& problem, const BackwardTensors& tensors);
    // With 64 query rows a step over 128 keys (cuda_v2/split_q_bwd64x128's), dQ by atomics.
    void launch_split_q_bwd64x128_backward(const Problem& problem, const BackwardTensors& tensors);
    // The same with its key tiles in split_q_bwd_longest_first_order
    // (cuda_v2/split_q_bwd64x128_longest_first's), in sections of `section` pairs (0: as L2 sizes them);
    // with `dq_tiled`, dQ's accumulator in the fragments' order too.
    void launch_split_q_bwd64x128_longest_first_backward(const Problem& problem,
                                                         const BackwardTensors& tensors);
    void launch_split_q_bwd64x128_longest_first_sections(const Problem& problem,
                                                         const BackwardTensors& tensors, int section,
                                                         bool dq_tiled = false);
    // The 64 x 128 kernel with dQ's accumulator in the fragments' order
    // (cuda_v2/split_q_bwd64x128_tiled_dq's), and with its key tiles longest first as well
    // (cuda_v2/split_q_bwd64x128_tiled_dq_longest_first's).
    void launch_split_q_bwd64x128_tiled_dq_backward(const Problem& problem, const BackwardTensors& tensors);
    void launch_split_q_bwd64x128_tiled_dq_longest_first_backward(const Problem& problem,
                                                                  const BackwardTensors& tensors);)

}  // namespace flashlab::cuda_v2
