// How split_q uses the Ampere-generation instructions (their wrappers are in common/cuda/ptx.cuh):
//   cp.async   global -> shared copy bypassing registers: the next K/V tile loads while this one is used
//   ldmatrix   a warp loads 8x8 b16 matrices from shared memory straight into mma fragment layout
//   mma.sync   m16n8k16, fp16/bf16 inputs, fp32 accumulators: one warp-wide tensor-core product
// the rows each lane hands to ldmatrix, the fragment layout of the mma, and the swizzle that keeps ldmatrix
// and cp.async free of shared-memory bank conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/convert.cuh"
#include "common/cuda/ptx.cuh"

namespace flashlab::cuda_v2 {

using ptx::cp_async_16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::ldmatrix_x4_trans;
using ptx::mma_m16n8k16;

// Which 16-byte row lane l hands to ldmatrix.x4 for each operand of a 16 x 16 k-step, as (row, col) offsets
// in the tile. The four matrices come back in the register order the mma wants:
//   A from a row-major [m][k] tile (Q):   a0..a3 = (rows 0-7 | 8-15) x (cols 0-7), then x (cols 8-15)
//   B from a [n][k] tile (K, B = K^T):     b0, b1 of n-tile 0, then b0, b1 of n-tile 1 (n = tile rows)
//   B from a [k][n] tile (V), with .trans: the same order, k = tile rows, n = tile columns
struct LdmatrixRow {
  int row, col;
};
__host__ __device__ constexpr LdmatrixRow a_operand_row(int lane) {
  return {lane % 16, (lane / 16) * 8};
}
// (`lane` is [[maybe_unused]] for the exercise's skeleton, which leaves it unread.)
__host__ __device__ constexpr LdmatrixRow b_operand_row_nk([[maybe_unused]] int lane) {
  LdmatrixRow row{0, 0};
  // EXERCISE BEGIN ldmatrix-rows
  // teaches: ldmatrix.x4: each lane hands one 16-byte row address, lanes 8m .. 8m+7 the 8 rows of matrix m,
  //   and matrix m comes back in register m in the mma's fragment order. Which tile row (and which 8 columns)
  //   lane l names for the B operand: from K ([n][k], no transpose) and from V ([k][n], with .trans)
  // difficulty: 3
  // grades: cuda_v2/split_q$
  // checks: forward
  // docs: docs/04-cuda-v2.md#ldmatrix and the swizzle
  // hint: ldmatrix.x4 loads four 8 x 8 matrices, lane l giving the address of one row of matrix l / 8; they
  //   must come back in the order the two mma calls consume them
  // hint2: for K (no transpose) the two B fragments of an n-tile are its two 8-column halves of k; for V
  //   (.trans) tile rows are k and columns are n. Work out which tile row and which 8 columns lane l names in
  //   each case
  // hint3: the four matrices must arrive as b0, b1 of n-tile 0, then b0, b1 of n-tile 1 (the order the two
  //   mma calls take them; a_operand_row above does the same for A). For K, b0 = k columns 0-7, b1 = k
  //   columns 8-15 of the n-tile's 8 rows; for V with .trans, tile rows are k and columns n. Lane l is in
  //   matrix l / 8, row l % 8 of it.
  row = {lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8};
  // EXERCISE END ldmatrix-rows
  return row;
}
__host__ __device__ constexpr LdmatrixRow b_operand_row_kn([[maybe_unused]] int lane) {
  LdmatrixRow row{0, 0};
  // EXERCISE BEGIN ldmatrix-rows
  row = {lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8};
  // EXERCISE END ldmatrix-rows
  return row;
}

// ---- mma.sync m16n8k16 ----
//
// D (16x8, fp32) += A (16x16, row) * B (16x8, col). With g = lane / 4 (the "group") and t = lane % 4:
//   A: a[0] = A[g][2t..2t+1]  a[1] = A[g+8][2t..2t+1]  a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   B: b[0] = B[2t..2t+1][g]  b[1] = B[2t+8..2t+9][g]
//   D: d[0..1] = D[g][2t..2t+1]  d[2..3] = D[g+8][2t..2t+1]
// So each thread holds two rows (g and g + 8) of every accumulator, and the four threads of a quad
// (same g) hold a whole row between them: the softmax reduces row statistics across the quad only.

// Max and sum across the four threads of a quad (lanes 4g..4g+3), which together hold one accumulator row.
__device__ inline float quad_max(float x) {
  // EXERCISE BEGIN quad-reduce
  // teaches: the four lanes of a quad (4g .. 4g+3) hold one row of an mma.sync accumulator between them:
  //   its max and sum are reduced across the quad with two butterfly shuffles, every lane ending with the
  //   row's value
  // difficulty: 2
  // grades: cuda_v2/split_q$
  // checks: forward
  // docs: docs/04-cuda-v2.md#Fragment layouts and where the statistics live
  // hint: the four lanes of a quad hold one row between them; two exchanges between partner lanes leave every
  //   lane with the whole row's value
  // hint2: a butterfly exchange (__shfl_xor_sync) pairs lane l with lane l ^ d: which two distances stay
  //   inside a quad?
  // hint3: __shfl_xor_sync(0xffffffffu, x, d) gives lane ^ d's x (every lane of the warp must take part, with
  //   the full mask). Lane distance 1, then 2, stays inside the quad; combine with fmaxf for the max, + for
  //   the sum.
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  // EXERCISE END quad-reduce
  return x;
}
__device__ inline float quad_sum(float x) {
  // EXERCISE BEGIN quad-reduce
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  // EXERCISE END quad-reduce
  return x;
}

// Two fp32 values rounded to the element type and packed into one register: common/cuda/convert.cuh.
using cuda::pack_pair;

// ---- Swizzled shared-memory tiles ----
//
// A tile of `rows` x kCols b16 elements is stored row-major in 16-byte chunks (8 elements, the unit of
// cp.async and of one ldmatrix row). Unswizzled, a row is kCols * 2 >= 64 bytes, so the 8 rows an ldmatrix
// reads at the same column start in the same few banks: a 4- or 8-way conflict. The swizzle stores chunk c of
// row r at chunk
//     c ^ (r % 8)           in a row's groups of 8 chunks (128 bytes: all 32 banks)
//     c ^ ((r / 2) % 4)     in the last group of a row whose width is an odd multiple of 32 (4 chunks)
// XOR only flips the low bits of c, so the chunk stays inside its own group, and the 8 rows of one ldmatrix
// (consecutive r, same c) land on 8 different 16-byte bank groups: no conflict. A full group is CUTLASS's
// Swizzle<3, 3, 3> on b16 elements. A 4-chunk group is 64 bytes, so rows r and r + 1 of it fall in opposite
// halves of the banks; r / 2 spreads the pairs over its 4 chunks. On a 32-wide tile (64-byte rows) that is
// the 64-byte swizzle, CUTLASS's Swizzle<2, 4, 3> on byte addresses (`./flashlab layout swizzle --bytes 64`
// draws it). Widths 32 and 96 (head dims up to 32, and 80 or 96) end in such a group; 64, 128, 192 and 256 do
// not.
template <int kCols>
struct SwizzledTile {
  static_assert(kCols % 32 == 0,
                "the swizzle permutes groups of 8, or a last group of 4, chunks of 8 elements");
  static constexpr int kFullGroupChunks = kCols / 64 * 8;  // chunks in the row's groups of 8
  // Element offset of (row, col); col must be a multiple of 8 (a chunk start).
  __host__ __device__ static constexpr int offset(int row, int col) {
    const int c = col >> 3;
    const int chunk = c < kFullGroupChunks ? c ^ (row & 7) : c ^ ((row >> 1) & 3);
    return row * kCols + (chunk << 3);
  }
  // Whether step() holds: a width of whole groups that is a power of two (64, 128, 256).
  static constexpr bool kSteps = kCols >= 64 && (kCols & (kCols - 1)) == 0;
  // offset(row + rows, col + cols) from offset(row, col), for rows a multiple of 8 and cols one of 16 (of 8
  // from col 0), col 0 or 8: where the width is a power of two of at least 64 (whole groups), the XOR of the
  // chunk with the row touches only the offset's bits below the row's, so a step along the row is an XOR of
  // the offset and a step of 8 rows an addition. A kernel then forms each lane's ldmatrix row once and steps
  // it with an instruction or two per load, where offset() takes several (CuTe's swizzled layouts step the
  // same way).
  __host__ __device__ static constexpr int step(int offset0, int rows, int cols) {
    static_assert(kSteps, "XOR steps need a power-of-two width of groups");
    return (offset0 ^ cols) + rows * kCols;
  }
  // offset(row + rows, col + cols) from offset0 = offset(row, col): by step() where the width allows it, by
  // offset() at the widths that end in a half group (32, 96) or are not a power of two (192).
  __host__ __device__ static constexpr int moved(int offset0, int row, int col, int rows, int cols) {
    if constexpr (kSteps)
      return step(offset0, rows, cols);
    else
      return offset(row + rows, col + cols);
  }
};

// step() is offset(), for every lane's row (0-15) and column (0 or 8), every step it allows in a tile of 64
// rows: checked wherever the header is compiled.
template <int kCols>
constexpr bool steps_are_offsets() {
  using Tile = SwizzledTile<kCols>;
  for (int row = 0; row < 16; ++row)
    for (int col = 0; col < 16; col += 8)
      for (int rows = 0; row + rows < 64; rows += 8)
        for (int cols = 0; col + cols < kCols; cols += col == 0 ? 8 : 16)
          if (Tile::step(Tile::offset(row, col), rows, cols) != Tile::offset(row + rows, col + cols))
            return false;
  return true;
}
static_assert(steps_are_offsets<64>() && steps_are_offsets<128>() && steps_are_offsets<256>());

// Calls copy(r, col, src) for each 16-byte chunk that this thread copies of a kRows x kCols tile, rows row0..
// of a row_stride-strided tensor. With n = kCols / 8 chunks a row, chunk c is at tile row r = c / n and
// column col = 8 (c % n); src points at it in global memory (it may lie past the tensor: the caller decides
// whether to read it). The block's kThreads threads take chunks t, t + kThreads, ..., a count known when
// compiling, so the steps unroll. Where kThreads is a multiple of n a thread keeps its column, and each step
// moves the source by a fixed number of rows. (Written as `for (c = threadIdx.x; c < chunks; c += kThreads)`
// the trip count depends on threadIdx.x, and ptxas kept a general loop with a division and a remainder: about
// 600 of the 1,900 instructions of a full 4-warp key tile at d 128 in sm_90a SASS, docs/04 4.10.)
template <int kRows, int kCols, int kThreads, typename Element, typename Copy>
__device__ inline void for_each_chunk(const Element* gmem, int64_t row_stride, int row0, Copy copy) {
  constexpr int kPerRow = kCols / 8, kChunks = kRows * kPerRow;
  constexpr int kSteps = (kChunks + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x);
  if constexpr (kThreads % kPerRow == 0) {
    constexpr int kRowStep = kThreads / kPerRow;
    const int r0 = first / kPerRow, col = first % kPerRow * 8;
    const Element* src = gmem + (row0 + r0) * row_stride + col;
#pragma unroll
    for (int step = 0; step < kSteps; ++step, src += kRowStep * row_stride)
      if (kRows % kRowStep == 0 || r0 + step * kRowStep < kRows) copy(r0 + step * kRowStep, col, src);
  } else {  // the widths 96 and 192: a thread's column changes from step to step
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int chunk = first + step * kThreads, r = chunk / kPerRow, col = chunk % kPerRow * 8;
      if (kChunks % kThreads == 0 || chunk < kChunks) copy(r, col, gmem + (row0 + r) * row_stride + col);
    }
  }
}

// Copies rows [row0, row0 + kRows) of a (row_stride-strided) tile into swizzled shared memory with cp.async.
// Rows at or past `rows_valid` are zero-filled and never read: ragged tails stay in bounds, and a padded
// key's V row is exactly 0, so even a NaN stored there cannot reach an output. Columns at or past `head_dim`
// (a head dim below the tile width kHeadDim, common/cuda/tile_width.hpp) are zero-filled too and never read
// from global memory.
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ inline void load_tile_async(Element* smem, const Element* gmem, int64_t row_stride, int row0,
                                       int rows_valid, int head_dim) {
  for_each_chunk<kRows, kHeadDim, kThreads>(gmem, row_stride, row0, [&](int r, int col, const Element* src) {
    const bool in_range = row0 + r < rows_valid && col < head_dim;
    cp_async_16(smem + SwizzledTile<kHeadDim>::offset(r, col), in_range ? src : gmem, in_range);
  });
}

// The same copy without cp.async (the tensor-core ladder's rungs before it, split_q.cu): each thread moves
// 16-byte chunks through its registers, and the caller's barrier publishes them. Rows at or past `rows_valid`
// and columns at or past `head_dim` are zeros, never read.
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ inline void load_tile_sync(Element* smem, const Element* gmem, int64_t row_stride, int row0,
                                      int rows_valid, int head_dim) {
  for_each_chunk<kRows, kHeadDim, kThreads>(gmem, row_stride, row0, [&](int r, int col, const Element* src) {
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows_valid && col < head_dim) value = *reinterpret_cast<const uint4*>(src);
    *reinterpret_cast<uint4*>(smem + SwizzledTile<kHeadDim>::offset(r, col)) = value;
  });
}

}  // namespace flashlab::cuda_v2
