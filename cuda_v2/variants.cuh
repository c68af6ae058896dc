// What a problem may add between split_q's scores and its output (docs/04-cuda-v2.md, section 4.6): a score
// modification (soft-capping, ALiBi, a bias; common/score_mod.hpp) and dropout (common/dropout.hpp), as a
// policy the forward kernel calls in one line each. The kernel is built twice: with NoVariant, which adds
// nothing (ptxas reports the same registers as the kernel had before the policy), and with Variants for the
// problems that have one, so that their code takes no register from the plain kernel.
#pragma once

#include "cuda_v2/score_mod.cuh"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

struct NoVariant {
  static constexpr bool kActive = false;
  __device__ static bool modifies_scores(const SplitQParams&) { return false; }
  __device__ static float score(const SplitQParams&, float s, int, int, int, int, int, int) { return s; }
  __device__ static float weight(const SplitQParams&, float w, int, int, int, int) { return w; }
};

struct Variants {
  static constexpr bool kActive = true;
  __device__ static bool modifies_scores(const SplitQParams& p) { return p.mod.active(); }
  // The modified score s" of a valid (row, key), in the unscaled units the kernel's softmax works in
  // (score_mod.cuh); a -inf bias entry gives -inf, which weighs 0. The backward recomputes it the same way.
  __device__ static float score(const SplitQParams& p, float s, int b, int head, int row, int key, int rows_q,
                                int rows_k) {
    return modified_score(p, s, b, head, row, key, rows_q, rows_k);
  }
  // Dropout after the normalizer: l and the LSE are the undropped weights', O takes P Z (common/dropout.hpp).
  __device__ static float weight(const SplitQParams& p, float w, int b, int head, int row, int key) {
    return p.dropout.active() ? w * p.dropout.factor<float>(b, head, row, key) : w;
  }
};

}  // namespace flashlab::cuda_v2
