#include "common/special_values.hpp"

#include <cmath>
#include <cstdint>

#include "common/dropout.hpp"
#include "common/mask.hpp"
#include "common/score_mod.hpp"

namespace flashlab {

namespace {

// Whether a row holds a NaN or Inf: 0 x Inf and 0 x NaN are NaN, 0 x a finite value is 0 (a sum that
// vectorizes, where a branch per element did not: the scan runs after every forward).
bool special(const float* row, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += row[c] * 0.0f;
  return std::isnan(sum);
}

double dot(const float* x, const float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t c = 0; c < n; ++c) sum += static_cast<double>(x[c]) * static_cast<double>(y[c]);
  return sum;
}

}  // namespace

void repair_special_rows(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const int64_t d = p.head_dim;
  const double scale = p.softmax_scale();
  const Visibility visibility(p);
  const ScoreMod mod(p);
  const Dropout dropout(p);
#pragma omp parallel for collapse(3) schedule(static)  // nearly every row is finite: the scan is the cost
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        if (i >= p.stored_rows_q(b)) continue;  // packed: the sequence ends here
        float* const o = out.o_row(p, b, i, h);
        if (!special(o, d)) continue;
        const float* q = in.q_row(p, b, i, h);
        const double lse = out.lse_at(p, b, h, i);
        std::vector<double> sum(static_cast<size_t>(d));
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visibility.visible(b, i, j) || mod.hides(b, h, i, j)) continue;
          const double s = mod.apply(scale * dot(q, in.k_row(p, b, j, p.kv_head(h)), d), b, h, i, j);
          const double weight = std::exp(s - lse) * dropout.factor<double>(b, h, i, j);
          const float* v = in.v_row(p, b, j, p.kv_head(h));
          for (int64_t c = 0; c < d; ++c) sum[c] += weight * v[c];
        }
        for (int64_t c = 0; c < d; ++c)
          if (!std::isfinite(o[c])) o[c] = static_cast<float>(sum[c]);
      }
}

void repair_special_gradients(const Problem& p, const AttentionInputs& in, const AttentionOutputs& fwd,
                              const HostTensor& d_out, const std::vector<double>& D,
                              AttentionGradients& grad) {
  const int64_t d = p.head_dim, group = p.group_size();
  const double scale = p.softmax_scale();
  const Visibility visibility(p);
  const ScoreMod mod(p);
  const Dropout dropout(p);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t sq = p.stored_rows_q(b), sk = p.stored_rows_k(b);
      const auto kv_offset = [&](int64_t j) { return p.kv_offset(b, j, hk); };
      const auto q_offset = [&](int64_t h, int64_t i) { return p.q_offset(b, i, h); };
      std::vector<uint8_t> key_rows(static_cast<size_t>(sk)), query_rows(static_cast<size_t>(group * sq));
      bool any = false;
      for (int64_t j = 0; j < sk; ++j)
        any |= key_rows[j] =
            special(grad.dk.ptr() + kv_offset(j), d) || special(grad.dv.ptr() + kv_offset(j), d);
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = 0; i < sq; ++i)
          any |= query_rows[g * sq + i] = special(grad.dq.ptr() + q_offset(hk * group + g, i), d);
      if (!any) continue;
      std::vector<double> dk(static_cast<size_t>(sk * d)), dv(static_cast<size_t>(sk * d)), dq(d);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        for (int64_t i = 0; i < sq; ++i) {
          const float *q = in.q.ptr() + q_offset(h, i), *dout = d_out.ptr() + q_offset(h, i);
          const double lse = fwd.lse_at(p, b, h, i), row_dot = D[p.lse_offset(b, h, i)];
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            if (!query_rows[g * sq + i] && !key_rows[j]) continue;
            if (!visibility.visible(b, i, j) || mod.hides(b, h, i, j)) continue;
            const float *k = in.k.ptr() + kv_offset(j), *v = in.v.ptr() + kv_offset(j);
            const double s = mod.apply(scale * dot(q, k, d), b, h, i, j), weight = std::exp(s - lse);
            const double z = dropout.factor<double>(b, h, i, j);
            const double ds =
                scale * weight * (z * dot(dout, v, d) - row_dot) * mod.derivative(s, b, h, i, j);
            for (int64_t c = 0; c < d; ++c) {
              dq[c] += ds * k[c];
              dk[j * d + c] += ds * q[c];
              dv[j * d + c] += weight * z * dout[c];
            }
          }
          float* const dq_row = grad.dq.ptr() + q_offset(h, i);
          if (query_rows[g * sq + i])
            for (int64_t c = 0; c < d; ++c)
              if (!std::isfinite(dq_row[c])) dq_row[c] = static_cast<float>(dq[c]);
        }
      }
      for (int64_t j = 0; j < sk; ++j) {
        float *dk_row = grad.dk.ptr() + kv_offset(j), *dv_row = grad.dv.ptr() + kv_offset(j);
        for (int64_t c = 0; c < d && key_rows[j]; ++c) {
          if (!std::isfinite(dk_row[c])) dk_row[c] = static_cast<float>(dk[j * d + c]);
          if (!std::isfinite(dv_row[c])) dv_row[c] = static_cast<float>(dv[j * d + c]);
        }
      }
    }
}

}  // namespace flashlab
