// Special values, exactly: the exact path a tiled stage takes for the rare rows a NaN or Inf reached
// (docs/08-backward.md, "NaN and Inf").
//
// A pair that does not see each other (the mask, a -inf bias) takes no part in anything. A tile product
// cannot skip it: its weight is exactly 0, but 0 x NaN = 0 x Inf = NaN, so a NaN or Inf in a valid element of
// V (the forward's O = P V), Q, K or dO (the backward's dK = dS^T Q, dQ = dS K, dV = P^T dO) reaches the rows
// of its tile that never see it. Such a leak only ever adds a NaN: a finite element is right as the products
// left it. So these functions recompute each row that holds a NaN or Inf, pair by pair over the pairs that
// see each other only, in double, from the stage's own LSE (and O and D), and replace the elements that are
// not finite. With every output finite they make one pass over it and change nothing. cuda_v2's backward does
// the same on the GPU (exact_kernel in cuda_v2/backward.cu).
#pragma once

#include <vector>

#include "common/tensor.hpp"

namespace flashlab {

// O's rows after a forward: O_i = sum over the keys row i sees of exp(s_ij - LSE_i) z_ij v_j (score
// modifications and dropout's factors as in common/score_mod.hpp, common/dropout.hpp).
void repair_special_rows(const Problem& p, const AttentionInputs& in, AttentionOutputs& out);

// dQ, dK and dV after a backward from the forward outputs `fwd`, the upstream gradient `d_out` and
// D_i = dO_i . O_i laid out like the LSE (Problem::lse_offset).
void repair_special_gradients(const Problem& p, const AttentionInputs& in, const AttentionOutputs& fwd,
                              const HostTensor& d_out, const std::vector<double>& D,
                              AttentionGradients& grad);

}  // namespace flashlab
