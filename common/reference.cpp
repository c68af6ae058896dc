#include "common/reference.hpp"

#include <cmath>
#include <limits>

#include "common/dropout.hpp"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "common/score_mod.hpp"

namespace flashlab {

ScoreRow reference_score_row(const Problem& p, const AttentionInputs& in, const Visibility& visibility,
                             int64_t b, int64_t i, int64_t h, double* scores, uint8_t* seen) {
  const int64_t d = p.head_dim, hk = p.kv_head(h);
  const double scale = p.softmax_scale();
  const ScoreMod mod(p);
  const float* q = in.q_row(p, b, i, h);
  ScoreRow row{-std::numeric_limits<double>::infinity(), false};
  bool has_nan = false;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    seen[j] = visibility.visible(b, i, j) && !mod.hides(b, h, i, j);  // a -inf bias hides like a mask
    if (!seen[j]) continue;
    const float* k = in.k_row(p, b, j, hk);
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * static_cast<double>(k[c]);
    scores[j] = mod.apply(dot * scale, b, h, i, j);
    has_nan |= std::isnan(scores[j]);
    row.max = std::max(row.max, scores[j]);  // std::max drops a NaN, hence has_nan
    row.any = true;
  }
  if (has_nan) row.max = std::numeric_limits<double>::quiet_NaN();
  return row;
}

ReferenceResult reference_attention(const Problem& p, const AttentionInputs& in) {
  return reference_attention(p, in, 1);
}

ReferenceResult reference_attention(const Problem& p, const AttentionInputs& in, int64_t row_step) {
  p.validate();
  if (row_step < 1) fail("row_step (", row_step, ") must be >= 1");
  const Visibility visibility(p);
  const Dropout dropout(p);
  const int64_t d = p.head_dim;
  ReferenceResult result;
  result.o.assign(static_cast<size_t>(p.q_elements()), 0.0);
  result.lse.assign(static_cast<size_t>(p.lse_elements()), -std::numeric_limits<double>::infinity());

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = p.kv_head(h);
      std::vector<double> scores(static_cast<size_t>(p.seqlen_k));
      std::vector<uint8_t> seen(static_cast<size_t>(p.seqlen_k));
      for (int64_t i = 0; i < p.stored_rows_q(b); i += row_step) {
        const auto [row_max, any] =
            reference_score_row(p, in, visibility, b, i, h, scores.data(), seen.data());
        if (!any) continue;  // fully masked: O = 0, LSE = -inf (already set)
        double row_sum = 0.0;
        double* out = &result.o[p.q_offset(b, i, h)];
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!seen[j]) continue;
          const double weight = std::exp(scores[j] - row_max);
          row_sum += weight;
          const float* v = in.v_row(p, b, j, hk);
          // Dropout (common/dropout.hpp) acts on the weight in O only: the normalizer and the LSE are those
          // of the undropped weights.
          const double kept = weight * dropout.factor<double>(b, h, i, j);
          for (int64_t c = 0; c < d; ++c) out[c] += kept * static_cast<double>(v[c]);
        }
        for (int64_t c = 0; c < d; ++c) out[c] /= row_sum;
        result.lse[p.lse_offset(b, h, i)] = row_max + std::log(row_sum);
      }
    }
  }
  return result;
}

}  // namespace flashlab
