// The score modification (soft-capping, ALiBi, a bias; common/score_mod.hpp) as cuda_v2's tensor-core forward
// and its backward apply it, in one function so that the backward recomputes the forward's P to the bit.
#pragma once

#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

// The modified score of the unscaled score s of a valid (row, key) of batch element b and query head `head`:
// f(s scale) / scale, in the unscaled units both kernels' softmax works in (they scale, take the row max and
// form the LSE from unscaled scores). A -inf bias entry gives -inf.
__device__ inline float modified_score(const SplitQParams& p, float s, int b, int head, int row, int key,
                                       int rows_q, int rows_k) {
  const float modified = p.mod.apply(__fmul_rn(s, p.softmax_scale), b, head, row, key, rows_q, rows_k);
  return __fdiv_rn(modified, p.softmax_scale);
}

// ds"/ds of the same score (1 - (s' / cap)^2 under soft-capping, else 1), from its modified value in unscaled
// units as modified_score returned it.
__device__ inline float score_derivative(const SplitQParams& p, float modified_unscaled, int b, int head,
                                         int row, int key, int rows_q, int rows_k) {
  return p.mod.derivative(__fmul_rn(modified_unscaled, p.softmax_scale), b, head, row, key, rows_q, rows_k);
}

}  // namespace flashlab::cuda_v2
