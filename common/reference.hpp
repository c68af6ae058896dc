// The fp64 reference: the ground truth every implementation is checked against.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

struct ReferenceResult {
  std::vector<double> o;    // Problem::q_shape(): [batch, seqlen_q, heads_q, head_dim] or packed
  std::vector<double> lse;  // Problem::lse_shape(); -inf for a fully masked row
};

// Standard attention in double precision, from the float inputs as given: S = scale * Q K^T over visible
// keys, softmax with the max subtracted, O = P V. Masked keys take no part at all (so a NaN in a masked V row
// does not reach the row). Fully masked rows: O = 0, LSE = -inf.
ReferenceResult reference_attention(const Problem& problem, const AttentionInputs& inputs);

// The same, for the query rows i with i % row_step == 0 only (a sampled check of problems too large for the
// full fp64 reference, e.g. in GPU benchmarks); the other rows are left at O = 0, LSE = -inf.
ReferenceResult reference_attention(const Problem& problem, const AttentionInputs& inputs, int64_t row_step);

class Visibility;

// The fp64 score row that both references start from: scores[j] = scale * q_i . k_j (q_i of query head h),
// modified by the problem's soft-capping and ALiBi (common/score_mod.hpp),
// for each key j that row i of batch element b sees (seen[j] = 1), seen[j] = 0 for the others. Returns the
// row's max over the seen keys (NaN when a score is NaN, so that a NaN input poisons its row) and whether any
// key is seen (none: a fully masked row).
struct ScoreRow {
  double max;
  bool any;
};
ScoreRow reference_score_row(const Problem& problem, const AttentionInputs& inputs,
                             const Visibility& visibility, int64_t b, int64_t i, int64_t h, double* scores,
                             uint8_t* seen);

}  // namespace flashlab
