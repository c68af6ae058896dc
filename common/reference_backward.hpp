// The fp64 reference backward: dQ, dK and dV of a loss L given dO = dL/dO, the ground truth every backward is
// checked against (docs/08-backward.md derives each line).
//
// Per (batch, query head, row i), over the keys j that row sees (every mask through Visibility):
//   P_ij  = exp(S_ij - LSE_i),  S_ij = scale q_i . k_j     (the forward, recomputed in fp64)
//   dV_j += P_ij dO_i
//   dP_ij = dO_i . v_j
//   D_i   = dO_i . O_i = sum_j P_ij dP_ij                   (the softmax Jacobian's rank-one part)
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i += scale dS_ij k_j,   dK_j += scale dS_ij q_i
// GQA: a kv head's dK and dV sum over every query head of its group. A fully masked row (and a padded one)
// contributes nothing: its dQ is 0 and it adds nothing to any dK or dV; hidden and padded keys get dK = dV =
// 0.
#pragma once

#include <vector>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

struct ReferenceGradients {
  std::vector<double> dq;  // [batch, seqlen_q, heads_q, head_dim]
  std::vector<double> dk;  // [batch, seqlen_k, heads_kv, head_dim]
  std::vector<double> dv;  // [batch, seqlen_k, heads_kv, head_dim]
};

// The gradients in double precision from the float inputs and dO as given; the forward (O, LSE) is
// recomputed here in fp64, so the result depends on nothing an implementation computed.
ReferenceGradients reference_backward(const Problem& problem, const AttentionInputs& inputs,
                                      const HostTensor& d_out);

}  // namespace flashlab
