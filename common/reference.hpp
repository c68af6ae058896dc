// The fp64 reference: the ground truth every implementation is checked against.
#pragma once

#include <vector>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

struct ReferenceResult {
  std::vector<double> o;    // [batch, seqlen_q, heads_q, head_dim]
  std::vector<double> lse;  // [batch, heads_q, seqlen_q]; -inf for a fully masked row
};

// Standard attention in double precision, from the float inputs as given: S = scale * Q K^T over visible
// keys, softmax with the max subtracted, O = P V. Masked keys take no part at all (so a NaN in a masked V row
// does not reach the row). Fully masked rows: O = 0, LSE = -inf.
ReferenceResult reference_attention(const Problem& problem, const AttentionInputs& inputs);

// The same, for the query rows i with i % row_step == 0 only (a sampled check of problems too large for the
// full fp64 reference, e.g. in GPU benchmarks); the other rows are left at O = 0, LSE = -inf.
ReferenceResult reference_attention(const Problem& problem, const AttentionInputs& inputs, int64_t row_step);

}  // namespace flashlab
