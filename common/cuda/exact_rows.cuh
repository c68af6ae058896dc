// The GPU forwards' exact path for special values (docs/08-backward.md, "NaN and Inf"). O = P V as a tile
// product multiplies a hidden pair's weight, exactly 0, by its V row all the same, and 0 x NaN = 0 x Inf =
// NaN: a NaN or Inf in a valid V row reaches the rows of its tile that do not see that key. Such a leak only
// ever adds a NaN, so a finite element of O is right as the kernel left it. After the forward's kernel (when
// the kernel flagged a special value, or always in scanning mode: exact_rows.hpp), this pass reads O, and
// each row holding a NaN or Inf is computed again, in fp32, over the keys it sees only,
// from the LSE the forward wrote: O_i = sum_j exp(s"_ij - LSE_i) v_j, s" the scaled score after the forward's
// score modification (common/score_mod.hpp, when it applies one); its elements that are not finite are
// replaced. A warp a row, rows strided over kExactRowsBlocks blocks of 4 warps; a special row's keys 32
// at a time, a lane a key for the score, then every lane a column for the sum. The CPU stages' counterpart:
// common/special_values.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "common/cuda/check.hpp"
#include "common/cuda/convert.cuh"
#include "common/cuda/exact_rows.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/sequences.hpp"
#include "common/mask.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {  // both builds of this code may be linked into one program

namespace exact_rows_detail {

inline constexpr int kWarps = 4, kMaxHeadDim = 256;

template <typename Element>
__global__ void __launch_bounds__(32 * kWarps) exact_rows_kernel(const ExactRowsParams p) {
  __shared__ float q_rows[kWarps][kMaxHeadDim];
  __shared__ unsigned noted;
  if (p.special_rows != nullptr) {  // flagged mode: nothing to do unless the forward noted a special value
    if (threadIdx.x == 0) noted = *p.special_rows;
    __syncthreads();
    if (noted == 0u) return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rows = tokens_q(p) * p.heads_q;
  const int group_size = p.heads_q / p.heads_kv;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    // Rows in O's memory order (token, head), so that consecutive warps read consecutive rows; token t is
    // row i of batch element b (padded or packed: common/cuda/sequences.hpp).
    const int head = static_cast<int>(row % p.heads_q);
    Element* const o =
        static_cast<Element*>(p.o) + o_token_begin(p, row / p.heads_q) + head * p.o_head_stride;
    bool special = false;
    for (int c = lane; c < p.head_dim; c += 32) special |= !isfinite(to_float(o[c]));
    if (!__any_sync(0xffffffffu, special)) continue;
    int b = 0, i = 0;
    token_position(p, row / p.heads_q, b, i);

    const Element* const q =
        static_cast<const Element*>(p.q) + q_begin(p, b) + i * p.q_row_stride + head * p.q_head_stride;
    for (int c = lane; c < p.head_dim; c += 32) q_rows[warp][c] = to_float(q[c]);
    __syncwarp();
    const int head_kv = head / group_size;
    const Element* const k = static_cast<const Element*>(p.k) + k_begin(p, b) + head_kv * p.k_head_stride;
    const Element* const v = static_cast<const Element*>(p.v) + v_begin(p, b) + head_kv * p.v_head_stride;
    const float lse = p.lse[lse_begin(p, b, head) + i];
    const int rows_q = cuda::rows_q(p, b), rows_k = cuda::rows_k(p, b);
    const KeyRange keys = band_key_range(i, rows_q, rows_k, p.causal, p.window_left, p.window_right);
    // Loops over sum[] have a fixed trip count, unrolled, so that it stays in registers: a run-time bound
    // would put it in local memory (a stack frame in ptxas's report, LDL/STL in the SASS).
    float sum[kMaxHeadDim / 32] = {};
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += 32) {
      const int64_t j = j0 + lane;
      const bool seen =
          j < keys.end && explicit_mask_allows(p.mask, p.seqlen_k, i, j) && !p.mod.hides(b, head, i, j);
      float weight = 0.0f;
      if (seen) {
        float s = 0.0f;
        for (int c = 0; c < p.head_dim; ++c) s += to_float(k[j * p.k_row_stride + c]) * q_rows[warp][c];
        weight = expf(p.mod.apply(s * p.softmax_scale, b, head, i, j, rows_q, rows_k) - lse) *
                 p.dropout.factor<float>(b, head, i, j);
      }
      for (int e = 0; e < 32 && j0 + e < keys.end; ++e) {
        const float w = __shfl_sync(0xffffffffu, weight, e);
        if (!__shfl_sync(0xffffffffu, static_cast<int>(seen), e)) continue;  // the same for the whole warp
#pragma unroll
        for (int m = 0; m < kMaxHeadDim / 32; ++m)
          if (m * 32 + lane < p.head_dim)
            sum[m] += w * to_float(v[(j0 + e) * p.v_row_stride + m * 32 + lane]);
      }
    }
#pragma unroll
    for (int m = 0; m < kMaxHeadDim / 32; ++m)
      if (m * 32 + lane < p.head_dim && !isfinite(to_float(o[m * 32 + lane])))
        o[m * 32 + lane] = from_float<Element>(sum[m]);
    __syncwarp();  // q_rows[warp] is the next row's
  }
}

}  // namespace exact_rows_detail

// In a forward kernel's epilogue (flagged mode): raises the flag when this thread's outputs hold a NaN or an
// Inf, so that the pass after the kernel repairs them. Every writer writes the same 1: no atomic needed. A
// null flag (scanning mode) is left alone.
__device__ inline void note_special_rows(unsigned* flag, bool special) {
  if (special && flag != nullptr) *flag = 1u;
}

// The flag of a launch (flagged mode), in its workspace after the int lengths (int_lengths_bytes; the
// workspace holds kSpecialRowsFlagBytes more), cleared on `stream` before the forward's kernel.
inline unsigned* clear_special_rows_flag(void* workspace, const Problem& problem, cudaStream_t stream) {
  unsigned* const flag =
      reinterpret_cast<unsigned*>(static_cast<std::byte*>(workspace) + int_lengths_bytes(problem));
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), stream));
  return flag;
}

// Enqueues the pass on `stream`, after the forward that wrote O and the LSE.
template <typename Element>
void exact_rows(const ExactRowsParams& params, cudaStream_t stream) {
  launch_kernel<exact_rows_detail::exact_rows_kernel<Element>>(
      dim3(kExactRowsBlocks), dim3(32 * exact_rows_detail::kWarps), 0, stream, params);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda
