#include "common/reference_backward.hpp"

#include <cmath>
#include <limits>

#include "common/dropout.hpp"
#include "common/mask.hpp"
#include "common/reference.hpp"
#include "common/score_mod.hpp"

namespace flashlab {

ReferenceGradients reference_backward(const Problem& p, const AttentionInputs& in, const HostTensor& d_out) {
  p.validate();
  const Visibility visibility(p);
  const int64_t d = p.head_dim;
  const double scale = p.softmax_scale();
  const ScoreMod mod(p);
  const Dropout dropout(p);
  ReferenceGradients grad;
  grad.dq.assign(static_cast<size_t>(p.q_elements()), 0.0);
  grad.dk.assign(static_cast<size_t>(p.kv_elements()), 0.0);
  grad.dv.assign(static_cast<size_t>(p.kv_elements()), 0.0);

  // One task per (batch, kv head): it owns that head's dK and dV, so the group's query heads add into them
  // without a race.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::vector<double> scores(static_cast<size_t>(p.seqlen_k)), weights(static_cast<size_t>(p.seqlen_k));
      std::vector<uint8_t> seen(static_cast<size_t>(p.seqlen_k));
      std::vector<double> o(static_cast<size_t>(d));
      for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        for (int64_t i = 0; i < p.stored_rows_q(b); ++i) {
          const float* q = in.q_row(p, b, i, h);
          const float* dout = d_out.ptr() + p.q_offset(b, i, h);
          // Forward, in fp64: S over the visible keys, its max, the normalizer.
          const auto [row_max, any] =
              reference_score_row(p, in, visibility, b, i, h, scores.data(), seen.data());
          if (!any) continue;  // fully masked row: O is the constant 0, so it contributes no gradient
          double row_sum = 0.0;
          for (int64_t j = 0; j < p.seqlen_k; ++j)
            if (seen[j]) row_sum += (weights[j] = std::exp(scores[j] - row_max));
          std::fill(o.begin(), o.end(), 0.0);
          for (int64_t j = 0; j < p.seqlen_k; ++j) {  // P = exp(S - m) / l, O = P V
            if (!seen[j]) continue;
            weights[j] /= row_sum;
            const float* v = in.v_row(p, b, j, hk);
            const double kept = weights[j] * dropout.factor<double>(b, h, i, j);  // dropout: O = (P Z) V
            for (int64_t c = 0; c < d; ++c) o[c] += kept * static_cast<double>(v[c]);
          }
          double D = 0.0;  // D_i = dO_i . O_i
          for (int64_t c = 0; c < d; ++c) D += static_cast<double>(dout[c]) * o[c];
          double* dq = &grad.dq[p.q_offset(b, i, h)];
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (!seen[j]) continue;  // a hidden key takes no part (a NaN in its K or V must not leak in)
            const float* k = in.k_row(p, b, j, hk);
            const float* v = in.v_row(p, b, j, hk);
            double dP = 0.0;  // dP_ij = dO_i . v_j, times the dropout factor Z_ij (the mask, recomputed)
            for (int64_t c = 0; c < d; ++c) dP += static_cast<double>(dout[c]) * static_cast<double>(v[c]);
            const double z = dropout.factor<double>(b, h, i, j);
            dP *= z;
            // dS with respect to the scaled score s: the softmax's P (dP - D), times the modification's
            // derivative (1 - tanh^2 under soft-capping; ALiBi adds a constant)
            const double dS = weights[j] * (dP - D) * mod.derivative(scores[j], b, h, i, j);
            const int64_t kv = p.kv_offset(b, j, hk);
            for (int64_t c = 0; c < d; ++c) {
              grad.dv[kv + c] += weights[j] * z * static_cast<double>(dout[c]);
              grad.dk[kv + c] += scale * dS * static_cast<double>(q[c]);
              dq[c] += scale * dS * static_cast<double>(k[c]);
            }
          }
        }
      }
    }
  }
  return grad;
}

}  // namespace flashlab
