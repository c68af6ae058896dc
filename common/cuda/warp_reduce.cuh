// Reductions across the 32 lanes of a warp (butterfly shuffles: every lane ends with the result), written
// once for the kernels that reduce a row over a warp (cuda_v1, split_q_simt, the decoding kernels). The
// tensor-core kernels reduce over the four lanes of a quad instead (cuda_v2/tensor_core.cuh), and ask the
// warp whether its online-softmax rescale can be skipped (warp_must_rescale: split_q, ws).
#pragma once

#include "common/cuda/target.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {  // both builds of this code may be linked into one program

// The largest of the warp's values, NaN when any of them is NaN: the reference's max, under which a NaN score
// poisons its row (fmaxf would drop it).
__device__ inline float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, x, offset);
    x = (other > x || other != other) ? other : x;
  }
  return x;
}

// The largest of the warp's values by fmaxf, which drops a NaN: one instruction a step, for kernels in which
// a NaN score reaches the row through its sum anyway (exp(NaN - m) is NaN), or which the exact pass for
// special values follows (common/cuda/exact_rows.hpp). warp_max's select costs split_q_simt at d 64 over 60
// registers (nvcc 13, sm_80: 105 -> 162).
__device__ inline float warp_fmax(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Whether any lane of the warp must rescale its accumulator by the online softmax's factors exp(m_old -
// m_new) (common/softmax_state.hpp, raise_max). Where a row's max did not grow its factor is exp2(0), exactly
// 1 (ex2.approx returns 1 for 0), and the multiply would leave the row as it is: a warp in which every factor
// is 1 may skip the multiplies, and its accumulator is the same to the bit (x 1 changes no value, NaN and Inf
// included). The answer is the warp's, so the branch on it does not diverge.
template <int kRows>
__device__ inline bool warp_must_rescale(const float (&factors)[kRows]) {
  bool any = false;
#pragma unroll
  for (int i = 0; i < kRows; ++i) any |= factors[i] != 1.0f;
  return __any_sync(0xffffffffu, any);
}
__device__ inline bool warp_must_rescale(float factor) {
  const float factors[1] = {factor};
  return warp_must_rescale(factors);
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
