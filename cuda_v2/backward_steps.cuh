// What cuda_v2's backward kernels share (backward.cu, backward_64x128.cu): the two element formulas of
// FlashAttention-2's Algorithm 2 that every kernel of the backward evaluates the same way, the rows of the
// backward's own buffers, a key tile's schedule of steps and their copies, and the launch of a main kernel
// with the shared memory it asks for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda/check.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/sequences.hpp"
#include "common/error.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/dq_tile.hpp"
#include "cuda_v2/tensor_core.cuh"

namespace flashlab::cuda_v2 {

inline constexpr float kLog2e = 1.4426950408889634f;

// Row (b, head, row) of the backward's own buffers (D, dQ's accumulator): [batch, heads_q, seqlen_q] in
// either layout of the problem (packed, seqlen_q is the longest sequence).
__device__ inline int64_t row_index(const SplitQParams& f, int b, int head, int row) {
  return (static_cast<int64_t>(b) * f.heads_q + head) * f.seqlen_q + row;
}
// Where the 64-row Q tile holding `row` begins in dQ's accumulator in the fragments' order (p.dq_tiled):
// [batch, heads_q, Q tiles], each tile 64 x head_dim floats.
__device__ inline int64_t dq_tile_begin(const SplitQBackwardParams& p, int b, int head, int row) {
  const SplitQParams& f = p.forward;
  const int tiles = (f.seqlen_q + DqFragmentTile::kRows - 1) / DqFragmentTile::kRows;
  return ((static_cast<int64_t>(b) * f.heads_q + head) * tiles + row / DqFragmentTile::kRows) *
         DqFragmentTile{f.head_dim}.elements();
}
// Element (row, col) of dQ's accumulator for (b, head): in row order, or with p.dq_tiled in whole 64-row
// tiles in the fragments' order (dq_tile.hpp).
__device__ inline int64_t dq_accumulator_index(const SplitQBackwardParams& p, int b, int head, int row,
                                               int col) {
  const SplitQParams& f = p.forward;
  if (!p.dq_tiled) return row_index(f, b, head, row) * f.head_dim + col;
  const DqFragmentTile tile{f.head_dim};
  return dq_tile_begin(p, b, head, row) + tile.element(row % DqFragmentTile::kRows, col);
}
// A lane's share of one row of dQ_i into dQ's accumulator in row order: `at` is the row's element of the
// lane's first column, and accumulator nt of the lane holds that row's two adjacent columns at 2 * half and
// 2 * half + 1 (the mma's accumulator layout), 8 columns apart from one nt to the next. Each pair goes in one
// red.global.add.v2.f32, so that a quad's adds cover 32 bytes of the row, one whole sector (`at` 8-byte
// aligned: the launch check holds the accumulator to it).
template <int kNTiles>
__device__ inline void add_row_pairs(float* at, const float (&acc)[kNTiles][4], int half) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
    ptx::red_add_f32x2(at + 8 * nt, acc[nt][2 * half], acc[nt][2 * half + 1]);
}

// The forward's LSE of that row, in the problem's layout (common/cuda/sequences.hpp).
__device__ inline float lse_of(const SplitQParams& f, int b, int head, int row) {
  return f.lse[cuda::lse_begin(f, b, head) + row];
}

// P_ij = exp(S_ij scale - LSE_i) (Algorithm 2 line 10), recomputed from the forward's LSE. S scale is rounded
// once (never fused with the subtraction), as split_q rounded its max for the LSE (split_q.cu), and only the
// difference goes to the log2 domain: where one key dominates a row with scores ~1e4 (LSE ~4e4, a float ulp
// of 0.004) its P is then exactly 1, where taking S or the LSE to the log2 domain first cost P 0.5% (the case
// matrix's large-magnitude cases found it). With kFlushSubnormals, ex2 flushes subnormal results to zero
// (.ftz, as FlashAttention's kernels, built with fast math, do): a P below 2^-126 weighs nothing in a
// gradient rounded to bf16 or f16, and without .ftz each element costs 3 instructions more (the sm_90a SASS:
// a test, a scaling, a multiply). backward_64x128.cu's kernel flushes; backward.cu's keep the code the H200
// measured (with .ftz, ptxas spills 36 bytes at d 128 where it spilled 20).
template <bool kFlushSubnormals = false>
__device__ inline float recomputed_probability(float s, float scale, float lse) {
  return ptx::ex2_approx<kFlushSubnormals>((__fmul_rn(s, scale) - lse) * kLog2e);
}

// dS_ij = P_ij (dP_ij - D_i) (line 13 without its scale), evaluated left to right in every kernel, so that
// the exact pass (backward.cu's exact_kernel) forms the tensor-core kernels' value. The scale is one number
// for the whole problem, so it waits for the sums, as in FlashAttention-2: dK_j is multiplied by it once in
// each main kernel's epilogue, dQ_i where dq_kernel converts its accumulator, and exact_kernel's sums
// likewise. That is one multiply an element less: 32 of a 64 x 128 step's instructions, 16 of a 32-row step's
// (sm_90a SASS).
__device__ inline float score_gradient(float p, float dp, float d) {
  return p * (dp - d);
}

// K_j and V_j of the key tile from key0 (Algorithm 2 line 6) into swizzled shared memory, as one cp.async
// group; keys past the batch's length are zero.
template <int kBlockN, int kHeadDim, int kThreads, typename Element>
__device__ inline void load_key_tile(Element* sK, Element* sV, const SplitQParams& f, int b, int head_kv,
                                     int key0) {
  const Element* const k = static_cast<const Element*>(f.k) + cuda::k_begin(f, b) + head_kv * f.k_head_stride;
  const Element* const v = static_cast<const Element*>(f.v) + cuda::v_begin(f, b) + head_kv * f.v_head_stride;
  const int rows_k = cuda::rows_k(f, b);
  load_tile_async<kBlockN, kHeadDim, kThreads>(sK, k, f.k_row_stride, key0, rows_k, f.head_dim);
  load_tile_async<kBlockN, kHeadDim, kThreads>(sV, v, f.v_row_stride, key0, rows_k, f.head_dim);
  cp_async_commit();
}

// A step's Q_i, dO_i, LSE_i and D_i in shared memory (line 8), in one buffer.
template <typename Element>
struct StepBuffer {
  Element *q, *d_out;  // [kBlockM][kHeadDim], swizzled
  float *lse, *d;      // [kBlockM]
};

// Two of them: the next step's copy lands in one buffer while the other is computed on, as in
// FlashAttention-2's backward. Views into a kernel's dynamic shared memory; buffers[i] is buffer i.
template <typename Element, int kBlockM, int kHeadDim>
struct StepBuffers {
  Element *q, *d_out;  // [2][kBlockM][kHeadDim], swizzled
  float *lse, *d;      // [2][kBlockM]
  __device__ StepBuffer<Element> operator[](int buffer) const {
    return {q + buffer * kBlockM * kHeadDim, d_out + buffer * kBlockM * kHeadDim, lse + buffer * kBlockM,
            d + buffer * kBlockM};
  }
};

// The steps of key tile kv_tile's block, kBlockM query rows a step: for each query head of kv head head_kv's
// group (GQA: they all add into this kv head's dK and dV), the Q tiles that visit the key tile, which are the
// forward's block skipping seen from the key side (block_mask.cuh, query_tiles_of: found once a block, as
// FlashAttention-2's backward forms m_block_min and m_block_max). A kernel walks them with first_visit and
// next_visit, which carry the step's head, first row and whether the key tile is full for its Q tile from
// step to step: a step forms no mask unless its tile is cut.
template <int kBlockM, int kBlockN, int kHeadDim, int kThreads>
struct KeyTileSteps {
  // What the block's steps read and no register holds through the loops (the head-dim-128 kernels have none
  // to spare: ptxas -v): where batch element b's rows begin in Q, dO and the LSE (common/cuda/sequences.hpp:
  // padded or packed; [0] Q, [1] dO, [2] the LSE of head 0, [3] the LSE's head stride), and the visiting Q
  // tiles. In shared memory: thread 0 notes them, and the caller's barrier publishes them.
  struct Notes {
    int64_t batch_begin[4];
    QueryTileRun run;
  };
  __device__ static void note(const SplitQBackwardParams& p, int b, int kv_tile, Notes& notes) {
    if (threadIdx.x != 0) return;
    const SplitQParams& f = p.forward;
    notes.batch_begin[0] = cuda::q_begin(f, b);
    notes.batch_begin[1] = cuda::o_begin(f, b);
    notes.batch_begin[2] = cuda::lse_begin(f, b, 0);
    notes.batch_begin[3] = cuda::lse_begin(f, b, 1) - notes.batch_begin[2];
    notes.run = query_tiles_of<kBlockM, kBlockN>(f, b, kv_tile);
  }

  const SplitQBackwardParams& p;
  const Notes& notes;
  int b, head_kv, rows_q;
  int steps;  // visits: the group's query heads times the visiting Q tiles

  __device__ KeyTileSteps(const SplitQBackwardParams& params, const Notes& block_notes, int batch,
                          int kv_head)
      : p(params),
        notes(block_notes),
        b(batch),
        head_kv(kv_head),
        rows_q(cuda::rows_q(params.forward, batch)),
        steps(params.forward.heads_q / params.forward.heads_kv *
              (block_notes.run.end - block_notes.run.begin)) {}

  // A step: its number (steps when there is none left), its query head and first row, and whether the key
  // tile is full for its Q tile (BlockMask::tile_is_full: no element hidden by the mask's band).
  struct Step {
    int number, head, row0;
    bool full;
  };
  __device__ Step first_visit() const {
    return at({0, head_kv * (p.forward.heads_q / p.forward.heads_kv), notes.run.begin * kBlockM, false});
  }
  __device__ Step next_visit(Step step) const {
    ++step.number;
    step.row0 += kBlockM;
    if (step.row0 == notes.run.end * kBlockM) step.row0 = notes.run.begin * kBlockM, ++step.head;
    return at(step);
  }
  // The step's Q tile's mask, for the element masks of a tile that is not full.
  __device__ BlockMask block(const Step& step) const {
    return BlockMask::make<kBlockN>(p.forward, b, step.row0, step.row0 + kBlockM);
  }

  // Q_i, dO_i, LSE_i and D_i (line 8) of a step into one of its buffers, as one cp.async group. Padded rows
  // are zero and take no part (their LSE and D are never read: every element of theirs is hidden).
  template <typename Element>
  __device__ void load(const Step& step, const StepBuffer<Element>& into) const {
    const auto [sQ, sdO, sLse, sD] = into;
    const SplitQParams& f = p.forward;
    const int head_q = step.head, first = step.row0;
    const Element* const q =
        static_cast<const Element*>(f.q) + notes.batch_begin[0] + head_q * f.q_head_stride;
    const Element* const d_out =
        static_cast<const Element*>(p.d_out) + notes.batch_begin[1] + head_q * f.o_head_stride;
    load_tile_async<kBlockM, kHeadDim, kThreads>(sQ, q, f.q_row_stride, first, rows_q, f.head_dim);
    load_tile_async<kBlockM, kHeadDim, kThreads>(sdO, d_out, f.o_row_stride, first, rows_q, f.head_dim);
    const float* const lse = f.lse + notes.batch_begin[2] + head_q * notes.batch_begin[3];
    // A thread's rows are a count known when compiling, as for_each_chunk's chunks are (tensor_core.cuh):
    // looping from threadIdx.x, ptxas kept a general loop with a remainder, about 140 instructions a step.
#pragma unroll
    for (int i = 0; i < (kBlockM + kThreads - 1) / kThreads; ++i) {
      const int r = static_cast<int>(threadIdx.x) + i * kThreads;
      if (kBlockM % kThreads != 0 && r >= kBlockM) break;
      const int row = first + r;
      const bool valid = row < rows_q;
      ptx::cp_async_4(sLse + r, valid ? lse + row : lse, valid);
      ptx::cp_async_4(sD + r, valid ? p.d_sum + row_index(f, b, head_q, row) : p.d_sum, valid);
    }
    cp_async_commit();
  }

 private:
  __device__ Step at(Step step) const {
    step.full = step.row0 >= notes.run.full_begin * kBlockM && step.row0 < notes.run.full_end * kBlockM;
    return step;
  }
};

namespace FLASHLAB_CUDA_TARGET {

// Launches a main kernel of the backward (one block per key tile) with `smem` bytes of dynamic shared memory.
// 128 keys at d 128 take 106.5 KiB with 32 query rows a step and 161 KiB with 64: A100 and Hopper offer a
// block up to 163 and 227 KiB, GPUs of compute capability 8.6 and 8.9 only 99. Where the attribute is
// refused, the device's limit is read and named with the tile.
template <auto Kernel, typename... Args>
void launch_backward_tile(dim3 grid, int threads, int smem, int block_m, int block_n, int head_dim,
                          cudaStream_t stream, Args&&... args) {
  if (const cudaError_t status =
          cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      status != cudaSuccess) {
    (void)cudaGetLastError();  // the refusal, reported below
    int device = 0, offered = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&offered, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem > offered)
      fail("the backward's ", block_m, " x ", block_n, " tile at head_dim ", head_dim, " needs ", smem,
           " bytes of shared memory a block; this GPU offers ", offered);
    FLASHLAB_CUDA_CHECK(status);
  }
  cuda::launch_kernel<Kernel>(grid, dim3(threads), smem, stream, std::forward<Args>(args)...);
}

// The main kernel with 64 query rows a step over 128 keys in FlashAttention-2's warp layout
// (backward_64x128.cu): bf16, head_dim 64 or 128.
void launch_backward_64x128_kernel(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream);

}  // namespace FLASHLAB_CUDA_TARGET

using namespace FLASHLAB_CUDA_TARGET;

}  // namespace flashlab::cuda_v2
