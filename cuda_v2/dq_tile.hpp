// dQ's fp32 accumulator in the fragments' order: where each element of a 64-row Q tile's dQ lies when the
// tile is stored in the order the 64 x 128 backward kernel's threads hold it
// (cuda_v2/split_q_bwd64x128_tiled_dq; docs/08-backward.md, "dQ's accumulator in the fragments' order").
// FlashAttention-2's backward adds into its dQ accumulator the same way: each warp's add then covers
// contiguous bytes, where in row order it covers 8 rows of a few columns each. Plain C++, so that the host
// test holds the two directions to each other.
#pragma once

#include "common/host_device.hpp"

namespace flashlab::cuda_v2 {

// One Q tile of 64 rows x head_dim columns. Its product dQ_i += dS K_j is split over 8 warps, 2 (rows) x 4
// (columns), each 32 rows x head_dim / 4 columns as 2 x (head_dim / 32) mma accumulators (m-tile mt, n-tile
// nt) of 16 x 8. In the tile, accumulator (mt, nt) of every thread comes in thread order, its 4 floats
// together: a warp's red.global.add.v4.f32 of one accumulator covers 512 contiguous bytes.
struct DqFragmentTile {
  static constexpr int kRows = 64, kWarps = 8, kThreads = 32 * kWarps, kWarpRows = 32;
  int head_dim;  // 64 or 128 (the 64 x 128 kernel's)

  FLASHLAB_HOST_DEVICE constexpr int elements() const { return kRows * head_dim; }
  FLASHLAB_HOST_DEVICE constexpr int warp_cols() const { return head_dim / 4; }
  FLASHLAB_HOST_DEVICE constexpr int n_tiles() const { return warp_cols() / 8; }  // a warp's, per m-tile
  // Warp `warp`'s part: rows first_row(warp) .. + 31, columns first_col(warp) .. + head_dim / 4 - 1.
  FLASHLAB_HOST_DEVICE static constexpr int first_row(int warp) { return kWarpRows * (warp / 4); }
  FLASHLAB_HOST_DEVICE constexpr int first_col(int warp) const { return warp_cols() * (warp % 4); }

  // Where thread `thread`'s accumulator (mt, nt) starts in the tile: its 4 floats follow.
  FLASHLAB_HOST_DEVICE constexpr int fragment(int thread, int mt, int nt) const {
    return ((mt * n_tiles() + nt) * kThreads + thread) * 4;
  }
  // Where element (row, col) of the tile lies: the thread and accumulator that hold it, by the mma's
  // accumulator layout (tensor_core.cuh: register e of lane l is row l / 4 + 8 (e / 2), column 2 (l % 4) +
  // e % 2 of its 16 x 8 tile).
  FLASHLAB_HOST_DEVICE constexpr int element(int row, int col) const {
    const int warp = row / kWarpRows * 4 + col / warp_cols();
    const int mt = row % kWarpRows / 16, nt = col % warp_cols() / 8;
    const int r = row % 16, c = col % 8;  // in the 16 x 8 accumulator
    const int lane = r % 8 * 4 + c / 2, e = r / 8 * 2 + c % 2;
    return fragment(32 * warp + lane, mt, nt) + e;
  }
};

}  // namespace flashlab::cuda_v2
